"""What a capture says: ratios per sample, hollow share of busy time, the repeating step and its breakdown.

Pure numpy on a :class:`~smlens.profile.recording.Recording`; no CUPTI. Definitions (docs/profile.md):

* a sample's *busy* share is the part of its time a kernel ran (GR engine active); busy time is the sum of
  busy share x sample length, the sub-millisecond version of what NVML "utilization" counts;
* each sample is judged by the rule of the exporter's verdict and its GPUBusyButSMUnderused alert
  (thresholds.yaml), applied to the sample instead of a window: *idle* when kernels ran less than
  ``idle_utilization`` of it; *hollow* when they ran at least ``busy_utilization`` of it and SM active is
  at most ``hollow_sm_active``; *partial* when they ran only part of it (gaps between kernels: launch- or
  sync-bound); else *working*;
* the hollow share is the busy time of hollow samples over all busy time.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from smlens.profile.counters import RATIOS, ratio
from smlens.profile.recording import Recording
from smlens.verdicts.thresholds import Thresholds

IDLE, PARTIAL, HOLLOW, WORKING = 0, 1, 2, 3
CLASS_NAMES = ("idle", "partial", "hollow", "working")
MIN_REPEATS = 3  # a step period is reported only when the capture holds at least this many steps
MIN_STRENGTH = 0.5  # autocorrelation at the period, at least
MIN_PERIOD_SAMPLES = 4


@dataclass(frozen=True)
class Series:
    """The ratios of every sample, on the GPU's clock (ns)."""

    start_ns: np.ndarray
    seconds: np.ndarray  # each sample's length
    busy: np.ndarray
    sm_active: np.ndarray
    occupancy: np.ndarray
    tensor: np.ndarray
    dram: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    def ratio(self, key: str) -> np.ndarray:
        return np.asarray(getattr(self, key))


def series(recording: Recording) -> Series:
    columns = {counter: recording.column(counter) for counter in recording.counters}
    values = {r.key: ratio(r, columns, recording.peaks) for r in RATIOS}
    return Series(
        start_ns=np.asarray(recording.start_ns, dtype=np.int64),
        seconds=(np.asarray(recording.end_ns) - np.asarray(recording.start_ns)) / 1e9,
        **values,
    )


def classify(s: Series, t: Thresholds) -> np.ndarray:
    """Each sample's class, by the verdict's rule (:func:`smlens.verdicts.judge.judge`), with busy as its
    utilization."""
    classes = np.full(len(s), WORKING, dtype=np.int8)
    classes[(s.busy >= t.busy_utilization) & (s.sm_active <= t.hollow_sm_active)] = HOLLOW
    classes[s.busy < t.busy_utilization] = PARTIAL
    classes[s.busy < t.idle_utilization] = IDLE
    return classes


def hollow_share(s: Series, t: Thresholds) -> float | None:
    """Share of busy time spent in samples classed hollow."""
    busy = s.busy * s.seconds
    total = float(busy.sum())
    if total <= 0:
        return None
    return float(busy[classify(s, t) == HOLLOW].sum() / total)


def activity_histogram(s: Series, bins: int = 20) -> list[tuple[float, float, float]]:
    """Busy time by the SM activity of its sample, as (low, high, share of busy time); bins are closed on
    the right (a sample at exactly 0.3 falls in 0.25-0.3). The bins up to the hollow threshold hold the
    hollow share plus the busy time of partial samples with as little SM activity."""
    busy = s.busy * s.seconds
    total = float(busy.sum())
    edges = np.linspace(0.0, 1.0, bins + 1)
    if total <= 0:
        return [(float(edges[i]), float(edges[i + 1]), 0.0) for i in range(bins)]
    index = np.clip(np.ceil(s.sm_active * bins - 1e-9).astype(np.int64) - 1, 0, bins - 1)
    weights = np.bincount(index, weights=busy, minlength=bins)
    return [(float(edges[i]), float(edges[i + 1]), float(weights[i] / total)) for i in range(bins)]


@dataclass(frozen=True)
class StepPeriod:
    seconds: float
    samples: float  # period in samples (fractional, refined)
    strength: float  # normalised autocorrelation at the period, 0..1
    repeats: int  # whole steps in the capture


