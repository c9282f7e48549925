"""Watching and reading the GPU instances of GPUs in MIG mode through DCGM, for one session.

Given the NVML session's MIG layouts, each GPU in MIG mode gets a group of its GPU instance entities
(``DCGM_FE_GPU_I``, mapped by :mod:`smlens.sources.dcgm.mig` from DCGM's hierarchy, read once per
tick) watched for the per-instance fields; the group is made again whenever the instances or their
entity ids change, and values come back in ``Reading.instances``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from smlens import names as n
from smlens.model import GpuIdentity, InstanceReading, MigInstance, Reading
from smlens.sources.dcgm.decode import SampleCursor, ValueDecoder
from smlens.sources.dcgm.fields import WANTED_FIELDS
from smlens.sources.dcgm.mig import GiEntity, MigLayouts, gi_entities, match_instances
from smlens.sources.dcgm.session import DcgmSession, Made, connection_lost
from smlens.sources.dcgm.watches import WATCH_RETRY_SECONDS
from smlens.sources.nvml.calls import Absent

log = logging.getLogger(__name__)

Entities = tuple[tuple[MigInstance, int], ...]  # (instance, its DCGM entity id)
Hierarchy = dict[int, dict[int, GiEntity]]  # DCGM GPU id -> NVML GI id -> its entity


@dataclass
class InstanceWatch:
    """The group of one GPU's GPU-instance entities and what it watches, or why it watches nothing."""

    entities: Entities  # in the group
    field_ids: tuple[int, ...]
    made: list[Made] = field(default_factory=list)
    refused: set[MigInstance] = field(default_factory=set)  # instances DCGM would not watch
    retry_at: float = 0.0
    cursors: dict[MigInstance, SampleCursor] = field(default_factory=dict)


