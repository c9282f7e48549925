"""A deterministic simulated GPU node, for demos, tests and dashboards.

Each GPU holds one steady profile by default (see :data:`DEFAULT_LAYOUT`), so users and tests can tell
them apart; a scenario file makes them change over time, or splits a GPU into MIG instances (``mig:``),
each with its own steady profile. It is only ever used when asked for (``--backend sim``), never in
place of missing hardware.
"""

from __future__ import annotations

import dataclasses
import math
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smlens import names as n
from smlens.errors import ConfigError, GpuLostError
from smlens.files import clip, quote, read_yaml
from smlens.model import Activity, GpuIdentity, InstanceReading, MigInstance, Reading
from smlens.sources.base import DeviceSource

SIM_SM_COUNT = 132
SIM_MEMORY_BYTES = 141 * 1024**3
SIM_POWER_LIMIT_WATTS = 700.0
SIM_MAX_SM_CLOCK_HERTZ = 1.98e9
NOISE = 0.02
# MIG profiles of the simulated H200: SMs and memory of one GPU instance (the H100 family's slicing).
SIM_MIG_PROFILES: Mapping[str, tuple[int, int]] = {
    "1g.18gb": (16, 18 * 1024**3),
    "2g.35gb": (32, 35 * 1024**3),
    "3g.71gb": (60, 71 * 1024**3),
    "4g.71gb": (64, 71 * 1024**3),
    "7g.141gb": (132, 141 * 1024**3),
}


@dataclass(frozen=True)
class Profile:
    """A steady state of one simulated GPU. Ratios are 0..1, named as the activity keys they give."""

    utilization: float
    sm_active: float
    sm_occupancy: float
    tensor_active: float = 0.0
    hmma_active: float = 0.0
    imma_active: float = 0.0
    dfma_active: float = 0.0
    dmma_active: float = 0.0
    dram_active: float = 0.0
    fp64_active: float = 0.0
    fp32_active: float = 0.0
    fp16_active: float = 0.0
    integer_active: float = 0.0
    memory_used_ratio: float = 0.0
    pcie_bytes_per_second: float = 0.0
    nvlink_bytes_per_second: float = 0.0


PROFILES: Mapping[str, Profile] = {
    # Shaped after what real kernels read on an H200 (docs/validation.md), so that each profile gets the
    # verdict its name says.
    "healthy": Profile(
        0.99,
        0.96,
        0.14,
        tensor_active=0.93,
        hmma_active=0.93,
        dram_active=0.17,
        fp32_active=0.05,
        integer_active=0.013,
        memory_used_ratio=0.8,
        pcie_bytes_per_second=2e9,
        nvlink_bytes_per_second=50e9,
    ),
    "hollow": Profile(
        0.98,
        0.10,
        0.03,
        tensor_active=0.02,
        hmma_active=0.02,
        dram_active=0.03,
        fp32_active=0.02,
        integer_active=0.01,
        memory_used_ratio=0.5,
        pcie_bytes_per_second=1e8,
    ),
    "single_sm": Profile(
        1.0,
        1 / SIM_SM_COUNT,
        1 / SIM_SM_COUNT / 64,
        integer_active=0.0004,
        memory_used_ratio=0.02,
    ),
    "low_occupancy": Profile(0.99, 0.99, 0.016, fp32_active=0.3, integer_active=0.05, memory_used_ratio=0.3),
    "memory_bound": Profile(
        0.99,
        0.99,
        0.80,
        dram_active=0.88,
        fp32_active=0.1,
        integer_active=0.08,
        memory_used_ratio=0.6,
        pcie_bytes_per_second=5e8,
    ),
    "launch_bound": Profile(
        0.31,
        0.12,
        0.017,
        tensor_active=0.0025,
        hmma_active=0.0025,
        integer_active=0.002,
        memory_used_ratio=0.1,
        pcie_bytes_per_second=1e7,
    ),
    "idle": Profile(0.0, 0.0, 0.0),
    "idle_memory_held": Profile(0.0, 0.0, 0.0, memory_used_ratio=0.7),
}
DEFAULT_LAYOUT = (
    "healthy",
    "hollow",
    "single_sm",
    "low_occupancy",
    "memory_bound",
    "launch_bound",
    "idle",
    "idle_memory_held",
)


