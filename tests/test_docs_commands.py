"""The README and docs/ run only commands that exist, with flags they take.

What a reader would run is read from fenced code blocks and from inline code spans, a shell line at a
time (continuation lines joined, the line cut at `;`, `&&`, `||`, `|`, `&`, `>`, `$(`, `)` and ` #`):

- ``smlens SUBCOMMAND --flag ...`` (also ``python3 -m smlens``, ``.venv/bin/smlens``, and ``smlens`` right
  after a bare ``--``, as in ``kubectl exec POD -- smlens profile``): the subcommand must be one of the
  command line's (``smlens.cli``), and every ``--flag`` one that subcommand's parser takes;
- ``bash scripts/X.sh``, ``python3 bench/X.py``, ``python3 tools/X.py``: the file must exist and every
  ``--flag`` be written in it (a script that hands its arguments to another command is in ``PASSES_ON``);
- ``python3 -m bench.X`` and ``python3 -m smlens.X``: the module must be runnable and every ``--flag``
  be written in its source (a package's, all of it).

Anything else (helm, kubectl, pip, pytest, promtool...) is someone else's command and not checked here.
"""

from __future__ import annotations

import argparse
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from smlens import cli

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = (REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md")))
# Scripts and benches whose arguments (all of them, or those after a bare --) go to another command.
PASSES_ON = {
    "scripts/serve-sim.sh": ("all", ("smlens", "serve")),
    "scripts/test-all.sh": ("all", None),  # pytest's arguments
    "bench/peer_compare.py": ("after --", ("smlens", "serve")),
    "bench/soak.py": ("after --", ("smlens", "serve")),
}
_SEPARATORS = re.compile(r"\s*(?:;|&&|\|\||\s\|\s|\s&(?:\s|$)|\s\d?>>?\s|\$\(|\)|\s#\s|^#\s)\s*")
_PYTHON = re.compile(r"python(?:3(?:\.\d+)?)?$")
_FLAG = re.compile(r"^\[?(--[a-z][\w-]*)")
_LEADERS = {"sudo", "exec", "nohup", "setsid", "time", "env", "$"}


@cache
def smlens_options() -> dict[str | None, frozenset[str]]:
    """The option strings of ``smlens`` (key None) and of each of its subcommands."""
    parser = cli._parser()
    options: dict[str | None, frozenset[str]] = {
        None: frozenset(s for action in parser._actions for s in action.option_strings)
    }
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options[name] = frozenset(s for a in sub._actions for s in a.option_strings)
    return options


def shell_lines(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of every line of code in fenced blocks and every inline code span of prose."""
    found: list[tuple[int, str]] = []
    fenced, paragraph, start, pending, pending_at = False, [], 0, "", 0
    lines = markdown.splitlines()

    def spans() -> None:
        text = "\n".join(paragraph)
        for match in re.finditer(r"`([^`]+)`", text):
            found.append((start + text.count("\n", 0, match.start()), match.group(1).replace("\n", " ")))

    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            spans()
            paragraph, fenced = [], not fenced
            continue
        if fenced:
            pending_at = pending_at or number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            found.append((pending_at, pending + line))
            pending, pending_at = "", 0
        elif line.strip():
            if not paragraph:
                start = number
            paragraph.append(line)
        else:
            spans()
            paragraph = []
    spans()
    return found


def _words(segment: str) -> list[str]:
    segment = re.sub(r"^\s*[$>]\s+", "", segment)  # a console prompt
    try:
        return shlex.split(segment)
    except ValueError:  # an unbalanced quote, e.g. in a command's output
        return segment.split()


def _flags(words: list[str]) -> list[str]:
    return [m.group(1) for w in words if (m := _FLAG.match(w))]


def _written_in(flag: str, files: list[Path]) -> bool:
    pattern = re.compile(r"""(?:["']|^|\s|\|)""" + re.escape(flag) + r"""(?:["'=)\s]|$)""", re.MULTILINE)
    return any(pattern.search(f.read_text(encoding="utf-8")) for f in files)


def _until_dashes(words: list[str]) -> tuple[list[str], list[str]]:
    if "--" in words:
        i = words.index("--")
        return words[:i], words[i + 1 :]
    return words, []


def _smlens_problems(words: list[str]) -> list[str]:
    """``words`` start after ``smlens``."""
    options = smlens_options()
    if not words:
        return []
    if words[0].startswith("-"):
        return [f"smlens {w}: no such option" for w in _flags(words[:1]) if w not in options[None]]
    if not re.fullmatch(r"[a-z][a-z-]*", words[0]):
        return []  # a placeholder or an argument, not a subcommand
    sub = words[0]
    if sub not in options:
        return [f"smlens {sub}: no such subcommand"]
    own, _ = _until_dashes(words[1:])
    return [f"smlens {sub} {flag}: no such option" for flag in _flags(own) if flag not in options[sub]]


def _file_problems(path: str, words: list[str]) -> list[str]:
    target = REPO / path
    if not target.is_file():
        return [f"{path}: no such file"]
    if path.startswith("bench/") and re.search(r"^(from|import) bench\b", target.read_text(), re.MULTILINE):
        # Run as a file, a script's folder comes first on sys.path, not the checkout: no `bench` package.
        return [f"{path}: imports the bench package, so it runs as python3 -m {path[:-3].replace('/', '.')}"]
    passes, to = PASSES_ON.get(path, ("", None))
    own, after = _until_dashes(words)
    problems = []
    if passes != "all":
        problems += [f"{path} {f}: not an option of it" for f in _flags(own) if not _written_in(f, [target])]
    rest = own if passes == "all" else after if passes == "after --" else []
    if to == ("smlens", "serve"):
        problems += _smlens_problems(["serve", *rest])
    return problems


def _module_problems(module: str, words: list[str]) -> list[str]:
    parts = module.split(".")
    base = REPO / "exporter" if parts[0] == "smlens" else REPO
    target = base.joinpath(*parts)
    if (target / "__main__.py").is_file():
        files = sorted(target.rglob("*.py"))
    elif target.with_suffix(".py").is_file():
        files = [target.with_suffix(".py")]
    else:
        return [f"python3 -m {module}: no module to run"]
    own, _ = _until_dashes(words)
    return [f"python3 -m {module} {f}: not an option of it" for f in _flags(own) if not _written_in(f, files)]


def command_problems(text: str) -> list[str]:
    """What is wrong with the smlens, script, bench and module commands of one line of code."""
    problems: list[str] = []
    for segment in _SEPARATORS.split(text):
        words = _words(segment)
        first = 0
        while first < len(words) and (words[first] in _LEADERS or re.match(r"^[A-Za-z_]\w*=", words[first])):
            first += 1
        for i in range(first, len(words)):
            if Path(words[i]).name == "smlens" and (i == first or words[i - 1] == "--"):
                problems += _smlens_problems(words[i + 1 :])
                break
        if first >= len(words) - 1:
            continue
        program, args = words[first], words[first + 1 :]
        if program == "bash" and args[0].endswith(".sh"):
            problems += _file_problems(args[0], args[1:])
        elif _PYTHON.match(program):
            while args and args[0].startswith("-") and args[0] != "-m":
                args = args[1:]  # interpreter options such as -u
            if len(args) >= 2 and args[0] == "-m":
                module = args[1]
                if module == "smlens":
                    problems += _smlens_problems(args[2:])
                elif module.split(".")[0] in ("smlens", "bench"):
                    problems += _module_problems(module, args[2:])
            elif args and args[0].endswith(".py") and args[0].split("/")[0] in ("bench", "tools", "scripts"):
                problems += _file_problems(args[0], args[1:])
    return problems


def stale_commands(markdown: str) -> list[tuple[int, str]]:
    return [(number, problem) for number, text in shell_lines(markdown) for problem in command_problems(text)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_the_docs_run_exists(document: Path) -> None:
    stale = stale_commands(document.read_text(encoding="utf-8"))
    assert not stale, "\n".join(f"{document.relative_to(REPO)}:{line}: {why}" for line, why in stale)


def test_the_checker_catches_commands_that_do_not_exist_and_spares_others() -> None:
    as_module = "python3 -m bench.accounting_mix"
    doc = "\n".join(
        (
            "Run `smlens frobnicate --fast` and `smlens serve --no-such-flag` now.",  # 1
            "```sh",
            "$ smlens profile --gpu 0 --sample-rate 10",  # 3: profile has no --sample-rate
            "python3 -m smlens.bundle rules --outdir x && bash scripts/nope.sh",  # 4
            "python3 bench/nope.py --json x; python3 bench/soak.py --hours 2",  # 5
            "python3 bench/peer_compare.py --duration 60 \\",  # 6: continued
            "  -- --backend sim --no-such-serve-flag",
            "PYTHONPATH=exporter python3 -m bench.truth --no-gpu | tee log",  # 8
            "python3 -m bench.nothing --x",  # 9
            "kubectl -n monitoring exec ds/smlens -- smlens check --seconds 3 > out.txt",  # 10
            "PYTHONPATH=exporter python3 bench/accounting_mix.py --out o",  # 11: needs -m
            "```",
            # Commands that exist, and other programs' commands:
            "`smlens serve --backend sim --listen 127.0.0.1:0`, `smlens --version`, `smlens_backend_up`,",
            "`helm upgrade --install smlens ./helm/smlens -n monitoring`, `pip install smlens`,",
            "`kubectl exec ds/smlens -- smlens profile --gpu 3 --seconds 10 --out - > gpu.html`,",
            "`bash scripts/serve-sim.sh --listen 127.0.0.1:10133`, `bash scripts/test-all.sh -x`,",
            "`python3 -m pytest -q --no-such`, `python3 -m bench.truth --out o --no-ncu`,",
            "`python3 bench/peer_compare.py --smlens-only -- --backend sim`, `.venv/bin/smlens check`,",
            "`smlens serve [--backend auto|nvml|dcgm|sim] [--listen HOST:PORT]`,",
            "`smlens profile needs NVIDIA's`, `another smlens profile): try`,",
            "`python3 -m smlens.bundle rules --thresholds t.yaml --out rules`",
        )
    )
    assert stale_commands(doc) == [
        (1, "smlens frobnicate: no such subcommand"),
        (1, "smlens serve --no-such-flag: no such option"),
        (3, "smlens profile --sample-rate: no such option"),
        (4, "python3 -m smlens.bundle --outdir: not an option of it"),
        (4, "scripts/nope.sh: no such file"),
        (5, "bench/nope.py: no such file"),
        (5, "bench/soak.py --hours: not an option of it"),
        (6, "smlens serve --no-such-serve-flag: no such option"),
        (8, "python3 -m bench.truth --no-gpu: not an option of it"),
        (9, "python3 -m bench.nothing: no module to run"),
        (10, "smlens check --seconds: no such option"),
        (11, f"bench/accounting_mix.py: imports the bench package, so it runs as {as_module}"),
    ]
