"""The Grafana dashboards: fleet overview, node, single GPU, workload, and waste and cost, generated from
the thresholds.

Each dashboard reads the recorded layer that matches its selection: the fleet overview the cluster
layer (its cost does not grow with the number of nodes), the workload dashboard the namespace layer,
per-GPU sums for the pods of its tables and the pod layer's waste for its ranking, the node and GPU
dashboards one node's per-GPU series. Time series of one node or one GPU
compute exact means per graph step from the raw counters. Panels that list GPUs or pods show the
worst few (topk) rather than thousands of rows, GPUs from lists the rules rank once per evaluation.
Each dashboard opens with a panel that says whether the recording rules are loaded, so that their
absence never reads as an idle fleet.

One module per dashboard; panels.py has the kinds of panel, queries.py the PromQL, sections.py what
several dashboards share.
"""

from __future__ import annotations

from smlens.bundle.dashboards import fleet, gpu, node, waste, workload
from smlens.bundle.dashboards.sections import NEEDS_SMLENS
from smlens.bundle.grafana import render
from smlens.verdicts.thresholds import Thresholds

__all__ = ["DASHBOARDS", "NEEDS_SMLENS", "dashboard_files"]

DASHBOARDS = {
    "smlens-fleet.json": fleet.build,
    "smlens-node.json": node.build,
    "smlens-gpu.json": gpu.build,
    "smlens-workload.json": workload.build,
    "smlens-waste.json": waste.build,
}


def dashboard_files(t: Thresholds) -> dict[str, str]:
    """File name to content: the dashboards for these thresholds."""
    return {name: render(build(t)) for name, build in DASHBOARDS.items()}
