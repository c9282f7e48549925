"""Find and load NVIDIA's DCGM Python bindings, which ship with DCGM rather than on PyPI."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from smlens.errors import BackendUnavailable

# DCGM 4 and DCGM 3 install locations, in that order.
BINDING_DIRS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
)


@dataclass(frozen=True)
class DcgmBindings:
    """The binding modules smlens calls (they sit beside ``pydcgm.py`` in a DCGM install)."""

    agent: ModuleType  # dcgm_agent: the C API, one function per call
    structs: ModuleType  # dcgm_structs: constants, ctypes structures, DCGMError
    fields: ModuleType  # dcgm_fields: entity and field-type constants
    value: ModuleType  # dcgmvalue: the blank sentinels


def _import() -> DcgmBindings | None:
    try:
        return DcgmBindings(
            agent=importlib.import_module("dcgm_agent"),
            structs=importlib.import_module("dcgm_structs"),
            fields=importlib.import_module("dcgm_fields"),
            value=importlib.import_module("dcgmvalue"),
        )
    except ImportError:
        return None


def load_bindings(search_dirs: Sequence[str] = BINDING_DIRS) -> DcgmBindings:
    """Import the bindings from PYTHONPATH, else from the first DCGM install dir that has them,
    then load libdcgm. Raises :class:`BackendUnavailable` with one sentence when either is missing."""
    bindings = _import()
    if bindings is None:
        for directory in search_dirs:
            if (Path(directory) / "dcgm_agent.py").is_file():
                sys.path.append(directory)
                bindings = _import()
                if bindings is not None:
                    break
    if bindings is None:
        places = f"in {', '.join(search_dirs)} or on PYTHONPATH" if search_dirs else "on PYTHONPATH"
        raise BackendUnavailable(
            f"DCGM Python bindings (pydcgm) not found {places}; install DCGM or use --backend nvml.",
            reason="bindings_missing",
        )
    try:
        bindings.structs._dcgmInit()
        bindings.agent.dcgmInit()
    except bindings.structs.DCGMError as exc:
        where = Path(bindings.agent.__file__ or "dcgm_agent").parent
        raise BackendUnavailable(
            f"DCGM Python bindings found in {where} but the DCGM library could not be loaded ({exc}); "
            "install the datacenter-gpu-manager package that matches them.",
            reason="library_missing",
        ) from exc
    return bindings
