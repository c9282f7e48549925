"""Keep the Helm chart's version and its copies of smlens' thresholds, rules, dashboards and Alertmanager
routes in step with their sources.

    PYTHONPATH=exporter python tools/helm_sync.py          # rewrite the chart's copies
    PYTHONPATH=exporter python tools/helm_sync.py --check  # exit 1 naming every copy that differs

Helm cannot read files outside the chart, so the chart carries copies under helm/smlens/files/. The
rule and dashboard copies come from the same generators as rules/ and dashboards/, run with stand-in
thresholds whose every appearance in the output is then replaced by ``__SMLENS_THRESHOLD_<name>__``
(``__SMLENS_THRESHOLD_<name>_PERCENT__`` where a ratio is written as a whole percentage,
``__SMLENS_THRESHOLD_<a>_MINUS_<b>_PERCENT__`` for the difference of two). The chart puts the
effective thresholds back in (templates/_helpers.tpl), so ``--set thresholds.<name>=...`` changes the
alerts and dashboards exactly as regenerating them with that override would; tests/test_helm_chart.py
proves that equality, and that default values render exactly rules/ and dashboards/. The thresholds
part of values.schema.json is generated here too, so the chart rejects unknown threshold names.

``smlens.__version__`` (exporter/smlens/__init__.py) is the one source of the release version: Chart.yaml's
``version`` and ``appVersion`` (the default image tag) are written from it, in SemVer form (0.2.0rc1 ->
0.2.0-rc.1).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from smlens import __version__
from smlens.bundle.files import GENERATORS
from smlens.verdicts import thresholds
from smlens.verdicts.thresholds import _DURATION, _TEXT_FIELDS, Thresholds

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "smlens"
# The PEP 440 versions a release may carry, and their SemVer 2 pre-release names.
RELEASE_VERSION = re.compile(r"(\d+\.\d+\.\d+)(?:(a|b|rc)(\d+))?")
PRE_RELEASES = {"a": "alpha", "b": "beta", "rc": "rc"}
PLACEHOLDER = "__SMLENS_THRESHOLD_{}__"
PERCENT_PLACEHOLDER = "__SMLENS_THRESHOLD_{}_PERCENT__"
DIFFERENCE_PLACEHOLDER = "__SMLENS_THRESHOLD_{}_MINUS_{}_PERCENT__"
# Characters a text threshold may hold: none that YAML or JSON would have to escape around it.
TEXT_PATTERN = "^[^\\s\"'\\\\]+$"

# As smlens.verdicts.thresholds checks a price table.
_PRICE = {"type": "number", "minimum": 0, "exclusiveMaximum": 1e9}
PRICES_SCHEMA = {
    "type": "object",
    "description": "Prices for the cost series (docs/accounting.md); empty tables: no cost anywhere.",
    "additionalProperties": False,
    "properties": {
        "currency": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_.-]{0,15}$"},
        "gpu_hour": {
            "type": "object",
            "description": "GPU model, as gpu_info's model label writes it, to the price of one GPU-hour",
            "additionalProperties": _PRICE,
        },
        "mig_instance_hour": {
            "type": "object",
            "description": '"<model>/<MIG profile>" to the price of one hour of such an instance',
            "propertyNames": {"pattern": "^[^/]+/[^/]+$"},
            "additionalProperties": _PRICE,
        },
    },
}

Generator = Callable[[Thresholds], dict[str, str]]
GENERATED: Mapping[str, Generator] = GENERATORS


def _is_ratio(field: dataclasses.Field[Any]) -> bool:
    return field.type in ("float", float)


def stand_ins() -> tuple[Thresholds, dict[str, str]]:
    """Thresholds whose values are recognisable in generated text, and each such text's placeholder.

    Ratio i stands in as (200 + 13 * (2**i - 1)) %: its percentages (200 %, 213 %, 239 %...) are 5 modulo
    13, and the difference of any two (13 %, -13 %, 26 %...) is a distinct multiple of 13, so every
    ratio and every difference of two ratios is told apart when written as a whole percentage.
    """
    values: dict[str, Any] = {}
    forms: dict[str, str] = {}
    ratios = [f.name for f in dataclasses.fields(Thresholds) if _is_ratio(f)]
    for index, name in enumerate(ratios):
        percent = 200 + 13 * (2**index - 1)
        values[name] = float(f"{percent // 100}.{percent % 100:02d}0071")
        forms[repr(values[name])] = PLACEHOLDER.format(name)
        forms[f"{values[name]:.0%}"] = PERCENT_PLACEHOLDER.format(name)
    for minuend, subtrahend in itertools.permutations(ratios, 2):
        difference = values[minuend] - values[subtrahend]
        forms[f"{difference:.0%}"] = DIFFERENCE_PLACEHOLDER.format(minuend, subtrahend)
    for field in dataclasses.fields(Thresholds):
        if not _is_ratio(field) and field.name != "prices":  # the chart writes the price rules itself
            values[field.name] = PLACEHOLDER.format(field.name)
    return dataclasses.replace(thresholds.load(), **values), forms


def templated(generate: Generator) -> dict[str, str]:
    """The generator's files with every threshold replaced by its placeholder."""
    stand_in, forms = stand_ins()
    alternatives = "|".join(re.escape(text) for text in sorted(forms, key=len, reverse=True))
    form = re.compile(f"(?<![0-9.])(?:{alternatives})(?![0-9])")
    return {name: form.sub(lambda m: forms[m.group()], text) for name, text in generate(stand_in).items()}


