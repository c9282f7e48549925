"""smlens profile's capture loop (smlens.profile.cupti_session.Session) without a GPU: the decode loop, the
hand-over of half-full images to the real worker process, and how samples without timestamps are handled.
CUPTI is the double in tests/fakes/fake_cupti (checked against cupti-python 13.4.0; its decoding behaves
as the H200 did)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import process_alive
from smlens.profile.counters import COUNTERS, PEAK_OF, PIPE_COUNTERS, REQUIRED
from smlens.profile.cupti_session import Gpu, Session
from smlens.profile.errors import ProfileError

GPU = Gpu(index=0, uuid="GPU-00000000-0000-0000-0000-000000000000", name="NVIDIA H200", cuda_ordinal=0)
INTERVAL = 100_000


def expected_values(first: int, last: int) -> np.ndarray:
    from cupti.profiler_host import value

    return np.array([[value(c, seq) for c in COUNTERS] for seq in range(first, last + 1)])


def capture(cupti: Any, batches: list[int], slots: int = 100) -> Any:
    with Session(GPU, INTERVAL, slots=slots) as session:
        session.start()
        for count in batches:
            cupti.HARDWARE.feed(count)
            session.poll()
        session.stop()
        return session.recording()


def test_images_go_to_the_worker_half_full_and_every_sample_comes_back_in_order(cupti: Any) -> None:
    recording = capture(cupti, [20] * 30 + [5])  # 605 records, 20 per decode: never near a full image
    assert len(recording) == 604  # all but the first, which began before sampling (start 0)
    assert np.array_equal(recording.values, expected_values(2, 605))
    assert np.array_equal(recording.start_ns[1:], recording.end_ns[:-1])  # contiguous
    assert np.all(recording.end_ns - recording.start_ns == INTERVAL)
    notes = recording.notes
    assert notes["images"] == 11  # handed over at 60 samples (>= 50 of 100), and the last at stop
    assert (notes["images_filled"], notes["timestamps_filled"], notes["dropped_untimed"]) == (0, 0, 0)
    assert notes["dropped_unclocked"] == 1
    assert recording.peaks["sm__warps_active.avg"] == 64.0 and recording.peaks["dram__bytes.sum"] == 1504.0


def test_the_pipe_counters_and_their_peaks_are_recorded(cupti: Any) -> None:
    """Where PM sampling takes every counter in one pass (the double does; GH100 does not, below)."""
    from cupti.profiler_host import PEAKS  # the double's, on the path the fixture set

    recording = capture(cupti, [20, 5])
    assert list(recording.counters) == list(COUNTERS)
    assert {c: recording.peaks[c] for c in PIPE_COUNTERS} == {
        c: PEAKS[f"{c}.peak_sustained"] for c in PIPE_COUNTERS
    }
    assert "pipes_refused" not in recording.notes


# Passes PM sampling needs on GH100 for the required counters plus these pipe counters, as CUPTI 13.4's host
# API counted them on the H200 (bench/truth/profile_verdicts.py, `passes`): any pipe counter beside the
# required ones takes a second pass, so Collector.configure refuses every such set.
FMA, FP64, ALU = PIPE_COUNTERS
GH100_PASSES = {
    (FMA, FP64, ALU): 5,
    (FMA, ALU): 3,
    (FMA, FP64): 4,
    (FP64, ALU): 4,
    (FMA,): 2,
    (ALU,): 2,
    (FP64,): 3,
    (): 1,
}
UNSUPPORTED = (
    "Requested PM sampling configuration is not supported. This may mean the requested metrics cannot"
)


def one_pass_only(
    monkeypatch: pytest.MonkeyPatch, passes: dict[tuple[str, ...], int]
) -> list[tuple[str, ...]]:
    """Collector.configure refuses what needs more than one pass (ValueError, as cupti-python 13.4.0 turns
    ERROR_NOT_SUPPORTED); returns the pipe counters of each set asked for, in order."""
    from cupti import pm_sampling

    configure = pm_sampling.Collector.configure
    asked: list[tuple[str, ...]] = []

    def single_pass(self: Any, **kwargs: Any) -> None:
        pipes = tuple(c for c in PIPE_COUNTERS if c in kwargs["metrics"])
        asked.append(pipes)
        if passes[pipes] > 1:
            raise ValueError(UNSUPPORTED)
        configure(self, **kwargs)

    monkeypatch.setattr(pm_sampling.Collector, "configure", single_pass)
    return asked


def test_on_gh100_pm_sampling_takes_no_pipe_counter_and_the_rest_is_sampled(
    cupti: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every set with a pipe counter is refused, the largest first; the required counters alone are sampled,
    and the recording says which pipe counters it lacks and why."""
    from cupti.profiler_host import value

    asked = one_pass_only(monkeypatch, GH100_PASSES)
    recording = capture(cupti, [20, 5])
    assert asked == [(FMA, FP64, ALU), (FMA, ALU), (FMA, FP64), (FP64, ALU), (FMA,), (ALU,), (FP64,), ()]
    assert list(recording.counters) == list(REQUIRED)
    assert np.array_equal(recording.values, [[value(c, q) for c in REQUIRED] for q in range(2, 26)])
    assert set(recording.peaks) == {c for c in PEAK_OF if c in REQUIRED}
    assert recording.notes["pipes_refused"] == f"{FMA}, {FP64}, {ALU} left out: {UNSUPPORTED}"


