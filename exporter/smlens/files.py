"""Reading the user's YAML files with one-sentence errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from smlens.errors import ConfigError


def read_yaml(path: Path, what: str) -> Any:
    """The parsed content of ``path``; ``what`` names the file in errors (e.g. "config file")."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}.") from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})."
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML ({exc.__class__.__name__}).") from exc
    except RecursionError:
        raise ConfigError(f"{what} {path} is nested too deeply.") from None
