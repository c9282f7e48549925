"""``smlens report``: read the range's accounting series from Prometheus, print the rows."""

from __future__ import annotations

import logging
import sys
import time

from smlens.report.client import Prometheus, ReportError
from smlens.report.ledger import CHUNK_MS, COUNTER, account
from smlens.report.render import MACHINE_FORMATS, RENDERERS, build
from smlens.settings import ReportSettings
from smlens.timespec import duration, parse_duration, rfc3339
from smlens.verdicts import thresholds

log = logging.getLogger("smlens.report")

DEFAULT_RETENTION = 15 * 86400.0  # Prometheus' when neither a time nor a size retention is set


def retention(flags: dict[str, str]) -> float | None:
    """Seconds of samples the Prometheus keeps, from its flags; None where unknown or unbounded."""
    if not flags:
        return None
    for flag in ("storage.tsdb.retention.time", "storage.tsdb.retention"):  # the second: before 2.8
        try:
            return parse_duration(flags.get(flag, ""))
        except ValueError:
            continue
    if flags.get("storage.tsdb.retention.size", "0B") in ("0B", "0", ""):
        return DEFAULT_RETENTION  # neither set: Prometheus 2 keeps 15 days
    return None


def no_series(url: str, start: float, end: float) -> ReportError:
    return ReportError(
        f"Prometheus at {url} has no {COUNTER} series from {rfc3339(start)} to {rfc3339(end)}: enable "
        "smlens' accounting metric group (smlens serve --metrics default,accounting; Helm values "
        "metrics: [default, accounting])."
    )


def run(settings: ReportSettings) -> int:
    limits = thresholds.load(settings.thresholds)
    now = time.time()
    start, end = settings.window(now)
    cluster = limits.cluster_label
    with Prometheus(settings) as prometheus:
        found = prometheus.label_values("__name__", COUNTER, start - CHUNK_MS / 1000, end)
        kept = retention(prometheus.flags())
        if kept is not None and start < now - kept:
            raise ReportError(
                f"the range starts at {rfc3339(start)}, before what Prometheus at {prometheus.url} keeps "
                f"(retention {duration(kept)}): shorten --since, or move --until."
            )
        if COUNTER not in found:
            raise no_series(prometheus.url, start, end)
        ledger = account(prometheus, cluster, start, end, models=bool(limits.prices))
        if not ledger.spent:
            raise no_series(prometheus.url, start, end)
        log.debug(
            "read %d series (%d after deduplication); raw samples of %d node-chunks with a possible reset",
            ledger.series,
            len(ledger.spent),
            ledger.raw_fetches,
        )
    report = build(
        ledger.spent, cluster, settings.by, start, end, limits.prices, ledger.models, ledger.shares
    )
    print(RENDERERS[settings.format](report))
    if settings.format in MACHINE_FORMATS:
        for note in report.notes:
            print(f"smlens report: {note}", file=sys.stderr)
    return 0
