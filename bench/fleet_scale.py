"""Cost of the rules and dashboards on a synthetic fleet, in a real Prometheus TSDB.

    PYTHONPATH=exporter python3 bench/fleet_scale.py [--nodes 100 1000] [--minutes 14] [--clusters 4]

For each fleet size N:

1. One 8-GPU node of the sim backend is sampled (the exporter's own sampler and collector, on a
   simulated clock) and rendered as Prometheus text at the default metric groups, with the
   per-scrape families. Its series are copied to N nodes, relabelled the way a scrape would label
   them (hostname, uuid, instance, job, a cluster label), with the GPUs' sim profiles rotated per node
   and six of each node's eight GPUs held by pods (the owner labels smlens adds). Counters advance at
   the sim GPU's rates, one sample every --scrape seconds for --minutes, ending a few minutes after
   the data is loaded (so that the rules' windows stay full while the benchmark runs).
   With the accounting group (the default; --no-accounting leaves it out), each GPU also has
   gpu_verdict_seconds_total series for the 2-3 verdict classes its sim profile's class mixes
   (``VERDICT_MIX``: shares summing to one GPU-second per second) with its pod's owner labels (none for
   the free GPUs, whose classes still follow their profile, as the exporter would account them), and
   each cluster a kube-state-metrics whose owner series name the owners of the GPU pods (JobSets'
   Jobs, plain Jobs, StatefulSets, Deployments' ReplicaSets, bare pods, pods it does not know) and of
   ``EXTRA_PODS_PER_NODE`` pods without GPUs per node (DaemonSets, Deployments with their old
   ReplicaSets, CronJobs' Jobs, a StatefulSet). The sim has no MIG GPUs: no gpu_mig_sm_share_ratio.
2. ``promtool tsdb create-blocks-from openmetrics`` writes that history as TSDB blocks, and a real
   Prometheus opens them with the bundle's rules, evaluated every --interval seconds unless a group
   sets its own interval. With a price (--price-per-gpu-hour, default 3.5 USD per GPU-hour of the sim
   GPU's model) the bundle's own generator writes them (``python -m smlens.bundle rules --thresholds``
   with that price table), so that the cost layers and panels have data; with 0, its rules/ as shipped
   (no prices unless they have some).
3. After --evaluations evaluations, each rule group's last evaluation time (Prometheus'
   /api/v1/rules) is read after every evaluation; the median per group is printed, with Prometheus'
   CPU seconds per cycle of the slowest group's interval, and every rule whose health is not ok.
4. With --history-hours H, the recorded series as the rules wrote them are backfilled for the H hours
   before the raw data (one sample per recording interval, values varied a little so that they
   compress as real ones do), and Prometheus is restarted on the longer history: the dashboards then
   read H hours of recorded series, as after H hours of running. Raw series keep their --minutes.
5. Every query of every shipped dashboard (dashboards/) runs in its default view: the time range
   now-6h, the step Grafana would pick for the panel's width on a 1,800 px wide dashboard, All for
   multi-value variables that offer it and the first value (in order) for the others; the variable
   queries too. Queries run one after another; the wall time of each (HTTP included) is summed per
   dashboard. Each dashboard runs twice: while the rules are evaluated (as on a server, but here on
   the same two cores), then with the rules reloaded away (Prometheus keeps their last values fresh
   for two intervals), which is the dashboards' own cost.

Prints one JSON document: per N the series counts, group durations, the slowest rules, the active
alerts per alert name and dashboard times; then the ratios between the largest and smallest N, a
linear projection to 10,000 nodes and the budgets: recorded series per node over raw series per node,
the rules' CPU over the cycle, each group's duration over its interval, the slowest dashboard.
``raw_series`` and ``recorded_series`` (and ``recorded_over_raw``) are those of the default groups, as
before the accounting group: its raw series, kube-state-metrics' and its recorded series are counted
apart, and ``recorded_over_raw_with_accounting`` puts smlens' own together (kube-state-metrics'
series, which a cluster has anyway, are in neither). ``figures_without_accounting`` are the same run's
figures less the accounting groups and the waste dashboard; the rules' CPU is not split by group
(run --no-accounting for it).
Timings are noisy on a shared machine: compare the figures of one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "exporter"))
sys.path.insert(0, str(REPO / "tests"))

from conftest import free_port, wait_ready  # noqa: E402
from promstack import run_rules_generator, substitute  # noqa: E402
from smlens import names as n  # noqa: E402
from smlens.bundle import promql  # noqa: E402
from smlens.bundle.rules import ACCOUNTING_FILE, PRICES_FILE  # noqa: E402
from smlens.exposition.live import SnapshotAge, live_registry, render_live  # noqa: E402
from smlens.exposition.rendered import Rendered  # noqa: E402
from smlens.exposition.selection import parse_selection  # noqa: E402
from smlens.pipeline.accounting import Accountant  # noqa: E402
from smlens.pipeline.sampler import Sampler  # noqa: E402
from smlens.sources.sim import Scenario, SimBackend  # noqa: E402
from smlens.verdicts import thresholds  # noqa: E402

GPUS = 8
TEMPLATE_SECONDS = 60
GRAFANA_WIDTH_PX = 1800
SNAPSHOT_TIMESTAMP = "smlens_snapshot_timestamp_seconds"
SNAPSHOT_AGE = "smlens_snapshot_age_seconds"
SIX_HOURS = 6 * 3600
LOOKBACK_S = 300  # Prometheus' default lookback delta: an instant selector's series are this fresh
SLOWEST_RULES = 15
# The budgets (docs/performance.md): recorded series per node at most half the raw ones, the rules'
# CPU per evaluation cycle at most a quarter of the cycle, each group within half its interval, and
# each dashboard's default view under a second of Prometheus time.
BUDGETS = {
    "recorded_over_raw": 0.5,
    "rules_cpu_over_cycle": 0.25,
    "group_over_interval": 0.5,
    "dashboard_s": 1.0,
}
# A series is recorded if its name has the level:metric:operations shape.
RECORDED = re.compile(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")
# The accounting group's families, the rule groups and files that read them and the dashboard.
VERDICT_SECONDS = promql.total(n.GPU_VERDICT_SECONDS)
ACCOUNTING_FAMILIES = (VERDICT_SECONDS, n.GPU_MIG_SM_SHARE_RATIO)
ACCOUNTING_GROUPS = ("smlens-accounting", "smlens-accounting-alerts", "smlens-prices")
ACCOUNTING_FILES = (ACCOUNTING_FILE, PRICES_FILE)
WASTE_DASHBOARD = "smlens-waste.json"
CURRENCY = "USD"
# Per verdict class of a GPU's sim profile, the classes its seconds pass through in the 5 minutes an
# account lives, with their shares (summing to 1): a busy GPU mostly in its class, with phases of data
# loading, checkpoints and synchronisation in others; a hollow or idle one mostly as it is.
VERDICT_MIX: Mapping[str, Mapping[str, float]] = {
    "compute_bound": {"compute_bound": 0.86, "partial": 0.09, "stalled": 0.05},
    "memory_bound": {"memory_bound": 0.85, "compute_bound": 0.10, "partial": 0.05},
    "stalled": {"stalled": 0.80, "partial": 0.15, "compute_bound": 0.05},
    "partial": {"partial": 0.70, "hollow": 0.20, "idle_memory_held": 0.10},
    "hollow": {"hollow": 0.92, "partial": 0.08},
    "idle_memory_held": {"idle_memory_held": 0.95, "idle": 0.05},
    "idle": {"idle": 0.90, "idle_memory_held": 0.10},
}
# kube-state-metrics: one per cluster, scraped as job="kube-state-metrics".
KSM_JOB = "kube-state-metrics"
KSM_FAMILIES = ("kube_pod_owner", "kube_replicaset_owner", "kube_job_owner")
NONE = "<none>"  # kube-state-metrics' owner_kind, owner_name and owner_is_controller of no owner
EXTRA_PODS_PER_NODE = 20  # pods without GPUs: the 5 DaemonSets, SERVICE_PODS, CRONJOB_PODS, 1 StatefulSet
DAEMONSETS = (
    ("kube-system", "kube-proxy"),
    ("kube-system", "nvidia-device-plugin-daemonset"),
    ("gpu-operator", "nvidia-dcgm-exporter"),
    ("monitoring", "node-exporter"),
    ("monitoring", "smlens"),
)
SERVICE_PODS = 11  # per node, each of a Deployment of a team namespace
CRONJOB_PODS = 3  # per node, each of a Job of a CronJob (which keeps its last 3 Jobs)
OLD_REPLICASETS = 3  # old revisions of every Deployment, which kube-state-metrics reports too
INFER_DEPLOYMENTS = 6  # Deployments of the serving namespace per cluster
# Seconds a GPU had accounted before the data starts (its counters' start): 1 to 5 days, by node.
UPTIME_S = 86400.0


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    value: float
    rate: float  # per second; 0 for gauges


def template(scrape: float) -> list[Series]:
    """One sim node's series with each counter's rate, from two renders ``TEMPLATE_SECONDS`` apart, at
    the default groups and the accounting group (whose verdict class per GPU is its sim profile's)."""
    now = [0.0]
    sampler = Sampler(
        SimBackend(Scenario.steady(GPUS), hostname_hint="tmpl"),
        [],
        "tmpl",
        scrape,
        clock=lambda: now[0],
        wall=lambda: 1.7e9 + now[0],
    )
    sampler.attach_accountant(Accountant(thresholds.load(None), scrape))
    sampler.open()
    selection = parse_selection("default,accounting")
    renders = []
    for step in range(int(TEMPLATE_SECONDS / scrape) + 1):
        now[0] = step * scrape
        snapshot = sampler.tick()
        if step in (1, int(TEMPLATE_SECONDS / scrape)):
            body = Rendered(snapshot, selection=selection).text
            assert body is not None
            age = SnapshotAge(lambda taken=snapshot: taken)  # type: ignore[misc]
            live = render_live(live_registry(age), openmetrics=False)
            renders.append((body.head + live).decode())
    first: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for render, into in zip(renders, (first, last), strict=True):
        for family in text_string_to_metric_families(render):
            for sample in family.samples:
                if not sample.name.endswith("_created"):
                    into[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    elapsed = TEMPLATE_SECONDS - scrape
    out = []
    for (name, labels), value in last.items():
        rate = (value - first.get((name, labels), value)) / elapsed if name.endswith("_total") else 0.0
        out.append(Series(name, dict(labels), value, rate))
    return out


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _rest(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """A GPU series' labels other than the GPU's identity."""
    return frozenset((k, v) for k, v in labels.items() if k not in ("gpu", "uuid"))


def node_labels(node: int, clusters: int) -> dict[str, str]:
    return {
        "cluster": f"cluster-{node % clusters}",
        "hostname": f"node-{node:05d}",
        "instance": f"10.{node // 65536}.{node // 256 % 256}.{node % 256}:10132",
        "job": "smlens",
    }


def owner(node: int, gpu: int) -> dict[str, str]:
    """GPUs 0-3 run one training pod, 4 and 5 one inference pod each, 6 and 7 are free."""
    if gpu < 4:
        return {"namespace": f"team-{node % 25}", "pod": f"train-{node}", "container": "main"}
    if gpu < 6:
        return {"namespace": "serving", "pod": f"infer-{node}-{gpu}", "container": "server"}
    return {}


def profile_of(node: int, gpu: int, healthy: float) -> int:
    """The sim GPU whose profile GPU ``gpu`` of ``node`` runs: rotated so that nodes differ, or the
    healthy one (GPU 0's) on the ``healthy`` share of the nodes."""
    return 0 if node % 100 < healthy * 100 else (gpu + node) % GPUS


def _hash(*parts: object, size: int = 10) -> str:
    return hashlib.blake2s("/".join(map(str, parts)).encode(), digest_size=16).hexdigest()[:size]


Owners = dict[tuple[str, str, str], tuple[str, str]]  # (cluster, namespace, name): (owner kind, name)


def kube_state(nodes: int, clusters: int) -> dict[str, Owners]:
    """What kube-state-metrics knows of the fleet's pods, per family (kube_pod_owner's pods,
    kube_replicaset_owner's ReplicaSets, kube_job_owner's Jobs): each object's controlling owner.

    The training pods (GPUs 0-3): 12 in 20 nodes a Job of a JobSet that spans the team's nodes of a
    cluster, 3 a plain Job, 3 a StatefulSet's, 1 a bare pod, 1 a pod kube-state-metrics does not know
    (yet); the inference pods (GPUs 4-5) a Deployment's ReplicaSet, a StatefulSet's on a node in ten.
    Beside them ``EXTRA_PODS_PER_NODE`` pods without GPUs per node; every Deployment keeps its
    ``OLD_REPLICASETS`` old ReplicaSets, every CronJob its last 3 Jobs."""
    pods: Owners = {}
    replicasets: Owners = {}
    jobs: Owners = {}

    def deployment(cluster: str, namespace: str, name: str) -> str:
        """A Deployment's current ReplicaSet, its old ones registered with it."""
        for revision in range(OLD_REPLICASETS + 1):
            replicasets[(cluster, namespace, f"{name}-{_hash(cluster, namespace, name, revision)}")] = (
                "Deployment",
                name,
            )
        return f"{name}-{_hash(cluster, namespace, name, 0)}"

    for node in range(nodes):
        cluster = node_labels(node, clusters)["cluster"]
        held = {(o["namespace"], o["pod"], gpu) for gpu in range(GPUS) if (o := owner(node, gpu))}
        for namespace, pod, gpu in sorted(held):
            key = (cluster, namespace, pod)
            if key in pods:
                continue
            if pod.startswith("train-"):
                share = node % 20
                if share < 12:  # one Job per node of a JobSet (nodes of the same team and cluster)
                    jobset = f"train-{node % 100}-{node // 400}"
                    job = f"{jobset}-workers-{node // 100 % 4}"
                    pods[key] = ("Job", job)
                    jobs[(cluster, namespace, job)] = ("JobSet", jobset)
                elif share < 15:
                    job = f"batch-{node}"
                    pods[key] = ("Job", job)
                    jobs[(cluster, namespace, job)] = (NONE, NONE)
                elif share < 18:
                    pods[key] = ("StatefulSet", f"train-{node % 100}")
                elif share == 18:
                    pods[key] = (NONE, NONE)
                # share 19: a pod kube-state-metrics does not know
            elif gpu == 5 and node % 10 == 3:
                pods[key] = ("StatefulSet", f"vllm-{node % 3}")
            else:
                rs = deployment(cluster, namespace, f"infer-{(node + gpu) % INFER_DEPLOYMENTS}")
                pods[key] = ("ReplicaSet", rs)
        for namespace, daemonset in DAEMONSETS:
            pods[(cluster, namespace, f"{daemonset}-{_hash(node, daemonset, size=8)}")] = (
                "DaemonSet",
                daemonset,
            )
        for k in range(SERVICE_PODS):
            namespace = f"team-{(node + k) % 25}"
            rs = deployment(cluster, namespace, f"api-{k}")
            pods[(cluster, namespace, f"{rs}-{_hash(node, k, size=8)}")] = ("ReplicaSet", rs)
        for k in range(CRONJOB_PODS):
            namespace = f"team-{(node * 3 + k) % 25}"
            job = f"report-{k}-{29000000 + node // 25 % 3}"
            jobs[(cluster, namespace, job)] = ("CronJob", f"report-{k}")
            pods[(cluster, namespace, f"{job}-{_hash(node, k, size=8)}")] = ("Job", job)
        pods[(cluster, f"team-{node % 25}", f"db-{node % 7}-{node}")] = ("StatefulSet", f"db-{node % 7}")
    return {"kube_pod_owner": pods, "kube_replicaset_owner": replicasets, "kube_job_owner": jobs}


def ksm_labels(family: str, key: tuple[str, str, str], owned_by: tuple[str, str]) -> dict[str, str]:
    """A kube-state-metrics owner series' labels, as its cluster's Prometheus scrapes them."""
    cluster, namespace, name = key
    kind, owner_name = owned_by
    own = {
        "kube_pod_owner": {"pod": name, "uid": str(uuid.UUID(_hash(*key, size=32)))},
        "kube_replicaset_owner": {"replicaset": name},
        "kube_job_owner": {"job_name": name},
    }[family]
    return {
        "cluster": cluster,
        "instance": f"kube-state-metrics.{cluster}:8080",
        "job": KSM_JOB,
        "namespace": namespace,
        **own,
        "owner_kind": kind,
        "owner_name": owner_name,
        "owner_is_controller": NONE if kind == NONE else "true",
    }


def write_fleet(
    path: Path,
    nodes: int,
    clusters: int,
    scrape: float,
    minutes: float,
    end: float,
    healthy: float = 0.0,
    accounting: bool = True,
) -> dict[str, int]:
    """The fleet's history as OpenMetrics text; returns the number of series: of the default groups
    (with gpu_allocation_info and up) under "default", and of each accounting family and
    kube-state-metrics family under its name. A ``healthy`` share of the nodes runs the sim's healthy
    profile (GPU 0's) on all 8 GPUs; the others rotate the sim's eight profiles (hollow, single-SM,
    low-occupancy and idle GPUs among them, which alert)."""
    series = template(scrape)
    verdicts = {int(s.labels["gpu"]): s.labels["verdict"] for s in series if s.name == VERDICT_SECONDS}
    series = [s for s in series if s.name not in ACCOUNTING_FAMILIES]
    ticks = [end - i * scrape for i in range(int(minutes * 60 / scrape))][::-1]
    start = ticks[0]
    by_family: dict[str, list[Series]] = {}
    twins: dict[tuple[str, int, frozenset[tuple[str, str]]], Series] = {}
    for s in series:
        by_family.setdefault(s.name, []).append(s)
        if "gpu" in s.labels:
            twins[(s.name, int(s.labels["gpu"]), _rest(s.labels))] = s
    counts: dict[str, int] = {}
    count = 0
    with path.open("w") as out:
        for name, members in by_family.items():
            out.write(f"# TYPE {name} gauge\n")
            for node in range(nodes):
                base = node_labels(node, clusters)
                for s in members:
                    labels = {**s.labels, **base}
                    value, rate = s.value, s.rate
                    if "gpu" in s.labels:
                        # Rotate the sim profiles so that nodes differ; keep the GPU's index.
                        index = int(s.labels["gpu"])
                        profile = profile_of(node, index, healthy)
                        twin = twins.get((name, profile, _rest(s.labels)), s)
                        value, rate = twin.value, twin.rate
                        labels.update(uuid=f"GPU-{node:05d}-{index}", **owner(node, index))
                    text = f"{name}{_labels(labels)}"
                    if name == SNAPSHOT_TIMESTAMP:  # a sampler that keeps sampling
                        out.writelines(f"{text} {tick:.3f} {tick:.3f}\n" for tick in ticks)
                    elif name == SNAPSHOT_AGE:  # ...and scrapes that find its snapshot fresh
                        out.writelines(f"{text} {scrape / 2:g} {tick:.3f}\n" for tick in ticks)
                    else:
                        out.writelines(
                            f"{text} {value + rate * (tick - start):.6g} {tick:.3f}\n" for tick in ticks
                        )
                    count += 1
        if accounting:
            # Per GPU, its profile's class mix, accounted to the pod that holds it (empty owner labels,
            # left out as a scrape leaves them, for a free GPU).
            out.write(f"# TYPE {VERDICT_SECONDS} gauge\n")
            written = 0
            for node in range(nodes):
                base = node_labels(node, clusters)
                for gpu in range(GPUS):
                    main = verdicts[profile_of(node, gpu, healthy)]
                    for verdict, share in VERDICT_MIX.get(main, {main: 1.0}).items():
                        labels = {
                            "gpu": str(gpu),
                            "uuid": f"GPU-{node:05d}-{gpu}",
                            "hostname": base["hostname"],
                            "verdict": verdict,
                            **owner(node, gpu),
                            **base,
                        }
                        text = f"{VERDICT_SECONDS}{_labels(labels)}"
                        first = share * UPTIME_S * (1 + node % 5)
                        out.writelines(
                            f"{text} {first + share * (tick - start):.9g} {tick:.3f}\n" for tick in ticks
                        )
                        written += 1
            counts[VERDICT_SECONDS] = written
            for family, objects in kube_state(nodes, clusters).items():
                out.write(f"# TYPE {family} gauge\n")
                for key, owned_by in objects.items():
                    text = f"{family}{_labels(ksm_labels(family, key, owned_by))}"
                    out.writelines(f"{text} 1 {tick:.3f}\n" for tick in ticks)
                counts[family] = len(objects)
        out.write("# TYPE gpu_allocation_info gauge\n")
        for node in range(nodes):
            base = node_labels(node, clusters)
            for gpu in range(GPUS):
                if owner(node, gpu):
                    labels = {
                        **base,
                        "gpu": str(gpu),
                        "uuid": f"GPU-{node:05d}-{gpu}",
                        **owner(node, gpu),
                        "resource": "nvidia.com/gpu",
                    }
                    out.writelines(f"gpu_allocation_info{_labels(labels)} 1 {tick:.3f}\n" for tick in ticks)
                    count += 1
        out.write("# TYPE up gauge\n")
        for node in range(nodes):
            out.writelines(f"up{_labels(node_labels(node, clusters))} 1 {tick:.3f}\n" for tick in ticks)
            count += 1
        out.write("# EOF\n")
    counts["default"] = count
    return counts


def sim_model(scrape: float) -> str:
    """The sim GPU's model, as gpu_info's model label gives it (the price table's key)."""
    return next(s.labels["model"] for s in template(scrape) if s.name == "gpu_info")


def bundle_rules(bundle: Path, args: argparse.Namespace, workdir: Path) -> tuple[list[Path], dict[str, Any]]:
    """The rule files Prometheus loads for a bundle, and its prices. With --price-per-gpu-hour, the
    checkout's own generator writes them (``python -m smlens.bundle rules --thresholds``, a thresholds
    override with a price table for the sim GPU's model), so that the cost layers and panels have
    data; else, or where that fails (a checkout without price tables), its rules/ as shipped.
    --no-accounting leaves out the accounting and price groups."""
    shipped = sorted((bundle / "rules").glob("*.rules.yaml"))
    files = shipped
    prices: dict[str, Any] = {"on": False}
    if args.accounting and args.price_per_gpu_hour > 0:
        table = {"currency": CURRENCY, "gpu_hour": {sim_model(args.scrape): args.price_per_gpu_hour}}
        out = workdir / "rules"
        done = run_rules_generator(out, {"prices": table}, bundle / "exporter")
        if done.returncode == 0:
            files = sorted(out.glob("*.rules.yaml"))
            # The other files should be the shipped ones: if not, the checkout's rules/ are stale.
            differ = [
                p.name
                for p in files
                if p.name != PRICES_FILE
                and (
                    not (bundle / "rules" / p.name).exists()
                    or (bundle / "rules" / p.name).read_text() != p.read_text()
                )
            ]
            prices = {
                "on": True,
                **table,
                "rules_generated_by": "python -m smlens.bundle rules --thresholds <overrides> --out <dir>",
                "generated_files_not_as_shipped": differ,
            }
        else:
            prices = {"on": False, "generator_failed": done.stderr.strip()[-500:]}
            print(f"fleet_scale: no price table for {bundle}: {done.stderr.strip()}", file=sys.stderr)
    if not args.accounting:
        files = [p for p in files if p.name not in ACCOUNTING_FILES]
    return files, prices


@contextmanager
def prometheus(
    workdir: Path, data: Path, interval: float, rule_files: list[Path]
) -> Iterator[tuple[str, int]]:
    rules = [str(p) for p in rule_files]
    config = {"global": {"evaluation_interval": f"{interval:g}s"}, "rule_files": rules}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{base}/-/ready", process, timeout=600)
        yield base, process.pid
    finally:
        process.terminate()
        process.wait(60)
        log.close()


def pause_rules(workdir: Path, base: str, pid: int) -> None:
    """Reload Prometheus without its rule files, so that dashboards can be timed without rule
    evaluations competing for this machine's two cores. Prometheus marks the removed groups' series
    stale only two evaluation intervals later: until then they read as they were."""
    config = yaml.safe_load((workdir / "prometheus.yml").read_text())
    config["rule_files"] = []
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 60
    while httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]:
        if time.monotonic() > deadline:
            raise SystemExit("fleet_scale: Prometheus did not drop its rules on reload.")
        time.sleep(0.2)


def instant(base: str, expr: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=120).json()
    if body["status"] != "success":
        raise SystemExit(f"query failed: {expr}: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used: unlike wall time, it does not grow when other
    processes compete for the cores."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rule_health(base: str) -> dict[str, Any]:
    """Per group, its rules and those whose health is not ok (name: health and last error)."""
    groups = httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]
    return {
        group["name"]: {
            "rules": len(group["rules"]),
            "not_ok": {
                rule["name"]: f"{rule['health']}: {rule.get('lastError', '')}"
                for rule in group["rules"]
                if rule["health"] != "ok"
            },
        }
        for group in groups
    }


def accounting_names(base: str) -> set[str]:
    """The names the accounting and price groups record."""
    groups = httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]
    return {
        rule["name"]
        for group in groups
        if group["name"] in ACCOUNTING_GROUPS
        for rule in group["rules"]
        if rule["type"] == "recording"
    }


def group_intervals(base: str) -> dict[str, float]:
    """Each rule group's evaluation interval in seconds: its own, or the global one."""
    groups = httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]
    return {group["name"]: float(group["interval"]) for group in groups}


