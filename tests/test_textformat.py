"""smlens writes /metrics itself: the bytes must be prometheus_client's, in both formats.

prometheus_client is the oracle here (and only in tests): the same families built with its
``GaugeMetricFamily``/``CounterMetricFamily`` and written by its ``generate_latest`` (text 0.0.4 and
OpenMetrics 1.0.0) must give the bytes smlens' families and :func:`smlens.textformat.render` give.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import prometheus_client.core as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString

from smlens.attribution.podnames import PodNames
from smlens.attribution.refresher import PODRESOURCES, PROCESSES
from smlens.sources.sim import load_scenario
from smlens.exposition.collector import SnapshotCollector
from smlens.exposition.rendered import Exposition
from smlens.metricfamily import CounterMetricFamily, GaugeMetricFamily, Metric
from smlens.model import Allocation, Attribution, Snapshot, SourceState, Workload, WorkloadUsage
from smlens.web.stats import ServingStats
from smlens.textformat import OPENMETRICS_EOF, format_value, render
from test_golden import sampled
from test_lean_imports import loaded


@dataclass(frozen=True)
class Spec:
    counter: bool
    name: str
    help: str
    labels: tuple[str, ...] | None  # None: one unlabelled value
    rows: tuple[tuple[tuple[str, ...], float], ...]


class Families:
    """What prometheus_client's renderers take: anything with ``collect()``."""

    def __init__(self, families: Sequence[Any]) -> None:
        self.families = families

    def collect(self) -> Sequence[Any]:
        return self.families


def build(spec: Spec, gauge: type[Any], counter: type[Any]) -> Any:
    kind = counter if spec.counter else gauge
    if spec.labels is None:
        return kind(spec.name, spec.help, value=spec.rows[0][1]) if spec.rows else kind(spec.name, spec.help)
    family = kind(spec.name, spec.help, labels=list(spec.labels))
    for values, value in spec.rows:
        family.add_metric(list(values), value)
    return family


def oracle(families: Sequence[Any], openmetrics_format: bool) -> bytes:
    if openmetrics_format:
        rendered: bytes = openmetrics.generate_latest(Families(families))  # type: ignore[no-untyped-call]
        return rendered
    return generate_latest(Families(families))  # type: ignore[arg-type]


def ours(families: Iterable[Metric], openmetrics_format: bool) -> bytes:
    return render(families, openmetrics_format) + (OPENMETRICS_EOF if openmetrics_format else b"")


NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}(_total)?", fullmatch=True).filter(
    lambda name: name.removesuffix("_total") != ""
)
LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda name: not name.startswith("__")
)
# Text with the characters either format escapes, unicode, and what neither escapes (\r, \t, quotes).
TEXT = st.one_of(st.text(), st.text(alphabet=st.sampled_from(list('\\"\n\r\t aé€😀{}=,#'))))
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.sampled_from([0.0, -0.0, 1e6, 999999.0, 1e15, 1e16, 1.5e16, 1234567.891, 1e-7, 5e-324, 1.8e308]),
    st.floats(min_value=1e5, max_value=1e17),
)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    counter = draw(st.booleans())
    name = draw(NAMES)
    labels = draw(st.none() | st.lists(LABEL_NAMES, max_size=4, unique=True).map(tuple))
    if labels is None:
        rows: tuple[tuple[tuple[str, ...], float], ...] = tuple(
            ((), v) for v in draw(st.lists(VALUES, max_size=1))
        )
    else:
        row = st.tuples(st.tuples(*(TEXT for _ in labels)), VALUES)
        rows = tuple(draw(st.lists(row, max_size=4)))
    return Spec(counter, name, draw(TEXT), labels, rows)


