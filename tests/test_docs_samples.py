"""The docs' samples are what the code prints: the first sweep of docs/sweep-yaml.md is a
valid sweep of the trials it says, and the summary sample of docs/results.md is what
scripts/sample_outputs.py regenerates from a synthetic sweep (rerun the script after a change
to the summary's wording)."""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script():
    path = ROOT / "scripts" / "sample_outputs.py"
    spec = importlib.util.spec_from_file_location("sample_outputs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sample_outputs", module)
    spec.loader.exec_module(module)
    return module


def _first_sweep() -> tuple[str, str]:
    """The 'Your first sweep' section of docs/sweep-yaml.md and its first YAML block."""
    doc = (ROOT / "docs" / "sweep-yaml.md").read_text()
    section = doc.split("## Your first sweep\n", 1)[1].split("\n## ", 1)[0]
    return section, section.split("```yaml\n", 1)[1].split("```\n", 1)[0]


def test_the_first_sweep_comes_before_the_reference():
    doc = (ROOT / "docs" / "sweep-yaml.md").read_text()
    headings = [line for line in doc.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Your first sweep"
    assert doc.index("```yaml\n") > doc.index("## Your first sweep")  # its YAML is the first


def test_the_first_sweep_is_valid_and_has_the_trials_it_says(tmp_path, monkeypatch):
    from scalelab.orchestrator.door import load

    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    section, text = _first_sweep()
    path = tmp_path / "first.yaml"
    path.write_text(text)
    sweep = load(path)  # the real parser and the job's checks: raises SpecError
    said = int(re.search(r"= (\d+) trials", text)[1])
    assert len(sweep.trials) == said == 4
    assert f"{said} trials" in section.split("```yaml\n", 1)[0]  # the prose says it too
    assert {t.variant for t in sweep.trials} == {"dense", "hadamard"}
    assert sweep.spec.backend.kind == "local"
    assert not sweep.spec.backend.gpus_per_trial  # on CPU
    # the commands the section shows are the sweep's own
    name = sweep.name
    for command in (f"scalelab submit {path.name} --dry-run", f"scalelab submit {path.name}",
                    f"scalelab status {name}"):  # fmt: skip
        assert command in section, command


def test_the_sample_markers_are_well_formed():
    script = _script()
    found = script.docs_with_samples()
    names = [name for samples in found.values() for name in samples]
    assert sorted(names) == sorted(set(names)), "a sample name used twice"
    assert set(names) <= set(script.SAMPLES)
    assert "summary" in found.get(ROOT / "docs" / "results.md", {})


def test_the_summary_sample_is_what_the_summary_prints(tmp_path, monkeypatch):
    """Regenerates the synthetic sweep's summary (seconds, no training) and compares it with
    the docs' block, timings masked. On failure: python scripts/sample_outputs.py."""
    script = _script()
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    fresh = script.synthetic_summary(tmp_path / "home")
    shown = script.blocks((ROOT / "docs" / "results.md").read_text())["summary"]
    if script.normalise(shown) != script.normalise(fresh):
        pytest.fail(
            "docs/results.md's summary sample is stale: run `python scripts/sample_outputs.py`\n"
            + "\n".join(
                difflib.unified_diff(
                    script.normalise(shown).splitlines(),
                    script.normalise(fresh).splitlines(),
                    "docs",
                    "now",
                    lineterm="",
                )
            )
        )