def group_durations(
    base: str, pid: int, evaluations: int, interval: float
) -> tuple[dict[str, float], float, dict[str, float]]:
    """Median over ``evaluations`` evaluations of each group's evaluation time, in seconds,
    Prometheus' CPU seconds per evaluation cycle over them (a cycle: the longest group interval;
    Prometheus does nothing else meanwhile), and the slowest rules' median evaluation times
    (group/rule name: seconds)."""
    interval = max(group_intervals(base).values(), default=interval)
    seen: dict[str, list[float]] = {}
    per_rule: dict[str, list[float]] = {}
    last: dict[str, str] = {}
    cpu_start: float | None = None
    cycles_start = 0
    deadline = time.monotonic() + evaluations * interval * 4 + 120
    while time.monotonic() < deadline:
        groups = httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]
        for group in groups:
            stamp = group.get("lastEvaluation", "")
            if stamp.startswith("0001") or last.get(group["name"]) == stamp:
                continue
            last[group["name"]] = stamp
            seen.setdefault(group["name"], []).append(group["evaluationTime"])
            for rule in group["rules"]:
                per_rule.setdefault(f"{group['name']}/{rule['name']}", []).append(rule["evaluationTime"])
        # Cycles of the longest interval: the group evaluated least often.
        evaluated = min((len(v) for v in seen.values()), default=0) if len(seen) == len(groups) else 0
        if cpu_start is None and evaluated >= 1:
            cpu_start, cycles_start = cpu_seconds(pid), evaluated
        if evaluated > evaluations:
            break
        time.sleep(interval / 3)
    cpu = (cpu_seconds(pid) - cpu_start) / max(evaluated - cycles_start, 1) if cpu_start is not None else 0.0
    # The first evaluation after start pays for loading the blocks' index: left out.
    rules = {name: statistics.median(times[1:] or times) for name, times in per_rule.items()}
    slowest = dict(sorted(rules.items(), key=lambda item: -item[1])[:SLOWEST_RULES])
    return {name: statistics.median(times[1:] or times) for name, times in seen.items()}, cpu, slowest


