"""Pausing and resuming DCGM's profiling hostengine-wide, so that another profiler (Nsight Compute and
friends) can have the GPUs' performance counters; the admin endpoints drive it."""

from __future__ import annotations

import logging

from smlens.errors import BackendError
from smlens.sources.dcgm.session import DcgmSession, HostengineConnection, connection_lost, error_code

log = logging.getLogger(__name__)


class ProfilingPause:
    """Whether smlens paused DCGM's profiling, and the calls that pause and resume it."""

    def __init__(self, connection: HostengineConnection) -> None:
        self._connection = connection
        self.paused = False

    def set(self, pause: bool) -> None:
        """Pause or resume in the current session; the caller holds the backend's lock."""
        verb = "pause" if pause else "resume"
        session = self._connection.session
        if session is None:
            raise self._connection.unreachable(None)
        bindings = session.bindings
        call = bindings.agent.dcgmProfPause if pause else bindings.agent.dcgmProfResume
        try:
            call(session.handle)
        except bindings.structs.DCGMError as exc:
            if connection_lost(bindings, exc):
                raise self._connection.lose(0.0, exc) from exc
            if error_code(exc) == bindings.structs.DCGM_ST_NOT_SUPPORTED:
                raise BackendError(
                    f"DCGM cannot {verb} profiling on this node ({exc}).", reason="not_supported"
                ) from exc
            raise BackendError(f"DCGM failed to {verb} profiling ({exc}).", reason="dcgm_error") from exc
        self.paused = pause
        log.warning("DCGM profiling %s on %s", "paused" if pause else "resumed", self._connection.where)

    def reapply(self, session: DcgmSession) -> None:
        """Pause a new session again if smlens had paused: a restarted hostengine forgot the pause."""
        if self.paused:
            session.bindings.agent.dcgmProfPause(session.handle)
