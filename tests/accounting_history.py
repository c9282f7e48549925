"""A known history of smlens' accounting series, its exact truth, and a Prometheus that serves it.

:class:`History` simulates the exporter's ledger (smlens.pipeline.accounting) tick by tick (1 s) on two
clusters for four hours, and what Prometheus scraped of it every 15 s:

- cluster ``east``, node ``node-a`` (NVIDIA H200, 132 SMs), scraped by two jobs (``smlens`` and
  ``smlens-dup``, 8 s apart): the same series twice, differing only in job and instance, but the second
  job's scrapes failing from 1h30m to 2h;

  - GPU 0: pod serving/infer-7d9f-abcde (ReplicaSet infer-7d9f of Deployment infer) compute-bound, then
    idle holding memory, hollow, and compute-bound again from 0 (its compute_bound series went stale at
    1h05m and comes back at 2h30m);
  - GPU 1: no workload (idle), then pod research/train-w-0-0-xyz (Job train-w-0 of JobSet train) stalled
    and partial, pod research/train-w-1-0-def (Job train-w-1 of JobSet train) memory-bound, no workload;
  - GPU 2: pod research/debug-shell, which kube-state-metrics does not know, idle; then pod
    lab/notebook-0 (StatefulSet notebook) hollow and idle holding memory by turns of 20 minutes (each
    series drops out and comes back from 0, again and again);
  - GPU 3 in MIG mode: instance 1 (3g.71gb, 60 of 132 SMs) pod serving/infer-7d9f-fghij compute-bound;
    instance 2 (1g.18gb, 16 SMs) no workload, then pod research/eval-0-q (Job eval, no owner) stalled;

- cluster ``west``, node ``node-b`` (NVIDIA A100-SXM4-80GB, 108 SMs), one job, its exporter restarted at
  2h10m (down 40 s: every counter starts again from 0):

  - GPU 0: Slurm job 4242 compute-bound, then Slurm job 4243 hollow;
  - GPU 1: pod serving/infer-5c6b-zzzzz (Deployment infer of this cluster) partial, idle for 100 s at
    51m40s and again at 2h30m (the idle series' last sample before its first drop falls in the last
    5 minutes before 1h, it is absent from 1h to 2h, and it comes back from 0 to the same value).

With it: gpu_info, gpu_mig_sm_share_ratio and kube-state-metrics' kube_pod_owner, kube_replicaset_owner
and kube_job_owner, as Prometheus stores them (labels with empty values left out, a ``cluster`` label
and the target's job and instance on each series).

The truth is what the exporter counted: a tick at time t adds its second to the account of that tick's
class and holder, and :meth:`History.gpu_seconds` sums the ticks in a range (start, end], a MIG
instance's seconds times its share, grouped by any of :data:`LABELS` (the owner is the top owner the
kube-state-metrics series give, as smlens.bundle.accounting resolves it). :meth:`History.tolerance` is
one scrape interval per series (account incarnation) counted in a group: what any method that reads
the scraped samples may miss at the ends of the range or before a reset.

:func:`backfill` writes the history as TSDB blocks (``promtool tsdb create-blocks-from openmetrics``);
:func:`serve` runs a Prometheus on them, on loopback, optionally behind TLS and basic auth (a web config);
:func:`served` does both for :func:`recent`, a history ending an hour or two before now.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from conftest import free_port
from promstack import _Process, require_any
from smlens import names as n
from smlens.pipeline.accounting import LINGER_SECONDS

SCRAPE = 15  # seconds between scrapes of the exporters
KSM_SCRAPE = 30
HOURS = 4
DURATION = HOURS * 3600
CLUSTER = "cluster"  # Thresholds.cluster_label's default
H200, A100 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB"
# The labels the truth groups by.
LABELS = (
    CLUSTER,
    n.HOSTNAME,
    n.GPU,
    n.UUID,
    n.GPU_INSTANCE,
    n.MIG_PROFILE,
    "model",
    n.VERDICT,
    n.NAMESPACE,
    n.POD,
    n.CONTAINER,
    n.SLURM_JOB,
    n.OWNER_KIND,
    n.OWNER_NAME,
)


@dataclass(frozen=True)
class Holder:
    """Who holds a GPU: a pod's container, a Slurm job, or nobody (all empty); ``owner`` is its top owner
    as the report and the rules must resolve it."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    slurm_job: str = ""
    owner: tuple[str, str] = ("", "")


