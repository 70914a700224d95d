"""One Markdown report per sweep: the gains by both estimators, what to run next, the fitted
laws and their checks, the forecast backtest, per-cell differences, the plots and the
trials, ready to paste into a paper draft (results/<sweep>/report.md).

`summarise_sweep` is the whole tail of a sweep (sync, fit, plots, report) in one call,
returning the text the CLI prints.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scalelab.analysis.results.render import markdown_sections, markdown_table

# Part of the summary cache's key: a summary cached by an older layout is made again.
SUMMARY_FORMAT = 5  # 5: the report has a tuned sweep's gains at both rates

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scalelab.analysis.results.fit import SweepFit
    from scalelab.analysis.scaling import Interval


def write_report(
    fit: SweepFit,
    plots: dict[str, Path],
    out_dir: Path,
    tracking_uri: str = "",
    tuned: Sequence[str] = (),
) -> Path:
    """Write out_dir/report.md (plots linked relative to it) and report.html beside it (the
    same page, its plots embedded: one file to open in a browser); return report.md's path.
    `tuned`: a tuned sweep's gains at both rates (results/tuned_gain.py), after the verdict."""
    from scalelab.analysis.report_html import report_html
    from scalelab.analysis.results.verdict import verdict_lines

    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"# Scaling results: sweep `{fit.sweep}`", ""]
    md.append(
        f"{fit.n_used} of {fit.n_trials} trials used (FINISHED, finite `{fit.loss}`); "
        f"variants: {', '.join(fit.variants)}; baseline: `{fit.baseline}` "
        f"({_parametrization(fit)}); "
        f"intervals: {fit.level:.0%}, Student-t for the paired gains, the L(C) laws and the "
        "forecast, bootstrap over trials for the unpaired gains and L(N, D) "
        f"(Huber δ {fit.huber_delta:g} on log loss). "
        + (f"Trials filtered by `{fit.where}`. " if fit.where else "")
        + f"Generated {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}."
    )
    verdict = verdict_lines(fit)
    if verdict:
        head = verdict[0].removeprefix("verdict: ")
        md += ["", f"**Verdict: {head}.**", ""]
        md += [f"- {line.strip()}" for line in verdict[1:]]
    if tuned:
        md += ["", "**At each variant's own tuned rate, and at the baseline's.**", ""]
        md += [f"- {line.removeprefix('tuned: ')}" for line in tuned]
    headline = headline_lines(fit)
    if headline:
        md += ["", "**Headline.**", ""] + [f"- {line}" for line in headline]
    warnings = check_lines(fit)
    if warnings:
        md += ["", "**Fits to read with care.**", ""] + [f"- {line}" for line in warnings]
    md += markdown_sections(fit)
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
        f"- Gain m: the variant reaches the {fit.baseline}'s loss with m × its FLOPs "
        "(m < 1: cheaper). Paired: from the loss differences of trials with the same cell "
        f"and seed, turned into compute by the {fit.baseline}'s log-log slope through its "
        "cells; unpaired: a compute-shifted law L(C / m) through both variants' trials "
        "(docs/scaling.md). Loss ×: the geometric mean of the pairs' loss ratios.",
        "- Forecast backtest: the law through the smaller sizes predicts each run of the "
        "held-out size; the interval is for one run (the law's uncertainty and a run's "
        "scatter about it).",
        "- FLOPs are model FLOPs of training (forward + backward), not hardware peak.",
    ]
    if tracking_uri:
        md.append(f"- MLflow: `{tracking_uri}`, experiment `{fit.sweep}`.")
    path = out_dir / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    page = report_html("\n".join(md) + "\n", out_dir, f"sweep {fit.sweep}")
    path.with_suffix(".html").write_text(page, encoding="utf-8")
    return path


def report_lines(report: Path) -> list[str]:
    """Where the report is, as the summary and `results report` print it: report.md (to
    read and paste) and report.html beside it (to open in a browser)."""
    lines = [f"report: {report}"]
    page = report.with_suffix(".html")
    if page.exists():
        lines.append(f"report: {page} (open in a browser)")
    return lines


def headline_lines(fit: SweepFit) -> list[str]:
    """One sentence per variant: the paired gain when there is one, else the unpaired."""
    out = []
    for v in fit.variants:
        p = fit.paired_gain(v)
        g = next((g for g in fit.gains if g.variant == v), None)
        if p is not None:
            text = f"{p}."
            if g is not None:
                m = g.multiplier
                text += f" Unpaired: {m.estimate:.2f}×, CI [{m.low:.2f}, {m.high:.2f}]"
                wider = _log_width(m) / max(_log_width(p.multiplier), 1e-12)
                text += f" ({wider:.0f}× wider)." if np.isfinite(wider) else "."
            out.append(text)
        elif g is not None:
            out.append(f"{g} (unpaired).")
    return out


def _log_width(m: Interval) -> float:
    return float(np.log(m.high / m.low)) if m.low > 0 else float("inf")


