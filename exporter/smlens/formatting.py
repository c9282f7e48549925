"""Values written for people, formatted one way wherever they appear.

This module imports nothing, so that every layer, the lowest included, can use it.
"""

from __future__ import annotations


def percent(ratio: float | None, digits: int = 1, *, width: int = 0, sep: str = "") -> str:
    """A 0..1 ratio as a percentage with ``digits`` decimals, "n/a" when it is unknown.

    ``width`` right-aligns the number (for columns of text); ``sep`` goes between it and the sign.
    """
    if ratio is None:
        return "n/a"
    return f"{100 * ratio:.{digits}f}".rjust(width) + f"{sep}%"
