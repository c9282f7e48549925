"""The DCGM backend over the stub libdcgm and fake hostengines (tests/fakes/dcgm_hostengine.py), driven
through the double of DCGM's Python bindings (tests/fakes/fake_dcgm) and, where $SMLENS_DCGM_BINDINGS
names copies of them, through NVIDIA's own bindings: every test here runs once per binding set."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from conftest import (
    DCGM_BINDING_MODULES,
    DCGM_DOUBLE_DIR,
    nvidia_dcgm_binding_dirs,
    skip_without_nvidia_dcgm_bindings,
)
from fakes.device_source import NvmlLikeNode
from smlens import names as n
from smlens.errors import BackendError, BackendUnavailable, ConfigError, GpuLostError
from smlens.model import Activity, GpuIdentity
from smlens.pipeline.sampler import Sampler
from smlens.sources.dcgm import session as dcgm_session
from smlens.sources.dcgm import watches as dcgm_watches
from smlens.sources.dcgm.address import HostengineAddress, parse_hostengine
from smlens.sources.dcgm.backend import DcgmBackend, open_dcgm_backend
from smlens.sources.dcgm.bindings import BINDING_DIRS, load_bindings
from smlens.sources.dcgm.fields import (
    BYTE_RATE_FIELDS,
    RATIO_FIELDS,
    WANTED_FIELDS,
    MetricGroup,
    passes_needed,
    plan_fields,
)
from smlens.sources.nvml import gpm
from smlens.web.admin import add_profiling_admin

FAKE_DIR = DCGM_DOUBLE_DIR
INTERVAL = 1.0
UUIDS = ("GPU-0a0a0a0a-0000-0000-0000-000000000000", "GPU-1b1b1b1b-1111-1111-1111-111111111111")
# One DCGM sample of every wanted field: ratios 0..1, byte rates in bytes/s.
SAMPLE: dict[int, float | int] = {
    1002: 0.25,
    1003: 0.125,
    1004: 0.5,
    1005: 0.375,
    1006: 0.1875,
    1007: 0.0625,
    1008: 0.03125,
    1013: 0.15625,
    1014: 0.4375,
    1015: 0.21875,
    1016: 0.34375,
    1009: 2_000_000,
    1010: 1_000_000,
    1011: 40_000_000,
    1012: 30_000_000,
}


@pytest.fixture
def fake(fake_dcgm: ModuleType) -> ModuleType:
    """``fakes.dcgm_hostengine`` with a fresh registry, under one set of bindings (see conftest)."""
    return fake_dcgm


def gpus(count: int = 2) -> list[GpuIdentity]:
    return [GpuIdentity(index=i, uuid=UUIDS[i], name="NVIDIA A100-SXM4-80GB") for i in range(count)]


def start_engine(fake: ModuleType, *fake_gpus: Any, address: str = "localhost:5555") -> Any:
    engine = fake.FakeHostengine(list(fake_gpus) or [fake.FakeGpu(UUIDS[0]), fake.FakeGpu(UUIDS[1])])
    fake.REGISTRY.listen(engine, address)
    return engine


def attached(fake: ModuleType, engine: Any, count: int = 2) -> DcgmBackend:
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    verdicts = backend.attach(gpus(count))
    assert verdicts == {uuid: None for uuid in UUIDS[:count]}
    return backend


def publish_all(engine: Any, sample: dict[int, float | int] = SAMPLE) -> None:
    for index in range(len(engine.gpus)):
        engine.publish(index, sample)


def warm(backend: DcgmBackend, engine: Any, now: float, count: int = 2) -> None:
    """The first read of a session only starts the interval."""
    publish_all(engine)
    for gpu in gpus(count):
        first = backend.read(gpu, now)
        assert first.activity == {}
        assert set(first.missing.values()) <= {"warming_up", "metric_group_conflict", "not_supported"}


# -- locating the bindings --------------------------------------------------------------------------


def test_missing_bindings_are_one_sentence_naming_both_dcgm_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).resolve() != FAKE_DIR])
    for name in DCGM_BINDING_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(BackendUnavailable) as caught:
        open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    message = str(caught.value)
    assert caught.value.reason == "bindings_missing"
    assert all(directory in message for directory in BINDING_DIRS)
    assert "--backend nvml" in message
    assert message.endswith(".") and ". " not in message and "\n" not in message  # one sentence


def test_bindings_found_in_a_dcgm_install_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).resolve() != FAKE_DIR])
    for name in DCGM_BINDING_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    bindings = load_bindings(search_dirs=("/nonexistent/dcgm", str(FAKE_DIR)))
    assert Path(bindings.agent.__file__ or "").parent == FAKE_DIR
    assert str(FAKE_DIR) in sys.path


def test_library_missing_is_reported_apart_from_bindings(
    fake: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake.REGISTRY.library_present = False
    monkeypatch.setattr(sys.modules["dcgm_structs"], "dcgmLib", None)  # not loaded yet
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))  # NVIDIA's loader looks here, finds nothing
    with pytest.raises(BackendUnavailable, match="DCGM library could not be loaded") as caught:
        open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    assert caught.value.reason == "library_missing"


# -- connecting -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, HostengineAddress("localhost:5555")),
        ("10.0.0.7", HostengineAddress("10.0.0.7:5555")),
        ("node-1:5566", HostengineAddress("node-1:5566")),
        ("[::1]:5555", HostengineAddress("[::1]:5555")),
        ("unix:///run/nvidia-dcgm/dcgm.sock", HostengineAddress("/run/nvidia-dcgm/dcgm.sock", True)),
        ("/tmp/dcgm.sock", HostengineAddress("/tmp/dcgm.sock", True)),
    ],
)
def test_hostengine_addresses(text: str | None, expected: HostengineAddress) -> None:
    assert parse_hostengine(text) == expected


@pytest.mark.parametrize("text", ["", "host:", ":5555", "host:0", "host:70000", "host:http", "unix://rel"])
def test_bad_hostengine_address_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_hostengine(text)
    assert "\n" not in str(caught.value)


def test_connection_refused(fake: ModuleType) -> None:
    with pytest.raises(BackendUnavailable) as caught:
        open_dcgm_backend("127.0.0.1:5599", embedded=False, interval=INTERVAL)
    assert caught.value.reason == "hostengine_unreachable"
    assert "nv-hostengine at 127.0.0.1:5599" in str(caught.value)
    assert "not valid" in str(caught.value)  # DCGM's own words for a refused connection


def test_unix_socket(fake: ModuleType) -> None:
    start_engine(fake, address="unix:/run/dcgm.sock")
    backend = open_dcgm_backend("unix:///run/dcgm.sock", embedded=False, interval=INTERVAL)
    assert backend.attach(gpus()) == {uuid: None for uuid in UUIDS}


def test_embedded_engine_only_when_asked(fake: ModuleType) -> None:
    fake.REGISTRY.embedded = fake.FakeHostengine([fake.FakeGpu(UUIDS[0])])
    with pytest.raises(BackendUnavailable):  # no hostengine listens: smlens must not start one itself
        open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    assert "dcgmStartEmbedded" not in fake.REGISTRY.calls
    backend = open_dcgm_backend(None, embedded=True, interval=INTERVAL)
    assert backend.attach(gpus(1)) == {UUIDS[0]: None}
    assert fake.REGISTRY.embedded.watched(0)
    # --dcgm-hostengine with --dcgm-embedded is refused by the settings (tests/test_settings.py).


def test_watches_at_the_sampling_interval_and_leaves_no_trace(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = open_dcgm_backend(None, embedded=False, interval=2.5)
    backend.attach(gpus())
    frequencies = {freq for owners in engine.watches.values() for freq in owners.values()}
    assert frequencies == {2_500_000}
    assert fake.REGISTRY.calls.count("dcgmGroupCreate") == 1  # identical GPUs share one group
    backend.close()
    assert engine.watched(0) == engine.watched(1) == set()
    assert engine.groups == {} and engine.field_groups == {}
    assert fake.REGISTRY.connections == {}


# -- profiling metric groups ------------------------------------------------------------------------


def test_plan_prefers_sm_active_then_occupancy_then_coverage() -> None:
    groups = [
        MetricGroup(0, 0, frozenset({1001, 1004, 1006, 1007, 1008, 1014})),  # more fields, no SM active
        MetricGroup(0, 1, frozenset({1001, 1002})),
        MetricGroup(0, 2, frozenset({1002, 1003})),
        MetricGroup(1, 0, frozenset({1005})),
    ]
    plan = plan_fields(groups)
    assert plan.watched == (1002, 1003, 1005)
    assert plan.unavailable[n.TENSOR_ACTIVE] == "metric_group_conflict"
    assert plan.unavailable[n.PCIE_TX_BYTES] == "not_supported"
    assert n.SM_ACTIVE not in plan.unavailable


def test_plan_without_groups_watches_nothing() -> None:
    plan = plan_fields([])
    assert plan.watched == ()
    assert set(plan.unavailable.values()) == {"not_supported"}


def test_one_pass_gpu_gives_the_gpm_metric_set(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    warm(backend, engine, now=100.0)
    publish_all(engine)
    reading = backend.read(gpus()[0], now=101.5)
    assert reading.source == "dcgm" and reading.profiling
    # DCGM has no ratio field for GPM's DMMA_TENSOR_UTIL.
    assert set(reading.activity) == {key for key, _ in gpm.RATIO_METRICS} - {n.DMMA_ACTIVE}
    assert set(reading.increments) == {key for key, _ in gpm.TRAFFIC_METRICS}
    assert reading.missing == {}
    for field_id, key in RATIO_FIELDS.items():
        assert reading.activity[key] == Activity(SAMPLE[field_id] * 1.5, 1.5)
    for field_id, key in BYTE_RATE_FIELDS.items():
        assert reading.increments[key] == pytest.approx(SAMPLE[field_id] * 1.5)
    # By name as well, not only through the map under test: each pipe comes from its own field.
    pipes = {
        n.FP64_ACTIVE: 0.28125,  # 1006
        n.FP32_ACTIVE: 0.09375,  # 1007
        n.FP16_ACTIVE: 0.046875,  # 1008
        n.IMMA_ACTIVE: 0.234375,  # 1013
        n.HMMA_ACTIVE: 0.65625,  # 1014
        n.DFMA_ACTIVE: 0.328125,  # 1015
        n.INTEGER_ACTIVE: 0.515625,  # 1016
    }
    assert {key: reading.activity[key].active_seconds for key in pipes} == pipes


def test_multi_pass_gpu_watches_one_pass_and_names_the_rest(fake: ModuleType) -> None:
    engine = start_engine(fake, fake.FakeGpu(UUIDS[0], fake.MULTI_PASS), fake.FakeGpu(UUIDS[1]))
    backend = attached(fake, engine)  # the double fails any watch that would need two passes
    assert engine.watched(0) == {1002, 1003, 1005, 1009, 1010, 1011, 1012}
    assert fake.REGISTRY.calls.count("dcgmGroupCreate") == 2
    warm(backend, engine, now=10.0)
    publish_all(engine)
    reading = backend.read(gpus()[0], now=11.0)
    assert set(reading.activity) == {n.SM_ACTIVE, n.SM_OCCUPANCY, n.DRAM_ACTIVE}
    pipes = (n.TENSOR_ACTIVE, n.HMMA_ACTIVE, n.IMMA_ACTIVE, n.FP64_ACTIVE, n.FP32_ACTIVE, n.FP16_ACTIVE)
    for key in (*pipes, n.INTEGER_ACTIVE):
        assert reading.missing[key] == "metric_group_conflict"
    assert reading.missing[n.DFMA_ACTIVE] == "not_supported"  # in none of this GPU's metric groups


def test_hmma_missing_where_dcgm_lacks_it(fake: ModuleType) -> None:
    engine = start_engine(fake, fake.FakeGpu(UUIDS[0], fake.NO_HMMA))
    backend = attached(fake, engine, count=1)
    warm(backend, engine, now=10.0, count=1)
    publish_all(engine)
    reading = backend.read(gpus(1)[0], now=11.0)
    assert reading.missing == {n.HMMA_ACTIVE: "not_supported"}
    assert n.HMMA_ACTIVE not in reading.activity


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (-36, "DCGM profiling is not supported on this GPU"),  # DCGM_ST_PROFILING_NOT_SUPPORTED
        (-6, "DCGM profiling is not supported on this GPU"),  # DCGM_ST_NOT_SUPPORTED
        (-33, "the DCGM profiling module is not loaded in the hostengine"),  # DCGM_ST_MODULE_NOT_LOADED
        (-29, "DCGM profiling needs the hostengine to run as root"),  # DCGM_ST_REQUIRES_ROOT
    ],
)
def test_gpu_without_profiling_is_not_served_and_says_why(fake: ModuleType, code: int, reason: str) -> None:
    start_engine(fake, fake.FakeGpu(UUIDS[0], profiling_error=code), fake.FakeGpu(UUIDS[1]))
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    assert backend.attach(gpus()) == {UUIDS[0]: reason, UUIDS[1]: None}


def test_gpu_dcgm_does_not_see(fake: ModuleType) -> None:
    start_engine(fake, fake.FakeGpu(UUIDS[1]))
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    assert backend.attach(gpus()) == {UUIDS[0]: "DCGM does not see this GPU", UUIDS[1]: None}


def test_gpu_with_only_traffic_fields_is_not_served(fake: ModuleType) -> None:
    start_engine(fake, fake.FakeGpu(UUIDS[0], ((0, 0, (1009, 1010)),)))
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    assert backend.attach(gpus(1)) == {UUIDS[0]: "DCGM offers no SM-level profiling field on this GPU"}


# -- values -----------------------------------------------------------------------------------------


def test_blank_values_are_missing_never_zero(fake: ModuleType) -> None:
    import dcgmvalue

    engine = start_engine(fake)
    backend = attached(fake, engine)
    warm(backend, engine, now=10.0)
    blanks = {
        **SAMPLE,
        1002: dcgmvalue.DCGM_FP64_BLANK,
        1003: dcgmvalue.DCGM_FP64_NOT_SUPPORTED,
        1004: dcgmvalue.DCGM_FP64_NOT_PERMISSIONED,
        1009: dcgmvalue.DCGM_INT64_BLANK,
        1010: dcgmvalue.DCGM_INT64_NOT_SUPPORTED,
    }
    engine.publish(0, blanks)
    reading = backend.read(gpus()[0], now=11.0)
    assert reading.missing == {
        n.SM_ACTIVE: "blank",
        n.SM_OCCUPANCY: "not_supported",
        n.TENSOR_ACTIVE: "no_permission",
        n.PCIE_TX_BYTES: "blank",
        n.PCIE_RX_BYTES: "not_supported",
    }
    assert not set(reading.missing) & (set(reading.activity) | set(reading.increments))
    assert reading.activity[n.DRAM_ACTIVE] == Activity(0.375, 1.0)


def test_no_sample_yet_is_missing(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    backend.read(gpus()[0], now=10.0)
    reading = backend.read(gpus()[0], now=11.0)  # DCGM has not sampled yet: status NO_DATA
    assert reading.activity == {} and reading.increments == {}
    assert set(reading.missing.values()) == {"no_data"}
    assert not reading.profiling


def test_a_sample_dcgm_stopped_refreshing_goes_stale(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    warm(backend, engine, now=10.0)
    assert n.SM_ACTIVE in backend.read(gpus()[0], now=11.0).activity  # same sample, still fresh
    assert n.SM_ACTIVE in backend.read(gpus()[0], now=13.0).activity
    stale = backend.read(gpus()[0], now=14.5)  # > 3 intervals since the sample last changed
    assert stale.missing[n.SM_ACTIVE] == "stale" and stale.activity == {}
    publish_all(engine)
    assert n.SM_ACTIVE in backend.read(gpus()[0], now=15.0).activity


def test_gpu_lost(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    engine.gpus[1].lost = True
    with pytest.raises(GpuLostError):
        backend.read(gpus()[1], now=10.0)


# -- hostengine restart -----------------------------------------------------------------------------


def test_hostengine_restart_mid_run(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    warm(backend, engine, now=10.0)
    publish_all(engine)
    assert backend.read(gpus()[0], now=11.0).activity
    engine.restart()
    assert engine.watched(0) == set()
    with pytest.raises(BackendError) as caught:
        backend.read(gpus()[0], now=12.0)
    assert caught.value.reason == "hostengine_unreachable"
    with pytest.raises(BackendError):  # the same tick's other GPU does not retry at once
        backend.read(gpus()[1], now=12.0)
    assert fake.REGISTRY.calls.count("dcgmConnect_v2") == 1
    reconnected = backend.read(gpus()[0], now=13.0)  # watches again; DCGM has no sample yet
    assert engine.watched(0) == set(WANTED_FIELDS)
    assert reconnected.activity == {} and set(reconnected.missing.values()) == {"no_data"}
    publish_all(engine)
    reading = backend.read(gpus()[0], now=14.0)
    assert reading.activity[n.SM_ACTIVE] == Activity(0.25, 1.0)  # not stretched over the outage


def test_reconnect_backs_off_while_the_hostengine_is_down(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    engine.stop()
    attempts = []
    now = 100.0
    while now < 200.0:
        connects = fake.REGISTRY.calls.count("dcgmConnect_v2")
        with pytest.raises(BackendError) as caught:
            backend.read(gpus()[0], now)
        assert caught.value.reason == "hostengine_unreachable"
        if fake.REGISTRY.calls.count("dcgmConnect_v2") > connects:
            attempts.append(now)
        now += 0.5
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert max(gaps) == dcgm_session.RECONNECT_MAX_DELAY
    engine.start()
    while True:  # back within one backoff step
        try:
            backend.read(gpus()[0], now)
            break
        except BackendError:
            now += 0.5
    assert now - 200.0 <= dcgm_session.RECONNECT_MAX_DELAY
    assert engine.watched(0) == set(WANTED_FIELDS)


def test_sampler_shows_dcgm_down_during_a_restart_and_recovers(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    now = [0.0]
    sampler = Sampler(NvmlLikeNode(gpus(), INTERVAL), [backend], "node-a", INTERVAL, clock=lambda: now[0])
    sampler.open()

    def tick() -> Any:
        publish_all(engine)
        now[0] += INTERVAL
        snapshot = sampler.tick()
        dcgm_stats = next(b for b in snapshot.backends if b.name == "dcgm")
        return snapshot.gpus[0], dcgm_stats

    tick()
    gpu, stats = tick()
    assert stats.up and gpu.profiling_source == "dcgm" and gpu.profiling_available
    assert gpu.gauges[n.SM_ACTIVE] == pytest.approx(0.25)
    engine.restart()
    gpu, stats = tick()
    assert not stats.up and stats.errors_total == {"hostengine_unreachable": 2}
    assert n.SM_ACTIVE not in gpu.gauges and not gpu.profiling_available
    assert gpu.gauges[n.UTILIZATION] == 1.0  # the other backend carries on
    for _ in range(3):
        gpu, stats = tick()
    assert stats.up and gpu.profiling_available
    assert gpu.gauges[n.SM_ACTIVE] == pytest.approx(0.25)


# -- profiling pause --------------------------------------------------------------------------------


def test_pause_and_resume(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    warm(backend, engine, now=10.0)
    backend.pause_profiling()
    assert engine.paused and backend.paused
    publish_all(engine)  # DCGM stores blanks while paused
    paused = backend.read(gpus()[0], now=11.0)
    assert paused.activity == {} and paused.increments == {}
    assert paused.missing == {key: "profiling_paused" for key in WANTED_FIELDS.values()}
    assert not paused.profiling
    backend.resume_profiling()
    assert not engine.paused and not backend.paused
    publish_all(engine)
    resumed = backend.read(gpus()[0], now=12.0)
    assert resumed.activity[n.SM_ACTIVE] == Activity(0.25, 1.0) and resumed.profiling


def test_pause_survives_a_hostengine_restart(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    backend.pause_profiling()
    engine.restart()
    assert not engine.paused
    with pytest.raises(BackendError):
        backend.read(gpus()[0], now=10.0)
    backend.read(gpus()[0], now=11.0)
    assert engine.paused


def test_pause_refused_on_a_gpm_node(fake: ModuleType) -> None:
    start_engine(fake, fake.FakeGpu(UUIDS[0], gpm=True))
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    with pytest.raises(BackendError) as caught:
        backend.pause_profiling()
    assert caught.value.reason == "not_supported" and not backend.paused


def test_pause_without_a_hostengine(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    engine.stop()
    with pytest.raises(BackendError) as caught:
        backend.pause_profiling()
    assert caught.value.reason == "hostengine_unreachable" and not backend.paused


def test_pause_through_the_admin_endpoint(fake: ModuleType) -> None:
    engine = start_engine(fake)
    backend = attached(fake, engine)
    app = FastAPI()
    add_profiling_admin(app, backend, "token-for-the-dcgm-test")
    http = TestClient(app)
    auth = {"Authorization": "Bearer token-for-the-dcgm-test"}
    assert http.post("/admin/profiling/pause", headers=auth).json() == {"paused": True}
    assert engine.paused
    assert http.post("/admin/profiling/resume", headers=auth).json() == {"paused": False}
    assert not engine.paused
    engine.gpus[0].gpm = True
    refused = http.post("/admin/profiling/pause", headers=auth)
    assert refused.status_code == 409 and refused.json()["reason"] == "not_supported"


# -- conformance of the bindings ------------------------------------------------------------------


def test_nvidia_bindings_are_available_for_the_conformance_runs() -> None:
    """Every test above also runs through NVIDIA's bindings named in $SMLENS_DCGM_BINDINGS."""
    skip_without_nvidia_dcgm_bindings("the DCGM tests ran only through the double")
    for directory in nvidia_dcgm_binding_dirs():
        assert (Path(directory) / "dcgm_agent.py").is_file(), directory