def check_lines(fit: SweepFit) -> list[str]:
    """Every fit whose check is not ok, and gains whose law fell back, in words."""
    out = [f"{law} of {v}: {c.summary()}" for law, v, c in fit.checks() if not c.ok]
    fell = [g.variant for g in fit.gains if g.fit.baseline.fallback]
    if fell:
        out.append(
            f"unpaired gain{'s' if len(fell) > 1 else ''} of {', '.join(fell)}: "
            + next(g.fit.baseline.fallback for g in fit.gains if g.fit.baseline.fallback)
        )
    if fit.backtest is not None:
        out += [f"forecast backtest: {note}" for note in fit.backtest.notes]
    return out


def _parametrization(fit: SweepFit) -> str:
    """The baseline trials' model.parametrization (models/parametrization.py), e.g.
    'standard parametrisation' or 'µP, base width 64'; trials from before the field
    existed were standard."""
    names = set()
    for row in fit.table.select(["variant", "config"]).to_pylist():
        if row["variant"] == fit.baseline:
            model = json.loads(row["config"] or "{}").get("model", {})
            kind = model.get("parametrization", "standard")
            names.add("µP, base width " + str(model["mup_base_width"]) if kind == "mup" else kind)
    names = {"standard parametrisation" if n == "standard" else n for n in names}
    return "; ".join(sorted(names)) or "parametrisation unknown"


def _trial_rows(fit: SweepFit) -> tuple[list[str], list[list[str]]]:
    from scalelab.contract.trial_time import duration_text

    t = fit.table
    head = ["trial", "id", "variant", "size", "params", "tokens", "FLOPs", fit.loss, "time"]
    head += ["queued"]
    cols = ["trial_id", "variant", "size", "n_params", "tokens", "flops", fit.loss]
    cols += ["wall_time_s", "queued_s", "name", "branched_from"]
    rows = []
    for r in t.select([c for c in cols if c in t.column_names]).to_pylist():
        label = r.get("name") or r["trial_id"][:8]
        # a wsd cooldown branch trained off its trunk's checkpoint (docs/sweep-yaml.md)
        trunk, _, step = (r.get("branched_from") or "").partition("@")
        if trunk:
            label += f" (branch of `{trunk[:8]}` at step {step})"
        rows.append(
            [
                label, f"`{r['trial_id'][:8]}`", r["variant"], r["size"],
                f"{r['n_params']:,}", f"{r['tokens']:.3g}", f"{r['flops']:.3g}",
                f"{r[fit.loss]:.4f}", duration_text(r.get("wall_time_s")),
                duration_text(r.get("queued_s")),
            ]
        )  # fmt: skip
    return head, rows


def _print_ranked(sweep: str, root: Path | None, console: Any) -> None:
    """Without a law (one size, say a learning-rate sweep), what there is to read: the
    finished trials, lowest final validation loss first, with the settings they vary."""
    from rich.table import Table

    from scalelab.analysis.results import load_trials
    from scalelab.analysis.results.tables import ResultsError

    try:
        rows = load_trials(sweep, root).to_pylist()
    except ResultsError:
        return
    done = [r for r in rows if r.get("final_val_loss") is not None]
    if not done:
        return
    table = Table(title=f"{sweep}: trials by final val loss", title_justify="left")
    for head in ("trial (its swept settings)", "id", "variant", "size", "tokens", "val loss"):
        table.add_column(head, justify="right" if head in ("tokens", "val loss") else "left")
    for r in sorted(done, key=lambda r: r["final_val_loss"]):
        table.add_row(
            r.get("name") or r["trial_id"][:8], r["trial_id"][:8], r["variant"], r["size"],
            f"{r['tokens']:.3g}", f"{r['final_val_loss']:.4f}",
        )  # fmt: skip
    console.print(table)
    console.print(f"all columns: scalelab results query {sweep}")


def mlflow_ui_hint(uri: str, sweep: str) -> str:
    if uri.startswith(("http://", "https://")):
        return f"open {uri} in a browser"
    return f"scalelab ui {sweep}  (it prints the address of the sweep's runs)"


def tuned_lines(
    sweep: str,
    own: SweepFit | None,
    baseline: str,
    root: Path | None = None,
    where: str | None = None,
) -> list[str]:
    """What a tuned sweep's readers print with its gains (results/tuned_gain.py): with a fit
    (`own`), each variant's paired gain at its own rate and at the baseline's; without one
    (too few compute points for a law), its loss gaps cell by cell. Nothing for a sweep
    without `tune:`."""
    from scalelab.analysis.results.fit import fit_table
    from scalelab.analysis.results.query import trials_where
    from scalelab.analysis.results.tables import ResultsError
    from scalelab.analysis.results.tuned_gain import fairness_lines, loss_gap_lines, split_by_rate

    try:
        split = split_by_rate(trials_where(sweep, where, root), baseline)
    except ResultsError:
        return []
    if split is None:
        return []
    if own is None:
        return loss_gap_lines(split)
    try:
        shared = fit_table(split.shared, sweep, baseline=baseline, resample=False)
    except ResultsError:
        shared = None
    return fairness_lines(own, shared, split)


