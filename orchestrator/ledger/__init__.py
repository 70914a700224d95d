"""MLflow is the sweep's state: one parent run per sweep, one child run per trial
(docs/architecture.md, 'Data flow of one sweep'). The ledger is those runs, in rooms:

    connection.py the client, the experiment, searches, tag and status writes
    parent.py   the parent run `sweep:<name>` and what `resume` reads from it
    records.py  one run per trial: placeholders, the run of a first launch, cancels
    claims.py   which driver owns a trial: claims and heartbeats
    trial_claims.py  which driver trains a trial, across the sweeps that list it
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scalelab.contract import workdir
from scalelab.contract.runs import sweep_experiment
from scalelab.orchestrator.ledger.claims import Liveness, new_driver_id
from scalelab.orchestrator.ledger.connection import (
    MAX_TAG,
    LedgerUnavailable,
    check_reachable,
    guarded_client,
)
from scalelab.orchestrator.ledger.parent import ParentRun
from scalelab.orchestrator.ledger.records import Records, TrialRecord
from scalelab.orchestrator.ledger.trial_claims import TrialClaims

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.expand import Trial
    from scalelab.orchestrator.plan.spec import SweepSpec

__all__ = [
    "MAX_TAG",
    "Ledger",
    "LedgerUnavailable",
    "Liveness",
    "TrialRecord",
    "check_reachable",
    "find_sweep",
    "new_driver_id",
]


class Ledger(ParentRun, Records, TrialClaims):
    """One sweep's runs in MLflow, as seen by one driver (`driver_id`)."""

    def __init__(
        self,
        sweep: str,
        experiment: str | None = None,
        tracking_uri: str | None = None,
        driver_id: str | None = None,
        lease_s: float = 60.0,
    ):
        super().__init__(sweep, experiment, tracking_uri)
        self.driver_id = driver_id or new_driver_id()
        self.lease_s = lease_s

    def sync(
        self, spec: SweepSpec, trials: list[Trial], **parent_info: str
    ) -> dict[str, TrialRecord]:
        """The parent run and a placeholder for every trial that has none (neither is
        ever duplicated); the records of every trial."""
        parent = self.ensure_parent(spec, trials=trials, **parent_info)
        return self.create_placeholders(parent, spec, trials)


def find_sweep(name: str, tracking_uri: str | None = None) -> Ledger:
    """The ledger of a sweep by name, whatever experiment it lives in."""
    uri = tracking_uri or workdir.tracking_uri()
    check_reachable(uri)
    exp = sweep_experiment(guarded_client(uri), name)
    if exp is None:
        raise LookupError(f"no sweep named {name!r} in {uri}")
    ledger = Ledger(name, exp.name, uri)
    ledger.find_parent()
    return ledger
