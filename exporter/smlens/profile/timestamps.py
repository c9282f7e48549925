"""Turning the start/end stamps CUPTI gives each PM sample into a clean timeline. No CUPTI here.

What CUPTI 13.4 returned on an H200 (docs/profile.md, "Samples without timestamps"):

* the capture's first sample can have start 0 and a real end (it began before sampling started);
* the one or two samples decoded after ``cuptiPmSamplingStop`` have start == end, stamped when sampling
  started: they cover no time;
* after a decode that filled its counter-data image (stop reason ``COUNTER_DATA_FULL``), a run of samples
  comes back with start and end 0. The capture hands images over half full (cupti_session.py), so an image
  fills only when the decode loop falls behind by more than ``HEADROOM_S``; these are counted in the notes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIT = 0.02  # an untimed run is placed when its gap is its length times the interval within 2 %


@dataclass(frozen=True)
class Settled:
    keep: np.ndarray  # bool per sample
    start_inferred: int  # start 0, end real: the start is the previous sample's end
    dropped_unclocked: int  # start 0 with no sample before it to take a start from
    dropped_empty: int  # start == end: covers no time
    timestamps_filled: int  # no stamp at all, placed in a gap of matching length
    dropped_untimed: int  # no stamp at all, and no gap that fits


def settle(stamps: np.ndarray, interval_ns: int) -> Settled:
    """Repair ``stamps`` (samples x (start, end), int64, in decode order) in place; say which rows to keep."""
    start, end = stamps[:, 0], stamps[:, 1]
    untimed = (start == 0) & (end == 0)
    open_start = (start == 0) & (end != 0)
    previous_end = np.concatenate(([0], end[:-1])).astype(np.int64)
    inferred = open_start & (previous_end != 0)
    start[inferred] = previous_end[inferred]
    unclocked = open_start & ~inferred
    empty = (start == end) & ~untimed
    fitted, filled = fill_timestamps(stamps, interval_ns)
    keep = fitted & ~unclocked & ~empty
    return Settled(
        keep=keep,
        start_inferred=int(inferred.sum()),
        dropped_unclocked=int(unclocked.sum()),
        dropped_empty=int(empty.sum()),
        timestamps_filled=filled,
        dropped_untimed=int(untimed.sum()) - filled,
    )


def fill_timestamps(stamps: np.ndarray, interval_ns: int) -> tuple[np.ndarray, int]:
    """Place samples without timestamps (rows of (0, 0)), in place.

    A run of k such samples between a sample ending at E and one starting at S is placed in k equal slots
    when (S - E) / k is the sampling interval within 2 %; runs at the ends of the capture, or that do not
    fit, are dropped. Returns the rows to keep and how many were placed."""
    keep = np.ones(len(stamps), dtype=bool)
    untimed = (stamps[:, 0] == 0) & (stamps[:, 1] == 0)
    edges_of_runs = np.flatnonzero(np.diff(np.concatenate(([0], untimed.view(np.int8), [0]))))
    filled = 0
    for i, j in zip(edges_of_runs[::2].tolist(), edges_of_runs[1::2].tolist(), strict=True):
        k = j - i
        if i > 0 and j < len(stamps):
            before, after = int(stamps[i - 1, 1]), int(stamps[j, 0])
            slot = (after - before) / k
            if abs(slot - interval_ns) <= FIT * interval_ns:
                edges = before + np.rint(np.arange(k + 1) * slot).astype(np.int64)
                stamps[i:j, 0], stamps[i:j, 1] = edges[:-1], edges[1:]
                filled += k
                continue
        keep[i:j] = False
    return keep, filled
