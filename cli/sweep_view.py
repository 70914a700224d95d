"""What a person watching a sweep sees in the terminal: a line per trial as it ends with an
ETA, the failures with where their logs are, and `status`'s rows (the run name, the loss,
run and queue times, the error's tail) as cells."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir as paths
from scalelab.contract.runs import Status
from scalelab.contract.trial_time import duration_text, run_seconds
from scalelab.contract.trial_time import launched as trial_launched
from scalelab.orchestrator.door import run_names, short_count

if TYPE_CHECKING:
    from rich.console import Console

    from scalelab.orchestrator.door import Failure, Ledger, Trial

ERROR_CHARS = 240  # of an error, in a table cell or a failure line: its end, where Python's is


def error_tail(text: str, chars: int = ERROR_CHARS) -> str:
    """An error on one line, cut from the front when long (the cause is at the end)."""
    flat = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return flat if len(flat) <= chars else "…" + flat[-(chars - 1) :]


def read_result(trial_id: str) -> dict[str, Any]:
    path = paths.trial_dir(trial_id) / paths.RESULT_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class TrialLines:
    """One printed line per trial as it ends (name, tokens, final loss, time) and the ETA
    of the rest, from the plan's FLOPs and the FLOPs done so far per second."""

    def __init__(
        self,
        console: Console,
        trials: list[Trial],
        already_done: set[str],
        ledger: Ledger,
        scored: list[str] | None = None,
        reused: set[str] = frozenset(),
    ) -> None:
        self.console, self.ledger = console, ledger
        self.scored = scored  # an evaluation's tasks (`eval SWEEP`): the lines show their scores
        self.trials = {t.trial_id: t for t in trials}
        self.names = run_names(trials)
        # the ETA counts what is trained here: a reused trial's curve is copied in a second
        self.reused = reused
        self.to_run = sum(t.flops for t in trials if t.trial_id not in already_done | reused)
        self.done_flops = 0.0
        self.t0 = time.monotonic()

    def ended(self, trial_id: str, outcome: str) -> None:
        t = self.trials[trial_id]
        if trial_id not in self.reused:
            self.done_flops += t.flops
        if self.scored is not None:
            self.scores(trial_id, "evaluated" if outcome == "finished" else outcome)
            return
        result = read_result(trial_id)
        loss = result.get("final_val_loss")
        parts = [
            f"{self.names[trial_id]:<28}",
            f"{outcome:<8}",
            f"{short_count(t.tokens)} tokens",
            f"val loss {loss:.4f}" if isinstance(loss, float) else "",
            duration_text(self.run_time(trial_id)),
        ]
        if outcome in ("failed", "diverged"):
            parts.append(f"log: {paths.trial_log(trial_id)}")
        self.console.print("  ".join(p for p in parts if p), highlight=False, soft_wrap=True)

    def scores(self, trial_id: str, outcome: str) -> None:
        """The line of an evaluated trial: per task, its scores as `scalelab eval` of one
        trial prints them and, in brackets, what ran; or why its evaluation failed."""
        from scalelab.contract.runs import Tag
        from scalelab.orchestrator.door import ran_text, score_text

        rec = self._record(trial_id, launched=False)
        metrics, tags = (rec.metrics, rec.tags) if rec else ({}, {})
        parts = [f"{self.names[trial_id]:<28}", f"{outcome:<8}"]
        for task in self.scored or ():
            if scores := score_text(task, metrics):
                parts.append(f"{task}: {scores}  [{ran_text(task, metrics)}]")
            else:
                why = error_tail(tags.get(Tag.EVAL_ERROR, "")) or "not evaluated"
                parts.append(f"{task}: no scores ({why})")
        if outcome in ("failed", "diverged"):
            parts.append(f"log: {paths.trial_log(trial_id)}")
        self.console.print("  ".join(parts), highlight=False, soft_wrap=True, markup=False)

    def run_time(self, trial_id: str) -> float | None:
        """The trial's run time as MLflow has it (contract/trial_time.py), as `status` shows."""
        rec = self._record(trial_id)
        return run_seconds(rec.tags, rec.status, rec.end_time) if rec else None

    def _record(self, trial_id: str, launched: bool = True) -> Any:
        """The trial's run in this sweep as MLflow has it now (the one every reader takes:
        contract/trial_time.trial_run_rank); `launched`: None while it is a placeholder."""
        from scalelab.contract.runs import Tag, tag_filter, trials_filter
        from scalelab.contract.trial_time import trial_run_rank
        from scalelab.orchestrator.door import record_of

        wanted = f"{trials_filter(self.ledger.sweep)} and {tag_filter(Tag.TRIAL_ID, trial_id)}"
        runs = self.ledger.search(wanted)
        if launched:
            runs = [r for r in runs if trial_launched(r.data.tags)]
        return record_of(min(runs, key=trial_run_rank)) if runs else None

    def eta(self) -> str:
        """'ETA 3m10s' once a trial has ended, from the FLOPs per second so far."""
        elapsed = time.monotonic() - self.t0
        left = self.to_run - self.done_flops
        if self.done_flops <= 0 or left <= 0:
            return ""
        return f"ETA {duration_text(elapsed * left / self.done_flops)}"


