"""Counter evaluation in a worker process, so that a capture's decode loop does nothing but drain the GPU.

Turning a decoded sample into counter values (``cuptiProfilerHostEvaluateToGpuValues``) costs host time of
its own; done in the loop that drains the GPU's sample buffer, it would hold the drain up until the buffer
overflows at high rates. Here the loop hands each counter-data image, once it holds enough
samples, to one worker process and goes on decoding into the next image; the worker evaluates the image's
samples and the image is reused once they are back.

Images live in memfd shared memory: no copy, and no dependence on the size of ``/dev/shm`` (64 MiB in a
container by default, less than one image). The worker maps an image through ``/proc/<pid>/fd/<fd>``.
cupti-python documents this use of a decoded image (``cupti.pm_sampling.CounterData``: "serialized to defer or
offload metric extraction to another process"). No CUPTI import at module level: the worker imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from smlens.errors import SmlensError

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# The longest waits for the worker: beyond them it is taken as stuck (inside CUPTI, as nothing else blocks).
START_TIMEOUT_S = 120.0  # a fresh interpreter that imports numpy and CUPTI, on a busy host
RESULT_TIMEOUT_S = 60.0  # one image's values: far beyond what evaluating one takes
CLOSE_TIMEOUT_S = 5.0  # its exit once its jobs end; then it is killed
STARTING = "the process that evaluates the samples could not start"
EVALUATING = "evaluating the samples failed in the worker process"
ENDED = "it ended unexpectedly (killed, or out of memory?)"


class EvaluatorError(SmlensError):
    """The worker process failed, ended or stopped answering; one sentence for the user."""


class SharedImage:
    """A counter-data image in memory that the worker process maps too."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("smlens-counter-data")
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size)
        self.array: np.ndarray = np.frombuffer(self._map, dtype=np.uint8)
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        del self.array
        # an array may still refer to the map (in the traceback of a failed decode): then it goes with it
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self.fd)


@dataclass(frozen=True)
class Evaluated:
    values: np.ndarray  # samples x counters, float64
    peaks: np.ndarray | None  # the peak sub-metrics, read from the image's first sample when asked
    cpu_s: float  # the worker's CPU time so far
    max_rss_kib: int  # the worker's peak resident set so far


Job = Callable[[str, int, int, bool], Evaluated]

# The worker's state: its own CUPTI host object and the images it has mapped (by path).
_host: Any = None
_metrics: tuple[list[str], list[str]] = ([], [])
_maps: dict[str, np.ndarray] = {}


