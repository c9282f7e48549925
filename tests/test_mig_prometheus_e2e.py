"""A real Prometheus scrapes the sim backend with a GPU split into MIG instances, with the shipped rules.

GPU 0 is whole and healthy; GPU 1 is in MIG mode: a healthy 3g.71gb, a hollow 1g.18gb holding half its
memory and an idle, empty 1g.18gb. The instance layer, GPUMigInstanceHollow's condition (its ``for``
of 15 minutes is left to the promtool suite rules/tests/mig.test.yaml) and the GPU dashboard's MIG table
are checked against it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import yaml

from conftest import REPO, ExporterFactory
from promstack import panel_queries, prometheus, query, require_any, substitute, wait_for

HOSTNAME = "mig-node"
SCENARIO = (
    "gpus:\n  - healthy\n"
    "  - mig: [{mig_profile: 3g.71gb, profile: healthy}, {mig_profile: 1g.18gb, profile: hollow},"
    " {mig_profile: 1g.18gb, profile: idle}]\n"
)


def _alert_expr(name: str) -> str:
    alerts = yaml.safe_load((REPO / "rules" / "smlens-alerts.rules.yaml").read_text())["groups"][0]["rules"]
    [expr] = [a["expr"] for a in alerts if a.get("alert") == name]
    return str(expr)


def test_mig_instances_are_recorded_alerted_and_listed(
    start_exporter: ExporterFactory, tmp_path: Path
) -> None:
    require_any("prometheus")
    scenario = tmp_path / "mig.yaml"
    scenario.write_text(SCENARIO)
    exporter = start_exporter(
        "--backend", "sim", "--sim-scenario", str(scenario), "--interval", "0.5", "--hostname", HOSTNAME
    )
    rule_files = sorted((REPO / "rules").glob("*.rules.yaml"))
    with prometheus(tmp_path, {"smlens": exporter.removeprefix("http://")}, rule_files) as base:
        ratio = "gpu_instance:gpu_mig_sm_active:ratio_rate10m"
        wait_for("the three instances' means", lambda: len(query(base, ratio)) == 3)
        by_profile = {
            (s["metric"]["gpu"], s["metric"]["gpu_instance"], s["metric"]["mig_profile"]): float(
                s["value"][1]
            )
            for s in query(base, ratio)
        }
        healthy, hollow, idle = sorted(by_profile.items())
        assert healthy[0][2] == "3g.71gb" and healthy[1] >= 0.9
        assert hollow[0][2] == "1g.18gb" and 0.05 <= hollow[1] <= 0.15
        assert idle[0][2] == "1g.18gb" and idle[1] == 0.0
        assert {k[0] for k in by_profile} == {"1"}

        # Held (memory in use) and hollow: the hollow instance only; the idle one holds no memory.
        firing = query(base, _alert_expr("GPUMigInstanceHollow"))
        assert [(s["metric"]["gpu"], s["metric"]["gpu_instance"]) for s in firing] == [hollow[0][:2]]
        # A GPU in MIG mode has no NVML utilization: the whole-GPU hollow alert has nothing to judge.
        assert not query(base, 'gpu:gpu_utilization:ratio_rate10m{gpu="1"}')
        assert not query(base, _alert_expr("GPUBusyButSMUnderused"))

        # The GPU dashboard (GPU 1, then the whole GPU 0) and the node dashboard (all GPUs, then GPU 0
        # alone): the instances' rows where they exist; nothing elsewhere, which the panel names.
        values = {"datasource": "prometheus", "cluster": ".*", "hostname": HOSTNAME}
        for name, mig_gpus in (("smlens-gpu.json", "1"), ("smlens-node.json", ".*")):
            model = json.loads((REPO / "dashboards" / name).read_text())
            mig = [expr for title, expr in panel_queries(model) if title.startswith("MIG instances")]
            assert len(mig) == 4, name
            for expr in mig:
                rows = query(base, substitute(expr, {**values, "gpu": mig_gpus}))
                assert sorted(r["metric"]["gpu_instance"] for r in rows) == sorted(k[1] for k in by_profile)
                assert not query(base, substitute(expr, {**values, "gpu": "0"})), expr
            (table,) = [p for p in model["panels"] if p["type"] == "table" and p["title"].startswith("MIG")]
            assert table["fieldConfig"]["defaults"]["noValue"].startswith("no MIG instances on ")

        # Every rule evaluates without error with instance series present.
        groups = httpx.get(f"{base}/api/v1/rules", timeout=10).json()["data"]["groups"]
        broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] == "err"]
        assert not broken
