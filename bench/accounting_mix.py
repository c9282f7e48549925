"""The accounting counters of one GPU through a mix of work, against the wall clock.

    PYTHONPATH=exporter python3 -m bench.accounting_mix [--gpu 0] [--out DIR]

Runs ``smlens serve --metrics default,accounting`` on the GPU host and, one after another: nothing at
all (no process on the GPU), Hugging Face GPT-2 training steps, a bf16 GEMM, and a process that holds
2 GiB and runs nothing. Prints, as JSON, each phase's wall time, the seconds gpu_verdict_seconds_total
added per class over the whole run and over the phase without a process, how many accounting series the
GPU has at the end, and how many series the GPU has in all. A good result: the seconds added equal the
run's wall time, the phase without a process is all ``idle``, GPT-2 training is ``stalled``, the GEMM
``compute_bound``, the held memory ``idle_memory_held`` (the few seconds a workload takes to start and
stop land in the class of what the GPU did then).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.truth.exporter import Exporter
from bench.truth.metrics import Scrape, seconds_by_verdict
from bench.truth.workloads import Gemm, Gpt2Train

from smlens import names as n

PHASE_SECONDS = {"no_process": 15.0, "gpt2_train": 40.0, "gemm_bf16": 20.0, "memory_held": 15.0}


def _run(workload: Any, seconds: float) -> float:
    workload.prepare()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        workload.step()
    workload.release()
    return time.monotonic() - started


def _series(scrape: Scrape, gpu: str) -> tuple[int, int]:
    """The GPU's accounting series, and all of its series."""
    accounts = sum(
        1 for labels in scrape.samples.get(f"{n.GPU_VERDICT_SECONDS}_total", {}) if (n.GPU, gpu) in labels
    )
    every = sum(1 for series in scrape.samples.values() for labels in series if (n.GPU, gpu) in labels)
    return accounts, every


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--gpu", default="0", help="NVML index of the GPU (default 0)")
    parser.add_argument("--out", type=Path, default=Path("accounting-out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    phases: dict[str, float] = {}
    with Exporter(args.out / "exporter.log", 1.0, "--metrics", "default,accounting") as exporter:
        exporter.wait_ready()
        time.sleep(3)
        first = exporter.scrape()
        time.sleep(PHASE_SECONDS["no_process"])
        phases["no_process"] = PHASE_SECONDS["no_process"]
        without_process = exporter.scrape()
        phases["gpt2_train"] = _run(Gpt2Train(), PHASE_SECONDS["gpt2_train"])
        phases["gemm_bf16"] = _run(
            Gemm("gemm_bf16", 8192, 16, "bf16 GEMM 8192^3"), PHASE_SECONDS["gemm_bf16"]
        )
        import torch  # type: ignore[import-not-found,unused-ignore]

        held = torch.empty(2**31, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        time.sleep(PHASE_SECONDS["memory_held"])
        phases["memory_held"] = PHASE_SECONDS["memory_held"]
        last = exporter.scrape()
        del held
    accounts, every = _series(last, args.gpu)
    result = {
        "phases_seconds": {k: round(v, 2) for k, v in phases.items()},
        "wall_seconds": round(last.at - first.at, 2),
        "seconds_by_verdict": {k: round(v, 2) for k, v in seconds_by_verdict(first, last, args.gpu).items()},
        "no_process_seconds_by_verdict": {
            k: round(v, 2) for k, v in seconds_by_verdict(first, without_process, args.gpu).items()
        },
        "accounting_series": accounts,
        "series_of_the_gpu": every,
    }
    (args.out / "accounting_mix.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
