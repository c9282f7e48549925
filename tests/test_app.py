from __future__ import annotations

import gzip
import time
from collections.abc import Callable

from starlette.testclient import TestClient

from smlens.exposition.rendered import Publisher
from smlens.model import Snapshot
from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend
from smlens.verdicts import thresholds
from smlens.web.app import create_app


def sampled(ticks: int = 3) -> Snapshot:
    sampler = Sampler(SimBackend(Scenario.steady(8)), [], hostname="node-a", interval=1.0)
    sampler.open()
    for _ in range(ticks):
        snap = sampler.tick()
    return snap


def client(publisher: Publisher, alive: bool = True, wall: Callable[[], float] = time.time) -> TestClient:
    return TestClient(create_app(publisher, thresholds.load(), lambda: alive, wall=wall))


def test_not_ready_and_503_until_a_first_sample() -> None:
    c = client(Publisher())
    assert c.get("/-/healthy").status_code == 200
    ready = c.get("/-/ready")
    assert ready.status_code == 503 and "no complete sample" in ready.text
    assert c.get("/metrics").status_code == 503
    assert c.get("/api/v1/gpus").status_code == 503


def test_ready_turns_false_when_the_snapshot_goes_stale() -> None:
    publisher = Publisher()
    publisher.publish(sampled())
    assert publisher.current is not None
    now = [publisher.current.snapshot.taken_at]
    c = client(publisher, wall=lambda: now[0])
    assert c.get("/-/ready").status_code == 200
    now[0] += 60
    stale = c.get("/-/ready")
    assert stale.status_code == 503 and "sampling stalled" in stale.text


def test_healthy_fails_when_the_sampler_thread_died() -> None:
    assert client(Publisher(), alive=False).get("/-/healthy").status_code == 503


def test_metrics_negotiates_openmetrics_and_gzip() -> None:
    publisher = Publisher()
    publisher.publish(sampled())
    c = client(publisher)
    plain = c.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "gpu_sm_active_ratio{" in plain.text
    accept = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"}
    first = c.get("/metrics", headers=accept)  # not rendered yet: the text format, which it accepts
    assert first.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert publisher.current is not None
    publisher.publish(publisher.current.snapshot)  # the next tick renders what was asked
    om = c.get("/metrics", headers=accept)
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    raw = c.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip"
    refused = c.get("/metrics", headers={"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in refused.headers
    assert gzip.compress(b"") and "gpu_up{" in raw.text  # httpx decoded the gzip body


def test_api_lists_gpus_with_verdicts_and_filters() -> None:
    publisher = Publisher()
    publisher.publish(sampled())
    c = client(publisher)
    body = c.get("/api/v1/gpus").json()
    assert body["hostname"] == "node-a" and len(body["gpus"]) == 8
    verdicts = [g["verdict"]["code"] for g in body["gpus"]]
    assert verdicts == [
        "compute_bound",
        "hollow",
        "hollow",
        "stalled",
        "memory_bound",
        "partial",
        "idle",
        "idle_memory_held",
    ]
    assert body["gpus"][0]["verdict"]["pipe"] == "tensor"
    one = c.get("/api/v1/gpus", params={"gpu": body["gpus"][2]["uuid"]}).json()["gpus"]
    assert [g["index"] for g in one] == [2]
    missing = c.get("/api/v1/gpus", params={"gpu": "99"})
    assert missing.status_code == 404 and "no GPU with index or uuid '99'" in missing.json()["error"]


def test_unknown_paths_and_methods_keep_their_json_bodies() -> None:
    c = client(Publisher())
    missing = c.get("/nowhere")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    wrong = c.post("/metrics")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    assert set(wrong.headers["allow"].split(", ")) == {"GET", "HEAD"}
