"""The YAML form of the bundle's generated files: rule files and Alertmanager routes."""

from __future__ import annotations

import yaml


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line strings; keys in insertion order (set by the caller)."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _represent_str)


def dump(document: object, header: str) -> str:
    """``document`` as YAML after ``header`` (the comment lines that say where the file comes from)."""
    return header + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True)