def test_char_arrays_come_back_as_str(fake: ModuleType) -> None:
    bindings = load_bindings()
    dcgm_agent, dcgm_structs = bindings.agent, bindings.structs

    start_engine(fake)
    params = dcgm_structs.c_dcgmConnectV2Params_v2()
    handle = dcgm_agent.dcgmConnect_v2("localhost:5555", params)
    uuid = dcgm_agent.dcgmGetDeviceAttributes(handle, 0).identifiers.uuid
    assert isinstance(uuid, str) and uuid == UUIDS[0]
    dcgm_agent.dcgmDisconnect(handle)


def test_errors_are_per_code_subclasses(fake: ModuleType) -> None:
    bindings = load_bindings()
    dcgm_agent, dcgm_structs = bindings.agent, bindings.structs

    with pytest.raises(dcgm_structs.dcgmExceptionClass(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)) as caught:
        dcgm_agent.dcgmConnect_v2("localhost:5599", dcgm_structs.c_dcgmConnectV2Params_v2())
    assert type(caught.value).__name__ == "DCGMError_ConnectionNotValid"
    assert caught.value.value == dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID
    assert isinstance(dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_TIMEOUT), dcgm_structs.DCGMError_Timeout)


# -- lifecycle --------------------------------------------------------------------------------------


