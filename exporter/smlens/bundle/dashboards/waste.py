"""The Waste and cost dashboard: GPU-hours by verdict class per namespace and per job (what owns the
pods) over the dashboard's range, their cost where a price table is given, the top wasters and the
trend week over week. Reads the accounting layers (smlens.bundle.accounting), integrated over the
range at the rule window: trailing window means sampled once per window tile the range."""

from __future__ import annotations

from smlens import names as n
from smlens.bundle import accounting as a
from smlens.bundle.dashboards.panels import CHECK_OPTIONS, bargauge, series, stat, table
from smlens.bundle.dashboards.queries import Exprs
from smlens.bundle.dashboards.sections import RULES_FIX, RULES_STRIP, optional_group
from smlens.bundle.grafana import JSON, Panel, Query, Row, Variable, dashboard
from smlens.bundle.layers import TOP_GPUS
from smlens.bundle.promql import one_of, total
from smlens.verdicts.thresholds import Thresholds

# Columns of the tables, in the order people read them: what worked, what wasted, the rest; each the
# classes it sums, so that the columns add up to the Total.
CLASSES = (
    ((n.VERDICT_COMPUTE_BOUND,), "Compute-bound"),
    ((n.VERDICT_MEMORY_BOUND,), "Memory-bound"),
    ((n.VERDICT_PARTIAL,), "Partial"),
    ((n.VERDICT_STALLED,), "Stalled"),
    ((n.VERDICT_HOLLOW,), "Hollow"),
    ((n.VERDICT_IDLE_MEMORY_HELD,), "Idle, memory held"),
    ((n.VERDICT_IDLE,), "Idle"),
    ((n.VERDICT_NO_PROFILING, n.VERDICT_UNKNOWN, n.VERDICT_DOWN), "Not judged"),
)
NO_OWNER = "(none)"  # the table rows' value of an empty owner label
JOB_LEGEND = "{{namespace}} {{owner_kind}}/{{owner_name}}"
NO_PRICES = (
    "no price table: cost needs thresholds.prices (Helm value thresholds.prices, docs/accounting.md);"
    " nothing here is money until then"
)
NO_ACCOUNTING = (
    "no accounting series: export the accounting metric group (--metrics default,accounting; Helm value"
    " metrics: [default, accounting]) and load rules/smlens-accounting.rules.yaml"
)


def _hours(e: Exprs, metric: str, level: str, selector: str, by: str) -> str:
    """GPU-hours (or money) over the dashboard's range from a layer's per-second rates."""
    integral = f"sum_over_time({a.name(level, metric, e.w)}{selector}[$__range:$__interval])"
    per_hour = " * $__interval_ms / 3600000" if metric == a.SECONDS else " * $__interval_ms / 1000"
    return f"sum by ({by}) ({integral}){per_hour}"


def _named(expr: str, by: str) -> str:
    """``expr`` with NO_OWNER for its empty owner labels: Grafana's merge matches rows on the labels every
    query's frame has, and Prometheus drops empty labels, so a column holding only spare capacity (no
    namespace, no owner) would otherwise land in every row of its cluster."""
    for label in (n.NAMESPACE, n.OWNER_KIND, n.OWNER_NAME):
        if label in by.split(", "):
            expr = f'label_replace({expr}, "{label}", "{NO_OWNER}", "{label}", "")'
    return expr


def _wasted(selector: str) -> str:
    """The selector, narrowed to the classes in which a workload's GPUs are wasted."""
    wasted = one_of(n.VERDICT, (*n.WASTED_VERDICTS, *n.WASTED_WHEN_HELD))
    return selector[:-1] + f', {wasted}, {n.OWNER_KIND}!=""}}'


def _check(e: Exprs) -> Panel:
    """1: loaded; 0: the accounting group is exported but its rules are missing; -1: smlens reports GPUs
    without the accounting group."""
    sel = e.selector()
    owner = a.name("owner", a.SECONDS, e.w)
    raw = total(n.GPU_VERDICT_SECONDS)
    expr = f"group({owner}{sel})\nor\n(group({raw}{sel}) - 1)\nor\n(group({n.GPU_UP}{sel}) - 2)"
    states = {
        "1": {"text": "smlens accounting rules: loaded", "color": "green", "index": 0},
        "0": {
            "text": f"smlens accounting rules NOT LOADED: panels below are empty, not zero. Fix: {RULES_FIX}",
            "color": "red",
            "index": 1,
        },
        "-1": {"text": f"accounting metric group NOT EXPORTED: {NO_ACCOUNTING}", "color": "red", "index": 2},
    }
    return Panel(
        "stat",
        RULES_STRIP,
        "Whether smlens exports the accounting group and its rules are loaded, so that empty panels never"
        f" read as unused GPUs.{optional_group('accounting')}",
        [Query(expr, instant=True)],
        width=16,
        height=2,
        options=CHECK_OPTIONS,
        mappings=[{"type": "value", "options": states}],
    )


def _prices(e: Exprs) -> Panel:
    return Panel(
        "stat",
        "Prices",
        "The currency of the cost panels, from the price table; without one the cost panels say so.",
        [Query(f"group by ({a.CURRENCY}) ({a.PRICE})", "prices in {{currency}}", instant=True)],
        width=8,
        height=2,
        options={**CHECK_OPTIONS, "textMode": "name"},
        no_value=NO_PRICES,
    )


