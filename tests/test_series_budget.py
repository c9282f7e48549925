"""The exporter's series budget where users meet it, /metrics: at the default ``--metrics`` a GPU has at
most 36 series on every backend (NVML with GPM, NVML with DCGM, the sim), every other family is one
group away, and a bad group name is one sentence."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from types import ModuleType

import helm_python
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conftest import REPO, ExporterFactory, run_cli
from fakes.fake_pynvml import FakeGpu, FakeNode, install
from helm_support import CHART_DIR, render
from smlens import names as n
from smlens.exposition.collector import (
    ACTIVITY_COUNTERS,
    COVERAGE_COUNTERS,
    PLAIN_COUNTERS,
    PLAIN_GAUGES,
    RATIO_GAUGES,
)
from smlens.exposition.rendered import Publisher
from smlens.exposition.selection import (
    BY_NAME,
    DEFAULT_GROUPS,
    EVERYTHING,
    SELECTABLE,
    Selection,
    parse_selection,
)
from smlens.pipeline.sampler import Sampler
from smlens.settings import resolve
from smlens.sources.registry import KINDS
from smlens.verdicts import thresholds
from smlens.web.app import create_app

SERIES_PER_GPU = 36
UUIDS = ("GPU-0a0a0a0a-0000-0000-0000-000000000000", "GPU-1b1b1b1b-1111-1111-1111-111111111111")
EVERY_GPU_FAMILY = {
    name
    for specs in (RATIO_GAUGES, PLAIN_GAUGES, ACTIVITY_COUNTERS, COVERAGE_COUNTERS, PLAIN_COUNTERS)
    for _, name, _ in specs
} | {n.GPU_ECC_ERRORS, n.GPU_CLOCK_EVENT_ACTIVE, n.GPU_PIPE_ACTIVE_SECONDS}
# SM active, occupancy, tensor, DRAM and every compute pipe: the most series DCGM gives a GPU.
DCGM_SAMPLE = {1002: 0.5, 1003: 0.25, 1004: 0.125, 1005: 0.5} | dict.fromkeys(
    (1006, 1007, 1008, 1013, 1014, 1015, 1016), 0.1
)
COMPUTE = {n.GPU_PIPE_ACTIVE_SECONDS, n.GPU_COMPUTE_SOL_SECONDS}


def per_gpu(text: str) -> tuple[Counter[str], set[str]]:
    """Series per GPU (whole-GPU series only), and the families that have any."""
    counts: Counter[str] = Counter()
    families = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "gpu" in sample.labels and "gpu_instance" not in sample.labels:
                counts[sample.labels["gpu"]] += 1
                families.add(family.name)
    return counts, families


def scraped(kind: str, selection: Selection, node: FakeNode, engine: object | None = None) -> str:
    settings = resolve(
        "check", {"backend": kind, "energy_interval": 1, "utilization_interval": 1}, environ={}
    )
    opened = KINDS[kind].open(settings)
    now = [0.0]
    sampler = Sampler(opened.device, opened.extras, "node-a", 1.0, clock=lambda: now[0])
    sampler.open()
    publisher = Publisher(selection)
    sampler.subscribe(publisher.publish)
    try:
        for tick in range(3):
            node.advance(1.0)
            if engine is not None:
                for index in range(len(UUIDS)):
                    engine.publish(index, DCGM_SAMPLE)  # type: ignore[attr-defined]
            now[0] = float(tick)
            sampler.tick()
    finally:
        sampler.close()
    return TestClient(create_app(publisher, thresholds.load(), lambda: True)).get("/metrics").text


def test_nvml_with_gpm_keeps_the_budget_at_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, *(FakeGpu(uuid) for uuid in UUIDS))  # every clock-event reason supported
    counts, families = per_gpu(scraped("auto", Selection(), node))
    assert set(counts) == {"0", "1"}
    assert max(counts.values()) <= SERIES_PER_GPU, counts
    assert {n.GPU_SM_ACTIVE_SECONDS, n.GPU_PROFILED_SECONDS, n.GPU_CLOCK_EVENT_ACTIVE, *COMPUTE} <= families
    everything, all_families = per_gpu(scraped("auto", EVERYTHING, node))
    assert min(everything.values()) > max(counts.values())
    assert all_families - families >= {n.GPU_PCIE_TRANSMIT_BYTES, n.GPU_POWER_LIMIT_WATTS}


def test_nvml_with_dcgm_keeps_the_budget_at_the_default(
    monkeypatch: pytest.MonkeyPatch, fake_dcgm: ModuleType
) -> None:
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "gpm_supported": False, "compute_capability": (8, 0)}
    node = install(monkeypatch, *(FakeGpu(uuid, **a100) for uuid in UUIDS))  # type: ignore[arg-type]
    engine = fake_dcgm.FakeHostengine([fake_dcgm.FakeGpu(uuid) for uuid in UUIDS])
    fake_dcgm.REGISTRY.listen(engine)
    counts, families = per_gpu(scraped("dcgm", Selection(), node, engine))
    assert set(counts) == {"0", "1"}
    assert max(counts.values()) <= SERIES_PER_GPU, counts
    assert {n.GPU_SM_ACTIVE_SECONDS, n.GPU_PROFILING_MODE, *COMPUTE} <= families


def test_a_running_sim_exporter_keeps_the_budget_and_exports_a_chosen_group(
    start_exporter: ExporterFactory,
) -> None:
    counts, families = per_gpu(httpx.get(start_exporter("--backend", "sim") + "/metrics", timeout=10).text)
    assert len(counts) == 8 and max(counts.values()) <= SERIES_PER_GPU, counts
    assert n.GPU_PCIE_TRANSMIT_BYTES not in families and n.GPU_SM_ACTIVE_SECONDS in families
    base = start_exporter("--backend", "sim", "--metrics", "default,pcie,-errors")
    _, chosen = per_gpu(httpx.get(base + "/metrics", timeout=10).text)
    assert chosen - families == {n.GPU_PCIE_TRANSMIT_BYTES, n.GPU_PCIE_RECEIVE_BYTES, n.GPU_PCIE_REPLAYS}
    assert families - chosen == {n.GPU_ECC_ERRORS}


def test_every_family_is_in_one_group_or_always_there() -> None:
    grouped = [family for group in BY_NAME.values() for family in group.families]
    assert set(grouped) >= EVERY_GPU_FAMILY - {n.GPU_INFO, n.GPU_UP}
    # One group per family, except the clock events and the pipes, whose label values two groups split.
    split = {n.GPU_CLOCK_EVENT_ACTIVE, n.GPU_PIPE_ACTIVE_SECONDS}
    assert {f for f, c in Counter(grouped).items() if c > 1} == split


def test_the_default_label_values_are_the_slowdowns_and_every_pipe_but_dmma() -> None:
    default, clocks, pipes = Selection(), n.GPU_CLOCK_EVENT_ACTIVE, n.GPU_PIPE_ACTIVE_SECONDS
    assert all(default.exports_value(clocks, r) for r in n.SLOWDOWN_REASONS)
    assert not default.exports_value(clocks, n.POWER_CAP_REASON) and not default.exports_value(
        clocks, "gpu_idle"
    )
    every_reason = parse_selection("default,clock_events")
    assert every_reason.exports_value(clocks, n.POWER_CAP_REASON) and every_reason.exports_value(
        clocks, "gpu_idle"
    )
    assert not parse_selection("activity").exports_value(clocks, n.SLOWDOWN_REASONS[0])
    assert [p for _, p in n.PIPE_LABELS if not default.exports_value(pipes, p)] == ["dmma"]
    assert parse_selection("default,pipes").exports_value(pipes, "dmma")


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("default", DEFAULT_GROUPS),
        ("-errors", tuple(g for g in DEFAULT_GROUPS if g != "errors")),
        ("all,-pcie", tuple(g for g in BY_NAME if g != "pcie")),
        (" memory , pcie,memory", ("memory", "pcie")),
        ("default,-default,nvlink", ("nvlink",)),
    ],
)
def test_selections_parse(text: str, groups: tuple[str, ...]) -> None:
    assert parse_selection(text).groups == groups


@pytest.mark.parametrize("text", ["", " , ", "default,-default", "-all"])
def test_a_selection_of_no_group_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="selects no metric group"):
        parse_selection(text)


def test_an_unknown_group_is_one_sentence() -> None:
    result = run_cli("serve", "--backend", "sim", "--metrics", "default,-pci")
    assert result.returncode != 0
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert "no metric group 'pci'" in message and "pcie" in message


def test_the_chart_passes_the_metric_groups_and_its_schema_knows_them() -> None:
    assert "--metrics=default" in render().container["args"]
    assert (
        "--metrics=default,pcie,-errors"
        in render({"metrics": ["default", "pcie", "-errors"]}).container["args"]
    )
    for refused in (["pci"], []):
        with pytest.raises(helm_python.HelmValuesError, match="metrics"):
            render({"metrics": refused})
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    pattern = schema["properties"]["metrics"]["items"]["pattern"]
    named = set(pattern.removeprefix("^-?(").removesuffix(")$").split("|"))
    assert named == {"default", "all", *BY_NAME}


ACCOUNTING_FILE = "smlens-accounting.rules.yaml"
DEFAULT_FAMILIES = {family for group in DEFAULT_GROUPS for family in BY_NAME[group].families}
FAMILY = re.compile(r"(?<![:\w])(gpu_[a-z0-9_]+?)(?:_total)?\b")


def read_families(text: str) -> set[str]:
    """The selectable families a rule or query text names (recorded series, named level:metric:op,
    are not families)."""
    return {m.group(1) for m in FAMILY.finditer(text)} & SELECTABLE


def test_the_shipped_bundle_works_at_the_default_groups() -> None:
    """Rules and alerts read only default families, the accounting rules the accounting group besides;
    a dashboard panel that reads others says which group to add."""
    for path in sorted((REPO / "rules").glob("*.rules.yaml")):
        extra = BY_NAME["accounting"].families if path.name == ACCOUNTING_FILE else frozenset()
        assert read_families(path.read_text()) <= DEFAULT_FAMILIES | extra, path.name
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            extra = read_families(json.dumps(panel.get("targets", []))) - DEFAULT_FAMILIES
            if extra:
                assert "--metrics" in panel["description"], (path.name, panel["title"], extra)
                named = {g.name for g in BY_NAME.values() if g.families & extra and not g.default}
                assert all(name in panel["description"] for name in named), (panel["title"], named)


def test_the_docs_list_each_group_as_the_code_defines_it() -> None:
    rows = re.findall(
        r"^\| `(\w+)` \| (yes|no) \| (.+?) \| .+ \|$", (REPO / "docs" / "metrics.md").read_text(), re.M
    )
    documented = {
        name: (default == "yes", set(re.findall(r"`(gpu_\w+?)(?:_total)?`", families)))
        for name, default, families in rows
    }
    assert documented == {g.name: (g.default, set(g.families)) for g in BY_NAME.values()}


def test_serving_without_the_activity_group_warns_that_the_bundle_goes_empty(
    start_exporter: ExporterFactory, tmp_path: Path
) -> None:
    start_exporter("--backend", "sim", "--metrics", "memory,pcie")
    (log,) = tmp_path.glob("exporter-*.log")
    assert "--metrics leaves out activity" in log.read_text()
