"""Regenerate the sample outputs the docs show, from real runs of the code that prints them.

    python scripts/sample_outputs.py            # the samples that take seconds
    python scripts/sample_outputs.py --demo     # also the demo's summary (`make demo`, ~3 min)
    python scripts/sample_outputs.py --check    # say which samples are stale, change nothing

Each sample sits in a doc between two markers, a fenced block between them:

    <!-- sample: NAME -->
    ```
    ...
    ```
    <!-- /sample -->

and is rewritten in place. `summary` is the end-of-sweep summary (`summarise_sweep`, which
`scalelab submit` prints when a sweep ends) of a synthetic sweep: real MLflow runs and trial
folders written as a sweep writes them, with losses drawn from a known law
(tests/orchestrator/synthetic_sweep.py), so it takes seconds and no training. `demo` is the
summary `make demo` prints, measured from the real demo sweep in a fresh work directory.
tests/test_docs_samples.py regenerates `summary` and fails when the docs' block differs
(after `normalise`): a change to the summary's wording is rerun here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SYNTHETIC = ROOT / "tests" / "orchestrator"

# The synthetic sweep of the `summary` sample: the demo's variants, with known compute
# multipliers (hadamard reaches dense's loss with 0.8x its FLOPs; budget and tsa match it),
# four sizes (the forecast backtest holds the largest out) and two token budgets: 32 trials
SWEEP = "synthetic"
MULTIPLIERS = {"dense": 1.0, "hadamard": 0.8, "budget": 1.0, "tsa": 1.0}
SIZES = ("nano", "tiny", "micro", "mini")
TOKENS_PER_PARAM = (10, 20)
RUN_TIME_S = 60.0  # each trial's recorded wall time: what the `next:` lines are priced on
N_RESAMPLES = 100
WIDTH = 160
HOME_SHOWN = "scalelab-runs"  # the work directory as the sample shows it (the default)

START = re.compile(r"<!-- sample: (?P<name>[\w-]+) -->\n")
END = "<!-- /sample -->"


def synthetic_summary(home: Path) -> str:
    """The summary of the synthetic sweep, written into the empty work directory `home`,
    with `home` shown as the default `scalelab-runs`."""
    os.environ["SCALELAB_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if str(SYNTHETIC) not in sys.path:
        sys.path.insert(0, str(SYNTHETIC))
    from mlflow import MlflowClient
    from synthetic_sweep import write_sweep

    from scalelab.analysis.report import summarise_sweep
    from scalelab.analysis.results.sources import find_sweep_runs
    from scalelab.contract.runs import Tag
    from scalelab.contract.workdir import tracking_uri

    write_sweep(
        SWEEP,
        sizes=SIZES,
        multipliers=MULTIPLIERS,
        tokens_per_param=TOKENS_PER_PARAM,
        steps=4,
        run_time_s=RUN_TIME_S,
    )
    # the sweep file on the parent run, as a submit records it: a CPU sweep, so the `next:`
    # lines are priced in CPU-hours
    spec = (ROOT / "sweeps" / "demo.yaml").read_text().replace("name: demo", f"name: {SWEEP}")
    parent = find_sweep_runs(SWEEP, tracking_uri()).parent_run_id
    MlflowClient(tracking_uri()).set_tag(parent, Tag.SPEC_YAML, spec)
    text = summarise_sweep(SWEEP, n_resamples=N_RESAMPLES, width=WIDTH)
    return text.replace(str(home), HOME_SHOWN)


def demo_summary(home: Path) -> str:
    """What `scalelab submit sweeps/demo.yaml` prints after its progress bar, in the empty
    work directory `home` (the real demo: ~3 minutes on 2 cores)."""
    env = {**os.environ, "SCALELAB_HOME": str(home), "COLUMNS": "160"}
    env.pop("MLFLOW_TRACKING_URI", None)
    scalelab = Path(sys.executable).with_name("scalelab")
    run = subprocess.run(
        [str(scalelab), "submit", str(ROOT / "sweeps" / "demo.yaml")],
        env=env, capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("verdict:"))
    return "\n".join(lines[start:]).replace(str(home), HOME_SHOWN) + "\n"


def normalise(text: str) -> str:
    """What legitimately differs between two runs of one sample: timings and trailing
    spaces."""
    text = re.sub(r"\bin \d+(\.\d+)? s\b", "in <t> s", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


SAMPLES: dict[str, Callable[[Path], str]] = {"summary": synthetic_summary, "demo": demo_summary}
SLOW = {"demo"}


def blocks(text: str) -> dict[str, str]:
    """The samples of a doc, by name: the text inside each one's fenced block."""
    out = {}
    for m in START.finditer(text):
        body = text[m.end() : text.index(END, m.end())]
        fence = re.match(r"```[^\n]*\n(?P<inner>.*)```\n?$", body, re.DOTALL)
        if fence is None:
            raise ValueError(f"sample {m['name']}: no fenced block between its markers")
        out[m["name"]] = fence["inner"]
    return out


def replace(text: str, name: str, sample: str) -> str:
    """`text` with the sample `name`'s block replaced by `sample`."""
    m = re.search(rf"<!-- sample: {re.escape(name)} -->\n", text)
    if m is None:
        raise ValueError(f"no sample {name!r}")
    end = text.index(END, m.end())
    lines = [line.rstrip() for line in sample.strip("\n").splitlines()]
    body = "```\n" + "\n".join(lines) + "\n```\n"
    return text[: m.end()] + body + text[end:]


def docs_with_samples() -> dict[Path, dict[str, str]]:
    found = {}
    for path in sorted(DOCS.rglob("*.md")):
        names = blocks(path.read_text())
        if names:
            found[path] = names
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true", help="also run the demo (~3 min)")
    parser.add_argument("--check", action="store_true", help="report stale samples only")
    args = parser.parse_args(argv)
    wanted = [n for n in SAMPLES if args.demo or n not in SLOW]
    stale = []
    with tempfile.TemporaryDirectory(prefix="scalelab-samples-") as tmp:
        fresh = {name: SAMPLES[name](Path(tmp) / name) for name in wanted}
    for path, found in docs_with_samples().items():
        text = path.read_text()
        for name in set(found) & set(fresh):
            if normalise(found[name]) == normalise(fresh[name]):
                continue
            stale.append(f"{path.relative_to(ROOT)}: {name}")
            text = replace(text, name, fresh[name])
        if not args.check:
            path.write_text(text)
    for line in stale:
        print(("stale: " if args.check else "rewritten: ") + line)
    if not stale:
        print(f"up to date: {', '.join(wanted)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
