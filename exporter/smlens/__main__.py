import sys

from smlens.cli import main

sys.exit(main())