def other_client(fake: ModuleType, field_ids: Sequence[int], name: str, gpu_ids: Sequence[int] = (0,)) -> Any:
    """Another DCGM client of the same hostengine (dcgm-exporter, say) watching ``field_ids``."""
    bindings = load_bindings()
    dcgm_agent, dcgm_structs = bindings.agent, bindings.structs

    params = dcgm_structs.c_dcgmConnectV2Params_v2()
    handle = dcgm_agent.dcgmConnect_v2("localhost:5555", params)
    group = dcgm_agent.dcgmGroupCreate(handle, dcgm_structs.DCGM_GROUP_EMPTY, name)
    for gpu_id in gpu_ids:
        dcgm_agent.dcgmGroupAddDevice(handle, group, gpu_id)
    field_group = dcgm_agent.dcgmFieldGroupCreate(handle, list(field_ids), name)
    dcgm_agent.dcgmWatchFields(handle, group, field_group, 1_000_000, 3600.0, 0)
    return handle


def test_connects_so_that_the_hostengine_drops_our_groups(fake: ModuleType) -> None:
    engine = start_engine(fake)
    attached(fake, engine)
    (connection,) = fake.REGISTRY.connections.values()
    assert not connection.persist  # persistAfterDisconnect=0 in dcgmConnectV2Params_v2


