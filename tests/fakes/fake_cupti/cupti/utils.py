"""Double of ``cupti.utils`` (cupti-python 13.4.0): ``metrics_to_c_array`` returns (what to keep, pointer)."""

from __future__ import annotations

from typing import Any


def metrics_to_c_array(metrics: list[str]) -> tuple[Any, int]:
    kept = [m.encode() for m in metrics]
    return kept, id(kept)
