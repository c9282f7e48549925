import sys

from bench.truth.harness import main

sys.exit(main())
