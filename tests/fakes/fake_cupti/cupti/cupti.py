"""Double of ``cupti.cupti`` (cupti-python 13.4.0), PM sampling part, over a simulated GPU.

The simulated hardware buffer holds records that a test adds with ``feed``. Behaviour, as seen on an H200
with CUPTI 13.4 (docs/profile.md):

* a decode copies records into the counter-data image until the records or the image's free slots run out;
  its stop reason is ``COUNTER_DATA_FULL`` when records were left, else ``END_OF_RECORDS``;
* the decode after one that stopped at ``COUNTER_DATA_FULL`` gives its samples start and end 0;
* the capture's first sample has start 0 (it began before sampling started);
* more records than the hardware buffer holds: every decode raises ``ERROR_OUT_OF_MEMORY``.

As in cupti-python 13.4.0 (checked by importing the real module under Python 3.12 on 2026-11-30): ``Result``
has NVIDIA's values; ``cuptiError(status)`` keeps ``status`` as an int, reads "ERROR_NAME (value)" and
survives pickling (the real one defines ``__reduce__``); a params object refuses a field it does not have
(AttributeError); ``decode_stop_reason`` is an int; the struct sizes are the real ones. A test makes a call
fail with ``HARDWARE.fail[call name] = Result.X``.

Image layout (the double's own; the real one is opaque): int64 [total slots, populated], then per slot
int64 (start, end, sequence number). ``profiler_host`` evaluates a counter from the sequence number.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import weakref
from typing import Any

import numpy as np

HEADER = 2
SLOT = 3


class Result(enum.IntEnum):
    SUCCESS = 0
    ERROR_INVALID_PARAMETER = 1
    ERROR_INVALID_OPERATION = 7
    ERROR_OUT_OF_MEMORY = 8
    ERROR_NOT_INITIALIZED = 15
    ERROR_HARDWARE_BUSY = 26
    ERROR_NOT_SUPPORTED = 27
    ERROR_INSUFFICIENT_PRIVILEGES = 35
    ERROR_UNKNOWN = 999


class PmSamplingDecodeStopReason(enum.IntEnum):
    OTHER = 0
    COUNTER_DATA_FULL = 1
    END_OF_RECORDS = 2
    COUNT = 3


class PmSamplingTriggerMode(enum.IntEnum):
    GPU_SYSCLK_INTERVAL = 0
    GPU_TIME_INTERVAL = 1
    COUNT = 2


class PmSamplingHardwareBufferAppendMode(enum.IntEnum):
    KEEP_OLDEST = 0
    KEEP_LATEST = 1


class cuptiError(Exception):  # NVIDIA's name
    def __init__(self, status: int) -> None:
        super().__init__(f"{Result(status).name} ({int(status)})")
        self.status = int(status)

    def __reduce__(self) -> tuple[type[cuptiError], tuple[int]]:
        return cuptiError, (self.status,)


PM_SAMPLING_DECODE_DATA_PARAMS_STRUCT_SIZE = 45
PM_SAMPLING_GET_COUNTER_DATA_INFO_PARAMS_STRUCT_SIZE = 56
PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE = 64
PM_SAMPLING_GET_COUNTER_DATA_SIZE_PARAMS_STRUCT_SIZE = 56
PM_SAMPLING_COUNTER_DATA_IMAGE_INITIALIZE_PARAMS_STRUCT_SIZE = 40

_params: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # by .ptr


class _Params:
    FIELDS: tuple[str, ...] = ()

    def __init__(self) -> None:
        for name in ("struct_size", "p_priv", *self.FIELDS):
            object.__setattr__(self, name, 0)
        _params[id(self)] = self

    def __setattr__(self, name: str, value: object) -> None:
        if name not in ("struct_size", "p_priv", *self.FIELDS):
            raise AttributeError(f"'cupti.cupti.{type(self).__name__}' object has no attribute '{name}'")
        object.__setattr__(self, name, value)

    @property
    def ptr(self) -> int:
        return id(self)


class PmSamplingDecodeDataParams(_Params):
    FIELDS = ("p_pm_sampling_object", "p_counter_data_image", "counter_data_image_size", "decode_stop_reason",
              "overflow")  # fmt: skip


class PmSamplingGetCounterDataInfoParams(_Params):
    FIELDS = ("p_counter_data_image", "counter_data_image_size", "num_total_samples", "num_populated_samples",
              "num_completed_samples")  # fmt: skip


class PmSamplingCounterDataGetSampleInfoParams(_Params):
    FIELDS = ("p_pm_sampling_object", "p_counter_data_image", "counter_data_image_size", "sample_index",
              "start_timestamp", "end_timestamp")  # fmt: skip


class PmSamplingGetCounterDataSizeParams(_Params):
    FIELDS = ("p_pm_sampling_object", "p_metric_names", "num_metrics", "max_samples", "counter_data_size")


class PmSamplingCounterDataImageInitializeParams(_Params):
    FIELDS = ("p_pm_sampling_object", "counter_data_size", "p_counter_data")


class Hardware:
    """The simulated GPU side: records waiting in the hardware buffer."""

    def __init__(self, interval_ns: int = 100_000, capacity: int = 1_000_000) -> None:
        self.interval_ns = interval_ns
        self.capacity = capacity
        self.waiting: list[tuple[int, int, int]] = []
        self.sequence = itertools.count(1)
        self.clock = 1_000_000_000
        self.after_full = False
        self.overflowed = False
        self.fail: dict[str, Result] = {}  # call name -> the status it raises

    def call(self, name: str) -> None:
        status = self.fail.get(name)
        if status is not None:
            raise cuptiError(status)

    def feed(self, count: int) -> None:
        for _ in range(count):
            seq = next(self.sequence)
            start = 0 if seq == 1 else self.clock
            self.clock += self.interval_ns
            self.waiting.append((start, self.clock, seq))
        self.overflowed |= len(self.waiting) > self.capacity


HARDWARE = Hardware()


def _image(address: int, size: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_int64 * (size // 8)).from_address(address), dtype=np.int64)


def _params_at(ptr: int) -> Any:
    return _params[ptr]


def pm_sampling_get_counter_data_size(p_params: int) -> None:
    HARDWARE.call("pm_sampling_get_counter_data_size")
    params = _params_at(p_params)
    params.counter_data_size = 8 * (HEADER + SLOT * params.max_samples)


def pm_sampling_counter_data_image_initialize(p_params: int) -> None:
    params = _params_at(p_params)
    image = _image(params.p_counter_data, params.counter_data_size)
    image[:] = 0
    image[0] = (len(image) - HEADER) // SLOT


def pm_sampling_decode_data(p_params: int) -> None:
    HARDWARE.call("pm_sampling_decode_data")
    params = _params_at(p_params)
    if HARDWARE.overflowed:
        raise cuptiError(Result.ERROR_OUT_OF_MEMORY)
    image = _image(params.p_counter_data_image, params.counter_data_image_size)
    total, populated = int(image[0]), int(image[1])
    take = min(total - populated, len(HARDWARE.waiting))
    for i in range(take):
        start, end, seq = HARDWARE.waiting.pop(0)
        if HARDWARE.after_full:
            start = end = 0
        at = HEADER + SLOT * (populated + i)
        image[at : at + SLOT] = (start, end, seq)
    image[1] = populated + take
    full = populated + take == total and bool(HARDWARE.waiting)
    HARDWARE.after_full = full
    params.decode_stop_reason = int(
        PmSamplingDecodeStopReason.COUNTER_DATA_FULL if full else PmSamplingDecodeStopReason.END_OF_RECORDS
    )
    params.overflow = 0


def pm_sampling_get_counter_data_info(p_params: int) -> None:
    params = _params_at(p_params)
    image = _image(params.p_counter_data_image, params.counter_data_image_size)
    params.num_total_samples = int(image[0])
    params.num_populated_samples = params.num_completed_samples = int(image[1])


def pm_sampling_counter_data_get_sample_info(p_params: int) -> None:
    params = _params_at(p_params)
    image = _image(params.p_counter_data_image, params.counter_data_image_size)
    at = HEADER + SLOT * params.sample_index
    params.start_timestamp, params.end_timestamp = int(image[at]), int(image[at + 1])
