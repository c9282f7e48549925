"""One NVML initialisation shared by the backends that read NVML (nvml and gpm).

A backend calls ``acquire(self)`` before its first NVML call and ``release(self)`` in ``close()``;
both are idempotent per backend. ``nvmlInit`` runs at the first acquire, ``nvmlShutdown`` at the last
release, so closing one backend never pulls NVML from under the other.
"""

from __future__ import annotations

import threading
from typing import Any

from smlens.backends.nvml_calls import Absent, call, describe, nvml_module
from smlens.errors import BackendUnavailable
from smlens.model import GpuIdentity

_INIT_FAILURES = {
    "library_not_found": "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this machine; "
    "use --backend sim for a simulated node.",
    "driver_not_loaded": "NVML cannot start: the NVIDIA kernel driver is not loaded; load it "
    "or use --backend sim for a simulated node.",
    "no_permission": "NVML cannot start: no permission to open the NVIDIA devices (/dev/nvidia*); "
    "run smlens with access to them.",
    "lib_rm_version_mismatch": "NVML cannot start: libnvidia-ml and the loaded NVIDIA kernel driver "
    "are of different versions; reload the driver or reboot.",
}


class NvmlSession:
    """Reference-counted NVML initialisation plus the device handles of the GPUs found."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: set[object] = set()
        self._handles: dict[str, Any] = {}

    def acquire(self, user: object) -> None:
        """Initialise NVML if nobody holds it yet; raises BackendUnavailable with one sentence."""
        with self._lock:
            if user in self._users:
                return
            if not self._users:
                started = call(nvml_module().nvmlInit)
                if isinstance(started, Absent):
                    raise BackendUnavailable(
                        _INIT_FAILURES.get(
                            started.reason,
                            f"NVML cannot start ({started.reason}); use --backend sim for a simulated node.",
                        ),
                        reason=started.reason,
                    )
            self._users.add(user)

    def release(self, user: object) -> None:
        with self._lock:
            if user not in self._users:
                return
            self._users.discard(user)
            if not self._users:
                self._handles.clear()
                call(nvml_module().nvmlShutdown)  # nothing left to do if the shutdown fails

    def remember(self, uuid: str, handle: Any) -> None:
        with self._lock:
            self._handles[uuid] = handle

    def handle(self, gpu: GpuIdentity) -> Any | Absent:
        """The device handle of a GPU: the one found at discovery, else looked up by UUID."""
        with self._lock:
            known = self._handles.get(gpu.uuid)
        if known is not None:
            return known
        found = call(nvml_module().nvmlDeviceGetHandleByUUID, gpu.uuid, gpu=describe(gpu))
        if not isinstance(found, Absent):
            self.remember(gpu.uuid, found)
        return found