def _class_table(e: Exprs, metric: str, level: str, selector: str, by: str, title: str, what: str) -> Panel:
    total = _named(_hours(e, metric, level, selector, by), by)
    columns = [
        (label, _named(_hours(e, metric, level, selector[:-1] + f", {one_of(n.VERDICT, codes)}}}", by), by))
        for codes, label in CLASSES
    ]
    unit = "h" if metric == a.SECONDS else "none"
    return table(
        title,
        f"{what} over the dashboard's range, by the verdict class the GPUs were in, second by second"
        f" ({e.t.window} means integrated), largest first; not judged: no profiling, unknown or down;"
        f" {NO_OWNER}: no workload (spare capacity) or, for a Slurm job, no namespace. A MIG instance counts"
        " its share of its GPU.",
        ("Total", total),
        columns,
        on=by,
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".*"},
                # A class with no series for a row is no time in it; the panel's own no-value text is
                # for a table without any rows.
                "properties": [{"id": "unit", "value": unit}, {"id": "noValue", "value": "0"}],
            }
        ],
        no_value=NO_PRICES if metric == a.COST else NO_ACCOUNTING,
        every_row=True,
        min_interval=e.w,
    )


def _top_wasters(e: Exprs, metric: str, selector: str) -> Panel:
    by = f"{e.c}, namespace, owner_kind, owner_name"
    wasted = _hours(e, metric, "owner", _wasted(selector), by)
    what = "GPU-hours" if metric == a.SECONDS else "Money"
    return bargauge(
        f"Top wasters: {what.lower()} wasted per job",
        f"{what} each job (what owns its pods: a Deployment, Job, JobSet, StatefulSet, a pod kube-state-"
        "metrics names no owner of, a Slurm job) spent with its GPUs hollow, stalled, or idle while held,"
        f" over the dashboard's range; the {TOP_GPUS} largest.",
        f"sort_desc(topk({TOP_GPUS}, {wasted}))",
        JOB_LEGEND,
        unit="h" if metric == a.SECONDS else "none",
        min_interval=e.w,
        no_value=NO_ACCOUNTING if metric == a.SECONDS else NO_PRICES,
    )


def _over_time(e: Exprs, selector: str) -> Panel:
    return series(
        "GPUs in each class",
        "GPUs (GPU-seconds per second) in each verdict class over time, summed over the selected clusters.",
        [Query(f"sum by ({n.VERDICT}) ({a.name('cluster', a.SECONDS, e.w)}{selector})", "{{verdict}}")],
        unit="none",
        width=24,
        no_value=NO_ACCOUNTING,
    )


def _week_over_week(e: Exprs, selector: str) -> list[Panel]:
    wasted = f"{a.name('cluster', a.SECONDS, e.w)}{selector[:-1]}, {one_of(n.VERDICT, n.WASTED_VERDICTS)}}}"
    hours = "* $__interval_ms / 3600000"
    week = f"sum_over_time(sum({wasted})[7d:$__interval]) {hours}"
    before = f"sum_over_time(sum({wasted} offset 7d)[7d:$__interval]) {hours}"
    daily = f"sum_over_time(sum({wasted})[1d:$__interval]) {hours}"
    daily_before = f"sum_over_time(sum({wasted} offset 7d)[1d:$__interval]) {hours}"
    trend = Panel(
        "timeseries",
        "Wasted GPU-hours per day, this week and the week before",
        "GPU-hours spent hollow, stalled or idle with memory held over the 24 hours before each point, and"
        " the same a week earlier: the trend week over week.",
        [Query(daily, "last 24 h"), Query(daily_before, "the same 24 h a week before")],
        unit="h",
        width=16,
        min_interval=e.w,
        no_value=NO_ACCOUNTING,
    )
    return [
        stat(
            "Wasted GPU-hours, last 7 days",
            "Hollow, stalled or idle with memory held, over the 7 days before now.",
            week,
            no_value=NO_ACCOUNTING,
            min_interval=e.w,
        ),
        stat(
            "The 7 days before",
            "The same, a week earlier: empty until there is that much history.",
            before,
            no_value="no history a week back yet",
            min_interval=e.w,
        ),
        trend,
    ]


def _variables(e: Exprs) -> list[Variable]:
    owner = a.name("owner", a.SECONDS, e.w)
    return [
        e.cluster_variable(),
        Variable("namespace", "Namespace", f"label_values({owner}{e.selector()}, namespace)", multi=True),
    ]


def build(t: Thresholds) -> JSON:
    e = Exprs(t)
    clusters = e.selector()
    namespaces = e.selector('namespace=~"$namespace"')
    ns_by, job_by = f"{e.c}, namespace", f"{e.c}, namespace, owner_kind, owner_name"
    hours, cost = a.SECONDS, a.COST
    return dashboard(
        "smlens-waste",
        "smlens / Waste and cost",
        "GPU-hours by what the GPUs did, per namespace and per job, with their cost where a price table is"
        " given; the top wasters and the trend week over week. Reads the accounting rules.",
        _variables(e),
        [
            Row("Accounting", [_check(e), _prices(e)]),
            Row(
                "GPU-hours",
                [
                    _class_table(
                        e, hours, "namespace", namespaces, ns_by, "GPU-hours per namespace", "GPU-hours"
                    ),
                    _top_wasters(e, hours, namespaces),
                    _class_table(e, hours, "owner", namespaces, job_by, "GPU-hours per job", "GPU-hours"),
                    _over_time(e, clusters),
                ],
            ),
            Row(
                "Cost",
                [
                    _class_table(
                        e, cost, "namespace", namespaces, f"{ns_by}, currency", "Cost per namespace", "Money"
                    ),
                    _top_wasters(e, cost, namespaces),
                    _class_table(
                        e, cost, "owner", namespaces, f"{job_by}, currency", "Cost per job", "Money"
                    ),
                ],
            ),
            Row("Week over week", _week_over_week(e, clusters)),
        ],
    )
