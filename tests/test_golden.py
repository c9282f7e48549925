"""Golden-file test of the whole exposition for a fixed simulated node (node_exporter style).

Regenerate after an intended change with ``SMLENS_UPDATE_GOLDEN=1 python3 -m pytest tests/test_golden.py``
and review the diff.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from smlens.exposition.live import SnapshotAge, render_live
from smlens.exposition.rendered import Rendered
from smlens.exposition.selection import DEFAULT_SELECTION, EVERYTHING, Selection
from smlens.model import Snapshot
from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend, load_scenario

GOLDEN_DIR = Path(__file__).parent / "golden"
# The steady 8-GPU node at the default metric groups and at all of them, and a node with unreadable
# values: a GPU without profiling, one without power, one lost after 2 s (absent series must stay
# absent, never turn into zeros).
SCENARIOS: dict[str, tuple[Callable[[], Scenario], Selection]] = {
    "sim_8gpu.prom": (lambda: Scenario.steady(8), DEFAULT_SELECTION),
    "sim_8gpu_all_groups.prom": (lambda: Scenario.steady(8), EVERYTHING),
    "sim_unreadable.prom": (
        lambda: load_scenario(Path(__file__).parent / "fixtures" / "scenarios" / "unreadable.yaml"),
        EVERYTHING,
    ),
}
VOLATILE = (
    "smlens_build_info{",
    "smlens_tick_duration_seconds ",
    "smlens_sampler_cpu_seconds_total ",
    "smlens_backend_last_sample_duration_seconds{",
    "smlens_backend_sample_seconds_total{",
)


def sampled(scenario: Scenario, hostname: str = "golden-node") -> Snapshot:
    """The snapshot after four ticks, one second apart on fixed clocks."""
    now = [0.0]
    sampler = Sampler(
        SimBackend(scenario, seed=42),
        [],
        hostname=hostname,
        interval=1.0,
        clock=lambda: now[0],
        wall=lambda: 1_800_000_000.0 + now[0],
    )
    sampler.open()
    for tick in range(4):
        now[0] = float(tick)
        snapshot = sampler.tick()
    return snapshot


def render(scenario: Scenario, selection: Selection = DEFAULT_SELECTION) -> str:
    snapshot = sampled(scenario)
    live = CollectorRegistry(auto_describe=False)
    live.register(SnapshotAge(lambda: snapshot, wall=lambda: 1_800_000_004.0))
    tail = render_live(live, openmetrics=False)
    rendered = Rendered(snapshot, selection=selection)
    text = rendered.answer(openmetrics=False, gzip=False, live=tail).body.decode()
    # Timing and runtime-version values differ per machine: keep the series, blank the value.
    return "".join(
        (line.rsplit(" ", 1)[0] + " <volatile>\n") if line.startswith(VOLATILE) else line + "\n"
        for line in text.splitlines()
    )


@pytest.mark.parametrize("name", SCENARIOS)
def test_exposition_matches_golden_file(name: str) -> None:
    scenario, selection = SCENARIOS[name]
    rendered = render(scenario(), selection)
    golden = GOLDEN_DIR / name
    if os.environ.get("SMLENS_UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text()
