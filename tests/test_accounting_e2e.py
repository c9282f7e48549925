"""A real Prometheus scrapes the sim exporter with the accounting group, and a kube-state-metrics stand-in
(a static page of its owner series), with smlens' recording, accounting and price rules loaded: owners are
resolved where users meet them, and the Waste and cost dashboard answers.

The sim node's default pods (smlens.attribution.sim_layout): GPU 0 llm-pretrain-0, 1 llm-finetune-0,
2 spin-wait-debug, 3 embedder-a and embedder-b (shared), 4 vllm-70b-0, 5 triton-small-batch-0,
7 notebook-bob; GPU 6 is held by nobody.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import REPO, ExporterFactory
from promstack import has_data_soon, panel_queries, prometheus, query, require_any, substitute, wait_for
from smlens.bundle import accounting, rules
from smlens.verdicts import thresholds

MODEL = "NVIDIA H200 (simulated)"
PRICE = 3.6  # per GPU-hour
T = thresholds.load().with_overrides({"prices": {"currency": "EUR", "gpu_hour": {MODEL: PRICE}}}, "test")


def _owner(series: str, namespace: str, owned: tuple[str, str], kind: str, name: str) -> str:
    label, value = owned
    controller = "false" if kind == "<none>" else "true"
    return (
        f'{series}{{namespace="{namespace}",{label}="{value}",owner_kind="{kind}",owner_name="{name}",'
        f'owner_is_controller="{controller}"}} 1'
    )


POD, REPLICASET, JOB = "kube_pod_owner", "kube_replicaset_owner", "kube_job_owner"
KSM = "\n".join(
    [
        _owner(POD, "ml-training", ("pod", "llm-pretrain-0"), "Job", "llm-pretrain-r0"),
        _owner(POD, "ml-training", ("pod", "llm-finetune-0"), "PyTorchJob", "finetune"),
        _owner(POD, "ml-inference", ("pod", "embedder-a"), "ReplicaSet", "embedder-5d8c"),
        _owner(POD, "ml-inference", ("pod", "embedder-b"), "ReplicaSet", "embedder-5d8c"),
        _owner(POD, "ml-inference", ("pod", "vllm-70b-0"), "StatefulSet", "vllm-70b"),
        _owner(POD, "research", ("pod", "notebook-bob"), "<none>", "<none>"),
        _owner(REPLICASET, "ml-inference", ("replicaset", "embedder-5d8c"), "Deployment", "embedder"),
        _owner(JOB, "ml-training", ("job_name", "llm-pretrain-r0"), "JobSet", "llm-pretrain"),
        "",
    ]
)
# Grafana's builtins for a 10-minute range at a 1 s step: the sim's history is seconds long.
BUILTINS = {"__rate_interval": "5s", "__interval": "1s", "__interval_ms": "1000", "__range": "10m"}
# (namespace, owner_kind, owner_name) -> the verdict of its GPU in the sim's default scenario.
OWNERS = {
    ("ml-training", "JobSet", "llm-pretrain"): "compute_bound",
    ("ml-training", "PyTorchJob", "finetune"): "hollow",
    ("research", "Pod", "spin-wait-debug"): "hollow",
    ("ml-inference", "Deployment", "embedder"): "stalled",
    ("ml-inference", "StatefulSet", "vllm-70b"): "memory_bound",
    ("ml-inference", "Pod", "triton-small-batch-0"): "partial",
    ("research", "Pod", "notebook-bob"): "idle_memory_held",
    ("", "", ""): "idle",
}


@contextmanager
def static_page(text: str) -> Iterator[str]:
    """host:port of a loopback server that answers every GET with ``text``, as an exporter would."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _rule_files(tmp_path: Path, names: tuple[str, ...]) -> list[Path]:
    folder = tmp_path / "bundle"
    folder.mkdir(exist_ok=True)
    paths = []
    for name, text in rules.rule_files(T).items():
        if name in names:
            (folder / name).write_text(text)
            paths.append(folder / name)
    return paths


@pytest.fixture
def stack(start_exporter: ExporterFactory, tmp_path: Path) -> Iterator[str]:
    require_any("prometheus")
    exporter = start_exporter("--backend", "sim", "--interval", "0.5", "--metrics", "default,accounting")
    files = _rule_files(tmp_path, (rules.RECORDING_FILE, rules.ACCOUNTING_FILE, rules.PRICES_FILE))
    with static_page(KSM) as ksm:
        targets = {"smlens": exporter.removeprefix("http://"), "kube-state-metrics": ksm}
        with prometheus(tmp_path, targets, files) as base:
            fleet = accounting.name("fleet", accounting.COST, T.window)
            wait_for("the accounting layers", lambda: bool(query(base, fleet)), timeout=60)
            wait_for("all eight owners", lambda: len(query(base, _owners())) == len(OWNERS), timeout=60)
            yield base


