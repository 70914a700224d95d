"""WSD with cooldown branches against cosine, side by side on CPU (issue 29).

    python benchmarks/wsd.py [--sweep sweeps/demo_wsd.yaml] [--out wsd.json] [--resamples 200]

The trials of `sweeps/demo_wsd.yaml` (dense nano/tiny/micro x 24.6k/49.2k/98.3k tokens:
budgets 1, 2 and 4x), trained in this process with the real job:
  (a) wsd (1-sqrt, 20% cooldown) through its cooldown branches (each size's trunk, then the
      shorter budgets from its checkpoints) against the same trials with the cosine
      schedule trained independently: the final validation loss per budget;
  (b) training compute spent with branching (the plan's count: a branch trains its
      cooldown only) against independent runs, and the wall time of both passes;
  (c) L(C) = E + A C^-alpha fitted to each schedule's nine final losses, with bootstrap
      intervals of alpha, and whether they overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from scalelab.jobs.config import JobConfig  # noqa: E402
from scalelab.orchestrator.plan.expand import Trial  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def wsd_trials(sweep: Path) -> list[Trial]:
    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.spec import parse_spec

    spec, source = parse_spec(sweep.read_text(), str(sweep))
    return expand(spec, source)


def cosine_of(job: JobConfig) -> JobConfig:
    """The same trial with the cosine schedule (same warm-up, lr, min_lr_ratio, data)."""
    data = job.model_dump(mode="json")
    for key in ("cooldown_fraction", "cooldown_shape", "branch", "branch_seeds"):
        data["train"].pop(key)
    data["train"]["schedule"] = "cosine"
    return JobConfig.model_validate(data)


def train_all(jobs: list[JobConfig]) -> tuple[dict[str, object], float]:
    from scalelab.jobs.training.train import run

    t0, results = time.perf_counter(), {}
    for job in jobs:
        results[job.trial_id] = run(job)
        assert results[job.trial_id].status == "FINISHED", results[job.trial_id]
    return results, time.perf_counter() - t0


def alpha_interval(flops: list[float], loss: list[float], resamples: int) -> dict[str, float]:
    import numpy as np

    from scalelab.analysis.scaling.bootstrap import bootstrap
    from scalelab.analysis.scaling.powerlaw import fit_power_law

    b = bootstrap(fit_power_law, np.array(flops), np.array(loss), n_resamples=resamples)
    a = b["alpha"]
    return {"alpha": a.estimate, "low": a.low, "high": a.high, "form": b.point.form}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", type=Path, default=ROOT / "sweeps" / "demo_wsd.yaml")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--resamples", type=int, default=200)
    args = p.parse_args()

    from scalelab.orchestrator.plan.branching import branches, saving

    home = Path(tempfile.mkdtemp(prefix="wsd-bench-"))
    os.environ["SCALELAB_HOME"] = str(home)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
    os.environ["SCALELAB_EXPERIMENT"] = "bench-wsd"
    trials = wsd_trials(args.sweep)
    found = branches(trials)
    trunks_first = [t for t in trials if t.trial_id not in found] + [
        t for t in trials if t.trial_id in found
    ]
    wsd, wsd_s = train_all([t.job for t in trunks_first])
    cos_jobs = {t.trial_id: cosine_of(t.job) for t in trials}
    cos, cos_s = train_all(list(cos_jobs.values()))

    rows = []
    for t in sorted(trials, key=lambda t: (t.n_params, t.tokens)):
        w, c = wsd[t.trial_id], cos[cos_jobs[t.trial_id].trial_id]
        rows.append({
            "size": t.size, "tokens": t.tokens, "flops": t.flops, "branched": t.trial_id in found,
            "wsd_val_loss": w.final_val_loss, "cosine_val_loss": c.final_val_loss,
            "wsd_minus_cosine": w.final_val_loss - c.final_val_loss,
        })  # fmt: skip
    s = saving(trials)
    fits = {}
    for name in ("wsd", "cosine"):
        fits[name] = alpha_interval([r["flops"] for r in rows],
                                    [r[f"{name}_val_loss"] for r in rows], args.resamples)  # fmt: skip
    overlap = (
        fits["wsd"]["low"] <= fits["cosine"]["high"]
        and fits["cosine"]["low"] <= fits["wsd"]["high"]
    )
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}",
        "rows": rows,
        "compute": {
            "independent_flops": s.independent,
            "spent_flops": s.spent,
            "saved_fraction": s.saved_fraction,
            "trunks": s.trunks,
            "branches": s.branches,
        },  # fmt: skip
        "wall_s": {"wsd_branched": wsd_s, "cosine_independent": cos_s},
        "fits": fits,
        "alpha_intervals_overlap": overlap,
    }
    print("| size | tokens | branched | wsd val loss | cosine val loss | wsd - cosine |")
    print("|---|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['size']} | {r['tokens']:,} | {'yes' if r['branched'] else 'trunk'} | "
              f"{r['wsd_val_loss']:.4f} | {r['cosine_val_loss']:.4f} | {r['wsd_minus_cosine']:+.4f} |")  # fmt: skip
    print(f"\ncompute: spent {s.spent:.4g} FLOPs with branching, {s.independent:.4g} independent "
          f"({s.saved_fraction:.1%} saved; {s.trunks} trunks, {s.branches} branches)")  # fmt: skip
    print(f"wall: wsd branched {wsd_s:.1f} s, cosine independent {cos_s:.1f} s")
    for name, f in fits.items():
        print(
            f"L(C) {name}: alpha {f['alpha']:.4g} [{f['low']:.4g}, {f['high']:.4g}] ({f['form']})"
        )
    print(f"alpha intervals overlap: {overlap}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
