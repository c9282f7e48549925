"""`smlens profile`'s analysis on captures recorded on an H200 (tests/fixtures/profile/, written by
bench/truth/profile_truth.py). Every expected value comes from outside the code under test: the launch shapes
and the device's SM count and warps per SM (physics), the %globaltimer stamps the workload wrote at each phase
boundary, and NVML GPM read by the workload over the same windows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smlens.profile import analysis
from smlens.profile.counters import (
    COUNTERS,
    CUPTI_DRAM_ELAPSED,
    CUPTI_GR_ACTIVE,
    CUPTI_GR_ELAPSED,
    CUPTI_SM_ACTIVE,
    PEAK_OF,
    PIPE_RATIOS,
    RATIOS,
)
from smlens.profile.counters import CUPTI_SM_ELAPSED as SM_ELAPSED
from smlens.profile.counters import CUPTI_TENSOR_ACTIVE as TENSOR_ACTIVE
from smlens.profile.recording import Recording, RecordingError
from smlens.profile.summary import summarize
from smlens.profile.timestamps import fill_timestamps, settle
from smlens.verdicts import thresholds

FIXTURES = Path(__file__).parent / "fixtures" / "profile"
GUARD_NS = (
    2_000_000  # phase edges left out: one sample can hold two phases, and the PM and stamp clocks differ
)
RULE = thresholds.load()  # the shipped thresholds.yaml: the verdict's and the alert's


def load(name: str) -> tuple[Recording, dict[str, Any]]:
    with gzip.open(FIXTURES / name, "rt") as f:
        data = json.load(f)
    return Recording.from_json(data["capture"]), data


@pytest.fixture(scope="module")
def schedule() -> tuple[analysis.Series, dict[str, Any]]:
    recording, data = load("h200_schedule.json.gz")
    return analysis.series(recording), data["phases"]


def windows(phases: dict[str, Any], name: str) -> list[tuple[int, int]]:
    stamps, names = phases["stamps"], phases["names"]
    return [(stamps[i], stamps[i + 1]) for i, n in enumerate(names[:-1]) if n == name]


def phase_mean(s: analysis.Series, phases: dict[str, Any], name: str, key: str) -> float:
    """Mean over every sample lying wholly inside one of the phase's windows, edges left out."""
    end = s.start_ns + (s.seconds * 1e9).astype(np.int64)
    inside = np.zeros(len(s), dtype=bool)
    for lo, hi in windows(phases, name):
        inside |= (s.start_ns >= lo + GUARD_NS) & (end <= hi - GUARD_NS)
    assert inside.sum() > 100
    return float(s.ratio(key)[inside].mean())


@pytest.mark.parametrize(
    "name", ["spin_one_warp", "spin_half_sms", "spin_warp_per_sm", "spin_full_occupancy"]
)
def test_spin_phases_read_what_the_launch_shape_implies(schedule: Any, name: str) -> None:
    s, phases = schedule
    sms, per_sm, threads = phases["shapes"][name]
    sm_count, warps = phases["sm_count"], phases["max_warps_per_sm"]
    assert phase_mean(s, phases, name, "sm_active") == pytest.approx(sms / sm_count, abs=0.002)
    occupancy = sms * per_sm * threads / 32 / (sm_count * warps)
    assert phase_mean(s, phases, name, "occupancy") == pytest.approx(occupancy, abs=0.002)
    assert phase_mean(s, phases, name, "busy") == pytest.approx(1.0, abs=0.002)
    assert phase_mean(s, phases, name, "tensor") == 0.0


def test_idle_gaps_read_zero(schedule: Any) -> None:
    s, phases = schedule
    for key in ("busy", "sm_active", "occupancy", "tensor", "dram"):
        assert phase_mean(s, phases, "idle", key) < 0.002


def test_tensor_needs_cuptis_peak_and_then_matches_gpm() -> None:
    """The GEMM's tensor pipe counter runs at ~3.7 per elapsed cycle: it must be divided by the peak CUPTI
    reported (4 on GH100), and then agrees with NVML GPM's tensor activity over the same second."""
    recording, data = load("h200_steady.json.gz")
    assert recording.peaks[TENSOR_ACTIVE] == 4.0
    s = analysis.series(recording)
    gpm = steady_gpm(data)["gemm_bf16"]
    lo, hi = steady_window(data, "gemm_bf16")
    mean, count = analysis.window_mean(s, "tensor", lo, hi)
    assert count > 500
    assert mean == pytest.approx(gpm["tensor"], abs=0.02)
    inside = (s.start_ns >= lo) & (s.start_ns < hi)
    raw = recording.column(TENSOR_ACTIVE)[inside] / recording.column(SM_ELAPSED)[inside]
    assert float(raw.mean()) > 3.0  # unnormalised: the tensor counter's peak is 4 per cycle, not 1


