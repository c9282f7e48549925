"""Double of ``cupti.cupti`` (cupti-python 13.4.0), PM sampling part, over a simulated GPU.

The simulated hardware buffer holds records that a test adds with ``feed``. Behaviour, as seen on an H200
with CUPTI 13.4 (docs/profile.md):

* a decode copies records into the counter-data image until the records or the image's free slots run out;
  its stop reason is ``COUNTER_DATA_FULL`` when records were left, else ``END_OF_RECORDS``;
* the decode after one that stopped at ``COUNTER_DATA_FULL`` gives its samples start and end 0;
* the capture's first sample has start 0 (it began before sampling started);
* more records than the hardware buffer holds: every decode raises ``ERROR_OUT_OF_MEMORY``.

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
    ERROR_OUT_OF_MEMORY = 13
    ERROR_INSUFFICIENT_PRIVILEGES = 35
    ERROR_HARDWARE_BUSY = 39


class PmSamplingDecodeStopReason(enum.IntEnum):
    OTHER = 0
    COUNTER_DATA_FULL = 1
    END_OF_RECORDS = 2


class PmSamplingTriggerMode(enum.IntEnum):
    GPU_SYSCLK_INTERVAL = 0
    GPU_TIME_INTERVAL = 1
    COUNT = 2


class PmSamplingHardwareBufferAppendMode(enum.IntEnum):
    KEEP_OLDEST = 0
    KEEP_LATEST = 1


class cuptiError(Exception):  # NVIDIA's name
    def __init__(self, status: int) -> None:
        super().__init__(f"CUPTI error {Result(status).name}")
        self.status = Result(status)


PM_SAMPLING_DECODE_DATA_PARAMS_STRUCT_SIZE = 56
PM_SAMPLING_GET_COUNTER_DATA_INFO_PARAMS_STRUCT_SIZE = 56
PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE = 64
PM_SAMPLING_GET_COUNTER_DATA_SIZE_PARAMS_STRUCT_SIZE = 56
PM_SAMPLING_COUNTER_DATA_IMAGE_INITIALIZE_PARAMS_STRUCT_SIZE = 40

_params: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # by .ptr


class _Params:
    def __init__(self) -> None:
        self.struct_size = 0
        self.p_priv = 0
        _params[id(self)] = self

    @property
    def ptr(self) -> int:
        return id(self)


class PmSamplingDecodeDataParams(_Params):
    p_pm_sampling_object = 0
    p_counter_data_image = 0
    counter_data_image_size = 0
    decode_stop_reason = 0
    overflow = 0


class PmSamplingGetCounterDataInfoParams(_Params):
    p_counter_data_image = 0
    counter_data_image_size = 0
    num_total_samples = 0
    num_populated_samples = 0
    num_completed_samples = 0


class PmSamplingCounterDataGetSampleInfoParams(_Params):
    p_pm_sampling_object = 0
    p_counter_data_image = 0
    counter_data_image_size = 0
    sample_index = 0
    start_timestamp = 0
    end_timestamp = 0


class PmSamplingGetCounterDataSizeParams(_Params):
    p_pm_sampling_object = 0
    p_metric_names = 0
    num_metrics = 0
    max_samples = 0
    counter_data_size = 0


class PmSamplingCounterDataImageInitializeParams(_Params):
    p_pm_sampling_object = 0
    counter_data_size = 0
    p_counter_data = 0


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
    params = _params_at(p_params)
    params.counter_data_size = 8 * (HEADER + SLOT * params.max_samples)


def pm_sampling_counter_data_image_initialize(p_params: int) -> None:
    params = _params_at(p_params)
    image = _image(params.p_counter_data, params.counter_data_size)
    image[:] = 0
    image[0] = (len(image) - HEADER) // SLOT


def pm_sampling_decode_data(p_params: int) -> None:
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
    params.decode_stop_reason = (
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
