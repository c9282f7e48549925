"""The pure fold of one tick's MIG GPU instance readings of one GPU into cumulative totals and states.

An instance is known by its :class:`~smlens.model.MigInstance` (GPU instance id, profile, MIG device
UUIDs). One that a tick's MIG layout no longer has is gone, with its totals, so its series leave /metrics at
once; an instance created again is a new one whose counters start from zero. In a tick where no backend
knew the layout (``Reading.mig_layout_read``), the instances keep their totals and series. Activity
comes only from the GPU's profiling source (``admits``), as for the whole GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from smlens.model import ZERO_ACTIVITY, Activity, InstanceState, MigInstance, Reading

InstanceTotals = Mapping[MigInstance, Mapping[str, Activity]]


def fold_instances(
    totals: InstanceTotals, readings: Sequence[Reading], admits: Callable[[Reading], bool]
) -> tuple[InstanceTotals, tuple[InstanceState, ...]]:
    """New totals and the states of the instances this tick's ``readings`` name, by GPU instance id."""
    if not totals and not any(reading.instances for reading in readings):
        return totals, ()  # a GPU without MIG, the common case: nothing to build
    gauges: dict[MigInstance, dict[str, float]] = {}
    missing: dict[MigInstance, dict[str, str]] = {}
    activity: dict[MigInstance, dict[str, Activity]] = {}
    if not any(reading.mig_layout_read for reading in readings):
        for instance in totals:
            gauges[instance], missing[instance] = {}, {"mig_layout": "not_read"}
            activity[instance] = dict(totals[instance])
    for reading in readings:
        profiling = admits(reading)
        for part in reading.instances:
            instance = part.instance
            gauges.setdefault(instance, {}).update(part.gauges)
            missing.setdefault(instance, {}).update(part.missing)
            summed = activity.setdefault(instance, dict(totals.get(instance, {})))
            if not profiling:
                continue
            for key, amount in part.activity.items():
                summed[key] = summed.get(key, ZERO_ACTIVITY) + amount
                ratio = amount.ratio
                if ratio is not None:
                    gauges[instance][key] = ratio
    states = tuple(
        InstanceState(
            instance=instance,
            gauges=MappingProxyType(gauges[instance]),
            activity_totals=MappingProxyType(activity[instance]),
            missing=MappingProxyType(missing[instance]),
        )
        for instance in sorted(gauges, key=lambda i: (i.gpu_instance, i.mig_uuids))
    )
    return MappingProxyType(activity), states
