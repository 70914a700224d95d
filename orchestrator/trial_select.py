"""Which trial a person means: its run name (`dense-nano-98k`, what `submit`, `status` and
MLflow show) or its id (whole, or a prefix of it, for scripts). One rule for `status`,
`logs`, `cancel`, `generate` and `eval` (docs/monitoring.md, 'Naming a trial')."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scalelab.contract.config import did_you_mean

SHOWN = 5  # matches listed in an error


class UnknownTrial(LookupError):
    """No trial, or more than one, answers to the name or id given; the message says which
    ones come close."""


def select(names: Mapping[str, str], selector: str, sweep: str) -> str:
    """The id of the one trial (of `names`: trial id -> run name) whose id is `selector`,
    whose run name is `selector`, or whose id starts with it, in that order; UnknownTrial
    when none or several."""
    if selector in names:
        return selector
    named = [tid for tid, name in names.items() if name == selector]
    if len(named) == 1:
        return named[0]
    found = named or [tid for tid in names if selector and tid.startswith(selector)]
    if len(found) == 1:
        return found[0]
    if found:
        listed = ", ".join(f"{names[tid]} ({tid})" for tid in found[:SHOWN])
        more = ", ..." if len(found) > SHOWN else ""
        raise UnknownTrial(
            f"{selector!r} matches {len(found)} trials of sweep {sweep}: {listed}{more}; "
            "give the trial id"
        )
    known = sorted({name for name in names.values() if name})
    hint = did_you_mean(selector, known)
    if not hint and known:
        hint = f" (its trials: {', '.join(known[:SHOWN])}{', ...' if len(known) > SHOWN else ''})"
    raise UnknownTrial(f"no trial {selector!r} in sweep {sweep}{hint}")


def select_all(names: Mapping[str, str], selectors: Iterable[str], sweep: str) -> list[str]:
    """`select` for each selector, in order, each trial id once."""
    return list(dict.fromkeys(select(names, s, sweep) for s in selectors))


def trials_named(
    name: str, sweep: str | None = None, tracking_uri: str | None = None
) -> dict[str, str]:
    """trial id -> sweep, of the trial runs called `name` in the tracking store (in `sweep`
    only, when given): where a command that takes no sweep (`generate`) finds a run name.
    Creates nothing: a store not made yet holds none."""
    from pathlib import Path

    from scalelab.contract import workdir
    from scalelab.contract.runs import Role, Tag, quote, search_all, tag_filter
    from scalelab.orchestrator.ledger.connection import check_reachable, guarded_client

    uri = tracking_uri or workdir.tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return {}
    check_reachable(uri)
    client = guarded_client(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    where = f"attributes.run_name = {quote(name)} and {tag_filter(Tag.ROLE, Role.TRIAL)}"
    if sweep:
        where += f" and {tag_filter(Tag.SWEEP, sweep)}"
    runs = search_all(client, experiments, where) if experiments else []
    return {
        r.data.tags[Tag.TRIAL_ID]: r.data.tags.get(Tag.SWEEP, "")
        for r in runs
        if Tag.TRIAL_ID in r.data.tags
    }


def located_trial(target: str, sweep: str | None = None) -> object:
    """`locate(target)` (a trial folder, id or checkpoint); where that finds no trial, the
    trial whose run is named `target` in the tracking store (of `sweep`, when given). What
    `generate` and `eval` load."""
    from scalelab.jobs.training.trained_model import TrialError, locate
    from scalelab.orchestrator.ledger import LedgerUnavailable

    try:
        return locate(target)
    except TrialError as e:
        try:
            named = trials_named(target, sweep)
        except (LedgerUnavailable, ValueError):  # no store to ask: the folder lookup's answer
            raise e from None
        if not named:
            raise
    if len(named) > 1:
        where = ", ".join(f"{tid} (sweep {s})" for tid, s in sorted(named.items()))
        raise TrialError(f"run name {target!r} names {len(named)} trials: {where}; give --sweep")
    return locate(next(iter(named)))
