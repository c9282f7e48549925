"""DCGM's field values made into smlens readings: why a value is absent, and each of DCGM's samples
credited to the time since the previous read of its entity (a GPU or a GPU instance).

DCGM's values are averages over its own sample period, which smlens sets to its sampling interval; a
read credits the latest sample to the whole time since the previous read (see docs/dcgm.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from smlens.model import Activity, Reading
from smlens.sources.dcgm.bindings import DcgmBindings
from smlens.sources.dcgm.fields import RATIO_FIELDS, WANTED_FIELDS

STALE_AFTER_INTERVALS = 3  # a sample older than this many intervals is not credited again


@dataclass
class SampleCursor:
    """Where the reads of one entity (a GPU or a GPU instance) stand."""

    # Whether a sample already there at the first read may be credited. Not for a GPU instance: DCGM
    # serves an entity id's cached samples whatever GI the id denotes since a reconfiguration
    # (DcgmCacheManager::GetLatestSample, ClearGpuMigInfo).
    earlier_samples: bool = True
    began: float | None = None  # the first read
    last_read: float | None = None
    # field -> (DCGM ts, seen at; None for a sample there at the first read that must not be credited)
    samples: dict[int, tuple[int, float | None]] = field(default_factory=dict)


class Credit(NamedTuple):
    """What one read of an entity's latest values gives."""

    activity: dict[str, Activity]
    increments: dict[str, float]  # bytes
    missing: dict[str, str]
    span: float  # seconds since the previous read; 0 at the first


class ValueDecoder:
    """Turns ``dcgmEntityGetLatestValues`` replies into activity, byte increments and absences."""

    def __init__(self, bindings: DcgmBindings, interval: float, source: str) -> None:
        self._b = bindings
        self._interval = interval
        self._source = source
        structs, value = bindings.structs, bindings.value
        # what a status or a sentinel value means, built once: absent() runs for every value of every tick
        self._status_reasons = {
            structs.DCGM_ST_NO_DATA: "no_data",
            structs.DCGM_ST_NOT_WATCHED: "not_watched",
            structs.DCGM_ST_NOT_SUPPORTED: "not_supported",
            structs.DCGM_ST_NO_PERMISSION: "no_permission",
            structs.DCGM_ST_STALE_DATA: "stale",
            structs.DCGM_ST_GPU_IS_LOST: "gpu_lost",
        }
        self._fp64_sentinels = {
            value.DCGM_FP64_NOT_SUPPORTED: "not_supported",
            value.DCGM_FP64_NOT_PERMISSIONED: "no_permission",
            value.DCGM_FP64_NOT_FOUND: "not_found",
        }
        self._int64_sentinels = {
            value.DCGM_INT64_NOT_SUPPORTED: "not_supported",
            value.DCGM_INT64_NOT_PERMISSIONED: "no_permission",
            value.DCGM_INT64_NOT_FOUND: "not_found",
        }

    def absent(self, value: Any) -> tuple[str | None, float]:
        """(why a DCGM field value is absent, or None; its number). Blanks are DCGM's sentinels."""
        status = int(value.status)
        if status != self._b.structs.DCGM_ST_OK:
            return self._status_reasons.get(status, "dcgm_error"), 0.0
        kind = chr(int(value.fieldType))
        raw: float | int
        if kind == self._b.fields.DCGM_FT_DOUBLE:
            raw = float(value.value.dbl)
            blank = self._b.value.DCGM_FP64_IS_BLANK(raw)
            sentinels = self._fp64_sentinels
        elif kind == self._b.fields.DCGM_FT_INT64:
            raw = int(value.value.i64)
            blank = self._b.value.DCGM_INT64_IS_BLANK(raw)
            sentinels = self._int64_sentinels
        else:
            return "unexpected_type", 0.0
        if blank:
            return sentinels.get(raw, "blank"), 0.0
        return None, float(raw)

    def credit(self, cursor: SampleCursor, values: Any, now: float, paused: bool) -> Credit:
        """Activity, byte increments and missing values of one entity's latest values, credited to
        the time since its previous read; and that time (0 at the first read)."""
        baseline = cursor.began is None and not cursor.earlier_samples
        began = cursor.began = now if cursor.began is None else cursor.began
        span = 0.0 if cursor.last_read is None else now - cursor.last_read
        cursor.last_read = now
        too_old = STALE_AFTER_INTERVALS * self._interval
        activity: dict[str, Activity] = {}
        increments: dict[str, float] = {}
        missing: dict[str, str] = {}
        for value in values:
            field_id = int(value.fieldId)
            key = WANTED_FIELDS[field_id]
            reason, number = self.absent(value)
            if int(value.status) == self._b.structs.DCGM_ST_OK:
                ts = int(value.ts)
                seen = cursor.samples.get(field_id)
                if seen is None or seen[0] != ts:
                    cursor.samples[field_id] = (ts, None if baseline else now)
                elif reason is None:
                    seen_at = began if seen[1] is None else seen[1]
                    if now - seen_at > too_old:
                        reason = "stale"
                    elif seen[1] is None:  # not a sample of this cursor's yet
                        reason = "warming_up"
            if paused:
                reason = "profiling_paused"
            elif reason is None and span <= 0:
                reason = "warming_up"
            if reason is not None:
                missing[key] = reason
            elif field_id in RATIO_FIELDS:
                activity[key] = Activity.of(number, span)
            else:
                increments[key] = max(number, 0.0) * span
        return Credit(activity, increments, missing, span)

    def reading(
        self,
        cursor: SampleCursor,
        values: Any,
        now: float,
        *,
        paused: bool,
        unavailable: Mapping[str, str],
        mode: str,
    ) -> Reading:
        """A GPU's reading from its latest values; ``unavailable`` are the fields it does not watch."""
        credit = self.credit(cursor, values, now, paused)
        return Reading(
            source=self._source,
            activity=credit.activity,
            increments=credit.increments,
            missing={**unavailable, **credit.missing},
            # Like gpm, the first read of a session only starts the interval yet counts as profiling.
            profiling=not paused and (bool(credit.activity) or credit.span <= 0),
            profiling_mode=mode,
        )

    def unwatched(self, reason: str) -> Reading:
        """The reading of a GPU smlens watches nothing on: every wanted field absent for ``reason``."""
        return Reading(source=self._source, missing={key: reason for key in WANTED_FIELDS.values()})
