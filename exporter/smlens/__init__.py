"""smlens: GPU SM activity and occupancy beside NVML utilization, as Prometheus metrics."""

# The one place the release version is written (docs/release.md). A literal: setuptools reads it without
# importing smlens, and smlens needs no importlib.metadata, which would stay resident in `smlens serve`.
__version__ = "0.1.0"
