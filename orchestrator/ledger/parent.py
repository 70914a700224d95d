"""The sweep's parent run `sweep:<name>`: created once (two drivers at once keep the older),
tagged with what `resume` needs (the YAML, its path, the command-line overrides), and the
experiment described for the MLflow UI."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from scalelab.contract.runs import (
    ExperimentTag,
    Role,
    Status,
    Tag,
    sweep_filter,
    sweep_run_name,
)
from scalelab.jobs.tracking.provenance import code_version
from scalelab.orchestrator.ledger.store import MAX_TAG, SweepStore

if TYPE_CHECKING:
    from scalelab.orchestrator.spec import SweepSpec

SETTLE_S = 0.5  # > the time from creating a run to seeing it in a search, with margin


class ParentRun(SweepStore):
    def find_parent(self) -> str | None:
        if self.parent_id is None:
            runs = self.search(sweep_filter(self.sweep))
            if runs:
                self.parent_id = min(
                    runs, key=lambda r: (r.info.start_time, r.info.run_id)
                ).info.run_id
        return self.parent_id

    def describe_experiment(self, spec: SweepSpec) -> None:
        """Tell the MLflow UI what the experiment is: model training (it opens on the runs,
        not the GenAI overview) and the sweep's description as its note."""
        eid = self.experiment_id(create=True)
        tags = {ExperimentTag.KIND: ExperimentTag.TRAINING}
        if spec.description:
            tags[ExperimentTag.NOTE] = spec.description
        from mlflow.exceptions import MlflowException

        current = self.client.get_experiment(eid).tags
        for key, value in tags.items():
            if current.get(key) == value:
                continue
            try:
                self.client.set_experiment_tag(eid, key, value)
            except MlflowException:  # a second driver set it at once (a unique key)
                if self.client.get_experiment(eid).tags.get(key) != value:
                    raise

    def ensure_parent(
        self, spec: SweepSpec, spec_yaml: str = "", spec_path: str = "", overrides: str = "[]"
    ) -> str:
        """The sweep's parent run (created if missing), tagged with its YAML, path and
        command-line overrides (a JSON list of KEY=VALUE) for `resume`."""
        self.describe_experiment(spec)
        if self.find_parent():
            self._update_parent_tags(spec, spec_yaml, spec_path, overrides)
            return self.parent_id
        eid = self.experiment_id(create=True)
        tags = {
            Tag.RUN_NAME: sweep_run_name(self.sweep),
            Tag.ROLE: Role.SWEEP,
            Tag.SWEEP: self.sweep,
            Tag.CODE_VERSION: code_version(),
        }
        run = self.client.create_run(eid, tags=tags, run_name=sweep_run_name(self.sweep))
        time.sleep(SETTLE_S)
        self.parent_id = None
        parent = self.find_parent()
        if parent != run.info.run_id:
            self.client.delete_run(run.info.run_id)  # lost a creation race: use the winner's
        else:
            self.client.update_run(parent, status=Status.SCHEDULED)
        self._update_parent_tags(spec, spec_yaml, spec_path, overrides)
        return parent

    def _update_parent_tags(
        self, spec: SweepSpec, spec_yaml: str, spec_path: str, overrides: str
    ) -> None:
        from mlflow.entities import RunTag

        tags = {Tag.BACKEND: spec.backend.kind, Tag.OVERRIDES: overrides}
        if spec_yaml and len(spec_yaml) <= MAX_TAG:
            tags[Tag.SPEC_YAML] = spec_yaml
        if spec_path:
            tags[Tag.SPEC_PATH] = spec_path
        self.client.log_batch(self.parent_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def finish_sweep(self, status: str) -> None:
        if self.parent_id:
            self.set_status(self.parent_id, status)
