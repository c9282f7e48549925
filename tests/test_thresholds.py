"""The shipped thresholds.yaml is the one place a threshold's value is written: the loaded defaults are its
values, changing it changes them, and a file that leaves a threshold out or names an unknown one is refused
in one sentence."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from smlens.errors import ConfigError
from smlens.verdicts import thresholds
from smlens.verdicts.thresholds import Thresholds


def test_the_dataclass_writes_no_value() -> None:
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(Thresholds)
    )


def test_the_loaded_defaults_are_the_shipped_file() -> None:
    assert thresholds.load().as_dict() == yaml.safe_load(thresholds.SHIPPED.read_text())


def _shipped_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str, replacement: str) -> None:
    """A copy of the shipped file with the match of ``pattern`` replaced, loaded as the shipped one."""
    text, found = re.subn(rf"(?m)^{pattern}", replacement, thresholds.SHIPPED.read_text())
    assert found == 1, pattern
    shipped = tmp_path / "thresholds.yaml"
    shipped.write_text(text)
    monkeypatch.setattr(thresholds, "SHIPPED", shipped)


def test_changing_a_value_in_the_shipped_file_changes_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = thresholds.load()
    _shipped_with(tmp_path, monkeypatch, r"hollow_sm_active: [0-9.]+", "hollow_sm_active: 0.25")
    after = thresholds.load()
    assert after.hollow_sm_active == 0.25 != before.hollow_sm_active
    assert dataclasses.replace(after, hollow_sm_active=before.hollow_sm_active) == before
    user = tmp_path / "user.yaml"
    user.write_text("hollow_for: 1m\n")
    overridden = thresholds.load(user)  # a user's file still overrides the shipped file, key by key
    assert (overridden.hollow_sm_active, overridden.hollow_for) == (0.25, "1m")


def test_a_shipped_file_without_a_threshold_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shipped_with(tmp_path, monkeypatch, r"tensor_busy: .*$", "")
    with pytest.raises(
        ConfigError, match=r"^shipped thresholds\.yaml: threshold 'tensor_busy' is missing\.$"
    ):
        thresholds.load()


def test_a_user_file_with_an_unknown_threshold_or_a_bad_value_is_one_sentence(tmp_path: Path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text("hollow_sm_activ: 0.2\n")
    with pytest.raises(
        ConfigError, match=r"^.*user\.yaml: unknown threshold 'hollow_sm_activ'; known: "
    ) as raised:
        thresholds.load(user)
    assert "\n" not in str(raised.value)
    user.write_text("window: ten minutes\n")
    with pytest.raises(ConfigError, match=r"threshold 'window' must be a Prometheus duration such as 15m"):
        thresholds.load(user)
