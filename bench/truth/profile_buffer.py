"""How the PM sampling hardware buffer copes with a long capture at 10 kHz, and what a capture costs a GEMM.

    PYTHONPATH=exporter python3 -m bench.truth.profile_buffer --out DIR

For each variant (append mode, buffer size, poll period) it captures a bf16 GEMM loop (bench/truth/phases.py
``gemm-rate``, 3 s) and reports samples kept, samples CUPTI returned without timestamps, the time the kept
samples cover against the capture's span, and the GEMM's TFLOP/s; runs without a capture in between.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from bench.truth.profile_truth import Child

from smlens.profile.cupti_session import Session, resolve_gpu

VARIANTS = (
    ("keep_oldest_256MiB_poll100ms", False, 256, 0.1),
    ("none", None, 0, 0),
    ("keep_latest_256MiB_poll100ms", True, 256, 0.1),
    ("keep_oldest_2GiB_poll100ms", False, 2048, 0.1),
    ("none", None, 0, 0),
    ("keep_oldest_256MiB_poll20ms", False, 256, 0.02),
)


def run(gpu: Any, keep_latest: bool | None, mib: int, poll: float) -> dict[str, Any]:
    child = Child("gemm-rate", "--seconds", "3")
    if keep_latest is None:
        child.go()
        return {"tflops": child.result()["tflops"]}
    with Session(gpu, 100_000, mib * 2**20, keep_latest) as session:
        session.start()
        child.go()
        while child.process.poll() is None:
            time.sleep(poll)
            session.poll()
        session.stop()
        rec = session.recording()
    start, end = np.asarray(rec.start_ns), np.asarray(rec.end_ns)
    span = (int(end[-1]) - int(start[0])) / 1e9 if len(rec) else 0.0
    covered = float((end - start).sum()) / 1e9
    return {
        "tflops": child.result()["tflops"],
        "kept": len(rec),
        "span_s": span,
        "covered_s": covered,
        "coverage": covered / span if span else None,
        **rec.notes,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    gpu = resolve_gpu("0")
    results = []
    for name, keep_latest, mib, poll in VARIANTS:
        try:
            r = {"variant": name, **run(gpu, keep_latest, mib, poll)}
        except Exception:
            r = {"variant": name, "error": traceback.format_exc()[-700:]}
        results.append(r)
        print(json.dumps(r), flush=True)
    (args.out / "profile_buffer.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
