"""The DCGM backend: SM activity, occupancy, pipe activity and PCIe/NVLink traffic from DCGM's
profiling fields, for GPUs without NVML GPM (Volta, Turing, Ampere, Ada).

It talks to a running nv-hostengine (or, when asked, an embedded one), watches per GPU only fields
that DCGM can count in one pass, and reads DCGM's latest sample once per tick. DCGM's values are
averages over its own sample period, which smlens sets to its sampling interval; each read credits
the latest sample to the whole time since the previous read of that GPU (see docs/dcgm.md).

Lifecycle (all timed on the sampler's clock, the ``now`` of :meth:`DcgmBackend.read`): a lost or hung
hostengine (CONNECTION_NOT_VALID, TIMEOUT) drops the session and reconnects with backoff; a watch
DCGM refuses is retried every :data:`WATCH_RETRY_SECONDS`; every :data:`SHARING_CHECK_SECONDS` smlens
looks at the other clients' field groups to tell whether DCGM multiplexes the profiling counters.
smlens only ever destroys groups it made, named ``smlens-<node>-<random>-<n>``.

MIG: given the NVML session's MIG layouts (``mig``), each GPU in MIG mode also gets a group of its GPU
instance entities (``DCGM_FE_GPU_I``, mapped by :mod:`smlens.sources.dcgm.mig` from DCGM's hierarchy,
read once per tick) watched for the per-instance fields; the group is made again whenever the
instances or their entity ids change, and values come back in ``Reading.instances``.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from smlens import names as n
from smlens.errors import BackendError, BackendUnavailable, ConfigError, GpuLostError
from smlens.model import Activity, GpuIdentity, InstanceReading, MigInstance, Reading
from smlens.sources.base import Backend
from smlens.sources.dcgm.bindings import DcgmBindings, load_bindings
from smlens.sources.dcgm.mig import GiEntity, MigLayouts, gi_entities, match_instances
from smlens.sources.nvml.calls import Absent

log = logging.getLogger(__name__)

DEFAULT_PORT = 5555
DEFAULT_HOSTENGINE = f"localhost:{DEFAULT_PORT}"
CONNECT_TIMEOUT_MS = 1000  # DCGM's default is 5 s, too long to block a sampling tick
RECONNECT_FIRST_DELAY = 1.0
RECONNECT_MAX_DELAY = 30.0
STALE_AFTER_INTERVALS = 3  # a sample older than this many intervals is not credited again
WATCH_RETRY_SECONDS = 30.0  # a refused watch is tried again this long after
SHARING_CHECK_SECONDS = 60.0  # how often to look at what other DCGM clients watch
MAX_MULTIPLEXED_PASSES = 5  # DCGM multiplexes up to 5 metric groups (NVIDIA/DCGM tests/test_prof.py)
NAME_PREFIX = "smlens-"

# DCGM field ids (the C ABI is stable; the Python constant names changed in DCGM 4.6).
RATIO_FIELDS: Mapping[int, str] = MappingProxyType(
    {
        1002: n.SM_ACTIVE,  # DCGM_FI_PROF_SM_ACTIVE
        1003: n.SM_OCCUPANCY,  # DCGM_FI_PROF_SM_OCCUPANCY
        1004: n.TENSOR_ACTIVE,  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
        1005: n.DRAM_ACTIVE,  # DCGM_FI_PROF_DRAM_ACTIVE
        1006: n.FP64_ACTIVE,  # DCGM_FI_PROF_PIPE_FP64_ACTIVE
        1007: n.FP32_ACTIVE,  # DCGM_FI_PROF_PIPE_FP32_ACTIVE
        1008: n.FP16_ACTIVE,  # DCGM_FI_PROF_PIPE_FP16_ACTIVE
        1014: n.HMMA_ACTIVE,  # DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE
    }
)
BYTE_RATE_FIELDS: Mapping[int, str] = MappingProxyType(
    {
        1009: n.PCIE_TX_BYTES,  # DCGM_FI_PROF_PCIE_TX_BYTES (bytes/s)
        1010: n.PCIE_RX_BYTES,  # DCGM_FI_PROF_PCIE_RX_BYTES
        1011: n.NVLINK_TX_BYTES,  # DCGM_FI_PROF_NVLINK_TX_BYTES
        1012: n.NVLINK_RX_BYTES,  # DCGM_FI_PROF_NVLINK_RX_BYTES
    }
)
WANTED_FIELDS: Mapping[int, str] = MappingProxyType({**RATIO_FIELDS, **BYTE_RATE_FIELDS})
SM_ACTIVE_FIELD = 1002
SM_OCCUPANCY_FIELD = 1003


@dataclass(frozen=True)
class HostengineAddress:
    """Where nv-hostengine listens: ``host:port`` over TCP, or a unix socket path."""

    target: str
    unix_socket: bool = False

    def __str__(self) -> str:
        return f"unix://{self.target}" if self.unix_socket else self.target


def parse_hostengine(text: str | None) -> HostengineAddress:
    """``HOST[:PORT]`` (IPv6 in brackets), ``unix:///path`` or ``/path``; None means localhost:5555."""
    if text is None:
        return HostengineAddress(DEFAULT_HOSTENGINE)
    text = text.strip()
    if text.startswith("unix://") or text.startswith("/"):
        path = text.removeprefix("unix://")
        if not path.startswith("/"):
            raise ConfigError(
                f"DCGM hostengine socket {text!r} must be an absolute path such as unix:///run/dcgm.sock."
            )
        return HostengineAddress(path, unix_socket=True)
    host, colon, port = text.rpartition(":")
    if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
        host, port = text, str(DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"DCGM hostengine {text!r} is not HOST:PORT (e.g. localhost:5555) or a unix socket path."
        )
    return HostengineAddress(f"{host}:{int(port)}")