def _owners() -> str:
    return accounting.name("owner", accounting.SECONDS, T.window)


def _key(metric: dict[str, str]) -> tuple[str, str, str]:
    return (metric.get("namespace", ""), metric.get("owner_kind", ""), metric.get("owner_name", ""))


def test_owners_are_resolved_through_kube_state_metrics_with_the_pod_as_fallback(stack: str) -> None:
    found = {_key(s["metric"]): s["metric"]["verdict"] for s in query(stack, _owners())}
    assert found == OWNERS
    # Each owner holds one GPU (embedder's two pods share GPU 3): at one evaluation their rates match,
    # and the fleet's GPU-seconds per second are the sum of the eight.
    rates = [float(s["value"][1]) for s in query(stack, _owners())]
    assert max(rates) <= min(rates) * 1.05, rates
    [fleet] = query(stack, f"sum({accounting.name('fleet', accounting.SECONDS, T.window)})")
    assert float(fleet["value"][1]) == pytest.approx(sum(rates), rel=0.05)


def test_cost_is_gpu_seconds_at_the_price_of_the_model(stack: str) -> None:
    cost = accounting.name("owner", accounting.COST, T.window)
    expr = f"{cost} / on (namespace, owner_kind, owner_name, verdict, model) group_left () {_owners()}"
    ratios = query(stack, expr)
    assert len(ratios) == len(OWNERS)
    assert {s["metric"]["currency"] for s in ratios} == {"EUR"}
    assert all(float(s["value"][1]) == pytest.approx(PRICE / 3600) for s in ratios)


def test_every_waste_dashboard_query_answers(stack: str) -> None:
    model = json.loads((REPO / "dashboards" / "smlens-waste.json").read_text())
    values = {"cluster": ".*", "namespace": ".*"}
    a_week_back = {"The 7 days before"}  # the sim's history is minutes long
    not_judged = 'verdict=~"no_profiling|unknown|down"'  # the default sim node judges every GPU
    empty = []
    for title, expr in panel_queries(model):
        if title in a_week_back or "offset 7d" in expr or not_judged in expr:
            continue
        if not has_data_soon(stack, substitute(expr, values, BUILTINS), timeout=15.0):
            empty.append(f"{title}: {expr}")
    assert not empty, "queries without data:\n" + "\n".join(empty)
    columns = [(t, e) for t, e in panel_queries(model) if not_judged in e]
    assert len(columns) == 4
    for title, expr in columns:
        assert query(stack, substitute(expr, values, BUILTINS)) == [], title
    (strip,) = [p for p in model["panels"] if p["title"] == "Recording rules"]
    [sample] = query(stack, substitute(strip["targets"][0]["expr"], values, BUILTINS))
    assert sample["value"][1] == "1"


@pytest.mark.parametrize(("groups", "state"), [("default,accounting", "0"), ("default", "-1")])
def test_the_strip_says_what_is_missing(
    start_exporter: ExporterFactory, tmp_path: Path, groups: str, state: str
) -> None:
    """Without the accounting rules, the strip says so; without the accounting group, it says that."""
    require_any("prometheus")
    exporter = start_exporter("--backend", "sim", "--interval", "0.5", "--metrics", groups)
    model = json.loads((REPO / "dashboards" / "smlens-waste.json").read_text())
    (strip,) = [p for p in model["panels"] if p["title"] == "Recording rules"]
    with prometheus(tmp_path, {"smlens": exporter.removeprefix("http://")}, []) as base:
        wait_for("the GPUs scraped", lambda: len(query(base, "gpu_up")) == 8)
        [sample] = query(base, substitute(strip["targets"][0]["expr"], {"cluster": ".*"}))
        assert sample["value"][1] == state
        text = strip["fieldConfig"]["defaults"]["mappings"][0]["options"][state]["text"]
        assert ("NOT LOADED" if state == "0" else "NOT EXPORTED") in text and text.count("accounting")
        for title, expr in panel_queries(model):
            if title != "Recording rules":
                assert query(base, substitute(expr, {"cluster": ".*", "namespace": ".*"})) == [], title
