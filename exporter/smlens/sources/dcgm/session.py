"""The connection to DCGM: opening a session with nv-hostengine (or an embedded host engine), the groups
and field groups smlens makes in it, and dropping a lost session and reconnecting with backoff.

Every attempt is timed on the sampler's clock (the ``now`` of the backend's reads). smlens only ever
destroys groups it made, named ``smlens-<node>-<random>-<n>``.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from smlens.errors import BackendError, BackendUnavailable
from smlens.sources.dcgm.address import HostengineAddress
from smlens.sources.dcgm.bindings import DcgmBindings

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_MS = 1000  # DCGM's default would block a sampling tick for too long
RECONNECT_FIRST_DELAY = 1.0
RECONNECT_MAX_DELAY = 30.0
NAME_PREFIX = "smlens-"

Made = tuple[str, Any]  # ("group" | "field_group", DCGM's id) of something smlens created


def error_code(exc: Exception) -> int:
    """The DCGM_ST_* status of a DCGMError (0 when it carries none)."""
    return int(getattr(exc, "value", 0))


def connection_lost(bindings: DcgmBindings, exc: Exception) -> bool:
    """A broken connection or a hostengine that stopped answering (DCGM_ST_TIMEOUT)."""
    structs = bindings.structs
    return error_code(exc) in (int(structs.DCGM_ST_CONNECTION_NOT_VALID), int(structs.DCGM_ST_TIMEOUT))


def instance_name(node: str) -> str:
    """``smlens-<node>-<random>``: unique per backend instance, readable in ``dcgmi group -l``."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", node).strip("-")[:60] or "node"
    return f"{NAME_PREFIX}{safe}-{secrets.token_hex(4)}"


class GroupNames:
    """The names of the groups and field groups one backend makes, numbered on across its sessions."""

    def __init__(self, node: str) -> None:
        self.instance = instance_name(node)
        self._numbers = itertools.count(1)

    def new(self) -> str:
        return f"{self.instance}-{next(self._numbers)}"

    def ours(self, name: str) -> bool:
        return name.startswith(self.instance + "-")


@dataclass
class DcgmSession:
    """One open session with DCGM and the groups and field groups smlens made in it."""

    bindings: DcgmBindings
    handle: Any
    interval: float  # DCGM samples watched fields this often, in seconds
    names: GroupNames
    made: list[Made] = field(default_factory=list)

    def watch(
        self, field_ids: Sequence[int], gpu_ids: Sequence[int] = (), instances: Sequence[int] = ()
    ) -> list[Made]:
        """Create a group of GPUs or of GPU-instance entities and a field group, and watch them; on
        failure destroy what was made. Returns what was made."""
        agent, structs = self.bindings.agent, self.bindings.structs
        name = self.names.new()
        made: list[Made] = []
        try:
            group = agent.dcgmGroupCreate(self.handle, structs.DCGM_GROUP_EMPTY, name)
            made.append(("group", group))
            for gpu_id in gpu_ids:
                agent.dcgmGroupAddDevice(self.handle, group, gpu_id)
            for entity_id in instances:
                agent.dcgmGroupAddEntity(self.handle, group, self.bindings.fields.DCGM_FE_GPU_I, entity_id)
            field_group = agent.dcgmFieldGroupCreate(self.handle, list(field_ids), name)
            made.append(("field_group", field_group))
            agent.dcgmWatchFields(
                self.handle,
                group,
                field_group,
                round(self.interval * 1_000_000),
                max(30.0, 4 * self.interval),
                0,
            )
        except structs.DCGMError as exc:
            if not connection_lost(self.bindings, exc):
                self.destroy(made)
            raise
        self.made.extend(made)
        return made

    def latest_values(self, entity_group: int, entity_id: int, field_ids: Sequence[int]) -> Any:
        """DCGM's latest sample of each field of one entity (a GPU or a GPU instance)."""
        return self.bindings.agent.dcgmEntityGetLatestValues(
            self.handle, entity_group, entity_id, list(field_ids)
        )

    def destroy(self, made: Sequence[Made]) -> None:
        """Destroy groups and field groups this backend made, newest first; nothing else, ever."""
        agent = self.bindings.agent
        for kind, ident in reversed(made):
            destroy = agent.dcgmFieldGroupDestroy if kind == "field_group" else agent.dcgmGroupDestroy
            try:
                destroy(self.handle, ident)
            except self.bindings.structs.DCGMError as exc:
                if connection_lost(self.bindings, exc):
                    raise
                log.debug("destroying DCGM %s %s failed: %s", kind, ident, exc)

    def forget(self, made: Sequence[Made]) -> None:
        """Destroy what one watch made and stop counting it among the current DCGM connection's."""
        self.destroy(made)
        self.made = [m for m in self.made if m not in made]


