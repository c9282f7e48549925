"""The status page's server side: its self-contained files, the history ring and /api/v1/history."""

from __future__ import annotations

import gc
import re
import tracemalloc
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from smlens.exposition.rendered import Publisher
from smlens.model import Allocation, Attribution, GpuIdentity, Reading, Workload
from smlens.pipeline.attribution import build_refresher
from smlens.pipeline.sampler import Sampler
from smlens.settings import resolve
from smlens.sources.sim import PROFILES, Phase, Scenario, SimBackend, SimInstance
from smlens.verdicts import thresholds
from smlens.web.app import create_app
from smlens.web.status import history as history_module
from smlens.web.status.history import MAX_VALUES_PER_ANSWER, History

LIMITS = thresholds.load()
STATIC = Path(history_module.__file__).parent / "static"


class CountingSim(SimBackend):
    """The sim backend, counting its reads: rendering the page must cost none."""

    reads = 0

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        self.reads += 1
        return super().read(gpu, now)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def node(
    scenario: Scenario | None = None, window: float = 900.0, pods: bool = False
) -> tuple[Sampler, CountingSim, History, TestClient, Clock]:
    clock = Clock()
    sim = CountingSim(scenario or Scenario.steady(8))
    sampler = Sampler(sim, [], hostname="node-a", interval=1.0, clock=clock, wall=clock)
    gpus = sampler.open()
    if pods:
        refresher = build_refresher(resolve("serve", {"backend": "sim"}, environ={}), gpus)
        assert refresher is not None
        refresher.refresh()
        sampler.attach_attribution(refresher)
    publisher, history = Publisher(), History(LIMITS, window_seconds=window)
    sampler.subscribe(publisher.publish)
    sampler.subscribe(history.record)
    return sampler, sim, history, TestClient(create_app(publisher, LIMITS, lambda: True, history)), clock


def run(sampler: Sampler, clock: Clock, ticks: int) -> None:
    for _ in range(ticks):
        sampler.tick()
        clock.now += 1.0


def test_page_is_three_shipped_files_and_loads_nothing_from_elsewhere() -> None:
    client = TestClient(create_app(Publisher(), LIMITS, lambda: True))
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for link in ("metrics", "api/v1/gpus", "api/v1/history", "-/healthy", "-/ready"):
        assert f'href="{link}"' in page.text
    referenced = re.findall(r'(?:href|src)="([^"]+)"', page.text)
    assert sorted(r for r in referenced if r.startswith("static/")) == [
        "static/status.css",
        "static/status.js",
    ]
    for name, kind in (("status.css", "text/css"), ("status.js", "text/javascript")):
        asset = client.get("/static/" + name)
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert asset.content == (STATIC / name).read_bytes()
    missing = client.get("/static/<script>alert(1)<.js")
    assert missing.status_code == 404 and "script" not in missing.text  # a 404 never echoes the name
    for path in STATIC.iterdir():
        text = path.read_text()
        # The SVG namespace is a name, not a request; any other absolute URL would be one.
        urls = re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text)
        assert set(urls) <= {"http://www.w3.org/2000/svg"}, (path.name, urls)
        assert "@import" not in text and "url(" not in text, path.name
    assert client.get("/api/v1/history").status_code == 503  # nothing sampled yet


def test_history_agrees_with_the_api_and_answers_only_new_points() -> None:
    sampler, sim, _, client, clock = node(pods=True)
    run(sampler, clock, 5)
    full = client.get("/api/v1/history").json()
    assert full["reset"] and full["sequences"] == [1, 2, 3, 4, 5] and full["window_seconds"] == 900
    assert full["times"] == [1_800_000_000.0 + i for i in range(5)]
    api = {g["uuid"]: g for g in client.get("/api/v1/gpus").json()["gpus"]}
    for gpu in full["gpus"]:
        assert gpu["verdict"] == api[gpu["uuid"]]["verdict"]
        assert gpu["timeline"]["verdict"][-1] == gpu["verdict"]["code"]
        assert gpu["timeline"]["utilization"][0] is None  # the first tick only primes the counters
        assert gpu["timeline"]["sm_active"][-1] == pytest.approx(gpu["values"]["sm_active"], abs=1e-4)
    hollow = full["gpus"][1]
    assert hollow["verdict"]["code"] == "hollow" and hollow["verdict_since"] == full["times"][1]
    assert hollow["owners"] == [{"namespace": "ml-training", "pod": "llm-finetune-0", "container": "trainer"}]
    assert [len(g["owners"]) for g in full["gpus"]] == [1, 1, 1, 2, 1, 1, 0, 1]

    newer = client.get("/api/v1/history", params={"after": 3}).json()
    assert not newer["reset"] and newer["sequences"] == [4, 5]
    assert newer["gpus"][0]["timeline"]["utilization"] == full["gpus"][0]["timeline"]["utilization"][3:]
    assert client.get("/api/v1/history", params={"after": 5}).json()["sequences"] == []
    restarted = client.get("/api/v1/history", params={"after": 99}).json()  # the exporter restarted
    assert restarted["reset"] and restarted["sequences"] == [1, 2, 3, 4, 5]
    huge = client.get("/api/v1/history", params={"after": "9" * 5000}).json()  # past int()'s 4,300 digits
    assert huge["reset"] and huge["sequences"] == [1, 2, 3, 4, 5]
    assert client.get("/api/v1/history", params={"after": "0003"}).json()["sequences"] == [4, 5]
    for bad in ("-1", "+1", "1.5", "", "abc", "\uff11"):  # the last a fullwidth digit
        refused = client.get("/api/v1/history", params={"after": bad})
        assert (refused.status_code, refused.json()) == (
            422,
            {"error": "after must be a sequence number (digits only)"},
        ), bad

    reads = sim.reads
    for _ in range(10):
        client.get("/api/v1/history")
        client.get("/")
    assert sim.reads == reads  # rendering touches no backend


