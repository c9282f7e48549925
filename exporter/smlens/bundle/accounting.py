"""The accounting rules: GPU-seconds by verdict class per owner, namespace, cluster and fleet, their
cost where a price table is given, and the alert for the one slow rank of a job.

An owner is what owns a workload's pods, resolved from kube-state-metrics to the top owner it gives
(a Deployment's ReplicaSet to the Deployment, a Job to its CronJob or JobSet; a Kubeflow, Ray or other
controller as it is), or the pod itself where kube-state-metrics knows none; a Slurm job on a node
without pods; nothing (``owner_kind=""``) for seconds no workload held. The labels are ``owner_kind``
and ``owner_name``, never Prometheus' own ``job``.

GPU-seconds count a MIG GPU instance's seconds times its share of the GPU's SMs, so that an hour of
every instance of a GPU is one GPU-hour. A cost is a GPU-second at its model's price per GPU-hour; an
instance whose ``<model>/<profile>`` has a price of its own costs that per hour of the instance.
"""

from __future__ import annotations

from collections.abc import Callable

from smlens import names as n
from smlens.bundle.alerts import Alert, alert_rule
from smlens.bundle.layers import GPU, hollow_name, mean_name, stalled_name
from smlens.bundle.promql import by, number, one_of, quoted, total
from smlens.bundle.series import SM_ACTIVE_MEAN, UTILIZATION_MEAN
from smlens.verdicts.thresholds import Prices, Thresholds

Rule = dict[str, object]
Matched = Callable[[str], str]  # PromQL of series selected by the matchers it is given

OWNER_LABELS = (n.NAMESPACE, n.OWNER_KIND, n.OWNER_NAME)
# The owner layer keeps the GPU model and MIG profile: a GPU-second's price depends on them.
OWNER_LEVEL_LABELS = (*OWNER_LABELS, n.VERDICT, "model", n.MIG_PROFILE)
LEVELS = {
    "owner": OWNER_LEVEL_LABELS,
    "namespace": (n.NAMESPACE, n.VERDICT),
    "cluster": (n.VERDICT,),
    "fleet": (n.VERDICT,),
}
SECONDS = "gpu_verdict_seconds"
COST = "gpu_cost"
PRICE = "model:gpu_price_per_hour:configured"
CURRENCY = "currency"
# kube-state-metrics' series and labels for the owners of pods, ReplicaSets and Jobs.
KSM_POD_OWNER = "kube_pod_owner"
KSM_REPLICASET_OWNER = "kube_replicaset_owner"
KSM_JOB_OWNER = "kube_job_owner"
# Owner kinds whose own owner kube-state-metrics gives, with its series and the label naming them.
OWNED_OWNERS = (("ReplicaSet", KSM_REPLICASET_OWNER, "replicaset"), ("Job", KSM_JOB_OWNER, "job_name"))
# The ways a GPU series names its workload, with the owner each falls back to (label_replace's source).
FALLBACKS = (
    ('pod!=""', n.OWNER_KIND_POD, n.POD),
    (f'pod="", {n.SLURM_JOB}!=""', n.OWNER_KIND_SLURM_JOB, n.SLURM_JOB),
)
NO_WORKLOAD = f'pod="", {n.SLURM_JOB}=""'
# The top owner of each pod that holds a GPU (value 1), recorded as kubernetes-mixin records pods' workloads.
GPU_POD_OWNER = "namespace_owner_pod:kube_pod_owner:top_of_gpu_pods"


def name(level: str, metric: str, window: str) -> str:
    """A recorded accounting series: per second, GPU-seconds (SECONDS) or money (COST)."""
    return f"{level}:{metric}:rate{window}"


