"""The nvml backend against a fake pynvml built from the real one (tests/fakes/fake_pynvml.py)."""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import pynvml
import pytest

from conftest import GPU_ONLY
from fakes.fake_pynvml import FakeGpu, FakeNode, install
from smlens import names as n
from smlens.errors import BackendError, BackendUnavailable, ConfigError, GpuLostError
from smlens.model import Activity, GpuIdentity
from smlens.sources.nvml.backend import NvmlBackend, open_nvml_backends
from smlens.sources.nvml.calls import Absent, value_of
from smlens.sources.nvml.session import NvmlSession

US = 1_000_000


def started(
    node: FakeNode, energy_interval: float = 15.0, utilization_interval: float = 0.0
) -> tuple[NvmlBackend, list[GpuIdentity]]:
    backend = NvmlBackend(NvmlSession(), energy_interval, utilization_interval)
    gpus = backend.discover()
    assert backend.attach(gpus) == {gpu.uuid: None for gpu in gpus}
    return backend, gpus


def test_discover_reads_identities(monkeypatch: pytest.MonkeyPatch) -> None:
    install(
        monkeypatch,
        FakeGpu("GPU-a", pci_bus_id="00000000:18:00.0"),
        FakeGpu(
            "GPU-b",
            pci_bus_id="00000000:2A:00.0",
            serial=None,
            sm_count=None,
            cuda_cores=None,
            compute_capability=(8, 0),
        ),
    )
    gpus = NvmlBackend(NvmlSession()).discover()
    assert gpus == [
        GpuIdentity(0, "GPU-a", "NVIDIA H200", "00000000:18:00.0", "580.159.04", "1650123456789", 132, "9.0"),
        GpuIdentity(1, "GPU-b", "NVIDIA H200", "00000000:2A:00.0", "580.159.04", "", None, "8.0"),
    ]


@pytest.mark.parametrize(
    ("capability", "cores", "sm_count"),
    [
        ((9, 0), 16896, 132),
        ((8, 0), 6912, 108),
        ((8, 9), 18176, 142),
        ((6, 0), 3584, None),
        ((9, 0), None, None),
    ],
)
def test_sm_count_from_cores_where_attributes_are_mig_only(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], cores: int | None, sm_count: int | None
) -> None:
    install(monkeypatch, FakeGpu("GPU-a", sm_count=None, cuda_cores=cores, compute_capability=capability))
    assert NvmlBackend(NvmlSession()).discover()[0].sm_count == sm_count


def test_gpu_lost_before_discovery_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeGpu("GPU-a", lost=True), FakeGpu("GPU-b"))
    assert [g.uuid for g in NvmlBackend(NvmlSession()).discover()] == ["GPU-b"]


def test_nvml_library_missing_gives_one_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"))
    node.library_missing = True
    nvml, gpm = open_nvml_backends()
    with pytest.raises(BackendUnavailable) as caught:
        nvml.discover()
    assert str(caught.value) == (
        "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this machine; "
        "use --backend sim for a simulated node."
    )
    assert caught.value.reason == "library_not_found"
    nvml.close()
    gpm.close()
    assert node.initialized == 0 and node.shutdown_calls == 0


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to open the NVIDIA devices"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML cannot start (unknown)"),
    ],
)
def test_nvml_init_failures_are_one_sentence(monkeypatch: pytest.MonkeyPatch, code: int, words: str) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"))
    node.init_error = code
    with pytest.raises(BackendUnavailable) as caught:
        NvmlBackend(NvmlSession()).discover()
    message = str(caught.value)
    assert words in message
    assert message.endswith(".") and message.count(". ") == 0 and "\n" not in message


def test_real_pynvml_without_driver_gives_the_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip(GPU_ONLY + "this machine has an NVIDIA driver, so NVML does start here")
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    with pytest.raises(BackendUnavailable, match=r"^NVML library libnvidia-ml\.so\.1 not found: no NVIDIA"):
        NvmlBackend(NvmlSession()).discover()


