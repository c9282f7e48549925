"""dcgm-exporter's series, scraped by a real Prometheus, land in smlens' recorded layers.

Two nodes, one per generation of dcgm-exporter's names. gpu-node-1 serves the exposition of
4.5.3-4.8.2, following its template (NVIDIA/dcgm-exporter internal/pkg/rendermetrics/render_metrics.go
at tag 4.5.3-4.8.2: gpu, UUID, pci_bus_id, device, modelName, GPU_I_PROFILE/GPU_I_ID on MIG instances,
Hostname, then the label-type fields and pod labels), with the fields of its etc/dcp-metrics-included.csv
plus DCGM_FI_PROF_SM_ACTIVE and DCGM_FI_PROF_SM_OCCUPANCY, which that file ships commented out and users
turn on. gpu-node-2 serves the same fields as 4.10.0 names them: the template with ``hostname``
(released in 4.8.3), the 4.9.0 names (DCGM 4.7's) with utilization as a ratio, framebuffer
memory in bytes and the DCGM_FI_SYSTEM_DRIVER_VERSION label, and 4.10.0's PCIe rates. On each node
GPU 1 is in MIG mode: dcgm-exporter (default device option "f") exports its GPU instance only.

The node and GPU dashboards are read against the same Prometheus: every panel either shows the
dcgm-exporter GPU (from the series the mapping records) or says that it needs smlens.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from conftest import REPO
from promstack import generate_rules, prometheus, query, substitute, wait_for
from smlens.bundle import dashboards

GPU0 = (
    'gpu="0",UUID="GPU-5d4a3c1e-0000-0000-0000-000000000000",pci_bus_id="00000000:07:00.0",'
    'device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dcgm-exporter-x7k2p",'
    'DCGM_FI_DRIVER_VERSION="550.54.15",namespace="ml",pod="train-0",container="main"'
)
MIG = (
    'gpu="1",UUID="GPU-5d4a3c1e-1111-0000-0000-000000000000",pci_bus_id="00000000:0F:00.0",'
    'device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="1g.10gb",GPU_I_ID="3",'
    'Hostname="dcgm-exporter-x7k2p"'
)
EXPOSITION = f"""# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{GPU0}}} 96
DCGM_FI_DEV_GPU_UTIL{{{MIG}}} 50
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{MIG}}} 4096
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{{{GPU0}}} 0.120000
DCGM_FI_PROF_SM_ACTIVE{{{MIG}}} 0.050000
# HELP DCGM_FI_PROF_SM_OCCUPANCY The ratio of number of warps resident on an SM.
# TYPE DCGM_FI_PROF_SM_OCCUPANCY gauge
DCGM_FI_PROF_SM_OCCUPANCY{{{GPU0}}} 0.040000
# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.
# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{GPU0}}} 0.010000
# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active.
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{{{GPU0}}} 0.200000
"""
NEW_GPU0 = (
    'gpu="0",UUID="GPU-7e2b9d40-0000-0000-0000-000000000000",pci_bus_id="00000000:1B:00.0",'
    'device="nvidia0",modelName="NVIDIA H200",hostname="dcgm-exporter-q9w2z",'
    'DCGM_FI_SYSTEM_DRIVER_VERSION="580.65.06",container="vllm",namespace="llm",pod="serve-0"'
)
NEW_MIG = (
    'gpu="1",UUID="GPU-7e2b9d40-1111-0000-0000-000000000000",pci_bus_id="00000000:2B:00.0",'
    'device="nvidia1",modelName="NVIDIA H200",GPU_I_PROFILE="1g.18gb",GPU_I_ID="5",'
    'hostname="dcgm-exporter-q9w2z",DCGM_FI_SYSTEM_DRIVER_VERSION="580.65.06"'
)
# Help texts are this test's; the mapping reads names, values and labels only.
NEW_EXPOSITION = f"""# HELP DCGM_FI_DEV_GPU_UTIL_RATIO GPU utilization (ratio).
# TYPE DCGM_FI_DEV_GPU_UTIL_RATIO gauge
DCGM_FI_DEV_GPU_UTIL_RATIO{{{NEW_GPU0}}} 0.5
# HELP DCGM_FI_DEV_FB_USED_BYTES Framebuffer memory used (in bytes).
# TYPE DCGM_FI_DEV_FB_USED_BYTES gauge
DCGM_FI_DEV_FB_USED_BYTES{{{NEW_MIG}}} 2147483648
# HELP DCGM_FI_PROF_SM_UTIL_RATIO The ratio of cycles an SM has at least 1 warp assigned.
# TYPE DCGM_FI_PROF_SM_UTIL_RATIO gauge
DCGM_FI_PROF_SM_UTIL_RATIO{{{NEW_GPU0}}} 0.250000
DCGM_FI_PROF_SM_UTIL_RATIO{{{NEW_MIG}}} 0.750000
# HELP DCGM_FI_PROF_SM_OCCUPANCY_RATIO The ratio of number of warps resident on an SM.
# TYPE DCGM_FI_PROF_SM_OCCUPANCY_RATIO gauge
DCGM_FI_PROF_SM_OCCUPANCY_RATIO{{{NEW_GPU0}}} 0.125000
# HELP DCGM_FI_PROF_TENSOR_UTIL_RATIO The ratio of cycles any tensor pipe is active.
# TYPE DCGM_FI_PROF_TENSOR_UTIL_RATIO gauge
DCGM_FI_PROF_TENSOR_UTIL_RATIO{{{NEW_GPU0}}} 0.062500
# HELP DCGM_FI_PROF_DRAM_UTIL_RATIO The ratio of cycles the device memory interface is active.
# TYPE DCGM_FI_PROF_DRAM_UTIL_RATIO gauge
DCGM_FI_PROF_DRAM_UTIL_RATIO{{{NEW_GPU0}}} 0.375000
# HELP DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND The rate of data transmitted over the PCIe bus.
# TYPE DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND gauge
DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND{{{NEW_GPU0}}} 2500000000
"""


@contextmanager
def dcgm_exporter(exposition: str = EXPOSITION) -> Iterator[str]:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exposition.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus base URL, once both nodes' GPUs and instances are mapped."""
    tmp_path = tmp_path_factory.mktemp("dcgm")
    rule_files = generate_rules(tmp_path / "rules", {})
    assert any(p.name == "smlens-dcgm-exporter.rules.yaml" for p in rule_files)
    with (
        dcgm_exporter() as old,
        dcgm_exporter(NEW_EXPOSITION) as new,
        prometheus(
            tmp_path,
            {"dcgm-exporter-4.8": old, "dcgm-exporter-4.10": new},
            rule_files,
            target_labels={
                "dcgm-exporter-4.8": {"node": "gpu-node-1", "cluster": "east"},
                "dcgm-exporter-4.10": {"node": "gpu-node-2", "cluster": "east"},
            },
        ) as base,
    ):
        # Per node: one whole GPU, one sliced GPU (with one instance).
        expected = {"gpu:gpu_dram_active_seconds:rate10m": 2, "gpu_up": 4, "gpu_mig_memory_used_bytes": 2}
        for mapped, count in expected.items():
            expr = f'count({mapped}{{exporter="dcgm-exporter"}}) == {count}'
            wait_for(f"{mapped} of both nodes", lambda expr=expr: bool(query(base, expr)), timeout=60)
        yield base