def test_where_some_pipe_counters_fit_it_keeps_the_most_and_says_which_it_left_out(
    cupti: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chip that takes two pipe counters beside the required ones: FMA and ALU, not FP64."""
    asked = one_pass_only(monkeypatch, {**GH100_PASSES, (FMA, ALU): 1, (FMA,): 1, (ALU,): 1})
    recording = capture(cupti, [20, 5])
    assert asked == [(FMA, FP64, ALU), (FMA, ALU)]
    assert list(recording.counters) == [*REQUIRED, FMA, ALU]
    assert set(recording.peaks) == {c for c in PEAK_OF if c in REQUIRED or c in (FMA, ALU)}
    assert recording.notes["pipes_refused"] == f"{FP64} left out: {UNSUPPORTED}"


def test_a_configuration_refused_whatever_the_counters_stops_the_capture(
    cupti: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal that is not the counters' (the trigger mode, say): even the required ones alone are
    refused, and the capture stops with one sentence naming CUPTI's reason."""
    one_pass_only(monkeypatch, dict.fromkeys(GH100_PASSES, 2))
    with pytest.raises(ProfileError, match="cannot sample smlens' counters: Requested PM sampling"):
        capture(cupti, [20, 5])


def test_a_stalled_loop_fills_images_and_the_untimed_samples_are_placed_where_they_fit(cupti: Any) -> None:
    recording = capture(cupti, [20, 20, 250, 20, 20])  # 250 at once: more than an image's free slots
    notes = recording.notes
    assert notes["images_filled"] >= 2
    assert notes["timestamps_filled"] > 0 and notes["dropped_untimed"] == 0
    assert len(recording) == 329
    assert np.array_equal(recording.values, expected_values(2, 330))
    assert np.array_equal(recording.start_ns[1:], recording.end_ns[:-1])


def test_untimed_samples_with_nothing_timed_after_them_are_dropped_and_counted(cupti: Any) -> None:
    recording = capture(cupti, [20, 250])  # the capture ends inside the untimed run, as the quiet A/B arm did
    notes = recording.notes
    assert notes["dropped_untimed"] > 0 and notes["timestamps_filled"] == 0
    assert len(recording) + notes["dropped_untimed"] + notes["dropped_unclocked"] == 270


def test_an_overflowed_hardware_buffer_stops_the_capture_with_one_sentence(cupti: Any) -> None:
    cupti.HARDWARE.capacity = 50
    with pytest.raises(ProfileError, match="sample buffer overflowed before it was decoded"):
        capture(cupti, [60])


def test_capture_polls_while_the_gpu_writes_and_reports_progress(
    cupti: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from smlens.profile import cupti_session

    hardware = cupti.HARDWARE
    stop = threading.Event()

    # What is asserted must not hang on how the host schedules two threads and a worker process: the GPU
    # writes while the capture polls, but never so far ahead of the decoding that an image could fill, and
    # the capture's clock moves one poll period only once the GPU has written something to decode.
    def gpu() -> None:
        while not stop.is_set():
            if len(hardware.waiting) < 50:
                hardware.feed(10)
            stop.wait(0.001)

    class Clock:
        now = 0.0
        perf_counter = staticmethod(time.perf_counter)
        process_time = staticmethod(time.process_time)

        @staticmethod
        def monotonic() -> float:
            return Clock.now

        @staticmethod
        def sleep(seconds: float) -> None:
            deadline = time.monotonic() + 60
            while len(hardware.waiting) < 20 and time.monotonic() < deadline:
                time.sleep(0.001)
            Clock.now += seconds

    monkeypatch.setattr(cupti_session, "time", Clock)
    writer = threading.Thread(target=gpu)
    writer.start()
    progress: list[tuple[float, int]] = []
    try:
        recording = cupti_session.capture(GPU, 0.6, INTERVAL, lambda t, n: progress.append((t, n)))
    finally:
        stop.set()
        writer.join()
    assert len(progress) >= 2 and progress[-1][1] > progress[0][1] > 0
    assert len(recording) > 100 and recording.notes["images_filled"] == 0
    assert np.array_equal(recording.start_ns[1:], recording.end_ns[:-1])


def _no_worker_left() -> bool:
    import multiprocessing

    return not multiprocessing.active_children()


@pytest.mark.parametrize(
    ("call", "status", "sentence"),
    [
        (
            "pm_sampling_enable",
            "ERROR_INSUFFICIENT_PRIVILEGES",
            "no permission to read GPU 0's performance counters",
        ),
        (
            "pm_sampling_enable",
            "ERROR_INVALID_OPERATION",
            "CUPTI cannot start PM sampling on GPU 0: PM sampling is",
        ),
        (
            "pm_sampling_enable",
            "ERROR_OUT_OF_MEMORY",
            "CUPTI cannot start PM sampling on GPU 0: Memory allocation",
        ),
        (
            "pm_sampling_set_config",
            "ERROR_HARDWARE_BUSY",
            "another profiler holds GPU 0's performance counters",
        ),
        (
            "pm_sampling_set_config",
            "ERROR_NOT_SUPPORTED",
            "GPU 0 cannot sample smlens' counters: Requested PM",
        ),
        ("pm_sampling_start", "ERROR_HARDWARE_BUSY", "another profiler holds GPU 0's performance counters"),
        ("pm_sampling_decode_data", "ERROR_UNKNOWN", "CUPTI failed on GPU 0: ERROR_UNKNOWN (999)."),
        (
            "pm_sampling_stop",
            "ERROR_UNKNOWN",
            "CUPTI failed to stop PM sampling on GPU 0: ERROR_UNKNOWN (999).",
        ),
    ],
)
def test_each_cupti_failure_is_one_sentence_and_releases_the_worker(
    cupti: Any, call: str, status: str, sentence: str
) -> None:
    cupti.HARDWARE.fail[call] = cupti.Result[status]
    with pytest.raises(ProfileError) as raised:
        capture(cupti, [20, 20])
    assert str(raised.value).startswith(sentence)
    assert _no_worker_left()


def test_a_worker_killed_mid_capture_is_one_sentence(cupti: Any) -> None:
    import multiprocessing
    import os
    import signal

    from smlens.profile.evaluator import EvaluatorError

    with pytest.raises(EvaluatorError) as raised, Session(GPU, INTERVAL, slots=100) as session:
        session.start()
        (worker,) = multiprocessing.active_children()
        os.kill(worker.pid or 0, signal.SIGKILL)
        worker.join(10)
        for _ in range(10):
            cupti.HARDWARE.feed(60)  # each poll hands an image over: the first one after the kill fails
            session.poll()
    assert str(raised.value) == (
        "evaluating the samples failed in the worker process: it ended unexpectedly (killed, or out of "
        "memory?)."
    )
    assert _no_worker_left()


DRIVER = Path(__file__).parent / "profile_capture_driver.py"


def _start_capture(tmp_path: Path, *driver_args: str) -> tuple[subprocess.Popen[str], int]:
    """``smlens profile --seconds 60`` over the double, in its own process group; (process, worker pid)."""
    import select

    from conftest import REPO

    process = subprocess.Popen(
        [
            sys.executable,
            str(DRIVER),
            *driver_args,
            "--seconds",
            "60",
            "--interval-us",
            "100",
            "--out",
            str(tmp_path / "r.html"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 60)
    assert ready, "the evaluator did not start within 60 s"
    word, pid = process.stdout.readline().split()
    assert word == "worker" and process_alive(int(pid))
    time.sleep(0.5)  # capturing
    return process, int(pid)


def _left_in_group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                if os.getpgid(int(entry.name)) == pgid and process_alive(int(entry.name)):
                    left.append(int(entry.name))
    return left


def _gone(*pids: int, group: int | None = None, within_s: float = 20) -> bool:
    """Whether ``pids`` and every process of ``group`` end within ``within_s``."""

    def left() -> bool:
        return any(map(process_alive, pids)) or bool(group and _left_in_group(group))

    deadline = time.monotonic() + within_s
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not left()


def test_ctrl_c_ends_the_capture_early_and_keeps_it(tmp_path: Path) -> None:
    process, worker = _start_capture(tmp_path)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal sends: to the worker too
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "reporting what was captured." in stderr
    assert (tmp_path / "r.html").stat().st_size > 0
    assert _gone(worker, group=process.pid)


def test_sigterm_is_one_sentence_and_exit_1(tmp_path: Path) -> None:
    process, worker = _start_capture(tmp_path)
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert (
        stderr.rsplit("\n", 2)[-2]
        == "smlens: stopped by SIGTERM before the capture finished: nothing was written."
    )
    assert "Traceback" not in stderr
    assert _gone(worker, group=process.pid)


def test_a_killed_capture_leaves_no_process_and_no_warning(tmp_path: Path) -> None:
    process, worker = _start_capture(tmp_path)
    process.kill()  # SIGKILL to the capture only: nothing in it can clean up
    try:
        _, stderr = process.communicate(timeout=60)  # till every process that shares its stderr ends
        assert _gone(worker, group=process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert "Traceback" not in stderr
    assert "resource_tracker" not in stderr  # multiprocessing's warning about semaphores it cleans up


def test_a_hung_worker_is_one_sentence_and_exit_1(tmp_path: Path) -> None:
    process, worker = _start_capture(tmp_path, "--hang-worker")  # no result for 2 s is a hung worker
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 1
    assert stderr.rsplit("\n", 2)[-2] == (
        "smlens: evaluating the samples failed in the worker process: it gave no answer in 2 s (stuck "
        "inside CUPTI?)."
    )
    assert "Traceback" not in stderr
    assert _gone(worker, group=process.pid)
