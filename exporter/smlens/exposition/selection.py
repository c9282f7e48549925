"""Which metric families /metrics carries: named groups, chosen with ``--metrics`` (Helm value
``metrics``), as node_exporter's collectors and dcgm-exporter's counters file choose theirs.

The default groups hold what the shipped rules, alerts and dashboards read, within a budget of series
per GPU that a hosted Prometheus bills for (docs/metrics.md). A GPU's identity and state (``gpu_info``,
``gpu_up``, ``gpu_profiling_available``, ``gpu_profiling_mode``), MIG instances' ``gpu_mig_info``, the
attribution families and the exporter's own health are not in any group: they are always there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from smlens import names as n
from smlens.files import quote

DEFAULT = "default"
ALL = "all"


@dataclass(frozen=True)
class Group:
    """Families exported together. ``only``: for a family with a label that tells its series apart
    (a clock-event reason, a pipe), the label values this group exports; every value where not named."""

    name: str
    default: bool
    families: frozenset[str]
    help: str
    only: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _group(
    name: str, default: bool, help: str, *families: str, only: Mapping[str, Iterable[str]] | None = None
) -> Group:
    limited = {family: frozenset(values) for family, values in (only or {}).items()}
    return Group(name, default, frozenset(families), help, limited)


# DMMA reads 0 on Hopper, whose FP64 tensor work shows as DFMA, and DCGM has no ratio for it: it waits
# in the pipes group, which keeps a GPU a workload holds within the budget.
DEFAULT_PIPES = tuple(label for key, label in n.PIPE_LABELS if key != n.DMMA_ACTIVE)


GROUPS = (
    _group(
        "activity",
        True,
        "utilization, SM active, SM occupancy, tensor and DRAM activity: gauges, integrals, coverage; "
        "the integrals of every compute pipe and of the compute speed of light",
        n.GPU_UTILIZATION_RATIO,
        n.GPU_SM_ACTIVE_RATIO,
        n.GPU_SM_OCCUPANCY_RATIO,
        n.GPU_TENSOR_ACTIVE_RATIO,
        n.GPU_DRAM_ACTIVE_RATIO,
        n.GPU_BUSY_SECONDS,
        n.GPU_SM_ACTIVE_SECONDS,
        n.GPU_SM_OCCUPANCY_SECONDS,
        n.GPU_TENSOR_ACTIVE_SECONDS,
        n.GPU_DRAM_ACTIVE_SECONDS,
        n.GPU_PIPE_ACTIVE_SECONDS,
        n.GPU_COMPUTE_SOL_SECONDS,
        n.GPU_UTILIZATION_SAMPLED_SECONDS,
        n.GPU_PROFILED_SECONDS,
        only={n.GPU_PIPE_ACTIVE_SECONDS: DEFAULT_PIPES},
    ),
    _group(
        "memory", True, "framebuffer memory used and total", n.GPU_MEMORY_USED_BYTES, n.GPU_MEMORY_TOTAL_BYTES
    ),
    _group("power", True, "board power and energy", n.GPU_POWER_WATTS, n.GPU_ENERGY_JOULES),
    _group("temperature", True, "GPU core temperature", n.GPU_TEMPERATURE_CELSIUS),
    _group(
        "clocks",
        True,
        "SM clock, and the clock events that slow a GPU down (thermal and hardware slowdowns)",
        n.GPU_SM_CLOCK_HERTZ,
        n.GPU_CLOCK_EVENT_ACTIVE,
        only={n.GPU_CLOCK_EVENT_ACTIVE: n.SLOWDOWN_REASONS},
    ),
    _group("errors", True, "ECC and XID errors", n.GPU_ECC_ERRORS, n.GPU_XID_ERRORS),
    _group(
        "pipes",
        False,
        "HMMA, FP64, FP32 and FP16 pipe activity gauges, and the DMMA pipe's integral",
        n.GPU_PIPE_ACTIVE_SECONDS,
        n.GPU_HMMA_ACTIVE_RATIO,
        n.GPU_FP64_ACTIVE_RATIO,
        n.GPU_FP32_ACTIVE_RATIO,
        n.GPU_FP16_ACTIVE_RATIO,
    ),
    _group(
        "accounting",
        False,
        "seconds per verdict class and owner of every GPU and MIG instance (the Waste and cost dashboard, "
        "`smlens report`), and each MIG instance's share of its GPU",
        n.GPU_VERDICT_SECONDS,
        n.GPU_MIG_SM_SHARE_RATIO,
    ),
    _group(
        "pcie",
        False,
        "PCIe bytes sent and received, and replays",
        n.GPU_PCIE_TRANSMIT_BYTES,
        n.GPU_PCIE_RECEIVE_BYTES,
        n.GPU_PCIE_REPLAYS,
    ),
    _group(
        "nvlink",
        False,
        "NVLink bytes sent and received",
        n.GPU_NVLINK_TRANSMIT_BYTES,
        n.GPU_NVLINK_RECEIVE_BYTES,
    ),
    _group(
        "clock_events",
        False,
        "every clock-event reason the GPU reports (power cap, idle, application clocks, sync boost...)",
        n.GPU_CLOCK_EVENT_ACTIVE,
    ),
    _group(
        "limits",
        False,
        "enforced power limit and maximum SM clock",
        n.GPU_POWER_LIMIT_WATTS,
        n.GPU_SM_CLOCK_MAX_HERTZ,
    ),
    _group(
        "device_memory",
        False,
        "device memory (HBM) temperature and clock",
        n.GPU_MEMORY_TEMPERATURE_CELSIUS,
        n.GPU_MEMORY_CLOCK_HERTZ,
    ),
)
BY_NAME = {group.name: group for group in GROUPS}
DEFAULT_GROUPS = tuple(group.name for group in GROUPS if group.default)
SELECTABLE = frozenset(family for group in GROUPS for family in group.families)


@dataclass(frozen=True)
class Selection:
    """The groups chosen; :meth:`exports` says whether a family is in them."""

    groups: tuple[str, ...] = DEFAULT_GROUPS

    def __post_init__(self) -> None:
        for name in self.groups:
            _known(name)

    def exports(self, family: str) -> bool:
        """Whether a family (a whole-GPU name, or a MIG instance's twin of one) is exported."""
        if family not in SELECTABLE and family.startswith("gpu_mig_"):
            family = "gpu_" + family.removeprefix("gpu_mig_")
        return family not in SELECTABLE or any(family in BY_NAME[g].families for g in self.groups)

    def exports_value(self, family: str, value: str) -> bool:
        """Whether a family carries its series of this label value (a reason, a pipe)."""
        chosen = [BY_NAME[g] for g in self.groups if family in BY_NAME[g].families]
        return any(family not in group.only or value in group.only[family] for group in chosen)


def parse_selection(text: str) -> Selection:
    """``--metrics``: comma-separated group names; ``default`` and ``all`` stand for those sets, and a
    name after ``-`` leaves a group out (``default,pcie,-errors``; ``-errors`` alone leaves it out of
    the default groups). A selection of no group at all is refused: nothing the bundle reads would be
    exported."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if items and all(item.startswith("-") for item in items):
        items = [DEFAULT, *items]
    chosen: list[str] = []
    for item in items:
        leave_out = item.startswith("-")
        name = item.removeprefix("-").strip()
        names = DEFAULT_GROUPS if name == DEFAULT else tuple(BY_NAME) if name == ALL else (name,)
        for group in names:
            if leave_out:
                chosen = [g for g in chosen if g != group]
            elif group not in chosen:
                chosen.append(group)
        if name not in (DEFAULT, ALL):
            _known(name)  # also where it only leaves a group out
    if not chosen:
        raise ValueError("selects no metric group: name at least one, or default")
    return Selection(tuple(chosen))


def _known(name: str) -> None:
    if name not in BY_NAME:
        raise ValueError(
            f"names no metric group {quote(name)}: the groups are {', '.join(BY_NAME)}, {DEFAULT} and {ALL}"
        )


DEFAULT_SELECTION = Selection()
EVERYTHING = Selection(tuple(BY_NAME))