def _mapped(base: str, name: str) -> dict[str, dict[str, Any]]:
    """The series the mapping records under ``name``, by node."""
    return {r["metric"]["hostname"]: r for r in query(base, f'{name}{{exporter="dcgm-exporter"}}')}


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("gpu:gpu_utilization_sampled_seconds:rate10m", 1.0, 1.0),
        ("gpu:gpu_busy_seconds:rate10m", 0.96, 0.5),  # percent scaled; the ratio as it is
        ("gpu:gpu_sm_active_seconds:rate10m", 0.12, 0.25),
        ("gpu:gpu_sm_occupancy_seconds:rate10m", 0.04, 0.125),
        ("gpu:gpu_tensor_active_seconds:rate10m", 0.01, 0.0625),
        ("gpu:gpu_dram_active_seconds:rate10m", 0.2, 0.375),
        ("gpu:gpu_profiled_seconds:rate10m", 1.0, 1.0),
    ],
)
def test_both_generations_map_into_the_per_gpu_series(stack: str, name: str, old: float, new: float) -> None:
    """One series per whole GPU (the MIG GPUs have none), in smlens' units, whatever the names."""
    series = _mapped(stack, name)
    assert {node: float(s["value"][1]) for node, s in series.items()} == pytest.approx(
        {"gpu-node-1": old, "gpu-node-2": new}, abs=1e-9
    )
    assert series["gpu-node-2"]["metric"] == {
        "__name__": name,
        "exporter": "dcgm-exporter",
        "cluster": "east",
        "hostname": "gpu-node-2",  # the scrape's node label, not the exporter pod's hostname
        "gpu": "0",
        "uuid": "GPU-7e2b9d40-0000-0000-0000-000000000000",
        "namespace": "llm",
        "pod": "serve-0",
        "container": "vllm",
    }
    assert series["gpu-node-1"]["metric"]["pod"] == "train-0"


