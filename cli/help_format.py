"""How `--help` reads: placeholders a user types, prose that wraps to the terminal, and each
command's examples (cli/examples.py).

Typer (0.29 on) shows a parameter's Python type where a placeholder goes (`--dry-run
<bool>`, `<list[str]>`, `<int range>`) and a required argument in braces (`{sweep}`). Here
every placeholder is what the user types instead: SWEEP, TRIAL, N (a whole number), NUMBER,
FILE, DIR, the choices (`refuse|merge|keep`), else the option's name in capitals (`--sweep
SWEEP`); a flag shows none. `install()` sets this up once, for every command (cli/main.py);
on an older typer, whose placeholders were already words, it changes nothing.
`HelpGroup`, the app's group, gives each command its examples and unwraps the docstrings'
hard line breaks, so prose wraps to the terminal's width.
"""

from __future__ import annotations

import re
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperArgument, TyperGroup, TyperOption

from scalelab.cli.examples import EXAMPLES

_TYPE = re.compile(r"^<(?P<label>.*)>$")
_NUMBERS = {"int": "N", "int range": "N", "float": "NUMBER", "float range": "NUMBER"}
_PATHS = {"path": "PATH", "file": "FILE", "directory": "DIR", "dir": "DIR"}


def placeholder(param: Any, label: str) -> str | None:
    """The word shown for a value of `param`, from typer's type label ("int", "list[str]",
    "refuse|merge|keep"); None for a flag."""
    label = label.removeprefix("list[").removesuffix("]") if label.startswith("list[") else label
    if "|" in label:
        return label
    if label == "bool" or getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if label in _NUMBERS:
        return _NUMBERS[label]
    if label in _PATHS:
        return _PATHS[label]
    longs = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    name = longs[0].removeprefix("--") if longs else (param.name or "value")
    return name.replace("-", "_").upper()


def _label(param: Any, ctx: Any) -> str:
    shown = _ORIGINAL["display_type"](param, ctx) or ""
    found = _TYPE.match(shown)
    return found["label"] if found else shown


def _option_placeholder(self: Any, ctx: Any) -> str | None:
    if self.metavar is not None:
        return self.metavar
    return placeholder(self, _label(self, ctx))


def _argument_name(self: Any) -> str:
    return self.metavar if self.metavar is not None else (self.name or "").upper()


def _argument_usage(self: Any) -> str:
    name = self.display_name_raw
    if not self.required:
        name = f"[{name}]"
    return f"{name}..." if self.nargs != 1 else name


_ORIGINAL: dict[str, Any] = {}


def install() -> None:
    """Readable placeholders in every help page (idempotent; nothing on an older typer)."""
    if _ORIGINAL or not all(
        hasattr(TyperOption, "display_type") and hasattr(cls, attr)
        for cls, attr in (
            (TyperOption, "display_type_rich"),
            (TyperArgument, "display_type_rich"),
            (TyperArgument, "_usage_display_name"),
            (TyperArgument, "display_name_raw"),
        )
    ):
        return
    _ORIGINAL["display_type"] = TyperOption.display_type
    TyperOption.display_type_rich = _option_placeholder
    TyperArgument.display_type_rich = lambda self, ctx: None  # the name says it: SWEEP
    TyperArgument.display_name_raw = property(_argument_name)
    TyperArgument._usage_display_name = _argument_usage


def unwrapped(text: str | None) -> str | None:
    """A docstring's paragraphs, each on one line (so rich wraps it to the terminal); a
    paragraph of indented lines (a list, an example) is kept as it is."""
    if not text:
        return text
    paragraphs = [p.strip("\n") for p in text.split("\n\n")]
    kept = []
    for p in paragraphs:
        lines = p.splitlines()
        indented = len(lines) > 1 and all(line.startswith(" ") for line in lines[1:])
        kept.append(p if indented else " ".join(line.strip() for line in lines))
    return "\n\n".join(kept)


def examples_text(lines: tuple[str, ...]) -> str:
    """The `Examples:` block under a help page: one command a line, its comment after `#`."""
    width = max(len(line.partition("  # ")[0]) for line in lines)
    shown = []
    for line in lines:
        command, _, comment = line.partition("  # ")
        shown.append(f"  {command:<{width}}  # {comment}" if comment else f"  {command}")
    return "Examples:\n" + escape("\n".join(shown))


class HelpGroup(TyperGroup):
    """The app's group: on building it, every command below it gets its examples (a
    command without any is a failing test: tests/cli/test_help.py) and unwrapped prose."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _dress(self, ())


def _dress(command: Any, path: tuple[str, ...]) -> None:
    command.help = unwrapped(command.help)
    lines = EXAMPLES.get(" ".join(path))
    if lines and not command.epilog:
        command.epilog = examples_text(lines)
    for name, sub in getattr(command, "commands", {}).items():
        _dress(sub, (*path, name))


def version_option() -> Any:
    """`--version`: print scalelab's version and exit."""

    def show(value: bool) -> None:
        if value:
            print(f"scalelab {package_version()}")
            raise typer.Exit()

    return typer.Option(
        False, "--version", callback=show, is_eager=True, help="Print scalelab's version and exit."
    )


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scalelab")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"
