"""Every check of the training job that needs no device runs at `submit` and `--dry-run`,
before any run exists, naming file:line: key; and a trial that still fails reports the
job's own message (issue 17, defect 5: these passed `--dry-run`, every trial failed, and
`status` showed `ray::scalelab-trial() (pid=..., ip=...)` where the reason should be)."""

from __future__ import annotations

import json
import os

import pytest
from faults.input_cli import one_line_error, runs_in, scalelab

SWEEP = """name: checks
base:
  model: {size: nano, vocab_size: 256, block_size: 64}
  data: {source: "builtin:pydoc", tokenizer: byte, seq_len: 64}
  train: {tokens: 4096, global_batch_tokens: 512}
  seed: 0
backend: {concurrency: 1, cpus_per_trial: 0.5, max_retries: 0}
"""

# (what, replace this, with this, the error: line, key, start of the message)
CASES = [
    ("seq_len above block_size", "block_size: 64", "block_size: 32",
     "4: base.data.seq_len: data.seq_len=64 exceeds model.block_size=32"),
    ("a data.source path component over 255 characters (issue 33, item 6)", '"builtin:pydoc"',
     '"/tmp/' + "a" * 300 + '/x.txt"', "4: base.data.source: data.source '/tmp/aaaa"),
    ("a vocabulary smaller than the tokenizer's", "vocab_size: 256", "vocab_size: 100",
     "3: base.model.vocab_size: tokenizer 'byte' has 256 tokens but model.vocab_size is 100"),
    ("a batch that is not whole sequences", "global_batch_tokens: 512", "global_batch_tokens: 500",
     "5: base.train.global_batch_tokens: train.global_batch_tokens=500 is not a multiple of "
     "data.seq_len=64"),
    ("a negative seed", "seed: 0", "seed: -1",
     "6: base.seed: Input should be greater than or equal to 0"),
    ("a batch that does not split across the ranks", "max_retries: 0}", "max_retries: 0, "
     "ranks_per_trial: 3}", "5: base.train.global_batch_tokens: the global batch of 8 sequences "
     "(train.global_batch_tokens / data.seq_len) does not divide across 3 ranks"),
    ("fp16 on CPU", "global_batch_tokens: 512}", "global_batch_tokens: 512, dtype: fp16}",
     "5: base.train.dtype: train.dtype='fp16' needs a GPU"),
    ("a batch larger than the budget", "global_batch_tokens: 512", "global_batch_tokens: 8192",
     "5: base.train.global_batch_tokens: train.global_batch_tokens=8,192 is more than the "
     "trial's budget of 4,096 tokens"),
    ("a batch beyond any run's (issue 33, item 5)", "global_batch_tokens: 512",
     f"global_batch_tokens: {10**30}", "5: base.train.global_batch_tokens: Input should be "
     "less than or equal to 1000000000"),
    ("a budget beyond any run's", "tokens: 4096,", "flops: 1.0e+40,",
     "5: base.train.flops: train.flops makes"),
    ("an empty variants list (issue 33, item 10)", "seed: 0\n", "seed: 0\nvariants: []\n",
     "7: variants: needs at least one variant"),
    ("a bad base value an axis sets (issue 33, item 10)", "size: nano,", "size: -1,",
     "3: base.model.size: Input should be a valid string"),
    ("a grid value is blamed at its own line", "seed: 0\n", "seed: 0\ngrid:\n  model.block_size:"
     " [64, 32]\n", "8: grid.model.block_size[1]: data.seq_len=64 exceeds model.block_size=32"),
]  # fmt: skip


@pytest.mark.parametrize(
    "old, new, expected", [c[1:] for c in CASES], ids=[c[0].replace(" ", "-") for c in CASES]
)
def test_a_trial_that_could_not_start_is_refused_before_any_run_exists(
    tmp_path, old, new, expected
):
    assert old in SWEEP
    path, home = tmp_path / "sweep.yaml", tmp_path / "home"
    path.write_text(SWEEP.replace(old, new, 1))
    planned = one_line_error(scalelab(home, "submit", path, "--dry-run"))
    assert planned.startswith(f"{path}:{expected}"), planned
    submitted = one_line_error(scalelab(home, "submit", path))
    assert submitted == planned
    assert runs_in(home) == 0 and not (home / "mlflow.db").exists()