def test_gauges_and_totals_in_base_units(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", memory_used=2 * 2**30, energy_mj=1_234_567, ecc_corrected=3))
    backend, (gpu,) = started(node)
    reading = backend.read(gpu, now=100.0)
    assert reading.source == "nvml" and not reading.profiling
    assert reading.gauges == {
        n.MEMORY_USED_BYTES: 2 * 2**30,
        n.MEMORY_TOTAL_BYTES: 150_754_820_096,
        n.POWER_WATTS: 120.5,
        n.POWER_LIMIT_WATTS: 700.0,
        n.TEMPERATURE_CELSIUS: 35.0,
        n.MEMORY_TEMPERATURE_CELSIUS: 41.0,
        n.SM_CLOCK_HERTZ: 345e6,
        n.MEMORY_CLOCK_HERTZ: 3201e6,
        n.SM_CLOCK_MAX_HERTZ: 1980e6,
    }
    assert reading.totals == {
        n.ENERGY_JOULES: pytest.approx(1234.567),
        n.ECC_CORRECTED: 3.0,
        n.ECC_UNCORRECTED: 0.0,
        n.PCIE_REPLAYS: 0.0,
    }
    assert reading.missing == {}


# What an H200 without processes answered (driver 580.159.04): version 1 of nvmlDeviceGetMemoryInfo counts
# the driver's reserve as used, version 2 reports it apart and nothing used, as nvidia-smi does.
H200_RESERVED = 644_939_776


@pytest.mark.parametrize(("has_v2", "used"), [(True, 0), (False, H200_RESERVED)])
def test_memory_used_leaves_out_the_drivers_reserve_where_nvml_can(
    monkeypatch: pytest.MonkeyPatch, has_v2: bool, used: int
) -> None:
    """An idle GPU must not read "memory held" for what the driver keeps for itself."""
    gpu = FakeGpu("GPU-a", memory_used=0, memory_reserved=H200_RESERVED, memory_v2=has_v2)
    backend, (identity,) = started(install(monkeypatch, gpu))
    assert backend.read(identity, now=100.0).gauges[n.MEMORY_USED_BYTES] == used


def test_unsupported_values_are_absent_never_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(
        monkeypatch,
        FakeGpu(
            "GPU-a",
            power_mw=None,
            memory_temperature=None,
            max_sm_clock_mhz=None,
            energy_mj=None,
            ecc_corrected=None,
            ecc_uncorrected=None,
            pcie_replays=None,
            supported_clock_event_reasons=None,
            utilization_samples=None,
            utilization_percent=None,
            event_types=0,
        ),
    )
    backend, (gpu,) = started(node)
    reading = backend.read(gpu, now=1.0)
    absent = {
        n.POWER_WATTS,
        n.MEMORY_TEMPERATURE_CELSIUS,
        n.SM_CLOCK_MAX_HERTZ,
        n.ENERGY_JOULES,
        n.ECC_CORRECTED,
        n.ECC_UNCORRECTED,
        n.PCIE_REPLAYS,
        n.UTILIZATION,
        "clock_events",
        "xid_events",
    }
    assert reading.missing == dict.fromkeys(absent, "not_supported")
    assert absent.isdisjoint(reading.gauges) and absent.isdisjoint(reading.totals)
    assert reading.activity == {} and reading.clock_events == {}
    assert set(reading.gauges) == {
        n.MEMORY_USED_BYTES,
        n.MEMORY_TOTAL_BYTES,
        n.POWER_LIMIT_WATTS,
        n.TEMPERATURE_CELSIUS,
        n.SM_CLOCK_HERTZ,
        n.MEMORY_CLOCK_HERTZ,
    }


def test_error_codes_become_short_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(
        monkeypatch,
        FakeGpu(
            "GPU-a",
            errors={
                "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NO_PERMISSION,
                "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN,
                "nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_TIMEOUT,
            },
        ),
    )
    backend, (gpu,) = started(node)
    missing = backend.read(gpu, now=1.0).missing
    assert missing == {
        n.POWER_WATTS: "no_permission",
        n.TEMPERATURE_CELSIUS: "unknown",
        n.MEMORY_USED_BYTES: "timeout",
        n.MEMORY_TOTAL_BYTES: "timeout",
    }


def test_utilization_is_the_exact_integral_of_driver_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    # History from before attach only sets the starting timestamp: 10 s at 100 % must not count.
    node = install(monkeypatch, FakeGpu("GPU-a", utilization_samples=[(0, 100), (10 * US, 100)]))
    backend, (gpu,) = started(node)
    samples = node.gpu("GPU-a").utilization_samples
    assert samples is not None
    # Each value holds from the previous sample's timestamp to its own; timestamps are microseconds.
    samples += [(10_500_000, 100), (10_666_667, 0), (11_000_000, 40)]
    first = backend.read(gpu, now=1.0).activity[n.UTILIZATION]
    assert first.active_seconds == pytest.approx(0.5 * 1.0 + 0.333_333 * 0.4)
    assert first.covered_seconds == pytest.approx(1.0)
    # Nothing new: no coverage at all this tick, and not reported missing either.
    empty = backend.read(gpu, now=2.0)
    assert empty.activity == {n.UTILIZATION: Activity(0.0, 0.0)} and n.UTILIZATION not in empty.missing
    # Chained from the last timestamp seen: only the new samples count; a repeated timestamp adds nothing.
    samples += [(13_000_000, 25), (13_000_000, 25), (14_000_000, 100)]
    activity = backend.read(gpu, now=3.0).activity[n.UTILIZATION]
    assert activity.covered_seconds == pytest.approx(3.0)
    assert activity.active_seconds == pytest.approx(2.0 * 0.25 + 1.0 * 1.0)
    calls = node.gpu("GPU-a").calls
    assert calls["nvmlDeviceGetSamples"] == 4 and calls["nvmlDeviceGetUtilizationRates"] == 0


def test_time_lost_when_the_driver_ring_buffer_overran_is_not_covered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", utilization_samples=[(10 * US, 100)]))
    backend, (gpu,) = started(node)
    fake = node.gpu("GPU-a")
    fake.utilization_samples = [(40 * US, 100), (40_200_000, 50), (40_400_000, 0)]  # 10 s..40 s are gone
    activity = backend.read(gpu, now=30.0).activity[n.UTILIZATION]
    assert activity.covered_seconds == pytest.approx(0.4) and activity.active_seconds == pytest.approx(0.1)


def test_utilization_samples_read_every_utilization_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", utilization_samples=[(US + 437, 0)]))
    backend, (gpu,) = started(node, utilization_interval=5.0)
    fake = node.gpu("GPU-a")
    assert fake.utilization_samples is not None
    covered = 0.0
    for tick in range(2, 14):
        fake.utilization_samples.append((tick * US + 437, 60))  # a sample a second, µs not round
        reading = backend.read(gpu, now=float(tick))
        assert n.UTILIZATION not in reading.missing
        if tick in (2, 7, 12):
            covered += reading.activity[n.UTILIZATION].covered_seconds
        else:
            assert n.UTILIZATION not in reading.activity  # not read this tick: nothing, not a zero
    assert fake.calls["nvmlDeviceGetSamples"] == 1 + 3  # priming at attach, then at t=2, 7 and 12 s
    assert covered == pytest.approx(11.0)  # every second from 1 to 12 s, none twice


def test_utilization_falls_back_to_rates_times_elapsed(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", utilization_samples=None, utilization_percent=80))
    backend, (gpu,) = started(node)
    assert backend.read(gpu, now=5.0).activity == {n.UTILIZATION: Activity(0.0, 0.0)}
    node.gpu("GPU-a").utilization_percent = 30
    activity = backend.read(gpu, now=7.5).activity[n.UTILIZATION]
    assert activity.active_seconds == pytest.approx(0.75) and activity.covered_seconds == 2.5


def test_energy_and_replays_read_every_energy_interval_and_held_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", energy_mj=1000))
    backend, (gpu,) = started(node, energy_interval=15.0)
    fake = node.gpu("GPU-a")
    seen = []
    for now in (100.0, 105.0, 110.0, 114.9, 115.0, 120.0, 130.0, 131.0):
        fake.energy_mj = int(now * 1000)  # the driver's counters move every tick
        fake.pcie_replays = int(now)
        totals = backend.read(gpu, now).totals
        seen.append((totals[n.ENERGY_JOULES], totals[n.PCIE_REPLAYS]))
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3  # at 100, 115 and 130
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == 3
    assert [energy for energy, _ in seen] == [100.0, 100.0, 100.0, 100.0, 115.0, 115.0, 130.0, 130.0]
    assert [replays for _, replays in seen] == [100, 100, 100, 100, 115, 115, 130, 130]


def test_clock_events_decoded_for_supported_reasons_only(monkeypatch: pytest.MonkeyPatch) -> None:
    supported = (
        pynvml.nvmlClocksEventReasonGpuIdle
        | pynvml.nvmlClocksEventReasonSwPowerCap
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    current = (
        pynvml.nvmlClocksEventReasonSwPowerCap
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        | pynvml.nvmlClocksEventReasonSyncBoost  # not supported: must not appear
    )
    node = install(
        monkeypatch, FakeGpu("GPU-a", supported_clock_event_reasons=supported, clock_event_reasons=current)
    )
    backend, (gpu,) = started(node)
    first = {
        "gpu_idle": False,
        "sw_power_cap": True,
        "hw_thermal_slowdown": True,
        "hw_power_brake_slowdown": False,
    }
    assert backend.read(gpu, now=1.0).clock_events == first
    node.gpu("GPU-a").clock_event_reasons = pynvml.nvmlClocksEventReasonGpuIdle
    changed = backend.read(gpu, now=2.0).clock_events  # decoded again: the bits changed
    assert changed["gpu_idle"] is True and changed["sw_power_cap"] is False
    assert backend.read(gpu, now=3.0).clock_events == changed  # the same bits again
    node.gpu("GPU-a").clock_event_reasons = current
    assert backend.read(gpu, now=4.0).clock_events == first
    assert node.gpu("GPU-a").calls["nvmlDeviceGetSupportedClocksEventReasons"] == 1  # cached at attach


def test_xid_events_counted_per_gpu_and_drained_once_per_round(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b"), FakeGpu("GPU-c", event_types=0))
    backend, gpus = started(node)
    node.xid("GPU-a", 79)
    node.xid("GPU-b", 48)
    node.xid("GPU-a", 79)
    node.xid("GPU-a", 13)
    first = [backend.read(g, now=1.0) for g in gpus]
    assert [r.xid_events for r in first] == [{79: 2, 13: 1}, {48: 1}, {}]
    assert first[2].missing == {"xid_events": "not_supported"}
    assert node.event_wait_timeouts == [0] * 5  # four events, then one empty wait: never blocks
    second = [backend.read(g, now=2.0) for g in gpus]
    assert [r.xid_events for r in second] == [{}, {}, {}]
    assert len(node.event_wait_timeouts) == 6  # one drain for the whole round of three GPUs
    node.xid("GPU-b", 94)
    assert backend.read(gpus[1], now=3.0).xid_events == {94: 1}  # a round may start at any GPU


def test_lost_gpu_raises_for_that_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b"), FakeGpu("GPU-c"))
    backend, gpus = started(node)
    for gpu in gpus:
        backend.read(gpu, now=1.0)
    node.gpu("GPU-b").lost = True
    with pytest.raises(GpuLostError, match=r"^GPU 1 \(GPU-b\) is lost") as caught:
        backend.read(gpus[1], now=2.0)
    assert caught.value.reason == "gpu_lost"
    for gpu in (gpus[0], gpus[2]):
        assert backend.read(gpu, now=2.0).missing == {}


def test_attach_reports_a_lost_gpu_and_serves_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b"))
    backend = NvmlBackend(NvmlSession())
    gpus = backend.discover()
    node.gpu("GPU-a").lost = True
    verdicts = backend.attach(gpus)
    assert verdicts["GPU-b"] is None
    assert verdicts["GPU-a"] is not None and "GPU 0 (GPU-a) is lost" in verdicts["GPU-a"]
    with pytest.raises(BackendError) as caught:
        backend.read(gpus[0], now=1.0)
    assert caught.value.reason == "not_attached"


def test_one_nvml_init_shared_and_shut_down_at_last_close(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"))
    nvml, gpm = open_nvml_backends()
    gpus = nvml.discover()
    nvml.attach(gpus)
    gpm.attach(gpus)
    assert node.init_calls == 1
    nvml.close()
    assert node.initialized == 1 and node.shutdown_calls == 0  # gpm still uses NVML
    assert gpm.read(gpus[0], now=1.0).profiling
    gpm.close()
    gpm.close()
    nvml.close()
    assert node.initialized == 0 and node.shutdown_calls == 1
    assert node.live_event_sets == 0 and node.live_gpm_samples == 0


def test_bad_intervals_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    with pytest.raises(ConfigError, match="energy interval"):
        open_nvml_backends(energy_interval=-1.0)
    with pytest.raises(ConfigError, match="utilization interval"):
        open_nvml_backends(utilization_interval=float("nan"))


def test_values_are_read_through_the_member_their_type_names() -> None:
    union = pynvml.c_nvmlValue_t()
    union.dVal = 41.5
    assert value_of(union, pynvml.NVML_VALUE_TYPE_DOUBLE) == 41.5
    union.ullVal = 2**40
    assert value_of(union, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG) == 2**40
    assert value_of(union, 99) == Absent("unknown_value_type")


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN])
def test_an_event_wait_failure_ends_the_drain_and_costs_no_reading(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """nvml.h lets nvmlEventSetWait_v2 fail otherwise than by timeout; the XIDs already counted stay, and a
    lost GPU is reported by its own reads, not by the drain of every GPU."""
    node = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b"))
    backend, gpus = started(node)
    node.xid("GPU-b", 79)
    waits: list[int] = []

    def failing(event_set: Any, timeout_ms: int) -> Any:
        waits.append(timeout_ms)
        if len(waits) == 1:
            return node.nvmlEventSetWait_v2(event_set, timeout_ms)
        raise node.module.NVMLError(code)

    monkeypatch.setattr(node.module, "nvmlEventSetWait_v2", failing)
    first = [backend.read(g, now=1.0) for g in gpus]
    assert [r.xid_events for r in first] == [{}, {79: 1}]
    assert [r.missing for r in first] == [{}, {}]
    assert waits == [0, 0]  # the drain stopped at the failure
