"""The examples each `--help` ends with, by command path ("" is `scalelab` itself): one to
three command lines, a comment after two spaces and `#`. cli/help_format.py puts them under
the help page; tests/cli/test_help.py fails for a command that has none."""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "": (
        "scalelab submit sweeps/demo.yaml --dry-run  # the plan: trials, FLOPs, memory, time",
        "scalelab submit sweeps/demo.yaml  # run it, then fit and report",
        "scalelab sweeps  # the sweeps recorded so far",
    ),
    "models": (
        "scalelab models  # every size preset, dense and each mechanism",
        "scalelab models --size tiny --variant hadamard+tsa",
        "scalelab models --json",
    ),
    "variants": ("scalelab variants  # dense, hadamard, budget, tsa, hadamard+tsa, ...",),
    "train": (
        "scalelab train job.yaml  # one job file, one process",
        "scalelab train sweeps/demo.yaml --trial 3f2a  # one trial of a sweep",
    ),
    "submit": (
        "scalelab submit sweeps/demo.yaml --dry-run  # the plan; submits nothing",
        "scalelab submit sweeps/demo.yaml  # run it here and watch it",
        "scalelab submit sweeps/demo.yaml train.lr=3e-4 --detach  # a Ray job",
    ),
    "cancel": (
        "scalelab cancel demo  # every live trial of the sweep",
        "scalelab cancel demo dense-nano-98.3k 3f2a  # these trials only",
    ),
    "resume": ("scalelab resume demo  # its unfinished trials, as recorded",),
    "schema": ("scalelab schema > scalelab-sweep.schema.json  # for your editor",),
    "migrate": (
        "scalelab migrate demo --dry-run  # what would be re-keyed",
        "scalelab migrate demo",
    ),
    "sweeps": (
        "scalelab sweeps  # each sweep with its finished, failed, running trials",
        "scalelab sweeps --json",
    ),
    "status": (
        "scalelab status demo  # a table of its trials",
        "scalelab status demo --watch  # refresh until every trial is done",
        "scalelab status sweeps/demo.yaml --json",
    ),
    "logs": (
        "scalelab logs demo  # each trial's log with its last line",
        "scalelab logs demo dense-nano-98.3k --follow",
        "scalelab logs demo 3f2a --lines 200 --rank 1",
    ),
    "ui": (
        "scalelab ui demo  # MLflow's UI at the sweep's runs",
        "scalelab ui demo --port 5001  # another port; still 127.0.0.1 only",
    ),
    "generate": (
        'scalelab generate dense-nano-98.3k --prompt "def main"',
        'scalelab generate 3f2a --prompt "x" --temperature 0.8 --top-k 40 --num-samples 3',
    ),
    "eval": (
        "scalelab eval dense-nano-98.3k --tasks piqa,arc_easy  # one trial",
        "scalelab eval demo --tasks scalelab_zen  # every finished trial of a sweep",
        "scalelab eval 3f2a --tasks my_task.yaml --limit 20",
    ),
    "results": (
        "scalelab results report demo  # tables, plots, laws",
        "scalelab results forecast demo --target mini",
    ),
    "results sync": ("scalelab results sync demo  # MLflow and trials/* to Parquet",),
    "results query": (
        "scalelab results query demo --where \"variant == 'dense'\"",
        "scalelab results query demo --group-by variant,size --format csv -o out.csv",
    ),
    "results fit": (
        "scalelab results fit demo  # laws, their checks, gains vs dense",
        "scalelab results fit demo --budget 1e21,1e22 --json",
    ),
    "results plot": ("scalelab results plot demo  # PNGs, also on the sweep's MLflow run",),
    "results report": ("scalelab results report demo  # results/demo/report.md",),
    "results summary": ("scalelab results summary demo  # sync, fit, plot, report",),
    "results advise": (
        "scalelab results advise demo  # what to run next",
        "scalelab results advise demo --effect 0.05 --json",
    ),
    "results forecast": (
        "scalelab results forecast demo --target mini  # a larger size's loss",
        "scalelab results forecast demo --holdout micro  # backtest on a size",
        "scalelab results forecast demo --metric eval_piqa_acc --flops 1e22",
    ),
    "results import": (
        "scalelab results import benchmarks/data/chinchilla_ladder.csv --sweep chin",
        "scalelab results import ladder.csv --sweep chin --duplicates merge",
    ),
    "results compare": (
        "scalelab results compare demo --metric eval_piqa_acc  # each variant vs dense",
        "scalelab results compare demo -m final_val_loss --baseline hadamard",
    ),
    "data": ("scalelab data list",),
    "data prepare": (
        "scalelab data prepare builtin:pydoc --tokenizer gpt2",
        "scalelab data prepare hf:HuggingFaceFW/fineweb --tokenizer gpt2 --max-tokens 1000000000",
    ),
    "data list": ("scalelab data list  # each prepared source, its tokens and shards",),
}
