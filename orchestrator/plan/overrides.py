"""Command-line overrides of a sweep file: `scalelab submit sweep.yaml train.lr=3.0e-4
backend.concurrency=4`.

An override sets one key of the file's data before it is validated, so it is checked like
the file (an error names the override instead of a line) and a trial it makes is the same
trial, with the same id, as one whose file says the same. The key is a dotted path from
the top of the sweep (`backend.concurrency`, `description`); a key that is not a sweep
section is a key of `base` (`train.lr` = `base.train.lr`); under `grid` and `zip` the rest
is one axis key (`grid.train.lr=[1.0e-3, 3.0e-3]`). The value is YAML, read like the file's
values (`3.0e-4` is a number; YAML 1.1 reads `3e-4` as text, in the file too).
"""

from __future__ import annotations

from typing import Any

from scalelab.orchestrator.plan.sweep_file import MAX_DEPTH, SourceMap, SpecError, load_yaml

AXIS_SECTIONS = ("grid", "zip")


def parse_override(text: str, sections: set[str]) -> tuple[tuple[str, ...], Any]:
    """'train.lr=3.0e-4' -> (('base', 'train', 'lr'), 0.0003)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    shown = text if len(text) <= 120 else text[:120] + "..."
    if not sep or not key or any(not part for part in key.split(".")):
        raise SpecError([f"override {shown!r}: expected KEY=VALUE, e.g. train.lr=3.0e-4"])
    if key.count(".") >= MAX_DEPTH:  # the file's own limit
        raise SpecError([f"override {shown!r}: a key nested deeper than {MAX_DEPTH} levels"])
    head, *rest = key.split(".")
    if head in AXIS_SECTIONS and rest:
        path: tuple[str, ...] = (head, ".".join(rest))
    elif head in sections:
        path = (head, *rest)
    else:
        path = ("base", head, *rest)
    value, _ = load_yaml(raw if raw.strip() else "null", f"override {text!r}")
    return path, value


def apply_overrides(
    data: dict[str, Any], source: SourceMap, overrides: list[str], sections: set[str]
) -> tuple[dict[str, Any], SourceMap, list[str]]:
    """The file's data with the overrides set, a source map that names an override where
    an error is about a key it set, and the overrides that could not be set (one line each,
    reported with the validation's problems)."""
    if not overrides:
        return data, source, []
    problems, where = [], {}
    for text in overrides:
        try:
            path, value = parse_override(text, sections)
        except SpecError as e:
            problems += e.problems
            continue
        axis = _swept_by(data, path)
        if axis:
            problems.append(
                f"override {text!r}: {'.'.join(path[1:])} is swept by {axis}; override the "
                f"axis instead, e.g. {axis}=[...]"
            )
            continue
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
        where[path] = text
    return data, OverriddenSource(source, where), problems


def _swept_by(data: dict[str, Any], path: tuple[str, ...]) -> str:
    """'grid.train.lr' when a base key is also an axis (the axis would win)."""
    if path[0] != "base":
        return ""
    key = ".".join(path[1:])
    for section in AXIS_SECTIONS:
        axes = data.get(section)
        if isinstance(axes, dict) and key in axes:
            return f"{section}.{key}"
    return ""


class OverriddenSource(SourceMap):
    """A file's source map, except that keys set on the command line are named by their
    override ('override train.lr=abc') rather than by a line of the file."""

    def __init__(self, source: SourceMap, overrides: dict[tuple[str, ...], str]) -> None:
        super().__init__(source.path, source.root)
        self.overrides = overrides

    def where(self, keys: tuple[Any, ...]) -> str:
        for path, text in self.overrides.items():
            if tuple(str(k) for k in keys[: len(path)]) == path:
                return f"override {text!r}"
        return super().where(keys)
