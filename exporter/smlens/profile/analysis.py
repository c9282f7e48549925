"""What a capture says: ratios per sample, hollow share of busy time, the repeating step and its breakdown.

Pure numpy on a :class:`~smlens.profile.recording.Recording`; no CUPTI. Definitions (docs/profile.md):

* a sample's *busy* share is the part of its time a kernel ran (GR engine active); busy time is the sum of
  busy share x sample length, the sub-millisecond version of what NVML "utilization" counts;
* each sample is judged by the exporter's verdict (:func:`smlens.verdicts.judge.judge`, thresholds.yaml)
  applied to the sample instead of a window, with its busy share as the utilization and its busiest compute
  pipe as the compute speed of light: *idle*, *hollow*, *memory_bound*, *compute_bound*, *stalled* (SMs
  active, but neither DRAM nor a pipe near its peak) or *partial* (kernels on part of the SMs part of the
  time: gaps between kernels, launch- or sync-bound); *unknown* where the verdict needs a pipe the
  recording lacks (one made before the pipe counters were recorded, or on a GPU whose PM sampling cannot
  take them in the same pass, GH100 among them: only tensor is there);
* the hollow share is the busy time of hollow samples over all busy time.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from smlens import names as n
from smlens.profile.counters import PIPE_OF, PIPE_RATIOS, RATIOS, ratio
from smlens.profile.recording import Recording
from smlens.verdicts.judge import Means, judge
from smlens.verdicts.thresholds import Thresholds

IDLE, PARTIAL, HOLLOW, STALLED, MEMORY_BOUND, COMPUTE_BOUND, UNKNOWN = range(7)
CLASS_NAMES = (
    n.VERDICT_IDLE,
    n.VERDICT_PARTIAL,
    n.VERDICT_HOLLOW,
    n.VERDICT_STALLED,
    n.VERDICT_MEMORY_BOUND,
    n.VERDICT_COMPUTE_BOUND,
    n.VERDICT_UNKNOWN,
)
# verdict code -> class; a sample's memory is never known, so it is never "idle, memory held"
_CLASS_OF = {code: i for i, code in enumerate(CLASS_NAMES)}
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
    # the other compute pipes the recording holds, by PIPE_RATIOS key (none in a recording made before them)
    pipes: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.start_ns)

    def ratio(self, key: str) -> np.ndarray:
        return np.asarray(self.pipes[key] if key in self.pipes else getattr(self, key))

    def ratio_keys(self) -> tuple[str, ...]:
        """The keys of every ratio it holds."""
        return (*(r.key for r in RATIOS), *self.pipes)

    def map(self, f: Callable[[np.ndarray], np.ndarray]) -> Series:
        """Every per-sample array, ``start_ns`` and ``seconds`` too, through ``f``."""
        plain = {k.name: f(getattr(self, k.name)) for k in dataclasses.fields(self) if k.name != "pipes"}
        return Series(**plain, pipes={k: f(v) for k, v in self.pipes.items()})


def series(recording: Recording) -> Series:
    columns = {counter: recording.column(counter) for counter in recording.counters}
    values = {r.key: ratio(r, columns, recording.peaks) for r in RATIOS}
    pipes = {
        r.key: ratio(r, columns, recording.peaks)
        for r in PIPE_RATIOS
        if r.counter in columns and r.counter in recording.peaks
    }
    return Series(
        start_ns=np.asarray(recording.start_ns, dtype=np.int64),
        seconds=(np.asarray(recording.end_ns) - np.asarray(recording.start_ns)) / 1e9,
        pipes=pipes,
        **values,
    )


def pipe_activity(s: Series) -> dict[str, np.ndarray]:
    """Each compute pipe's activity per sample, by the verdict's pipe key (names.COMPUTE_SOL_PIPES)."""
    return {PIPE_OF["tensor"]: s.tensor, **{PIPE_OF[k]: v for k, v in s.pipes.items()}}


def compute_sol(s: Series, t: Thresholds) -> np.ndarray:
    """Each sample's compute speed of light: its busiest pipe. Where the recording lacks some pipe, a busy
    pipe still makes the sample compute-bound, but a low one proves nothing: NaN there (unknown)."""
    pipes = pipe_activity(s)
    sol = np.max(np.stack(list(pipes.values())), axis=0) if len(s) else np.zeros(0)
    if set(s.pipes) != {r.key for r in PIPE_RATIOS}:
        sol = np.where(sol >= t.compute_bound_pipe, sol, np.nan)
    return np.asarray(sol, dtype=np.float64)


def classify(s: Series, t: Thresholds) -> np.ndarray:
    """Each sample's class: the exporter's verdict (:func:`smlens.verdicts.judge.judge`) on the sample, with
    busy as its utilization and its busiest pipe as its compute speed of light.

    The verdict compares each ratio with thresholds and nothing else, so samples whose ratios fall on the
    same side of every threshold get the same verdict: it is asked once for each such group, on the group's
    first sample, rather than once per sample (a 600 s capture holds millions)."""
    if len(s) == 0:
        return np.zeros(0, dtype=np.int8)
    sol = compute_sol(s, t)
    values = (s.busy, s.sm_active, s.occupancy, s.dram, sol)
    edges = np.array(sorted({v for v in t.as_dict().values() if type(v) in (int, float)}))
    keys = np.stack([_side(np.asarray(v, dtype=np.float64), edges) for v in values], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    pipes = pipe_activity(s)
    verdicts = np.array(
        [
            _CLASS_OF.get(
                judge(
                    t,
                    Means(
                        float(s.busy[i]),
                        float(s.sm_active[i]),
                        float(s.occupancy[i]),
                        float(s.dram[i]),
                        None if np.isnan(sol[i]) else float(sol[i]),
                        {k: float(v[i]) for k, v in pipes.items()},
                        False,
                    ),
                ).code,
                UNKNOWN,
            )
            for i in first
        ],
        dtype=np.int8,
    )
    return verdicts[np.asarray(inverse).reshape(-1)]


def _side(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Where each value lies among the sorted ``edges``: 2k below edge k (and above edge k-1), 2k+1 on it;
    -1 for NaN."""
    index = np.searchsorted(edges, values, side="left")
    on = (index < len(edges)) & (edges[np.minimum(index, len(edges) - 1)] == values)
    return np.where(np.isnan(values), -1, 2 * index + on)


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
    dram: float
    pipe: str | None  # compute-bound: its busiest pipe over the stretch (names.SOL_PIPE_NAMES)


