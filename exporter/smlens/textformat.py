"""Metric families written in Prometheus' text format 0.0.4 or in OpenMetrics 1.0.0.

The bytes are those prometheus_client 0.2x's ``generate_latest`` writes for the same gauges and counters
(tests/test_textformat.py holds it to that, prometheus_client as the oracle): what Prometheus stored from
smlens before does not change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from smlens.metricfamily import Metric

OPENMETRICS_EOF = b"# EOF\n"


def format_value(value: float) -> str:
    """A sample value as Prometheus' clients write it: ``NaN``, ``+Inf``, ``-Inf``, Python's shortest
    round-trip form, except that a positive number written with 7 to 16 integer digits takes Go's exponent
    form (``1e+06``, ``1.5e+07``)."""
    x = float(value)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if math.isnan(x):
        return "NaN"
    text = repr(x)
    whole, point, fraction = text.partition(".")
    if x <= 0 or not point or len(whole) < 7:
        return text
    digits = (whole + fraction).rstrip("0")
    mantissa = digits[0] + "." + digits[1:] if len(digits) > 1 else digits
    return f"{mantissa}e+{len(whole) - 1:02d}"


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_text_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def render(families: Iterable[Metric], openmetrics: bool) -> bytes:
    """``families`` in one format. OpenMetrics' closing ``# EOF`` line (:data:`OPENMETRICS_EOF`) is left to
    the caller, who may append more families first."""
    escape_help = _escape_value if openmetrics else _escape_text_help
    lines: list[str] = []
    for family in families:
        # The text format names a counter's family as its samples, with _total.
        name = family.name + "_total" if family.type == "counter" and not openmetrics else family.name
        lines.append(f"# HELP {name} {escape_help(family.documentation)}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            if sample.labels:
                pairs = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(sample.labels.items()))
                lines.append(f"{sample.name}{{{pairs}}} {format_value(sample.value)}\n")
            else:
                lines.append(f"{sample.name} {format_value(sample.value)}\n")
    # A label value that is not valid text (a lone surrogate from a file name that is not UTF-8) gets "?"
    # where its bad bytes were, rather than failing the whole scrape.
    return "".join(lines).encode(errors="replace")