class HostengineConnection:
    """The current session, if any, and when to try again after losing it. ``address`` None means an
    embedded host engine."""

    def __init__(
        self, bindings: DcgmBindings, address: HostengineAddress | None, interval: float, names: GroupNames
    ) -> None:
        self._b = bindings
        self._address = address
        self._interval = interval
        self._names = names
        self.session: DcgmSession | None = None
        self._retry_delay = RECONNECT_FIRST_DELAY
        self._retry_at = 0.0

    @property
    def where(self) -> str:
        return (
            "an embedded DCGM host engine" if self._address is None else f"nv-hostengine at {self._address}"
        )

    def _open(self) -> DcgmSession:
        agent, structs = self._b.agent, self._b.structs
        if self._address is None:
            handle = agent.dcgmStartEmbedded(structs.DCGM_OPERATION_MODE_AUTO)
        else:
            params = structs.c_dcgmConnectV2Params_v2()
            params.persistAfterDisconnect = 0  # the hostengine drops our groups and watches when we go
            params.timeoutMs = CONNECT_TIMEOUT_MS
            params.addressIsUnixSocket = 1 if self._address.unix_socket else 0
            handle = agent.dcgmConnect_v2(self._address.target, params)
        return DcgmSession(self._b, handle, self._interval, self._names)

    def connect(self) -> DcgmSession:
        """Open the first session; raises :class:`BackendUnavailable` with one sentence if it fails."""
        try:
            self.session = self._open()
        except self._b.structs.DCGMError as exc:
            hint = (
                "run smlens as root or use nv-hostengine"
                if self._address is None
                else "start it (systemctl start nvidia-dcgm) or pass --dcgm-hostengine / --dcgm-embedded"
            )
            raise BackendUnavailable(
                f"cannot use {self.where} ({exc}); {hint}.", reason="hostengine_unreachable"
            ) from exc
        return self.session

    def live(self, now: float, start: Callable[[DcgmSession], None]) -> DcgmSession:
        """The live session, reconnecting (with backoff) when the hostengine went away; ``start``
        prepares a new session, and a DCGM error in it counts as a failed reconnect."""
        if self.session is not None:
            return self.session
        if now < self._retry_at:
            raise self.unreachable(None)
        try:
            self.session = self._open()
            start(self.session)
        except self._b.structs.DCGMError as exc:
            raise self.lose(now, exc, reconnecting=True) from exc
        self._retry_delay = RECONNECT_FIRST_DELAY
        log.info("reconnected to %s", self.where)
        return self.session

    def lose(self, now: float, exc: Exception | None, reconnecting: bool = False) -> BackendError:
        """Drop the session after a connection failure and schedule the next attempt: 1 s after
        losing a working session, then twice as long after each failed reconnect, up to 30 s."""
        if self.session is not None:
            self._disconnect(self.session, tidy=False)
            self.session = None
        self._retry_at = now + self._retry_delay
        if reconnecting:
            self._retry_delay = min(self._retry_delay * 2, RECONNECT_MAX_DELAY)
        return self.unreachable(exc)

    def unreachable(self, exc: Exception | None) -> BackendError:
        detail = f" ({exc})" if exc is not None else ""
        return BackendError(f"lost {self.where}{detail}; reconnecting.", reason="hostengine_unreachable")

    def close(self) -> None:
        """End the session, destroying what smlens made in it."""
        if self.session is not None:
            self._disconnect(self.session, tidy=True)
            self.session = None

    def _disconnect(self, session: DcgmSession, tidy: bool) -> None:
        agent = self._b.agent
        try:
            if tidy:  # the hostengine would drop them with the connection; a live one is told at once
                session.destroy(session.made)
            if self._address is None:
                agent.dcgmStopEmbedded(session.handle)
            else:
                agent.dcgmDisconnect(session.handle)
        except self._b.structs.DCGMError as exc:
            log.debug("closing the DCGM connection failed: %s", exc)