def thresholds_schema() -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for field in dataclasses.fields(Thresholds):
        if _is_ratio(field):
            properties[field.name] = {"$ref": "#/definitions/ratio"}
        elif field.name == "prices":
            properties[field.name] = PRICES_SCHEMA
        elif field.name in _TEXT_FIELDS:
            properties[field.name] = {
                "type": "string",
                "pattern": TEXT_PATTERN,
                "description": f"{_TEXT_FIELDS[field.name][1]}, without spaces, quotes or backslashes",
            }
        else:
            properties[field.name] = {"$ref": "#/definitions/duration"}
    return {
        "type": "object",
        "description": "Overrides of smlens' thresholds.yaml; see docs/deploy.md.",
        "additionalProperties": False,
        "properties": properties,
    }


def schema_text(current: str) -> str:
    schema = json.loads(current)
    schema["definitions"]["duration"]["pattern"] = _DURATION.pattern.replace("\\d", "[0-9]")
    schema["properties"]["thresholds"] = thresholds_schema()
    return json.dumps(schema, indent=2) + "\n"


def chart_version(version: str) -> str:
    """The SemVer 2 form Helm needs of a release's PEP 440 version."""
    match = RELEASE_VERSION.fullmatch(version)
    if match is None:
        raise ValueError(
            f"version {version!r} (smlens.__version__) is not a release version (X.Y.Z, optionally aN, bN or "
            "rcN); Helm needs SemVer, so the chart cannot carry it."
        )
    core, kind, number = match.groups()
    return core if kind is None else f"{core}-{PRE_RELEASES[kind]}.{number}"


def chart_yaml_text(current: str, version: str) -> str:
    """Chart.yaml with ``version`` and ``appVersion`` set to ``version``; every other line kept."""
    text, found = re.subn(r"(?m)^version: .*$", f"version: {version}", current)
    text, found_app = re.subn(r"(?m)^appVersion: .*$", f'appVersion: "{version}"', text)
    if (found, found_app) != (1, 1):
        raise ValueError("Chart.yaml must have one top-level 'version:' line and one 'appVersion:' line.")
    return text


def expected_files() -> dict[Path, str]:
    """Every chart file this tool owns, with the content it must have."""
    chart_yaml = CHART / "Chart.yaml"
    files = {
        chart_yaml: chart_yaml_text(chart_yaml.read_text(), chart_version(__version__)),
        CHART / "files" / "thresholds.yaml": thresholds.SHIPPED.read_text(),
    }
    for folder, generate in GENERATED.items():
        for name, text in templated(generate).items():
            files[CHART / "files" / folder / name] = text
    schema = CHART / "values.schema.json"
    files[schema] = schema_text(schema.read_text())
    return files


def stale_files(expected: Mapping[Path, str]) -> list[Path]:
    """Files in the chart's generated folders that no generator produces any more."""
    folders = [CHART / "files" / folder for folder in GENERATED]
    return sorted(p for f in folders if f.is_dir() for p in f.iterdir() if p not in expected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Sync the Helm chart's version and its copies of thresholds, rules and dashboards."
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a copy differs")
    args = parser.parse_args(argv)
    try:
        expected = expected_files()
    except ValueError as exc:
        print(f"helm_sync: {exc}", file=sys.stderr)
        return 1
    differing = [p for p, text in expected.items() if not p.is_file() or p.read_text() != text]
    stale = stale_files(expected)
    if args.check:
        for path in [*differing, *stale]:
            print(f"out of date: {path.relative_to(ROOT)}", file=sys.stderr)
        if differing or stale:
            print("run: PYTHONPATH=exporter python tools/helm_sync.py", file=sys.stderr)
            return 1
        return 0
    for path in differing:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(ROOT)}")
    for path in stale:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