NOBODY = Holder()


@dataclass(frozen=True)
class Segment:
    start: int  # seconds after the history's start: the ticks start <= t < end are this segment's
    end: int
    holder: Holder
    verdict: str


@dataclass(frozen=True, eq=False)  # by identity: hashed on every simulated tick
class Device:
    """A whole GPU, or a MIG GPU instance of one (``gpu_instance`` set, ``share`` its share of the SMs)."""

    gpu: str
    uuid: str
    segments: tuple[Segment, ...]
    gpu_instance: str = ""
    mig_profile: str = ""
    share: float = 1.0

    def at(self, t: int) -> Segment:
        for segment in self.segments:
            if segment.start <= t < segment.end or (t == DURATION and segment.end == DURATION):
                return segment
        raise AssertionError(f"no segment at {t}")


@dataclass(frozen=True, eq=False)
class Node:
    cluster: str
    hostname: str
    model: str
    devices: tuple[Device, ...]
    jobs: tuple[tuple[str, str, float], ...]  # (job, instance, offset of its scrapes in the interval)
    down: tuple[int, int] | None = None  # the exporter's restart: no tick nor scrape from .. to
    failing: tuple[str, int, int] | None = None  # a job whose scrapes fail from .. to

    def up(self, t: float) -> bool:
        return self.down is None or not self.down[0] <= t < self.down[1]

    def scraped(self, job: str, at: float) -> bool:
        """Whether ``job``'s scrape at ``at`` succeeds."""
        if self.failing is not None and self.failing[0] == job and self.failing[1] <= at < self.failing[2]:
            return False
        return self.up(at)

    def first_tick(self, t: int) -> bool:
        """The first tick of a process: it accounts no seconds (no capture before it)."""
        return t == 0 or (self.down is not None and t == self.down[1])


@dataclass(frozen=True)
class Account:
    node: Node
    device: Device
    verdict: str
    holder: Holder

    def labels(self) -> dict[str, str]:
        """Every label of LABELS, empty ones included."""
        h = self.holder
        return {
            CLUSTER: self.node.cluster,
            n.HOSTNAME: self.node.hostname,
            n.GPU: self.device.gpu,
            n.UUID: self.device.uuid,
            n.GPU_INSTANCE: self.device.gpu_instance,
            n.MIG_PROFILE: self.device.mig_profile,
            "model": self.node.model,
            n.VERDICT: self.verdict,
            n.NAMESPACE: h.namespace,
            n.POD: h.pod,
            n.CONTAINER: h.container,
            n.SLURM_JOB: h.slurm_job,
            n.OWNER_KIND: h.owner[0],
            n.OWNER_NAME: h.owner[1],
        }

    def series_labels(self) -> dict[str, str]:
        """The labels of its gpu_verdict_seconds_total series, as the exporter writes them."""
        all_labels = self.labels()
        return {k: all_labels[k] for k in (CLUSTER, *n.VERDICT_SECONDS_LABELS)}


def _pod(namespace: str, pod: str, container: str, kind: str, name: str) -> Holder:
    return Holder(namespace=namespace, pod=pod, container=container, owner=(kind, name))


INFER_A = _pod("serving", "infer-7d9f-abcde", "server", "Deployment", "infer")
INFER_B = _pod("serving", "infer-7d9f-fghij", "server", "Deployment", "infer")
TRAIN_0 = _pod("research", "train-w-0-0-xyz", "trainer", "JobSet", "train")
TRAIN_1 = _pod("research", "train-w-1-0-def", "trainer", "JobSet", "train")
DEBUG = _pod("research", "debug-shell", "sh", n.OWNER_KIND_POD, "debug-shell")
NOTEBOOK = _pod("lab", "notebook-0", "notebook", "StatefulSet", "notebook")
EVAL = _pod("research", "eval-0-q", "eval", "Job", "eval")
INFER_WEST = _pod("serving", "infer-5c6b-zzzzz", "server", "Deployment", "infer")
SLURM_4242 = Holder(slurm_job="4242", owner=(n.OWNER_KIND_SLURM_JOB, "4242"))
SLURM_4243 = Holder(slurm_job="4243", owner=(n.OWNER_KIND_SLURM_JOB, "4243"))

