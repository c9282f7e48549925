"""Watching smlens' profiling fields on each GPU of one DCGM session: planning them per GPU, retrying
a watch DCGM refused, and the sharing check.

A watch DCGM refuses is retried every :data:`WATCH_RETRY_SECONDS`; every
:data:`SHARING_CHECK_SECONDS` smlens looks at the other clients' field groups to tell whether DCGM
multiplexes the profiling counters.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from smlens.model import GpuIdentity
from smlens.sources.dcgm.decode import SampleCursor
from smlens.sources.dcgm.fields import (
    RATIO_FIELDS,
    FieldPlan,
    MetricGroup,
    metric_groups_of,
    passes_needed,
    plan_fields,
)
from smlens.sources.dcgm.session import DcgmSession, connection_lost, error_code

log = logging.getLogger(__name__)

WATCH_RETRY_SECONDS = 30.0  # a refused watch is tried again this long after
SHARING_CHECK_SECONDS = 60.0  # how often to look at what other DCGM clients watch


@dataclass
class GpuWatch:
    """What smlens watches on one GPU in the current session."""

    gpu_id: int  # DCGM's
    plan: FieldPlan
    groups: tuple[MetricGroup, ...]
    cursor: SampleCursor = field(default_factory=SampleCursor)
    mode: str = ""  # "one_pass" or "multiplexed" once the sharing check ran


@dataclass
class WatchRefusal:
    """Why a GPU is not watched, and whether trying again may help (then when, once known)."""

    why: str
    retryable: bool = False
    retry_at: float | None = None  # on the sampler's clock; set by the first read after a refusal


def _text(raw: object) -> str:
    """A char array of NVIDIA's bindings: str since DCGM 2.2.6, bytes before."""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