def steady_gpm(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    phases = data["phases"]
    return {w["name"]: dict(zip(phases["gpm_keys"], w["gpm"], strict=True)) for w in phases["windows"]}


def steady_window(data: dict[str, Any], name: str) -> tuple[int, int]:
    window = next(w for w in data["phases"]["windows"] if w["name"] == name)
    offset = data["pm_clock_minus_host_ns"]
    return window["host_ns"][0] + offset + 50_000_000, window["host_ns"][1] + offset - 50_000_000


def test_steady_workloads_agree_with_gpm_over_the_same_second() -> None:
    recording, data = load("h200_steady.json.gz")
    s = analysis.series(recording)
    gpm = steady_gpm(data)
    assert len(gpm) == 8  # idle, four spins, a GEMM, launch-bound GEMMs, a copy
    for name, reading in gpm.items():
        lo, hi = steady_window(data, name)
        for key in ("sm_active", "occupancy", "tensor", "dram"):
            mean, count = analysis.window_mean(s, key, lo, hi)
            assert count > 500, (name, key)
            assert mean == pytest.approx(reading[key], abs=0.02), (name, key)


def test_hollow_busy_time_is_the_one_warp_spin_not_the_launch_bound_stretch(schedule: Any) -> None:
    """The verdict calls a window hollow when kernels ran at least busy_utilization of it with SM active at
    most hollow_sm_active; the launch-bound stretch runs kernels a third of the time (its SM active is low
    because of the gaps), so it is partial, as the verdict says of such a window; the one-warp spin runs
    kernels all the time on 1 SM of 132, so it is hollow. The hollow busy time is then the one-warp spin's
    stamped length (busy 1.0 there): 19.4 % of the busy time, not the 22.7 % that counting the launch-bound
    stretch as hollow gives."""
    s, phases = schedule
    one = sum((hi - lo) / 1e9 for lo, hi in windows(phases, "spin_one_warp"))
    busy_time = float((s.busy * s.seconds).sum())  # the GR engine's counter, not SM activity
    share = analysis.hollow_share(s, RULE)
    assert share == pytest.approx(one / busy_time, abs=0.002)
    assert share == pytest.approx(0.194, abs=0.002)
    classes = analysis.classify(s, RULE)
    end = s.start_ns + (s.seconds * 1e9).astype(np.int64)
    for name, kind in (("launch_bound", analysis.PARTIAL), ("spin_one_warp", analysis.HOLLOW)):
        for lo, hi in windows(phases, name):
            inside = (s.start_ns >= lo + GUARD_NS) & (end <= hi - GUARD_NS)
            assert inside.sum() > 10 and set(classes[inside].tolist()) == {kind}, name
    histogram = analysis.activity_histogram(s)
    assert sum(h[2] for h in histogram) == pytest.approx(1.0)
    assert sum(h[2] for h in histogram if h[1] <= RULE.hollow_sm_active + 1e-9) >= share


def capture(rows: list[tuple[int, float, float]]) -> Recording:
    """A recording of back-to-back samples, each (length in us, busy, SM active), from raw counters: one
    elapsed cycle per ns, every peak 1, no warps, tensor or DRAM traffic."""
    lengths = np.array([length * 1000 for length, _, _ in rows], dtype=np.int64)
    end = np.cumsum(lengths) + 1_000_000
    columns = {counter: np.zeros(len(rows)) for counter in COUNTERS}
    for counter in (SM_ELAPSED, CUPTI_GR_ELAPSED, CUPTI_DRAM_ELAPSED):
        columns[counter] = lengths.astype(np.float64)
    columns[CUPTI_GR_ACTIVE] = lengths * np.array([busy for _, busy, _ in rows])
    columns[CUPTI_SM_ACTIVE] = lengths * np.array([sm for _, _, sm in rows])
    values = np.column_stack([columns[counter] for counter in COUNTERS])
    peaks = dict.fromkeys(PEAK_OF, 1.0)
    return Recording({"index": 0}, "GH100", 100_000, COUNTERS, peaks, end - lengths, end, values)


def test_hollow_share_weighs_each_hollow_sample_by_its_busy_share() -> None:
    """Busy time is busy share x sample length (docs/profile.md, "What it measures"). With busy_utilization
    0.2 the samples of busy 0.5 and 0.25 are hollow, and count for 0.5 x 100 + 0.25 x 200 = 100 us of the
    285 us of busy time (100 + 50 + 50 + 75 + 0 + 10), not for their 300 us of time."""
    rule = RULE.with_overrides({"busy_utilization": 0.2}, "test")
    recording = capture(
        [
            (100, 1.0, 0.9),
            (100, 0.5, 0.1),
            (200, 0.25, 0.05),
            (100, 0.75, 0.6),
            (100, 0.0, 0.0),
            (100, 0.1, 0.05),
        ]
    )
    s = analysis.series(recording)
    classes = [analysis.CLASS_NAMES[c] for c in analysis.classify(s, rule)]
    # with every pipe and DRAM at 0: SMs active 0.9 is stalled, 0.6 (under working_sm_active) partial
    assert classes == ["stalled", "hollow", "hollow", "partial", "idle", "partial"]
    assert analysis.hollow_share(s, rule) == pytest.approx(100 / 285)
    summary = summarize(recording, rule)
    assert summary["hollow_share_of_busy"] == pytest.approx(100 / 285)
    assert summary["means"]["busy"] == pytest.approx(285 / 700)
    assert summary["means"]["sm_active"] == pytest.approx((90 + 10 + 10 + 60 + 0 + 5) / 700)
    shares = {round(h["high"], 2): h["share_of_busy"] for h in summary["sm_activity_of_busy_time"]}
    assert {high: share for high, share in shares.items() if share} == pytest.approx(
        {0.05: (50 + 10) / 285, 0.1: 50 / 285, 0.6: 75 / 285, 0.9: 100 / 285}
    )


def test_step_period_within_five_percent_of_the_stamped_one(schedule: Any) -> None:
    s, phases = schedule
    starts = [lo for lo, _ in windows(phases, "idle")]
    stamped = float(np.mean(np.diff(starts))) / 1e9
    period = analysis.step_period(s)
    assert period is not None
    assert period.seconds == pytest.approx(stamped, rel=0.05)
    assert period.repeats >= 4


def test_typical_step_breaks_down_into_the_stamped_phases(schedule: Any) -> None:
    """The fixture was recorded before the FMA, FP64 and ALU pipe counters were: its tensor pipe alone is
    there. The GEMM's tensor pipe near its peak is compute-bound all the same; the spins with every SM
    active could be limited by a pipe the recording lacks, so they are unknown, not stalled; the half-SM
    spin (SM active 0.5, under working_sm_active) is partial, as the verdict says of such a window."""
    s, phases = schedule
    assert not s.pipes
    period = analysis.step_period(s)
    assert period is not None
    step = analysis.breakdown(s, period, RULE)

    def mean_length(*names: str) -> float:
        return sum(float(np.mean([hi - lo for lo, hi in windows(phases, n)])) for n in names) / 1e9

    unknown = mean_length("spin_warp_per_sm", "spin_full_occupancy")
    hollow, idle, gemm = mean_length("spin_one_warp"), mean_length("idle"), mean_length("gemm_bf16")
    partial = mean_length("launch_bound", "spin_half_sms")
    slack = 0.003  # a sample or two at each edge, and the steps differ by a few ms
    assert step.compute_bound_s == pytest.approx(gemm, abs=slack)
    assert step.unknown_s == pytest.approx(unknown, abs=slack)
    assert step.hollow_s == pytest.approx(hollow, abs=slack)
    assert step.partial_s == pytest.approx(partial, abs=slack)
    assert step.idle_s == pytest.approx(idle, abs=slack)
    assert step.stalled_s == step.memory_bound_s == 0.0
    total = sum(step.seconds(kind) for kind in analysis.CLASS_NAMES)
    assert total == pytest.approx(step.period_s, abs=1e-9)
    assert {x.pipe for x in step.stretches if x.kind == "compute_bound"} == {"tensor"}
    one_warp = [x for x in step.stretches if x.kind == "hollow" and x.sm_active < 0.02]
    assert len(one_warp) == 1 and one_warp[0].seconds == pytest.approx(hollow, abs=slack)


def test_no_period_in_a_signal_that_does_not_repeat() -> None:
    n = 3000
    rng = np.random.default_rng(7)
    s = synthetic(rng.random(n))
    assert analysis.step_period(s) is None
    assert analysis.step_period(synthetic(np.full(n, 0.5))) is None


def test_period_of_a_synthetic_square_wave() -> None:
    pattern = np.concatenate([np.full(30, 0.9), np.full(20, 0.05), np.full(10, 0.0)])
    s = synthetic(np.tile(pattern, 20))
    period = analysis.step_period(s)
    assert period is not None and period.samples == pytest.approx(60, abs=0.5)
    step = analysis.breakdown(s, period, RULE)
    assert (step.stalled_s, step.hollow_s, step.idle_s) == pytest.approx((30e-4, 20e-4, 10e-4))


def synthetic(sm_active: np.ndarray) -> analysis.Series:
    n = len(sm_active)
    busy = np.where(sm_active > 0.01, 1.0, 0.0)
    return analysis.Series(
        start_ns=np.arange(n, dtype=np.int64) * 100_000,
        seconds=np.full(n, 1e-4),
        busy=busy,
        sm_active=sm_active,
        occupancy=sm_active / 2,
        tensor=np.zeros(n),
        dram=np.zeros(n),
        pipes={r.key: np.zeros(n) for r in PIPE_RATIOS},  # every pipe idle: SMs active are stalled
    )


def test_samples_without_timestamps_are_placed_only_where_they_fit() -> None:
    zero = [0, 0]
    stamps = np.array([zero, [100, 200], zero, zero, [400, 500], zero, zero, zero, [900, 1000], zero])
    keep, placed = fill_timestamps(stamps, 100)
    assert placed == 2
    assert keep.tolist() == [False, True, True, True, True, False, False, False, True, False]
    assert stamps[2:4].tolist() == [[200, 300], [300, 400]]


def test_ratios_are_clamped_and_unclocked_samples_read_zero() -> None:
    recording, _ = load("h200_schedule.json.gz")
    values = recording.values[:3].copy()
    values[0, :] = 0.0  # nothing elapsed
    values[1, list(recording.counters).index(SM_ELAPSED)] = 1.0  # more active than elapsed cycles
    short = Recording(
        recording.gpu,
        recording.chip,
        recording.interval_ns,
        recording.counters,
        recording.peaks,
        recording.start_ns[:3],
        recording.end_ns[:3],
        values,
    )
    s = analysis.series(short)
    for r in RATIOS:
        assert s.ratio(r.key)[0] == 0.0
        assert float(s.ratio(r.key).min()) >= 0.0 and float(s.ratio(r.key).max()) <= 1.0
    assert s.sm_active[1] == 1.0


def test_recording_round_trips_and_bad_ones_get_one_sentence(tmp_path: Path) -> None:
    recording, _ = load("h200_schedule.json.gz")
    again = Recording.from_json(json.loads(json.dumps(recording.to_json())))
    assert np.array_equal(again.values, recording.values)
    assert np.array_equal(again.start_ns, recording.start_ns)
    assert again.peaks == recording.peaks
    bad = recording.to_json()
    del bad["peaks"]["sm__warps_active.avg"]
    with pytest.raises(RecordingError, match=r"lacks sm__warps_active\.avg"):
        Recording.from_json(bad)
    with pytest.raises(RecordingError, match="not a smlens profile recording"):
        Recording.from_json({"format": "other"})
    for peak in (0.0, -1.0, float("inf"), float("nan")):
        zero = recording.to_json()
        zero["peaks"]["sm__warps_active.avg"] = peak
        with pytest.raises(RecordingError, match=r"peak of sm__warps_active\.avg .* not a positive number"):
            Recording.from_json(zero)
    shuffled = recording.to_json()
    shuffled["samples"] = shuffled["samples"][::-1]
    in_order = Recording.from_json(shuffled)  # each sample has its own stamps: order restored, none lost
    assert np.array_equal(in_order.start_ns, recording.start_ns)
    assert np.array_equal(in_order.values, recording.values)
    backwards = recording.to_json()
    backwards["samples"][5][1] = backwards["samples"][5][0] - 1
    with pytest.raises(RecordingError, match="sample 5 ends before it starts"):
        Recording.from_json(backwards)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(RecordingError, match="cannot read"):
        Recording.load(broken)


def test_settling_keeps_what_covers_time_and_says_what_it_dropped() -> None:
    # decode order as CUPTI 13.4 gave it on the H200: an unclocked first sample, an open start, an untimed run
    # that fits its gap, one that does not, and the zero-length samples decoded after stop
    stamps = np.array(
        [[0, 50], [0, 100], [100, 200], [0, 300], [0, 0], [400, 500], [0, 0], [900, 1000], [10, 10], [10, 10]]
    )
    settled = settle(stamps, 100)
    assert settled.keep.tolist() == [False, True, True, True, True, True, False, True, False, False]
    assert stamps[1].tolist() == [50, 100] and stamps[3].tolist() == [200, 300]
    assert stamps[4].tolist() == [300, 400]
    assert (settled.dropped_unclocked, settled.start_inferred, settled.timestamps_filled) == (1, 2, 1)
    assert (settled.dropped_untimed, settled.dropped_empty) == (1, 2)