def test_gpu_info_reads_the_driver_label_of_either_generation(stack: str) -> None:
    whole = {
        r["metric"]["hostname"]: (r["metric"]["model"], r["metric"]["driver_version"])
        for r in query(stack, 'gpu_info{exporter="dcgm-exporter", gpu="0"}')
    }
    assert whole == {
        "gpu-node-1": ("NVIDIA A100-SXM4-80GB", "550.54.15"),
        "gpu-node-2": ("NVIDIA H200", "580.65.06"),
    }


def test_sliced_gpus_count_once_and_their_instances_map_into_the_instance_layer(stack: str) -> None:
    """The parent GPU: one gpu_up without owner labels; its instance: SM activity and memory in bytes
    (MiB scaled on the old node, bytes as they are on the new one)."""
    sliced = {
        r["metric"]["uuid"]: r["metric"] for r in query(stack, 'gpu_up{exporter="dcgm-exporter", gpu="1"}')
    }
    assert {m["hostname"] for m in sliced.values()} == {"gpu-node-1", "gpu-node-2"}
    assert not any("pod" in m for m in sliced.values())
    instances = _mapped(stack, "gpu_instance:gpu_mig_sm_active_seconds:rate10m")
    labels = {
        node: [s["metric"].get(k) for k in ("gpu", "gpu_instance", "mig_profile")]
        for node, s in instances.items()
    }
    assert labels == {"gpu-node-1": ["1", "3", "1g.10gb"], "gpu-node-2": ["1", "5", "1g.18gb"]}
    assert {node: float(s["value"][1]) for node, s in instances.items()} == pytest.approx(
        {"gpu-node-1": 0.05, "gpu-node-2": 0.75}, abs=1e-9
    )
    memory = {node: float(s["value"][1]) for node, s in _mapped(stack, "gpu_mig_memory_used_bytes").items()}
    assert memory == {"gpu-node-1": 4096 * 1024 * 1024, "gpu-node-2": 2 * 1024**3}
    available = {node: float(s["value"][1]) for node, s in _mapped(stack, "gpu_profiling_available").items()}
    assert available == {"gpu-node-1": 1.0, "gpu-node-2": 1.0}


