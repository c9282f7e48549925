"""Reading the user's YAML files with one-sentence errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from smlens.errors import ConfigError


def read_yaml(path: Path, what: str) -> Any:
    """The parsed content of ``path``; ``what`` names the file in errors (e.g. "config file")."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}.") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML ({exc.__class__.__name__}).") from exc
