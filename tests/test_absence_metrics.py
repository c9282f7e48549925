"""The absence contract where users meet it: a value smlens cannot read has no series at /metrics
(text 0.0.4 and OpenMetrics), never 0 and never NaN. Scraped over HTTP from the real app, for a GPU
without profiling, a GPU whose power draw is not readable, a GPU lost mid-run (tests/fixtures/
scenarios/unreadable.yaml) and a DCGM blank value (through the DCGM bindings and the stub libdcgm)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from starlette.testclient import TestClient

from conftest import ExporterFactory
from fakes.device_source import NvmlLikeNode
from smlens import names as n
from smlens.errors import ConfigError
from smlens.exposition.collector import PLAIN_GAUGES, RATIO_GAUGES
from smlens.exposition.rendered import Publisher
from smlens.exposition.selection import EVERYTHING
from smlens.model import GpuIdentity, Snapshot
from smlens.pipeline.sampler import Sampler
from smlens.sources.dcgm.backend import open_dcgm_backend
from smlens.sources.sim import SimBackend, load_scenario
from smlens.verdicts import thresholds
from smlens.web.app import create_app

SCENARIO = Path(__file__).parent / "fixtures" / "scenarios" / "unreadable.yaml"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
PROFILING_GAUGES = [name for key, name, _ in RATIO_GAUGES if key in n.PROFILING_ACTIVITIES]
PROFILING_COUNTERS = [
    "gpu_sm_active_seconds_total",
    "gpu_profiled_seconds_total",
    "gpu_tensor_active_seconds_total",
]
ALL_GAUGES = [name for _, name, _ in (*RATIO_GAUGES, *PLAIN_GAUGES)]

Series = dict[tuple[str, str], float]  # (sample name, gpu label) -> value
PipeSeries = dict[tuple[str, str, str], float]  # (sample name, gpu label, pipe label or "") -> value


def scrape(snapshot: Snapshot, accept: str) -> Series:
    return {(name, gpu): value for (name, gpu, _), value in scrape_pipes(snapshot, accept).items()}


def scrape_pipes(snapshot: Snapshot, accept: str) -> PipeSeries:
    publisher = Publisher(EVERYTHING)  # the contract holds for every family, exported by default or not
    publisher.asked(accept.startswith("application/openmetrics-text"))  # as an earlier scrape would
    publisher.publish(snapshot)
    response = TestClient(create_app(publisher, thresholds.load(), lambda: True)).get(
        "/metrics", headers={"Accept": accept}
    )
    assert response.status_code == 200
    openmetrics = accept.startswith("application/openmetrics-text")
    assert response.headers["content-type"].startswith(
        "application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4"
    )
    return parse_pipes(response.text, openmetrics)


def parse(body: str, openmetrics: bool) -> Series:
    return {(name, gpu): value for (name, gpu, _), value in parse_pipes(body, openmetrics).items()}


def parse_pipes(body: str, openmetrics: bool) -> PipeSeries:
    series: PipeSeries = {}
    for family in (parse_openmetrics if openmetrics else parse_text)(body):
        for sample in family.samples:
            assert not math.isnan(sample.value), f"{sample.name}{sample.labels} is NaN"
            if "gpu" in sample.labels:
                series[(sample.name, sample.labels["gpu"], sample.labels.get(n.PIPE, ""))] = sample.value
    return series


def sim_snapshots(ticks: int) -> list[Snapshot]:
    now = [0.0]
    sampler = Sampler(SimBackend(load_scenario(SCENARIO), seed=7), [], "node-a", 1.0, clock=lambda: now[0])
    sampler.open()
    snapshots = []
    for tick in range(ticks):
        now[0] = float(tick)
        snapshots.append(sampler.tick())
    return snapshots


@pytest.fixture(params=["text/plain", OPENMETRICS], ids=["text", "openmetrics"])
def accept(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def absent(series: Series, gpu: str, names: Sequence[str]) -> list[str]:
    """The names that DO have a series for this GPU (so: an empty list when all are absent)."""
    return [name for name in names if (name, gpu) in series]


def test_gpu_without_profiling_has_no_sm_level_series(accept: str) -> None:
    series = scrape(sim_snapshots(4)[-1], accept)
    assert absent(series, "1", PROFILING_GAUGES + PROFILING_COUNTERS) == []
    assert absent(series, "0", PROFILING_GAUGES + PROFILING_COUNTERS) == PROFILING_GAUGES + PROFILING_COUNTERS
    assert series[("gpu_profiling_available", "1")] == 0
    assert series[("gpu_utilization_ratio", "1")] > 0.9  # what NVML-level data there is stays


def test_power_not_supported_has_no_power_series(accept: str) -> None:
    series = scrape(sim_snapshots(4)[-1], accept)
    assert absent(series, "2", ["gpu_power_watts"]) == []
    assert ("gpu_power_watts", "0") in series
    assert series[("gpu_sm_active_ratio", "2")] > 0.9  # the rest of that GPU is there
    assert ("gpu_power_limit_watts", "2") in series


def test_gpu_lost_mid_run_drops_its_gauges(accept: str) -> None:
    before, after = sim_snapshots(4)[1], sim_snapshots(4)[-1]
    assert absent(scrape(before, accept), "3", ALL_GAUGES) == ALL_GAUGES
    series = scrape(after, accept)
    assert series[("gpu_up", "3")] == 0
    assert absent(series, "3", ALL_GAUGES) == []
    assert series[("gpu_up", "0")] == 1


def test_dcgm_blank_value_has_no_series(fake_dcgm: ModuleType, accept: str) -> None:
    import dcgmvalue

    uuid = "GPU-0a0a0a0a-0000-0000-0000-000000000000"
    engine = fake_dcgm.FakeHostengine([fake_dcgm.FakeGpu(uuid)])
    fake_dcgm.REGISTRY.listen(engine)
    backend = open_dcgm_backend(None, embedded=False, interval=1.0)
    now = [0.0]
    node = NvmlLikeNode([GpuIdentity(0, uuid, "NVIDIA A100")], gauges={n.POWER_WATTS: 300})
    sampler = Sampler(node, [backend], "node-a", 1.0, clock=lambda: now[0])
    sampler.open()
    sample = {1002: 0.5, 1003: 0.25, 1004: 0.125, 1005: 0.5, 1009: 1000, 1010: 1000}
    for tick in range(2):
        engine.publish(0, sample)
        now[0] = float(tick)
        snapshot = sampler.tick()
    assert scrape(snapshot, accept)[("gpu_sm_active_ratio", "0")] == 0.5
    engine.publish(0, {**sample, 1002: dcgmvalue.DCGM_FP64_BLANK, 1003: dcgmvalue.DCGM_FP64_NOT_SUPPORTED})
    now[0] = 2.0
    series = scrape(sampler.tick(), accept)
    assert absent(series, "0", ["gpu_sm_active_ratio", "gpu_sm_occupancy_ratio"]) == []
    assert series[("gpu_tensor_active_ratio", "0")] == 0.125
    assert series[("gpu_profiling_mode", "0")] == 1  # DCGM says how it counts: one_pass here


def test_a_pipe_the_source_lacks_has_no_series_nor_a_sol_without_any_pipe(
    fake_dcgm: ModuleType, accept: str
) -> None:
    """Through DCGM: GPU 0 counts every pipe DCGM has (none is DMMA), GPU 1's metric groups lack HMMA and
    GPU 2's every compute pipe, so that it has SM activity but neither pipe nor compute SOL series."""
    uuids = [f"GPU-{i}a{i}a{i}a{i}a-0000-0000-0000-000000000000" for i in range(3)]
    no_pipes = ((0, 0, (1001, 1002, 1003, 1005)), (1, 0, (1009, 1010)))
    engine = fake_dcgm.FakeHostengine(
        [
            fake_dcgm.FakeGpu(uuids[0]),
            fake_dcgm.FakeGpu(uuids[1], fake_dcgm.NO_HMMA),
            fake_dcgm.FakeGpu(uuids[2], no_pipes),
        ]
    )
    fake_dcgm.REGISTRY.listen(engine)
    backend = open_dcgm_backend(None, embedded=False, interval=1.0)
    now = [0.0]
    node = NvmlLikeNode([GpuIdentity(i, uuid, "NVIDIA A100") for i, uuid in enumerate(uuids)])
    sampler = Sampler(node, [backend], "node-a", 1.0, clock=lambda: now[0])
    sampler.open()
    # Every ratio field; the double keeps those watched.
    every_field = dict.fromkeys((*range(1002, 1009), *range(1013, 1017)), 0.25)
    for tick in range(2):
        for index in range(3):
            engine.publish(index, every_field)
        now[0] = float(tick)
        snapshot = sampler.tick()
    series = scrape_pipes(snapshot, accept)

    def pipes_of(gpu: str) -> set[str]:
        return {pipe for name, at, pipe in series if name == "gpu_pipe_active_seconds_total" and at == gpu}

    dcgm_pipes = {"hmma", "imma", "dfma", "fp64", "fp32", "fp16", "integer"}
    assert pipes_of("0") == dcgm_pipes
    assert pipes_of("1") == dcgm_pipes - {"hmma"}
    assert pipes_of("2") == set()
    sol = "gpu_compute_sol_seconds_total"
    assert series[(sol, "0", "")] == series[(sol, "1", "")] == 0.25  # 1 s at 0.25 on each pipe
    assert (sol, "2", "") not in series and series[("gpu_sm_active_seconds_total", "2", "")] == 0.25


