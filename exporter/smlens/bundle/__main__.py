"""Write the bundle's files.

``python -m smlens.bundle rules|dashboards|alertmanager --out DIR [--thresholds FILE]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from smlens.bundle.files import GENERATORS
from smlens.errors import SmlensError
from smlens.verdicts import thresholds


def write(directory: Path, files: Mapping[str, str]) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
    except OSError as exc:
        raise SmlensError(f"cannot write to {directory}: {exc.strerror}.") from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m smlens.bundle",
        description="Write smlens' Prometheus rules, Grafana dashboards or Alertmanager routes.",
    )
    parser.add_argument("what", choices=sorted(GENERATORS), help="which part of the bundle to write")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the files into")
    parser.add_argument(
        "--thresholds", type=Path, help="YAML file whose keys override the shipped thresholds"
    )
    args = parser.parse_args(argv)
    try:
        files = GENERATORS[args.what](thresholds.load(args.thresholds))
        write(args.out, files)
    except SmlensError as exc:
        print(f"smlens.bundle: {exc}", file=sys.stderr)
        return 1
    for name in files:
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
