"""The DCGM double (tests/fakes/fake_dcgm) against facts about NVIDIA's own bindings, recorded in
tests/fixtures/dcgm_facts.json by tools/dcgm_facts.py from the SHA-256-pinned files of every DCGM tag in
scripts/fetch-dcgm-bindings.sh: this runs in CI, where NVIDIA's files are not present. Where they are,
test_dcgm_conformance.py compares the double with them directly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tools.dcgm_facts import DOUBLE, FACTS, MODULES, bindings, facts_of, names_of, pinned

RECORDED = json.loads(FACTS.read_text())
GROUPS: list[dict[str, Any]] = RECORDED["groups"]


def test_the_facts_come_from_every_pinned_tag_and_file() -> None:
    recorded = {
        (tag, name): digest
        for g in GROUPS
        for tag, sums in g["sources"].items()
        for name, digest in sums.items()
    }
    assert recorded == pinned()
    assert {name for _, name in recorded} == {f"{m}.py" for m in MODULES}


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: "+".join(g["sources"]))
def test_the_double_says_what_nvidias_bindings_say(group: dict[str, Any]) -> None:
    with bindings(DOUBLE) as double:
        ours = json.loads(json.dumps(facts_of(double, names_of(double))))
    theirs = group["facts"]
    assert ours.keys() == theirs.keys()
    for kind in theirs:  # one kind at a time, for a readable difference
        assert ours[kind] == theirs[kind], (
            f"{kind}: the double differs; after fixing it or the pins, rerun tools/dcgm_facts.py"
        )
