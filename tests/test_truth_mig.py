"""The MIG truth harness' judging (bench/truth/mig.py) on scrapes written by hand: it runs only on a
GPU host in MIG mode, so this is what can be checked here."""

from __future__ import annotations

from bench.truth.metrics import parse
from bench.truth.mig import instance_mean, judge, series_outcomes

from smlens.model import MigInstance

GPU = "GPU-11111111-1111-2222-3333-444444444444"
SMALL = MigInstance(7, "1g.18gb", ("MIG-a",), 16)
OTHER = MigInstance(9, "1g.18gb", ("MIG-b",), 16)


def scrape(at: float, series: dict[int, tuple[float, float]], utilization: bool = False) -> str:
    lines = []
    for gi, (active, covered) in series.items():
        labels = (
            f'gpu="0",uuid="{GPU}",hostname="h",gpu_instance="{gi}",mig_profile="1g.18gb",mig_uuid="MIG-{gi}"'
        )
        lines += [
            f"gpu_mig_sm_active_seconds_total{{{labels}}} {active}",
            f"gpu_mig_profiled_seconds_total{{{labels}}} {covered}",
            f'gpu_mig_info{{{labels},sm_count="16"}} 1',
        ]
    if utilization:
        lines.append(f'gpu_utilization_ratio{{gpu="0",uuid="{GPU}",hostname="h"}} 1')
    return "\n".join(lines) + "\n"


def test_the_window_mean_comes_from_the_instance_counters() -> None:
    first = parse(scrape(0, {7: (1.0, 10.0), 9: (0.0, 10.0)}), 0.0)
    last = parse(scrape(8, {7: (1.5, 18.0), 9: (0.0, 18.0)}), 8.0)
    assert instance_mean(first, last, SMALL) == 0.5 / 8
    assert instance_mean(first, last, OTHER) == 0.0
    assert instance_mean(first, last, MigInstance(3, "", ("MIG-c",))) is None


def test_one_warp_passes_when_instance_relative_and_fails_when_whole_gpu_relative() -> None:
    assert [o.ok for o in judge("one_warp", {7: 1 / 16, 9: 0.0}, SMALL, 132)] == [True]
    assert [o.ok for o in judge("one_warp", {7: 1 / 132, 9: 0.0}, SMALL, 132)] == [False]
    assert [o.ok for o in judge("one_warp", {7: 1 / 16}, MigInstance(7, "", ("MIG-a",)), 132)] == [False]


def test_a_full_instance_must_leave_the_others_idle() -> None:
    assert [o.ok for o in judge("all_sms", {7: 0.99, 9: 0.0}, SMALL, 132)] == [True, True]
    assert [o.ok for o in judge("all_sms", {7: 0.99, 9: 0.2}, SMALL, 132)] == [True, False]
    assert [o.ok for o in judge("idle", {7: 0.0, 9: None}, SMALL, 132)] == [True, False]


def test_series_checks_want_every_instance_and_no_nvml_utilization() -> None:
    good = parse(scrape(0, {7: (0, 0), 9: (0, 0)}), 0.0)
    assert all(o.ok for o in series_outcomes(good, GPU, [SMALL, OTHER]))
    bad = parse(scrape(0, {7: (0, 0)}, utilization=True), 0.0)
    assert [o.ok for o in series_outcomes(bad, GPU, [SMALL, OTHER])] == [True, False, False]