def test_timeout_reconnects_like_a_lost_connection(fake: ModuleType) -> None:
    import dcgm_structs

    engine = start_engine(fake)
    backend = attached(fake, engine)
    warm(backend, engine, now=10.0)
    engine.fail("dcgmEntityGetLatestValues", dcgm_structs.DCGM_ST_TIMEOUT)  # a hung hostengine
    with pytest.raises(BackendError) as caught:
        backend.read(gpus()[0], now=11.0)
    assert caught.value.reason == "hostengine_unreachable"
    assert fake.REGISTRY.calls.count("dcgmDisconnect") == 1  # the hung session is given up
    with pytest.raises(BackendError):
        backend.read(gpus()[0], now=11.5)  # backoff: not before 1 s
    assert fake.REGISTRY.calls.count("dcgmConnect_v2") == 1
    backend.read(gpus()[0], now=12.0)
    assert fake.REGISTRY.calls.count("dcgmConnect_v2") == 2
    assert len(fake.REGISTRY.connections) == 1 and engine.watched(0) == set(WANTED_FIELDS)


def test_names_are_unique_per_instance_and_carry_the_node(fake: ModuleType) -> None:
    engine = start_engine(fake)
    first = open_dcgm_backend(None, embedded=False, interval=INTERVAL, node="node-a.example")
    second = open_dcgm_backend(None, embedded=False, interval=INTERVAL, node="node-a.example")
    assert first.attach(gpus()) == second.attach(gpus()) == {uuid: None for uuid in UUIDS}
    names = [g.name for g in engine.field_groups.values()]
    assert len(names) == len(set(names)) == 2
    assert all(name.startswith("smlens-node-a.example-") for name in names)
    assert first.instance != second.instance
    first.close()
    assert [g.name for g in engine.field_groups.values()] == [
        n for n in names if n.startswith(second.instance)
    ]
    assert engine.watched(0) == set(WANTED_FIELDS)  # shared watches: the second one still holds them


