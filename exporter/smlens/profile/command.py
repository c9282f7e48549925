"""``smlens profile``: capture one GPU with CUPTI PM sampling, print a summary, write the report."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smlens.errors import SmlensError
from smlens.verdicts import thresholds

if TYPE_CHECKING:
    from smlens.profile.recording import Recording

MIN_INTERVAL_US = 100  # 10 kHz
# Not the top rate by default: decoding and the evaluator process cost host CPU in step with the rate
# (docs/profile.md, Cost).
DEFAULT_INTERVAL_US = 200
MAX_INTERVAL_US = 1_000_000
MAX_SECONDS = 600
# The modules of the extra (pip install 'smlens[profile]'), as the sentence about a missing one names them.
EXTRA = {"cupti": "NVIDIA's cupti-python", "numpy": "numpy"}


def add_parser(commands: Any, formatter: Any) -> None:
    summary = "capture one GPU's SM activity at up to 10 kHz (CUPTI PM sampling) and report it"
    profile = commands.add_parser(
        "profile",
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}. Every process on the GPU is captured. Needs "
        "pip install 'smlens[profile]' and the right to read performance counters.",
        usage="smlens profile [options]",
        formatter_class=formatter,
    )
    profile.add_argument("--gpu", default="0", help="NVML index or UUID of the GPU (default: 0)")
    profile.add_argument("--seconds", type=float, default=10.0, help="capture length (default: 10)")
    profile.add_argument(
        "--interval-us",
        type=int,
        default=DEFAULT_INTERVAL_US,
        help=f"sampling interval, {MIN_INTERVAL_US} to {MAX_INTERVAL_US} (default: {DEFAULT_INTERVAL_US})",
    )
    profile.add_argument(
        "--out",
        default="smlens-profile.html",
        help="HTML report, '-' for stdout (default: smlens-profile.html)",
    )
    profile.add_argument("--json", type=Path, help="also write the samples and the summary to this file")
    profile.add_argument("--thresholds", type=Path, help="thresholds file (its hollow_sm_active is used)")
    profile.add_argument("--from-json", type=Path, help="analyse a capture written by --json (no GPU needed)")


def _progress(elapsed: float, samples: int, seconds: float) -> None:
    print(
        f"\rcapturing {elapsed:5.1f}/{seconds:g} s, {samples} samples decoded",
        end="",
        file=sys.stderr,
        flush=True,
    )


def check_extra(capturing: bool) -> None:
    """One sentence if a module of the extra does not import: the analysis imports numpy, and a capture
    needs cupti-python too (a recording given by --from-json does not)."""
    missing = []
    for module in ("cupti", "numpy") if capturing else ("numpy",):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            root = (exc.name or module).split(".")[0]
            if root != module:  # installed, but something it imports is not
                raise SmlensError(
                    f"smlens profile needs {EXTRA[module]}, which cannot load ({root} is missing): "
                    "pip install 'smlens[profile]'."
                ) from None
            missing.append(EXTRA[module])
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise SmlensError(
            f"smlens profile needs {' and '.join(missing)}, which {verb} not installed: "
            "pip install 'smlens[profile]'."
        )


def run(args: argparse.Namespace) -> int:
    if not 0 < args.seconds <= MAX_SECONDS:
        raise SmlensError(f"--seconds must be above 0 and at most {MAX_SECONDS}, got {args.seconds:g}.")
    if not MIN_INTERVAL_US <= args.interval_us <= MAX_INTERVAL_US:
        raise SmlensError(
            f"--interval-us must be {MIN_INTERVAL_US} (10 kHz) to {MAX_INTERVAL_US} (1 Hz), "
            f"got {args.interval_us}."
        )
    if args.interval_us > args.seconds * 1e6:
        raise SmlensError(
            f"--interval-us {args.interval_us} is longer than the capture (--seconds {args.seconds:g}): "
            "it would hold no sample."
        )
    limits = thresholds.load(args.thresholds)
    for path in (None if args.out == "-" else Path(args.out), args.json):
        if path is not None:
            _check_writable(path)
    check_extra(capturing=args.from_json is None)  # before the first import of numpy, below
    from smlens.profile.recording import Recording
    from smlens.profile.report import render_html
    from smlens.profile.summary import render_text, summarize

    recording = Recording.load(args.from_json) if args.from_json is not None else _capture(args)
    if len(recording) == 0:
        raise SmlensError("the capture holds no sample (the GPU clock did not advance?).")
    summary = summarize(recording, limits)
    page = render_html(recording, summary)
    if args.out == "-":
        sys.stdout.write(page)
        print(render_text(summary), file=sys.stderr)
    else:
        _write(Path(args.out), page)
        print(render_text(summary))
        print(f"report: {args.out}")
    if args.json is not None:
        _write(args.json, json.dumps({"summary": summary, "capture": recording.to_json()}))
        if args.out != "-":
            print(f"samples and summary: {args.json}")
    return 0


def _capture(args: argparse.Namespace) -> Recording:
    from smlens.profile.cupti_session import capture, import_cupti, resolve_gpu

    import_cupti()
    gpu = resolve_gpu(str(args.gpu))
    try:
        recording = capture(
            gpu, args.seconds, args.interval_us * 1000, lambda e, n: _progress(e, n, args.seconds)
        )
    finally:
        print(file=sys.stderr)  # ends the progress line, before any sentence about a failure
    interrupted = recording.notes.get("interrupted_after_s")
    if interrupted is not None:
        print(
            f"interrupted after {interrupted:g} of {args.seconds:g} s: reporting what was captured.",
            file=sys.stderr,
        )
    return recording


def _check_writable(path: Path) -> None:
    """Fail now, not after a capture that cannot be repeated (tried, not guessed: root passes os.access)."""
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as exc:
        raise SmlensError(f"cannot write {path}: {exc.strerror}.") from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise SmlensError(f"cannot write {path}: {exc.strerror}.") from None