@dataclass(frozen=True)
class StepBreakdown:
    period_s: float
    steps: int  # steps averaged
    idle_s: float
    partial_s: float
    hollow_s: float
    stalled_s: float
    memory_bound_s: float
    compute_bound_s: float
    unknown_s: float
    stretches: tuple[Stretch, ...]

    def seconds(self, kind: str) -> float:
        """The time of one class (CLASS_NAMES) in the typical step."""
        return float(getattr(self, f"{kind}_s"))


def breakdown(s: Series, period: StepPeriod, t: Thresholds) -> StepBreakdown:
    """The typical step: the position-wise median of every whole step, each found where it best matches the
    typical one (:func:`_step_starts`), cut at its longest quiet moment."""
    p = max(1, round(period.samples))
    grids = {key: _grid(s, s.ratio(key)) for key in s.ratio_keys()}
    activity = np.nan_to_num(grids["busy"] + grids["sm_active"])
    starts = _step_starts(activity, period.samples, p)
    rows = starts[:, None] + np.arange(p)
    with warnings.catch_warnings():  # a position no step has a sample for: NaN, read as idle below
        warnings.simplefilter("ignore", RuntimeWarning)
        fold = {key: np.nan_to_num(np.nanmedian(g[rows], axis=0)) for key, g in grids.items()}
    steps = len(starts)
    dt = float(np.median(s.seconds))
    start = int(np.argmin(np.convolve(fold["busy"] + fold["sm_active"], np.ones(3) / 3, mode="same")))
    # start the step where its longest idle stretch ends (or at its quietest sample when none is idle)
    rolled = {key: np.roll(fold[key], -start) for key in s.ratio_keys()}
    profile = Series(
        start_ns=np.arange(p, dtype=np.int64),
        seconds=np.full(p, dt),
        pipes={key: rolled[key] for key in s.pipes},
        **{r.key: rolled[r.key] for r in RATIOS},
    )
    classes = classify(profile, t)
    runs = _runs(classes)
    idle_runs = [r for r in runs if r[0] == IDLE]
    if idle_runs:
        _, first, length = max(idle_runs, key=lambda r: r[2])
        shift = (first + length) % p
        profile = profile.map(lambda values: np.roll(values, -shift))
        classes = np.roll(classes, -shift)
        runs = _runs(classes)
    pipes = pipe_activity(profile)

    def stretch(kind: int, first: int, length: int) -> Stretch:
        part = slice(first, first + length)
        means = {key: float(values[part].mean()) for key, values in pipes.items()}
        busiest = max(means, key=means.__getitem__)
        return Stretch(
            CLASS_NAMES[kind],
            first * dt,
            length * dt,
            float(profile.sm_active[part].mean()),
            float(profile.tensor[part].mean()),
            float(profile.dram[part].mean()),
            n.SOL_PIPE_NAMES[busiest] if kind == COMPUTE_BOUND else None,
        )

    stretches = tuple(stretch(*run) for run in runs)
    seconds = {name: sum(x.seconds for x in stretches if x.kind == name) for name in CLASS_NAMES}
    return StepBreakdown(
        p * dt, steps, **{f"{name}_s": seconds[name] for name in CLASS_NAMES}, stretches=stretches
    )