def failure_lines(failures: tuple[Failure, ...], sweep: str) -> list[str]:
    """Each failed trial: its name and id, attempts, the error's tail, and where its log is."""
    lines = []
    for f in failures:
        how = "diverged" if f.diverged else "failed"
        error = error_tail(f.error) or "no reason recorded"
        lines.append(f"  {f.name} ({f.trial_id}) {how} after {f.attempts} attempt(s): {error}")
        lines.append(f"    log: {f.log}  (scalelab logs {sweep} {f.trial_id[:8]})")
    return lines


def status_cells(row: dict[str, Any]) -> list[str]:
    """The table's cells of a status_row, in STATUS_COLUMNS order: the run name first (the
    variant, size, budget and swept settings are in it), the id's start for scripts."""
    loss = row["val_loss"]
    status = "DIVERGED" if row["diverged"] else row["status"]
    trunk, _, step = (row.get("branched_from") or "").partition("@")
    if trunk:  # a wsd cooldown branch: trained off its trunk's checkpoint
        status += f"\nbranch of {trunk[:8]} at step {step}"
    elif row.get("branches"):
        status += f"\ntrunk of {row['branches']}"
    stage = row.get("stage")
    if stage == "tune":
        status += "\nlr search"
    elif stage and row.get("lr") is not None:  # the sweep's own trials, at a tuned rate
        status += f"\nat tuned lr {row['lr']:.3g}"
    error = error_tail(row["error"])
    return [
        row["name"] or row["trial_id"][:8],
        row["trial_id"][:8],
        f"{loss:.4f}" if loss is not None else "",
        duration_text(row["duration_s"]),
        duration_text(row["queued_s"]),
        status,
        str(row["attempts"]),
        f"{error}\nlog: {row['log']}" if error and row["log"] else error,
    ]


STATUS_COLUMNS = ("name", "trial", "val loss", "time", "queued", "status", "attempts", "error")


def shared_settings(rows: list[dict[str, Any]]) -> str:
    """What every trial has alike and its name leaves out: 'every trial: 98.3k tokens, lr
    0.001' ('' when they differ: the names tell them apart)."""
    tokens, lrs = {r["tokens"] for r in rows}, {r["lr"] for r in rows}
    parts = [f"{short_count(n)} tokens" for n in tokens if len(tokens) == 1 and n is not None]
    parts += [f"lr {lr:.3g}" for lr in lrs if len(lrs) == 1 and lr is not None]
    return f"every trial: {', '.join(parts)}" if parts else ""


def status_notes(rows: list[dict[str, Any]]) -> list[str]:
    """What the table's rows do not say: MLflow writes still spooled, per trial; a tuned
    sweep whose own trials wait for the learning-rate search."""
    notes = [
        f"note: {r['name'] or r['trial_id']}: {r['metrics_pending']} MLflow write(s) spooled, "
        f"not sent yet ({r['pending_why']}); sent when `status`, `results sync` or a submit "
        "next reads the sweep"
        for r in rows
        if r.get("metrics_pending")
    ]
    stages = [r.get("stage") for r in rows]
    if "tune" in stages and not any(s in ("ladder", "tune+ladder") for s in stages):
        done = sum(r["status"] == Status.FINISHED for r in rows if r.get("stage") == "tune")
        notes.append(
            f"stage 1 of 2: the lr search, {done}/{stages.count('tune')} finished; the sweep's "
            "own trials start when it ends, each variant at its tuned rate"
        )
    return notes
