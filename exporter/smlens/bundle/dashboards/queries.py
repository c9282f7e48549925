"""The dashboards' PromQL for one set of thresholds: the rule window names the recorded series."""

from __future__ import annotations

from smlens import names as n
from smlens.bundle.grafana import Variable
from smlens.bundle.layers import (
    COMPUTE_SOL,
    GPU,
    Level,
    count_name,
    hollow_name,
    level_labels,
    mean_expr,
    ranked_name,
    stalled_name,
    sum_name,
    summed,
    wasted_name,
)
from smlens.bundle.promql import ratio, total
from smlens.bundle.series import DCGM_EXPORTER, MEMORY_SOL_MEAN, SM_ACTIVE_MEAN, UTILIZATION_MEAN, Mean
from smlens.verdicts.thresholds import Thresholds

# The range each graph step's rate() reads: Grafana's, which it fits to the scrape interval.
RATE_INTERVAL = "[$__rate_interval]"


class Exprs:
    """PromQL for one set of thresholds (the rule window names the recorded series)."""

    def __init__(self, t: Thresholds) -> None:
        self.t = t
        self.w = t.window
        self.c = t.cluster_label
        self.gpu_labels = ", ".join(level_labels(GPU, t.cluster_label))

    def selector(self, *matchers: str) -> str:
        """A selector on the dashboard's cluster variable and ``matchers``."""
        return "{" + ", ".join((f'{self.c}=~"$cluster"', *matchers)) + "}"

    def cluster_variable(self) -> Variable:
        return Variable("cluster", "Cluster", f"label_values({n.GPU_INFO}, {self.c})", multi=True)

    def mean(self, level: Level, mean: Mean, selector: str = "") -> str:
        """A layer's window mean per series (recorded, or its recorded sums divided)."""
        return mean_expr(level, mean, self.w, selector)

    def layer_mean(self, level: Level, mean: Mean, selector: str, by: str = "") -> str:
        """Exact window mean over the selected series of a layer: summed numerators over summed
        denominators, never a mean of ratios."""
        numerator = f"sum{by} ({summed(level, mean.numerator, self.w, selector)})"
        denominator = f"sum{by} ({summed(level, mean.denominator, self.w, selector)})"
        return ratio(numerator, denominator)

    def layer_count(self, level: Level, state: str | None, selector: str) -> str:
        return f"sum({count_name(level, state, self.w)}{selector})"

    def rules_loaded(self, level: Level, selector: str) -> str:
        """1 where the layer is recorded, 0 where smlens reports GPUs but the layer is missing (the
        recording rules are not loaded), nothing where no smlens data is selected."""
        recorded = f"group({sum_name(level, UTILIZATION_MEAN.denominator, self.w)}{selector})"
        return f"{recorded}\nor\n(group({n.GPU_UP}{selector}) - 1)"

    def ranked(self, ranking: str, top: int, *matchers: str) -> str:
        """The selection's top GPUs of one of the lists the rules rank (ranked_name)."""
        selector = self.selector(*matchers, f'ranking="{ranking}"')
        return f"topk({top}, max without (ranking) ({ranked_name(self.w)}{selector}))"

    def current_owner(self, selector: str) -> str:
        """Keeps the per-GPU series of a GPU's current owner: after pod churn the window-mean series
        of the previous owner lingers for a window, and a table would show the GPU twice."""
        labels = ", ".join((self.c, n.HOSTNAME, n.UUID, *n.OWNER_LABELS))
        return f"and on ({labels}) {n.GPU_UP}{selector}"

    @staticmethod
    def rate(counter: str, selector: str) -> str:
        """Per-second rate of a counter over each graph step."""
        return f"rate({total(counter)}{selector}{RATE_INTERVAL})"

    @staticmethod
    def step_ratio(numerator: str, denominator: str, selector: str, by: str) -> str:
        """Exact mean over each graph step of one counter over another, straight from the counters."""
        return ratio(
            f"sum by ({by}) ({Exprs.rate(numerator, selector)})",
            f"sum by ({by}) ({Exprs.rate(denominator, selector)})",
        )

    @staticmethod
    def step_mean(mean: Mean, selector: str, by: str) -> str:
        """Exact mean over each graph step, straight from the counters."""
        return Exprs.step_ratio(mean.numerator, mean.denominator, selector, by)

    def or_mapped(self, mean: Mean, selector: str) -> str:
        """``or`` the per-GPU window mean of GPUs mapped from dcgm-exporter, which have no smlens
        counters to take step means from; one series per GPU, like a step mean ``by (gpu)``."""
        mapped = f'{selector[:-1]}, exporter="{DCGM_EXPORTER}"}}'
        return f"\nor\nmax by (gpu) ({self.mean(GPU, mean, mapped)})"

    def gap(self, selector: str) -> str:
        return f"{self.mean(GPU, UTILIZATION_MEAN, selector)} - {self.mean(GPU, SM_ACTIVE_MEAN, selector)}"

    def hollow_hours(self, level: Level, selector: str, by: str) -> str:
        """GPU-hours spent hollow over the dashboard range, integrated at the panel's interval (the
        panels set it to at least the rule window: trailing window means sampled once per window tile
        the range)."""
        integral = f"sum_over_time({hollow_name(level, self.w)}{selector}[$__range:$__interval])"
        return f"sum by ({by}) ({integral}) * $__interval_ms / 3600000"

    def wasted_hours(self, selector: str) -> str:
        """GPU-hours each selected pod spent busy but hollow or stalled over the dashboard range, its
        recorded window means sampled once per window (the panel's least interval):
        trailing means that tile the range integrate it, at a fraction of a finer step's reads."""
        return (
            f"sum_over_time({wasted_name(self.w)}{selector}[$__range:$__interval]) * $__interval_ms / 3600000"
        )

    def roofline(self, selector: str, worst: int | None) -> tuple[str, str]:
        """Per GPU, memory speed of light (x) and compute speed of light (y); with ``worst``, only the
        busy and stalled GPUs farthest from the compute roof, that many."""
        on = f"and on ({self.gpu_labels})"
        compute = self.mean(GPU, COMPUTE_SOL, selector)
        # A point needs both: GPUs without a compute SOL (mapped from dcgm-exporter) get none.
        memory = f"({self.mean(GPU, MEMORY_SOL_MEAN, selector)} {on} {compute})"
        if worst is None:
            return memory, compute
        stalled = f"{stalled_name(GPU, self.w)}{selector} > 0"
        chosen = f"{on}\nbottomk({worst}, {compute} {on} {stalled})"
        return f"{self.mean(GPU, MEMORY_SOL_MEAN, selector)}\n{chosen}", f"{compute}\n{chosen}"

    def sm_steps(self) -> list[tuple[float | None, str]]:
        return [(None, "red"), (self.t.hollow_sm_active, "orange"), (self.t.working_sm_active, "green")]
