"""Backend health where users meet it: /metrics of a node whose GPU 0 fails its GPM reads every tick
while GPU 1 is fine (fake pynvml), and the exporter log."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from fakes.fake_pynvml import FakeGpu, install
from smlens.exposition.rendered import Publisher
from smlens.pipeline.build import build_sampler
from smlens.settings import resolve
from smlens.verdicts import thresholds
from smlens.web.app import create_app

BAD, GOOD = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def test_a_backend_failing_on_one_gpu_is_down_at_metrics_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = install(monkeypatch, FakeGpu(BAD), FakeGpu(GOOD))
    node.gpu(BAD).errors["nvmlGpmSampleGet"] = node.module.NVML_ERROR_UNKNOWN
    sampler = build_sampler(resolve("check", {"backend": "auto"}, environ={}))
    publisher = Publisher()
    sampler.subscribe(publisher.publish)
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(5):
                node.advance(1.0)
                sampler.tick()
    finally:
        sampler.close()
    text = TestClient(create_app(publisher, thresholds.load(), lambda: True)).get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("smlens_backend_up", (("backend", "gpm"),))] == 0
    assert samples[("smlens_backend_up", (("backend", "nvml"),))] == 1
    assert samples[("smlens_backend_errors_total", (("backend", "gpm"), ("reason", "unknown")))] == 5
    available = {
        dict(labels)["gpu"]: value
        for (name, labels), value in samples.items()
        if name == "gpu_profiling_available"
    }
    assert available == {"0": 0, "1": 1}
    down = [r.getMessage() for r in caplog.records if "backend gpm" in r.getMessage()]
    assert len(down) == 1 and down[0].startswith(f"backend gpm is down: GPU 0 ({BAD}): GPM sample")
