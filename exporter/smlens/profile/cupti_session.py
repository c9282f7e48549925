"""PM sampling of one GPU through NVIDIA's cupti-python (with evaluator.py's worker, the only CUPTI user).

The hardware writes one record per interval into a buffer on the GPU; :class:`Session` decodes it into
counter-data images every ``POLL_S`` while the capture runs (``poll``) and hands each image, half full, to a
worker process that evaluates the counters, so the loop that drains the GPU's buffer does nothing else.
Built on ``cupti.pm_sampling.Collector`` of cupti-python 13.4 for enable/configure/start/stop, and on the
``cupti.cupti`` calls that Collector itself makes for decoding (cupti-python 13.4.0, cupti/pm_sampling.py).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smlens.profile.counters import COUNTERS, PEAK_OF, PIPE_COUNTERS, REQUIRED, pipe_choices
from smlens.profile.errors import ProfileError
from smlens.profile.evaluator import ImagePipeline, SharedImage, peak_rss_kib, prepare
from smlens.profile.recording import Recording
from smlens.profile.timestamps import settle

HARDWARE_BUFFER_BYTES = 256 * 2**20
POLL_S = 0.05  # the decode loop's period
HEADROOM_S = 0.2  # how far the decode loop may fall behind before an image fills
MIN_IMAGE_SLOTS = 256


def import_cupti() -> tuple[Any, Any, Any]:
    try:
        import cupti.cupti as cu  # type: ignore[import-not-found,import-untyped,unused-ignore]
        from cupti import pm_sampling, profiler_host  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as exc:
        missing = (exc.name or "cupti").split(".")[0]
        what = "is not installed" if missing == "cupti" else f"cannot load ({missing} is missing)"
        raise ProfileError(
            f"smlens profile needs NVIDIA's cupti-python, which {what}: pip install 'smlens[profile]'."
        ) from None
    except Exception as exc:  # a broken install (13.4.0 itself imports without a CUDA driver)
        raise ProfileError(f"CUPTI cannot load on this host: {exc}.") from None
    return cu, pm_sampling, profiler_host


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML index
    uuid: str
    name: str
    cuda_ordinal: int


def resolve_gpu(selector: str) -> Gpu:
    """The GPU named by NVML index or UUID, with its CUDA ordinal (matched by UUID, whatever the order)."""
    import pynvml

    from smlens.profile.cuda import cuda_ordinal_of_uuid

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ProfileError(f"NVML cannot start, so no GPU can be profiled: {exc}.") from None
    try:
        try:
            if selector.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(selector))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(selector)
        except pynvml.NVMLError:
            count = pynvml.nvmlDeviceGetCount()
            raise ProfileError(
                f"no GPU {selector!r} on this host (it has {count}: indices 0-{count - 1})."
            ) from None
        index = int(pynvml.nvmlDeviceGetIndex(handle))
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        name = pynvml.nvmlDeviceGetName(handle)
    finally:
        pynvml.nvmlShutdown()
    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    name = name.decode() if isinstance(name, bytes) else str(name)
    return Gpu(index, uuid, name, cuda_ordinal_of_uuid(uuid))


@dataclass
class DecodeStats:
    decode_s: float = 0.0  # cuptiPmSamplingDecodeData
    timestamps_s: float = 0.0  # per-sample start/end
    images: int = 0  # images handed to the worker
    images_filled: int = 0  # decodes that stopped at a full image (then samples come back untimed)
    incomplete_at_handover: int = 0  # samples populated but not completed in an image handed over
    overflow: bool = False
    cpu_s: float = field(default=0.0)  # this process, in poll()


def image_slots(interval_ns: int) -> int:
    """Samples per counter-data image: twice what arrives in ``HEADROOM_S``, so that an image handed over
    when half full still has room for ``HEADROOM_S`` of samples if the decode loop falls behind."""
    return max(MIN_IMAGE_SLOTS, math.ceil(2 * HEADROOM_S * 1e9 / interval_ns))


class Session:
    """One PM sampling capture of one GPU; use as a context manager (the session is released on exit).

    ``poll`` decodes what the GPU wrote into a counter-data image and reads each new sample's timestamps;
    an image that is half full goes to a worker process (evaluator.py) that evaluates its counters, and
    decoding goes on in a fresh image. A decode fills an image only when the loop fell behind by more than
    ``HEADROOM_S``: after one that does, CUPTI 13.4 returns samples without timestamps (docs/profile.md)."""

    def __init__(
        self,
        gpu: Gpu,
        interval_ns: int,
        hardware_buffer_bytes: int = HARDWARE_BUFFER_BYTES,
        keep_latest: bool = False,
        slots: int | None = None,
    ) -> None:
        self.gpu = gpu
        self.interval_ns = interval_ns
        self._cu, self._pm, self._ph = import_cupti()
        self._collector: Any = None
        self._pipeline: ImagePipeline | None = None
        self._image: SharedImage | None = None
        self._slots = slots or image_slots(interval_ns)
        self._harvested = 0  # samples of the current image whose timestamps were read
        self._image_stamps = np.zeros((self._slots, 2), dtype=np.int64)  # theirs: start, end
        self._stamps: list[np.ndarray] = []  # those of each image handed over
        self._handed = 0  # samples in the images handed over
        self.stats = DecodeStats()
        self._buffer = hardware_buffer_bytes
        self._keep_latest = keep_latest
        self._sampling = False  # between a successful start and stop
        self._counters: tuple[str, ...] = COUNTERS  # fewer pipe counters where PM sampling refuses them all
        self._pipes_refused: str | None = None  # which it refused and why, then

    def __enter__(self) -> Session:
        from smlens.profile.cuda import retain_primary_context

        retain_primary_context(self.gpu.cuda_ordinal)
        cu = self._cu
        collector = self._pm.Collector(device_index=self.gpu.cuda_ordinal)
        try:
            collector.enable()
        except PermissionError:
            raise ProfileError(self._no_permission()) from None
        except cu.cuptiError as exc:
            raise ProfileError(self._explain(exc)) from None
        except (RuntimeError, ValueError, MemoryError) as exc:  # what Collector.enable documents
            raise ProfileError(f"CUPTI cannot start PM sampling on GPU {self.gpu.index}: {exc}") from None
        self._collector = collector
        try:
            self._configure_fitting(collector)
            image_bytes = self._image_bytes()
        except cu.cuptiError as exc:
            self.close()
            raise ProfileError(self._explain(exc)) from None
        except (ValueError, OverflowError) as exc:
            self.close()
            raise ProfileError(f"GPU {self.gpu.index} cannot sample smlens' counters: {exc}") from None
        try:
            self._pipeline = ImagePipeline(
                image_bytes,
                self._initialize_image,
                prepare,
                (collector._chip_name, self._counters, self._peak_names()),
            )
        except BaseException:
            self.close()
            raise
        return self

    def _peak_names(self) -> tuple[str, ...]:
        return tuple(PEAK_OF[c] for c in PEAK_OF if c in self._counters)

    def _configure_fitting(self, collector: Any) -> None:
        """Configure every counter; where PM sampling refuses the set (it must fit in one pass), the required
        counters with the most pipe counters that fit (counters.pipe_choices), the refused pipes noted."""
        refusal: ValueError | None = None
        for pipes in pipe_choices():
            self._counters = (*REQUIRED, *pipes)
            try:
                self._configure(collector)
            except ValueError as exc:  # not supported in one pass; a wrong argument would fail every set
                refusal = refusal or exc
                continue
            if refusal is not None:
                left_out = ", ".join(c for c in PIPE_COUNTERS if c not in pipes)
                self._pipes_refused = f"{left_out} left out: {refusal}"
            return
        assert refusal is not None
        raise refusal

    def _configure(self, collector: Any) -> None:
        mode = self._pm.HardwareBufferAppendMode
        collector.configure(
            metrics=[*self._counters, *self._peak_names()],
            hardware_buffer_size=self._buffer,
            sampling_interval=self.interval_ns,
            hw_buffer_append_mode=mode.KEEP_LATEST if self._keep_latest else mode.KEEP_OLDEST,
        )

    def _no_permission(self) -> str:
        return (
            f"no permission to read GPU {self.gpu.index}'s performance counters: run as root or with "
            "CAP_SYS_ADMIN, or load the NVIDIA driver with NVreg_RestrictProfilingToAdminUsers=0."
        )

    def _explain(self, exc: Any) -> str:
        status = getattr(exc, "status", None)
        result = self._cu.Result
        if status == result.ERROR_HARDWARE_BUSY:
            return (
                f"another profiler holds GPU {self.gpu.index}'s performance counters (Nsight Compute or "
                "Systems, DCGM profiling, or another smlens profile): try again when it has finished."
            )
        if status == result.ERROR_INSUFFICIENT_PRIVILEGES:
            return self._no_permission()
        if status == result.ERROR_INVALID_PARAMETER:
            return (
                "CUPTI refused its own host setup, the sign of a libcupti older than cupti-python "
                f"(loaded first by another package): {exc}."
            )
        return f"CUPTI failed on GPU {self.gpu.index}: {exc}."

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Release everything, quietly: it also runs after a failure, which is what the user hears about."""
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        if self._collector is not None:
            with contextlib.suppress(Exception):
                if self._sampling:
                    self._collector.stop()
                self._collector.disable()
            self._collector = None

    # The two image calls below are the ones cupti-python 13.4.0's Collector._create_counter_data_image makes
    # (cupti/pm_sampling.py), on memory the worker process shares. Every image has the same size: CUPTI's
    # size query is made once.
    def _image_bytes(self) -> int:
        from cupti.utils import metrics_to_c_array  # type: ignore[import-not-found,import-untyped,unused-ignore]

        cu = self._cu
        kept, names = metrics_to_c_array(self._collector._metrics)  # kept: what the pointers point into
        params = cu.PmSamplingGetCounterDataSizeParams()
        params.struct_size = cu.PM_SAMPLING_GET_COUNTER_DATA_SIZE_PARAMS_STRUCT_SIZE
        params.p_pm_sampling_object = self._collector._pm_sampling_object
        params.p_metric_names = names
        params.num_metrics = len(self._collector._metrics)
        params.max_samples = self._slots
        cu.pm_sampling_get_counter_data_size(params.ptr)
        del kept
        return int(params.counter_data_size)

    def _initialize_image(self, image: np.ndarray) -> None:
        cu = self._cu
        params = cu.PmSamplingCounterDataImageInitializeParams()
        params.struct_size = cu.PM_SAMPLING_COUNTER_DATA_IMAGE_INITIALIZE_PARAMS_STRUCT_SIZE
        params.p_pm_sampling_object = self._collector._pm_sampling_object
        params.counter_data_size = len(image)
        params.p_counter_data = image.ctypes.data
        cu.pm_sampling_counter_data_image_initialize(params.ptr)

    def start(self) -> None:
        self._image = self._take()
        try:
            self._collector.start()
        except self._cu.cuptiError as exc:
            raise ProfileError(self._explain(exc)) from None
        except RuntimeError as exc:
            raise ProfileError(f"CUPTI cannot start PM sampling on GPU {self.gpu.index}: {exc}") from None
        self._sampling = True

    def stop(self) -> None:
        """Stop sampling, decode what is left and hand the last image over."""
        self._sampling = False
        try:
            self._collector.stop()
        except (self._cu.cuptiError, RuntimeError) as exc:
            raise ProfileError(f"CUPTI failed to stop PM sampling on GPU {self.gpu.index}: {exc}.") from None
        self.poll()
        if self._image is not None and self._harvested:
            self._hand_over()
        self._image = None

    @property
    def samples(self) -> int:
        return self._handed + self._harvested

    def _take(self) -> SharedImage:
        assert self._pipeline is not None
        return self._pipeline.take()

    def _hand_over(self) -> None:
        assert self._pipeline is not None and self._image is not None
        self._pipeline.hand_over(self._image, self._harvested)
        self._stamps.append(self._image_stamps[: self._harvested].copy())
        self._handed += self._harvested
        self.stats.images += 1

    def poll(self) -> None:
        """Decode what the hardware wrote since the last call; hand a half-full image to the worker."""
        cpu = time.process_time()
        try:
            self._decode()
        except self._cu.cuptiError as exc:
            if getattr(exc, "status", None) == self._cu.Result.ERROR_OUT_OF_MEMORY:
                raise ProfileError(
                    "the GPU's sample buffer overflowed before it was decoded (the host was too slow): "
                    "use a longer --interval-us."
                ) from None
            raise ProfileError(self._explain(exc)) from None
        self.stats.cpu_s += time.process_time() - cpu

    def _decode(self) -> None:
        cu = self._cu
        while True:
            assert self._image is not None
            image = self._image.array
            params = cu.PmSamplingDecodeDataParams()
            params.struct_size = cu.PM_SAMPLING_DECODE_DATA_PARAMS_STRUCT_SIZE
            params.p_pm_sampling_object = self._collector._pm_sampling_object
            params.p_counter_data_image = image.ctypes.data
            params.counter_data_image_size = len(image)
            t = time.perf_counter()
            cu.pm_sampling_decode_data(params.ptr)
            self.stats.decode_s += time.perf_counter() - t
            self.stats.overflow |= bool(params.overflow)
            populated = self._read_timestamps()
            full = params.decode_stop_reason == cu.PmSamplingDecodeStopReason.COUNTER_DATA_FULL
            self.stats.images_filled += int(full)
            if full or populated >= self._slots // 2:
                self.stats.incomplete_at_handover += max(0, populated - self._harvested)
                self._hand_over()
                self._image, self._harvested = self._take(), 0
            if not full:
                break

    def _read_timestamps(self) -> int:
        """Read the start/end of every sample completed since the last call; returns the populated count."""
        cu = self._cu
        assert self._image is not None
        image = self._image.array
        t = time.perf_counter()
        info = cu.PmSamplingGetCounterDataInfoParams()
        info.struct_size = cu.PM_SAMPLING_GET_COUNTER_DATA_INFO_PARAMS_STRUCT_SIZE
        info.p_counter_data_image = image.ctypes.data
        info.counter_data_image_size = len(image)
        cu.pm_sampling_get_counter_data_info(info.ptr)
        sample = cu.PmSamplingCounterDataGetSampleInfoParams()
        sample.struct_size = cu.PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE
        sample.p_pm_sampling_object = self._collector._pm_sampling_object
        sample.p_counter_data_image = image.ctypes.data
        sample.counter_data_image_size = len(image)
        completed = int(info.num_completed_samples)
        if completed > len(self._image_stamps):  # CUPTI gave the image more slots than asked
            self._image_stamps = np.resize(self._image_stamps, (completed, 2))
        starts, ends = self._image_stamps[:, 0], self._image_stamps[:, 1]  # views: cheaper than rows
        for index in range(self._harvested, completed):
            sample.sample_index = index
            cu.pm_sampling_counter_data_get_sample_info(sample.ptr)
            starts[index], ends[index] = sample.start_timestamp, sample.end_timestamp
        self._harvested = completed
        self.stats.timestamps_s += time.perf_counter() - t
        return int(info.num_populated_samples)

    def recording(self) -> Recording:
        """The capture, once the worker has evaluated every image (call after ``stop``)."""
        assert self._pipeline is not None
        evaluated = self._pipeline.results()
        counters = self._counters
        values = np.concatenate([e.values for e in evaluated]) if evaluated else np.empty((0, len(counters)))
        first = next((e.peaks for e in evaluated if e.peaks is not None), None)
        peaked = [c for c in PEAK_OF if c in counters]
        peaks = {} if first is None else {c: float(v) for c, v in zip(peaked, first, strict=True)}
        stamps = np.concatenate(self._stamps) if self._stamps else np.empty((0, 2), dtype=np.int64)
        settled = settle(stamps, self.interval_ns)
        stamps, values = stamps[settled.keep], values[settled.keep]
        stats = self.stats
        return Recording(
            gpu={"index": self.gpu.index, "uuid": self.gpu.uuid, "name": self.gpu.name},
            chip=str(self._collector._chip_name if self._collector else ""),
            interval_ns=self.interval_ns,
            counters=list(counters),
            peaks=peaks,
            start_ns=stamps[:, 0],
            end_ns=stamps[:, 1],
            values=values,
            notes={
                "decode_s": round(stats.decode_s, 4),
                "timestamps_s": round(stats.timestamps_s, 4),
                "host_cpu_s": round(stats.cpu_s, 4),
                "evaluator_cpu_s": round(evaluated[-1].cpu_s, 4) if evaluated else 0.0,
                "evaluator_max_rss_mib": round(evaluated[-1].max_rss_kib / 1024, 1) if evaluated else 0.0,
                "max_rss_mib": round(peak_rss_kib() / 1024, 1),
                "image_slots": self._slots,
                "image_bytes": self._pipeline.image_bytes,
                "images": stats.images,
                "images_filled": stats.images_filled,
                "evaluator_waits": self._pipeline.waits,
                "incomplete_at_handover": stats.incomplete_at_handover,
                "overflow": stats.overflow,
                "dropped_unclocked": settled.dropped_unclocked,
                "dropped_empty": settled.dropped_empty,
                "start_inferred": settled.start_inferred,
                "timestamps_filled": settled.timestamps_filled,
                "dropped_untimed": settled.dropped_untimed,
                # the pipe counters PM sampling refused and why: the classes need them (docs/profile.md)
                **({"pipes_refused": self._pipes_refused} if self._pipes_refused else {}),
            },
        )


