"""The gpm backend against a fake pynvml built from the real one (tests/fakes/fake_pynvml.py)."""

from __future__ import annotations

import ctypes
import math
import struct

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.fake_pynvml import FakeGpu, FakeNode, install
from smlens import names as n
from smlens.errors import BackendError, GpuLostError
from smlens.model import GpuIdentity, Reading
from smlens.sources.nvml.backend import NvmlBackend
from smlens.sources.nvml.gpm import METRICS, NOT_SUPPORTED, GpmBackend, results_layout
from smlens.sources.nvml.session import NvmlSession

MIB = 1 << 20
SM = pynvml.NVML_GPM_METRIC_SM_UTIL
OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
TENSOR = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
PCIE_TX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
NVLINK_RX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC


def attached(node: FakeNode) -> tuple[GpmBackend, list[GpuIdentity], dict[str, str | None]]:
    session = NvmlSession()
    gpus = NvmlBackend(session).discover()
    backend = GpmBackend(session)
    return backend, gpus, backend.attach(gpus)


def ratio_seconds(reading: Reading, key: str) -> tuple[float, float]:
    activity = reading.activity[key]
    return activity.active_seconds, activity.covered_seconds


def test_first_read_only_takes_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", gpm_rates={SM: 50.0}))
    backend, (gpu,), _ = attached(node)
    assert backend.read(gpu, now=10.0) == Reading(source="gpm", profiling=True, mig_layout_read=True)
    assert node.gpu("GPU-a").calls["nvmlGpmSampleGet"] == 1 and node.metric_requests == []


