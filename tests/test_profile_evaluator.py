"""smlens profile's evaluation pipeline without a GPU: real worker process, real shared images; only the two
CUPTI calls (ready an image, evaluate a sample) are replaced (tests/profile_worker_double.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import process_alive
from profile_worker_double import HUNG_MARK, evaluate, failing, hanging, prepare
from smlens.profile import evaluator
from smlens.profile.cupti_session import image_slots
from smlens.profile.evaluator import EvaluatorError, ImagePipeline

SIZE = 4096


def zero(image: np.ndarray) -> None:
    image[:] = 0


def test_images_are_evaluated_in_another_process_in_order_and_reused_only_once_evaluated() -> None:
    initialized: list[int] = []  # the address of each image readied

    def initialize(image: np.ndarray) -> None:
        initialized.append(image.ctypes.data)
        zero(image)

    pipeline = ImagePipeline(SIZE, initialize, prepare, ("GH100",), job=evaluate, max_images=2)
    try:
        patterns = []
        for k in range(6):
            image = pipeline.take()
            assert not image.array[:16].any(), "a reused image is readied again before decoding"
            image.array[: 10 + k] = k + 1  # what "decoding" wrote
            patterns.append([k + 1] * (10 + k))
            pipeline.hand_over(image, 10 + k)
        results = pipeline.results()
    finally:
        pipeline.close()
    assert [r.values[:, 0].tolist() for r in results] == patterns  # no image was overwritten early
    assert len(set(initialized)) == 2 and len(initialized) >= 6  # two images, each readied before reuse
    assert pipeline.waits >= 1  # the evaluations were slower than the hand-overs
    assert results[0].peaks is not None and int(results[0].peaks[0]) != os.getpid()
    assert all(r.peaks is None for r in results[1:])  # the peaks are read once


def test_a_worker_that_cannot_prepare_fails_at_once() -> None:
    with pytest.raises(
        EvaluatorError, match=r"^the process that evaluates the samples could not start: no host"
    ):
        ImagePipeline(SIZE, zero, prepare, ("broken",), job=evaluate)


def test_a_failed_evaluation_surfaces_when_the_results_are_read() -> None:
    pipeline = ImagePipeline(SIZE, zero, prepare, ("GH100",), job=failing)
    try:
        pipeline.hand_over(pipeline.take(), 3)
        with pytest.raises(
            EvaluatorError, match=r"^evaluating the samples failed in the worker process: bad counter"
        ):
            pipeline.results()
    finally:
        pipeline.close()


@pytest.mark.parametrize("read_results", [True, False])
def test_a_hung_worker_is_waited_for_within_a_bound_then_killed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, read_results: bool
) -> None:
    # a worker stuck inside CUPTI: reading its results, or closing without them, must not wait forever
    monkeypatch.setattr(evaluator, "RESULT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(evaluator, "CLOSE_TIMEOUT_S", 1.0)
    hung = tmp_path / "hung"
    monkeypatch.setenv(HUNG_MARK, str(hung))
    pipeline = ImagePipeline(SIZE, zero, prepare, ("GH100",), job=hanging)
    (worker,) = multiprocessing.active_children()
    raised: list[BaseException] = []

    def use() -> None:
        try:
            pipeline.hand_over(pipeline.take(), 3)
            deadline = time.monotonic() + 20
            while not hung.exists() and time.monotonic() < deadline:  # the worker is inside the evaluation
                time.sleep(0.01)
            if read_results:
                pipeline.results()
        except BaseException as exc:
            raised.append(exc)
        finally:
            pipeline.close()

    thread = threading.Thread(target=use, daemon=True)
    thread.start()
    thread.join(20)
    stuck = thread.is_alive()
    if stuck:  # let the pipeline go
        os.kill(worker.pid or 0, signal.SIGKILL)
        thread.join(20)
    assert not stuck, "the pipeline was still waiting for the worker after 20 s"
    assert not process_alive(worker.pid or 0)
    sentence = (
        "evaluating the samples failed in the worker process: it gave no answer in 1 s (stuck inside CUPTI?)."
    )
    assert [str(exc) for exc in raised] == ([sentence] if read_results else [])


@pytest.mark.parametrize(("interval_us", "slots"), [(100, 4000), (200, 2000), (1000, 400), (10_000, 256)])
def test_an_image_holds_twice_the_headroom(interval_us: int, slots: int) -> None:
    # handed over half full, an image keeps 0.2 s of room (HEADROOM_S) for a late decode
    assert image_slots(interval_us * 1000) == slots
