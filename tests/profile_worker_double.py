"""Stand-ins for the CUPTI side of smlens.profile.evaluator's worker, importable by its spawned process.

They replace only what CUPTI does (readying an image, evaluating a sample); the pipeline, the shared memory
and the worker process are the real ones. ``evaluate`` reads "sample" i as byte i of the image, so a test can
see which bytes the worker saw."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from smlens.profile import evaluator

SLOW_S = 0.05  # each evaluation takes this long, so that the decode side has to wait for images
HUNG_MARK = "PROFILE_WORKER_DOUBLE_HUNG"
_prepared: dict[str, object] = {}


def prepare(tag: str) -> None:
    if tag == "broken":
        raise RuntimeError("no host for this chip")
    _prepared["tag"] = tag


def evaluate(path: str, size: int, count: int, with_peaks: bool) -> evaluator.Evaluated:
    assert _prepared, "prepare ran first"
    time.sleep(SLOW_S)
    image = evaluator.image_view(path, size)
    values = image[:count].astype(np.float64).reshape(-1, 1)
    peaks = np.array([float(os.getpid())]) if with_peaks else None
    return evaluator.Evaluated(values, peaks, time.process_time(), 0)


def failing(path: str, size: int, count: int, with_peaks: bool) -> evaluator.Evaluated:
    raise ValueError("bad counter data")


def hanging(path: str, size: int, count: int, with_peaks: bool) -> evaluator.Evaluated:
    """Never returns, as a call stuck inside CUPTI would not; first creates the file named by $HUNG_MARK."""
    if HUNG_MARK in os.environ:
        Path(os.environ[HUNG_MARK]).touch()
    while True:
        time.sleep(3600)