STEP_SEARCH = 0.15  # how far (share of the period) a step's start may lie from one period after the last
TEMPLATE_STEPS = 8  # steps the first template is the median of


def _step_starts(x: np.ndarray, period: float, p: int) -> np.ndarray:
    """Where each whole step of ``x`` (the grid's activity) starts. A training loop's steps are not all one
    length (a step of 10.8 ms varies by a few samples at 100 us), so steps cut at multiples of the mean period
    drift from the real ones until, a few hundred steps on, their median mixes every phase with every other.
    Instead each step is placed where it correlates best with a template of one step, within
    ``STEP_SEARCH`` of a period after the previous one; the template is the median of the first
    ``TEMPLATE_STEPS`` steps at multiples of the period, then once more the median of all steps so placed."""
    if len(x) < p:
        return np.zeros(0, dtype=np.int64)
    first = np.rint(np.arange(min(TEMPLATE_STEPS, int((len(x) - p) // period) + 1)) * period)
    template = np.median(x[first.astype(np.int64)[:, None] + np.arange(p)], axis=0)
    size = 1 << (len(x) + p).bit_length()
    spectrum = np.fft.rfft(x, size)
    starts = _place_steps(spectrum, len(x), template, period)
    template = np.median(x[starts[:, None] + np.arange(p)], axis=0)
    return _place_steps(spectrum, len(x), template, period)


def _place_steps(spectrum: np.ndarray, n: int, template: np.ndarray, period: float) -> np.ndarray:
    """Each step's start: the best match of ``template`` within the search window after the last one;
    ``spectrum`` is the activity's (``n`` samples), zero-padded to twice its length or more."""
    size = 2 * (len(spectrum) - 1)
    centred = template - template.mean()
    # score[i]: x[i : i + p] against the template (the template's mean taken out, so a level shift scores 0)
    score = np.fft.irfft(spectrum * np.conj(np.fft.rfft(centred, size)), size)[: n - len(template) + 1]
    reach = max(1, round(STEP_SEARCH * period))
    nearest_first = np.array(sorted(range(-reach, reach + 1), key=abs))  # a tie goes to the expected start

    def best(expected: int, lo: int) -> int | None:
        candidates = expected + nearest_first
        candidates = candidates[(candidates >= lo) & (candidates < len(score))]
        return int(candidates[np.argmax(score[candidates])]) if len(candidates) else None

    start = best(0, 0)
    starts: list[int] = []
    while start is not None:
        starts.append(start)
        start = best(round(start + period), start + 1)
    return np.asarray(starts, dtype=np.int64)


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
