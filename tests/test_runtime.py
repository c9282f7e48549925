"""Backend selection for --backend auto|nvml|dcgm, through the fake pynvml and the DCGM test double."""

from __future__ import annotations

from types import ModuleType

import pytest

from fakes.fake_pynvml import FakeGpu, install
from smlens.errors import BackendUnavailable
from smlens.pipeline.build import build_sampler
from smlens.settings import resolve

HOPPER, AMPERE = "GPU-11111111-0000-0000-0000-000000000000", "GPU-22222222-0000-0000-0000-000000000000"


@pytest.fixture
def dcgm_engine(fake_dcgm: ModuleType) -> ModuleType:
    """DCGM bindings over the stub libdcgm (conftest's fake_dcgm)."""
    return fake_dcgm


def node(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeGpu(HOPPER), FakeGpu(AMPERE, name="NVIDIA A100-SXM4-80GB", gpm_supported=False))


def sources(backend: str, **flags: str) -> dict[str, str | None]:
    sampler = build_sampler(resolve("check", {"backend": backend, **flags}, environ={}))
    try:
        snapshot = sampler.tick()
        return {gpu.identity.uuid: gpu.profiling_source for gpu in snapshot.gpus}
    finally:
        sampler.close()


def test_auto_uses_gpm_where_supported_and_dcgm_for_the_rest(
    monkeypatch: pytest.MonkeyPatch, dcgm_engine: ModuleType
) -> None:
    node(monkeypatch)
    engine = dcgm_engine.FakeHostengine([dcgm_engine.FakeGpu(AMPERE)])
    dcgm_engine.REGISTRY.listen(engine, "localhost:5555")
    assert sources("auto") == {HOPPER: "gpm", AMPERE: "dcgm"}


def test_auto_without_dcgm_leaves_older_gpus_without_profiling(
    monkeypatch: pytest.MonkeyPatch, dcgm_engine: ModuleType
) -> None:
    node(monkeypatch)  # no hostengine listens
    assert sources("auto") == {HOPPER: "gpm", AMPERE: None}


def test_nvml_backend_never_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    node(monkeypatch)
    assert sources("nvml") == {HOPPER: None, AMPERE: None}


def test_explicit_dcgm_without_a_hostengine_is_one_sentence(
    monkeypatch: pytest.MonkeyPatch, dcgm_engine: ModuleType
) -> None:
    node(monkeypatch)
    with pytest.raises(BackendUnavailable, match=r"start it .*or pass --dcgm-hostengine"):
        sources("dcgm")


def test_attribution_shares_the_backends_nvml_session(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeGpu(HOPPER))
    settings = resolve("serve", {"backend": "nvml", "process_attribution": True}, environ={})
    sampler = build_sampler(settings)
    try:
        assert sampler._attribution is not None  # the process source: built, not started
        assert fake.init_calls == 1  # one session: a second one would initialise NVML again
    finally:
        sampler.close()
