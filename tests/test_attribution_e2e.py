"""The real exporter process on the sim backend, fed pods by the fake kubelet over a unix socket."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conftest import ExporterFactory, run_cli
from fakes.fake_kubelet import FakeKubelet, pod

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]
OWNER = ("namespace", "pod", "container")


def scrape(base: str) -> Series:
    text = httpx.get(base + "/metrics", timeout=5).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def rows(series: Series, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in series if n == name]


def owner_of(series: Series, metric: str, gpu: str) -> tuple[str, ...] | None:
    (labels,) = [row for row in rows(series, metric) if row["gpu"] == gpu]
    if not any(key in labels for key in OWNER):
        return None
    return tuple(labels[key] for key in OWNER)


def allocations(series: Series) -> set[tuple[str, ...]]:
    return {(r["gpu"], r["namespace"], r["pod"], r["container"]) for r in rows(series, "gpu_allocation_info")}


def up(series: Series) -> float | None:
    return series.get(("smlens_attribution_up", frozenset({("source", "podresources")})))


def eventually(base: str, check: Callable[[Series], bool], timeout: float = 10.0) -> Series:
    deadline = time.monotonic() + timeout
    while True:
        series = scrape(base)
        if check(series):
            return series
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout} s; last allocations: {allocations(series)}")
        time.sleep(0.1)


def test_metrics_follow_the_kubelet(tmp_path: Path, start_exporter: ExporterFactory) -> None:
    kubelet = FakeKubelet(tmp_path / "kubelet.sock").start()
    try:
        kubelet.set_pods(
            [
                pod("train", "llm-0", {"trainer": {"nvidia.com/gpu": ["0", "1"]}}),
                pod("ml", "embed-a", {"server": {"nvidia.com/gpu.shared": ["3::0"]}}),
                pod("ml", "embed-b", {"server": {"nvidia.com/gpu.shared": ["3::1"]}}),
            ]
        )
        base = start_exporter(
            "--backend", "sim", "--interval", "0.2", "--hostname", "node-a",
            "--pod-resources-socket", str(kubelet.socket),
            "--attribution-interval", "0.5", "--attribution-timeout", "0.4",
        )  # fmt: skip
        first = eventually(base, lambda s: up(s) == 1 and bool(allocations(s)))
        # The kubelet replaces the sim layout entirely.
        assert allocations(first) == {
            ("0", "train", "llm-0", "trainer"),
            ("1", "train", "llm-0", "trainer"),
            ("3", "ml", "embed-a", "server"),
            ("3", "ml", "embed-b", "server"),
        }
        assert owner_of(first, "gpu_sm_active_ratio", "0") == ("train", "llm-0", "trainer")
        assert owner_of(first, "gpu_up", "1") == ("train", "llm-0", "trainer")
        assert owner_of(first, "gpu_sm_active_ratio", "3") is None  # shared: no single owner
        assert owner_of(first, "gpu_sm_active_ratio", "4") is None  # unallocated
        assert ("smlens_attribution_up", frozenset({("source", "sim")})) not in first

        # Pod churn, and the plugin switching to UUID ids: gone within one refresh.
        uuid = {r["gpu"]: r["uuid"] for r in rows(first, "gpu_info")}
        kubelet.set_pods([pod("infer", "vllm-0", {"vllm": {"nvidia.com/gpu": [uuid["5"]]}})])
        churned = eventually(base, lambda s: allocations(s) == {("5", "infer", "vllm-0", "vllm")}, 5.0)
        assert owner_of(churned, "gpu_sm_active_ratio", "0") is None
        assert owner_of(churned, "gpu_sm_active_ratio", "5") == ("infer", "vllm-0", "vllm")

        # The kubelet goes away: labels dropped, GPU metrics go on.
        kubelet.stop()
        down = eventually(base, lambda s: up(s) == 0, 5.0)
        assert allocations(down) == set()
        assert owner_of(down, "gpu_sm_active_ratio", "5") is None
        assert all(v == 1 for (name, _), v in down.items() if name == "gpu_up")
        taken = down[("smlens_snapshot_timestamp_seconds", frozenset())]
        later = eventually(base, lambda s: s[("smlens_snapshot_timestamp_seconds", frozenset())] > taken)
        assert up(later) == 0

        # It comes back on a new socket file, as after a kubelet restart.
        kubelet.start()
        back = eventually(base, lambda s: up(s) == 1 and bool(allocations(s)), 5.0)
        assert allocations(back) == {("5", "infer", "vllm-0", "vllm")}
    finally:
        kubelet.stop()


def test_sim_layout_file_and_label_switch(tmp_path: Path, start_exporter: ExporterFactory) -> None:
    layout = tmp_path / "pods.yaml"
    layout.write_text("pods:\n  - {namespace: demo, pod: only-one, container: main, gpus: [1]}\n")
    base = start_exporter(
        "--backend", "sim", "--sim-gpus", "2", "--sim-pods", str(layout), "--no-workload-labels"
    )
    series = eventually(base, lambda s: bool(allocations(s)))
    assert allocations(series) == {("1", "demo", "only-one", "main")}
    assert owner_of(series, "gpu_sm_active_ratio", "1") is None  # switched off
    assert series[("smlens_attribution_up", frozenset({("source", "sim")}))] == 1


def test_bad_attribution_settings_get_one_sentence(tmp_path: Path) -> None:
    bad_layout = tmp_path / "pods.yaml"
    bad_layout.write_text("pods:\n  - {namespace: a, pod: b, container: c, gpus: [9]}\n")
    cases = [
        (["--backend", "sim", "--process-attribution"], "--process-attribution"),
        (["--backend", "sim", "--sim-pods", str(bad_layout)], "lists GPU 9"),
        (["--backend", "sim", "--attribution-interval", "2", "--attribution-timeout", "3"], "shorter than"),
        (["--backend", "sim", "--gpu-resource-names", " , "], "at least one name"),
    ]
    for args, words in cases:
        result = run_cli("serve", "--listen", "127.0.0.1:1", *args, timeout=30)
        assert result.returncode != 0, args
        assert words in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("smlens: "), result.stderr


def test_a_bad_layout_file_is_refused_before_the_port_is_bound(tmp_path: Path) -> None:
    bad_layout = tmp_path / "pods.yaml"
    bad_layout.write_text("pods: 3\n")
    with socket.socket() as taken:  # a port in use: a bind before the read would fail on it first
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "serve",
            "--backend",
            "sim",
            "--listen",
            f"127.0.0.1:{port}",
            "--sim-pods",
            str(bad_layout),
            timeout=30,
        )
    assert result.returncode == 1
    assert (
        result.stderr == f"smlens: sim pod layout {bad_layout} needs a list under 'pods' (it may be empty).\n"
    )
