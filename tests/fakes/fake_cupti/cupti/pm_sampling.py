"""Double of ``cupti.pm_sampling`` (cupti-python 13.4.0): ``Collector`` and the enums smlens uses."""

from __future__ import annotations

from cupti.cupti import HARDWARE, PmSamplingHardwareBufferAppendMode

HardwareBufferAppendMode = PmSamplingHardwareBufferAppendMode


class Collector:
    def __init__(self, device_index: int = 0) -> None:
        self._device_index = device_index
        self._metrics: list[str] = []
        self._pm_sampling_object: int | None = None
        self._chip_name: str | None = None

    def enable(self) -> None:
        self._pm_sampling_object, self._chip_name = 1, "GH100"

    def configure(self, *, metrics: list[str], hardware_buffer_size: int = 512 * 1024 * 1024,
                  sampling_interval: int = 10000, hw_buffer_append_mode: object = None) -> None:  # fmt: skip
        self._metrics = list(metrics)
        HARDWARE.interval_ns = sampling_interval

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def disable(self) -> None:
        self._pm_sampling_object = self._chip_name = None
