"""Reading the user's files with one-sentence errors: every file smlens reads goes through
:func:`read_bounded`, every YAML file through :func:`read_yaml`, and a bad value is shown by :func:`quote`."""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

from smlens.errors import ConfigError

# More than any settings file holds (a web config with an inline CA bundle included), and small enough
# that the pure-Python YAML parser gets through it in seconds: /dev/zero or a log given by mistake gets
# one sentence instead of filling the memory.
MAX_FILE_BYTES = 1 << 20
# An alias shares its anchor's node, so parsing stays cheap however often it is used; it is every walk of
# the value (a check, the repr in an error) that expands it, and a short file can expand to billions of
# nodes. Anchors that save typing in a hand-written file add far fewer nodes than this.
MAX_ALIAS_NODES = 10_000
MAX_QUOTED = 40  # characters of a bad value that an error shows

_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = 4
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = MAX_QUOTED


def quote(value: object) -> str:
    """``value``'s repr, cut to a few dozen characters: an error names a bad value, it never copies it."""
    try:
        return clip(_REPR.repr(value))
    except ValueError:  # an int beyond Python's digit limit for str()
        return "a number too long to show"


def clip(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` cut to ``limit`` characters, the cut marked."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_bounded(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them; ``what`` names the file in errors."""
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)  # one byte more than allowed tells a file at the limit from a larger one
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}.") from exc
    if len(data) > limit:
        raise ConfigError(f"{what} {path} is larger than {_size(limit)}, more than such a file holds.")
    return data


def _size(limit: int) -> str:
    return f"{limit / 2**20:g} MiB" if limit >= 2**20 else f"{limit} bytes"


def _expanded_nodes(root: yaml.Node) -> int | None:
    """How many nodes the document has once every alias is expanded (None: an alias holds itself).

    Counted over the distinct nodes, each once: the count of a node is one plus its children's."""
    total: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            open_nodes.discard(key)
            total[key] = 1 + sum(total[id(child)] for child in children)
            continue
        if key in total:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                return None
            if id(child) not in total:
                stack.append((child, False))
    return total[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _distinct_nodes(root: yaml.Node) -> int:
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_children(node))
    return len(seen)


def _line_of(exc: yaml.YAMLError, text: str) -> int | None:
    """The 1-based line that PyYAML blames, if it says."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return int(mark.line) + 1
    position = getattr(exc, "position", None)  # a ReaderError: a character YAML does not allow
    if isinstance(position, int):
        return text.count("\n", 0, position) + 1
    return None


def _problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or getattr(exc, "reason", None)
    if not isinstance(problem, str) or not problem:
        return exc.__class__.__name__
    return clip(problem, 2 * MAX_QUOTED)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader; a scalar that its type cannot hold (a date in month 13, an int past Python's
    digit limit) is a YAML error at that scalar's line, not a ValueError from deep in the constructor."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError:
            kind = str(node.tag).rsplit(":", 1)[-1]
            raise yaml.constructor.ConstructorError(
                None, None, f"{quote(node.value)} cannot be read as {kind}", node.start_mark
            ) from None


def read_yaml(path: Path, what: str) -> Any:
    """The parsed content of ``path``; ``what`` names the file in errors (e.g. "config file")."""
    data = read_bounded(path, what)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})."
        ) from None
    try:
        return _load(text, path, what)
    except yaml.YAMLError as exc:
        line = _line_of(exc, text)
        at = f" at line {line}" if line is not None else ""
        raise ConfigError(f"{what} {path} is not valid YAML{at}: {_problem(exc)}.") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} is nested too deeply.") from None


def _load(text: str, path: Path, what: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_nodes(node)
        if expanded is None:
            raise ConfigError(f"{what} {path} holds an alias that refers to itself.")
        if expanded - _distinct_nodes(node) > MAX_ALIAS_NODES:
            raise ConfigError(
                f"{what} {path} uses aliases that expand to more than {MAX_ALIAS_NODES:,} extra values; "
                "write the values out."
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()