# kube-state-metrics, per cluster: (pod, its kube_pod_owner kind and name); the ReplicaSets' and Jobs'
# owners. debug-shell has no series: kube-state-metrics does not know it.
POD_OWNERS = {
    "east": [
        (INFER_A, "ReplicaSet", "infer-7d9f"),
        (INFER_B, "ReplicaSet", "infer-7d9f"),
        (TRAIN_0, "Job", "train-w-0"),
        (TRAIN_1, "Job", "train-w-1"),
        (NOTEBOOK, "StatefulSet", "notebook"),
        (EVAL, "Job", "eval"),
    ],
    "west": [(INFER_WEST, "ReplicaSet", "infer-5c6b")],
}
REPLICASET_OWNERS = {
    "east": [("serving", "infer-7d9f", "Deployment", "infer")],
    "west": [("serving", "infer-5c6b", "Deployment", "infer")],
}
JOB_OWNERS = {
    "east": [
        ("research", "train-w-0", "JobSet", "train"),
        ("research", "train-w-1", "JobSet", "train"),
        ("research", "eval", "<none>", "<none>"),
    ],
    "west": [],
}


def _alternating(start: int, end: int, turn: int, holder: Holder, verdicts: Sequence[str]) -> list[Segment]:
    segments, at, index = [], start, 0
    while at < end:
        segments.append(Segment(at, min(at + turn, end), holder, verdicts[index % len(verdicts)]))
        at, index = at + turn, index + 1
    return segments


