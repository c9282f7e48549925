"""The backend registry: --backend choices, capabilities, and admin endpoints on any pausable backend."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pytest

import smlens.sources
from conftest import run_cli
from smlens import cli
from smlens.sources.base import Backend, ProfilingControl
from smlens.sources.registry import KINDS, Opened
from smlens.sources.sim import Scenario, SimBackend
from smlens.settings import options, resolve
from smlens.errors import ConfigError
from smlens.model import GpuIdentity, Reading
from smlens.pipeline.sampler import Sampler


def test_backend_choices_come_from_the_registry() -> None:
    (backend,) = (o for o in options("serve") if o.name == "backend")
    assert backend.choices == tuple(KINDS) == ("auto", "nvml", "dcgm", "sim")
    assert {k.name for k in KINDS.values() if k.pausable} == {"auto", "dcgm"}
    assert {k.name for k in KINDS.values() if not k.profiling} == {"nvml"}


def test_the_backends_import_no_higher_layer() -> None:
    """Not even for type checking: the registry reads the settings through its own Protocol."""
    higher = ("smlens.settings", "smlens.cli", "smlens.pipeline.build", "smlens.web.app", "smlens.pipeline.sampler")
    for module in Path(smlens.sources.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            assert not [name for name in names if name.startswith(higher)], module


def test_the_sim_kind_opens_a_simulated_node() -> None:
    opened = KINDS["sim"].open(resolve("check", {"backend": "sim", "sim_gpus": "3"}, environ={}))
    assert isinstance(opened.device, SimBackend) and len(opened.gpus) == 3 and opened.extras == []


class Pausable(Backend):
    """Not DCGM: any backend with the ProfilingControl methods can be driven by the admin endpoints."""

    name = "pausable"
    provides_profiling = True

    def __init__(self) -> None:
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def pause_profiling(self) -> None:
        self._paused = True

    def resume_profiling(self) -> None:
        self._paused = False

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        return {g.uuid: None for g in gpus}

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        return Reading(self.name, profiling=True)


def test_the_admin_endpoints_drive_whichever_backend_can_pause() -> None:
    pausable = Pausable()
    assert isinstance(pausable, ProfilingControl) and not isinstance(
        SimBackend(Scenario.steady(1)), ProfilingControl
    )
    sampler = Sampler(SimBackend(Scenario.steady(1)), [pausable], hostname="n", interval=1.0)
    assert cli._admin_control(sampler) is pausable
    with pytest.raises(ConfigError, match="DCGM is not in use here"):
        cli._admin_control(Sampler(SimBackend(Scenario.steady(1)), [], hostname="n", interval=1.0))


@pytest.mark.parametrize("backend", ["nvml", "sim"])
def test_an_admin_token_on_a_backend_that_cannot_pause_is_refused_before_nvml_opens(
    tmp_path: Path, backend: str
) -> None:
    token = tmp_path / "token"
    token.write_text("a-long-enough-secret-token\n")
    token.chmod(0o600)
    # No NVML on this machine: had smlens opened it first, the error would name NVML.
    result = run_cli("serve", "--backend", backend, "--admin-token-file", str(token), timeout=30)
    assert result.returncode == 1
    assert result.stderr == (
        "smlens: --admin-token-file enables DCGM profiling pause/resume, but DCGM is not in use here.\n"
    )


def test_opened_closes_the_device_source_when_an_extra_fails_to_close() -> None:
    class FailsToClose(Pausable):
        def close(self) -> None:
            raise RuntimeError("stuck")

    device = SimBackend(Scenario.steady(1))
    closed: list[str] = []
    device.close = lambda: closed.append("device")  # type: ignore[method-assign]
    Opened(device, device.discover(), [FailsToClose()]).close()
    assert closed == ["device"]