Recorded = list[tuple[dict[str, str], float, float]]  # labels (with __name__), value, interval


def recorded_history(base: str, before: float, seconds: float) -> tuple[Recorded, float, float]:
    """The recorded series as the rules last wrote them, each with its group's interval; and the span
    of history to write for them: ``seconds`` up to ``before``."""
    intervals = {
        rule["name"]: float(group["interval"])
        for group in httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]
        for rule in group["rules"]
        if rule["type"] == "recording"
    }
    series = instant(base, '{__name__=~".+:.+:.+"}')
    rows = [
        (s["metric"], float(s["value"][1]), intervals.get(s["metric"]["__name__"], 60.0))
        for s in series
        if RECORDED.fullmatch(s["metric"]["__name__"])
    ]
    return rows, before - seconds, before


def create_blocks(promtool: str, om: Path, into: Path) -> None:
    """TSDB blocks of an OpenMetrics file's samples, written into ``into``; the file goes."""
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(into)],
        check=True,
        capture_output=True,
        timeout=3600,
    )
    om.unlink()


def backfill(workdir: Path, data: Path, history: tuple[Recorded, float, float], promtool: str) -> None:
    """Writes the recorded series' history as TSDB blocks into ``data`` (Prometheus stopped): each
    series at its value, varied by a few percent per sample so that the chunks compress as a real
    series' do, one sample per its group's interval."""
    rows, start, stop = history
    om = workdir / "recorded.om"
    blocks = workdir / "recorded-blocks"
    with om.open("w") as out:
        by_name: dict[str, list[tuple[dict[str, str], float, float]]] = {}
        for labels, value, interval in rows:
            by_name.setdefault(labels["__name__"], []).append((labels, value, interval))
        for name, members in by_name.items():
            out.write(f"# TYPE {name} gauge\n")
            for index, (labels, value, interval) in enumerate(members):
                text = name + _labels({k: v for k, v in labels.items() if k != "__name__"})
                steps = int((stop - start) / interval)
                out.writelines(
                    f"{text} {value * (1 + 0.03 * math.sin(index + i / 7)):.6g} {start + i * interval:.3f}\n"
                    for i in range(steps)
                )
        out.write("# EOF\n")
    create_blocks(promtool, om, blocks)
    for block in blocks.iterdir():
        block.rename(data / block.name)


