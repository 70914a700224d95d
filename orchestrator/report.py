"""One Markdown report per sweep: the gains, the fitted laws, per-size differences, the plots
and the trials, ready to paste into a paper draft (results/<sweep>/report.md).

`summarise_sweep` is the whole tail of a sweep (sync, fit, plots, report) in one call,
returning the text the CLI prints.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.results.render import markdown_table, sections

if TYPE_CHECKING:
    from orchestrator.results.fit import SweepFit


def write_report(
    fit: SweepFit, plots: dict[str, Path], out_dir: Path, tracking_uri: str = ""
) -> Path:
    """Write out_dir/report.md (plots linked relative to it); return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"# Scaling results: sweep `{fit.sweep}`", ""]
    md.append(
        f"{fit.n_used} of {fit.n_trials} trials used (FINISHED, finite `{fit.loss}`); "
        f"variants: {', '.join(fit.variants)}; baseline: `{fit.baseline}`; "
        f"intervals: {fit.level:.0%} bootstrap over trials. "
        f"Generated {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}."
    )
    if fit.gains:
        md += ["", "**Headline.** " + "; ".join(str(g) + "." for g in fit.gains)]
    for title, (head, rows) in sections(fit):
        md += ["", f"## {title}", "", markdown_table(head, rows)]
    if plots:
        md += ["", "## Plots", ""]
        for name, path in plots.items():
            rel = path.relative_to(out_dir) if path.is_relative_to(out_dir) else path
            md += [f"### {name.replace('_', ' ')}", "", f"![{name}]({rel.as_posix()})", ""]
    md += ["", "## Trials", "", markdown_table(*_trial_rows(fit))]
    if fit.notes:
        md += ["", "## Notes", ""] + [f"- {n}" for n in fit.notes]
    md += [
        "",
        "## Definitions",
        "",
        f"- Gain m: the variant reaches the loss L* with m × the FLOPs the {fit.baseline} "
        f"needs (m < 1: cheaper). L* is the {fit.baseline} law's loss at the largest compute "
        "both ran; laws L(C) = E + A·C^-alpha share E (docs/scaling.md).",
        "- FLOPs are model FLOPs of training (forward + backward), not hardware peak.",
    ]
    if tracking_uri:
        md.append(f"- MLflow: `{tracking_uri}`, experiment `{fit.sweep}`.")
    path = out_dir / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


def _trial_rows(fit: SweepFit) -> tuple[list[str], list[list[str]]]:
    t = fit.table
    head = ["trial", "variant", "size", "params", "tokens", "FLOPs", fit.loss, "wall s"]
    rows = []
    for r in t.select(
        ["trial_id", "variant", "size", "n_params", "tokens", "flops", fit.loss, "wall_time_s"]
    ).to_pylist():
        wall = r["wall_time_s"]
        rows.append(
            [
                f"`{r['trial_id'][:8]}`", r["variant"], r["size"], f"{r['n_params']:,}",
                f"{r['tokens']:.3g}", f"{r['flops']:.3g}", f"{r[fit.loss]:.4f}",
                "" if wall is None or not np.isfinite(wall) else f"{wall:.0f}",
            ]
        )  # fmt: skip
    return head, rows


def mlflow_ui_hint(uri: str) -> str:
    if uri.startswith(("http://", "https://")):
        return f"open {uri} in a browser"
    return f"mlflow ui --backend-store-uri '{uri}'  (then open http://127.0.0.1:5000)"


def summarise_sweep(
    sweep: str,
    tracking_uri: str | None = None,
    *,
    baseline: str = "dense",
    n_resamples: int = 1000,
    root: Path | None = None,
    width: int = 120,
) -> str:
    """Sync, fit, plot (files + MLflow artifacts) and report; return the printed summary:
    the gains with intervals, the plot and report paths, and how to open the MLflow UI.

    An unknown sweep raises ResultsError; a sweep the fits cannot support still returns a
    summary that says why."""
    from rich.console import Console

    from jobs import paths
    from orchestrator import plots as plotting
    from orchestrator.results import load_curves, sweep_dir, sync
    from orchestrator.results.fit import fit_sweep
    from orchestrator.results.render import rich_tables
    from orchestrator.results.sources import find_sweep_runs
    from orchestrator.results.store import ResultsError

    uri = tracking_uri or paths.tracking_uri()
    synced = sync(sweep, uri, root=root)
    cache = sweep_dir(sweep, root) / "summary.cache.json"
    key = _summary_key(sweep, root, baseline, n_resamples, width)
    if cache.exists() and (cache.parent / "report.md").exists():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:  # same trials, same options: the same fits and files
            return f"{synced}\n{cached['text']}"
    console = Console(record=True, width=width, file=io.StringIO())
    try:
        fit = fit_sweep(sweep, baseline=baseline, n_resamples=n_resamples, root=root)
    except ResultsError as e:
        console.print(f"no fit: {e}")
        console.print(f"MLflow UI: {mlflow_ui_hint(uri)}")
        return f"{synced}\n{console.export_text()}"
    out = sweep_dir(sweep, root)
    files = plotting.make_plots(fit, load_curves(sweep, root), out / "plots")
    plotting.log_plots(find_sweep_runs(sweep, uri).parent_run_id, files, uri)
    report = write_report(fit, files, out, uri)
    for table in rich_tables(fit)[:1] if fit.gains else rich_tables(fit)[:2]:
        console.print(table)
    for note in fit.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"plots: {out / 'plots'} ({', '.join(files)})", highlight=False)
    console.print(f"report: {report}", highlight=False)
    console.print(f"MLflow UI: {mlflow_ui_hint(uri)}", highlight=False)
    text = console.export_text()
    cache.write_text(json.dumps({"key": key, "text": text}))
    return f"{synced}\n{text}"


def _summary_key(sweep: str, root: Path | None, *options: object) -> str:
    """A digest of the synced trials table and the fit options."""
    import hashlib

    import pyarrow as pa

    from orchestrator.results import load_trials

    sink = pa.BufferOutputStream()
    table = load_trials(sweep, root)
    table = table.sort_by("trial_id") if "trial_id" in table.column_names else table
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    digest = hashlib.sha256(sink.getvalue().to_pybytes())
    digest.update(repr(options).encode())
    return digest.hexdigest()