def test_history_judges_mig_instances_as_the_api_does_and_gives_reasons_in_words() -> None:
    split = Scenario(
        (
            (Phase(PROFILES["healthy"], 0.0, frozenset({"profiling"})),),
            (Phase(PROFILES["idle"], 0.0),),
            (Phase(PROFILES["idle_memory_held"], 0.0),),
        ),
        mig={
            1: (
                SimInstance("3g.71gb", PROFILES["healthy"]),
                SimInstance("1g.18gb", PROFILES["hollow"]),
                SimInstance("1g.18gb", PROFILES["idle"]),
            )
        },
    )
    sampler, sim, _, client, clock = node(split)
    run(sampler, clock, 3)
    body = client.get("/api/v1/history").json()
    api = client.get("/api/v1/gpus").json()["gpus"]
    assert [g["instances"] for g in body["gpus"]] == [g["instances"] for g in api]
    instances = api[1]["instances"]
    assert [(i["verdict"]["code"], i["memory_held"]) for i in instances] == [
        ("compute_bound", True),
        ("hollow", True),
        ("idle", False),
    ]
    assert (api[2]["verdict"]["code"], api[2]["memory_held"]) == ("idle_memory_held", True)  # a notebook's
    assert body["reasons"] == {"not_supported": "not supported by this GPU"}
    assert api[0]["profiling"]["reason"] == "not_supported"  # the API keeps the code
    reads = sim.reads
    client.get("/api/v1/history")
    assert sim.reads == reads


def test_ring_holds_the_window_and_says_since_when() -> None:
    turns_hollow = Scenario(
        (
            (Phase(PROFILES["healthy"], 0.0),),
            (Phase(PROFILES["healthy"], 30.0), Phase(PROFILES["hollow"], 1000.0)),
        )
    )
    sampler, _, history, client, clock = node(turns_hollow, window=20.0)
    run(sampler, clock, 45)
    assert history.capacity == 21
    body = client.get("/api/v1/history").json()
    assert body["sequences"] == list(range(25, 46))
    working, hollow = body["gpus"]
    assert working["verdict_since"] == body["times"][0]  # compute-bound through the whole ring
    first_hollow = hollow["timeline"]["verdict"].index("hollow")
    assert set(hollow["timeline"]["verdict"][:first_hollow]) == {"compute_bound"}
    assert set(hollow["timeline"]["verdict"][first_hollow:]) == {"hollow"}
    assert hollow["verdict_since"] == body["times"][first_hollow]
    assert 29 <= hollow["verdict_since"] - 1_800_000_000.0 <= 31
    stale = client.get("/api/v1/history", params={"after": 10}).json()  # older than the ring holds
    assert stale["reset"] and stale["sequences"] == body["sequences"]


def traced_bytes() -> int:
    """Bytes allocated by history.py and still held."""
    gc.collect()  # count only what is reachable
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, history_module.__file__)])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def test_ring_memory_is_fixed_once_allocated() -> None:
    sampler, _, history, _, clock = node(window=60.0)
    tracemalloc.start()
    try:
        run(sampler, clock, 2)
        allocated = traced_bytes()
        run(sampler, clock, 3 * history.capacity)
        full = traced_bytes()
    finally:
        tracemalloc.stop()
    assert history.capacity == 61
    expected = history.capacity * (8 + 8 + 8 * (4 * 4 + 1))  # sequence, time; 8 GPUs: 4 float32 + verdict
    assert expected <= allocated <= expected + 1024
    assert full == allocated


def test_history_answers_are_capped_and_continue_where_they_stopped() -> None:
    sampler, _, _, client, clock = node(Scenario.steady(64))
    run(sampler, clock, 300)
    pages = [client.get("/api/v1/history").json()]
    while pages[-1]["more"]:
        pages.append(client.get("/api/v1/history", params={"after": pages[-1]["sequences"][-1]}).json())
    per_page = MAX_VALUES_PER_ANSWER // 64
    assert [len(p["sequences"]) for p in pages] == [per_page] * (300 // per_page) + [300 % per_page]
    assert [s for p in pages for s in p["sequences"]] == list(range(1, 301))
    assert pages[0]["reset"] and not any(p["reset"] for p in pages[1:])
    assert all(len(g["timeline"]["verdict"]) == len(p["sequences"]) for p in pages for g in p["gpus"])


def test_a_pod_named_by_a_file_name_that_is_not_utf8_costs_only_its_bad_bytes() -> None:
    """A lone surrogate (a non-UTF-8 byte of a container log's file name) in an owner: the page's data is
    still served, with "?" for the bad byte (as on /metrics)."""
    sampler, _, history, client, clock = node(Scenario.steady(2))
    run(sampler, clock, 3)
    latest = sampler.latest
    assert latest is not None
    uuid = latest.gpus[0].identity.uuid
    held = Attribution(
        allocations=(Allocation(Workload("ml", "train\udcff", "main"), "nvidia.com/gpu", uuid, uuid),)
    )
    history.record(latest._replace(sequence=latest.sequence + 1, taken_at=clock.now, attribution=held))
    answer = client.get("/api/v1/history")
    assert answer.status_code == 200
    assert answer.json()["gpus"][0]["owners"] == [{"namespace": "ml", "pod": "train?", "container": "main"}]
