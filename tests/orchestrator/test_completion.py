"""Shell completion through the installed `scalelab` entry point, as bash asks for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scalelab.cli.completion import sweep_files

SCALELAB = Path(sys.executable).with_name("scalelab")


def complete(words: str, cwd: Path) -> list[str]:
    """What bash's completion function gets for the command line `words` (cursor at the end)."""
    env = dict(
        os.environ,
        _SCALELAB_COMPLETE="complete_bash",
        COMP_WORDS=words,
        COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    )
    done = subprocess.run(
        [str(SCALELAB)], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_commands_and_sweep_files_complete(tmp_path):
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "demo.yaml").write_text("name: demo\n")
    (tmp_path / "sweeps" / "notes.txt").write_text("not a sweep\n")
    assert complete("scalelab sub", tmp_path) == ["submit"]
    assert complete("scalelab submit sweeps/", tmp_path) == ["sweeps/demo.yaml"]
    assert complete("scalelab status sweeps/d", tmp_path) == ["sweeps/demo.yaml"]


def test_sweep_files_offers_folders_and_yaml_files_only(tmp_path, monkeypatch):
    (tmp_path / "sweeps").mkdir()
    (tmp_path / ".hidden").mkdir()
    for name in ("a.yaml", "b.yml", "c.json"):
        (tmp_path / "sweeps" / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert sweep_files("") == ["sweeps/"]
    assert sweep_files("sweeps/") == ["sweeps/a.yaml", "sweeps/b.yml"]
    assert sweep_files(f"{tmp_path}/sw") == [f"{tmp_path}/sweeps/"]
    assert sweep_files("no-such-folder/x") == []


def test_show_completion_prints_the_bash_script():
    done = subprocess.run(
        [str(SCALELAB), "--show-completion", "bash"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "_SCALELAB_COMPLETE=complete_bash" in done.stdout
    assert "complete " in done.stdout and "scalelab" in done.stdout