def last_evaluations(base: str) -> dict[str, float]:
    """Each rule group's last evaluation, in seconds since the epoch."""
    groups = httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]
    out = {}
    for group in groups:
        # RFC 3339 with 0 to 9 digits of fraction, which Python 3.10's fromisoformat does not all take.
        match = re.fullmatch(r"(.{19})(\.\d+)?(Z|[+-]\d\d:\d\d)", group["lastEvaluation"])
        assert match, group["lastEvaluation"]
        whole, fraction, zone = match.groups()
        stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
        out[group["name"]] = stamp + float(fraction or 0)
    return out


def rule_samples(base: str, at: float) -> dict[str, int]:
    """Per group, the samples its rules read in one evaluation (each rule's expression run once as an
    instant query with stats, at ``at``: the time of the last timed evaluation, so that it reads the
    data those evaluations read): a cost measure free of the timing noise of a shared machine."""
    samples: dict[str, int] = {}
    for group in httpx.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]:
        total = 0
        for rule in group["rules"]:
            body = httpx.get(
                f"{base}/api/v1/query",
                params={"query": rule["query"], "stats": "all", "time": at},
                timeout=120,
            ).json()
            total += body["data"]["stats"]["samples"]["totalQueryableSamples"]
        samples[group["name"]] = total
    return samples


