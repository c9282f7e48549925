"""The DCGM backend: SM activity, occupancy, pipe activity and PCIe/NVLink traffic from DCGM's
profiling fields, for GPUs without NVML GPM (Volta, Turing, Ampere, Ada).

It talks to a running nv-hostengine (or, when asked, an embedded one), watches per GPU only fields
that DCGM can count in one pass, and reads DCGM's latest sample once per tick (see docs/dcgm.md).
:class:`DcgmBackend` composes the package's parts under one lock:

- :mod:`~smlens.sources.dcgm.address`: where the hostengine listens;
- :mod:`~smlens.sources.dcgm.fields`: the fields smlens wants and which fit in one pass;
- :mod:`~smlens.sources.dcgm.session`: the session, what smlens made in it, reconnects with backoff;
- :mod:`~smlens.sources.dcgm.watches`: the watches per GPU, their retries and the sharing check;
- :mod:`~smlens.sources.dcgm.decode`: DCGM's values made into a :class:`~smlens.model.Reading`;
- :mod:`~smlens.sources.dcgm.instances`: the GPU instances of GPUs in MIG mode;
- :mod:`~smlens.sources.dcgm.control`: pausing and resuming profiling.

A session's watches live as long as the session: a new session after a reconnect starts them afresh.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from smlens.errors import BackendError, GpuLostError
from smlens.model import GpuIdentity, Reading
from smlens.sources.base import Backend
from smlens.sources.dcgm.address import HostengineAddress, parse_hostengine
from smlens.sources.dcgm.bindings import DcgmBindings, load_bindings
from smlens.sources.dcgm.control import ProfilingPause
from smlens.sources.dcgm.decode import ValueDecoder
from smlens.sources.dcgm.instances import InstanceWatches
from smlens.sources.dcgm.mig import MigLayouts
from smlens.sources.dcgm.session import (
    DcgmSession,
    GroupNames,
    HostengineConnection,
    connection_lost,
    error_code,
)
from smlens.sources.dcgm.watches import GpuWatches

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Watched:
    """What smlens watches in one session: per GPU, and per GPU instance when MIG layouts are known."""

    session: DcgmSession
    gpus: GpuWatches
    instances: InstanceWatches | None


class DcgmBackend(Backend):
    """Reads DCGM profiling fields. ``address`` None means an embedded host engine."""

    name = "dcgm"
    provides_profiling = True

    def __init__(
        self,
        bindings: DcgmBindings,
        address: HostengineAddress | None,
        interval: float,
        node: str,
        mig: MigLayouts | None = None,
    ) -> None:
        self._b = bindings
        self._mig = mig
        self._names = GroupNames(node)
        self._connection = HostengineConnection(bindings, address, interval, self._names)
        self._decoder = ValueDecoder(bindings, interval, self.name)
        self._pause = ProfilingPause(self._connection)
        self._lock = threading.Lock()
        self._gpus: list[GpuIdentity] = []
        self._watched: _Watched | None = None

    @property
    def where(self) -> str:
        return self._connection.where

    @property
    def instance(self) -> str:
        """The prefix of every group and field-group name this backend creates."""
        return self._names.instance

    @property
    def paused(self) -> bool:
        return self._pause.paused

    def _state(self, session: DcgmSession) -> _Watched:
        """What is watched in ``session``; nothing yet in a session not seen before."""
        if self._watched is None or self._watched.session is not session:
            instances = None if self._mig is None else InstanceWatches(session, self._decoder, self._mig)
            self._watched = _Watched(session, GpuWatches(session), instances)
        return self._watched

    def _restart(self, session: DcgmSession, now: float) -> None:
        """Watch the attached GPUs in a new session, paused again if smlens had paused."""
        self._state(session).gpus.setup(self._gpus, now)
        self._pause.reapply(session)

    def connect(self) -> None:
        """Open the first session; raises :class:`BackendUnavailable` with one sentence if it fails."""
        with self._lock:
            self._state(self._connection.connect())

    # -- Backend interface ------------------------------------------------------------------

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        """GPUs DCGM cannot profile are refused; a GPU whose watch failed, or every GPU while the
        hostengine is unreachable, is served and retried on reads."""
        with self._lock:
            self._gpus = list(gpus)
            session = self._connection.session
            if session is None:
                return {gpu.uuid: None for gpu in gpus}
            watches = self._state(session).gpus
            try:
                watches.setup(gpus, None)
            except self._b.structs.DCGMError as exc:
                log.warning("%s failed during setup (%s); reconnecting on the next read", self.where, exc)
                self._connection.lose(0.0, exc)
                return {gpu.uuid: None for gpu in gpus}
            return watches.verdicts(gpus)

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        with self._lock:
            session = self._connection.live(now, lambda fresh: self._restart(fresh, now))
            try:
                return self._read(self._state(session), gpu, now)
            except self._b.structs.DCGMError as exc:
                if connection_lost(self._b, exc):
                    raise self._connection.lose(now, exc) from exc
                if error_code(exc) == self._b.structs.DCGM_ST_GPU_IS_LOST:
                    raise GpuLostError(f"DCGM reports GPU {gpu.index} lost.") from exc
                raise BackendError(
                    f"DCGM read of GPU {gpu.index} failed ({exc}).", reason="dcgm_error"
                ) from exc

    def _read(self, watched: _Watched, gpu: GpuIdentity, now: float) -> Reading:
        watched.gpus.retry_refused(gpu, now)
        watched.gpus.check_sharing(now)
        watch = watched.gpus.watches.get(gpu.uuid)
        if watch is None:
            return self._decoder.unwatched(watched.gpus.unwatched_reason(gpu.uuid))
        values = watched.session.latest_values(self._b.fields.DCGM_FE_GPU, watch.gpu_id, watch.plan.watched)
        paused = self._pause.paused
        reading = self._decoder.reading(
            watch.cursor, values, now, paused=paused, unavailable=watch.plan.unavailable, mode=watch.mode
        )
        if watched.instances is not None:
            reading = watched.instances.add_to(gpu, watch.gpu_id, watch.plan.watched, reading, now, paused)
        return reading

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    # -- profiling pause --------------------------------------------------------------------

    def pause_profiling(self) -> None:
        """Release the GPUs' performance counters (for Nsight Compute and friends) hostengine-wide."""
        with self._lock:
            self._pause.set(True)

    def resume_profiling(self) -> None:
        with self._lock:
            self._pause.set(False)


def open_dcgm_backend(
    hostengine: str | None,
    embedded: bool,
    interval: float,
    node: str | None = None,
    mig: MigLayouts | None = None,
) -> DcgmBackend:
    """Load the bindings and connect; raises :class:`BackendUnavailable` (or :class:`ConfigError`
    for a bad hostengine address) with one sentence. The settings have already checked that
    ``embedded`` and ``hostengine`` exclude each other and that ``interval`` is in range. ``node``
    (default: this host's name) goes into the names of the groups smlens creates in the hostengine.
    ``mig`` (the NVML session) names the GPU instances of GPUs in MIG mode; without it none are read."""
    address = None if embedded else parse_hostengine(hostengine)
    backend = DcgmBackend(load_bindings(), address, interval, node or socket.gethostname(), mig)
    backend.connect()
    return backend