def step_period(s: Series, max_period_s: float | None = None) -> StepPeriod | None:
    """The repeat period of SM activity, by autocorrelation; None when nothing repeats clearly.

    Only lags past the autocorrelation's first fall below zero count (before it, a signal looks like
    itself because it is smooth, not because it repeats); the highest local maximum there wins, unless a
    maximum almost as high (85 %) sits at a whole fraction of its lag: then that base period wins."""
    if len(s) < 2 * MIN_PERIOD_SAMPLES * MIN_REPEATS:
        return None
    x = _uniform(s)
    n = len(x)
    if float(np.dot(x, x)) <= 0:
        return None
    size = 1 << (2 * n - 1).bit_length()
    spectrum = np.fft.rfft(x, size)
    acf = np.fft.irfft(spectrum * np.conj(spectrum), size)[:n]
    acf = acf / (acf[0] * (n - np.arange(n)) / n)  # unbiased: each lag by its overlap
    dt = float(np.median(s.seconds))
    longest = n // MIN_REPEATS
    if max_period_s is not None and dt > 0:
        longest = min(longest, int(max_period_s / dt))
    negative = np.nonzero(acf[:longest] < 0)[0]
    if len(negative) == 0:
        return None
    shortest = max(MIN_PERIOD_SAMPLES, int(negative[0]))
    if longest <= shortest + 1:
        return None
    lags = np.arange(shortest, longest)
    window = acf[shortest - 1 : longest + 1]
    peaks = lags[(window[1:-1] > window[:-2]) & (window[1:-1] >= window[2:])]
    peaks = peaks[acf[peaks] >= MIN_STRENGTH]
    if len(peaks) == 0:
        return None
    lag = int(peaks[np.argmax(acf[peaks])])
    for divisor in range(lag // shortest, 1, -1):  # a peak at a fraction of the best one is the base period
        near = peaks[np.abs(peaks - lag / divisor) <= 0.05 * lag / divisor]
        if len(near) and float(acf[near].max()) >= 0.85 * float(acf[lag]):
            lag = int(near[np.argmax(acf[near])])
            break
    left, mid, right = acf[lag - 1], acf[lag], acf[lag + 1]
    curvature = left - 2 * mid + right
    shift = 0.5 * (left - right) / curvature if curvature < 0 else 0.0
    period = lag + float(shift)
    return StepPeriod(period * dt, period, float(mid), int(n // period))


def _grid(s: Series, values: np.ndarray) -> np.ndarray:
    """``values`` on a grid of one median sample length, placed by start time; NaN where no sample fell
    (a sample lost in decoding leaves a hole rather than shifting everything after it)."""
    dt = float(np.median(s.seconds))
    index = np.rint((s.start_ns - s.start_ns[0]) / (dt * 1e9)).astype(np.int64)
    grid = np.full(int(index[-1]) + 1, np.nan)
    grid[index] = values
    return grid


def _uniform(s: Series) -> np.ndarray:
    """SM activity minus its mean on the grid; holes read the mean (0)."""
    grid = _grid(s, s.sm_active - float(s.sm_active.mean()))
    grid[np.isnan(grid)] = 0.0
    return grid


@dataclass(frozen=True)
class Stretch:
    kind: str  # one of CLASS_NAMES
    start_s: float  # from the step's start
    seconds: float
    sm_active: float  # mean over the stretch
    tensor: float


@dataclass(frozen=True)
class StepBreakdown:
    period_s: float
    steps: int  # steps averaged
    idle_s: float
    partial_s: float
    hollow_s: float
    working_s: float
    stretches: tuple[Stretch, ...]


def breakdown(s: Series, period: StepPeriod, t: Thresholds) -> StepBreakdown:
    """The typical step: the position-wise median of every whole step, cut at its longest quiet moment."""
    p = max(1, round(period.samples))
    grids = {key: _grid(s, s.ratio(key)) for key in ("busy", "sm_active", "tensor")}
    steps = len(grids["busy"]) // p
    with warnings.catch_warnings():  # a position no step has a sample for: NaN, read as idle below
        warnings.simplefilter("ignore", RuntimeWarning)
        fold = {
            key: np.nan_to_num(np.nanmedian(g[: steps * p].reshape(steps, p), axis=0))
            for key, g in grids.items()
        }
    dt = float(np.median(s.seconds))
    start = int(np.argmin(np.convolve(fold["busy"] + fold["sm_active"], np.ones(3) / 3, mode="same")))
    # start the step where its longest idle stretch ends (or at its quietest sample when none is idle)
    profile = Series(
        start_ns=np.arange(p, dtype=np.int64),
        seconds=np.full(p, dt),
        busy=np.roll(fold["busy"], -start),
        sm_active=np.roll(fold["sm_active"], -start),
        occupancy=np.zeros(p),
        tensor=np.roll(fold["tensor"], -start),
        dram=np.zeros(p),
    )
    classes = classify(profile, t)
    runs = _runs(classes)
    idle_runs = [r for r in runs if r[0] == IDLE]
    if idle_runs:
        _, first, length = max(idle_runs, key=lambda r: r[2])
        shift = (first + length) % p
        profile = Series(**{k: np.roll(getattr(profile, k), -shift) for k in Series.__dataclass_fields__})
        classes = np.roll(classes, -shift)
        runs = _runs(classes)
    stretches = tuple(
        Stretch(
            CLASS_NAMES[kind],
            first * dt,
            length * dt,
            float(profile.sm_active[first : first + length].mean()),
            float(profile.tensor[first : first + length].mean()),
        )
        for kind, first, length in runs
    )
    seconds = {name: sum(x.seconds for x in stretches if x.kind == name) for name in CLASS_NAMES}
    return StepBreakdown(
        p * dt, steps, seconds["idle"], seconds["partial"], seconds["hollow"], seconds["working"], stretches
    )


def _runs(classes: np.ndarray) -> list[tuple[int, int, int]]:
    """(class, first index, length) of each run of equal classes."""
    runs: list[tuple[int, int, int]] = []
    first = 0
    for i in range(1, len(classes) + 1):
        if i == len(classes) or classes[i] != classes[first]:
            runs.append((int(classes[first]), first, i - first))
            first = i
    return runs


def window_mean(s: Series, key: str, start_ns: int, end_ns: int) -> tuple[float | None, int]:
    """Time-weighted mean of ``key`` over the samples wholly inside [start_ns, end_ns], and their count."""
    end = s.start_ns + (s.seconds * 1e9).astype(np.int64)
    inside = (s.start_ns >= start_ns) & (end <= end_ns)
    count = int(inside.sum())
    if count == 0:
        return None, 0
    weights = s.seconds[inside]
    return float(np.average(s.ratio(key)[inside], weights=weights)), count
