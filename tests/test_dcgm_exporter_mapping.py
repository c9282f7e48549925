"""dcgm-exporter's series, scraped by a real Prometheus, land in smlens' recorded layers.

The served exposition follows dcgm-exporter's own template (NVIDIA/dcgm-exporter
internal/pkg/rendermetrics/render.go, ``gpuMetricsFormat``: gpu, UUID, pci_bus_id, device, modelName,
GPU_I_PROFILE/GPU_I_ID on MIG instances, Hostname, then the pod labels), with the fields of its
etc/dcp-metrics-included.csv plus DCGM_FI_PROF_SM_ACTIVE and DCGM_FI_PROF_SM_OCCUPANCY, which that
file ships commented out and users turn on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from promstack import generate_rules, prometheus, query, wait_for

GPU0 = (
    'gpu="0",UUID="GPU-5d4a3c1e-0000-0000-0000-000000000000",pci_bus_id="00000000:07:00.0",'
    'device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dcgm-exporter-x7k2p",'
    'namespace="ml",pod="train-0",container="main"'
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


def _values(base: str, expr: str) -> dict[tuple[str, str], float]:
    return {
        (r["metric"].get("hostname", ""), r["metric"]["gpu"]): float(r["value"][1]) for r in query(base, expr)
    }


def test_dcgm_exporter_gpus_join_the_recorded_layers(tmp_path: Path) -> None:
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
        wait_for(
            "the node layer from dcgm-exporter",
            lambda: bool(query(base, "hostname:gpu_utilization:ratio_rate10m")),
            timeout=60,
        )
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
        wait_for(
            "the MIG instance's mean",
            lambda: bool(query(base, "gpu_instance:gpu_mig_sm_active:ratio_rate10m")),
            timeout=30,
        )
        (instance,) = query(base, "gpu_instance:gpu_mig_sm_active:ratio_rate10m")
        assert {k: instance["metric"].get(k) for k in ("gpu", "gpu_instance", "mig_profile", "exporter")} == {
            "gpu": "1",
            "gpu_instance": "3",
            "mig_profile": "1g.10gb",
            "exporter": "dcgm-exporter",
        }
        assert abs(float(instance["value"][1]) - 0.05) < 1e-9
        (memory,) = query(base, "gpu_mig_memory_used_bytes")
        assert float(memory["value"][1]) == 4096 * 1024 * 1024
        (node,) = query(base, 'hostname:gpu_utilization:ratio_rate10m{cluster="east"}')
        assert abs(float(node["value"][1]) - 0.96) < 1e-9
        wait_for("the cluster counts", lambda: bool(query(base, "cluster:gpus:count")), timeout=30)
        assert [float(r["value"][1]) for r in query(base, 'cluster:gpus:count{cluster="east"}')] == [2.0]