def _nodes() -> tuple[Node, ...]:
    h, s = 3600, Segment
    a = Node(
        "east",
        "node-a",
        H200,
        (
            Device("0", "GPU-a0", (
                s(0, h, INFER_A, n.VERDICT_COMPUTE_BOUND),
                s(h, h * 3 // 2, INFER_A, n.VERDICT_IDLE_MEMORY_HELD),
                s(h * 3 // 2, h * 5 // 2, INFER_A, n.VERDICT_HOLLOW),
                s(h * 5 // 2, DURATION, INFER_A, n.VERDICT_COMPUTE_BOUND),
            )),
            Device("1", "GPU-a1", (
                s(0, h // 2, NOBODY, n.VERDICT_IDLE),
                s(h // 2, 2 * h, TRAIN_0, n.VERDICT_STALLED),
                s(2 * h, 2 * h + 300, TRAIN_0, n.VERDICT_PARTIAL),
                s(2 * h + 300, 3 * h, TRAIN_1, n.VERDICT_MEMORY_BOUND),
                s(3 * h, DURATION, NOBODY, n.VERDICT_IDLE),
            )),
            Device("2", "GPU-a2", (
                s(0, 5000, DEBUG, n.VERDICT_IDLE),
                *_alternating(5000, DURATION, 1200, NOTEBOOK, (n.VERDICT_HOLLOW, n.VERDICT_IDLE_MEMORY_HELD)),
            )),
            Device("3", "GPU-a3", (
                s(0, DURATION, INFER_B, n.VERDICT_COMPUTE_BOUND),
            ), "1", "3g.71gb", 60 / 132),
            Device("3", "GPU-a3", (
                s(0, 2 * h, NOBODY, n.VERDICT_IDLE),
                s(2 * h, DURATION, EVAL, n.VERDICT_STALLED),
            ), "2", "1g.18gb", 16 / 132),
        ),
        (("smlens", "10.0.0.1:10132", 3.5), ("smlens-dup", "node-a:10132", 11.5)),
        failing=("smlens-dup", h * 3 // 2, 2 * h),
    )  # fmt: skip
    b = Node(
        "west",
        "node-b",
        A100,
        (
            Device("0", "GPU-b0", (
                s(0, 10000, SLURM_4242, n.VERDICT_COMPUTE_BOUND),
                s(10000, DURATION, SLURM_4243, n.VERDICT_HOLLOW),
            )),
            Device("1", "GPU-b1", (
                s(0, 3100, INFER_WEST, n.VERDICT_PARTIAL),
                s(3100, 3200, INFER_WEST, n.VERDICT_IDLE),
                s(3200, 9000, INFER_WEST, n.VERDICT_PARTIAL),
                s(9000, 9100, INFER_WEST, n.VERDICT_IDLE),
                s(9100, DURATION, INFER_WEST, n.VERDICT_PARTIAL),
            )),
        ),
        (("smlens", "10.0.1.1:10132", 7.25),),
        down=(7800, 7840),
    )  # fmt: skip
    return (a, b)


def _labels_text(labels: Mapping[str, str]) -> str:
    """OpenMetrics label set; empty values left out, as Prometheus stores them."""
    kept = [f'{k}="{v}"' for k, v in sorted(labels.items()) if v != ""]
    return "{" + ",".join(kept) + "}"


class History:
    """The simulated ledger of every node from ``start`` (unix time) for DURATION seconds, its scraped
    samples and its truth."""

    def __init__(self, start: float) -> None:
        self.start = float(start)
        self.end = self.start + DURATION
        self.nodes = _nodes()
        self.ticks: dict[Account, list[int]] = {}  # the ticks (seconds after start) that added a second
        self.lives: dict[Account, list[tuple[int, int]]] = {}  # incarnations: (first tick, last tick)
        # Series text (name and labels) to its samples (unix time, value), per family.
        self.families: dict[str, tuple[str, dict[str, list[tuple[float, float]]]]] = {}
        for node in self.nodes:
            self._simulate(node)
        self._kube_state_metrics()

    # -- the simulation --------------------------------------------------------------------------

    def _series(
        self, family: str, kind: str, name: str, labels: Mapping[str, str]
    ) -> list[tuple[float, float]]:
        _kind, series = self.families.setdefault(family, (kind, {}))
        return series.setdefault(name + _labels_text(labels), [])

    def _simulate(self, node: Node) -> None:
        ledger: dict[Account, tuple[int, int]] = {}  # account: (seconds, tick that last added)
        scrapes = sorted(
            (k * SCRAPE + offset, job, instance)
            for job, instance, offset in node.jobs
            for k in range(DURATION // SCRAPE + 1)
            if k * SCRAPE + offset <= DURATION
        )
        next_scrape = 0
        for t in range(DURATION + 1):
            if node.up(t):
                if node.first_tick(t):
                    ledger = {}
                else:
                    for device in node.devices:
                        segment = device.at(t)
                        account = Account(node, device, segment.verdict, segment.holder)
                        seconds = ledger[account][0] if account in ledger else 0
                        if account not in ledger:
                            self.lives.setdefault(account, []).append((t, t))
                        first, _last = self.lives[account][-1]
                        self.lives[account][-1] = (first, t)
                        ledger[account] = (seconds + 1, t)
                        self.ticks.setdefault(account, []).append(t)
                    ledger = {a: e for a, e in ledger.items() if t - e[1] < LINGER_SECONDS}
            while next_scrape < len(scrapes) and scrapes[next_scrape][0] < t + 1:
                at, job, instance = scrapes[next_scrape]
                next_scrape += 1
                if node.scraped(job, at):
                    self._scrape(node, ledger, self.start + at, job, instance)

    def _scrape(
        self, node: Node, ledger: Mapping[Account, tuple[int, int]], at: float, job: str, instance: str
    ) -> None:
        target = {CLUSTER: node.cluster, "job": job, "instance": instance}
        for account, (seconds, _added) in ledger.items():
            labels = {**target, **account.series_labels()}
            self._series(n.GPU_VERDICT_SECONDS, "counter", f"{n.GPU_VERDICT_SECONDS}_total", labels).append(
                (at, float(seconds))
            )
        gpus = {d.gpu: d.uuid for d in node.devices}
        for gpu, uuid in gpus.items():
            labels = {**target, n.GPU: gpu, n.UUID: uuid, n.HOSTNAME: node.hostname, "model": node.model}
            labels["driver_version"] = "550.54.15"
            self._series(n.GPU_INFO, "gauge", n.GPU_INFO, labels).append((at, 1.0))
        for d in node.devices:
            if d.gpu_instance:
                labels = {**target, n.GPU: d.gpu, n.UUID: d.uuid, n.HOSTNAME: node.hostname}
                labels.update({n.GPU_INSTANCE: d.gpu_instance, n.MIG_PROFILE: d.mig_profile})
                self._series(n.GPU_MIG_SM_SHARE_RATIO, "gauge", n.GPU_MIG_SM_SHARE_RATIO, labels).append(
                    (at, d.share)
                )

    def _kube_state_metrics(self) -> None:
        """The owner series, scraped every KSM_SCRAPE seconds: a pod's from two minutes before it first
        holds a GPU to a minute after it last does, the ReplicaSets' and Jobs' for the whole history."""
        held: dict[tuple[str, Holder], tuple[int, int]] = {}
        for node in self.nodes:
            for device in node.devices:
                for segment in device.segments:
                    key = (node.cluster, segment.holder)
                    first, last = held.get(key, (segment.start, segment.end))
                    held[key] = (min(first, segment.start), max(last, segment.end))
        for cluster in POD_OWNERS:
            target = {CLUSTER: cluster, "job": "kube-state-metrics", "instance": f"ksm-{cluster}:8080"}
            everywhere = [t for t in range(0, DURATION + 1, KSM_SCRAPE)]
            for holder, kind, name in POD_OWNERS[cluster]:
                first, last = held[(cluster, holder)]
                labels = {**target, n.NAMESPACE: holder.namespace, n.POD: holder.pod, n.OWNER_KIND: kind}
                labels.update({n.OWNER_NAME: name, "owner_is_controller": "true", "uid": f"uid-{holder.pod}"})
                samples = self._series("kube_pod_owner", "gauge", "kube_pod_owner", labels)
                samples.extend((self.start + t, 1.0) for t in everywhere if first - 120 <= t <= last + 60)
            for namespace, replicaset, kind, name in REPLICASET_OWNERS[cluster]:
                labels = {**target, n.NAMESPACE: namespace, "replicaset": replicaset, n.OWNER_KIND: kind}
                labels.update({n.OWNER_NAME: name, "owner_is_controller": "true"})
                samples = self._series("kube_replicaset_owner", "gauge", "kube_replicaset_owner", labels)
                samples.extend((self.start + t, 1.0) for t in everywhere)
            for namespace, job, kind, name in JOB_OWNERS[cluster]:
                controller = "<none>" if kind == "<none>" else "true"
                labels = {**target, n.NAMESPACE: namespace, "job_name": job, n.OWNER_KIND: kind}
                labels.update({n.OWNER_NAME: name, "owner_is_controller": controller})
                samples = self._series("kube_job_owner", "gauge", "kube_job_owner", labels)
                samples.extend((self.start + t, 1.0) for t in everywhere)

    # -- the samples ------------------------------------------------------------------------------

    def openmetrics(self) -> Iterator[str]:
        """The history as OpenMetrics text, line by line, for promtool."""
        for family, (kind, series) in sorted(self.families.items()):
            yield f"# TYPE {family} {kind}\n"
            for text, samples in sorted(series.items()):
                for at, value in samples:
                    yield f"{text} {value:.10g} {at:.3f}\n"
        yield "# EOF\n"

    def series_count(self, family: str) -> int:
        return len(self.families[family][1])

    # -- the truth --------------------------------------------------------------------------------

    def _ticks_in(self, ticks: list[int], start: float, end: float) -> int:
        return sum(1 for t in ticks if start < self.start + t <= end)

    def gpu_seconds(self, start: float, end: float, keys: Sequence[str]) -> dict[tuple[str, ...], float]:
        """GPU-seconds the exporter counted in (start, end] per value of ``keys`` (names of LABELS)."""
        totals: dict[tuple[str, ...], float] = {}
        for account, ticks in self.ticks.items():
            count = self._ticks_in(ticks, start, end)
            if count:
                labels = account.labels()
                key = tuple(labels[k] for k in keys)
                totals[key] = totals.get(key, 0.0) + count * account.device.share
        return totals

    def tolerance(self, start: float, end: float, keys: Sequence[str]) -> dict[tuple[str, ...], float]:
        """One scrape interval of GPU-seconds per incarnation of a series that ticked in the range or in
        the scrape interval before it, per value of ``keys``."""
        totals: dict[tuple[str, ...], float] = {}
        for account, lives in self.lives.items():
            labels = account.labels()
            key = tuple(labels[k] for k in keys)
            for first, last in lives:
                if self.start + last > start - SCRAPE and self.start + first <= end:
                    totals[key] = totals.get(key, 0.0) + SCRAPE * account.device.share
        return totals

    def cost(
        self,
        start: float,
        end: float,
        keys: Sequence[str],
        gpu_hour: Mapping[str, float],
        mig_instance_hour: Mapping[str, float],
    ) -> dict[tuple[str, ...], float]:
        """Money of the GPU-seconds in (start, end]: an instance's hours at its profile's price where
        listed, else GPU-seconds at the model's; seconds of a model without a price cost nothing."""
        totals: dict[tuple[str, ...], float] = {}
        for account, ticks in self.ticks.items():
            count = self._ticks_in(ticks, start, end)
            labels = account.labels()
            profile_price = mig_instance_hour.get(f"{labels['model']}/{labels[n.MIG_PROFILE]}")
            if account.device.gpu_instance and profile_price is not None:
                money = count * profile_price / 3600
            elif labels["model"] in gpu_hour:
                money = count * account.device.share * gpu_hour[labels["model"]] / 3600
            else:
                continue
            key = tuple(labels[k] for k in keys)
            totals[key] = totals.get(key, 0.0) + money
        return totals


# -- TSDB blocks and a Prometheus on them ---------------------------------------------------------


def recent() -> History:
    """The history ending an hour or two before now (whole hours), so that `--since 7d` and a
    Prometheus' retention take it in as they would a real one."""
    return History(math.floor(time.time() / 3600) * 3600 - 5 * 3600)


def backfill(history: History, data: Path, workdir: Path) -> None:
    """The history as TSDB blocks in ``data`` (a Prometheus' --storage.tsdb.path)."""
    promtool = require_any("promtool")
    om = workdir / "history.om"
    with om.open("w") as out:
        out.writelines(history.openmetrics())
    data.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    om.unlink()


def copy_blocks(source: Path, data: Path) -> None:
    """The blocks of one TSDB directory into another (a second Prometheus cannot share the first's)."""
    data.mkdir(parents=True, exist_ok=True)
    for block in source.iterdir():
        if block.is_dir() and (block / "meta.json").exists():
            shutil.copytree(block, data / block.name)


@contextmanager
def served(workdir: Path, flags: Sequence[str] = ()) -> Iterator[tuple[History, str, Path]]:
    """A recent history backfilled into ``workdir``/data and a Prometheus serving it: yields the
    history, Prometheus' base URL and the TSDB directory."""
    history = recent()
    backfill(history, workdir / "data", workdir)
    with serve(workdir / "prometheus", workdir / "data", flags=flags) as url:
        yield history, url, workdir / "data"


@contextmanager
def serve(
    workdir: Path,
    data: Path,
    web_config: Mapping[str, Any] | None = None,
    client: Mapping[str, Any] | None = None,
    flags: Sequence[str] = (),
) -> Iterator[str]:
    """A Prometheus on loopback serving the TSDB ``data``, scraping nothing; ``web_config`` its
    --web.config.file (TLS, basic auth), ``client`` the httpx options that get through it. Yields the
    base URL and stops Prometheus on leaving."""
    binary = require_any("prometheus")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}, "scrape_configs": []}))
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        *flags,
    ]
    scheme = "http"
    if web_config is not None:
        web = workdir / "web.yml"
        web.write_text(yaml.safe_dump(dict(web_config)))
        argv.append(f"--web.config.file={web}")
        scheme = "https" if "tls_server_config" in web_config else "http"
    process = _Process(argv, workdir / "prometheus.log")
    base = f"{scheme}://127.0.0.1:{port}"
    try:
        _wait_ready(base, process, dict(client or {}))
        yield base
    finally:
        process.stop()


def _wait_ready(base: str, process: _Process, client: dict[str, Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0, **client) as http:
        while time.monotonic() < deadline:
            if process.process.poll() is not None:
                raise RuntimeError(f"Prometheus exited: {process.log.read_text()[-2000:]}")
            try:
                if http.get(f"{base}/-/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"Prometheus at {base} not ready after {timeout} s")
