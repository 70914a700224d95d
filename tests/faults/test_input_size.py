"""A sweep's size is checked from its axes before anything is expanded or created
(issue 17, defect 4: a 100 x 100 x 1000 grid made `--dry-run` grow ~34 MB/s with no
output; a 20 x 1000 grid started creating runs without asking)."""

from __future__ import annotations

import itertools
import json

from faults.input_cli import deadline, one_line_error, runs_in, scalelab

from scalelab.cli import sweeps as commands
from scalelab.orchestrator.plan.spec import parse_spec


def grid_sweep(name: str, axes: dict[str, list]) -> str:
    grid = "".join(f"  {key}: {json.dumps(values)}\n" for key, values in axes.items())
    return f"""name: {name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: 4096, global_batch_tokens: 512}}
grid:
{grid}"""


HUGE = {
    "seed": list(range(100)),
    "train.lr": [round(1e-4 * (i + 1), 6) for i in range(100)],
    "train.tokens": [4096 * (i + 1) for i in range(1000)],
}


def test_a_ten_million_trial_grid_is_refused_from_its_axes_at_once(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text(grid_sweep("huge", HUGE))
    with deadline(30):  # before: it expanded every combination, growing without end
        result = scalelab(tmp_path / "home", "submit", path, "--dry-run")
    line = one_line_error(result)
    rows = path.read_text().splitlines()
    tokens_line = next(i for i, row in enumerate(rows, 1) if row.startswith("  train.tokens:"))
    assert line.startswith(f"{path}:{tokens_line}: 10,000,000 trial combinations")
    assert "grid.seed 100 x grid.train.lr 100 x grid.train.tokens 1,000" in line
    assert "--max-trials 10000000" in line


def test_a_20_by_1000_grid_submits_nothing(tmp_path):
    path = tmp_path / "wide.yaml"
    axes = {"seed": list(range(20)), "train.tokens": [4096 * (i + 1) for i in range(1000)]}
    path.write_text(grid_sweep("wide", axes))
    home = tmp_path / "home"
    with deadline(60):  # before: it created SCHEDULED runs, about 16 a second
        result = scalelab(home, "submit", path)
    assert "20,000 trial combinations" in one_line_error(result)
    assert runs_in(home) == 0 and not (home / "mlflow.db").exists()


def test_max_trials_raises_the_limit_and_a_big_plan_shows_its_progress(tmp_path, monkeypatch):
    path = tmp_path / "big.yaml"
    axes = {"seed": list(range(30)), "train.lr": [round(1e-4 * (i + 1), 6) for i in range(50)]}
    path.write_text(grid_sweep("big", axes))
    home = tmp_path / "home"
    refused = one_line_error(scalelab(home, "submit", path, "--dry-run"))
    assert "1,500 trial combinations" in refused and "limit of 1,000" in refused
    monkeypatch.setattr(commands, "PROGRESS_FROM", 1_000)  # the progress of a big sweep
    result = scalelab(home, "submit", path, "--dry-run", "--json", "--max-trials", "1500")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["trials"]) == 1_500
    assert "sweep big: expanding 1,500 combinations" in result.stderr
    assert "sweep big: 1,500 trials" in result.stderr
    assert not (home / "mlflow.db").exists()


def test_expansion_streams_trials_without_walking_the_whole_product():
    from scalelab.orchestrator.plan.expand import iter_trials

    spec, source = parse_spec(grid_sweep("huge", HUGE), "huge.yaml")
    with deadline(10):
        first = list(itertools.islice(iter_trials(spec, source), 5))
    assert len({t.trial_id for t in first}) == 5
    assert spec.combinations == 10_000_000
