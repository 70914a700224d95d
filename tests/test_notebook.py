"""docs/notebook.md's worked example runs as written: its Python blocks, in order, in a fresh
interpreter (plan -> submit a tiny sweep -> status -> results -> fit -> plot)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _blocks(doc: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```\n", doc.read_text(), flags=re.S)


@pytest.mark.slow
@pytest.mark.distributed
def test_the_notebook_example_runs_as_written(tmp_path, monkeypatch):
    blocks = _blocks(ROOT / "docs" / "notebook.md")
    assert len(blocks) >= 4  # plan, submit, results, fit
    (tmp_path / "sweeps").symlink_to(ROOT / "sweeps")  # the doc's relative path
    script = tmp_path / "notebook.py"
    script.write_text("\n".join(blocks))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env |= {"SCALELAB_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=480,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "8 trials" in out and "8 of 8 trials to train" in out
    assert "finished: 8 failed: 0" in out
    gain = re.search(r"hadamard: (\d+\.\d\d)x dense's compute \[(\d+\.\d\d), (\d+\.\d\d)\]", out)
    assert gain, out
    estimate, low, high = map(float, gain.groups())
    assert 0 < low <= estimate <= high
    assert (tmp_path / "loss_vs_flops.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    import scalelab

    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    trials = scalelab.results("notebook", sync=False)  # the tables the example synced
    assert trials.num_rows == 8
    assert set(trials["status"].to_pylist()) == {"FINISHED"}
