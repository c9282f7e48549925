"""What the nvml and gpm backends read, where users meet it: /metrics and /api/v1/gpus of a node on the fake
pynvml (tests/fakes/fake_pynvml.py) whose counters, held at 0 by its defaults, are all set and distinct."""

from __future__ import annotations

import pynvml
import pytest

from fakes.fake_pynvml import FakeGpu, install
from test_mig_metrics import Exporter

UUID = "GPU-00000000-1111-2222-3333-444444444444"
PIPES = {  # GPM metric -> percent; the JSON key of its ratio
    pynvml.NVML_GPM_METRIC_SM_UTIL: (50.0, "sm_active"),
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: (25.0, "hmma_active"),
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: (3.125, "imma_active"),
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: (18.75, "dfma_active"),
    pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: (9.375, "dmma_active"),
    pynvml.NVML_GPM_METRIC_FP64_UTIL: (12.5, "fp64_active"),
    pynvml.NVML_GPM_METRIC_FP32_UTIL: (37.5, "fp32_active"),
    pynvml.NVML_GPM_METRIC_FP16_UTIL: (6.25, "fp16_active"),
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: (43.75, "integer_active"),
}
# The pipe label of each pipe's integral at /metrics.
PIPE_LABELS = {
    "hmma_active": "hmma",
    "imma_active": "imma",
    "dfma_active": "dfma",
    "dmma_active": "dmma",
    "fp64_active": "fp64",
    "fp32_active": "fp32",
    "fp16_active": "fp16",
    "integer_active": "integer",
}


def test_error_counters_energy_clock_events_and_pipes_reach_metrics_and_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = install(
        monkeypatch,
        FakeGpu(
            UUID,
            ecc_corrected=3,
            ecc_uncorrected=2,
            energy_mj=1_234_567,
            clock_event_reasons=pynvml.nvmlClocksEventReasonHwThermalSlowdown,
            gpm_rates={metric: rate for metric, (rate, _) in PIPES.items()},
        ),
    )
    exporter = Exporter(node)
    exporter.tick()
    series = exporter.tick(2.0)

    def at(name: str, **extra: str) -> float:
        return series[(name, frozenset({"gpu": "0", "uuid": UUID, "hostname": "node-a", **extra}.items()))]

    assert at("gpu_ecc_errors_total", type="corrected") == 3
    assert at("gpu_ecc_errors_total", type="uncorrected") == 2
    assert at("gpu_energy_joules_total") == pytest.approx(1234.567)
    assert at("gpu_clock_event_active", reason="hw_thermal_slowdown") == 1
    assert at("gpu_clock_event_active", reason="hw_slowdown") == 0
    assert all(("reason", "sw_power_cap") not in labels for _, labels in series)  # in clock_events only
    # The second tick covered 2 s. DMMA's integral is in the pipes group only, not in the default set.
    exported = {
        labels: value for (name, labels), value in series.items() if name == "gpu_pipe_active_seconds_total"
    }
    assert {dict(labels)["pipe"]: value for labels, value in exported.items()} == {
        PIPE_LABELS[key]: pytest.approx(rate / 100 * 2.0)
        for rate, key in PIPES.values()
        if key in PIPE_LABELS and key != "dmma_active"
    }
    # Integer (43.75 %) is the busiest of any tensor (0 %), FP64, FP32, FP16 and integer.
    assert at("gpu_compute_sol_seconds_total") == pytest.approx(0.875)
    (gpu,) = exporter.client.get("/api/v1/gpus").json()["gpus"]
    assert {key: gpu["values"][key] for _, key in PIPES.values()} == {
        key: pytest.approx(rate / 100) for rate, key in PIPES.values()
    }
    assert gpu["values"]["compute_sol"] == pytest.approx(0.4375)
