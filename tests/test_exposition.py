from __future__ import annotations

import gzip
import subprocess

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from conftest import require_tool
from smlens.exposition.live import SnapshotAge, live_registry, render_live
from smlens.exposition.rendered import ASKED_WITHIN, Publisher, Rendered
from smlens.model import Snapshot
from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend


def snapshot(ticks: int = 3) -> Snapshot:
    now = [0.0]
    sampler = Sampler(
        SimBackend(Scenario.steady(8)),
        [],
        hostname="node-a",
        interval=1.0,
        clock=lambda: now[0],
        wall=lambda: 1_700_000_000.0,
    )
    sampler.open()
    for tick in range(ticks):
        now[0] = float(tick)
        snap = sampler.tick()
    return snap


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parse_text(body)
        for s in family.samples
    }


def test_text_body_passes_promtool_check_metrics() -> None:
    promtool = require_tool("promtool")
    body = Rendered(snapshot()).answer(openmetrics=False, gzip=False, live=b"").body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == b"" and result.stderr == b""


def test_every_gpu_series_has_gpu_uuid_hostname_and_ratios_in_range() -> None:
    body = Rendered(snapshot()).answer(openmetrics=False, gzip=False, live=b"").body.decode()
    parsed = samples(body)
    gpu_series = [(name, dict(labels)) for name, labels in parsed if name.startswith("gpu_")]
    assert gpu_series
    for name, labels in gpu_series:
        assert {"gpu", "uuid", "hostname"} <= labels.keys(), name
        assert labels["hostname"] == "node-a"
    for (name, _), value in parsed.items():
        if name.endswith("_ratio"):
            assert 0.0 <= value <= 1.0, name
    hollow = {n: v for (n, labels), v in parsed.items() if ("gpu", "1") in labels}
    assert hollow["gpu_utilization_ratio"] >= 0.95 and hollow["gpu_sm_active_ratio"] <= 0.15
    assert "utilization" in body and "NOT say how" in body  # HELP warns about the time-based metric


def test_counters_are_the_integrals_and_coverage_is_their_denominator() -> None:
    parsed = samples(
        Rendered(snapshot(ticks=5)).answer(openmetrics=False, gzip=False, live=b"").body.decode()
    )
    by_gpu = {dict(labels)["gpu"]: {} for (_, labels) in parsed if "gpu" in dict(labels)}
    for (name, labels), value in parsed.items():
        if "gpu" in dict(labels):
            by_gpu[dict(labels)["gpu"]][name] = value
    healthy = by_gpu["0"]
    assert healthy["gpu_profiled_seconds_total"] == 4.0  # 5 ticks one second apart, the first primes
    assert healthy["gpu_utilization_sampled_seconds_total"] == 4.0
    assert 0.85 * 4 <= healthy["gpu_sm_active_seconds_total"] <= 4.0
    assert by_gpu["6"]["gpu_busy_seconds_total"] == 0.0  # idle: a real zero, still present


def test_openmetrics_and_gzip_bodies_parse_and_carry_the_age() -> None:
    rendered = Rendered(snapshot())
    live = live_registry(SnapshotAge(lambda: rendered.snapshot, wall=lambda: 1_700_000_002.5))
    om = rendered.answer(openmetrics=True, gzip=True, live=render_live(live, openmetrics=True))
    assert om.content_type.startswith("application/openmetrics-text")
    text = gzip.decompress(om.body).decode()
    assert text.endswith("smlens_snapshot_age_seconds 2.5\n# EOF\n") and text.count("# EOF") == 1
    assert "process_resident_memory_bytes " in text
    families = {f.name: f for f in parse_openmetrics(text)}
    assert families["gpu_busy_seconds"].type == "counter"
    tail = render_live(live, openmetrics=False)
    plain = rendered.answer(openmetrics=False, gzip=True, live=tail)
    assert gzip.decompress(plain.body) == rendered.answer(openmetrics=False, gzip=False, live=tail).body
    assert plain.content_type.startswith("text/plain; version=0.0.4")


def test_only_the_formats_scrapers_ask_for_are_rendered_and_a_new_one_from_the_next_tick() -> None:
    now = [0.0]
    publisher = Publisher(clock=lambda: now[0])
    snap = snapshot()
    publisher.publish(snap)
    rendered = publisher.current
    assert rendered is not None and rendered.text is not None and rendered.openmetrics is None
    publisher.asked(True)  # a Prometheus: it accepts the text format too, and gets it this once
    assert rendered.served(True) is False
    publisher.publish(snap)
    rendered = publisher.current  # only OpenMetrics: nobody asked for text
    assert rendered is not None and rendered.text is None and rendered.served(True) is True
    assert rendered.served(False) is True  # a text client meanwhile gets OpenMetrics, and asks for text
    publisher.asked(False)
    publisher.publish(snap)
    rendered = publisher.current
    assert rendered is not None and rendered.served(True) is True and rendered.served(False) is False
    now[0] += ASKED_WITHIN + 1  # nobody asked for text since: only OpenMetrics is rendered again
    publisher.asked(True)
    publisher.publish(snap)
    rendered = publisher.current
    assert rendered is not None and rendered.text is None
    om = rendered.answer(openmetrics=False, gzip=False, live=b"# EOF\n")
    assert om.content_type.startswith("application/openmetrics-text") and om.body.endswith(b"# EOF\n")