@dataclass(frozen=True)
class MetricGroup:
    """One of DCGM's profiling metric groups: groups that share ``major`` exclude each other."""

    major: int
    minor: int
    field_ids: frozenset[int]


@dataclass(frozen=True)
class FieldPlan:
    """The wanted fields one GPU can count in one pass, and why the others are unavailable."""

    watched: tuple[int, ...]
    unavailable: Mapping[str, str]


def plan_fields(groups: Sequence[MetricGroup]) -> FieldPlan:
    """Pick one metric group per major id so that DCGM never multiplexes: SM active first, then SM
    occupancy, then as many wanted fields as possible."""
    by_major: dict[int, list[MetricGroup]] = {}
    for group in groups:
        by_major.setdefault(group.major, []).append(group)

    def covered(choice: Sequence[MetricGroup]) -> frozenset[int]:
        return frozenset(itertools.chain.from_iterable(g.field_ids for g in choice)) & WANTED_FIELDS.keys()

    def score(choice: Sequence[MetricGroup]) -> tuple[bool, bool, int]:
        fields = covered(choice)
        return SM_ACTIVE_FIELD in fields, SM_OCCUPANCY_FIELD in fields, len(fields)

    best = max(itertools.product(*by_major.values()), key=score, default=())
    watched = covered(best)
    supported = covered(groups)
    unavailable = {
        key: "metric_group_conflict" if field_id in supported else "not_supported"
        for field_id, key in WANTED_FIELDS.items()
        if field_id not in watched
    }
    return FieldPlan(tuple(sorted(watched)), MappingProxyType(unavailable))


def passes_needed(groups: Sequence[MetricGroup], field_ids: frozenset[int]) -> int:
    """Hardware passes DCGM needs to count ``field_ids``: per major id, the fewest of its groups that
    cover the fields only it offers; fields no group offers are ignored."""
    passes = 0
    by_major: dict[int, list[frozenset[int]]] = {}
    for group in groups:
        by_major.setdefault(group.major, []).append(group.field_ids)
    for options in by_major.values():
        wanted = field_ids & frozenset().union(*options)
        needed = next(
            (
                size
                for size in range(1, len(options) + 1)
                if any(
                    wanted <= frozenset().union(*choice) for choice in itertools.combinations(options, size)
                )
            ),
            0,
        )
        passes = max(passes, needed if wanted else 0)
    return passes


def instance_name(node: str) -> str:
    """``smlens-<node>-<random>``: unique per backend instance, readable in ``dcgmi group -l``."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", node).strip("-")[:60] or "node"
    return f"{NAME_PREFIX}{safe}-{secrets.token_hex(4)}"


@dataclass
class _Cursor:
    """Where the reads of one entity (a GPU or a GPU instance) stand."""

    # Whether a sample already there at the first read may be credited. Not for a GPU instance: DCGM
    # serves an entity id's cached samples whatever GI the id denotes since a reconfiguration
    # (DcgmCacheManager::GetLatestSample, ClearGpuMigInfo).
    earlier_samples: bool = True
    began: float | None = None  # the first read
    last_read: float | None = None
    # field -> (DCGM ts, seen at; None for a sample there at the first read that must not be credited)
    samples: dict[int, tuple[int, float | None]] = field(default_factory=dict)


@dataclass
class _Watch:
    """What smlens watches on one GPU in the current hostengine session."""

    gpu_id: int
    plan: FieldPlan
    groups: tuple[MetricGroup, ...]
    cursor: _Cursor = field(default_factory=_Cursor)
    mode: str = ""  # "one_pass" or "multiplexed" once the sharing check ran


@dataclass
class _InstanceWatch:
    """The group of one GPU's GPU-instance entities and what it watches, or why it watches nothing."""

    entities: tuple[tuple[MigInstance, int], ...]  # (instance, its DCGM entity id) in the group
    field_ids: tuple[int, ...]
    made: list[tuple[str, Any]] = field(default_factory=list)
    refused: set[MigInstance] = field(default_factory=set)  # instances DCGM would not watch
    retry_at: float = 0.0
    cursors: dict[MigInstance, _Cursor] = field(default_factory=dict)


