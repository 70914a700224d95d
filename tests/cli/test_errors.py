"""Bad input to any command: one line on stderr, `error: ...`, exit code 2, and the user's
own text shown as written (cli/console.py prints it, never reads it as rich markup)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from scalelab.cli.main import app

BAD_INPUT = {
    "data prepare": (["data", "prepare", "/nonexistent/[bold]x[/bold].txt"], "[bold]x[/bold]"),
    "submit": (["submit", "/nonexistent/[red]sweep.yaml"], "[red]sweep.yaml"),
    "results query": (["results", "query", "any", "--format", "[xml]"], "'[xml]'"),
    "generate": (["generate", "any", "--prompt", "a", "--device", "[tpu]"], "'[tpu]'"),
}


@pytest.mark.parametrize("command", sorted(BAD_INPUT))
def test_bad_input_is_one_literal_error_line(command: str):
    args, literal = BAD_INPUT[command]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert literal in lines[0]
