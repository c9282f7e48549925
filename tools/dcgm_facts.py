"""Writes tests/fixtures/dcgm_facts.json: facts, not code, about NVIDIA's DCGM Python bindings (NVIDIA/DCGM
testing/python3) for every name the DCGM double (tests/fakes/fake_dcgm) defines, so that CI checks the double
against NVIDIA's bindings without them (tests/test_dcgm_facts.py).

    bash scripts/fetch-dcgm-bindings.sh --from-git /path/to/NVIDIA/DCGM     # or without --from-git: download
    python3 tools/dcgm_facts.py "$(bash scripts/fetch-dcgm-bindings.sh --cached)"

Every binding file is checked against its SHA-256 pinned in scripts/fetch-dcgm-bindings.sh before it is
imported. Recorded: structure layouts (member, ctypes type, offset, size), version constants, return codes
with their DCGMError subclass names, blank sentinels and what the IS_BLANK tests answer, field ids and other
constants, and the parameter names of the calls; versions with the same facts share one entry.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib
import inspect
import json
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOUBLE = REPO / "tests" / "fakes" / "fake_dcgm"
FACTS = REPO / "tests" / "fixtures" / "dcgm_facts.json"
PINS = REPO / "scripts" / "fetch-dcgm-bindings.sh"
MODULES = ("dcgm_agent", "dcgm_structs", "dcgm_fields", "dcgmvalue")
BLANK_SAMPLES: dict[str, tuple[Any, ...]] = {
    "DCGM_INT32_IS_BLANK": (0, 2**31 - 17, 2**31 - 16, 2**31 - 1),
    "DCGM_INT64_IS_BLANK": (0, 2**47, 2**63 - 17, 2**63 - 16, 2**63 - 1),
    "DCGM_FP64_IS_BLANK": (0.0, 2.0**47 - 1, 2.0**47, 2.0**47 + 3),
    "DCGM_STR_IS_BLANK": ("", "GPU-1", "<<<NULL>>>", "<<<NOT_PERM>>>"),
}


@contextmanager
def bindings(directory: Path) -> Iterator[dict[str, ModuleType]]:
    """The four modules of ``directory``, imported afresh (they import each other by these names)."""
    saved = {name: sys.modules.pop(name) for name in MODULES if name in sys.modules}
    sys.path.insert(0, str(directory))
    try:
        yield {name: importlib.import_module(name) for name in MODULES}
    finally:
        sys.path.remove(str(directory))
        for name in MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def names_of(double: dict[str, ModuleType]) -> dict[str, list[str]]:
    """The names the double defines, by kind: what the facts are gathered for."""
    structs, value = vars(double["dcgm_structs"]), vars(double["dcgmvalue"])
    return {
        "structs": sorted(
            k
            for k, v in structs.items()
            if k.startswith("c_dcgm") and isinstance(v, type) and issubclass(v, ctypes.Structure)
        ),
        "versions": sorted(k for k, v in structs.items() if "_version" in k and isinstance(v, int)),
        "codes": sorted(k for k in structs if k.startswith("DCGM_ST_")),
        "constants": sorted(
            k
            for k, v in structs.items()
            if k.startswith("DCGM_") and not k.startswith("DCGM_ST_") and not callable(v)
        ),
        "sentinels": sorted(k for k, v in value.items() if k.startswith("DCGM_") and not callable(v)),
        "fields": sorted(k for k in vars(double["dcgm_fields"]) if k.startswith("DCGM_")),
        "calls": sorted(
            k for k, v in vars(double["dcgm_agent"]).items() if k.startswith("dcgm") and callable(v)
        ),
    }


def facts_of(modules: dict[str, ModuleType], names: dict[str, list[str]]) -> dict[str, Any]:
    """What ``modules`` say about each of ``names``, as JSON-ready data."""
    structs, value = modules["dcgm_structs"], modules["dcgmvalue"]

    def layout(struct: type[ctypes.Structure]) -> dict[str, Any]:
        members = []
        for member, kind, *_ in struct._fields_:
            described = getattr(struct, member)
            members.append([member, kind.__name__, described.offset, described.size])
        return {"size": ctypes.sizeof(struct), "members": members}

    def code(name: str) -> list[Any]:
        number = getattr(structs, name)
        error = structs.dcgmExceptionClass(number) if number != 0 else None
        return [number, None if error is None else error.__name__]

    with warnings.catch_warnings():  # DCGM 4.6 renamed profiling constants; the old names warn
        warnings.simplefilter("ignore", DeprecationWarning)
        return {
            "structs": {k: layout(getattr(structs, k)) for k in names["structs"]},
            "versions": {k: getattr(structs, k) for k in names["versions"]},
            "codes": {k: code(k) for k in names["codes"]},
            "constants": {k: getattr(structs, k) for k in names["constants"]},
            "sentinels": {k: getattr(value, k) for k in names["sentinels"]},
            "blank_tests": {
                k: [[sample, getattr(value, k)(sample)] for sample in samples]
                for k, samples in BLANK_SAMPLES.items()
            },
            "fields": {k: getattr(modules["dcgm_fields"], k) for k in names["fields"]},
            "calls": {
                k: list(inspect.signature(getattr(modules["dcgm_agent"], k)).parameters)
                for k in names["calls"]
            },
        }


def pinned() -> dict[tuple[str, str], str]:
    """(tag, file) -> SHA-256, from scripts/fetch-dcgm-bindings.sh."""
    pins = {}
    for line in PINS.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith("v") and parts[1] in {f"{m}.py" for m in MODULES}:
            pins[parts[0], parts[1]] = parts[2]
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("dirs", help="directories of NVIDIA's bindings, one per tag, joined by ':'")
    parser.add_argument("--out", type=Path, default=FACTS)
    args = parser.parse_args(argv)
    pins = pinned()
    with bindings(DOUBLE) as double:
        names = names_of(double)
    groups: list[dict[str, Any]] = []
    for directory in (Path(d) for d in args.dirs.split(":") if d):
        tag = directory.name
        sums = {}
        for module in MODULES:
            digest = hashlib.sha256((directory / f"{module}.py").read_bytes()).hexdigest()
            if pins.get((tag, f"{module}.py")) != digest:
                print(
                    f"{directory}/{module}.py does not match the SHA-256 pinned for {tag}.", file=sys.stderr
                )
                return 1
            sums[f"{module}.py"] = digest
        with bindings(directory) as theirs:
            facts = facts_of(theirs, names)
        group = next((g for g in groups if g["facts"] == facts), None)
        if group is None:
            groups.append(group := {"sources": {}, "facts": facts})
        group["sources"][tag] = sums
    if not groups:
        print("no binding directory given.", file=sys.stderr)
        return 1
    args.out.write_text(
        json.dumps({"from": "NVIDIA/DCGM testing/python3", "groups": groups}, indent=1) + "\n"
    )
    print(f"{args.out}: {sum(len(g['sources']) for g in groups)} tags in {len(groups)} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
