"""The report's rows (GPU-hours per verdict class, their cost where priced) and its four formats."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from smlens import names as n
from smlens.report.ledger import GpuKey, InstanceKey, Spent
from smlens.timespec import duration, rfc3339
from smlens.verdicts.thresholds import Prices

GROUP_LABELS = {
    "job": ("cluster", n.NAMESPACE, n.OWNER_KIND, n.OWNER_NAME),
    "namespace": ("cluster", n.NAMESPACE),
    "cluster": ("cluster",),
}
TITLES = {"cluster": "cluster", n.NAMESPACE: "namespace", n.OWNER_KIND: "owner kind", n.OWNER_NAME: "owner"}
UNKNOWN_MODEL = "(no gpu_info model)"


@dataclass
class Row:
    labels: tuple[str, ...]
    seconds: dict[str, float] = field(default_factory=dict)  # GPU-seconds per verdict class
    wasted: float = 0.0  # GPU-seconds
    cost: dict[str, float] = field(default_factory=dict)  # per verdict class, of the priced seconds
    unpriced: float = 0.0  # GPU-seconds without a price

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def priced(self) -> bool:
        """Some of its seconds have a price: its cost is a number (of those seconds)."""
        return self.total - self.unpriced > 1e-9


@dataclass
class Report:
    by: str
    start: float
    end: float
    rows: list[Row]
    classes: list[str]  # the verdict classes that occurred, in names.VERDICT_CODES order
    currency: str | None  # None: no prices, no cost columns
    notes: list[str]

    @property
    def priced_gaps(self) -> bool:
        return any(row.unpriced > 0 for row in self.rows)


def _wasted(verdict: str, owner_kind: str) -> bool:
    return verdict in n.WASTED_VERDICTS or (verdict in n.WASTED_WHEN_HELD and owner_kind != "")


def build(
    spent: Sequence[Spent],
    cluster: str,
    by: str,
    start: float,
    end: float,
    prices: Prices,
    models: Mapping[GpuKey, str],
    shares: Mapping[InstanceKey, float],
) -> Report:
    """Rows of GPU-seconds per class for ``by`` (job, namespace or cluster), sorted by waste."""
    rows: dict[tuple[str, ...], Row] = {}
    unpriced: dict[str, float] = {}
    no_share: dict[InstanceKey, float] = {}
    for item in spent:
        labels = item.labels
        gpu = (labels[cluster], labels[n.HOSTNAME], labels[n.UUID])
        profile, verdict = labels[n.MIG_PROFILE], labels[n.VERDICT]
        mig = labels[n.GPU_INSTANCE] != ""
        share = shares.get((*gpu, labels[n.GPU_INSTANCE], profile)) if mig else 1.0
        if share is None:
            instance = (*gpu, labels[n.GPU_INSTANCE], profile)
            no_share[instance] = no_share.get(instance, 0.0) + sum(item.seconds.values())
            continue
        model = models.get(gpu)
        for (kind, name), seconds in item.seconds.items():
            values = {"cluster": labels[cluster], n.NAMESPACE: labels[n.NAMESPACE], n.OWNER_KIND: kind}
            values[n.OWNER_NAME] = name
            key = tuple(values[label] for label in GROUP_LABELS[by])
            row = rows.get(key) or rows.setdefault(key, Row(key))
            gpu_seconds = seconds * share
            row.seconds[verdict] = row.seconds.get(verdict, 0.0) + gpu_seconds
            if _wasted(verdict, kind):
                row.wasted += gpu_seconds
            if not prices:
                continue
            instance_price = prices.mig_instance_hour.get(f"{model}/{profile}") if mig else None
            gpu_price = prices.gpu_hour.get(model) if model is not None else None
            if instance_price is not None:
                money = seconds * instance_price / 3600
            elif gpu_price is not None:
                money = gpu_seconds * gpu_price / 3600
            else:
                row.unpriced += gpu_seconds
                what = UNKNOWN_MODEL if model is None else model
                unpriced[what] = unpriced.get(what, 0.0) + gpu_seconds
                continue
            row.cost[verdict] = row.cost.get(verdict, 0.0) + money
    occurred = {verdict for row in rows.values() for verdict, value in row.seconds.items() if value > 0}
    ordered = sorted(rows.values(), key=lambda row: (-row.wasted, -row.total, row.labels))
    notes = []
    if unpriced:
        listed = ", ".join(
            f"{model} ({hours(seconds)} GPU-hours)" for model, seconds in sorted(unpriced.items())
        )
        notes.append(
            f"No price for {listed}: their seconds have no cost (column unpriced); give a price per GPU-hour "
            "in the thresholds file's prices.gpu_hour."
        )
    if no_share:
        listed = ", ".join(
            f"{host} GPU {uuid} instance {instance} ({profile or 'no profile'}, "
            f"{hours(seconds)} instance-hours)"
            for (_cluster, host, uuid, instance, profile), seconds in sorted(no_share.items())
        )
        notes.append(
            f"Left out, without {n.GPU_MIG_SM_SHARE_RATIO} to make GPU-hours of their hours: {listed}."
        )
    return Report(
        by=by,
        start=start,
        end=end,
        rows=ordered,
        classes=[code for code in n.VERDICT_CODES if code in occurred],
        currency=prices.currency if prices else None,
        notes=notes,
    )


def hours(seconds: float, digits: int = 2) -> str:
    return f"{seconds / 3600:.{digits}f}"


def caption(report: Report) -> str:
    span = f"{rfc3339(report.start)} to {rfc3339(report.end)} ({duration(report.end - report.start)})"
    money = f"; cost in {report.currency}" if report.currency else ""
    return f"GPU-hours by verdict class, {span}, by {report.by}{money}.\nWasted: {n.WASTED_WORDS}."


# -- machine formats ---------------------------------------------------------------------------------


def _number(value: float) -> float:
    return round(value, 6)


def as_objects(report: Report) -> list[dict[str, object]]:
    objects: list[dict[str, object]] = []
    for row in report.rows:
        item: dict[str, object] = dict(zip(GROUP_LABELS[report.by], row.labels, strict=True))
        item["gpu_hours"] = {c: _number(row.seconds.get(c, 0.0) / 3600) for c in report.classes}
        item["gpu_hours_total"] = _number(row.total / 3600)
        item["gpu_hours_wasted"] = _number(row.wasted / 3600)
        if report.currency:  # null where none of the row's seconds has a price
            item["cost"] = {c: _number(row.cost.get(c, 0.0)) if row.priced else None for c in report.classes}
            item["cost_total"] = _number(sum(row.cost.values())) if row.priced else None
            item["currency"] = report.currency
            item["unpriced_gpu_hours"] = _number(row.unpriced / 3600)
        objects.append(item)
    return objects


def render_json(report: Report) -> str:
    return json.dumps(as_objects(report), indent=2)


def render_csv(report: Report) -> str:
    header = [*GROUP_LABELS[report.by], *(f"gpu_hours_{c}" for c in report.classes)]
    header += ["gpu_hours_total", "gpu_hours_wasted"]
    if report.currency:
        header += [*(f"cost_{c}" for c in report.classes), "cost_total", "currency", "unpriced_gpu_hours"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in report.rows:
        line: list[object] = [*row.labels, *(_number(row.seconds.get(c, 0.0) / 3600) for c in report.classes)]
        line += [_number(row.total / 3600), _number(row.wasted / 3600)]
        if report.currency:  # empty where none of the row's seconds has a price
            line += [_number(row.cost.get(c, 0.0)) if row.priced else "" for c in report.classes]
            line += [_number(sum(row.cost.values())) if row.priced else "", report.currency]
            line.append(_number(row.unpriced / 3600))
        writer.writerow(line)
    return out.getvalue().rstrip("\n")


# -- formats for people ------------------------------------------------------------------------------


def _cells(report: Report) -> tuple[list[str], list[list[str]], int]:
    """Header, rows of text and how many leading columns are labels (the rest are numbers)."""
    labels = GROUP_LABELS[report.by]
    header = [TITLES[label] for label in labels] + report.classes + ["total", "wasted"]
    cost = bool(report.currency)
    if cost:
        header += [f"{c} {report.currency}" for c in report.classes] + [f"total {report.currency}"]
        if report.priced_gaps:
            header.append("unpriced")
    lines = []
    for row in report.rows:
        line = [value or "-" for value in row.labels]
        line += [hours(row.seconds.get(c, 0.0)) for c in report.classes]
        line += [hours(row.total), hours(row.wasted)]
        if cost:
            line += [f"{row.cost.get(c, 0.0):.2f}" if row.priced else "-" for c in report.classes]
            line.append(f"{sum(row.cost.values()):.2f}" if row.priced else "-")
            if report.priced_gaps:
                line.append(hours(row.unpriced))
        lines.append(line)
    return header, lines, len(labels)


def render_table(report: Report) -> str:
    header, lines, label_count = _cells(report)
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def text(line: list[str]) -> str:
        cells = [
            cell.ljust(width) if i < label_count else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    body = [text(header), text(["-" * w for w in widths]), *(text(line) for line in lines)]
    return "\n".join([caption(report), "", *body, *_notes(report)])


def render_markdown(report: Report) -> str:
    header, lines, label_count = _cells(report)

    def text(line: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |"

    rule = "|" + "|".join("---" if i < label_count else "---:" for i in range(len(header))) + "|"
    body = [text(header), rule, *(text(line) for line in lines)]
    return "\n".join([caption(report), "", *body, *_notes(report)])


def _notes(report: Report) -> list[str]:
    return ["", *report.notes] if report.notes else []


RENDERERS = {"table": render_table, "markdown": render_markdown, "csv": render_csv, "json": render_json}
# Formats a script reads: their notes go to stderr, so that stdout stays the data alone.
MACHINE_FORMATS = ("csv", "json")