def _fits(
    sweep: str, root: Path | None, baseline: str, n_resamples: int
) -> tuple[SweepFit, list[str]]:
    """The sweep's fit and, for a tuned sweep, its fairness lines (results/tuned_gain.py)."""
    from scalelab.analysis.results.fit import fit_sweep

    own = fit_sweep(sweep, baseline=baseline, n_resamples=n_resamples, root=root)
    return own, tuned_lines(sweep, own, baseline, root)


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
    first the verdict in words (analysis/results/verdict.py), then the gains table, the fit
    checks in one line, the forecast backtest in one line, the sync, the plot and report
    paths, how to open the MLflow UI, and last one `next:` line per variant, priced on the
    sweep's recorded hardware.

    An unknown sweep raises ResultsError; a sweep the fits cannot support still returns a
    summary that says why."""
    from rich.console import Console

    from scalelab.analysis import door
    from scalelab.analysis import plots as plotting
    from scalelab.analysis.parent_record import record_on_parent
    from scalelab.analysis.results import sweep_dir
    from scalelab.analysis.results.advice import costing, recorded_spec
    from scalelab.analysis.results.imports import curves_of, imported_only, parent_run
    from scalelab.analysis.results.render import rich_tables
    from scalelab.analysis.results.tables import ResultsError
    from scalelab.analysis.results.verdict import (
        backtest_line,
        fit_checks_line,
        next_line,
        verdict_lines,
    )
    from scalelab.contract import workdir

    uri = tracking_uri or workdir.tracking_uri()
    imported = imported_only(sweep, root)  # no MLflow run to log to or to point at
    synced = door.up_to_date(sweep, uri, root=root).line
    cache = sweep_dir(sweep, root) / "summary.cache.json"
    # the folder is part of the key: a copied runs folder prints its own paths
    key = _summary_key(sweep, root, baseline, n_resamples, width, SUMMARY_FORMAT, str(cache))
    if cache.exists() and (cache.parent / "report.md").exists():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key and "head" in cached:  # same trials, same options
            return f"{cached['head']}{synced}\n{cached['tail']}"  # the same fits and files
    console = Console(record=True, width=width, file=io.StringIO())

    def say(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True, markup=False)

    try:
        fit, tuned = _fits(sweep, root, baseline, n_resamples)
    except ResultsError as e:
        say(f"no fit: {e}")
        for line in tuned_lines(sweep, None, baseline, root):  # gaps cell by cell
            say(line)
        _print_ranked(sweep, root, console)
        head = console.export_text()  # export_text clears what it exports
        say(f"MLflow UI: {mlflow_ui_hint(uri, sweep)}")
        return f"{head}{synced}\n{console.export_text()}"
    out = sweep_dir(sweep, root)
    files = plotting.make_plots(fit, curves_of(sweep, root), out / "plots")
    parent_run_id = parent_run(sweep, uri, root)
    plotting.log_plots(parent_run_id, files, uri)
    report = write_report(fit, files, out, "" if imported else uri, tuned)
    record_on_parent(parent_run_id, fit, report, uri)
    # the verdict first, in words; then the table it comes from; the checks in one line
    for line in verdict_lines(fit):
        say(line)
    for line in tuned:
        say(line)
    tables = rich_tables(fit)
    for table in tables[:1] if fit.gains or fit.paired else tables[:2]:
        console.print(table)
    checks = fit_checks_line(fit, report.name)
    if checks:
        say(checks)
    for note in fit.notes:
        say(f"note: {note}")
    if fit.backtest is not None:
        say(backtest_line(fit.backtest))
    head = console.export_text()
    say(f"plots: {out / 'plots'} ({', '.join(files)})")
    for line in report_lines(report):
        say(line)
    if not imported:
        say(f"MLflow UI: {mlflow_ui_hint(uri, sweep)}")
    cost = costing(fit.table, None if imported else recorded_spec(parent_run_id, uri))
    for advice in fit.advice:  # the summary ends with what to run next, one per variant
        say(f"next: {next_line(advice, cost)}")
    tail = console.export_text()
    cache.write_text(json.dumps({"key": key, "head": head, "tail": tail}))
    return f"{head}{synced}\n{tail}"


def _summary_key(sweep: str, root: Path | None, *options: object) -> str:
    """A digest of the synced trials table and the fit options."""
    import hashlib

    import pyarrow as pa

    from scalelab.analysis.results import load_trials

    sink = pa.BufferOutputStream()
    table = load_trials(sweep, root)
    table = table.sort_by("trial_id") if "trial_id" in table.column_names else table
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    digest = hashlib.sha256(sink.getvalue().to_pybytes())
    digest.update(repr(options).encode())
    return digest.hexdigest()