def top_owner(cluster: str, window: str) -> str:
    """Per pod that kube-state-metrics knew an owner of within ``window``, its top owner: series of value
    1 labelled (cluster, namespace, pod, owner_kind, owner_name), one per pod. The window keeps a
    departed pod's owner while the rate windows still hold its seconds; of two owners one pod name had
    in it (a pod made again under another owner), one is taken rather than failing the whole join."""
    key = f"{cluster}, {n.NAMESPACE}, {n.POD}, {n.OWNER_KIND}, {n.OWNER_NAME}"
    controller = 'owner_is_controller="true"'
    named = f'{n.OWNER_KIND}!~"|<none>"'

    def known(series: str, matchers: str) -> str:
        return f"last_over_time({series}{{{matchers}}}[{window}])"

    parts = []
    for kind, series, label in OWNED_OWNERS:
        owned = known(KSM_POD_OWNER, f"{n.OWNER_KIND}={quoted(kind)}, {controller}")
        parts.append(
            f"max by ({key}) (\n"
            f'  label_replace({owned}, "{label}", "$1", "{n.OWNER_NAME}", "(.+)")\n'
            f"  * on ({cluster}, {n.NAMESPACE}, {label}) group_left ({n.OWNER_KIND}, {n.OWNER_NAME})\n"
            f"  topk by ({cluster}, {n.NAMESPACE}, {label}) (1,\n"
            f"    max by ({cluster}, {n.NAMESPACE}, {label}, {n.OWNER_KIND}, {n.OWNER_NAME})"
            f" ({known(series, f'{named}, {controller}')})\n  )\n)"
        )
    parts.append(f"max by ({key}) ({known(KSM_POD_OWNER, f'{named}, {controller}')})")
    union = f"\nor on ({cluster}, {n.NAMESPACE}, {n.POD})\n".join(parts)
    return f"topk by ({cluster}, {n.NAMESPACE}, {n.POD}) (1,\n{union}\n)"


def _owned_by(expr: str, kind: str, source: str) -> str:
    """``expr`` with owner_kind ``kind`` and owner_name the value of its label ``source``."""
    return (
        f'label_replace(label_replace(\n{expr}\n, "{n.OWNER_KIND}", "{kind}", "", ""),'
        f' "{n.OWNER_NAME}", "$1", "{source}", "(.+)")'
    )


def _with_owner(series: Matched, cluster: str, gpu_key: str, owners: str, pods_only: bool = False) -> str:
    """``series`` (of the series' own matchers) with owner labels: the top owner of its pod (``owners``:
    top_owner's expression or its recorded series), else its pod, else its Slurm job, else none;
    ``pods_only``: the series of pods alone (per-GPU series carry no Slurm job); ``gpu_key`` the labels
    that tell its series apart."""
    branches = [
        f"(\n{series(FALLBACKS[0][0])}\n)\n* on ({cluster}, {n.NAMESPACE}, {n.POD})"
        f" group_left ({n.OWNER_KIND}, {n.OWNER_NAME}) (\n{owners}\n)"
    ]
    for matchers, kind, source in FALLBACKS[:1] if pods_only else FALLBACKS:
        branches.append(f"or on ({gpu_key})\n{_owned_by(series(matchers), kind, source)}")
    if not pods_only:
        branches.append(f"or\n{series(NO_WORKLOAD)}")
    return "\n".join(branches)


def _gpu_seconds(t: Thresholds) -> Matched:
    """Per raw series (deduplicated over scrape jobs), GPU-seconds per second with the GPU's model."""
    c, w = t.cluster_label, t.window
    series = by((c, *n.VERDICT_SECONDS_LABELS))
    counter = total(n.GPU_VERDICT_SECONDS)
    instance = f"{c}, {n.HOSTNAME}, {n.UUID}, {n.GPU_INSTANCE}"
    gpu = f"{c}, {n.HOSTNAME}, {n.UUID}"

    def selected(matchers: str) -> str:
        whole = f'max {series}(rate({counter}{{gpu_instance="", {matchers}}}[{w}]))'
        sliced = (
            f'max {series}(rate({counter}{{gpu_instance!="", {matchers}}}[{w}]))\n'
            f"* on ({instance}) group_left () max by ({instance}) ({n.GPU_MIG_SM_SHARE_RATIO})"
        )
        return (
            f"(\n{whole}\nor\n{sliced}\n)\n"
            f"* on ({gpu}) group_left (model) max by ({gpu}, model) ({n.GPU_INFO})"
        )

    return selected


def _owner_seconds(t: Thresholds) -> str:
    c = t.cluster_label
    gpu_key = ", ".join((c, *n.VERDICT_SECONDS_LABELS))
    owned = _with_owner(_gpu_seconds(t), c, gpu_key, top_owner(c, t.window))
    return f"sum by ({c}, {', '.join(OWNER_LEVEL_LABELS)}) (\n{owned}\n)"


