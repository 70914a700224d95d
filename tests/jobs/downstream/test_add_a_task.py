"""Adding a task is one file (docs/architecture.md, 'The doors'; docs/evaluation.md): a task
YAML, lm-eval's own format, with its data beside it, named on `--tasks` by its path (or put
in jobs/downstream/tasks/ to ship it by name). Nothing else registers it: the file is
scored through lm-eval, each item's answer being the choice the model finds most likely."""

from __future__ import annotations

import json
from pathlib import Path

from varied_models import varied_model

from scalelab.jobs.data.tokenizers import load_tokenizer
from scalelab.jobs.downstream.adapter import TrialLM
from scalelab.jobs.downstream.score_trial import evaluate

ITEMS = [
    {"question": "Paris is in", "choices": ["France", "Peru", "Chad"], "label": 0},
    {"question": "Lima is in", "choices": ["Spain", "Peru", "Mali"], "label": 1},
    {"question": "Oslo is in", "choices": ["Norway", "Japan", "Iran"], "label": 0},
    {"question": "Quito is in", "choices": ["Cuba", "Fiji", "Ecuador"], "label": 2},
    {"question": "Rome is in", "choices": ["Italy", "Laos", "Oman"], "label": 0},
]


def _task_file(folder: Path) -> Path:
    with (folder / "capitals.jsonl").open("w") as f:
        for item in ITEMS:
            f.write(json.dumps(item) + "\n")
    task = folder / "capitals.yaml"
    task.write_text(
        "task: my_capitals\ndataset_path: json\n"
        "dataset_kwargs:\n  data_files:\n    test: capitals.jsonl\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: choices\ndoc_to_target: label\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return task


def test_a_task_yaml_of_ones_own_is_scored_by_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    task = _task_file(tmp_path)
    model, byte = varied_model("dense", seed=3, vocab=256), load_tokenizer("byte")
    (scores,) = evaluate(model, byte, [str(task)], batch_size=4)
    assert scores.task == "my_capitals"
    lm = TrialLM(model, byte, batch_size=4)
    right = 0
    for item in ITEMS:  # the answer lm-eval must have taken: the most likely choice
        context = lm.tok_encode(item["question"])  # lm-eval's target delimiter: one space
        pairs = [(None, context, lm.tok_encode(" " + c)) for c in item["choices"]]
        logps = lm._loglikelihood_tokens(pairs, disable_tqdm=True)
        best = max(range(len(pairs)), key=lambda i: logps[i][0])
        right += best == item["label"]
    assert scores.metrics["eval/my_capitals/acc"] == right / len(ITEMS)
