"""Rendering the Helm chart with Helm's own Go code (helm-python-sdk), for the tests of the chart."""

from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path
from typing import Any

import helm_python
import yaml

from conftest import REPO

CHART_DIR = REPO / "helm" / "smlens"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*.yaml"))
RELEASE = "smlens"
NAMESPACE = "monitoring"

sys.path.insert(0, str(REPO / "tools"))
import helm_sync  # noqa: E402 - tools/ is not a package

__all__ = ["CHART_DIR", "CI_VALUES", "NAMESPACE", "RELEASE", "Rendered", "helm_sync", "render"]


@functools.cache
def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART_DIR)


class Rendered:
    """The manifests of one render, parsed, plus NOTES.txt."""

    def __init__(self, manifests: dict[str, str]) -> None:
        self.notes = next((text for path, text in manifests.items() if path.endswith("NOTES.txt")), "")
        self.objects: list[dict[str, Any]] = [
            document
            for path, text in sorted(manifests.items())
            if not path.endswith("NOTES.txt")
            for document in yaml.safe_load_all(text)
            if document
        ]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        (found,) = self.of_kind(kind)
        return found

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
        return container


@functools.cache
def _render(values_json: str, release: str) -> Rendered:
    values = json.loads(values_json)
    return Rendered(_chart().render(values, name=release, namespace=NAMESPACE))


def render(values: dict[str, Any] | Path | None = None, release: str = RELEASE) -> Rendered:
    """Render like `helm template RELEASE helm/smlens -n monitoring -f VALUES --set monitoringCRDs=always`
    (an offline render sees no monitoring.coreos.com/v1, as GitOps tools do; values may set
    monitoringCRDs themselves); schema errors raise helm_python.HelmValuesError, template failures
    helm_python.HelmRenderError."""
    if isinstance(values, Path):
        values = yaml.safe_load(values.read_text())
    values = {"monitoringCRDs": "always", **(values or {})}
    rendered = _render(json.dumps(values, sort_keys=True), release)
    return copy.deepcopy(rendered)
