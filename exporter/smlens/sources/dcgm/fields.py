"""The DCGM profiling fields smlens reads, and which of them one GPU can count in one hardware pass.

DCGM groups its profiling counters into metric groups (``dcgmProfGetSupportedMetricGroups``); groups
that share a major id exclude each other, so watching fields of two of them makes DCGM multiplex the
counters. :func:`plan_fields` picks the fields smlens watches so that it never does, and
:func:`passes_needed` tells how many passes a set of fields (smlens' plus other clients') needs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from smlens import names as n

# DCGM field ids, as DCGM_FI_PROF_* names them: the C ABI is stable, while the Python constant names
# changed in DCGM 4.6, so smlens spells the numbers out. IMMA and HMMA came in DCGM 2.4.5, DFMA and INT
# in 3.0.4 (NVIDIA/DCGM dcgmlib/dcgm_fields.h): an older hostengine lists them in no metric group, so
# they are not_supported there. DCGM maps DFMA and INT to GPM's DFMA_TENSOR_UTIL and INTEGER_UTIL
# (dcgm_fields.cpp); it has no ratio field for GPM's DMMA_TENSOR_UTIL.
FI_PROF_SM_ACTIVE = 1002
FI_PROF_SM_OCCUPANCY = 1003
FI_PROF_PIPE_TENSOR_ACTIVE = 1004
FI_PROF_DRAM_ACTIVE = 1005
FI_PROF_PIPE_FP64_ACTIVE = 1006
FI_PROF_PIPE_FP32_ACTIVE = 1007
FI_PROF_PIPE_FP16_ACTIVE = 1008
FI_PROF_PCIE_TX_BYTES = 1009
FI_PROF_PCIE_RX_BYTES = 1010
FI_PROF_NVLINK_TX_BYTES = 1011
FI_PROF_NVLINK_RX_BYTES = 1012
FI_PROF_PIPE_TENSOR_IMMA_ACTIVE = 1013
FI_PROF_PIPE_TENSOR_HMMA_ACTIVE = 1014
FI_PROF_PIPE_TENSOR_DFMA_ACTIVE = 1015
FI_PROF_PIPE_INT_ACTIVE = 1016

# Fields whose value is the fraction of DCGM's sample period a unit was active.
RATIO_FIELDS: Mapping[int, str] = MappingProxyType(
    {
        FI_PROF_SM_ACTIVE: n.SM_ACTIVE,
        FI_PROF_SM_OCCUPANCY: n.SM_OCCUPANCY,
        FI_PROF_PIPE_TENSOR_ACTIVE: n.TENSOR_ACTIVE,
        FI_PROF_DRAM_ACTIVE: n.DRAM_ACTIVE,
        FI_PROF_PIPE_FP64_ACTIVE: n.FP64_ACTIVE,
        FI_PROF_PIPE_FP32_ACTIVE: n.FP32_ACTIVE,
        FI_PROF_PIPE_FP16_ACTIVE: n.FP16_ACTIVE,
        FI_PROF_PIPE_TENSOR_IMMA_ACTIVE: n.IMMA_ACTIVE,
        FI_PROF_PIPE_TENSOR_HMMA_ACTIVE: n.HMMA_ACTIVE,
        FI_PROF_PIPE_TENSOR_DFMA_ACTIVE: n.DFMA_ACTIVE,
        FI_PROF_PIPE_INT_ACTIVE: n.INTEGER_ACTIVE,
    }
)
# Fields whose value is a rate in bytes per second.
BYTE_RATE_FIELDS: Mapping[int, str] = MappingProxyType(
    {
        FI_PROF_PCIE_TX_BYTES: n.PCIE_TX_BYTES,
        FI_PROF_PCIE_RX_BYTES: n.PCIE_RX_BYTES,
        FI_PROF_NVLINK_TX_BYTES: n.NVLINK_TX_BYTES,
        FI_PROF_NVLINK_RX_BYTES: n.NVLINK_RX_BYTES,
    }
)
WANTED_FIELDS: Mapping[int, str] = MappingProxyType({**RATIO_FIELDS, **BYTE_RATE_FIELDS})


@dataclass(frozen=True)
class MetricGroup:
    """One of DCGM's profiling metric groups: groups that share ``major`` exclude each other."""

    major: int
    minor: int
    field_ids: frozenset[int]


@dataclass(frozen=True)
class FieldPlan:
    """The wanted fields one GPU can count in one pass, and why the others are unavailable."""

    watched: tuple[int, ...]
    unavailable: Mapping[str, str]


def metric_groups_of(reply: Any) -> tuple[MetricGroup, ...]:
    """The metric groups of a ``c_dcgmProfGetMetricGroups_v3`` reply."""
    groups = []
    for i in range(int(reply.numMetricGroups)):
        raw = reply.metricGroups[i]
        ids = frozenset(int(raw.fieldIds[j]) for j in range(int(raw.numFieldIds)))
        groups.append(MetricGroup(int(raw.majorId), int(raw.minorId), ids))
    return tuple(groups)


def _by_major(groups: Sequence[MetricGroup]) -> dict[int, list[MetricGroup]]:
    by_major: dict[int, list[MetricGroup]] = {}
    for group in groups:
        by_major.setdefault(group.major, []).append(group)
    return by_major


def plan_fields(groups: Sequence[MetricGroup]) -> FieldPlan:
    """Pick one metric group per major id so that DCGM never multiplexes: SM active first, then SM
    occupancy, then as many wanted fields as possible."""

    def covered(choice: Sequence[MetricGroup]) -> frozenset[int]:
        return frozenset(itertools.chain.from_iterable(g.field_ids for g in choice)) & WANTED_FIELDS.keys()

    def score(choice: Sequence[MetricGroup]) -> tuple[bool, bool, int]:
        fields = covered(choice)
        return FI_PROF_SM_ACTIVE in fields, FI_PROF_SM_OCCUPANCY in fields, len(fields)

    best = max(itertools.product(*_by_major(groups).values()), key=score, default=())
    watched = covered(best)
    supported = covered(groups)
    unavailable = {
        key: "metric_group_conflict" if field_id in supported else "not_supported"
        for field_id, key in WANTED_FIELDS.items()
        if field_id not in watched
    }
    return FieldPlan(tuple(sorted(watched)), MappingProxyType(unavailable))


def passes_needed(groups: Sequence[MetricGroup], field_ids: frozenset[int]) -> int:
    """Hardware passes DCGM needs to count ``field_ids``: per major id, the fewest of its groups that
    cover the fields only it offers; fields no group offers are ignored."""
    passes = 0
    for members in _by_major(groups).values():
        options = [group.field_ids for group in members]
        wanted = field_ids & frozenset().union(*options)
        needed = next(
            (
                size
                for size in range(1, len(options) + 1)
                if any(
                    wanted <= frozenset().union(*choice) for choice in itertools.combinations(options, size)
                )
            ),
            0,
        )
        passes = max(passes, needed if wanted else 0)
    return passes
