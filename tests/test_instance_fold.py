"""The fold of MIG GPU instance readings: totals survive a tick without a layout, leave with the instance."""

from __future__ import annotations

import pytest

from smlens import names as n
from smlens.model import Activity, InstanceReading, MigInstance, Reading
from smlens.pipeline.instance_fold import InstanceTotals, fold_instances

BUSY = MigInstance(7, "1g.18gb", ("MIG-busy",), 16)


def gpm(*instances: MigInstance, layout_read: bool = True) -> Reading:
    parts = tuple(InstanceReading(i, activity={n.SM_ACTIVE: Activity.of(0.5, 1.0)}) for i in instances)
    return Reading("gpm", profiling=True, instances=parts, mig_layout_read=layout_read)


def fold(totals: InstanceTotals, *readings: Reading) -> InstanceTotals:
    return fold_instances(totals, readings, lambda r: r.source == "gpm")[0]


@pytest.mark.parametrize(
    "unread",
    [(), (gpm(layout_read=False),), (Reading("nvml"),)],
    ids=["no reading", "layout unread", "other"],
)
def test_a_tick_without_the_layout_keeps_the_totals_and_the_series(unread: tuple[Reading, ...]) -> None:
    totals = fold(fold({}, gpm(BUSY)), gpm(BUSY))
    kept, states = fold_instances(totals, unread, lambda r: r.source == "gpm")
    assert [s.instance for s in states] == [BUSY]
    assert states[0].activity_totals[n.SM_ACTIVE].covered_seconds == 2.0
    assert fold(kept, gpm(BUSY))[BUSY][n.SM_ACTIVE].covered_seconds == 3.0  # no counter reset


def test_an_instance_the_layout_no_longer_has_leaves_with_its_totals() -> None:
    totals = fold(fold({}, gpm(BUSY)), gpm())
    assert totals == {}
    assert fold(totals, gpm(BUSY))[BUSY][n.SM_ACTIVE].covered_seconds == 1.0