def _has_data(base: str, expr: str, timeout: float = 10.0) -> bool:
    try:
        wait_for(expr, lambda: bool(query(base, expr)), timeout=timeout)
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize(("name", "gpu"), [("smlens-node.json", ".*"), ("smlens-gpu.json", "0")])
def test_node_and_gpu_dashboards_show_dcgm_exporter_gpus_or_say_they_need_smlens(
    stack: str, name: str, gpu: str
) -> None:
    """On a node that runs dcgm-exporter only, every panel of the node and GPU dashboards has data,
    names its empty state (noValue), or says in its description that it needs smlens; and a panel
    that says so is indeed empty here (it is not hiding data the mapping provides)."""
    model = json.loads((REPO / "dashboards" / name).read_text())
    values = {"datasource": "prometheus", "cluster": ".*", "hostname": "gpu-node-1", "gpu": gpu}
    empty, needless = [], []
    for panel in model["panels"]:
        if panel["type"] == "row":
            continue
        needs_smlens = dashboards.NEEDS_SMLENS in panel["description"]
        says_empty = "noValue" in panel["fieldConfig"]["defaults"]
        for target in panel["targets"]:
            expr = substitute(target["expr"], values)
            if needs_smlens:
                if query(stack, expr):
                    needless.append(f"{panel['title']}: {expr}")
            elif not says_empty and not _has_data(stack, expr):
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "panels without data for a dcgm-exporter GPU:\n" + "\n".join(empty)
    assert not needless, "panels that say they need smlens but have data:\n" + "\n".join(needless)


# Per node: utilization, SM active and SM efficiency (SM active per busy second), model and driver.
NODE_MEANS = {
    "gpu-node-1": ((0.96, 0.12, 0.125), ("NVIDIA A100-SXM4-80GB", "550.54.15")),
    "gpu-node-2": ((0.5, 0.25, 0.5), ("NVIDIA H200", "580.65.06")),
}
NODE_INSTANCES = {"gpu-node-1": ("3", "1g.10gb"), "gpu-node-2": ("5", "1g.18gb")}


@pytest.mark.parametrize("hostname", sorted(NODE_MEANS))
def test_time_series_of_a_dcgm_exporter_gpu_read_the_mapped_means(stack: str, hostname: str) -> None:
    """The per-GPU activity panels fall back to the mapping's recorded means (no smlens counters)."""
    model = json.loads((REPO / "dashboards" / "smlens-node.json").read_text())
    values = {"cluster": ".*", "hostname": hostname, "gpu": ".*"}
    by_title = {p["title"]: p for p in model["panels"]}
    means, identity = NODE_MEANS[hostname]
    titles = ("Utilization (NVML) per GPU", "SM active per GPU", "SM efficiency per GPU")
    for title, value in zip(titles, means, strict=True):
        (series,) = query(stack, substitute(by_title[title]["targets"][0]["expr"], values))
        assert series["metric"] == {"gpu": "0"}, title
        assert abs(float(series["value"][1]) - value) < 1e-9, title
    gpu = json.loads((REPO / "dashboards" / "smlens-gpu.json").read_text())
    (info,) = [p for p in gpu["panels"] if p["title"] == "Model"]
    (row,) = query(stack, substitute(info["targets"][0]["expr"], {**values, "gpu": "0"}))
    assert (row["metric"]["model"], row["metric"]["driver_version"]) == identity


@pytest.mark.parametrize("hostname", sorted(NODE_INSTANCES))
@pytest.mark.parametrize("name", ["smlens-node.json", "smlens-gpu.json"])
def test_mig_tables_list_the_dcgm_exporter_instances(stack: str, name: str, hostname: str) -> None:
    model = json.loads((REPO / "dashboards" / name).read_text())
    (table,) = [p for p in model["panels"] if p["type"] == "table" and p["title"].startswith("MIG")]
    values = {"cluster": ".*", "hostname": hostname, "gpu": "1" if name == "smlens-gpu.json" else ".*"}
    (row,) = query(stack, substitute(table["targets"][0]["expr"], values))
    instance = (row["metric"]["gpu"], row["metric"]["gpu_instance"], row["metric"]["mig_profile"])
    assert instance == ("1", *NODE_INSTANCES[hostname])
    if name == "smlens-gpu.json":  # the whole GPU 0: no instances, and the panel says so
        assert not query(stack, substitute(table["targets"][0]["expr"], {**values, "gpu": "0"}))
        assert table["fieldConfig"]["defaults"]["noValue"] == "no MIG instances on this GPU"