def grafana_step(width: int) -> int:
    """The step Grafana picks for a 6 h range: range / panel width in px, at least the 15 s scrape
    interval, rounded as Grafana rounds intervals (to 15 s, 20 s, 30 s, 1 m...)."""
    raw = SIX_HOURS / (GRAFANA_WIDTH_PX * width / 24)
    for step in (15, 20, 30, 60, 120, 300):
        if raw <= step:
            return step
    return 600


def min_interval(panel: Mapping[str, Any]) -> int:
    """The panel's "Min interval" in seconds (Grafana's ``interval``, in s or m here), else 0."""
    interval = str(panel.get("interval", ""))
    if not interval:
        return 0
    return int(interval[:-1]) * (60 if interval.endswith("m") else 1)


def _substitute(expr: str, values: Mapping[str, str], step: int) -> str:
    builtins = {
        "__rate_interval": f"{max(step + 15, 60)}s",
        "__interval": f"{step}s",
        "__interval_ms": str(step * 1000),
        "__range": "6h",
    }
    text: str = substitute(expr, values, builtins)
    return text


def default_values(base: str, model: Mapping[str, Any]) -> dict[str, str]:
    """All (.*) for multi-value variables that offer it, the first value (sorted) for the others, as
    Grafana opens a dashboard; each variable's query is timed as part of the dashboard."""
    values: dict[str, str] = {}
    for variable in model["templating"]["list"][1:]:
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
        assert match, variable["definition"]
        if variable["multi"] and variable["includeAll"]:
            values[variable["name"]] = ".*"
            continue
        selector = _substitute(match.group(1), values, 15)
        body = httpx.get(
            f"{base}/api/v1/label/{match.group(2)}/values",
            params={"match[]": selector, "start": time.time() - SIX_HOURS, "end": time.time()},
            timeout=60,
        ).json()
        values[variable["name"]] = sorted(body["data"])[0] if body["data"] else ""
    return values


