"""One NVML initialisation shared by the users of NVML (the nvml and gpm backends, attribution).

A user calls ``acquire(self)`` before its first NVML call and ``release(self)`` in ``close()``;
both are idempotent per user. ``nvmlInit`` runs at the first acquire, ``nvmlShutdown`` at the last
release, so closing one backend never pulls NVML from under the other.

The session also keeps each GPU's MIG layout (:func:`smlens.sources.nvml.mig.scan`), scanned again when older
than ``max_age`` or after :meth:`NvmlSession.rescan_mig`: a user whose call on a GPU instance fails
asks for a rescan, so a reconfigured GPU is seen at the next tick. A scan that fails is never kept: the
last layout read stands in for it, and the next tick (a later ``now``) scans again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import Any

from smlens.errors import BackendUnavailable, GpuLostError
from smlens.model import GpuIdentity
from smlens.sources.nvml.calls import Absent, call, describe, nvml_module
from smlens.sources.nvml.mig import GpuInstanceLayout, MigDevice, scan

_log = logging.getLogger(__name__)

# Seconds a MIG layout is trusted: instances created since appear at most this late. A failed call on
# an instance that is gone triggers a rescan at once.
MIG_RESCAN_INTERVAL = 10.0

MigLayout = tuple[GpuInstanceLayout, ...] | None | Absent  # None: not in MIG mode

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
        self._mig_lock = threading.Lock()
        self._users: set[object] = set()
        self._handles: dict[str, Any] = {}
        self._mig: dict[str, tuple[float, MigLayout]] = {}  # GPU uuid -> (scanned at, last layout read)
        self._mig_failed: dict[str, tuple[float, Absent]] = {}  # GPU uuid -> (failed at, why)
        self._mig_devices: dict[str, dict[str, MigDevice]] = {}  # GPU uuid -> MIG devices seen

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
                self._mig.clear()
                self._mig_failed.clear()
                self._mig_devices.clear()
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

    def mig_layout(self, gpu: GpuIdentity, now: float, max_age: float = MIG_RESCAN_INTERVAL) -> MigLayout:
        """The GPU instances of a GPU in MIG mode, scanned at most ``max_age`` seconds before ``now``."""
        cached = self._mig.get(gpu.uuid)  # both backends ask every tick: a fresh layout needs no lock
        if cached is not None and 0 <= now - cached[0] < max_age and gpu.uuid not in self._mig_failed:
            return cached[1]
        with self._mig_lock:  # the sampler and attribution threads: one scan at a time, on one cache
            return self._mig_layout(gpu, now, max_age)

    def _mig_layout(self, gpu: GpuIdentity, now: float, max_age: float) -> MigLayout:
        with self._lock:
            cached = self._mig.get(gpu.uuid)
            failed = self._mig_failed.get(gpu.uuid)
            known = self._mig_devices.setdefault(gpu.uuid, {})
        if failed is not None and failed[0] == now:  # the other backend of the same tick: no second try
            return failed[1] if cached is None else cached[1]
        if cached is not None and 0 <= now - cached[0] < max_age:
            return cached[1]
        handle = self.handle(gpu)
        layout = handle if isinstance(handle, Absent) else self._scan(gpu, handle, known)
        with self._lock:
            if not isinstance(layout, Absent):
                self._mig[gpu.uuid] = (now, layout)
                self._mig_failed.pop(gpu.uuid, None)
                return layout
            first = gpu.uuid not in self._mig_failed
            self._mig_failed[gpu.uuid] = (now, layout)
        if first:
            _log.warning(
                "MIG layout of %s unreadable (%s); kept the last one read", describe(gpu), layout.reason
            )
        return layout if cached is None else cached[1]

    def _scan(self, gpu: GpuIdentity, handle: Any, known: dict[str, MigDevice]) -> MigLayout:
        """A MIG problem costs the GPU's instances, never the GPU: an unexpected error is an Absent layout."""
        try:
            return scan(nvml_module(), handle, describe(gpu), known)
        except GpuLostError:
            raise
        except Exception:
            _log.debug("MIG scan of %s raised", describe(gpu), exc_info=True)
            return Absent("unexpected")

    def rescan_mig(self, gpu: GpuIdentity) -> None:
        """Scan this GPU's MIG layout again at the next ``mig_layout``."""
        with self._lock:
            if gpu.uuid in self._mig:  # keep the layout for a failing rescan to fall back on
                self._mig[gpu.uuid] = (-math.inf, self._mig[gpu.uuid][1])

    def mig_placements(self, gpus: Sequence[GpuIdentity], now: float) -> dict[str, tuple[str, int]]:
        """MIG device UUID -> (parent GPU UUID, GPU instance id) from the layouts the session keeps (scanned
        again when old, as for the sampler); unreadable GPUs left out."""
        placements: dict[str, tuple[str, int]] = {}
        for gpu in gpus:
            try:
                layout = self.mig_layout(gpu, now)
            except GpuLostError:
                continue
            for found in () if layout is None or isinstance(layout, Absent) else layout:
                for uuid in found.instance.mig_uuids:
                    placements[uuid] = (gpu.uuid, found.instance.gpu_instance)
        return placements
