"""Benchmark: what the packages `smlens serve` imports cost in resident memory, by leaving them out.

    PYTHONPATH=exporter python3 bench/import_cost.py [--runs 5] [--block PKG,PKG ...]

First it lists every module `smlens serve --backend sim` imports in its first seconds (``python -X
importtime``). Then fresh interpreters (``-S``: no ``.pth`` file of this environment imports anything) import
that whole list with some packages refused by an import hook; modules that import a refused package fail and
are left out too. The reference refuses only smlens' own modules on top of the web framework (``--own``),
since replacing the framework means rewriting them, not dropping them; each ``--block`` set is refused on
top of that. Each child prints its module count, VmRSS and RssAnon after ``gc.collect()``; the best of
``--runs`` is kept. An estimate of what removing a dependency would save, not a measurement of a smlens
without it; a package that smlens' core imports (yaml: the thresholds) cannot be measured this way, since
refusing it takes most of smlens with it (``bench/memory_breakdown.py`` gives its import cost alone).
docs/performance.md ("Memory") has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

EXPORTER = Path(__file__).resolve().parent.parent / "exporter"
OWN = "smlens.web.app,smlens.web.admin,smlens.web.status"
DEFAULT_BLOCKS = ("asyncio,h11,smlens.web",)  # Starlette, the first estimate, is gone (smlens.routing)
_CHILD = """
import gc, json, sys
blocked = json.loads(sys.argv[1])
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError(name)
        return None
sys.meta_path.insert(0, Refuse())
for module in json.loads(sys.argv[2]):
    try:
        __import__(module)
    except Exception:
        pass
gc.collect()
fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps([len(sys.modules), int(fields["VmRSS"].split()[0]), int(fields["RssAnon"].split()[0])]))
"""


def serve_modules(seconds: float) -> list[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(EXPORTER), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-X", "importtime", "-m", "smlens", "serve", "--backend", "sim"]
    try:
        done = subprocess.run(
            [*command, "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=seconds, env=env
        )
        log = done.stderr
    except subprocess.TimeoutExpired as stopped:
        log = stopped.stderr.decode() if isinstance(stopped.stderr, bytes) else (stopped.stderr or "")
    return [
        line.rsplit("|", 1)[1].strip()
        for line in log.splitlines()
        if line.startswith("import time:") and "imported package" not in line
    ]


def imported(modules: list[str], blocked: list[str], runs: int) -> tuple[int, int, int]:
    """Modules, VmRSS and RssAnon (KiB) of the best (smallest RSS) of ``runs`` fresh interpreters."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXPORTER), *filter(None, sys.path)])}
    results = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-S", "-c", _CHILD, json.dumps(blocked), json.dumps(modules)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        results.append(tuple(json.loads(out)))
    count, rss, anonymous = min(results, key=lambda r: r[1])
    return count, rss, anonymous


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long serve runs to list its imports")
    parser.add_argument("--own", default=OWN, help="smlens modules refused in the reference too")
    parser.add_argument(
        "--block", nargs="+", default=list(DEFAULT_BLOCKS), help="comma-separated packages, cumulative"
    )
    args = parser.parse_args()
    modules = serve_modules(args.seconds)
    refused = args.own.split(",")
    count, rss, anonymous = imported(modules, refused, args.runs)
    print(
        f"smlens serve imports {len(modules)} modules; the reference (without {args.own}): {count} modules, "
        f"RSS {rss / 1024:.2f} MiB, anonymous {anonymous / 1024:.2f} MiB"
    )
    for block in args.block:
        refused += block.split(",")
        left, rss_b, anonymous_b = imported(modules, refused, args.runs)
        print(
            f"also without {block}: {left} modules, RSS {rss_b / 1024:.2f} MiB, "
            f"saves {(rss - rss_b) / 1024:.2f} MiB (anonymous {(anonymous - anonymous_b) / 1024:.2f})"
        )
        count, rss, anonymous = left, rss_b, anonymous_b


if __name__ == "__main__":
    main()
