"""The READMEs and docs/ name only files, folders and modules that exist in this checkout.

Every Markdown file is read whole, fenced code and command output included. What counts as a name:

- a repository path: one that starts at a top-level folder (``exporter/smlens/web/app.py``,
  ``bench/peer_compare.py``, ``rules/*.rules.yaml``, ``helm/smlens/``), or at the package
  (``smlens/web/status/static/``, read under ``exporter/``);
- a path to a ``.py`` file inside the package or bench/ (``dcgm/backend.py``, ``status/page.py``);
- a bare file name ending in ``.py`` (``collector.py``), which some file of the checkout must carry;
- a module: ``python3 -m smlens.X`` or ``python3 -m bench.X`` (``-m`` needs a ``.py`` file or a package
  with ``__main__.py``), and a dotted ``smlens.X.Y`` in the text, whose modules must exist and whose first
  attribute past them must be defined there (``smlens.sources.nvml.calls.call``);
- the target of a relative Markdown link (``[text](metrics.md#mig-gpu-instances)``), read from the
  document's folder, with its anchor: a heading of that file, as GitHub makes anchors of headings.

A path right after a word character or one of ``/ . ~ $ : @ -`` is someone else's (``/etc/...``,
``~/.cache/smlens/...``, ``https://.../docs/...``, ``OLD/exporter``); so is the text of a Markdown link
to an ``http(s)`` address. Links are read in prose only, not in fenced or inline code. The few names of
other projects' files that still look like ours are listed in ``EXTERNAL`` with where they belong.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "exporter" / "smlens"
DOCUMENTS = (REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md")))
ROOTS = (
    "alertmanager",
    "bench",
    "dashboards",
    "docker",
    "docs",
    "exporter",
    "helm",
    "rules",
    "scripts",
    "tests",
    "tools",
)
# Names of other projects' files, as the docs cite them.
EXTERNAL = {
    "docs/METRICS.md": "utkuozdemir/nvidia_gpu_exporter's metric list (docs/migration.md)",
    "testing/python3/tests/test_prof.py": "NVIDIA/DCGM's profiling tests (docs/dcgm.md)",
    "tests/test_prof.py": "the same file, as docs/dcgm.md's table names it (under testing/python3/)",
    "test_prof.py": "the same file of NVIDIA/DCGM",
    "pynvml.py": "nvidia-ml-py's module (docs/validation.md)",
    "smlens.monitoring.svc": "the chart's Service name in the cluster's DNS (docs/security.md)",
}
# Not a path of ours when it comes right after one of these characters.
_OUTSIDE = r"(?<![\w./~$:@-])"
_LINK_TO_ELSEWHERE = re.compile(r"\[[^\]\n]*\]\((https?://[^)\s]*)\)")
_ROOTED = re.compile(_OUTSIDE + r"(?:" + "|".join(ROOTS) + r"|smlens)/[\w.*/-]*")
_PY_PATH = re.compile(_OUTSIDE + r"(?:[\w-]+/)+[\w-]+\.py\b")
_PY_FILE = re.compile(_OUTSIDE + r"[\w-]+\.py\b(?!/)")
_RUN_MODULE = re.compile(r"\bpython(?:3(?:\.\d+)?)?\}?\s+(?:-\w+\s+)*-m\s+((?:smlens|bench)(?:\.\w+)*)")
_DOTTED = re.compile(_OUTSIDE + r"smlens(?:\.\w+)+")
_RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^)\s#]*)(?:#([^)\s]*))?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def _trimmed(path: str) -> str:
    """Without the sentence's punctuation after it (``rules/...`` is the folder)."""
    return path.rstrip(".,:;")


def _exists(path: Path) -> bool:
    return any(path.parent.glob(path.name)) if "*" in path.name else path.exists()


@cache
def _package_dirs() -> tuple[Path, ...]:
    """Folders a package-relative path may start from: the package and every folder in it, and bench/."""
    dirs = [PACKAGE, *(p for p in sorted(PACKAGE.rglob("*")) if p.is_dir() and p.name != "__pycache__")]
    return (*dirs, REPO / "bench")


@cache
def _file_names() -> frozenset[str]:
    return frozenset(p.name for root in ROOTS if (REPO / root).is_dir() for p in (REPO / root).rglob("*.py"))


def rooted_path_missing(path: str) -> bool:
    path = _trimmed(path)
    if path in EXTERNAL:
        return False
    where = REPO / "exporter" / path if path.startswith("smlens/") else REPO / path
    return not _exists(where)


def package_path_missing(path: str) -> bool:
    path = _trimmed(path)
    if path in EXTERNAL or path.split("/", 1)[0] in (*ROOTS, "smlens"):
        return False  # a rooted path: rooted_path_missing answers for it
    return not any((base / path).is_file() for base in (REPO, *_package_dirs()))


def file_name_missing(name: str) -> bool:
    return name not in EXTERNAL and name not in _file_names()


def runnable_module_missing(module: str) -> bool:
    """Can ``python3 -m module`` run it, from the repository root (bench) or with the package installed?"""
    parts = module.split(".")
    base = PACKAGE.parent if parts[0] == "smlens" else REPO
    target = base.joinpath(*parts)
    return not (target.with_suffix(".py").is_file() or (target / "__main__.py").is_file())


