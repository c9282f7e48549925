"""Double of ``cupti.pm_sampling`` (cupti-python 13.4.0): ``Collector`` and the enums smlens uses.

``Collector.decode`` makes the calls the real one makes (one image of ``max_samples`` slots, one decode,
the counter-data info, each completed sample's timestamps) and returns what its ``CounterData`` holds
minus the metric evaluation; ``configure`` records the trigger mode (``Collector.trigger_mode``).

Its errors are the real Collector's (cupti/pm_sampling.py of the 13.4.0 wheel): ``enable`` turns
ERROR_INSUFFICIENT_PRIVILEGES into PermissionError, ERROR_INVALID_OPERATION into RuntimeError ("already
enabled") and ERROR_OUT_OF_MEMORY into MemoryError; ``configure`` turns ERROR_NOT_SUPPORTED into ValueError;
``start`` and ``stop`` turn ERROR_INVALID_OPERATION into RuntimeError; any other status stays a cuptiError.
The status comes from ``HARDWARE.fail`` under the name of the C call that fails: pm_sampling_enable,
pm_sampling_set_config, pm_sampling_start, pm_sampling_stop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cupti import cupti as cu
from cupti.cupti import (
    HARDWARE,
    PmSamplingHardwareBufferAppendMode,
    PmSamplingTriggerMode,
    Result,
    cuptiError,
)

HardwareBufferAppendMode = PmSamplingHardwareBufferAppendMode
TriggerMode = PmSamplingTriggerMode


@dataclass
class CounterData:
    num_total_samples: int
    num_populated_samples: int
    num_completed_samples: int
    _start_timestamps: list[int]
    _end_timestamps: list[int]


def _call(name: str, translate: dict[Result, BaseException]) -> None:
    try:
        HARDWARE.call(name)
    except cuptiError as exc:
        if exc.status in translate:
            raise translate[Result(exc.status)] from None
        raise


class Collector:
    def __init__(self, device_index: int = 0) -> None:
        self._device_index = device_index
        self._metrics: list[str] = []
        self._pm_sampling_object: int | None = None
        self._chip_name: str | None = None

    def enable(self) -> None:
        _call(
            "pm_sampling_enable",
            {
                Result.ERROR_INSUFFICIENT_PRIVILEGES: PermissionError(
                    "Insufficient privileges for PM sampling"
                ),
                Result.ERROR_INVALID_OPERATION: RuntimeError(
                    "PM sampling is already enabled on this device."
                ),
                Result.ERROR_OUT_OF_MEMORY: MemoryError(
                    "Memory allocation failed creating the PM sampling object."
                ),
            },
        )
        self._pm_sampling_object, self._chip_name = 1, "GH100"

    def configure(
        self,
        *,
        metrics: list[str],
        hardware_buffer_size: int = 512 * 1024 * 1024,
        sampling_interval: int = 10000,
        trigger_mode: object = TriggerMode.GPU_TIME_INTERVAL,
        hw_buffer_append_mode: object = None,
        single_pass_metric_set_name: str | None = None,
    ) -> None:
        if hardware_buffer_size <= 0 or sampling_interval <= 0:
            raise ValueError("hardware_buffer_size and sampling_interval must be > 0")
        unsupported = ValueError("Requested PM sampling configuration is not supported.")
        _call("pm_sampling_set_config", {Result.ERROR_NOT_SUPPORTED: unsupported})
        self._metrics = list(metrics)
        self.trigger_mode = trigger_mode
        HARDWARE.interval_ns = sampling_interval

    def decode(self, max_samples: int = 10000) -> CounterData:
        size = cu.PmSamplingGetCounterDataSizeParams()
        size.max_samples = max_samples
        cu.pm_sampling_get_counter_data_size(size.ptr)
        image = np.zeros(size.counter_data_size, dtype=np.uint8)
        init = cu.PmSamplingCounterDataImageInitializeParams()
        init.counter_data_size, init.p_counter_data = len(image), image.ctypes.data
        cu.pm_sampling_counter_data_image_initialize(init.ptr)
        decode = cu.PmSamplingDecodeDataParams()
        decode.p_counter_data_image, decode.counter_data_image_size = image.ctypes.data, len(image)
        try:
            cu.pm_sampling_decode_data(decode.ptr)
        except cu.cuptiError as exc:
            if exc.status == cu.Result.ERROR_OUT_OF_MEMORY:
                raise MemoryError("Record overflow in the hardware buffer.") from None
            raise
        info = cu.PmSamplingGetCounterDataInfoParams()
        info.p_counter_data_image, info.counter_data_image_size = image.ctypes.data, len(image)
        cu.pm_sampling_get_counter_data_info(info.ptr)
        starts, ends = [], []
        for index in range(info.num_completed_samples):
            sample = cu.PmSamplingCounterDataGetSampleInfoParams()
            sample.p_counter_data_image, sample.counter_data_image_size = image.ctypes.data, len(image)
            sample.sample_index = index
            cu.pm_sampling_counter_data_get_sample_info(sample.ptr)
            starts.append(sample.start_timestamp)
            ends.append(sample.end_timestamp)
        return CounterData(
            info.num_total_samples, info.num_populated_samples, info.num_completed_samples, starts, ends
        )

    def start(self) -> None:
        _call("pm_sampling_start", {Result.ERROR_INVALID_OPERATION: RuntimeError("already started")})

    def stop(self) -> None:
        _call("pm_sampling_stop", {Result.ERROR_INVALID_OPERATION: RuntimeError("already stopped")})

    def disable(self) -> None:
        self._pm_sampling_object = self._chip_name = None