def _owner_cost(t: Thresholds) -> str:
    """Money per second per owner: GPU-seconds at their model's price, or an instance's seconds at its
    profile's, where it has one (a profile's share of a model's SMs is the same on every GPU)."""
    c, w = t.cluster_label, t.window
    seconds = name("owner", SECONDS, w)
    own = f"{c}, {', '.join(OWNER_LEVEL_LABELS)}, {CURRENCY}"
    gpu = f"{c}, {n.HOSTNAME}, {n.UUID}"
    share = (
        f"max by (model, {n.MIG_PROFILE}) (\n  {n.GPU_MIG_SM_SHARE_RATIO}\n"
        f"  * on ({gpu}) group_left (model) max by ({gpu}, model) ({n.GPU_INFO})\n)"
    )
    model_priced = (
        f'({seconds} unless on (model, {n.MIG_PROFILE}) {PRICE}{{{n.MIG_PROFILE}!=""}})\n'
        f'* on (model) group_left ({CURRENCY}) {PRICE}{{{n.MIG_PROFILE}=""}}'
    )
    profile_priced = (
        f"{seconds}\n* on (model, {n.MIG_PROFILE}) group_left ({CURRENCY}) (\n"
        f'  {PRICE}{{{n.MIG_PROFILE}!=""}} / on (model, {n.MIG_PROFILE}) group_left () {share}\n)'
    )
    return f"sum by ({own}) (\n(\n{model_priced}\n)\nor\n(\n{profile_priced}\n)\n) / 3600"


def price_rules(prices: Prices) -> list[Rule]:
    """One static series per price: a GPU-hour of a model, or an hour of an instance of a profile."""
    rules: list[Rule] = []
    for model, price in sorted(prices.gpu_hour.items()):
        labels = {"model": model, CURRENCY: prices.currency}
        rules.append({"record": PRICE, "expr": f"vector({number(price)})", "labels": labels})
    for key, price in sorted(prices.mig_instance_hour.items()):
        model, profile = key.split("/")
        labels = {"model": model, n.MIG_PROFILE: profile, CURRENCY: prices.currency}
        rules.append({"record": PRICE, "expr": f"vector({number(price)})", "labels": labels})
    return rules


def _gpu_pod_owner(t: Thresholds) -> str:
    """top_owner of the pods that hold a GPU: what GPUJobSlowRank joins its GPUs with, evaluated once a
    cycle here rather than once per side of the alert's comparison."""
    c, w = t.cluster_label, t.window
    pod = f"{c}, {n.NAMESPACE}, {n.POD}"
    held = f'group by ({pod}) ({mean_name(GPU, UTILIZATION_MEAN, w)}{{{n.POD}!=""}})'
    return f"{top_owner(c, w)}\nand on ({pod})\n{held}"


def recording_rules(t: Thresholds) -> list[Rule]:
    w, c = t.window, t.cluster_label
    rules: list[Rule] = [
        {"record": GPU_POD_OWNER, "expr": _gpu_pod_owner(t)},
        {"record": name("owner", SECONDS, w), "expr": _owner_seconds(t)},
        {"record": name("owner", COST, w), "expr": _owner_cost(t)},
    ]
    below = "owner"
    for level in ("namespace", "cluster", "fleet"):
        keep = (c, *LEVELS[level]) if level != "fleet" else LEVELS[level]
        for metric, extra in ((SECONDS, ()), (COST, (CURRENCY,))):
            labels = ", ".join((*keep, *extra))
            rules.append(
                {"record": name(level, metric, w), "expr": f"sum by ({labels}) ({name(below, metric, w)})"}
            )
        below = level
    return rules


