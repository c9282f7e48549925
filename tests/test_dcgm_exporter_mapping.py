"""dcgm-exporter's series, scraped by a real Prometheus, land in smlens' recorded layers.

The served exposition follows dcgm-exporter's own template (NVIDIA/dcgm-exporter
internal/pkg/rendermetrics/render.go, ``gpuMetricsFormat``: gpu, UUID, pci_bus_id, device, modelName,
GPU_I_PROFILE/GPU_I_ID on MIG instances, Hostname, then the pod labels), with the fields of its
etc/dcp-metrics-included.csv plus DCGM_FI_PROF_SM_ACTIVE and DCGM_FI_PROF_SM_OCCUPANCY, which that
file ships commented out and users turn on. GPU 1 is in MIG mode: dcgm-exporter (default device
option "f") exports its GPU instance 3 only.

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


@contextmanager
def dcgm_exporter() -> Iterator[str]:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = EXPOSITION.encode()
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
    """Prometheus base URL, once the mapped GPUs and instances are in every layer."""
    tmp_path = tmp_path_factory.mktemp("dcgm")
    rule_files = generate_rules(tmp_path / "rules", {})
    assert any(p.name == "smlens-dcgm-exporter.rules.yaml" for p in rule_files)
    with (
        dcgm_exporter() as target,
        prometheus(
            tmp_path,
            {"dcgm-exporter": target},
            rule_files,
            target_labels={"dcgm-exporter": {"node": "gpu-node-1", "cluster": "east"}},
        ) as base,
    ):
        layers = ("hostname:gpu_utilization:ratio_rate10m", "cluster:gpus:count")
        instances = "gpu_instance:gpu_mig_sm_active:ratio_rate10m"
        for layer in (*layers, instances):
            wait_for(f"{layer} from dcgm-exporter", lambda name=layer: bool(query(base, name)), timeout=60)
        yield base


def _values(base: str, expr: str) -> dict[tuple[str, str], float]:
    return {
        (r["metric"].get("hostname", ""), r["metric"]["gpu"]): float(r["value"][1]) for r in query(base, expr)
    }


def test_dcgm_exporter_gpus_join_the_recorded_layers(stack: str) -> None:
    base = stack
    utilization = _values(base, "gpu:gpu_utilization:ratio_rate10m")
    assert utilization == {("gpu-node-1", "0"): 0.96}  # the MIG slice is not a GPU of its own
    (gpu,) = query(base, "gpu:gpu_sm_active:ratio_rate10m")
    assert gpu["metric"] == {
        "__name__": "gpu:gpu_sm_active:ratio_rate10m",
        "exporter": "dcgm-exporter",
        "cluster": "east",
        "hostname": "gpu-node-1",  # the scrape's node label, not the exporter pod's Hostname
        "gpu": "0",
        "uuid": "GPU-5d4a3c1e-0000-0000-0000-000000000000",
        "namespace": "ml",
        "pod": "train-0",
        "container": "main",
    }
    assert abs(float(gpu["value"][1]) - 0.12) < 1e-9
    # The sliced GPU counts once, without owner labels; its instance is in the instance layer.
    (sliced,) = query(base, 'gpu_up{uuid="GPU-5d4a3c1e-1111-0000-0000-000000000000"}')
    assert sliced["metric"]["hostname"] == "gpu-node-1" and "pod" not in sliced["metric"]
    (instance,) = query(base, "gpu_instance:gpu_mig_sm_active:ratio_rate10m")
    labels = [instance["metric"].get(k) for k in ("gpu", "gpu_instance", "mig_profile", "exporter")]
    assert labels == ["1", "3", "1g.10gb", "dcgm-exporter"]
    assert abs(float(instance["value"][1]) - 0.05) < 1e-9
    (memory,) = query(base, "gpu_mig_memory_used_bytes")
    assert float(memory["value"][1]) == 4096 * 1024 * 1024
    (node,) = query(base, 'hostname:gpu_utilization:ratio_rate10m{cluster="east"}')
    assert abs(float(node["value"][1]) - 0.96) < 1e-9
    assert [float(r["value"][1]) for r in query(base, 'cluster:gpus:count{cluster="east"}')] == [2.0]


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


def test_time_series_of_a_dcgm_exporter_gpu_read_the_mapped_means(stack: str) -> None:
    """The per-GPU activity panels fall back to the mapping's recorded means (no smlens counters)."""
    model = json.loads((REPO / "dashboards" / "smlens-node.json").read_text())
    values = {"cluster": ".*", "hostname": "gpu-node-1", "gpu": ".*"}
    by_title = {p["title"]: p for p in model["panels"]}
    expected = {"Utilization (NVML) per GPU": 0.96, "SM active per GPU": 0.12, "SM efficiency per GPU": 0.125}
    for title, value in expected.items():
        (series,) = query(stack, substitute(by_title[title]["targets"][0]["expr"], values))
        assert series["metric"] == {"gpu": "0"}, title
        assert abs(float(series["value"][1]) - value) < 1e-9, title
    gpu = json.loads((REPO / "dashboards" / "smlens-gpu.json").read_text())
    (info,) = [p for p in gpu["panels"] if p["title"] == "Model"]
    (row,) = query(stack, substitute(info["targets"][0]["expr"], {**values, "gpu": "0"}))
    assert (row["metric"]["model"], row["metric"]["driver_version"]) == ("NVIDIA A100-SXM4-80GB", "550.54.15")


@pytest.mark.parametrize("name", ["smlens-node.json", "smlens-gpu.json"])
def test_mig_tables_list_the_dcgm_exporter_instances(stack: str, name: str) -> None:
    model = json.loads((REPO / "dashboards" / name).read_text())
    (table,) = [p for p in model["panels"] if p["type"] == "table" and p["title"].startswith("MIG")]
    values = {"cluster": ".*", "hostname": "gpu-node-1", "gpu": "1" if name == "smlens-gpu.json" else ".*"}
    (row,) = query(stack, substitute(table["targets"][0]["expr"], values))
    assert (row["metric"]["gpu"], row["metric"]["gpu_instance"], row["metric"]["mig_profile"]) == (
        "1",
        "3",
        "1g.10gb",
    )
    if name == "smlens-gpu.json":  # the whole GPU 0: no instances, and the panel says so
        assert not query(stack, substitute(table["targets"][0]["expr"], {**values, "gpu": "0"}))
        assert table["fieldConfig"]["defaults"]["noValue"] == "no MIG instances on this GPU"