@settings(max_examples=400, deadline=None)
@given(st.lists(specs(), max_size=5), st.booleans())
def test_any_gauges_and_counters_render_as_prometheus_client_renders_them(
    family_specs: list[Spec], openmetrics_format: bool
) -> None:
    expected = oracle(
        [build(s, pc.GaugeMetricFamily, pc.CounterMetricFamily) for s in family_specs], openmetrics_format
    )
    built = [build(s, GaugeMetricFamily, CounterMetricFamily) for s in family_specs]
    assert ours(built, openmetrics_format) == expected


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (0, "0.0"),
        (-0.0, "-0.0"),
        (1, "1.0"),
        (0.25, "0.25"),
        (999999.0, "999999.0"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (1000000.5, "1.0000005e+06"),
        (12000000.0, "1.2e+07"),
        (9007199254740993, "9.007199254740992e+15"),
        (1e16, "1e+16"),
        (1.5e16, "1.5e+16"),
        (-1234567.0, "-1234567.0"),  # Go's form only for positive values, as prometheus_client
        (1e-7, "1e-07"),
        (5e-324, "5e-324"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_values_are_written_as_prometheus_client_writes_them(value: float, written: str) -> None:
    assert format_value(value) == written == floatToGoString(value)


def test_escaping_differs_between_the_formats_where_prometheus_client_differs() -> None:
    family = GaugeMetricFamily("g", 'say "a\\b"\nthen c', labels=["l"])
    family.add_metric(['x"y\\z\nw'], 1)
    assert render([family], openmetrics=False) == (
        b'# HELP g say "a\\\\b"\\nthen c\n# TYPE g gauge\ng{l="x\\"y\\\\z\\nw"} 1.0\n'
    )
    assert render([family], openmetrics=True).startswith(b'# HELP g say \\"a\\\\b\\"\\nthen c\n')


def test_a_counter_is_named_with_total_in_text_and_without_in_openmetrics() -> None:
    for name in ("jobs", "jobs_total"):
        family = CounterMetricFamily(name, "Jobs.", value=3)
        assert (
            render([family], openmetrics=False)
            == b"# HELP jobs_total Jobs.\n# TYPE jobs_total counter\njobs_total 3.0\n"
        )
        assert (
            render([family], openmetrics=True) == b"# HELP jobs Jobs.\n# TYPE jobs counter\njobs_total 3.0\n"
        )


@pytest.mark.parametrize("name", ["", "1x", "a-b", "a:b", "gpu_é", "a b"])
def test_names_either_format_would_have_to_escape_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid metric name"):
        GaugeMetricFamily(name, "x")
    with pytest.raises(ValueError, match="invalid label name"):
        GaugeMetricFamily("g", "x", labels=["ok", name or "__reserved"])
    with pytest.raises(ValueError, match="invalid metric name"):
        CounterMetricFamily("_total", "x")  # nothing left of the name once _total is taken off


def test_label_values_must_match_the_label_names() -> None:
    family = GaugeMetricFamily("g", "x", labels=["a", "b"])
    with pytest.raises(ValueError):
        family.add_metric(["only a"], 1)
    with pytest.raises(ValueError, match="either one value or label names"):
        GaugeMetricFamily("g", "x", value=1, labels=["a"])


def as_prometheus_client(family: Metric) -> pc.Metric:
    """The same family as a prometheus_client Metric, sample for sample."""
    converted = pc.Metric(family.name, family.documentation, family.type)
    for sample in family.samples:
        converted.add_sample(sample.name, dict(sample.labels), sample.value)
    return converted


def snapshot(tmp_path: Path) -> Snapshot:
    """A sim node with a GPU in MIG mode, unreadable values, and every attribution family: pods on a whole
    GPU and on a MIG instance (owner labels), a shared GPU, per-workload usage, both sources."""
    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        "gpus:\n  - healthy\n  - hollow\n"
        "  - mig: [{mig_profile: 3g.71gb, profile: healthy}, {mig_profile: 1g.18gb, profile: hollow}]\n"
        "  - {profile: idle, unreadable: [power_watts, profiling]}\n"
    )
    taken = sampled(load_scenario(scenario), hostname='node "a"\\b')
    u = [gpu.identity.uuid for gpu in taken.gpus]
    a, b = Workload("ml", "a", "main"), Workload("ml", "b\n", "side")
    attribution = Attribution(
        allocations=(
            Allocation(a, "nvidia.com/gpu", u[0], u[0]),
            Allocation(a, "nvidia.com/gpu.shared", f"{u[1]}::0", u[1]),
            Allocation(b, "nvidia.com/gpu.shared", f"{u[1]}::1", u[1]),
            Allocation(b, "nvidia.com/mig-1g.18gb", "MIG-x", u[2], partition=True, gpu_instance=2),
            Allocation(b, "nvidia.com/mig-1g.18gb", "MIG-unknown", None, partition=True),
        ),
        workloads=(
            WorkloadUsage(u[0], a, 2, 3e9, 0.5),
            WorkloadUsage(u[3], Workload(slurm_job="7"), 1, None, 0.0),
        ),
        sources=(SourceState(PODRESOURCES, True, refresh_seconds=0.01), SourceState(PROCESSES, False)),
        refreshed_at=1_800_000_003.5,
    )
    return taken._replace(attribution=attribution)


@pytest.mark.parametrize("openmetrics_format", [False, True])
def test_a_whole_node_renders_as_main_rendered_it_with_prometheus_client(
    tmp_path: Path, openmetrics_format: bool
) -> None:
    families = list(SnapshotCollector(snapshot(tmp_path)).collect())
    names = {family.name for family in families}
    assert {
        "gpu_mig_sm_active_ratio",
        "gpu_allocation_info",
        "gpu_workload_processes",
        "gpu_xid_errors",
    } <= names
    assert any("pod" in s.labels and "gpu_instance" in s.labels for f in families for s in f.samples)
    stats = ServingStats(open_connections=2, malformed_requests=1)
    stats.closed["idle_timeout"] += 3
    families += stats.collect()
    expected = oracle([as_prometheus_client(f) for f in families], openmetrics_format)
    assert ours(families, openmetrics_format) == expected


def test_no_smlens_module_imports_prometheus_client() -> None:
    """Every module, not only serve's (tests/test_lean_imports.py): check, profile, the bundle generator,
    every backend and attribution source."""
    every_module = (
        "import pkgutil, smlens\n"
        "for found in pkgutil.walk_packages(smlens.__path__, 'smlens.'):\n"
        "    if not found.name.endswith('__main__'):\n"
        "        __import__(found.name)\n"
    )
    assert loaded(
        every_module, ("prometheus_client", "smlens.profile.cupti_session", "smlens.bundle.rules")
    ) == [
        "smlens.bundle.rules",
        "smlens.profile.cupti_session",
    ]


def test_a_pod_named_by_a_file_name_that_is_not_utf8_costs_only_its_bad_bytes(tmp_path: Path) -> None:
    """os.listdir gives a lone surrogate for a byte that is not UTF-8; /metrics must still be served, in
    both formats, from the pod-name scan through the collector and the exposition a scrape reads."""
    (tmp_path / "containers").mkdir()
    (tmp_path / "pods").mkdir()
    log = os.path.join(os.fsencode(tmp_path / "containers"), b"train\xff_ml_main-0123456789ab.log")
    open(log, "wb").close()
    workload = PodNames.scan(tmp_path).containers["0123456789ab"]
    node = snapshot(tmp_path)
    uuid = node.gpus[0].identity.uuid
    held = replace(node.attribution, allocations=(Allocation(workload, "nvidia.com/gpu", uuid, uuid),))
    exposition = Exposition(node._replace(attribution=held))
    for om in (False, True):
        body = exposition.respond(openmetrics=om, gzip=False).body.decode("utf-8")
        assert 'pod="train?"' in body
        assert "gpu_sm_active_ratio{" in body