def dashboard_time(base: str, pid: int, model: Mapping[str, Any]) -> dict[str, Any]:
    cpu_start = cpu_seconds(pid)
    values = default_values(base, model)
    now = time.time()
    total = 0.0
    inside = 0.0  # Prometheus' own execTotalTime: without HTTP and JSON
    samples = 0  # samples the queries read (totalQueryableSamples): the cost free of timing noise
    slowest = ("", 0.0)
    timed: list[tuple[str, float]] = []  # each panel query ("title #target") and Prometheus' time of it
    series = 0
    queries = 0
    started = time.perf_counter()
    for variable in model["templating"]["list"][1:]:
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
        assert match
        httpx.get(
            f"{base}/api/v1/label/{match.group(2)}/values",
            params={"match[]": _substitute(match.group(1), values, 15), "start": now - SIX_HOURS, "end": now},
            timeout=60,
        ).raise_for_status()
        queries += 1
    total += time.perf_counter() - started
    for panel in model["panels"]:
        if panel["type"] == "row":
            continue
        step = max(grafana_step(panel["gridPos"]["w"]), min_interval(panel))
        for index, target in enumerate(panel["targets"]):
            expr = _substitute(target["expr"], values, step)
            params: dict[str, str | float] = {"query": expr, "stats": "all"}
            if target["instant"]:
                url = f"{base}/api/v1/query"
                params["time"] = now
            else:
                url = f"{base}/api/v1/query_range"
                params.update(start=now - SIX_HOURS, end=now, step=step)
            began = time.perf_counter()
            body = httpx.get(url, params=params, timeout=120).json()
            spent = time.perf_counter() - began
            if body["status"] != "success":
                raise SystemExit(f"{model['title']} / {panel['title']}: {body.get('error')}")
            total += spent
            inside += body["data"]["stats"]["timings"]["execTotalTime"]
            timed.append((f"{panel['title']} #{index}", body["data"]["stats"]["timings"]["execTotalTime"]))
            samples += body["data"]["stats"]["samples"]["totalQueryableSamples"]
            queries += 1
            series = max(series, len(body["data"]["result"]))
            if spent > slowest[1]:
                slowest = (panel["title"], spent)
    return {
        "queries": queries,
        "total_s": round(total, 3),
        "prometheus_exec_s": round(inside, 3),
        "prometheus_cpu_s": round(cpu_seconds(pid) - cpu_start, 3),
        "samples_read": samples,
        "slowest_panel": slowest[0],
        "slowest_s": round(slowest[1], 3),
        "slowest_queries_prometheus_exec_s": {
            name: round(spent, 3) for name, spent in sorted(timed, key=lambda item: -item[1])[:5]
        },
        "most_series_in_one_query": series,
        "variables": values,
    }