def _defines(module: Path, name: str) -> bool:
    pattern = (
        rf"^\s*(?:(?:async\s+)?def|class)\s+{name}\b"  # a function or class
        rf"|^{name}\s*[:=]"  # a module-level name
        rf"|^\s*(?:from\s+\S+\s+)?import\s.*\b{name}\b"  # or one imported into it
    )
    return re.search(pattern, module.read_text(encoding="utf-8"), flags=re.MULTILINE) is not None


def dotted_name_missing(dotted: str) -> bool:
    """``smlens.a.b.attr``: every module up to the first name that is none must exist, and that name
    (if any) must be defined in the last one."""
    dotted = _trimmed(dotted)
    if dotted in EXTERNAL:
        return False
    where = PACKAGE
    for part in dotted.split(".")[1:]:
        if where.is_dir() and (where / part / "__init__.py").is_file():
            where = where / part
        elif where.is_dir() and (where / f"{part}.py").is_file():
            where = where / f"{part}.py"
        else:
            module = where / "__init__.py" if where.is_dir() else where
            return not _defines(module, part)
    return False


def anchors(markdown: str) -> frozenset[str]:
    """GitHub's anchors of a document's headings: lower case, punctuation dropped, spaces as hyphens (a
    repeated heading gets -1, -2, ...); headings inside fenced code are none."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(found)


def link_missing(folder: Path, target: str, anchor: str | None, here: str) -> str | None:
    """Why a relative link (``target``, possibly empty, and ``anchor``) of the document in ``folder``, whose
    Markdown is ``here``, leads nowhere; None when it leads somewhere."""
    path = folder / target if target else None
    if path is not None and not path.exists():
        return "no such file or folder"
    if not anchor or (path is not None and path.suffix != ".md"):
        return None
    if anchor not in anchors(here if path is None else path.read_text(encoding="utf-8")):
        return f"no heading with the anchor #{anchor}"
    return None


CHECKS = (
    (_ROOTED, rooted_path_missing, "no such file or folder"),
    (_PY_PATH, package_path_missing, "no such file in the repository or the package"),
    (_PY_FILE, file_name_missing, "no file of this name in the checkout"),
    (_RUN_MODULE, runnable_module_missing, "no module to run with -m"),
    (_DOTTED, dotted_name_missing, "no such module or name in the package"),
)


def stale_names(text: str, document: Path) -> list[tuple[int, str, str]]:
    """(line, name, why) for every name in ``text``, the Markdown of ``document``, that the checkout lacks."""
    found: list[tuple[int, str, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced:  # links only in prose: code may hold "](" of its own
            for match in _RELATIVE_LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                why = link_missing(document.parent, match.group(1), match.group(2), text)
                if why is not None:
                    found.append((number, match.group(0)[2:-1], why))
        line = _LINK_TO_ELSEWHERE.sub(r"\1", line)
        for pattern, missing, why in CHECKS:
            for match in pattern.finditer(line):
                name = match.group(match.lastindex or 0)
                if missing(name):
                    found.append((number, _trimmed(name), why))
    unique: dict[tuple[int, str], str] = {}  # a name two checks catch is reported once, with the first why
    for line_number, name, why in found:
        unique.setdefault((line_number, name), why)
    return [(line_number, name, why) for (line_number, name), why in unique.items()]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_and_module_the_docs_name_exists(document: Path) -> None:
    stale = stale_names(document.read_text(encoding="utf-8"), document)
    assert not stale, "\n".join(
        f"{document.relative_to(REPO)}:{line}: {name}: {why}" for line, name, why in stale
    )


def test_the_checks_catch_names_that_do_not_exist_and_spare_others() -> None:
    lines = (
        "`exporter/smlens/serving/http11.py` and `bench/rss_compare.py`,",  # 1: both gone
        "```",
        "$ python3 -m smlens.routing --help; python -m bench.import_cost",  # 3: both gone
        "tests/test_nope.py: 1 passed",  # 4: a path in command output
        "```",
        "`smlens/backends/nvml.py`, `backends/nvml.py`, `textformat.py`, `smlens.serving.http11`",  # 6
        "`smlens.sources.nvml.calls.nope()`, [gone](docs/nope.md)",  # 7
        "[moved](docs/metrics.md#no-such-part)",  # 8
        # Names that exist, and names of others:
        "`exporter/smlens/web/app.py`, `rules/*.rules.yaml`, `helm/smlens/`, `rules/...`, `dcgm/backend.py`",
        "`python3 -m smlens.bundle`, `python3 -m bench.truth`, `smlens.sources.nvml.calls.call()`",
        "`smlens.__version__`, /etc/prometheus/smlens/x.yaml, ~/.cache/smlens/dcgm-bindings, OLD/exporter",
        "[docs/web-configuration.md](https://github.com/prometheus/exporter-toolkit/blob/main/docs/x.md)",
        "`collector.py`, [the MIG part](docs/metrics.md#mig-gpu-instances), [top](#smlens), `a[0](b)`",
        "# smlens",
    )
    stale = stale_names("\n".join(lines), REPO / "README.md")
    assert [(line, name) for line, name, _ in stale] == [
        (1, "exporter/smlens/serving/http11.py"),
        (1, "bench/rss_compare.py"),
        (3, "smlens.routing"),
        (3, "bench.import_cost"),
        (4, "tests/test_nope.py"),
        (6, "smlens/backends/nvml.py"),
        (6, "backends/nvml.py"),
        (6, "textformat.py"),
        (6, "smlens.serving.http11"),
        (7, "docs/nope.md"),
        (7, "smlens.sources.nvml.calls.nope"),
        (8, "docs/metrics.md#no-such-part"),
    ]
