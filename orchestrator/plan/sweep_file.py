"""A sweep file -> plain YAML data and a map from key paths to line numbers, in bounded time.

Whatever the bytes, reading ends in a value or a `SpecError` whose lines name the file
(and the line, where there is one): a file over MAX_FILE_BYTES, text that is not UTF-8, a
YAML error, a document nested deeper than MAX_DEPTH or with more than MAX_NODES nodes
(aliases counted as often as they are used: YAML bombs) are refused before they cost time.
The nesting and size limits are checked on the parser's event stream, before a node tree
is built: PyYAML's pure-Python scanner is quadratic in the depth of open flow collections
(`[[[[...` of 20,000 brackets takes minutes) and its composer recurses once per level.

Only YAML's core types are read (null, bool, int, float, str, lists, mappings, merge keys):
a date stays a string, other tags (!!binary, !!set, !!python/...) are errors, and a scalar
that does not convert (`!!int abc`) is an error at its line. Nothing in a file can make
the tool run code (safe loading only).
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.resolver import Resolver

MAX_FILE_BYTES = 1_000_000  # a sweep is a page of YAML; more is a mistake (or an attack)
MAX_NODES = 100_000  # after alias expansion
MAX_DEPTH = 64

TAG = "tag:yaml.org,2002:"
CORE_SCALARS = ("null", "bool", "int", "float", "str")


class SpecError(ValueError):
    """Bad sweep input; `problems` holds one 'file:line: key: message' line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


# ---------------------------------------------------------------- bytes -> text


def read_sweep(path: str | Path) -> str:
    """The text of a sweep file (UTF-8, a leading byte-order mark allowed). Only a regular
    file: a named pipe, a terminal or a device would block or never end. It is opened
    without blocking and checked before it is read."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise SpecError([f"{p}: cannot read: {getattr(e, 'strerror', None) or e}"]) from None
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(kind) else "not a regular file (a pipe, a device)"
        raise SpecError([f"{p}: {what}; a sweep is a YAML file"])
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise SpecError([f"{p}: cannot read: {e.strerror or e}"]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(
            [f"{p}: larger than {MAX_FILE_BYTES:,} bytes; a sweep file is a page of YAML"]
        )
    return decode_sweep(raw, str(p))


def decode_sweep(raw: bytes, path: str) -> str:
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # UTF-32's BOMs too
        raise SpecError(
            [f"{path}: UTF-16 or UTF-32 text (it starts with a byte-order mark); save it as UTF-8"]
        )
    if (nul := raw.find(b"\x00")) >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise SpecError(
            [f"{path}:{line}: a NUL byte: a binary file or UTF-16 text, not a UTF-8 YAML file"]
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SpecError(
            [
                f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                f"{e.start}); save the sweep as UTF-8"
            ]
        ) from None


# ---------------------------------------------------------------- the loader


def _scalar_at_its_line(construct: Any) -> Any:
    """A scalar constructor whose conversion errors are YAML errors at the scalar's line."""

    def construct_scalar(loader: Any, node: yaml.Node) -> Any:
        try:
            return construct(loader, node)
        except (ValueError, TypeError, ArithmeticError) as e:
            kind = node.tag.removeprefix(TAG)
            raise ConstructorError(
                None, None, f"cannot read {str(node.value)[:40]!r} as {kind}: {e}", node.start_mark
            ) from None

    return construct_scalar


class SweepLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml when installed
    """PyYAML's safe loader restricted to the core types (see the module doc)."""

    yaml_constructors = {
        **{
            TAG + name: _scalar_at_its_line(SafeConstructor.yaml_constructors[TAG + name])
            for name in CORE_SCALARS
        },
        TAG + "seq": SafeConstructor.yaml_constructors[TAG + "seq"],
        TAG + "map": SafeConstructor.yaml_constructors[TAG + "map"],
        None: SafeConstructor.yaml_constructors[None],  # any other tag: an error
    }
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != TAG + "timestamp"]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }


# ---------------------------------------------------------------- YAML with line numbers


class SourceMap:
    """The composed YAML tree of one file, to turn key paths into line numbers."""

    def __init__(self, path: str, root: yaml.Node | None):
        self.path, self.root = path, root

    def line(self, keys: tuple[Any, ...]) -> int | None:
        """1-based line of the deepest part of `keys` that exists: a mapping key's own
        line (not its value's, which for a block starts below), or a list item's."""
        node = self.root
        line = node.start_mark.line + 1 if node is not None else None
        for key in keys:
            found = _child(node, key) if node is not None else None
            if found is None:
                break
            at, node = found
            line = at.start_mark.line + 1
        return line

    def where(self, keys: tuple[Any, ...]) -> str:
        line = self.line(keys)
        return f"{self.path}:{line}" if line else self.path


def _child(node: yaml.Node, key: Any) -> tuple[yaml.Node, yaml.Node] | None:
    """(the node that names it, the value) of a mapping key or a list index."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if str(k.value) == str(key):
                return k, v
    elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
        if 0 <= key < len(node.value):
            return node.value[key], node.value[key]
    return None


def _too_many_nodes(path: str, line: int) -> SpecError:
    return SpecError(
        [
            f"{path}:{line}: the document expands to more than {MAX_NODES:,} nodes "
            "(a generated file, or nested aliases: a YAML bomb?); refused"
        ]
    )


def _check_events(text: str, path: str) -> None:
    """Depth and size limits on the event stream: bounded work whatever the text."""
    loader = SweepLoader(text)
    depth = nodes = 0
    try:
        while (event := loader.get_event()) is not None:
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1
                    raise SpecError([f"{path}:{line}: nested deeper than {MAX_DEPTH} levels"])
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                continue
            elif not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                continue
            nodes += 1
            if nodes > MAX_NODES:
                raise _too_many_nodes(path, event.start_mark.line + 1)
    finally:
        loader.dispose()


def _check_tree(node: yaml.Node, path: str) -> None:
    """Reject YAML bombs (aliases expanding past the limit) and duplicate keys."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node, depth: int) -> int:
        if depth > MAX_DEPTH:  # an alias used inside its own anchor, or stacked aliases
            raise SpecError([f"{path}:{n.start_mark.line + 1}: nested deeper than {MAX_DEPTH}"])
        if id(n) in sizes:  # an alias: count its expansion again, but compute it once
            return sizes[id(n)]
        total = 1
        if isinstance(n, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen and k.value != "<<":
                        raise SpecError(
                            [f"{path}:{k.start_mark.line + 1}: duplicate key {k.value!r}"]
                        )
                    seen.add(k.value)
                total += size(k, depth + 1) + size(v, depth + 1)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(size(v, depth + 1) for v in n.value)
        sizes[id(n)] = total
        if total > MAX_NODES:
            raise _too_many_nodes(path, n.start_mark.line + 1)
        return total

    size(node, 0)


def _yaml_problem(e: yaml.YAMLError, path: str) -> str:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}" if mark else path
        problem = e.problem or e.context or type(e).__name__
        return f"{where}: malformed YAML: {' '.join(str(problem).split())}"
    if isinstance(e, yaml.reader.ReaderError):
        return f"{path}: malformed YAML: {' '.join(str(e.reason).split())}"
    return f"{path}: malformed YAML: {' '.join(str(e).split())}"


def load_yaml(text: str, path: str = "<sweep>") -> tuple[Any, SourceMap]:
    """Safe-load one YAML document within the limits; returns (data, source map)."""
    try:
        text.encode()
    except UnicodeEncodeError:  # a command line's byte that is not UTF-8 (surrogate escape)
        raise SpecError([f"{path}: not UTF-8 text"]) from None
    try:
        _check_events(text, path)
        loader = SweepLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                raise SpecError([f"{path}: the file is empty"])
            _check_tree(node, path)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise SpecError([_yaml_problem(e, path)]) from None
    return data, SourceMap(path, node)