# ``unreadable:`` in a scenario entry or phase names values the simulated GPU cannot deliver: keys
# of the model (power_watts, sm_active, ...), "profiling" for every SM-level key (a GPU without
# profiling) or "gpu" for a GPU that is lost. They are reported missing, never as 0.
UNREADABLE_ALL_PROFILING = "profiling"
UNREADABLE_GPU = "gpu"
UNREADABLE_KEYS = frozenset(
    {
        *n.ACTIVITIES,
        n.MEMORY_USED_BYTES,
        n.MEMORY_TOTAL_BYTES,
        n.POWER_WATTS,
        n.POWER_LIMIT_WATTS,
        n.TEMPERATURE_CELSIUS,
        n.MEMORY_TEMPERATURE_CELSIUS,
        n.SM_CLOCK_HERTZ,
        n.MEMORY_CLOCK_HERTZ,
        n.SM_CLOCK_MAX_HERTZ,
        n.ENERGY_JOULES,
        n.ECC_CORRECTED,
        n.ECC_UNCORRECTED,
        n.PCIE_REPLAYS,
        n.PCIE_TX_BYTES,
        n.PCIE_RX_BYTES,
        n.NVLINK_TX_BYTES,
        n.NVLINK_RX_BYTES,
        UNREADABLE_ALL_PROFILING,
        UNREADABLE_GPU,
    }
)


@dataclass(frozen=True)
class Phase:
    profile: Profile
    seconds: float  # how long the phase lasts before the next; phases loop
    unreadable: frozenset[str] = frozenset()


def _unreadable(raw: Any, where: str) -> frozenset[str]:
    keys = raw.get("unreadable", []) if isinstance(raw, dict) else []
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(f"{where}: 'unreadable' must be a list of value names.")
    unknown = sorted(set(keys) - UNREADABLE_KEYS)
    if unknown:
        known = ", ".join(sorted(UNREADABLE_KEYS))
        raise ConfigError(f"{where}: cannot make {clip(', '.join(unknown))} unreadable; known: {known}.")
    return frozenset(keys)


@dataclass(frozen=True)
class SimInstance:
    """One simulated MIG GPU instance and the steady profile it holds."""

    mig_profile: str  # a key of SIM_MIG_PROFILES
    profile: Profile


@dataclass(frozen=True)
class Scenario:
    """Per GPU, the phases it goes through (one phase = steady), and its MIG instances if it is split."""

    gpus: tuple[tuple[Phase, ...], ...]
    mig: Mapping[int, tuple[SimInstance, ...]] = dataclasses.field(default_factory=dict)

    @staticmethod
    def steady(count: int) -> Scenario:
        return Scenario(
            tuple((Phase(PROFILES[DEFAULT_LAYOUT[i % len(DEFAULT_LAYOUT)]], 0.0),) for i in range(count))
        )


