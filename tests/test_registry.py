"""The backend registry: --backend choices, capabilities, the facts the settings and attribution read, and
admin endpoints on any pausable backend."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

import smlens
from conftest import run_cli
from smlens import cli
from smlens.errors import ConfigError
from smlens.model import GpuIdentity, Reading
from smlens.pipeline.sampler import Sampler
from smlens.settings import COMMANDS, options, resolve
from smlens.sources.base import Backend, ProfilingControl
from smlens.sources.registry import KINDS, SIM_GPUS, Opened, accepting
from smlens.sources.sim import Scenario, SimBackend


def test_backend_choices_come_from_the_registry() -> None:
    (backend,) = (o for o in options("serve") if o.name == "backend")
    assert backend.choices == tuple(KINDS) == ("auto", "nvml", "dcgm", "sim")
    assert {k.name for k in KINDS.values() if k.pausable} == {"auto", "dcgm"}
    assert {k.name for k in KINDS.values() if not k.profiling} == {"nvml"}


def test_the_facts_that_settings_and_attribution_read() -> None:
    assert {k.name for k in KINDS.values() if k.simulated} == {"sim"}
    assert {k.name for k in KINDS.values() if k.reads_nvml} == {"auto", "nvml", "dcgm"}
    assert accepting("sim_gpus") == accepting("sim_pods") == ("sim",)
    assert accepting("dcgm_embedded") == ("auto", "dcgm")
    assert accepting("interval") is None  # every kind takes it


def test_every_option_a_kind_names_is_a_setting_unset_by_default() -> None:
    """Unset (None, or off for a switch): a default would count as given, and every other kind refuse it."""
    defaults = {
        f.name: f.metadata["option"]["default"]
        for settings in COMMANDS.values()
        for f in dataclasses.fields(settings)
    }
    for kind in KINDS.values():
        assert kind.options <= set(defaults), kind.name
        assert all(defaults[name] in (None, False) for name in kind.options), kind.name


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("backend", list(KINDS))
def test_every_kind_takes_the_defaults(command: str, backend: str) -> None:
    assert resolve(command, {"backend": backend}, environ={}).backend == backend


PACKAGE = Path(smlens.__file__).parent


def _imports(module: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
    return names


@pytest.mark.parametrize("lower", ["sources", "attribution"])
def test_the_lower_layers_import_no_higher_one(lower: str) -> None:
    """Not even for type checking: the registry reads the settings through its own Protocol."""
    higher = tuple(
        f"smlens.{name}" for name in ("settings", "pipeline", "web", "exposition", "bundle", "cli")
    )
    modules = sorted((PACKAGE / lower).rglob("*.py"))
    assert modules
    for module in modules:
        assert not [name for name in _imports(module) if name.startswith(higher)], module


def _names_a_backend(node: ast.AST) -> bool:
    """A comparison of ``<something>.backend`` with a string (or strings)."""
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    asks = any(isinstance(side, ast.Attribute) and side.attr == "backend" for side in sides)
    texts = [
        e
        for side in sides
        for e in (side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side])
        if isinstance(e, ast.Constant) and isinstance(e.value, str)
    ]
    return asks and bool(texts)


def test_no_module_asks_a_backend_its_name() -> None:
    """What a backend is comes from the registry's facts, so that a new one is a module and an entry."""
    asking = [
        f"{module.relative_to(PACKAGE)}:{node.lineno}"
        for module in sorted(PACKAGE.rglob("*.py"))
        if "_pb2" not in module.name
        for node in ast.walk(ast.parse(module.read_text()))
        if _names_a_backend(node)
    ]
    assert asking == []


def test_the_sim_kind_opens_a_simulated_node() -> None:
    opened = KINDS["sim"].open(resolve("check", {"backend": "sim", "sim_gpus": "3"}, environ={}))
    assert isinstance(opened.device, SimBackend) and len(opened.gpus) == 3 and opened.extras == []
    unsized = KINDS["sim"].open(resolve("check", {"backend": "sim"}, environ={}))
    assert len(unsized.gpus) == SIM_GPUS


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
