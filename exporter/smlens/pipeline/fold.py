"""The pure fold of one tick's readings of one GPU into its cumulative totals and its published state.

No I/O, no clock, no mutation: the same inputs always give the same outputs, so the integration rules
(exact counters, absent rather than zero, one profiling source) can be tested on their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from smlens.model import EMPTY, ZERO_ACTIVITY, Activity, GpuIdentity, GpuState, Reading
from smlens.names import COMPUTE_SOL, COMPUTE_SOL_PIPES, xid_label
from smlens.pipeline.instance_fold import InstanceTotals, fold_instances
from smlens.pipeline.profiling_policy import ProfilingChoice


class GpuTotals(NamedTuple):
    """What one GPU accumulates across ticks, in read-only mappings."""

    activity: Mapping[str, Activity] = EMPTY
    ratios: Mapping[str, tuple[str, float]] = EMPTY  # key -> (source, last ratio)
    increments: Mapping[str, float] = EMPTY
    xids: Mapping[str, int] = EMPTY  # by xid_label
    instances: InstanceTotals = EMPTY  # per MIG GPU instance


def compute_sol(parts: Mapping[str, Activity]) -> Activity | None:
    """One reading's compute speed of light: the activity of its busiest compute pipe (COMPUTE_SOL_PIPES),
    among those it has; None when it has none of them."""
    covered = [parts[key] for key in COMPUTE_SOL_PIPES if key in parts and parts[key].covered_seconds > 0]
    return max(covered, key=lambda part: part.active_seconds / part.covered_seconds, default=None)


def fold(
    identity: GpuIdentity,
    totals: GpuTotals,
    readings: Sequence[Reading],
    missing: Mapping[str, str],
    up: bool,
    choice: ProfilingChoice,
) -> tuple[GpuTotals, GpuState]:
    """Fold this tick's ``readings`` (and the backends' failures in ``missing``) into new totals and state."""
    activity = dict(totals.activity)
    increments = dict(totals.increments)
    xids = totals.xids  # copied only in a tick with XID events: nearly every tick has none
    all_missing = dict(missing)
    gauges: dict[str, float] = {}
    device_totals: dict[str, float] = {}
    clock_events: dict[str, bool] = {}
    ratios: dict[str, tuple[str, float]] = {}
    by_source: dict[str, Reading] = {}
    for reading in readings:
        by_source[reading.source] = reading
        gauges.update(reading.gauges)
        device_totals.update(reading.totals)
        clock_events.update(reading.clock_events)
        all_missing.update(reading.missing)
        if reading.xid_events:
            xids = dict(xids)
            for xid, count in reading.xid_events.items():
                label = xid_label(xid)
                xids[label] = xids.get(label, 0) + count
        for key, amount in reading.increments.items():
            increments[key] = increments.get(key, 0.0) + amount
        if choice.admits(reading):
            for key, part in reading.activity.items():
                activity[key] = activity.get(key, ZERO_ACTIVITY) + part
                ratio = part.ratio
                if ratio is not None:
                    ratios[key] = (reading.source, ratio)
            sol = compute_sol(reading.activity)
            if sol is not None:
                activity[COMPUTE_SOL] = activity.get(COMPUTE_SOL, ZERO_ACTIVITY) + sol
    # A key read without new coverage keeps its last value, if its source read this GPU this tick.
    if not ratios.keys() >= totals.ratios.keys():  # most ticks cover every key again
        for key, (source, ratio) in totals.ratios.items():
            kept = by_source.get(source)
            if key not in ratios and kept is not None and key not in kept.missing:
                ratios[key] = (source, ratio)
    for key, (_, ratio) in ratios.items():
        gauges[key] = ratio
    # The SOL of the pipe ratios shown, so that it is never older or newer than they are.
    shown_sol = max((gauges[key] for key in COMPUTE_SOL_PIPES if key in gauges), default=None)
    if shown_sol is not None:
        gauges[COMPUTE_SOL] = shown_sol
    device_totals.update(increments)
    instance_totals, instances = fold_instances(totals.instances, readings, choice.admits)
    delivered = choice.delivered(readings)
    # Shared by totals and state, so read-only; a previous fold's mapping is reused as it is.
    xid_totals = xids if type(xids) is MappingProxyType else MappingProxyType(dict(xids))
    chosen = by_source.get(choice.source or "")
    activity_totals = MappingProxyType(activity)  # shared by totals and state, as xid_totals
    state = GpuState(
        identity=identity,
        up=up,
        gauges=MappingProxyType(gauges),
        activity_totals=activity_totals,
        totals=MappingProxyType(device_totals),
        clock_events=MappingProxyType(clock_events),
        xid_totals=xid_totals,
        missing=MappingProxyType(all_missing),
        profiling_source=choice.source,
        profiling_available=delivered,
        profiling_reason=choice.unavailable_reason(delivered, all_missing),
        sources=tuple(by_source),
        profiling_mode="" if chosen is None else chosen.profiling_mode,
        instances=instances,
    )
    frozen = GpuTotals(
        activity_totals,
        MappingProxyType(ratios),
        MappingProxyType(increments),
        xid_totals,
        instance_totals,
    )
    return frozen, state
