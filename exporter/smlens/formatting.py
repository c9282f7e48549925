"""Values written for people, formatted one way wherever they appear.

This module imports nothing, so that every layer, the lowest included, can use it.
"""

from __future__ import annotations


def percent(ratio: float | None, digits: int = 1, *, width: int = 0, sep: str = "") -> str:
    """A 0..1 ratio as a percentage with ``digits`` decimals, "n/a" when it is unknown.

    ``width`` right-aligns the number (for columns of text); ``sep`` goes between it and the sign.
    """
    if ratio is None:
        return "n/a"
    return f"{100 * ratio:.{digits}f}".rjust(width) + f"{sep}%"


# Words for the short reasons a value or a source is absent (``missing`` and ``profiling.reason`` in
# /api/v1/gpus): NVML's NVML_ERROR_* names in lower case (sources/nvml/calls.py), DCGM's per-value reasons
# (docs/dcgm.md) and smlens' own.
REASONS = {
    "not_supported": "not supported by this GPU",
    "no_permission": "no permission to read it",
    "not_found": "not found",
    "timeout": "timed out",
    "unknown": "unknown error",
    "uninitialized": "NVML not initialized",
    "insufficient_power": "not enough power connected",
    "driver_not_loaded": "NVIDIA driver not loaded",
    "function_not_found": "not in this driver",
    "gpu_lost": "the GPU is lost (fell off the bus or stopped answering)",
    "gpu_is_lost": "the GPU is lost (fell off the bus or stopped answering)",
    "reset_required": "the GPU needs a reset",
    "not_in_pynvml": "not in the installed nvidia-ml-py",
    "not_a_number": "not a number",
    "not_attached": "not served by this backend",
    "unexpected": "unexpected error (see the exporter's log)",
    "metric_group_conflict": "DCGM cannot read it in the same pass as SM activity",
    "blank": "DCGM has no value for it",
    "no_data": "no sample yet",
    "not_watched": "DCGM does not watch it yet",
    "stale": "DCGM stopped refreshing it",
    "warming_up": "first read, no value yet",
    "profiling_paused": "profiling is paused (handed to a profiler)",
    "watch_failed": "DCGM refused to watch it (retried every 30 s)",
    "dcgm_error": "DCGM failed to read it",
    "hostengine_unreachable": "the DCGM hostengine cannot be reached",
    "not_in_dcgm": "DCGM does not list this MIG instance yet",
    "mig_layout_changing": "the MIG layout is changing",
    "dcgm_hierarchy_unreadable": "DCGM cannot read the MIG layout",
    "not_read": "not read this tick",
}


def reason(text: str) -> str:
    """A reason in words: "not_supported" reads "not supported by this GPU", a "backend: code" keeps its
    backend, an unknown code loses its underscores, and a sentence stays as it is."""
    source, sep, code = text.rpartition(": ")
    if code in REASONS:
        return source + sep + REASONS[code]
    return source + sep + (code.replace("_", " ") if code.isidentifier() and code.islower() else code)
