"""Double of ``cupti.pm_sampling`` (cupti-python 13.4.0): ``Collector`` and the enums smlens uses.

``Collector.decode`` makes the calls the real one makes (one image of ``max_samples`` slots, one decode,
the counter-data info, each completed sample's timestamps) and returns what its ``CounterData`` holds
minus the metric evaluation; ``configure`` records the trigger mode (``Collector.trigger_mode``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cupti import cupti as cu
from cupti.cupti import HARDWARE, PmSamplingHardwareBufferAppendMode, PmSamplingTriggerMode

HardwareBufferAppendMode = PmSamplingHardwareBufferAppendMode
TriggerMode = PmSamplingTriggerMode


@dataclass
class CounterData:
    num_total_samples: int
    num_populated_samples: int
    num_completed_samples: int
    _start_timestamps: list[int]
    _end_timestamps: list[int]


class Collector:
    def __init__(self, device_index: int = 0) -> None:
        self._device_index = device_index
        self._metrics: list[str] = []
        self._pm_sampling_object: int | None = None
        self._chip_name: str | None = None

    def enable(self) -> None:
        self._pm_sampling_object, self._chip_name = 1, "GH100"

    def configure(self, *, metrics: list[str], hardware_buffer_size: int = 512 * 1024 * 1024,
                  sampling_interval: int = 10000, trigger_mode: object = TriggerMode.GPU_TIME_INTERVAL,
                  hw_buffer_append_mode: object = None) -> None:  # fmt: skip
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
        pass

    def stop(self) -> None:
        pass

    def disable(self) -> None:
        self._pm_sampling_object = self._chip_name = None
