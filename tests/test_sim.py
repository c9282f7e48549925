from __future__ import annotations

from pathlib import Path

import pytest

from smlens import model as m
from smlens import names as n
from smlens.errors import ConfigError
from smlens.sources.sim import DEFAULT_LAYOUT, Scenario, SimBackend, load_scenario


def run(backend: SimBackend, ticks: int, dt: float = 1.0) -> dict[int, list[m.Reading]]:
    gpus = backend.discover()
    backend.attach(gpus)
    readings: dict[int, list[m.Reading]] = {g.index: [] for g in gpus}
    for tick in range(ticks):
        for gpu in gpus:
            readings[gpu.index].append(backend.read(gpu, tick * dt))
    return readings


def ratios(readings: list[m.Reading], key: str) -> list[float]:
    return [r.ratio for reading in readings if (r := reading.activity.get(key)) and r.ratio is not None]


def test_default_node_holds_each_profile_within_its_band() -> None:
    readings = run(SimBackend(Scenario.steady(8), seed=7), ticks=200)
    assert DEFAULT_LAYOUT[1] == "hollow"
    bands = {
        0: {n.UTILIZATION: (0.95, 1), n.SM_ACTIVE: (0.85, 1), n.TENSOR_ACTIVE: (0.6, 1)},
        1: {n.UTILIZATION: (0.95, 1), n.SM_ACTIVE: (0, 0.15)},
        2: {n.UTILIZATION: (0.95, 1), n.SM_ACTIVE: (0.9 / 132, 1.1 / 132)},
        3: {n.SM_ACTIVE: (0.9, 1), n.SM_OCCUPANCY: (0, 0.05), n.TENSOR_ACTIVE: (0, 0.01)},
        4: {n.DRAM_ACTIVE: (0.8, 1), n.TENSOR_ACTIVE: (0, 0.01)},
        5: {n.UTILIZATION: (0.27, 0.33), n.SM_ACTIVE: (0.10, 0.14)},
        6: {n.UTILIZATION: (0, 0), n.SM_ACTIVE: (0, 0)},
        7: {n.UTILIZATION: (0, 0), n.SM_ACTIVE: (0, 0)},
    }
    for index, limits in bands.items():
        for key, (low, high) in limits.items():
            values = ratios(readings[index], key)
            assert len(values) == 199, (index, key)
            assert low <= min(values) and max(values) <= high, (index, key, min(values), max(values))
    held = readings[7][-1].gauges[n.MEMORY_USED_BYTES]
    assert held > 0.5 * readings[7][-1].gauges[n.MEMORY_TOTAL_BYTES]
    assert readings[6][-1].gauges[n.MEMORY_USED_BYTES] == 0


def test_noise_stays_within_two_hundredths_and_is_seeded() -> None:
    a = run(SimBackend(Scenario.steady(8), seed=3), ticks=50)
    b = run(SimBackend(Scenario.steady(8), seed=3), ticks=50)
    c = run(SimBackend(Scenario.steady(8), seed=4), ticks=50)
    assert ratios(a[0], n.SM_ACTIVE) == ratios(b[0], n.SM_ACTIVE)
    assert ratios(a[0], n.SM_ACTIVE) != ratios(c[0], n.SM_ACTIVE)
    values = ratios(a[0], n.SM_ACTIVE)
    assert max(values) - min(values) <= 0.04
    assert len(set(values)) > 1


def test_gpus_beyond_eight_cycle_through_the_layout_with_distinct_uuids() -> None:
    backend = SimBackend(Scenario.steady(10))
    gpus = backend.discover()
    assert len({g.uuid for g in gpus}) == 10
    readings = run(SimBackend(Scenario.steady(10)), ticks=3)
    assert ratios(readings[8], n.SM_ACTIVE)[0] > 0.85  # healthy again


def test_first_read_has_no_coverage_then_integrals_match_time() -> None:
    readings = run(SimBackend(Scenario.steady(1)), ticks=3, dt=0.5)[0]
    assert readings[0].activity == {}
    assert readings[1].activity[n.UTILIZATION].covered_seconds == pytest.approx(0.5)


def test_scenario_file_phases_loop(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(
        "gpus:\n"
        "  - phases: [{profile: idle, seconds: 2}, {profile: hollow, seconds: 3, sm_active: 0.05}]\n"
        "  - healthy\n"
    )
    backend = SimBackend(load_scenario(path))
    assert backend.profile_at(0, 1.0).sm_active == 0.0
    assert backend.profile_at(0, 2.5).sm_active == 0.05
    assert backend.profile_at(0, 5.5).utilization == 0.0  # looped back to idle
    assert backend.profile_at(1, 100.0).sm_active > 0.9


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: []", "non-empty list under 'gpus'"),
        ("gpus: [nonsense]", "unknown profile 'nonsense'"),
        ("gpus: [{profile: idle, sm_active: 2}]", "sm_active must be a ratio from 0 to 1"),
        ("gpus: [{profile: idle, colour: red}]", "unknown field 'colour'"),
        ("gpus: [{phases: [{profile: idle}]}]", "'seconds' must be a positive number"),
        ("gpus: [", "not valid YAML"),
        ("gpus: [{mig: []}]", "non-empty list of GPU instances"),
        ("gpus: [{mig: [{mig_profile: 5g.1gb}]}]", "mig_profile must be one of 1g.18gb"),
        (
            "gpus: [{mig: [{mig_profile: 4g.71gb}, {mig_profile: 4g.71gb}, {mig_profile: 1g.18gb}]}]",
            "more than the GPU's 132 SMs",
        ),
        ("gpus: [{mig: [{mig_profile: 1g.18gb, profile: nonsense}]}]", "unknown profile 'nonsense'"),
    ],
)
def test_bad_scenario_files_get_one_clear_sentence(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_scenario(path)


def test_a_mig_gpu_reads_per_instance_and_has_no_utilization(tmp_path: Path) -> None:
    path = tmp_path / "mig.yaml"
    path.write_text(
        "gpus:\n"
        "  - healthy\n"
        "  - mig: [{mig_profile: 3g.71gb, profile: healthy}, {mig_profile: 1g.18gb, profile: hollow}]\n"
    )
    backend = SimBackend(load_scenario(path))
    readings = run(backend, ticks=2, dt=1.0)
    whole, split = readings[0][1], readings[1][1]
    assert whole.instances == () and n.UTILIZATION in whole.activity
    assert n.UTILIZATION not in split.activity and split.missing == {n.UTILIZATION: "not_supported"}
    big, small = split.instances
    assert (big.instance.profile, big.instance.sm_count, small.instance.sm_count) == ("3g.71gb", 60, 16)
    assert big.instance.gpu_instance != small.instance.gpu_instance
    assert big.activity[n.SM_ACTIVE].ratio == pytest.approx(0.96, abs=0.03)
    assert small.activity[n.SM_ACTIVE].ratio == pytest.approx(0.10, abs=0.02)
    # The whole GPU: the instances weighted by their SMs (60 and 16 of 132), the rest idle.
    assert split.activity[n.SM_ACTIVE].ratio == pytest.approx((60 * 0.96 + 16 * 0.10) / 132, abs=0.03)
    assert small.gauges[n.MEMORY_TOTAL_BYTES] == 18 * 1024**3