class GpuWatches:
    """What smlens watches on each GPU of one session, and why it watches nothing on the others."""

    def __init__(self, session: DcgmSession) -> None:
        self._session = session
        self.watches: dict[str, GpuWatch] = {}  # by GPU uuid
        self.refused: dict[str, WatchRefusal] = {}  # by GPU uuid
        self._sharing_checked_at: float | None = None

    def setup(self, gpus: Sequence[GpuIdentity], now: float | None) -> None:
        """Plan and start the watches of these GPUs; connection errors propagate. ``now`` is None
        outside reads (attach), where the sampler's clock is not known."""
        bindings = self._session.bindings
        by_uuid = self._device_ids()
        planned: dict[tuple[int, ...], list[tuple[GpuIdentity, GpuWatch]]] = {}
        for gpu in gpus:
            watch = self._plan(gpu, by_uuid)
            if watch is not None:
                planned.setdefault(watch.plan.watched, []).append((gpu, watch))
        for field_ids, members in planned.items():
            try:
                self._session.watch(field_ids, [watch.gpu_id for _, watch in members])
            except bindings.structs.DCGMError as exc:
                if connection_lost(bindings, exc):
                    raise
                for gpu, _ in members:
                    why = f"DCGM refused to watch profiling fields ({exc})"
                    retry_at = None if now is None else now + WATCH_RETRY_SECONDS
                    self.refused[gpu.uuid] = WatchRefusal(why, retryable=True, retry_at=retry_at)
                    log.warning("GPU %d: %s; trying again in %.0f s", gpu.index, why, WATCH_RETRY_SECONDS)
                continue
            for gpu, watch in members:
                self.watches[gpu.uuid] = watch
        self.check_sharing(now)

    def _device_ids(self) -> dict[str, int]:
        """DCGM's GPU id of each GPU it sees, by lower-case uuid."""
        agent, handle = self._session.bindings.agent, self._session.handle
        return {
            _text(agent.dcgmGetDeviceAttributes(handle, gpu_id).identifiers.uuid).strip().lower(): int(gpu_id)
            for gpu_id in agent.dcgmGetAllDevices(handle)
        }

    def _plan(self, gpu: GpuIdentity, by_uuid: dict[str, int]) -> GpuWatch | None:
        """What to watch on this GPU, or None with the refusal recorded; connection errors propagate."""
        bindings = self._session.bindings
        self.refused.pop(gpu.uuid, None)
        gpu_id = by_uuid.get(gpu.uuid.strip().lower())
        if gpu_id is None:
            self.refused[gpu.uuid] = WatchRefusal("DCGM does not see this GPU")
            return None
        try:
            reply = bindings.agent.dcgmProfGetSupportedMetricGroups(self._session.handle, gpu_id)
        except bindings.structs.DCGMError as exc:
            if connection_lost(bindings, exc):
                raise
            self.refused[gpu.uuid] = WatchRefusal(self._why_no_profiling(exc))
            return None
        groups = metric_groups_of(reply)
        plan = plan_fields(groups)
        if not any(f in RATIO_FIELDS for f in plan.watched):
            self.refused[gpu.uuid] = WatchRefusal("DCGM offers no SM-level profiling field on this GPU")
            return None
        return GpuWatch(gpu_id, plan, groups)

    def _why_no_profiling(self, exc: Exception) -> str:
        structs = self._session.bindings.structs
        code = error_code(exc)
        if code in (structs.DCGM_ST_PROFILING_NOT_SUPPORTED, structs.DCGM_ST_NOT_SUPPORTED):
            return "DCGM profiling is not supported on this GPU"
        if code == structs.DCGM_ST_MODULE_NOT_LOADED:
            return "the DCGM profiling module is not loaded in the hostengine"
        if code == structs.DCGM_ST_REQUIRES_ROOT:
            return "DCGM profiling needs the hostengine to run as root"
        return f"DCGM cannot list profiling metrics for this GPU ({exc})"

    def retry_refused(self, gpu: GpuIdentity, now: float) -> None:
        """Set up a GPU whose watch DCGM refused again once its retry is due."""
        refused = self.refused.get(gpu.uuid)
        if refused is None or not refused.retryable:
            return
        if refused.retry_at is None:
            refused.retry_at = now + WATCH_RETRY_SECONDS
        elif now >= refused.retry_at:
            self.setup([gpu], now)
            if gpu.uuid in self.watches:
                log.info("DCGM watches GPU %d again", gpu.index)

    def unwatched_reason(self, uuid: str) -> str:
        """Why a GPU without a watch has no values: a refusal that may pass, or none to expect."""
        refused = self.refused.get(uuid, WatchRefusal("not watched"))
        return "watch_failed" if refused.retryable else "not_watched"

    def verdicts(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        """Per GPU, why it is refused for good, or None when served (now or after a retry); logs what
        is watched."""
        verdicts: dict[str, str | None] = {}
        for gpu in gpus:
            watch = self.watches.get(gpu.uuid)
            refused = self.refused.get(gpu.uuid)
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

    def check_sharing(self, now: float | None) -> None:
        """Tell, per GPU, whether our profiling fields plus those in other clients' field groups need
        more than one hardware pass, in which case DCGM multiplexes them (values become estimates)."""
        last = self._sharing_checked_at
        if now is not None and last is not None and now - last < SHARING_CHECK_SECONDS:
            return
        self._sharing_checked_at = now
        bindings = self._session.bindings
        try:
            everything = bindings.agent.dcgmFieldGroupGetAll(self._session.handle)
        except bindings.structs.DCGMError as exc:
            if connection_lost(bindings, exc):
                raise
            log.debug("DCGM cannot list field groups: %s", exc)
            return
        others: set[int] = set()
        for i in range(int(everything.numFieldGroups)):
            info = everything.fieldGroups[i]
            if not self._session.names.ours(_text(info.fieldGroupName)):
                others.update(int(info.fieldIds[j]) for j in range(int(info.numFieldIds)))
        for uuid, watch in self.watches.items():
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
