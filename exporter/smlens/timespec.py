"""Times and durations as Prometheus and its users write them: ``7d``, ``1h30m``; RFC 3339 or unix time."""

from __future__ import annotations

import datetime
import math
import re

# Prometheus' duration: units from largest to smallest, each at most once (model.ParseDuration).
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNITS = (365 * 86400.0, 7 * 86400.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$")
_UNIX = re.compile(r"^\d+(?:\.\d+)?$")


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration (``7d``, ``1h30m``, ``90s``); ValueError if it is none or 0."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None:
        raise ValueError("must be a Prometheus duration such as 7d, 12h or 1h30m")
    seconds = sum(int(g) * unit for g, unit in zip(match.groups(), _UNITS, strict=True) if g is not None)
    if seconds <= 0:
        raise ValueError("must be a duration longer than 0")
    return seconds


def parse_time(text: str) -> float:
    """Unix time of an RFC 3339 time (``2025-05-01T00:00:00Z``, an offset instead of Z) or of a unix
    time in seconds; ValueError otherwise."""
    raw = text.strip()
    if _UNIX.match(raw):
        value = float(raw)
        if math.isfinite(value):
            return value
    elif _RFC3339.match(raw):
        iso = raw.replace(" ", "T").replace("t", "T")
        iso = iso[:-1] + "+00:00" if iso[-1] in "Zz" else iso
        try:
            return datetime.datetime.fromisoformat(_six_digits(iso)).timestamp()
        except ValueError:
            pass
    raise ValueError("must be an RFC 3339 time such as 2025-05-01T00:00:00Z, or a unix time in seconds")


def _six_digits(iso: str) -> str:
    """Python 3.10's fromisoformat takes 3 or 6 fraction digits only: pad or cut to 6."""
    match = re.match(r"^(.*T\d{2}:\d{2}:\d{2})\.(\d+)(.*)$", iso)
    if match is None:
        return iso
    return f"{match.group(1)}.{(match.group(2) + '000000')[:6]}{match.group(3)}"


def parse_since(text: str) -> str:
    """``--since``: a duration back from the end of the range, or the time it starts at."""
    try:
        parse_duration(text)
    except ValueError:
        try:
            parse_time(text)
        except ValueError:
            raise ValueError(
                "must be a Prometheus duration back from --until (7d, 12h, 1h30m) or the start time "
                "(RFC 3339, or unix time)"
            ) from None
    return text.strip()


def since_seconds(since: str, until: float) -> float:
    """The start of the range that ``since`` (checked by :func:`parse_since`) gives, ending at ``until``."""
    try:
        return until - parse_duration(since)
    except ValueError:
        return parse_time(since)


def rfc3339(at: float) -> str:
    """A unix time as RFC 3339 in UTC, to the second (the millisecond where it has one)."""
    moment = datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
    text = moment.isoformat(timespec="milliseconds" if round(at * 1000) % 1000 else "seconds")
    return text.replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """Seconds as Prometheus writes a duration: 7d, 1h30m, 45s."""
    left = round(seconds * 1000)
    parts = []
    for unit, name in ((86400_000, "d"), (3600_000, "h"), (60_000, "m"), (1000, "s"), (1, "ms")):
        count, left = divmod(left, unit)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts) or "0s"
