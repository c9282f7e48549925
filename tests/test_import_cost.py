"""bench/import_cost.py, the estimate docs/performance.md gives for the dependencies serve could drop."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_refusing_asyncio_leaves_its_modules_out_and_saves_memory() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "import_cost.py"), "--runs", "1", "--block", "asyncio,h11"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    reference, without = done.stdout.splitlines()
    listed, kept = map(int, re.findall(r"(\d+) modules", reference))
    left = int(re.search(r"(\d+) modules", without)[1])
    saved = float(re.search(r"saves (-?[\d.]+) MiB", without)[1])
    assert listed > 200 and kept < listed  # serve's own list, less smlens' routes in the reference
    assert left < kept - 20  # asyncio and h11 are dozens of modules
    assert saved > 0.3
