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


PYTHON_TYPES = ("<bool>", "<str>", "<int>", "<float>", "<path>", "<list[", " range>")


def test_every_help_page_shows_examples_and_placeholders_a_user_types():
    runner = CliRunner()
    for path in _paths(typer.main.get_command(app)):
        shown = " ".join(("scalelab", *path))
        page = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100"}).output
        examples = page.partition("Examples:")[2]
        assert shown + " " in examples or (not path and "scalelab " in examples), shown
        for label in PYTHON_TYPES:
            assert label not in page, f"{shown} --help shows {label}"
        usage = next(line for line in page.splitlines() if "Usage:" in line)
        arguments = usage.partition("[OPTIONS]")[2]  # SWEEP [TRIAL]..., not {sweep} [trials]
        assert "{" not in usage and arguments == arguments.upper(), usage
    page = runner.invoke(app, ["status", "--help"], env={"COLUMNS": "100"}).output
    assert "status [OPTIONS] SWEEP [TRIAL]..." in page
    rows = {line.split()[1]: line.split()[2] for line in page.splitlines() if "│ --" in line}
    assert rows["--interval"] == "NUMBER" and rows["--json"] == "Print"  # a flag: no placeholder


def test_internal_options_are_hidden_but_work():
    runner = CliRunner()
    assert "--job" not in runner.invoke(app, ["submit", "--help"]).output
    result = runner.invoke(app, ["submit", "missing.yaml", "--job", "x:y", "--dry-run"])
    assert "No such option" not in result.output and result.exit_code == 2


def test_version_prints_the_package_version():
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"scalelab {version('scalelab')}\n"