def _profile(raw: Any, where: str) -> Profile:
    if isinstance(raw, str):
        raw = {"profile": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a profile name or a mapping, got {quote(raw)}.")
    base_name = raw.get("profile", "idle")
    if not isinstance(base_name, str) or base_name not in PROFILES:
        raise ConfigError(f"{where}: unknown profile {quote(base_name)}; known: {', '.join(PROFILES)}.")
    overrides = {k: v for k, v in raw.items() if k not in ("profile", "seconds", "unreadable")}
    fields = {f.name for f in dataclasses.fields(Profile)}
    for key, value in overrides.items():
        if key not in fields:
            raise ConfigError(
                f"{where}: unknown field {quote(key)}; known: profile, seconds, {', '.join(fields)}."
            )
        ratio_field = not key.endswith("_per_second")
        number = _finite(value)
        if number is None or number < 0 or (ratio_field and number > 1):
            bound = "a ratio from 0 to 1" if ratio_field else "a non-negative number"
            raise ConfigError(f"{where}: {key} must be {bound}, got {quote(value)}.")
        overrides[key] = number
    return dataclasses.replace(PROFILES[base_name], **overrides)


def _finite(value: object) -> float | None:
    """``value`` as a finite float; None for anything else (text, bools, NaN, inf, ints past float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def load_scenario(path: Path) -> Scenario:
    """Read a scenario file: ``gpus:`` a list, one entry per GPU, each a profile or ``phases:``."""
    raw = read_yaml(path, "scenario file")
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list) or not raw["gpus"]:
        raise ConfigError(f"scenario file {path} needs a non-empty list under 'gpus'.")
    if len(raw["gpus"]) > n.MAX_SIM_GPUS:
        raise ConfigError(
            f"scenario file {path} lists {len(raw['gpus'])} GPUs; a simulated node has at most "
            f"{n.MAX_SIM_GPUS}."
        )
    gpus: list[tuple[Phase, ...]] = []
    mig: dict[int, tuple[SimInstance, ...]] = {}
    for i, entry in enumerate(raw["gpus"]):
        where = f"{path}: gpus[{i}]"
        if isinstance(entry, dict) and "mig" in entry:
            mig[i] = _instances(entry["mig"], f"{where}.mig")
            gpus.append((Phase(PROFILES["idle"], 0.0),))
        elif isinstance(entry, dict) and "phases" in entry:
            phases = entry["phases"]
            if not isinstance(phases, list) or not phases:
                raise ConfigError(f"{where}: 'phases' must be a non-empty list.")
            built = []
            for j, phase in enumerate(phases):
                raw_seconds = phase.get("seconds") if isinstance(phase, dict) else None
                seconds = _finite(raw_seconds)
                if seconds is None or seconds <= 0:
                    raise ConfigError(
                        f"{where}.phases[{j}]: 'seconds' must be a positive number, got {quote(raw_seconds)}."
                    )
                here = f"{where}.phases[{j}]"
                built.append(Phase(_profile(phase, here), seconds, _unreadable(phase, here)))
            gpus.append(tuple(built))
        else:
            gpus.append((Phase(_profile(entry, where), 0.0, _unreadable(entry, where)),))
    return Scenario(tuple(gpus), mig)


def _instances(raw: Any, where: str) -> tuple[SimInstance, ...]:
    """``mig:`` a list of GPU instances, each ``{mig_profile: 1g.18gb, profile: hollow, ...overrides}``."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a non-empty list of GPU instances.")
    instances = []
    for j, entry in enumerate(raw):
        slot = f"{where}[{j}]"
        name = entry.get("mig_profile") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name not in SIM_MIG_PROFILES:
            raise ConfigError(
                f"{slot}: mig_profile must be one of {', '.join(SIM_MIG_PROFILES)}, got {quote(name)}."
            )
        instances.append(
            SimInstance(name, _profile({k: v for k, v in entry.items() if k != "mig_profile"}, slot))
        )
    if sum(SIM_MIG_PROFILES[i.mig_profile][0] for i in instances) > SIM_SM_COUNT:
        raise ConfigError(f"{where}: the instances need more than the GPU's {SIM_SM_COUNT} SMs.")
    return tuple(instances)