def capture(
    gpu: Gpu, seconds: float, interval_ns: int, progress: Callable[[float, int], None] | None = None
) -> Recording:
    """Sample ``gpu`` for ``seconds``; ``progress(elapsed, samples)`` is called about 5 times a second.

    Ctrl-C while sampling ends the capture early and keeps what was captured (notes:
    ``interrupted_after_s``); a second Ctrl-C abandons it. SIGTERM abandons it with one sentence. Either way
    the session is released."""
    main = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    with _on_signal(signal.SIGTERM, _terminated, main), Session(gpu, interval_ns) as session:
        session.start()
        began = shown = time.monotonic()
        interrupted = threading.Event()
        # the first Ctrl-C only ends the loop, between two polls: a poll cut in the middle would leave an
        # image both handed over and decoded into
        with _on_signal(signal.SIGINT, lambda *_: _once(interrupted), main):
            while (elapsed := time.monotonic() - began) < seconds and not interrupted.is_set():
                time.sleep(min(POLL_S, seconds - elapsed))
                session.poll()
                if progress is not None and time.monotonic() - shown >= 0.2:
                    shown = time.monotonic()
                    progress(min(seconds, shown - began), session.samples)
        stopped_after = time.monotonic() - began
        session.stop()
        recording = session.recording()
        if interrupted.is_set():
            recording.notes["interrupted_after_s"] = round(stopped_after, 2)
        return recording


def _terminated(signum: int, frame: object) -> None:
    raise ProfileError("stopped by SIGTERM before the capture finished: nothing was written.")


def _once(interrupted: threading.Event) -> None:
    if interrupted.is_set():
        raise KeyboardInterrupt
    interrupted.set()


@contextlib.contextmanager
def _on_signal(signum: int, handler: Callable[[int, Any], None], main_thread: bool) -> Iterator[None]:
    """``handler`` for ``signum`` while in the block (outside the main thread, nothing changes). SIGTERM's
    default action would skip releasing the session and the worker."""
    if not main_thread:
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)
