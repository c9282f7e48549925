"""The gate NVML calls of smlens pass through, and the one place NVML errors become reasons.

``call(fn, *args, gpu=...)`` returns what the pynvml function returns, or :class:`Absent` with a short
reason when NVML cannot give the value: ``not_supported``, ``no_permission``, ``timeout``, ``not_found``...
(the name of the ``NVML_ERROR_*`` code in lower case); ``call_named`` also answers ``not_in_pynvml`` for a
function the installed nvidia-ml-py does not define. A lost GPU raises
:class:`~smlens.errors.GpuLostError` instead, because nothing else can be read from it either.

pynvml is looked up in ``sys.modules`` at each use (:func:`nvml_module`), never bound at import, so that
tests can put a fake module in its place.

The every-tick calls of the nvml backend (memory info, its table of plain reads, the memory-temperature
field, the clock-event reasons), the GPM sample and metrics calls and the XID drain catch ``NVMLError``
themselves instead of going through ``call``, which would add a frame per call at every tick: the error
becomes its reason through :func:`failure`, as in ``call`` (the nvml backend keeps it and decodes it with
the tick, later), and the drain stops at it.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from smlens.errors import BackendUnavailable, GpuLostError
from smlens.model import GpuIdentity

T = TypeVar("T")

# Members of the c_nvmlValue_t union, indexed by NVML_VALUE_TYPE_* (an NVML ABI constant).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass(frozen=True, slots=True)
class Absent:
    """A value NVML could not give, and why (a short label fit for a metric label value)."""

    reason: str


def nvml_module() -> Any:
    """The pynvml module in use (the real one, or a fake a test installed in ``sys.modules``)."""
    loaded = sys.modules.get("pynvml")
    if loaded is not None:  # every NVML read asks: a dict lookup costs half an import statement
        return loaded
    try:
        import pynvml
    except ImportError as exc:
        raise BackendUnavailable(
            "Python package nvidia-ml-py (module pynvml) is not installed; reinstall smlens with its "
            "dependencies or use --backend sim for a simulated node.",
            reason="no_pynvml",
        ) from exc
    return pynvml


def describe(gpu: GpuIdentity) -> str:
    """How messages name a GPU."""
    return f"GPU {gpu.index} ({gpu.uuid})"


def call(fn: Callable[..., T], *args: Any, gpu: str = "a GPU") -> T | Absent:
    """``fn(*args)``, or Absent when NVML returns an error; ``gpu`` names the GPU in a GpuLostError."""
    try:
        return fn(*args)
    except Exception as exc:
        if not isinstance(exc, nvml_module().NVMLError):
            raise
        return failure(exc.value, gpu)


def call_named(nv: Any, name: str, *args: Any, gpu: str = "a GPU") -> Any | Absent:
    """``call`` of the pynvml function ``name``; Absent("not_in_pynvml") when this nvidia-ml-py lacks it."""
    fn = getattr(nv, name, None)
    return Absent("not_in_pynvml") if fn is None else call(fn, *args, gpu=gpu)


def failure(code: int, gpu: str = "a GPU") -> Absent:
    """The Absent for an NVML return code, e.g. a per-field or per-metric ``nvmlReturn``."""
    reason = _reasons(nvml_module()).get(code, f"nvml_error_{code}")
    if reason == "gpu_is_lost":
        raise GpuLostError(f"{gpu} is lost: NVML reports that it fell off the bus or stopped answering.")
    return Absent(reason)


@functools.lru_cache(maxsize=4)
def _reasons(nv: ModuleType) -> dict[int, str]:
    return {
        value: name.removeprefix("NVML_ERROR_").lower()
        for name, value in vars(nv).items()
        if name.startswith("NVML_ERROR_") and isinstance(value, int)
    }


def value_of(value: Any, value_type: int) -> float | Absent:
    """The number held in a ``c_nvmlValue_t`` union whose member NVML names by ``value_type``."""
    if not 0 <= value_type < len(_VALUE_MEMBERS):
        return Absent("unknown_value_type")
    return float(getattr(value, _VALUE_MEMBERS[value_type]))


def text(value: str | bytes) -> str:
    """pynvml returns str from most string getters and bytes from ctypes char arrays."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def address(handle: Any) -> int:
    """The address a device handle points to: equal for two handles of the same GPU."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def attach_each(
    gpus: Sequence[GpuIdentity], attach_one: Callable[[GpuIdentity], str | None]
) -> dict[str, str | None]:
    """Per GPU uuid, None if ``attach_one`` serves it, else why not; a lost GPU is one such reason."""
    verdicts: dict[str, str | None] = {}
    for gpu in gpus:
        try:
            verdicts[gpu.uuid] = attach_one(gpu)
        except GpuLostError as exc:
            verdicts[gpu.uuid] = str(exc)
    return verdicts
