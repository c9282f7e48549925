"""Which GPU each MIG device is carved from, so that MIG allocations land on their parent GPU."""

from __future__ import annotations

from collections.abc import Sequence

from smlens.backends.nvml_calls import Absent, call, describe, nvml_module, text
from smlens.backends.nvml_session import NvmlSession
from smlens.errors import GpuLostError
from smlens.model import GpuIdentity


def mig_parents(session: NvmlSession, gpus: Sequence[GpuIdentity]) -> dict[str, str]:
    """MIG device UUID -> parent GPU UUID for every GPU in MIG mode; GPUs NVML cannot read are left out."""
    nv = nvml_module()
    parents: dict[str, str] = {}
    for gpu in gpus:
        try:
            handle = session.handle(gpu)
            if isinstance(handle, Absent):
                continue
            mode = call(nv.nvmlDeviceGetMigMode, handle, gpu=describe(gpu))
            if isinstance(mode, Absent) or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
                continue
            count = call(nv.nvmlDeviceGetMaxMigDeviceCount, handle, gpu=describe(gpu))
            for index in range(0 if isinstance(count, Absent) else count):
                mig = call(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, index, gpu=describe(gpu))
                uuid = Absent("not_found") if isinstance(mig, Absent) else call(nv.nvmlDeviceGetUUID, mig)
                if not isinstance(uuid, Absent):
                    parents[text(uuid)] = gpu.uuid
        except GpuLostError:
            continue
    return parents
