"""smlens: GPU SM activity and occupancy beside NVML utilization, as Prometheus metrics."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("smlens")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