@dataclass
class _Refused:
    """Why a GPU is not watched, and whether trying again may help (then when, once known)."""

    why: str
    retryable: bool = False
    retry_at: float | None = None  # on the sampler's clock; set by the first read after a refusal


@dataclass
class _Session:
    handle: Any
    watches: dict[str, _Watch] = field(default_factory=dict)  # by GPU uuid
    refused: dict[str, _Refused] = field(default_factory=dict)  # by GPU uuid
    made: list[tuple[str, Any]] = field(default_factory=list)  # ("group"|"field_group", id) we created
    sharing_checked_at: float | None = None
    instance_watches: dict[str, _InstanceWatch] = field(default_factory=dict)  # by GPU uuid
    hierarchy: tuple[float, dict[int, dict[int, GiEntity]] | str] | None = None  # (read at, GIs or why not)


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
        structs, value = bindings.structs, bindings.value
        # what a status or a sentinel value means, built once: _absent runs for every value of every tick
        self._status_reasons = {
            structs.DCGM_ST_NO_DATA: "no_data",
            structs.DCGM_ST_NOT_WATCHED: "not_watched",
            structs.DCGM_ST_NOT_SUPPORTED: "not_supported",
            structs.DCGM_ST_NO_PERMISSION: "no_permission",
            structs.DCGM_ST_STALE_DATA: "stale",
            structs.DCGM_ST_GPU_IS_LOST: "gpu_lost",
        }
        self._fp64_sentinels = {
            value.DCGM_FP64_NOT_SUPPORTED: "not_supported",
            value.DCGM_FP64_NOT_PERMISSIONED: "no_permission",
            value.DCGM_FP64_NOT_FOUND: "not_found",
        }
        self._int64_sentinels = {
            value.DCGM_INT64_NOT_SUPPORTED: "not_supported",
            value.DCGM_INT64_NOT_PERMISSIONED: "no_permission",
            value.DCGM_INT64_NOT_FOUND: "not_found",
        }
        self._mig = mig
        self._address = address
        self._interval = interval
        self._instance = instance_name(node)
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._gpus: list[GpuIdentity] = []
        self._paused = False
        self._retry_delay = RECONNECT_FIRST_DELAY
        self._retry_at = 0.0

    @property
    def where(self) -> str:
        return (
            "an embedded DCGM host engine" if self._address is None else f"nv-hostengine at {self._address}"
        )

    @property
    def instance(self) -> str:
        """The prefix of every group and field-group name this backend creates."""
        return self._instance

    @property
    def paused(self) -> bool:
        return self._paused

    # -- connection -------------------------------------------------------------------------

    def _code(self, exc: Exception) -> int:
        return int(getattr(exc, "value", 0))

    def _connection_lost(self, exc: Exception) -> bool:
        """A broken connection or a hostengine that stopped answering (DCGM_ST_TIMEOUT)."""
        structs = self._b.structs
        return self._code(exc) in (int(structs.DCGM_ST_CONNECTION_NOT_VALID), int(structs.DCGM_ST_TIMEOUT))

    def _connect(self) -> Any:
        agent, structs = self._b.agent, self._b.structs
        if self._address is None:
            return agent.dcgmStartEmbedded(structs.DCGM_OPERATION_MODE_AUTO)
        params = structs.c_dcgmConnectV2Params_v2()
        params.persistAfterDisconnect = 0  # the hostengine drops our groups and watches when we go
        params.timeoutMs = CONNECT_TIMEOUT_MS
        params.addressIsUnixSocket = 1 if self._address.unix_socket else 0
        return agent.dcgmConnect_v2(self._address.target, params)

    def _disconnect(self, session: _Session, tidy: bool) -> None:
        agent = self._b.agent
        try:
            if tidy:  # the hostengine would drop them with the connection; a live one is told at once
                self._destroy(session.handle, session.made)
            if self._address is None:
                agent.dcgmStopEmbedded(session.handle)
            else:
                agent.dcgmDisconnect(session.handle)
        except self._b.structs.DCGMError as exc:
            log.debug("closing the DCGM connection failed: %s", exc)

    def _destroy(self, handle: Any, made: Sequence[tuple[str, Any]]) -> None:
        """Destroy groups and field groups this backend made, newest first; nothing else, ever."""
        agent = self._b.agent
        for kind, ident in reversed(made):
            destroy = agent.dcgmFieldGroupDestroy if kind == "field_group" else agent.dcgmGroupDestroy
            try:
                destroy(handle, ident)
            except self._b.structs.DCGMError as exc:
                if self._connection_lost(exc):
                    raise
                log.debug("destroying DCGM %s %s failed: %s", kind, ident, exc)

    def connect(self) -> None:
        """Open the first session; raises :class:`BackendUnavailable` with one sentence if it fails."""
        with self._lock:
            try:
                self._session = _Session(self._connect())
            except self._b.structs.DCGMError as exc:
                hint = (
                    "run smlens as root or use nv-hostengine"
                    if self._address is None
                    else "start it (systemctl start nvidia-dcgm) or pass --dcgm-hostengine / --dcgm-embedded"
                )
                raise BackendUnavailable(
                    f"cannot use {self.where} ({exc}); {hint}.", reason="hostengine_unreachable"
                ) from exc

    def _lose(self, now: float, exc: Exception | None, reconnecting: bool = False) -> BackendError:
        """Drop the session after a connection failure and schedule the next attempt: 1 s after
        losing a working session, then twice as long after each failed reconnect, up to 30 s."""
        if self._session is not None:
            self._disconnect(self._session, tidy=False)
            self._session = None
        self._retry_at = now + self._retry_delay
        if reconnecting:
            self._retry_delay = min(self._retry_delay * 2, RECONNECT_MAX_DELAY)
        return self._unreachable(exc)

    def _unreachable(self, exc: Exception | None) -> BackendError:
        detail = f" ({exc})" if exc is not None else ""
        return BackendError(f"lost {self.where}{detail}; reconnecting.", reason="hostengine_unreachable")

    def _session_for(self, now: float) -> _Session:
        """The live session, reconnecting (with backoff) when the hostengine went away."""
        if self._session is not None:
            return self._session
        if now < self._retry_at:
            raise self._unreachable(None)
        try:
            self._session = _Session(self._connect())
            self._setup(self._session, self._gpus, now)
            if self._paused:
                self._b.agent.dcgmProfPause(self._session.handle)  # a restarted hostengine forgot our pause
        except self._b.structs.DCGMError as exc:
            raise self._lose(now, exc, reconnecting=True) from exc
        self._retry_delay = RECONNECT_FIRST_DELAY
        log.info("reconnected to %s", self.where)
        return self._session

    # -- watches ----------------------------------------------------------------------------

    def _metric_groups(self, handle: Any, gpu_id: int) -> tuple[MetricGroup, ...]:
        reply = self._b.agent.dcgmProfGetSupportedMetricGroups(handle, gpu_id)
        groups = []
        for i in range(int(reply.numMetricGroups)):
            raw = reply.metricGroups[i]
            ids = frozenset(int(raw.fieldIds[j]) for j in range(int(raw.numFieldIds)))
            groups.append(MetricGroup(int(raw.majorId), int(raw.minorId), ids))
        return tuple(groups)

    def _why_no_profiling(self, exc: Exception) -> str:
        structs = self._b.structs
        code = self._code(exc)
        if code in (structs.DCGM_ST_PROFILING_NOT_SUPPORTED, structs.DCGM_ST_NOT_SUPPORTED):
            return "DCGM profiling is not supported on this GPU"
        if code == structs.DCGM_ST_MODULE_NOT_LOADED:
            return "the DCGM profiling module is not loaded in the hostengine"
        if code == structs.DCGM_ST_REQUIRES_ROOT:
            return "DCGM profiling needs the hostengine to run as root"
        return f"DCGM cannot list profiling metrics for this GPU ({exc})"

    def _device_ids(self, handle: Any) -> dict[str, int]:
        agent = self._b.agent
        by_uuid: dict[str, int] = {}
        for gpu_id in agent.dcgmGetAllDevices(handle):
            raw = agent.dcgmGetDeviceAttributes(handle, gpu_id).identifiers.uuid
            # NVIDIA's bindings return char arrays as str (since DCGM 2.2.6); older ones gave bytes.
            uuid = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            by_uuid[uuid.strip().lower()] = int(gpu_id)
        return by_uuid

    def _setup(self, session: _Session, gpus: Sequence[GpuIdentity], now: float | None) -> None:
        """Plan and start the watches of these GPUs; connection errors propagate. ``now`` is None
        outside reads (attach), where the sampler's clock is not known."""
        structs = self._b.structs
        handle = session.handle
        by_uuid = self._device_ids(handle)
        planned: dict[tuple[int, ...], list[tuple[GpuIdentity, int, FieldPlan, tuple[MetricGroup, ...]]]] = {}
        for gpu in gpus:
            session.refused.pop(gpu.uuid, None)
            gpu_id = by_uuid.get(gpu.uuid.strip().lower())
            if gpu_id is None:
                session.refused[gpu.uuid] = _Refused("DCGM does not see this GPU")
                continue
            try:
                groups = self._metric_groups(handle, gpu_id)
            except structs.DCGMError as exc:
                if self._connection_lost(exc):
                    raise
                session.refused[gpu.uuid] = _Refused(self._why_no_profiling(exc))
                continue
            plan = plan_fields(groups)
            if not any(f in RATIO_FIELDS for f in plan.watched):
                session.refused[gpu.uuid] = _Refused("DCGM offers no SM-level profiling field on this GPU")
                continue
            planned.setdefault(plan.watched, []).append((gpu, gpu_id, plan, groups))
        for field_ids, members in planned.items():
            try:
                self._watch(session, field_ids, [gpu_id for _, gpu_id, _, _ in members])
            except structs.DCGMError as exc:
                if self._connection_lost(exc):
                    raise
                for gpu, _, _, _ in members:
                    why = f"DCGM refused to watch profiling fields ({exc})"
                    retry_at = None if now is None else now + WATCH_RETRY_SECONDS
                    session.refused[gpu.uuid] = _Refused(why, retryable=True, retry_at=retry_at)
                    log.warning("GPU %d: %s; trying again in %.0f s", gpu.index, why, WATCH_RETRY_SECONDS)
                continue
            for gpu, gpu_id, plan, groups in members:
                session.watches[gpu.uuid] = _Watch(gpu_id, plan, groups)
        self._check_sharing(session, now)

    def _watch(
        self,
        session: _Session,
        field_ids: Sequence[int],
        gpu_ids: Sequence[int],
        instances: Sequence[int] = (),
    ) -> list[tuple[str, Any]]:
        """Create a group of GPUs or of GPU-instance entities and a field group, and watch them; on
        failure destroy what was made. Returns what was made."""
        agent, structs = self._b.agent, self._b.structs
        handle = session.handle
        name = f"{self._instance}-{next(self._names)}"
        made: list[tuple[str, Any]] = []
        try:
            group = agent.dcgmGroupCreate(handle, structs.DCGM_GROUP_EMPTY, name)
            made.append(("group", group))
            for gpu_id in gpu_ids:
                agent.dcgmGroupAddDevice(handle, group, gpu_id)
            for entity_id in instances:
                agent.dcgmGroupAddEntity(handle, group, self._b.fields.DCGM_FE_GPU_I, entity_id)
            field_group = agent.dcgmFieldGroupCreate(handle, list(field_ids), name)
            made.append(("field_group", field_group))
            agent.dcgmWatchFields(
                handle,
                group,
                field_group,
                round(self._interval * 1_000_000),
                max(30.0, 4 * self._interval),
                0,
            )
        except structs.DCGMError as exc:
            if not self._connection_lost(exc):
                self._destroy(handle, made)
            raise
        session.made.extend(made)
        return made

    def _retry_refused(self, session: _Session, gpu: GpuIdentity, now: float) -> None:
        refused = session.refused.get(gpu.uuid)
        if refused is None or not refused.retryable:
            return
        if refused.retry_at is None:
            refused.retry_at = now + WATCH_RETRY_SECONDS
        elif now >= refused.retry_at:
            self._setup(session, [gpu], now)
            if gpu.uuid in session.watches:
                log.info("DCGM watches GPU %d again", gpu.index)

    def _check_sharing(self, session: _Session, now: float | None) -> None:
        """Tell, per GPU, whether our profiling fields plus those in other clients' field groups need
        more than one hardware pass, in which case DCGM multiplexes them (values become estimates)."""
        last = session.sharing_checked_at
        if now is not None and last is not None and now - last < SHARING_CHECK_SECONDS:
            return
        session.sharing_checked_at = now
        try:
            everything = self._b.agent.dcgmFieldGroupGetAll(session.handle)
        except self._b.structs.DCGMError as exc:
            if self._connection_lost(exc):
                raise
            log.debug("DCGM cannot list field groups: %s", exc)
            return
        others: set[int] = set()
        for i in range(int(everything.numFieldGroups)):
            info = everything.fieldGroups[i]
            name = info.fieldGroupName
            name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            if not name.startswith(self._instance + "-"):
                others.update(int(info.fieldIds[j]) for j in range(int(info.numFieldIds)))
        for uuid, watch in session.watches.items():
            passes = passes_needed(watch.groups, frozenset(watch.plan.watched) | frozenset(others))
            mode = "multiplexed" if passes > 1 else "one_pass"
            if mode != watch.mode and (watch.mode or mode == "multiplexed"):
                log.warning(
                    "DCGM GPU %d (%s): %s; %s",
                    watch.gpu_id,
                    uuid,
                    f"smlens' and other clients' profiling fields need {passes} passes"
                    if mode == "multiplexed"
                    else "profiling fields fit in one pass again",
                    "DCGM multiplexes them and SM-level values become estimates"
                    if mode == "multiplexed"
                    else "values are counted continuously",
                )
            watch.mode = mode

    # -- Backend interface ------------------------------------------------------------------

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        """GPUs DCGM cannot profile are refused; a GPU whose watch failed, or every GPU while the
        hostengine is unreachable, is served and retried on reads."""
        with self._lock:
            self._gpus = list(gpus)
            session = self._session
            if session is None:
                return {gpu.uuid: None for gpu in gpus}
            try:
                self._setup(session, gpus, None)
            except self._b.structs.DCGMError as exc:
                log.warning("%s failed during setup (%s); reconnecting on the next read", self.where, exc)
                self._lose(0.0, exc)
                return {gpu.uuid: None for gpu in gpus}
            verdicts: dict[str, str | None] = {}
            for gpu in gpus:
                watch = session.watches.get(gpu.uuid)
                refused = session.refused.get(gpu.uuid)
                refused_for_good = refused is not None and not refused.retryable
                verdicts[gpu.uuid] = refused.why if refused is not None and refused_for_good else None
                if watch is not None:
                    log.info(
                        "DCGM watches GPU %d as DCGM GPU %d: fields %s%s",
                        gpu.index,
                        watch.gpu_id,
                        ", ".join(map(str, watch.plan.watched)),
                        "".join(f"; {k} {why}" for k, why in sorted(watch.plan.unavailable.items())),
                    )
            return verdicts

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        with self._lock:
            session = self._session_for(now)
            try:
                self._retry_refused(session, gpu, now)
                self._check_sharing(session, now)
                watch = session.watches.get(gpu.uuid)
                if watch is None:
                    refused = session.refused.get(gpu.uuid, _Refused("not watched"))
                    return self._unwatched(refused)
                values = self._b.agent.dcgmEntityGetLatestValues(
                    session.handle, self._b.fields.DCGM_FE_GPU, watch.gpu_id, list(watch.plan.watched)
                )
                reading = self._reading(watch, values, now)
                if self._mig is not None:
                    reading = self._with_instances(session, gpu, watch, reading, now)
            except self._b.structs.DCGMError as exc:
                if self._connection_lost(exc):
                    raise self._lose(now, exc) from exc
                if self._code(exc) == self._b.structs.DCGM_ST_GPU_IS_LOST:
                    raise GpuLostError(f"DCGM reports GPU {gpu.index} lost.") from exc
                raise BackendError(
                    f"DCGM read of GPU {gpu.index} failed ({exc}).", reason="dcgm_error"
                ) from exc
            return reading

    def _unwatched(self, refused: _Refused) -> Reading:
        reason = "watch_failed" if refused.retryable else "not_watched"
        return Reading(source=self.name, missing={key: reason for key in WANTED_FIELDS.values()})

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._disconnect(self._session, tidy=True)
                self._session = None

    # -- values -----------------------------------------------------------------------------

    def _absent(self, value: Any) -> tuple[str | None, float]:
        """(why a DCGM field value is absent, or None; its number). Blanks are DCGM's sentinels."""
        status = int(value.status)
        if status != self._b.structs.DCGM_ST_OK:
            return self._status_reasons.get(status, "dcgm_error"), 0.0
        kind = chr(int(value.fieldType))
        raw: float | int
        if kind == self._b.fields.DCGM_FT_DOUBLE:
            raw = float(value.value.dbl)
            blank = self._b.value.DCGM_FP64_IS_BLANK(raw)
            sentinels = self._fp64_sentinels
        elif kind == self._b.fields.DCGM_FT_INT64:
            raw = int(value.value.i64)
            blank = self._b.value.DCGM_INT64_IS_BLANK(raw)
            sentinels = self._int64_sentinels
        else:
            return "unexpected_type", 0.0
        if blank:
            return sentinels.get(raw, "blank"), 0.0
        return None, float(raw)

    def _reading(self, watch: _Watch, values: Any, now: float) -> Reading:
        activity, increments, missing, span = self._credit(watch.cursor, values, now)
        return Reading(
            source=self.name,
            activity=activity,
            increments=increments,
            missing={**watch.plan.unavailable, **missing},
            # Like gpm, the first read of a session only starts the interval yet counts as profiling.
            profiling=not self._paused and (bool(activity) or span <= 0),
            profiling_mode=watch.mode,
        )

    def _credit(
        self, cursor: _Cursor, values: Any, now: float
    ) -> tuple[dict[str, Activity], dict[str, float], dict[str, str], float]:
        """Activity, byte increments and missing values of one entity's latest values, credited to
        the time since its previous read; and that time (0 at the first read)."""
        baseline = cursor.began is None and not cursor.earlier_samples
        began = cursor.began = now if cursor.began is None else cursor.began
        span = 0.0 if cursor.last_read is None else now - cursor.last_read
        cursor.last_read = now
        too_old = STALE_AFTER_INTERVALS * self._interval
        activity: dict[str, Activity] = {}
        increments: dict[str, float] = {}
        missing: dict[str, str] = {}
        for value in values:
            field_id = int(value.fieldId)
            key = WANTED_FIELDS[field_id]
            reason, number = self._absent(value)
            if int(value.status) == self._b.structs.DCGM_ST_OK:
                ts = int(value.ts)
                seen = cursor.samples.get(field_id)
                if seen is None or seen[0] != ts:
                    cursor.samples[field_id] = (ts, None if baseline else now)
                elif reason is None:
                    seen_at = began if seen[1] is None else seen[1]
                    if now - seen_at > too_old:
                        reason = "stale"
                    elif seen[1] is None:  # not a sample of this cursor's yet
                        reason = "warming_up"
            if self._paused:
                reason = "profiling_paused"
            elif reason is None and span <= 0:
                reason = "warming_up"
            if reason is not None:
                missing[key] = reason
            elif field_id in RATIO_FIELDS:
                activity[key] = Activity.of(number, span)
            else:
                increments[key] = max(number, 0.0) * span
        return activity, increments, missing, span

    # -- MIG GPU instances --------------------------------------------------------------------

    def _with_instances(
        self, session: _Session, gpu: GpuIdentity, watch: _Watch, reading: Reading, now: float
    ) -> Reading:
        """The GPU's reading plus one per GPU instance of its NVML layout; connection errors propagate."""
        assert self._mig is not None
        layout = self._mig.mig_layout(gpu, now)
        if isinstance(layout, Absent):  # nobody knows the layout this tick: the fold keeps the instances
            return reading
        instances = () if layout is None else tuple(entry.instance for entry in layout)
        if not instances:
            self._drop_instance_watch(session, gpu.uuid)
            return reading._replace(mig_layout_read=True)
        entities = self._hierarchy(session, now)
        if isinstance(entities, str):
            parts = tuple(InstanceReading(i, missing={n.SM_ACTIVE: entities}) for i in instances)
            return reading._replace(instances=parts, mig_layout_read=True)
        matched = match_instances(instances, entities.get(watch.gpu_id, {}))
        if any(why == "mig_layout_changing" for why in matched.values()):
            self._mig.rescan_mig(gpu)
        instance_watch = self._instance_watch(session, gpu, watch, matched, now)
        parts = tuple(self._read_instance(session, instance_watch, i, matched[i], now) for i in instances)
        return reading._replace(instances=parts, mig_layout_read=True)

    def _hierarchy(self, session: _Session, now: float) -> dict[int, dict[int, GiEntity]] | str:
        """DCGM's GPU instances, read at most once per tick (entity ids can change at any time). The
        sampler reads each GPU at its own ``now``, all within a tick: a read of less than half an
        interval ago is this tick's."""
        cached = session.hierarchy
        if cached is not None and 0 <= now - cached[0] < self._interval / 2:
            return cached[1]
        found: dict[int, dict[int, GiEntity]] | str
        try:
            found = gi_entities(self._b.agent.dcgmGetGpuInstanceHierarchy(session.handle), self._b.fields)
        except self._b.structs.DCGMError as exc:
            if self._connection_lost(exc):
                raise
            log.debug("DCGM cannot list its GPU instances: %s", exc)
            found = "dcgm_hierarchy_unreadable"
        session.hierarchy = (now, found)
        return found

    def _instance_watch(
        self,
        session: _Session,
        gpu: GpuIdentity,
        watch: _Watch,
        matched: Mapping[MigInstance, GiEntity | str],
        now: float,
    ) -> _InstanceWatch:
        """The watch of this GPU's GI entities, made again when they changed or a refusal is due a retry."""
        entities = tuple((i, e.entity_id) for i, e in matched.items() if isinstance(e, GiEntity))
        current = session.instance_watches.get(gpu.uuid)
        if (
            current is not None
            and current.entities == entities
            and not (current.refused and now >= current.retry_at)
        ):
            return current
        before = {} if current is None else dict(current.entities)
        if self._mig is not None and any(before.get(i, e) != e for i, e in entities):
            self._mig.rescan_mig(gpu)  # DCGM moved an instance to another entity: NVML's may be stale too
        self._drop_instance_watch(session, gpu.uuid)
        field_ids = tuple(f for f in watch.plan.watched if WANTED_FIELDS[f] in n.INSTANCE_ACTIVITIES)
        fresh = _InstanceWatch(entities, field_ids)
        after = dict(entities)
        if current is not None:  # an instance read through the same entity loses no interval
            fresh.cursors = {i: c for i, c in current.cursors.items() if after.get(i) == before[i]}
        session.instance_watches[gpu.uuid] = fresh
        if entities and field_ids:
            # One group for all; if DCGM refuses it, one group per instance, so that only the instances
            # DCGM refuses go without values (at most 7 groups of DCGM's 64, and only then).
            if not self._try_watch(session, gpu, fresh, current, entities) and len(entities) > 1:
                for entity in entities:
                    self._try_watch(session, gpu, fresh, current, (entity,))
            fresh.retry_at = now + WATCH_RETRY_SECONDS
        for instance in () if current is None else current.refused - fresh.refused:
            if instance in after:
                log.info("GPU %d: DCGM watches GPU instance %d again", gpu.index, instance.gpu_instance)
        return fresh

    def _try_watch(
        self,
        session: _Session,
        gpu: GpuIdentity,
        fresh: _InstanceWatch,
        current: _InstanceWatch | None,
        batch: tuple[tuple[MigInstance, int], ...],
    ) -> bool:
        """Watch ``batch``'s entities in one group; a refusal of a single instance is recorded and logged."""
        try:
            fresh.made += self._watch(session, fresh.field_ids, (), [entity for _, entity in batch])
        except self._b.structs.DCGMError as exc:
            if self._connection_lost(exc):
                raise
            if len(batch) == 1:
                instance = batch[0][0]
                fresh.refused.add(instance)
                again = current is not None and instance in current.refused
                log.log(
                    logging.DEBUG if again else logging.WARNING,
                    "GPU %d: DCGM refused to watch GPU instance %d (%s); trying again every %.0f s",
                    gpu.index,
                    instance.gpu_instance,
                    exc,
                    WATCH_RETRY_SECONDS,
                )
            return False
        return True

    def _drop_instance_watch(self, session: _Session, uuid: str) -> None:
        old = session.instance_watches.pop(uuid, None)
        if old is not None and old.made:
            self._destroy(session.handle, old.made)
            session.made = [m for m in session.made if m not in old.made]

    def _read_instance(
        self,
        session: _Session,
        instance_watch: _InstanceWatch,
        instance: MigInstance,
        entity: GiEntity | str,
        now: float,
    ) -> InstanceReading:
        """One GPU instance's values; a value DCGM does not give stays absent, with the reason."""
        if isinstance(entity, str):
            return InstanceReading(instance, missing={n.SM_ACTIVE: entity})
        if not instance_watch.field_ids:
            return InstanceReading(instance, missing={n.SM_ACTIVE: "not_supported"})
        if instance in instance_watch.refused:
            return InstanceReading(instance, missing={n.SM_ACTIVE: "watch_failed"})
        try:
            values = self._b.agent.dcgmEntityGetLatestValues(
                session.handle, self._b.fields.DCGM_FE_GPU_I, entity.entity_id, list(instance_watch.field_ids)
            )
        except self._b.structs.DCGMError as exc:
            if self._connection_lost(exc):
                raise
            return InstanceReading(instance, missing={n.SM_ACTIVE: "dcgm_error"})
        cursor = instance_watch.cursors.setdefault(instance, _Cursor(earlier_samples=False))
        activity, _, missing, _ = self._credit(cursor, values, now)
        return InstanceReading(instance, activity=activity, missing=missing)

    # -- profiling pause --------------------------------------------------------------------

    def _control(self, pause: bool) -> None:
        verb = "pause" if pause else "resume"
        with self._lock:
            session = self._session
            if session is None:
                raise self._unreachable(None)
            call = self._b.agent.dcgmProfPause if pause else self._b.agent.dcgmProfResume
            try:
                call(session.handle)
            except self._b.structs.DCGMError as exc:
                code = self._code(exc)
                if self._connection_lost(exc):
                    raise self._lose(0.0, exc) from exc
                if code == self._b.structs.DCGM_ST_NOT_SUPPORTED:
                    raise BackendError(
                        f"DCGM cannot {verb} profiling on this node ({exc}).", reason="not_supported"
                    ) from exc
                raise BackendError(f"DCGM failed to {verb} profiling ({exc}).", reason="dcgm_error") from exc
            self._paused = pause
            log.warning("DCGM profiling %s on %s", "paused" if pause else "resumed", self.where)

    def pause_profiling(self) -> None:
        """Release the GPUs' performance counters (for Nsight Compute and friends) hostengine-wide."""
        self._control(pause=True)

    def resume_profiling(self) -> None:
        self._control(pause=False)


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
