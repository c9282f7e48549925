"""Property tests of every file and value a user hands smlens: whatever the input, the result is
settings (or thresholds, or a scenario) or one ConfigError sentence, never another exception."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from smlens.errors import ConfigError
from smlens.settings import options, resolve
from smlens.sources.sim import PROFILES, Profile, load_scenario
from smlens.verdicts import thresholds

OPTION_NAMES = sorted({o.name for command in ("serve", "check") for o in options(command)})
THRESHOLD_NAMES = [f.name for f in dataclasses.fields(thresholds.Thresholds)]
PROFILE_KEYS = ["profile", "seconds", "phases", *(f.name for f in dataclasses.fields(Profile))]

HUGE = "1" + "0" * 400  # past float's range: float() and math.isfinite() of it overflow
# st.integers() rarely leaves 64 bits; whole numbers past float's range need their own strategy.
huge_integers = st.integers(min_value=300, max_value=4000).map(lambda digits: 10**digits)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | huge_integers
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["nan", ".nan", "inf", "-inf", "1e400", HUGE, "0", "1", "15m", "0.5", *PROFILES])
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def keyed(names: list[str]) -> st.SearchStrategy[dict[Any, Any]]:
    keys = st.sampled_from(names) | st.text(max_size=10) | st.integers()
    return st.dictionaries(keys, values, max_size=6)


documents = st.one_of(values.map(yaml.safe_dump), st.text(max_size=200), st.binary(max_size=200))


def outcome(read: Callable[[Path], object], content: str | bytes) -> None:
    """``read`` of a file holding ``content`` returns, or raises ConfigError with one sentence."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "input.yaml"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        try:
            read(path)
        except ConfigError as exc:
            message = str(exc)
            assert message and "\n" not in message and "Traceback" not in message, message


def config(path: Path) -> object:
    return resolve("serve", {"config": str(path)}, environ={})


def scenario_document(gpus: list[Any]) -> str:
    return yaml.safe_dump({"gpus": gpus})


# Mostly well-formed entries with any values, so that the value checks are reached, not only the shape's.
profile_dicts = st.fixed_dictionaries(
    {"profile": st.sampled_from(sorted(PROFILES))},
    optional={key: values for key in PROFILE_KEYS if key != "profile"},
)
profile_entries = st.one_of(
    st.sampled_from(sorted(PROFILES)), st.text(max_size=10), keyed(PROFILE_KEYS), profile_dicts
)
phase_lists = st.lists(keyed(PROFILE_KEYS) | profile_dicts, max_size=3)
scenario_gpus = st.lists(profile_entries | phase_lists.map(lambda phases: {"phases": phases}), max_size=5)

common = settings(max_examples=150, deadline=None)
flag_values = (
    st.text(max_size=500)
    | huge_integers.map(str)
    | st.sampled_from(["nan", "-inf", "1e999", HUGE, "-" + HUGE])
)


@common
@given(st.one_of(keyed(OPTION_NAMES).map(yaml.safe_dump), documents))
def test_any_config_file_gives_settings_or_one_sentence(content: str | bytes) -> None:
    outcome(config, content)


@common
@given(
    st.dictionaries(st.sampled_from(OPTION_NAMES), flag_values),
    st.dictionaries(st.sampled_from(OPTION_NAMES), flag_values.filter(lambda t: "\0" not in t)),
    st.sampled_from(["serve", "check"]),
)
def test_any_flags_and_environment_give_settings_or_one_sentence(
    flags: dict[str, str], env: dict[str, str], command: str
) -> None:
    environ = {"SMLENS_" + name.upper(): value for name, value in env.items()}
    try:
        resolve(command, flags, environ=environ)
    except ConfigError as exc:
        assert "\n" not in str(exc)


@common
@given(st.one_of(keyed(THRESHOLD_NAMES).map(yaml.safe_dump), documents))
def test_any_thresholds_file_gives_thresholds_or_one_sentence(content: str | bytes) -> None:
    outcome(thresholds.load, content)


@common
@given(st.one_of(scenario_gpus.map(scenario_document), documents))
@example(scenario_document([{"phases": [{"profile": "idle", "seconds": int(HUGE)}]}]))
def test_any_scenario_file_gives_a_scenario_or_one_sentence(content: str | bytes) -> None:
    outcome(load_scenario, content)