def measure(nodes: int, args: argparse.Namespace, workdir: Path, bundle: Path) -> dict[str, Any]:
    promtool = shutil.which("promtool") or "promtool"
    began = time.monotonic()
    rule_files, prices = bundle_rules(bundle, args, workdir)
    ahead = args.ahead * 60 if args.ahead is not None else 20 + 0.15 * nodes
    end = time.time() + ahead
    om = workdir / "fleet.om"
    written = write_fleet(
        om, nodes, args.clusters, args.scrape, args.minutes, end, args.healthy_share, args.accounting
    )
    raw_series = written.pop("default")
    generated = time.monotonic()
    data = workdir / "data"
    create_blocks(promtool, om, data)
    loaded = time.monotonic()
    time.sleep(max(0.0, end + 1 - time.time()))
    data_age = time.time() - end
    with prometheus(workdir, data, args.interval, rule_files) as (base, pid):
        intervals = group_intervals(base)
        groups, rules_cpu, slowest_rules = group_durations(base, pid, args.evaluations, args.interval)
        health = rule_health(base)
        evaluated = last_evaluations(base)
        alerts = instant(base, "count by (alertname) (ALERTS)")
        group_samples = rule_samples(base, min(evaluated.values()))
        recorded_names = {
            s["metric"]["__name__"]: int(float(s["value"][1]))
            for s in instant(base, 'count by (__name__) ({__name__=~".+:.+:.+"})')
        }
        accounted = accounting_names(base)
        if args.history_hours:
            history = recorded_history(base, end - args.minutes * 60, args.history_hours * 3600)
    backfilled = 0.0
    if args.history_hours:
        began_backfill = time.monotonic()
        backfill(workdir, data, history, promtool)
        backfilled = time.monotonic() - began_backfill
    with prometheus(workdir, data, args.interval, rule_files) as (base, pid):
        if args.history_hours:
            group_durations(base, pid, 1, args.interval)  # the rules' series are fresh again
        health_restarted = rule_health(base)
        paths = sorted((bundle / "dashboards").glob("*.json"))
        models = {path.name: json.loads(path.read_text()) for path in paths}
        dashboards = {name: dashboard_time(base, pid, model) for name, model in models.items()}
        pause_rules(workdir, base, pid)
        quiet = {name: dashboard_time(base, pid, model) for name, model in models.items()}
    if max(evaluated.values()) - end > LOOKBACK_S:
        print(
            f"fleet_scale: the last timed evaluation came {max(evaluated.values()) - end:.0f} s after the raw"
            " data's end, past the lookback: its instant selectors found nothing (raise --ahead).",
            file=sys.stderr,
        )
    accounting_recorded = {k: v for k, v in sorted(recorded_names.items()) if k in accounted}
    backfilled_names: dict[str, int] = {}
    for labels, _, _ in history[0] if args.history_hours else []:
        if labels["__name__"] in accounted:
            backfilled_names[labels["__name__"]] = backfilled_names.get(labels["__name__"], 0) + 1
    return {
        "bundle": str(bundle),
        "rule_files": [p.name for p in rule_files],
        "accounting": args.accounting,
        "prices": prices,
        "nodes": nodes,
        "gpus": nodes * GPUS,
        "raw_series": raw_series,
        "recorded_series": sum(v for k, v in recorded_names.items() if k not in accounted),
        "accounting_raw_series": {k: v for k, v in written.items() if k not in KSM_FAMILIES},
        "kube_state_metrics_series": {k: v for k, v in written.items() if k in KSM_FAMILIES},
        "accounting_recorded_series": accounting_recorded,
        "build_s": {
            "generate": round(generated - began, 1),
            "promtool": round(loaded - generated, 1),
            "backfill": round(backfilled, 1),
        },
        "recorded_history_hours": args.history_hours,
        "recorded_history_series": len(history[0]) if args.history_hours else 0,
        "recorded_history_accounting_series": backfilled_names,
        "group_intervals_s": intervals,
        "data_age_at_start_s": round(data_age, 1),
        # Past Prometheus' 5 min lookback, instant selectors (gpu_info, kube_pod_owner...) find nothing.
        "data_age_at_last_timed_evaluation_s": round(max(evaluated.values()) - end, 1),
        "rule_groups_s": {k: round(v, 4) for k, v in groups.items()},
        "rules_total_s": round(sum(groups.values()), 4),
        "rules_cpu_s_per_cycle": round(rules_cpu, 4),
        "slowest_rules_s": {k: round(v, 4) for k, v in slowest_rules.items()},
        # Rules whose health is not ok, after the evaluations and after the restart on the history.
        "rules_not_ok": {
            name: {**health.get(name, {}).get("not_ok", {}), **after["not_ok"]}
            for name, after in health_restarted.items()
            if after["not_ok"] or health.get(name, {}).get("not_ok")
        },
        "rules_per_group": {name: group["rules"] for name, group in health.items()},
        # Pending and firing: Prometheus expands each one's labels and annotations every evaluation.
        "active_alerts": {a["metric"]["alertname"]: int(float(a["value"][1])) for a in alerts},
        "rule_groups_samples": group_samples,
        "rules_total_samples": sum(group_samples.values()),
        "dashboards": dashboards,
        "dashboards_rules_paused": quiet,
    }


