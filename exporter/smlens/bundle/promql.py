"""Small writers of PromQL text, shared by the rules and the dashboards."""

from __future__ import annotations

import json
from collections.abc import Sequence


def number(value: float) -> str:
    return repr(float(value))


def quoted(text: str) -> str:
    """A PromQL string literal (PromQL strings use Go escapes, which JSON's are a subset of)."""
    return json.dumps(text)


def one_of(label: str, values: Sequence[str]) -> str:
    """A matcher of ``label`` for any of ``values``: equality for one, a regex for several."""
    return f"{label}={quoted(values[0])}" if len(values) == 1 else f'{label}=~"{"|".join(values)}"'


def by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)}) " if labels else ""


def ratio(numerator: str, denominator: str) -> str:
    """``numerator`` over ``denominator``, nothing where the denominator is 0 (no coverage)."""
    return f"{numerator}\n/\n({denominator} > 0)"


def total(counter: str) -> str:
    """The sample name of a counter family (smlens.names defines them without the suffix)."""
    return f"{counter}_total"