def test_missing_data_is_planned_and_listed_as_a_blocker_that_a_submit_refuses(tmp_path):
    """Issue 27, item 7: data that is not here is no reason not to plan the sweep."""
    path, home = tmp_path / "sweep.yaml", tmp_path / "home"
    path.write_text(SWEEP.replace('"builtin:pydoc"', "/no/such/corpus.txt"))
    blocker = f"{path}:4: base.data.source: data.source '/no/such/corpus.txt': no such file"
    planned = scalelab(home, "submit", path, "--dry-run")
    assert planned.exit_code == 2 and "Traceback" not in planned.output
    assert "sweep checks: 1 trials on local" in planned.stdout
    assert "missing" in planned.stdout and f"  {blocker}" in planned.stdout
    assert "1 blocker(s)" in one_line_error(planned)
    assert one_line_error(scalelab(home, "submit", path)).startswith(blocker)
    assert runs_in(home) == 0 and not (home / "mlflow.db").exists()


def test_the_unchanged_sweep_passes_the_checks(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    result = scalelab(tmp_path / "home", "submit", path, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["trials"]) == 1


@pytest.fixture(scope="module")
def ray_home(tmp_path_factory):
    """One embedded Ray for the module, started with the module's work directory."""
    home = tmp_path_factory.mktemp("scalelab-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELAB_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        from scalelab.orchestrator.backends.base import ray_init

        owns = ray_init("local", embedded=True)
        yield home
        if owns:
            import ray

            ray.shutdown()


@pytest.mark.slow
def test_a_failed_trial_reports_the_jobs_message_not_rays_wrapper(tmp_path, ray_home):
    """The training job meets a data file that was there at submit time and is gone when it
    runs: the run's scalelab.error, `status` and the driver's summary give the job's message."""
    from scalelab.orchestrator.ledger import Ledger
    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.job_checks import check_trials
    from scalelab.orchestrator.plan.spec import parse_spec
    from scalelab.orchestrator.scheduler import run_sweep

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n" * 200)
    spec, source = parse_spec(SWEEP.replace('"builtin:pydoc"', str(corpus)), "sweep.yaml")
    trials = expand(spec, source)
    check_trials(spec, trials, source)  # fine at submit time
    os.remove(corpus)
    out = run_sweep(
        spec, trials, Ledger(spec.name), job="scalelab.jobs.training.train:run", poll_s=0.2
    )
    assert out.failed == [trials[0].trial_id]
    status = scalelab(ray_home, "status", spec.name, "--json")
    (row,) = json.loads(status.stdout)["trials"]
    assert row["status"] == "FAILED"
    assert row["error"].startswith(f"data.source '{corpus}': no such file or folder"), row
    assert "ray::" not in row["error"] and "Traceback" not in row["error"]


@pytest.mark.slow
def test_the_driver_prints_why_each_trial_failed(tmp_path, ray_home):
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP.replace("name: checks", "name: checks-summary"))
    result = scalelab(
        ray_home, "submit", path, "--job", "faults.input_cli:fails_like_bad_input", "--no-summary"
    )
    assert result.exit_code == 1, result.output
    status = json.loads(scalelab(ray_home, "status", "checks-summary", "--json").stdout)
    (row,) = status["trials"]
    message = f"data.source of trial {row['trial_id']} vanished before it ran"
    assert row["error"] == message
    printed = " ".join(result.stdout.split())  # however the console wrapped it
    assert f"({row['trial_id']}) failed after 1 attempt(s): {message}" in printed
    assert f"scalelab logs checks-summary {row['trial_id'][:8]}" in printed