def test_never_touches_groups_it_did_not_make(fake: ModuleType) -> None:
    engine = start_engine(fake)
    other_client(fake, [1002, 1003], "dcgm-exporter-fields")
    others = dict(engine.field_groups), dict(engine.groups)
    backend = attached(fake, engine)
    backend.close()
    assert (engine.field_groups, engine.groups) == others
    assert engine.watched(0) == {1002, 1003}


def test_a_refused_watch_is_cleaned_up_and_retried(fake: ModuleType) -> None:
    import dcgm_structs

    engine = start_engine(fake)
    engine.fail("dcgmWatchFields", dcgm_structs.DCGM_ST_MAX_LIMIT)
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    assert backend.attach(gpus()) == {uuid: None for uuid in UUIDS}  # served: retried on reads
    assert engine.groups == {} and engine.field_groups == {}  # the partial set-up is gone
    reading = backend.read(gpus()[0], now=10.0)
    assert reading.activity == {} and set(reading.missing.values()) == {"watch_failed"}
    assert not reading.profiling
    backend.read(gpus()[0], now=10.0 + dcgm_watches.WATCH_RETRY_SECONDS - 1)
    assert engine.watched(0) == set()
    backend.read(gpus()[0], now=10.0 + dcgm_watches.WATCH_RETRY_SECONDS)
    assert engine.watched(0) == set(WANTED_FIELDS)
    assert len(engine.groups) == len(engine.field_groups) == 1


