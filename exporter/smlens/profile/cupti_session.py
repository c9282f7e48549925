"""PM sampling of one GPU through NVIDIA's cupti-python: the only module of smlens that imports CUPTI.

The hardware writes one record per interval into a buffer on the GPU; :class:`Session` decodes it into
counter-data images of ``CHUNK_SAMPLES`` samples while the capture runs (``poll``), so a long capture never
overflows the buffer and most of the host work is done by the time it stops. Samples are evaluated (counter
values from the image) as they complete. Built on ``cupti.pm_sampling.Collector`` of cupti-python 13.4 for
enable/configure/start/stop, and on the ``cupti.cupti`` calls that Collector itself makes for decoding
(cupti-python 13.4.0, cupti/pm_sampling.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smlens.errors import SmlensError
from smlens.profile.counters import COUNTERS, PEAK_OF
from smlens.profile.recording import Recording

CHUNK_SAMPLES = 10_000
HARDWARE_BUFFER_BYTES = 256 * 2**20


class ProfileError(SmlensError):
    """Why a capture cannot run, in one sentence for the user."""


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
    except Exception as exc:  # cupti-python raises its own error when no CUDA driver is found
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
    evaluate_s: float = 0.0  # counter values per sample
    images: int = 0
    overflow: bool = False
    dropped_unclocked: int = 0  # samples without a start time and nothing before them (a capture's first)
    start_inferred: int = 0  # samples without a start time that continue the previous one
    timestamps_filled: int = 0  # samples without any timestamp placed between their neighbours
    dropped_untimed: int = 0  # samples without any timestamp that could not be placed
    image_bytes: int = 0
    cpu_s: float = field(default=0.0)


class Session:
    """One PM sampling capture of one GPU; use as a context manager (the session is released on exit)."""

    def __init__(
        self,
        gpu: Gpu,
        interval_ns: int,
        hardware_buffer_bytes: int = HARDWARE_BUFFER_BYTES,
        keep_latest: bool = False,
    ) -> None:
        self.gpu = gpu
        self.interval_ns = interval_ns
        self._cu, self._pm, self._ph = import_cupti()
        self._metrics = [*COUNTERS, *PEAK_OF.values()]
        self._collector: Any = None
        self._host: Any = None
        self._image: Any = None
        self._harvested = 0  # samples of the current image already evaluated
        self._rows: list[np.ndarray] = []
        self._stamps: list[tuple[int, int]] = []
        self.peaks: dict[str, float] = {}
        self.stats = DecodeStats()
        self._buffer = hardware_buffer_bytes
        self._keep_latest = keep_latest

    def __enter__(self) -> Session:
        from smlens.profile.cuda import retain_primary_context

        retain_primary_context(self.gpu.cuda_ordinal)
        cu = self._cu
        collector = self._pm.Collector(device_index=self.gpu.cuda_ordinal)
        try:
            collector.enable()
        except PermissionError:
            raise ProfileError(self._no_permission()) from None
        except RuntimeError as exc:
            raise ProfileError(f"CUPTI cannot start PM sampling on GPU {self.gpu.index}: {exc}") from None
        except cu.cuptiError as exc:
            raise ProfileError(self._explain(exc)) from None
        self._collector = collector
        try:
            mode = self._pm.HardwareBufferAppendMode
            collector.configure(
                metrics=self._metrics,
                hardware_buffer_size=self._buffer,
                sampling_interval=self.interval_ns,
                hw_buffer_append_mode=mode.KEEP_LATEST if self._keep_latest else mode.KEEP_OLDEST,
            )
            self._host = self._ph.ProfilerHost(collector._chip_name, self._ph.ProfilerType.PM_SAMPLING)
            self._host.initialize()
        except cu.cuptiError as exc:
            self.close()
            raise ProfileError(self._explain(exc)) from None
        except ValueError as exc:
            self.close()
            raise ProfileError(f"GPU {self.gpu.index} cannot sample smlens' counters: {exc}") from None
        return self

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
        if self._host is not None:
            self._host.deinitialize()
            self._host = None
        if self._collector is not None:
            self._collector.disable()
            self._collector = None

    def start(self) -> None:
        try:
            self._image = self._new_image()
            self._collector.start()
        except self._cu.cuptiError as exc:
            raise ProfileError(self._explain(exc)) from None

    def stop(self) -> None:
        self._collector.stop()
        self.poll()

    def _new_image(self) -> Any:
        self.stats.images += 1
        self._harvested = 0
        image = self._collector._create_counter_data_image(CHUNK_SAMPLES)
        self.stats.image_bytes = len(image)
        return image

    @property
    def samples(self) -> int:
        return len(self._stamps)

    def poll(self) -> None:
        """Decode what the hardware wrote since the last call and evaluate every completed sample."""
        cu = self._cu
        cpu = time.process_time()
        while True:
            params = cu.PmSamplingDecodeDataParams()
            params.struct_size = cu.PM_SAMPLING_DECODE_DATA_PARAMS_STRUCT_SIZE
            params.p_pm_sampling_object = self._collector._pm_sampling_object
            params.p_counter_data_image = self._image.ctypes.data
            params.counter_data_image_size = len(self._image)
            t = time.perf_counter()
            try:
                cu.pm_sampling_decode_data(params.ptr)
            except cu.cuptiError as exc:
                if getattr(exc, "status", None) == cu.Result.ERROR_OUT_OF_MEMORY:
                    raise ProfileError(
                        "the GPU's sample buffer overflowed before it was decoded (the host was too slow): "
                        "use a longer --interval-us."
                    ) from None
                raise
            self.stats.decode_s += time.perf_counter() - t
            self.stats.overflow |= bool(params.overflow)
            self._harvest()
            if params.decode_stop_reason != cu.PmSamplingDecodeStopReason.COUNTER_DATA_FULL:
                break
            self._image = self._new_image()
        self.stats.cpu_s += time.process_time() - cpu

    def _harvest(self) -> None:
        cu, image = self._cu, self._image
        info = cu.PmSamplingGetCounterDataInfoParams()
        info.struct_size = cu.PM_SAMPLING_GET_COUNTER_DATA_INFO_PARAMS_STRUCT_SIZE
        info.p_counter_data_image = image.ctypes.data
        info.counter_data_image_size = len(image)
        cu.pm_sampling_get_counter_data_info(info.ptr)
        for index in range(self._harvested, int(info.num_completed_samples)):
            t = time.perf_counter()
            sample = cu.PmSamplingCounterDataGetSampleInfoParams()
            sample.struct_size = cu.PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE
            sample.p_pm_sampling_object = self._collector._pm_sampling_object
            sample.p_counter_data_image = image.ctypes.data
            sample.counter_data_image_size = len(image)
            sample.sample_index = index
            cu.pm_sampling_counter_data_get_sample_info(sample.ptr)
            t2 = time.perf_counter()
            self.stats.timestamps_s += t2 - t
            if not self.peaks:
                values = self._host.evaluate_metric_values(image, self._metrics, index)
                self.peaks = {c: float(values[self._metrics.index(p)]) for c, p in PEAK_OF.items()}
                row = values[: len(COUNTERS)]
            else:
                row = self._host.evaluate_metric_values(image, list(COUNTERS), index)
            self.stats.evaluate_s += time.perf_counter() - t2
            start, end = int(sample.start_timestamp), int(sample.end_timestamp)
            if start == 0 and end != 0:
                if not self._stamps:  # the capture's first sample: it began before sampling started
                    self.stats.dropped_unclocked += 1
                    continue
                start = self._stamps[-1][1]
                self.stats.start_inferred += 1
            self._stamps.append((start, end))  # (0, 0): no timestamps, placed by fill_timestamps()
            self._rows.append(row)
        self._harvested = int(info.num_completed_samples)

    def recording(self) -> Recording:
        stamps = np.asarray(self._stamps, dtype=np.int64).reshape(-1, 2)
        values = np.asarray(self._rows, dtype=np.float64).reshape(-1, len(COUNTERS))
        keep, filled = fill_timestamps(stamps, self.interval_ns)
        stamps, values = stamps[keep], values[keep]
        stats = self.stats
        stats.timestamps_filled = filled
        stats.dropped_untimed = int((~keep).sum())
        return Recording(
            gpu={"index": self.gpu.index, "uuid": self.gpu.uuid, "name": self.gpu.name},
            chip=str(self._collector._chip_name if self._collector else ""),
            interval_ns=self.interval_ns,
            counters=list(COUNTERS),
            peaks=dict(self.peaks),
            start_ns=stamps[:, 0],
            end_ns=stamps[:, 1],
            values=values,
            notes={
                "decode_s": round(stats.decode_s, 4),
                "timestamps_s": round(stats.timestamps_s, 4),
                "evaluate_s": round(stats.evaluate_s, 4),
                "host_cpu_s": round(stats.cpu_s, 4),
                "images": stats.images,
                "overflow": stats.overflow,
                "dropped_unclocked": stats.dropped_unclocked,
                "start_inferred": stats.start_inferred,
                "timestamps_filled": stats.timestamps_filled,
                "dropped_untimed": stats.dropped_untimed,
                "image_bytes": stats.image_bytes,
            },
        )


def fill_timestamps(stamps: np.ndarray, interval_ns: int) -> tuple[np.ndarray, int]:
    """Place samples that CUPTI returned without timestamps (rows of (0, 0)), in place.

    Seen on an H200 with cupti-python 13.4: after each decode that filled a counter-data image, a run of
    samples comes back with start and end 0. A run of k such samples between a sample ending at E and one
    starting at S is placed in k equal slots when (S - E) / k is the sampling interval within 2 %; runs at the
    ends of the capture, or that do not fit, are dropped. Returns the rows to keep and how many were
    placed."""
    keep = np.ones(len(stamps), dtype=bool)
    untimed = (stamps[:, 0] == 0) & (stamps[:, 1] == 0)
    filled = 0
    i = 0
    while i < len(stamps):
        if not untimed[i]:
            i += 1
            continue
        j = i
        while j < len(stamps) and untimed[j]:
            j += 1
        k = j - i
        if i > 0 and j < len(stamps):
            before, after = int(stamps[i - 1, 1]), int(stamps[j, 0])
            slot = (after - before) / k
            if abs(slot - interval_ns) <= 0.02 * interval_ns:
                edges = before + np.rint(np.arange(k + 1) * slot).astype(np.int64)
                stamps[i:j, 0], stamps[i:j, 1] = edges[:-1], edges[1:]
                filled += k
                i = j
                continue
        keep[i:j] = False
        i = j
    return keep, filled


def capture(
    gpu: Gpu, seconds: float, interval_ns: int, progress: Callable[[float, int], None] | None = None
) -> Recording:
    """Sample ``gpu`` for ``seconds``; ``progress(elapsed, samples)`` is called about 5 times a second."""
    with Session(gpu, interval_ns) as session:
        session.start()
        began = time.monotonic()
        try:
            while (elapsed := time.monotonic() - began) < seconds:
                time.sleep(min(0.2, seconds - elapsed))
                session.poll()
                if progress is not None:
                    progress(min(seconds, time.monotonic() - began), session.samples)
        finally:
            session.stop()
        return session.recording()
