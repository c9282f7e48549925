"""XID errors from NVML's event API, counted per GPU and handed to each GPU's next reading.

One event set watches every GPU that supports ``nvmlEventTypeXidCriticalError``. It is drained without
blocking (timeout 0) once per round of reads: a round ends when a GPU already read in it is read again,
so the drain happens once per sampling tick whatever the order or the number of GPUs read.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from smlens.sources.nvml.calls import Absent, address, call, nvml_module

_MAX_EVENTS_PER_DRAIN = 256
_NONE: Mapping[int, int] = MappingProxyType({})  # a GPU's XIDs in a tick without any


class XidWatch:
    """``watch()`` each GPU once NVML is initialised, then ``take()`` at each of its reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event_set: Any = None  # an nvmlEventSet_t; Absent when NVML gave none; None when closed
        self._uuid_at: dict[int, str] = {}  # handle address -> uuid
        self._read_this_round: set[str] = set()
        self._pending: dict[str, Counter[int]] = {}

    def watch(self, uuid: str, handle: Any, label: str) -> Absent | None:
        """Registers the GPU for XID events; returns why it cannot be watched, or None."""
        nv = nvml_module()
        if self._event_set is None:
            self._event_set = call(nv.nvmlEventSetCreate)
        if isinstance(self._event_set, Absent):
            return self._event_set
        types = call(nv.nvmlDeviceGetSupportedEventTypes, handle, gpu=label)
        if isinstance(types, Absent):
            return types
        if not types & nv.nvmlEventTypeXidCriticalError:
            return Absent("not_supported")
        done = call(nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
        if isinstance(done, Absent):
            return done
        self._uuid_at[address(handle)] = uuid
        return None

    def take(self, uuid: str) -> Mapping[int, int]:
        """The XIDs seen on this GPU since its previous ``take``, as {xid: count}."""
        with self._lock:
            if not self._read_this_round or uuid in self._read_this_round:
                self._drain()
                self._read_this_round.clear()
            self._read_this_round.add(uuid)
            counts = self._pending.pop(uuid, None)
        return dict(counts) if counts else _NONE

    def _drain(self) -> None:
        if not self._uuid_at:
            return
        nv = nvml_module()
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                event = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except nv.NVMLError:  # "timeout" when nothing is queued; a lost GPU raises on its own read
                return
            uuid = self._uuid_at.get(address(event.device))
            if uuid is not None and event.eventType & nv.nvmlEventTypeXidCriticalError:
                self._pending.setdefault(uuid, Counter())[int(event.eventData)] += 1

    def close(self) -> None:
        if self._event_set is not None and not isinstance(self._event_set, Absent):
            call(nvml_module().nvmlEventSetFree, self._event_set)
        self._event_set = None
        self._uuid_at.clear()
        self._pending.clear()