class InstanceWatches:
    """The GPU-instance watches of one session, by GPU uuid, and DCGM's hierarchy of this tick."""

    def __init__(self, session: DcgmSession, decoder: ValueDecoder, mig: MigLayouts) -> None:
        self._session = session
        self._decoder = decoder
        self._mig = mig
        self._watches: dict[str, InstanceWatch] = {}
        self._hierarchy: tuple[float, Hierarchy | str] | None = None  # (read at, GIs or why not)

    def add_to(
        self,
        gpu: GpuIdentity,
        gpu_id: int,
        watched: Sequence[int],
        reading: Reading,
        now: float,
        paused: bool,
    ) -> Reading:
        """The GPU's reading plus one per GPU instance of its NVML layout; ``gpu_id`` is DCGM's and
        ``watched`` the fields watched on the GPU. Connection errors propagate."""
        layout = self._mig.mig_layout(gpu, now)
        if isinstance(layout, Absent):  # nobody knows the layout this tick: the fold keeps the instances
            return reading
        instances = () if layout is None else tuple(entry.instance for entry in layout)
        if not instances:
            self._drop(gpu.uuid)
            return reading._replace(mig_layout_read=True)
        entities = self._entities(now)
        if isinstance(entities, str):
            parts = tuple(InstanceReading(i, missing={n.SM_ACTIVE: entities}) for i in instances)
            return reading._replace(instances=parts, mig_layout_read=True)
        matched = match_instances(instances, entities.get(gpu_id, {}))
        if any(why == "mig_layout_changing" for why in matched.values()):
            self._mig.rescan_mig(gpu)
        instance_watch = self._watch(gpu, watched, matched, now)
        parts = tuple(self._read(instance_watch, i, matched[i], now, paused) for i in instances)
        return reading._replace(instances=parts, mig_layout_read=True)

    def _entities(self, now: float) -> Hierarchy | str:
        """DCGM's GPU instances, read at most once per tick (entity ids can change at any time). The
        sampler reads each GPU at its own ``now``, all within a tick: a read of less than half an
        interval ago is this tick's."""
        cached = self._hierarchy
        if cached is not None and 0 <= now - cached[0] < self._session.interval / 2:
            return cached[1]
        bindings = self._session.bindings
        found: Hierarchy | str
        try:
            found = gi_entities(
                bindings.agent.dcgmGetGpuInstanceHierarchy(self._session.handle), bindings.fields
            )
        except bindings.structs.DCGMError as exc:
            if connection_lost(bindings, exc):
                raise
            log.debug("DCGM cannot list its GPU instances: %s", exc)
            found = "dcgm_hierarchy_unreadable"
        self._hierarchy = (now, found)
        return found

    def _watch(
        self,
        gpu: GpuIdentity,
        watched: Sequence[int],
        matched: Mapping[MigInstance, GiEntity | str],
        now: float,
    ) -> InstanceWatch:
        """The watch of this GPU's GI entities, made again when they changed or a refusal is due a retry."""
        entities = tuple((i, e.entity_id) for i, e in matched.items() if isinstance(e, GiEntity))
        current = self._watches.get(gpu.uuid)
        if (
            current is not None
            and current.entities == entities
            and not (current.refused and now >= current.retry_at)
        ):
            return current
        before = {} if current is None else dict(current.entities)
        if any(before.get(i, e) != e for i, e in entities):
            self._mig.rescan_mig(gpu)  # DCGM moved an instance to another entity: NVML's may be stale too
        self._drop(gpu.uuid)
        field_ids = tuple(f for f in watched if WANTED_FIELDS[f] in n.INSTANCE_ACTIVITIES)
        fresh = InstanceWatch(entities, field_ids)
        after = dict(entities)
        if current is not None:  # an instance read through the same entity loses no interval
            fresh.cursors = {i: c for i, c in current.cursors.items() if after.get(i) == before[i]}
        self._watches[gpu.uuid] = fresh
        if entities and field_ids:
            # One group for all; if DCGM refuses it, one group per instance, so that only the instances
            # DCGM refuses go without values (DCGM allows each client few groups, so only then).
            if not self._try(gpu, fresh, current, entities) and len(entities) > 1:
                for entity in entities:
                    self._try(gpu, fresh, current, (entity,))
            fresh.retry_at = now + WATCH_RETRY_SECONDS
        for instance in () if current is None else current.refused - fresh.refused:
            if instance in after:
                log.info("GPU %d: DCGM watches GPU instance %d again", gpu.index, instance.gpu_instance)
        return fresh

    def _try(
        self, gpu: GpuIdentity, fresh: InstanceWatch, current: InstanceWatch | None, batch: Entities
    ) -> bool:
        """Watch ``batch``'s entities in one group; a refusal of a single instance is recorded and logged."""
        bindings = self._session.bindings
        try:
            fresh.made += self._session.watch(fresh.field_ids, instances=[entity for _, entity in batch])
        except bindings.structs.DCGMError as exc:
            if connection_lost(bindings, exc):
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

    def _drop(self, uuid: str) -> None:
        old = self._watches.pop(uuid, None)
        if old is not None and old.made:
            self._session.forget(old.made)

    def _read(
        self,
        instance_watch: InstanceWatch,
        instance: MigInstance,
        entity: GiEntity | str,
        now: float,
        paused: bool,
    ) -> InstanceReading:
        """One GPU instance's values; a value DCGM does not give stays absent, with the reason."""
        if isinstance(entity, str):
            return InstanceReading(instance, missing={n.SM_ACTIVE: entity})
        if not instance_watch.field_ids:
            return InstanceReading(instance, missing={n.SM_ACTIVE: "not_supported"})
        if instance in instance_watch.refused:
            return InstanceReading(instance, missing={n.SM_ACTIVE: "watch_failed"})
        bindings = self._session.bindings
        try:
            values = self._session.latest_values(
                bindings.fields.DCGM_FE_GPU_I, entity.entity_id, instance_watch.field_ids
            )
        except bindings.structs.DCGMError as exc:
            if connection_lost(bindings, exc):
                raise
            return InstanceReading(instance, missing={n.SM_ACTIVE: "dcgm_error"})
        cursor = instance_watch.cursors.setdefault(instance, SampleCursor(earlier_samples=False))
        credit = self._decoder.credit(cursor, values, now, paused)
        return InstanceReading(instance, activity=credit.activity, missing=credit.missing)
