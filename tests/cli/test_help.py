"""Every command's and subcommand's `--help` exits 0 with a help page (issue 27, item 9:
rich read `[/<config>]` in `data prepare`'s help as markup and crashed). In-process,
walking typer's command tree, so a command added later is covered too."""

from __future__ import annotations

from typing import Any

import typer
from typer.testing import CliRunner

from scalelab.cli.main import app


def _paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The command's path and every subcommand's (a group has `commands`)."""
    paths = [prefix]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _paths(sub, (*prefix, name))
    return paths


def test_every_help_page_renders():
    paths = _paths(typer.main.get_command(app))
    assert ("data", "prepare") in paths and ("status",) in paths and len(paths) >= 15
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        shown = " ".join(("scalelab", *path))
        assert result.exit_code == 0, f"{shown} --help: {result.output}{result.exception!r}"
        assert "Usage:" in result.output and len(result.output.splitlines()) > 3, shown