def test_a_failed_field_group_leaves_no_group_behind(fake: ModuleType) -> None:
    import dcgm_structs

    engine = start_engine(fake)
    engine.fail("dcgmFieldGroupCreate", dcgm_structs.DCGM_ST_DUPLICATE_KEY)
    backend = open_dcgm_backend(None, embedded=False, interval=INTERVAL)
    backend.attach(gpus())
    assert engine.groups == {} and fake.REGISTRY.calls.count("dcgmGroupDestroy") == 1


# -- sharing the hostengine -------------------------------------------------------------------------


def test_the_double_multiplexes_up_to_five_passes_across_clients(fake: ModuleType) -> None:
    import dcgm_structs

    engine = start_engine(fake, fake.FakeGpu(UUIDS[0], fake.MULTI_PASS))
    other_client(fake, [1002, 1003], "a")
    for i, field_id in enumerate((1004, 1006, 1007, 1008), start=2):
        other_client(fake, [field_id], f"b{i}")
        assert engine.passes(0) == i
    with pytest.raises(dcgm_structs.dcgmExceptionClass(dcgm_structs.DCGM_ST_PROFILING_MULTI_PASS)):
        other_client(fake, [1013], "c")


def test_another_clients_fields_that_force_multiplexing_are_noticed(
    fake: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    engine = start_engine(fake, fake.FakeGpu(UUIDS[0], fake.MULTI_PASS))
    backend = attached(fake, engine, count=1)
    warm(backend, engine, now=10.0, count=1)
    publish_all(engine)
    assert backend.read(gpus(1)[0], now=11.0).profiling_mode == "one_pass"
    other_client(fake, [1002, 1004], "dcgm-exporter")  # tensor active: another pass on this GPU
    assert engine.passes(0) == 2
    publish_all(engine)
    assert backend.read(gpus(1)[0], now=12.0).profiling_mode == "one_pass"  # not checked again yet
    publish_all(engine)
    reading = backend.read(gpus(1)[0], now=11.0 + dcgm_watches.SHARING_CHECK_SECONDS)
    assert reading.profiling_mode == "multiplexed" and reading.activity
    assert "need 2 passes" in caplog.text and "multiplexes" in caplog.text


def test_plan_passes() -> None:
    groups = [
        MetricGroup(0, 0, frozenset({1001, 1002, 1003})),
        MetricGroup(0, 1, frozenset({1001, 1004})),
        MetricGroup(1, 0, frozenset({1005})),
    ]
    assert passes_needed(groups, frozenset({1002, 1003, 1005})) == 1
    assert passes_needed(groups, frozenset({1001})) == 1
    assert passes_needed(groups, frozenset({1002, 1004})) == 2
    assert passes_needed(groups, frozenset({155})) == 0  # not a profiling field here


def test_only_our_own_field_groups_are_left_out_of_the_sharing_count(fake: ModuleType) -> None:
    # GPU 0 can watch one pass only; GPU 1 watches every field, tensor (1004) included, in our own group.
    engine = start_engine(fake, fake.FakeGpu(UUIDS[0], fake.MULTI_PASS), fake.FakeGpu(UUIDS[1]))
    backend = attached(fake, engine)
    assert 1004 in engine.watched(1) and 1004 not in engine.watched(0)
    warm(backend, engine, now=10.0)
    publish_all(engine)
    assert backend.read(gpus()[0], now=11.0).profiling_mode == "one_pass"  # GPU 1's fields are ours
    # Another client whose name merely extends ours ("...-<hex>0-...") is another client.
    other_client(fake, [1002, 1004], f"{backend.instance}0-fields", gpu_ids=(1,))
    publish_all(engine)
    reading = backend.read(gpus()[0], now=11.0 + dcgm_watches.SHARING_CHECK_SECONDS)
    assert reading.profiling_mode == "multiplexed"