class SimBackend(DeviceSource):
    """Simulated node: GPU ``i`` follows ``scenario.gpus[i]``, with seeded noise of at most +/-0.02."""

    name = "sim"
    provides_profiling = True

    def __init__(self, scenario: Scenario, seed: int = 0, hostname_hint: str = "sim") -> None:
        self._scenario = scenario
        self._seed = seed
        self._namespace = uuid.uuid5(uuid.NAMESPACE_DNS, f"smlens-sim-{hostname_hint}-{seed}")
        self._rng: dict[int, random.Random] = {}
        self._start: float | None = None
        self._last: dict[int, float] = {}
        self._energy: dict[int, float] = {}

    def discover(self) -> list[GpuIdentity]:
        return [
            GpuIdentity(
                index=i,
                uuid=f"GPU-{uuid.uuid5(self._namespace, str(i))}",
                name="NVIDIA H200 (simulated)",
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                driver_version="sim",
                serial=f"SIM{self._seed:04d}{i:04d}",
                sm_count=SIM_SM_COUNT,
                compute_capability="9.0",
            )
            for i in range(len(self._scenario.gpus))
        ]

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        for gpu in gpus:
            self._rng[gpu.index] = random.Random(self._seed * 1_000_003 + gpu.index)
            self._energy[gpu.index] = 0.0
        return {gpu.uuid: None for gpu in gpus}

    def profile_at(self, index: int, elapsed: float) -> Profile:
        return self.phase_at(index, elapsed).profile

    def phase_at(self, index: int, elapsed: float) -> Phase:
        phases = self._scenario.gpus[index]
        if len(phases) == 1:
            return phases[0]
        position = elapsed % sum(p.seconds for p in phases)
        for phase in phases:
            if position < phase.seconds:
                return phase
            position -= phase.seconds
        return phases[-1]

    def _noisy(self, rng: random.Random, value: float) -> float:
        if value == 0.0:
            return 0.0
        # Small values get proportionally small noise, so that one busy SM's share stays recognisable.
        amplitude = min(NOISE, value * 0.1)
        return min(max(value + rng.uniform(-amplitude, amplitude), 0.0), 1.0)

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        if self._start is None:
            self._start = now
        rng = self._rng[gpu.index]
        phase = self.phase_at(gpu.index, now - self._start)
        if UNREADABLE_GPU in phase.unreadable:
            raise GpuLostError(f"simulated GPU {gpu.index} is lost (scenario).")
        split = self._scenario.mig.get(gpu.index, ())
        profile = self._whole(split) if split else phase.profile
        last = self._last.get(gpu.index)
        self._last[gpu.index] = now
        dt = 0.0 if last is None else max(now - last, 0.0)
        ratios = {key: getattr(profile, key) for key in n.ACTIVITIES}
        noisy = {key: self._noisy(rng, value) for key, value in ratios.items()}
        activity = {key: Activity.of(value, dt) for key, value in noisy.items()} if dt > 0 else {}
        if split:  # as NVML: no utilization for a GPU in MIG mode
            activity.pop(n.UTILIZATION, None)
        busy = noisy[n.UTILIZATION]
        power = 75.0 + (SIM_POWER_LIMIT_WATTS - 75.0) * (0.25 * busy + 0.75 * noisy[n.SM_ACTIVE]) * 0.9
        self._energy[gpu.index] += power * dt
        clock = SIM_MAX_SM_CLOCK_HERTZ if busy > 0 else 345e6
        reading = Reading(
            source=self.name,
            gauges={
                n.MEMORY_USED_BYTES: round(profile.memory_used_ratio * SIM_MEMORY_BYTES),
                n.MEMORY_TOTAL_BYTES: float(SIM_MEMORY_BYTES),
                n.POWER_WATTS: round(power, 1),
                n.POWER_LIMIT_WATTS: SIM_POWER_LIMIT_WATTS,
                n.TEMPERATURE_CELSIUS: round(30.0 + 40.0 * noisy[n.SM_ACTIVE] + 5.0 * busy),
                n.MEMORY_TEMPERATURE_CELSIUS: round(32.0 + 30.0 * noisy[n.DRAM_ACTIVE] + 5.0 * busy),
                n.SM_CLOCK_HERTZ: clock,
                n.MEMORY_CLOCK_HERTZ: 2.619e9,
                n.SM_CLOCK_MAX_HERTZ: SIM_MAX_SM_CLOCK_HERTZ,
            },
            activity=activity,
            totals={
                n.ENERGY_JOULES: self._energy[gpu.index],
                n.ECC_CORRECTED: 0.0,
                n.ECC_UNCORRECTED: 0.0,
                n.PCIE_REPLAYS: 0.0,
            },
            increments={
                n.PCIE_TX_BYTES: profile.pcie_bytes_per_second * dt / 2,
                n.PCIE_RX_BYTES: profile.pcie_bytes_per_second * dt / 2,
                n.NVLINK_TX_BYTES: profile.nvlink_bytes_per_second * dt / 2,
                n.NVLINK_RX_BYTES: profile.nvlink_bytes_per_second * dt / 2,
            },
            clock_events={"gpu_idle": busy == 0.0, "sw_power_cap": False, "hw_thermal_slowdown": False},
            missing={n.UTILIZATION: "not_supported"} if split else {},
            profiling=True,
            instances=self._instance_readings(gpu, split, rng, dt),
            mig_layout_read=True,
        )
        return _without(reading, phase.unreadable) if phase.unreadable else reading

    @staticmethod
    def _whole(split: Sequence[SimInstance]) -> Profile:
        """A split GPU as a whole: its instances' profiles weighted by their SMs, idle SMs counting 0."""
        weights = [SIM_MIG_PROFILES[i.mig_profile][0] / SIM_SM_COUNT for i in split]
        merged = {
            f.name: sum(w * getattr(i.profile, f.name) for w, i in zip(weights, split, strict=True))
            for f in dataclasses.fields(Profile)
        }
        memory = sum(SIM_MIG_PROFILES[i.mig_profile][1] * i.profile.memory_used_ratio for i in split)
        return Profile(**{**merged, "memory_used_ratio": memory / SIM_MEMORY_BYTES})

    def _instance_readings(
        self, gpu: GpuIdentity, split: Sequence[SimInstance], rng: random.Random, dt: float
    ) -> tuple[InstanceReading, ...]:
        readings = []
        for position, sim in enumerate(split):
            sms, memory = SIM_MIG_PROFILES[sim.mig_profile]
            instance = MigInstance(
                gpu_instance=position + 1,
                profile=sim.mig_profile,
                mig_uuids=(f"MIG-{uuid.uuid5(self._namespace, f'{gpu.index}/{position}')}",),
                sm_count=sms,
            )
            ratios = {key: self._noisy(rng, getattr(sim.profile, key)) for key in n.INSTANCE_ACTIVITIES}
            readings.append(
                InstanceReading(
                    instance,
                    gauges={
                        n.MEMORY_USED_BYTES: round(sim.profile.memory_used_ratio * memory),
                        n.MEMORY_TOTAL_BYTES: float(memory),
                    },
                    activity={k: Activity.of(v, dt) for k, v in ratios.items()} if dt > 0 else {},
                )
            )
        return tuple(readings)


def _without(reading: Reading, unreadable: frozenset[str]) -> Reading:
    """The reading with the unreadable keys moved to ``missing`` (reason not_supported)."""
    keys = set(unreadable) - {UNREADABLE_ALL_PROFILING}
    if UNREADABLE_ALL_PROFILING in unreadable:
        keys |= set(n.PROFILING_ACTIVITIES)
    return reading._replace(
        gauges={k: v for k, v in reading.gauges.items() if k not in keys},
        activity={k: v for k, v in reading.activity.items() if k not in keys},
        totals={k: v for k, v in reading.totals.items() if k not in keys},
        increments={k: v for k, v in reading.increments.items() if k not in keys},
        missing={**reading.missing, **dict.fromkeys(sorted(keys), "not_supported")},
        profiling=not keys & set(n.PROFILING_ACTIVITIES),
    )
