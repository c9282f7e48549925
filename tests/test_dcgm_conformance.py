"""The DCGM double (tests/fakes/fake_dcgm) against NVIDIA's own Python bindings, member by member:
structure layouts, version constants, return codes and their DCGMError subclasses, blank sentinels,
field ids and the signatures of the calls smlens makes. NVIDIA's bindings come from the directories
in $SMLENS_DCGM_BINDINGS (scripts/fetch-dcgm-bindings.sh fetches them; they are never copied into
this repository). The behaviour through them is tested in test_dcgm_backend.py."""

from __future__ import annotations

import ctypes
import inspect
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from conftest import (
    DCGM_DOUBLE_DIR,
    import_dcgm_bindings,
    nvidia_dcgm_binding_dirs,
    skip_without_nvidia_dcgm_bindings,
)


@pytest.fixture(params=nvidia_dcgm_binding_dirs() or [""], ids=lambda d: Path(d).name or "absent")
def nvidia(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, ModuleType]:
    if not request.param:
        skip_without_nvidia_dcgm_bindings("the double cannot be compared with NVIDIA's bindings")
    double = import_dcgm_bindings(monkeypatch, DCGM_DOUBLE_DIR)
    global double_agent, double_fields, double_structs, double_value
    double_agent, double_fields = double["dcgm_agent"], double["dcgm_fields"]
    double_structs, double_value = double["dcgm_structs"], double["dcgmvalue"]
    return import_dcgm_bindings(monkeypatch, Path(request.param))


# The double's modules, imported by the fixture (they import each other by DCGM's module names).
double_agent: ModuleType
double_fields: ModuleType
double_structs: ModuleType
double_value: ModuleType


def public(module: ModuleType, prefix: str) -> dict[str, object]:
    return {k: v for k, v in vars(module).items() if k.startswith(prefix)}


def test_structure_layouts_and_versions(nvidia: dict[str, ModuleType]) -> None:
    theirs = nvidia["dcgm_structs"]
    structures = {
        k: v
        for k, v in vars(double_structs).items()
        if isinstance(v, type) and issubclass(v, ctypes.Structure)
    }
    structures = {k: v for k, v in structures.items() if k.startswith("c_dcgm")}
    assert len(structures) >= 12
    for name, ours in structures.items():
        real = getattr(theirs, name)
        assert ctypes.sizeof(ours) == ctypes.sizeof(real), name
        assert [f[0] for f in ours._fields_] == [f[0] for f in real._fields_], name
        for member, *_ in ours._fields_:
            mine, their = getattr(ours, member), getattr(real, member)
            assert (mine.offset, mine.size) == (their.offset, their.size), f"{name}.{member}"
    versions = {k: v for k, v in vars(double_structs).items() if "_version" in k and isinstance(v, int)}
    assert versions
    for name, value in versions.items():
        assert getattr(theirs, name) == value, name


def test_char_arrays_read_back_as_str_in_both(nvidia: dict[str, ModuleType]) -> None:
    for structs in (nvidia["dcgm_structs"], double_structs):
        identifiers = structs.c_dcgmDeviceIdentifiers_v1()
        identifiers.uuid = "GPU-1234"
        assert identifiers.uuid == "GPU-1234"
        value = structs.c_dcgmFieldValue_v1()
        value.value.str = "<<<NULL>>>"
        assert value.value.str == "<<<NULL>>>"


def test_return_codes_and_error_classes(nvidia: dict[str, ModuleType]) -> None:
    theirs = nvidia["dcgm_structs"]
    codes = public(double_structs, "DCGM_ST_")
    assert len(codes) > 35
    for name, code in codes.items():
        assert getattr(theirs, name) == code, name
        if code != 0:
            ours_cls, their_cls = double_structs.dcgmExceptionClass(code), theirs.dcgmExceptionClass(code)
            assert ours_cls is not None and their_cls is not None
            assert ours_cls.__name__ == their_cls.__name__
            assert their_cls().value == ours_cls().value == code
            assert type(theirs.DCGMError(code)) is their_cls
            assert type(double_structs.DCGMError(code)) is ours_cls


def test_constants_sentinels_and_field_ids(nvidia: dict[str, ModuleType]) -> None:
    for name, value in vars(double_value).items():
        if name.startswith("DCGM_") and not callable(value):
            assert getattr(nvidia["dcgmvalue"], name) == value, name
    for name in ("DCGM_INT64_IS_BLANK", "DCGM_FP64_IS_BLANK", "DCGM_INT32_IS_BLANK", "DCGM_STR_IS_BLANK"):
        ours, theirs = getattr(double_value, name), getattr(nvidia["dcgmvalue"], name)
        for sample in ("<<<NULL>>>", "GPU-1") if "STR" in name else (0, 2**31, 2**47, 2**63 - 16, 2**63 - 1):
            assert ours(sample) == theirs(sample), (name, sample)
    with warnings.catch_warnings():  # DCGM 4.6 renamed profiling constants; the old names warn
        warnings.simplefilter("ignore", DeprecationWarning)
        for name, value in vars(double_fields).items():
            if name.startswith("DCGM_"):
                assert getattr(nvidia["dcgm_fields"], name) == value, name
    for name in (
        "DCGM_OPERATION_MODE_AUTO",
        "DCGM_GROUP_EMPTY",
        "DCGM_MAX_NUM_DEVICES",
        "DCGM_MAX_STR_LENGTH",
    ):
        assert getattr(nvidia["dcgm_structs"], name) == getattr(double_structs, name)


def test_call_signatures(nvidia: dict[str, ModuleType]) -> None:
    calls = [name for name, fn in vars(double_agent).items() if name.startswith("dcgm") and callable(fn)]
    assert len(calls) >= 18
    for name in calls:
        ours = inspect.signature(getattr(double_agent, name))
        theirs = inspect.signature(getattr(nvidia["dcgm_agent"], name))
        assert list(ours.parameters) == list(theirs.parameters), name