def _slow_rank(t: Thresholds) -> Alert:
    """A GPU hollow or stalled while at least as many GPUs of its job work (their SMs active, neither
    hollow nor stalled): a job uniformly hollow is GPUBusyButSMUnderused's, a job on one GPU has no
    other GPU to be slower than, and GPUs no workload holds are no job."""
    w, c = t.window, t.cluster_label
    gpu_key = ", ".join((c, n.HOSTNAME, n.GPU, n.UUID, *n.OWNER_LABELS))

    def wasting(matchers: str) -> str:
        hollow, stalled = (
            f"{name}{{{matchers}}} > 0.5" for name in (hollow_name(GPU, w), stalled_name(GPU, w))
        )
        return f"(\n  {hollow}\n  or\n  {stalled}\n)"

    def working(matchers: str) -> str:
        return (
            f"(\n  {mean_name(GPU, SM_ACTIVE_MEAN, w)}{{{matchers}}} >= {number(t.working_sm_active)}\n"
            f"  and {mean_name(GPU, UTILIZATION_MEAN, w)}{{{matchers}}} >= {number(t.busy_utilization)}\n"
            f"  unless {wasting(matchers)}\n)"
        )

    job = f"{c}, {', '.join(OWNER_LABELS)}"
    kube = _straggler(
        _with_owner(wasting, c, gpu_key, GPU_POD_OWNER, pods_only=True),
        _with_owner(working, c, gpu_key, GPU_POD_OWNER, pods_only=True),
        job,
    )
    owner = (
        f"{{{{ if $labels.{n.POD} }}}}pod {{{{ $labels.{n.NAMESPACE} }}}}/{{{{ $labels.{n.POD} }}}} of"
        f" {{{{ end }}}}{{{{ $labels.{n.OWNER_KIND} }}}} {{{{ $labels.{n.OWNER_NAME} }}}}"
    )
    return alert_rule(
        t,
        "GPUJobSlowRank",
        f"(\n{kube}\n)\nor\n(\n{_slurm_straggler(t)}\n)",
        t.slow_rank_for,
        "warning",
        "One GPU of a multi-GPU job is hollow or stalled while the job's other GPUs work",
        "GPU {{ $labels.gpu }} ({{ $labels.uuid }}{{ if $labels.gpu_instance }}, MIG instance"
        " {{ $labels.gpu_instance }}{{ end }}) on node {{ $labels.hostname }}, "
        f"{owner}, has been hollow or stalled ({w} means) while at least as many of the job's GPUs worked: a"
        " straggler (data-loading skew, a bad node, a slow link in a collective) that the whole job"
        " waits for.",
    )


def _straggler(wasting: str, working: str, job: str) -> str:
    """The ``wasting`` GPUs of jobs (``job``: their labels) with at least as many ``working`` ones."""
    return (
        f"(\n{wasting}\n)\nand on ({job}) (\n"
        f"  count by ({job}) (\n{working}\n  )\n"
        f"  >= on ({job})\n"
        f"  count by ({job}) (\n{wasting}\n  )\n)"
    )


def _slurm_straggler(t: Thresholds) -> str:
    """The same for Slurm jobs, from the accounting counters: a Slurm node's per-GPU series carry no job,
    its verdict counters do. A GPU (or MIG instance) wastes while over half its seconds are hollow or
    stalled, and works while over half are compute- or memory-bound."""
    c, w = t.cluster_label, t.window
    key = f"{c}, {n.HOSTNAME}, {n.GPU}, {n.UUID}, {n.GPU_INSTANCE}, {n.SLURM_JOB}"
    counter = total(n.GPU_VERDICT_SECONDS)

    def mostly(verdicts: tuple[str, ...]) -> str:
        """The GPUs over half of whose seconds fall in ``verdicts``, each once over scrape jobs."""
        matchers = f'{n.SLURM_JOB}!="", {one_of(n.VERDICT, verdicts)}'
        return (
            f"  sum by ({key}) (\n"
            f"    max by ({key}, {n.VERDICT}) (rate({counter}{{{matchers}}}[{w}]))\n  ) > 0.5"
        )

    wasting = mostly((n.VERDICT_HOLLOW, n.VERDICT_STALLED))
    named = _owned_by(wasting, n.OWNER_KIND_SLURM_JOB, n.SLURM_JOB)
    working = mostly((n.VERDICT_COMPUTE_BOUND, n.VERDICT_MEMORY_BOUND))
    return _straggler(named, working, f"{c}, {n.SLURM_JOB}")


def alerting_rules(t: Thresholds) -> list[Alert]:
    return [_slow_rank(t)]
