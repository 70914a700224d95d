"""The plan's data columns: per trial, whether its text is prepared and how many tokens it
needs of how many there are; and the `scalelab data prepare` commands that would make the
plan's text ready (jobs/data/, docs/architecture.md 'Data')."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.expand import Trial


@dataclass(frozen=True)
class TrialData:
    state: str  # ready, partial, not prepared, generated, per trial, missing, error: ...
    tokens_needed: int | None = None
    tokens_available: int | None = None


def data_plan(
    trials: list[Trial], missing: set[str] | frozenset[str] = frozenset()
) -> tuple[list[TrialData], list[str]]:
    """Per trial its TrialData; and the `scalelab data prepare` commands that would make the
    plan's text ready. Each prepared folder is looked at once, however many trials read it.
    `missing`: the data.source values whose data is not here (their rows say "missing")."""
    from scalelab.jobs.data.prepare import dataset_root, enough
    from scalelab.jobs.data.reader import prefix_stable_extent
    from scalelab.jobs.data.shards import read_manifest
    from scalelab.jobs.data.sources import TextSource, resolve_source
    from scalelab.jobs.data.trial import tokens_needed, train_windows

    rows: list[TrialData] = []
    largest: dict[tuple[str, str, str], int] = {}
    folders: dict[tuple[str, str, str], tuple[object, str | None]] = {}
    for t in trials:
        cfg = t.job.data
        if cfg.source in missing:
            rows.append(TrialData("missing"))
            continue
        kind, _ = resolve_source(cfg.source)
        if kind not in ("pydoc", "local", "hub") or t.job.model.task == "classify":
            rows.append(TrialData("per trial" if kind in ("hub", "local") else "generated"))
            continue
        windows = train_windows(t.tokens, t.job.train.global_batch_tokens, cfg.seq_len)
        if t.job.train.schedule == "wsd":  # its prefix-stable order (jobs/data/reader.py)
            windows = prefix_stable_extent(windows)
        need, val = tokens_needed(cfg, windows)
        key = (cfg.source, cfg.tokenizer, cfg.text_field)
        if key not in folders:
            try:
                root = dataset_root(TextSource.open(cfg.source, cfg.text_field), cfg.tokenizer)
                folders[key] = (read_manifest(root), None)
            except ValueError as e:  # a missing source or tokenizer file: say so in the plan
                folders[key] = (None, f"error: {e}")
        m, error = folders[key]
        if error:
            rows.append(TrialData(error, need))
            continue
        if m is None:
            state = "not prepared"
        elif m.complete and need > m.train_tokens:
            state = f"ready, {need / m.train_tokens:.2f} epochs"
        elif enough(m, need, val):
            state = "ready"
        else:
            state = "partial"
        if not enough(m, need, val):
            largest[key] = max(largest.get(key, 0), need)
        rows.append(TrialData(state, need, m.train_tokens if m else None))
    commands = [
        f"scalelab data prepare {source} --tokenizer {tok}"
        + (f" --text-field {field}" if field != "text" else "") + f" --max-tokens {n}"
        for (source, tok, field), n in largest.items()
    ]  # fmt: skip
    return rows, commands