@pytest.mark.parametrize(
    ("unreadable", "message"),
    [
        ("power_watts", "'unreadable' must be a list of value names"),
        (["power_watt"], "cannot make power_watt unreadable; known: "),
    ],
)
def test_bad_unreadable_key_is_one_sentence(tmp_path: Path, unreadable: object, message: str) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"gpus": [{"profile": "idle", "unreadable": unreadable}]}))
    with pytest.raises(ConfigError, match=message) as caught:
        load_scenario(scenario)
    assert "\n" not in str(caught.value)


def test_a_running_exporter_serves_the_scenario_without_zeros(start_exporter: ExporterFactory) -> None:
    """The same contract end to end: ``smlens serve --sim-scenario`` scraped over loopback HTTP."""
    base = start_exporter(
        "--backend", "sim", "--sim-scenario", str(SCENARIO), "--interval", "0.5", "--metrics", "all"
    )
    deadline = time.monotonic() + 20
    while True:  # GPU 3 is lost 2 s after the first sample
        text = httpx.get(base + "/metrics", timeout=5).text
        if parse(text, openmetrics=False).get(("gpu_up", "3")) == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    for accept in ("text/plain", OPENMETRICS):
        response = httpx.get(base + "/metrics", headers={"Accept": accept}, timeout=5)
        # The first scrape asking for OpenMetrics may get the text format: parse what the answer says.
        series = parse(response.text, openmetrics=response.headers["content-type"].startswith(OPENMETRICS))
        assert series[("gpu_up", "3")] == 0
        assert absent(series, "3", ALL_GAUGES) == []
        assert absent(series, "1", PROFILING_GAUGES + PROFILING_COUNTERS) == []
        assert absent(series, "2", ["gpu_power_watts"]) == []
        assert ("gpu_power_watts", "0") in series and ("gpu_sm_active_ratio", "0") in series