def project(small: Mapping[str, Any], large: Mapping[str, Any], key: str, at: int) -> float:
    """Linear in the number of nodes through the two measured points."""
    slope = (float(large[key]) - float(small[key])) / (large["nodes"] - small["nodes"])
    return float(large[key]) + slope * (at - large["nodes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--clusters", type=int, default=4)
    parser.add_argument("--scrape", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--minutes", type=float, default=14.0, help="history written per series")
    parser.add_argument(
        "--ahead",
        type=float,
        help="minutes from the start to the end of the data, at least the build time"
        " (default: 20 s + 0.15 s per node)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=30.0,
        help="global rule evaluation interval (s), for groups without their own",
    )
    parser.add_argument(
        "--history-hours",
        type=float,
        default=6.0,
        help="hours of recorded series to backfill before the dashboards run (0: none)",
    )
    parser.add_argument("--evaluations", type=int, default=3)
    parser.add_argument(
        "--healthy-share",
        type=float,
        default=0.0,
        help="share of nodes whose GPUs all run the healthy profile, for a fleet with fewer active alerts"
        " (default 0: every node rotates the sim's eight profiles, so thousands of alerts are active)",
    )
    parser.add_argument(
        "--accounting",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the accounting group's series, kube-state-metrics' owner series and the accounting and price"
        " rules (default: on; --no-accounting: the default groups only)",
    )
    parser.add_argument(
        "--price-per-gpu-hour",
        type=float,
        default=3.5,
        help=f"price table of the rules: {CURRENCY} per GPU-hour of the sim GPU's model (0: the bundle's"
        " rules as shipped, no prices)",
    )
    parser.add_argument("--keep", type=Path, help="keep the TSDBs under this directory")
    parser.add_argument(
        "--bundle",
        type=Path,
        nargs="+",
        default=[REPO],
        help="checkouts whose rules/ and dashboards/ to measure, each on its own copy of the fleet",
    )
    args = parser.parse_args()
    if not 0.0 <= args.healthy_share <= 1.0:
        parser.error("--healthy-share must be between 0 and 1.")
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        print("fleet_scale: prometheus and promtool must be on PATH.", file=sys.stderr)
        return 1
    runs: dict[str, list[dict[str, Any]]] = {str(bundle): [] for bundle in args.bundle}
    for nodes in sorted(args.nodes):
        for index, bundle in enumerate(args.bundle):
            if args.keep:
                workdir = args.keep / f"fleet-{nodes}-{index}"
                workdir.mkdir(parents=True, exist_ok=True)
                result = measure(nodes, args, workdir, bundle)
            else:
                with tempfile.TemporaryDirectory(prefix=f"fleet-{nodes}-") as tmp:
                    result = measure(nodes, args, Path(tmp), bundle)
            result["budget"] = budgets(result)
            runs[str(bundle)].append(result)
            print(json.dumps(result), file=sys.stderr, flush=True)
    report: dict[str, Any] = {"runs": runs, "summary": {b: summary(r) for b, r in runs.items()}}
    if len(args.bundle) == 2:
        first, second = (runs[str(b)] for b in args.bundle)
        report["first_bundle_over_second"] = [
            {
                "nodes": a["nodes"],
                "rules_total": round(a["rules_total_s"] / max(b["rules_total_s"], 1e-9), 3),
                "rules_cpu": round(a["rules_cpu_s_per_cycle"] / max(b["rules_cpu_s_per_cycle"], 1e-9), 3),
                "rules_samples": round(a["rules_total_samples"] / max(b["rules_total_samples"], 1), 3),
                **{
                    f"{name} prometheus_exec{suffix}": round(
                        d["prometheus_exec_s"] / max(b[key].get(name, {}).get("prometheus_exec_s", 0), 1e-9),
                        3,
                    )
                    for key, suffix in (("dashboards", ""), ("dashboards_rules_paused", " rules paused"))
                    for name, d in a[key].items()
                    if name in b[key]
                },
            }
            for a, b in zip(first, second, strict=True)
        ]
    print(json.dumps(report, indent=2))
    return 0


def budgets(result: Mapping[str, Any]) -> dict[str, Any]:
    """One run's figures against the budgets, as ratios (at most 1 of the budget's value is met), and
    the same run's figures without the accounting groups' and the waste dashboard's share."""
    nodes = result["nodes"]
    cycle = max(result["group_intervals_s"].values())
    over_interval = {
        name: round(seconds / result["group_intervals_s"][name], 3)
        for name, seconds in result["rule_groups_s"].items()
    }
    slowest = max(d["prometheus_exec_s"] for d in result["dashboards_rules_paused"].values())
    figures = {
        "recorded_over_raw": round(result["recorded_series"] / max(result["raw_series"], 1), 3),
        "rules_cpu_over_cycle": round(result["rules_cpu_s_per_cycle"] / cycle, 3),
        "group_over_interval": max(over_interval.values(), default=0.0),
        "dashboard_s": slowest,
    }
    accounting_raw = sum(result["accounting_raw_series"].values())
    accounting_recorded = sum(result["accounting_recorded_series"].values())
    out: dict[str, Any] = {
        "raw_series_per_node": round(result["raw_series"] / nodes, 1),
        "recorded_series_per_node": round(result["recorded_series"] / nodes, 1),
    }
    met = {key: figures[key] <= BUDGETS[key] for key in BUDGETS}
    if result["accounting"]:
        with_accounting = (result["recorded_series"] + accounting_recorded) / max(
            result["raw_series"] + accounting_raw, 1
        )
        figures["recorded_over_raw_with_accounting"] = round(with_accounting, 3)
        met["recorded_over_raw_with_accounting"] = with_accounting <= BUDGETS["recorded_over_raw"]
        ungrouped = [name for name in over_interval if name not in ACCOUNTING_GROUPS]
        accounting_time = sum(v for k, v in result["rule_groups_s"].items() if k in ACCOUNTING_GROUPS)
        accounting_samples = sum(
            v for k, v in result["rule_groups_samples"].items() if k in ACCOUNTING_GROUPS
        )
        out.update(
            {
                "accounting_raw_series_per_node": round(accounting_raw / nodes, 1),
                "accounting_raw_series_per_node_by_family": {
                    k: round(v / nodes, 1) for k, v in result["accounting_raw_series"].items()
                },
                "kube_state_metrics_series_per_node": {
                    k: round(v / nodes, 1) for k, v in result["kube_state_metrics_series"].items()
                },
                "accounting_recorded_series_per_node": round(accounting_recorded / nodes, 2),
                "accounting_recorded_series_per_node_by_name": {
                    k: round(v / nodes, 3) for k, v in result["accounting_recorded_series"].items()
                },
                # Measured shares of this run's rules, not a run without them.
                "accounting_share_of_rule_time": round(
                    accounting_time / max(result["rules_total_s"], 1e-9), 3
                ),
                "accounting_share_of_rule_samples": round(
                    accounting_samples / max(result["rules_total_samples"], 1), 3
                ),
                "figures_without_accounting": {
                    "recorded_over_raw": figures["recorded_over_raw"],
                    "group_over_interval": max((over_interval[k] for k in ungrouped), default=0.0),
                    "dashboard_s": max(
                        (
                            d["prometheus_exec_s"]
                            for name, d in result["dashboards_rules_paused"].items()
                            if name != WASTE_DASHBOARD
                        ),
                        default=0.0,
                    ),
                },
            }
        )
    return {
        **out,
        "cycle_s": cycle,
        "group_over_interval_each": over_interval,
        "figures": figures,
        "budgets": BUDGETS,
        "met": met,
    }


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Growth from the smallest to the largest fleet, and the 10,000-node projection."""
    if len(results) < 2:
        return {}
    small, large = results[0], results[-1]
    out: dict[str, Any] = {
        "nodes_ratio": large["nodes"] / small["nodes"],
        "rules_total_ratio": round(large["rules_total_s"] / max(small["rules_total_s"], 1e-9), 2),
        "rules_cpu_ratio": round(
            large["rules_cpu_s_per_cycle"] / max(small["rules_cpu_s_per_cycle"], 1e-9), 2
        ),
        "rules_samples_ratio": round(large["rules_total_samples"] / max(small["rules_total_samples"], 1), 2),
        "dashboard_samples_ratio": {
            name: round(d["samples_read"] / max(small["dashboards"][name]["samples_read"], 1), 2)
            for name, d in large["dashboards"].items()
        },
    }
    rules_10k = project(small, large, "rules_total_s", 10_000)
    cpu_10k = project(small, large, "rules_cpu_s_per_cycle", 10_000)
    out["projected_rules_total_s_at_10000"] = round(rules_10k, 3)
    out["projected_rules_cpu_s_per_cycle_at_10000"] = round(cpu_10k, 3)
    return out


if __name__ == "__main__":
    sys.exit(main())