def _serve(
    jobs: Connection, parent: int, prepare: Callable[..., None], prepare_args: tuple[Any, ...], job: Job
) -> None:
    """The worker process: ``prepare``, then each job's arguments in turn, answering each (a string is why
    it failed) until the parent closes the pipe. Ctrl-C is the parent's to handle (it stops the capture and
    then this process), and this process dies with the parent, whatever kills it: busy in a job, it would
    not see the pipe close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)
    with contextlib.suppress(EOFError, OSError):  # the parent is done, or gone
        jobs.send(_outcome(prepare, prepare_args))
        while True:
            jobs.send(_outcome(job, jobs.recv()))


def _outcome(call: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        return call(*args)
    except Exception as exc:  # the parent tells the user; an exception may not survive pickling
        return str(exc) or type(exc).__name__


def prepare(chip: str, counters: Sequence[str], peaks: Sequence[str]) -> None:
    """In the worker: the CUPTI host object that evaluates images of ``chip`` (runs once, first)."""
    global _host, _metrics
    from cupti import profiler_host  # type: ignore[import-not-found,import-untyped,unused-ignore]

    host = profiler_host.ProfilerHost(chip, profiler_host.ProfilerType.PM_SAMPLING)
    host.initialize()
    _host, _metrics = host, (list(counters), [*counters, *peaks])


def image_view(path: str, size: int) -> np.ndarray:
    """In the worker: the shared image at ``path``, mapped once."""
    view = _maps.get(path)
    if view is None:
        with open(path, "rb") as f:
            view = np.frombuffer(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ), dtype=np.uint8)
        _maps[path] = view
    return view


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM: unlike ru_maxrss, not inherited from the parent's fork)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _usage() -> tuple[float, int]:
    return time.process_time(), peak_rss_kib()


def evaluate(path: str, size: int, count: int, with_peaks: bool) -> Evaluated:
    """In the worker: the counter values of samples 0..count-1 of the image at ``path``."""
    image = image_view(path, size)
    counters, everything = _metrics
    values = np.empty((count, len(counters)))
    peaks = None
    for index in range(count):
        if with_peaks and index == 0:
            row = _host.evaluate_metric_values(image, everything, 0)
            values[0], peaks = row[: len(counters)], row[len(counters) :]
        else:
            values[index] = _host.evaluate_metric_values(image, counters, index)
    return Evaluated(values, peaks, *_usage())


class ImagePipeline:
    """Counter-data images handed to one worker process in capture order, each reused once evaluated.

    ``initialize(array)`` readies an image for decoding (in this process); ``prepare`` with ``prepare_args``
    runs first in the worker; ``job`` evaluates one image there. At most ``max_images`` images exist: when
    none is free, taking one waits for the oldest evaluation. Any failure of the worker, its end, or a wait
    for it longer than its timeout is raised as :class:`EvaluatorError`. Create it in the main thread: the
    worker dies with the thread that started it."""

    def __init__(
        self,
        image_bytes: int,
        initialize: Callable[[np.ndarray], None],
        prepare: Callable[..., None],
        prepare_args: tuple[Any, ...],
        job: Job = evaluate,
        max_images: int = 3,
    ) -> None:
        self.image_bytes = image_bytes
        self._initialize = initialize
        self._max = max_images
        self._images: list[SharedImage] = []
        self._free: list[SharedImage] = []
        self._pending: deque[SharedImage] = deque()  # handed over, in order; their answers are owed
        self._evaluated: list[Evaluated] = []
        self._peaks_asked = False
        self.waits = 0  # times the decode loop had to wait for the worker to free an image
        # spawn, not fork: this process holds a CUDA context and CUPTI state a forked child must not inherit.
        # A plain process and a pipe: no lock or semaphore that a killed capture would leave to clean up.
        context = multiprocessing.get_context("spawn")
        self._jobs, theirs = context.Pipe()
        args = (theirs, os.getpid(), prepare, prepare_args, job)
        self._worker = context.Process(target=_serve, args=args, daemon=True)
        try:
            with contextlib.closing(theirs):  # left open here, it would hide the worker's end from ours
                self._worker.start()
            self._answer(START_TIMEOUT_S, STARTING)
        except BaseException as exc:
            self.close()
            if isinstance(exc, EvaluatorError) or not isinstance(exc, Exception):
                raise
            raise EvaluatorError(f"{STARTING}: {exc}.") from None

    def take(self) -> SharedImage:
        """A fresh image to decode into."""
        self._recycle(wait=False)
        if not self._free and len(self._images) >= self._max:
            self.waits += 1
            self._recycle(wait=True)
        if self._free:
            return self._free.pop()
        image = SharedImage(self.image_bytes)
        self._images.append(image)
        self._initialize(image.array)
        return image

    def hand_over(self, image: SharedImage, count: int) -> None:
        """Evaluate samples 0..count-1 of ``image`` in the worker; the image is reused afterwards."""
        with_peaks = count > 0 and not self._peaks_asked
        self._peaks_asked |= with_peaks
        try:
            self._jobs.send((image.path, image.size, count, with_peaks))
        except OSError:  # the worker ended
            raise EvaluatorError(f"{EVALUATING}: {ENDED}.") from None
        self._pending.append(image)

    def _recycle(self, wait: bool) -> None:
        while self._pending and (wait or self._jobs.poll()):
            image = self._receive()  # a worker failure stops the capture here
            self._initialize(image.array)
            self._free.append(image)
            wait = False

    def _receive(self) -> SharedImage:
        """The oldest image handed over, once its values are back."""
        self._evaluated.append(self._answer(RESULT_TIMEOUT_S, EVALUATING))
        return self._pending.popleft()

    def _answer(self, timeout_s: float, failure: str) -> Any:
        try:
            if not self._jobs.poll(timeout_s):
                raise EvaluatorError(
                    f"{failure}: it gave no answer in {timeout_s:g} s (stuck inside CUPTI?)."
                )
            answer = self._jobs.recv()
        except (EOFError, OSError):
            raise EvaluatorError(f"{failure}: {ENDED}.") from None
        if isinstance(answer, str):
            raise EvaluatorError(f"{failure}: {answer.rstrip('.')}.")
        return answer

    def results(self) -> list[Evaluated]:
        """Every image's values, in the order the images were handed over (waits for the worker)."""
        while self._pending:
            self._receive()
        return self._evaluated

    def close(self) -> None:
        """End the worker and free the images. Its pipe closed, the worker exits once its current job is
        done; one that has not within ``CLOSE_TIMEOUT_S`` (stuck inside CUPTI) is killed."""
        self._jobs.close()
        if self._worker.is_alive():  # also False when it never started
            self._worker.join(CLOSE_TIMEOUT_S)
            if self._worker.exitcode is None:
                self._worker.kill()
                self._worker.join(CLOSE_TIMEOUT_S)
        self._pending.clear()
        for image in self._images:
            image.close()
        self._images, self._free = [], []