def test_each_read_covers_exactly_the_interval_since_the_previous(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"))
    fake = node.gpu("GPU-a")
    backend, (gpu,), _ = attached(node)
    backend.read(gpu, now=100.0)
    fake.gpm_rates = {SM: 50.0, OCCUPANCY: 12.5, TENSOR: 90.0, PCIE_TX: 1000.0, NVLINK_RX: 0.0}
    node.advance(2.0)
    first = backend.read(gpu, now=102.0)
    fake.gpm_rates = {SM: 20.0, OCCUPANCY: 1.5625, DRAM: 88.0, PCIE_TX: 10.0, NVLINK_RX: 40_000.0}
    node.advance(0.5)
    second = backend.read(gpu, now=102.5)
    assert ratio_seconds(first, n.SM_ACTIVE) == pytest.approx((1.0, 2.0))
    assert ratio_seconds(first, n.SM_OCCUPANCY) == pytest.approx((0.25, 2.0))
    assert ratio_seconds(first, n.TENSOR_ACTIVE) == pytest.approx((1.8, 2.0))
    assert ratio_seconds(first, n.DRAM_ACTIVE) == (0.0, 2.0)
    assert first.increments[n.PCIE_TX_BYTES] == pytest.approx(1000.0 * MIB * 2.0)
    # Between the 2nd and 3rd samples only: a mix with the first interval would read 0.44 for SM active.
    assert ratio_seconds(second, n.SM_ACTIVE) == pytest.approx((0.1, 0.5))
    assert ratio_seconds(second, n.SM_OCCUPANCY) == pytest.approx((0.0078125, 0.5))
    assert ratio_seconds(second, n.TENSOR_ACTIVE) == (0.0, 0.5)
    assert ratio_seconds(second, n.DRAM_ACTIVE) == pytest.approx((0.44, 0.5))
    assert second.increments[n.PCIE_TX_BYTES] == pytest.approx(10.0 * MIB * 0.5)
    assert second.increments[n.NVLINK_RX_BYTES] == pytest.approx(40_000.0 * MIB * 0.5)
    assert set(second.activity) == set(n.PROFILING_ACTIVITIES) and second.missing == {}
    assert second.profiling and second.source == "gpm"


def test_every_key_reads_its_own_gpm_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    # A distinct rate for every metric, none of them 0: a key read from another metric, or held at 0,
    # reads the wrong value.
    ratios = {
        n.SM_ACTIVE: ("SM_UTIL", 50.0),
        n.SM_OCCUPANCY: ("SM_OCCUPANCY", 12.5),
        n.TENSOR_ACTIVE: ("ANY_TENSOR_UTIL", 40.0),
        n.HMMA_ACTIVE: ("HMMA_TENSOR_UTIL", 25.0),
        n.IMMA_ACTIVE: ("IMMA_TENSOR_UTIL", 3.125),
        n.DFMA_ACTIVE: ("DFMA_TENSOR_UTIL", 18.75),
        n.DMMA_ACTIVE: ("DMMA_TENSOR_UTIL", 9.375),
        n.DRAM_ACTIVE: ("DRAM_BW_UTIL", 75.0),
        n.FP64_ACTIVE: ("FP64_UTIL", 12.25),
        n.FP32_ACTIVE: ("FP32_UTIL", 37.5),
        n.FP16_ACTIVE: ("FP16_UTIL", 6.25),
        n.INTEGER_ACTIVE: ("INTEGER_UTIL", 43.75),
    }
    traffic = {
        n.PCIE_TX_BYTES: ("PCIE_TX_PER_SEC", 1.0),
        n.PCIE_RX_BYTES: ("PCIE_RX_PER_SEC", 3.0),
        n.NVLINK_TX_BYTES: ("NVLINK_TOTAL_TX_PER_SEC", 5.0),
        n.NVLINK_RX_BYTES: ("NVLINK_TOTAL_RX_PER_SEC", 7.0),
    }
    rates = {
        getattr(pynvml, f"NVML_GPM_METRIC_{name}"): rate
        for name, rate in (*ratios.values(), *traffic.values())
    }
    node = install(monkeypatch, FakeGpu("GPU-a", gpm_rates=rates))
    backend, (gpu,), _ = attached(node)
    backend.read(gpu, now=0.0)
    node.advance(2.0)
    reading = backend.read(gpu, now=2.0)
    assert {key: ratio_seconds(reading, key) for key in ratios} == {
        key: pytest.approx((rate / 100 * 2.0, 2.0)) for key, (_, rate) in ratios.items()
    }
    assert reading.increments == {key: pytest.approx(rate * MIB * 2.0) for key, (_, rate) in traffic.items()}


def test_a_value_that_is_not_a_number_is_missing_not_integrated(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", gpm_rates={SM: 50.0, DRAM: math.nan, PCIE_TX: math.nan}))
    backend, (gpu,), _ = attached(node)
    backend.read(gpu, now=0.0)
    node.advance(1.0)
    reading = backend.read(gpu, now=1.0)
    assert reading.missing == {n.DRAM_ACTIVE: "not_a_number", n.PCIE_TX_BYTES: "not_a_number"}
    assert n.DRAM_ACTIVE not in reading.activity and n.PCIE_TX_BYTES not in reading.increments
    assert ratio_seconds(reading, n.SM_ACTIVE) == (0.5, 1.0)


def test_percent_is_clamped_to_a_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", gpm_rates={SM: 100.4, OCCUPANCY: -0.1}))
    backend, (gpu,), _ = attached(node)
    backend.read(gpu, now=0.0)
    node.advance(1.0)
    reading = backend.read(gpu, now=1.0)
    assert ratio_seconds(reading, n.SM_ACTIVE) == (1.0, 1.0)
    assert ratio_seconds(reading, n.SM_OCCUPANCY) == (0.0, 1.0)


def test_graphics_util_is_never_requested(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"))
    backend, (gpu,), _ = attached(node)
    for now in (1.0, 2.0, 3.0):
        node.advance(1.0)
        backend.read(gpu, now)
    assert len(node.metric_requests) == 2
    expected = [getattr(pynvml, name) for _, name in METRICS]
    assert all(ids == expected for ids in node.metric_requests)
    assert pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL not in expected


def test_metric_errors_are_missing_with_their_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvlink = {
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: pynvml.NVML_ERROR_NOT_SUPPORTED,
        NVLINK_RX: pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_GPM_METRIC_FP64_UTIL: pynvml.NVML_ERROR_NO_PERMISSION,
    }
    node = install(monkeypatch, FakeGpu("GPU-a", gpm_rates={SM: 10.0}, gpm_metric_errors=no_nvlink))
    backend, (gpu,), _ = attached(node)
    backend.read(gpu, now=0.0)
    node.advance(1.0)
    reading = backend.read(gpu, now=1.0)
    assert reading.missing == {
        n.NVLINK_TX_BYTES: "not_supported",
        n.NVLINK_RX_BYTES: "not_supported",
        n.FP64_ACTIVE: "no_permission",
    }
    assert n.FP64_ACTIVE not in reading.activity and n.NVLINK_TX_BYTES not in reading.increments
    assert ratio_seconds(reading, n.SM_ACTIVE) == pytest.approx((0.1, 1.0))


def test_gpm_unsupported_on_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(
        monkeypatch,
        FakeGpu("GPU-a"),
        FakeGpu("GPU-b", name="NVIDIA A100-SXM4-80GB", gpm_supported=False),
        FakeGpu("GPU-c", errors={"nvmlGpmQueryDeviceSupport": pynvml.NVML_ERROR_NOT_SUPPORTED}),
        FakeGpu("GPU-d", errors={"nvmlGpmQueryDeviceSupport": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}),
    )
    backend, gpus, verdicts = attached(node)
    assert verdicts == {
        "GPU-a": None,
        "GPU-b": NOT_SUPPORTED,
        "GPU-c": NOT_SUPPORTED,
        "GPU-d": "GPM not available: the NVIDIA driver is too old (GPM needs R520 or newer)",
    }
    assert NOT_SUPPORTED == "GPM not supported on this GPU (needs Hopper or newer)"
    assert node.live_gpm_samples == 2  # only for the GPU it serves
    with pytest.raises(BackendError) as caught:
        backend.read(gpus[1], now=1.0)
    assert caught.value.reason == "not_attached"
    backend.read(gpus[0], now=1.0)


def test_failed_sample_keeps_the_chain_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a", gpm_rates={SM: 40.0}))
    fake = node.gpu("GPU-a")
    backend, (gpu,), _ = attached(node)
    backend.read(gpu, now=0.0)
    node.advance(1.0)
    fake.errors["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(BackendError) as caught:
        backend.read(gpu, now=1.0)
    assert caught.value.reason == "unknown"
    del fake.errors["nvmlGpmSampleGet"]
    fake.gpm_rates = {SM: 100.0}
    node.advance(1.0)
    assert ratio_seconds(backend.read(gpu, now=2.0), n.SM_ACTIVE) == pytest.approx((1.4, 2.0))


def test_lost_gpu_raises_for_that_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(
        monkeypatch, FakeGpu("GPU-a", gpm_rates={SM: 10.0}), FakeGpu("GPU-b", gpm_rates={SM: 30.0})
    )
    backend, gpus, _ = attached(node)
    for gpu in gpus:
        backend.read(gpu, now=0.0)
    node.advance(1.0)
    node.gpu("GPU-a").lost = True
    with pytest.raises(GpuLostError, match=r"^GPU 0 \(GPU-a\) is lost"):
        backend.read(gpus[0], now=1.0)
    assert ratio_seconds(backend.read(gpus[1], now=1.0), n.SM_ACTIVE) == pytest.approx((0.3, 1.0))


def test_close_frees_the_samples_and_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    node = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b"))
    session = NvmlSession()
    backend = GpmBackend(session)
    gpus = NvmlBackend(session).discover()
    backend.attach(gpus)
    backend.attach(gpus)  # attaching again replaces the samples rather than leaking them
    assert node.live_gpm_samples == 4
    backend.close()
    assert node.live_gpm_samples == 0
    assert node.initialized == 1  # the nvml backend that discovered still holds the session


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 1, 2, 3, 999, 2**32 - 1]), st.floats(allow_nan=True, width=64)),
        min_size=1,
        max_size=len(METRICS),
    )
)
def test_one_unpack_reads_what_the_ctypes_fields_hold(results: list[tuple[int, float]]) -> None:
    """The per-tick decode unpacks every metric's nvmlReturn and value at once: it must read the bytes
    pynvml's own ctypes fields read, for every metric of the request."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    for i, (returned, value) in enumerate(results):
        request.metrics[i].metricId = i + 1
        request.metrics[i].nvmlReturn = returned
        request.metrics[i].value = value
    flat = results_layout(request, len(results)).unpack_from(request)
    fields = [(request.metrics[i].nvmlReturn, request.metrics[i].value) for i in range(len(results))]
    bits = struct.Struct("=Id").pack  # NaN != NaN: compare the bits
    assert [bits(*pair) for pair in zip(flat[::2], flat[1::2], strict=True)] == [bits(*f) for f in fields]


def test_the_unpack_follows_the_struct_layout_of_the_installed_pynvml() -> None:
    """Offsets and sizes come from the ctypes types (nvml.h fixes only the order: nvmlReturn before value), so
    a layout with other padding still reads right."""

    class Metric(ctypes.Structure):
        _fields_ = [
            ("metricId", ctypes.c_uint),
            ("spare", ctypes.c_ulonglong),
            ("nvmlReturn", ctypes.c_uint),
            ("value", ctypes.c_double),
            ("tail", ctypes.c_char * 3),
        ]

    class Request(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint), ("metrics", Metric * 3)]

    request = Request()
    for i in range(3):
        request.metrics[i].spare, request.metrics[i].tail = 2**64 - 1, b"\xff" * 3
        request.metrics[i].nvmlReturn, request.metrics[i].value = 10 + i, 0.5 + i
    assert results_layout(request, 3).unpack_from(request) == (10, 0.5, 11, 1.5, 12, 2.5)
