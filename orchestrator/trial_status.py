"""What a recorded sweep's trials are doing: a row per trial (`scalelab status`, the
notebook's `status`) and the failures a run of the sweep ended with. Rows are plain,
JSON-ready dicts; turning them into a table is the caller's."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir as paths
from scalelab.contract.runs import Status, Tag
from scalelab.contract.trial_time import queued_seconds, run_seconds, shown_status

if TYPE_CHECKING:
    from scalelab.orchestrator.ledger import Ledger, TrialRecord
    from scalelab.orchestrator.ledger.view import SweepReads


def trial_rows(ledger: SweepReads) -> list[dict[str, Any]]:
    """The sweep's trials, oldest first, after sending what finished trials' spools still
    hold (a run turns FINISHED only when its spool is empty: orchestrator/delivery.py)."""
    from scalelab.orchestrator.delivery import send_owed

    recs = ledger.records()
    # only spools whose job ended (its result.json is written): a running job sends its own,
    # and sending it here would cost every look at a live sweep MLflow's start-up
    ended = [r for r in recs.values() if (paths.trial_dir(r.trial_id) / paths.RESULT_FILE).exists()]
    sent, owed = send_owed(ended, ledger.uri)
    if sent:
        recs = ledger.records()
    owing = {o.run_id: o for o in owed}
    rows = []
    for r in sorted(recs.values(), key=lambda r: r.start_time):
        error = r.tags.get(Tag.ERROR, "") if r.status != Status.FINISHED else ""
        row = status_row(r, error)
        o = owing.get(r.run_id)
        row["metrics_pending"] = o.pending if o else 0
        # bookkeeping, not the trial's error: the CLI says it under the table
        row["pending_why"] = o.why if o else ""
        rows.append(row)
    # a wsd trunk: the trials that branched off it (orchestrator/plan/branching.py)
    trunks = Counter(r["branched_from"].partition("@")[0] for r in rows if r["branched_from"])
    for row in rows:
        row["branches"] = trunks[row["trial_id"]]
    return rows


def status_row(rec: TrialRecord, error: str) -> dict[str, Any]:
    """One trial: what it is (name, swept settings, tokens, lr), where it is, and how it went
    (loss, run time, queue time and status as contract/trial_time.py defines them: the run
    time sums its attempts', the status is STARTING between a launch and its job's start;
    attempts, error)."""
    return {
        "trial_id": rec.trial_id,
        "run_id": rec.run_id,
        "name": rec.name,
        "variant": rec.tags.get(Tag.VARIANT, ""),
        "size": rec.tags.get(Tag.SIZE, ""),
        "swept": json.loads(rec.tags.get(Tag.SWEPT, "{}") or "{}"),
        "tokens": _int(rec.tags.get(Tag.TOKENS) or rec.params.get("train.tokens")),
        "lr": _float(rec.params.get("train.lr")),
        "val_loss": rec.metrics.get("val/loss"),
        "duration_s": run_seconds(rec.tags, rec.status, rec.end_time),
        "queued_s": queued_seconds(rec.tags),
        "status": shown_status(rec.status, rec.tags, rec.end_time),  # STARTING: launched
        "diverged": rec.tags.get(Tag.DIVERGED) == "1",
        "attempts": rec.attempts,
        "job_ref": rec.tags.get(Tag.JOB_REF, ""),
        "branched_from": rec.tags.get(Tag.BRANCHED_FROM, ""),  # a wsd cooldown branch's trunk@step
        "stage": rec.tags.get(Tag.STAGE, ""),  # a tuned sweep's: tune, ladder, tune+ladder
        "error": error,
        "log": str(paths.trial_log(rec.trial_id)) if error else "",
    }


@dataclass(frozen=True)
class Failure:
    """A trial that failed (its retries used up) or diverged, as MLflow recorded it."""

    trial_id: str
    name: str
    diverged: bool
    attempts: int
    error: str  # the recorded error, whole ("" when none was recorded)
    log: str  # trials/<id>/logs/trial.log


def failures(ledger: Ledger, failed: list[str]) -> list[Failure]:
    records = {r.trial_id: r for r in ledger.records().values()}
    out = []
    for tid in failed:
        rec = records.get(tid)
        tags = rec.tags if rec else {}
        out.append(
            Failure(
                trial_id=tid,
                name=rec.name if rec else tid,
                diverged=tags.get(Tag.DIVERGED) == "1",
                attempts=rec.attempts if rec else 0,
                error=tags.get(Tag.ERROR, ""),
                log=str(paths.trial_log(tid)),
            )
        )
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None
