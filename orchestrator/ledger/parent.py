"""The sweep's parent run `sweep:<name>`: created once (two drivers at once keep the older),
tagged with what `resume` needs (the YAML, its path, the command-line overrides), and the
experiment described for the MLflow UI."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
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
from scalelab.orchestrator.ledger.connection import MAX_TAG, SweepStore
from scalelab.orchestrator.ledger.ui_view import same_view, view_tags

if TYPE_CHECKING:
    from scalelab.orchestrator.plan.expand import Trial
    from scalelab.orchestrator.plan.spec import SweepSpec

SETTLE_S = 0.5  # > the time from creating a run to seeing it in a search, with margin
# A text longer than a tag (MLflow cuts tag values at 8,000 characters, silently) is kept as
# <key>.chunks = n, <key>.0 ... <key>.<n-1> and <key>.sha256; one that fits stays <key> too.
CHUNKS, DIGEST = ".chunks", ".sha256"


class RecordDamaged(ValueError):
    """A text recorded on the parent run is not whole (one line: which, and what to do)."""


@dataclass(frozen=True)
class RecordedSpec:
    yaml: str | None  # the sweep file's text as submitted last; None: not recorded
    path: str  # where the file was ("" when unknown)
    overrides: list[str]  # the command line's KEY=VALUE settings


def long_tag(key: str, text: str) -> dict[str, str]:
    """The tags that record `text` under `key` whatever its length, with its digest."""
    chunks = [text[i : i + MAX_TAG] for i in range(0, len(text), MAX_TAG)] or [""]
    tags = {f"{key}{CHUNKS}": str(len(chunks)), f"{key}{DIGEST}": _digest(text)}
    tags |= {f"{key}.{i}": chunk for i, chunk in enumerate(chunks)}
    if len(chunks) == 1:
        tags[key] = text  # readable as one tag in the UI, as before
    return tags


def read_long_tag(tags: dict[str, str], key: str) -> str | None:
    """The text `long_tag` recorded (or an older scalelab's plain tag); None when neither
    is there. Raises RecordDamaged when the chunks do not make the recorded digest."""
    if f"{key}{CHUNKS}" not in tags:
        return tags.get(key)
    n = int(tags[f"{key}{CHUNKS}"])
    text = "".join(tags.get(f"{key}.{i}", "") for i in range(n))
    if _digest(text) != tags.get(f"{key}{DIGEST}"):
        raise RecordDamaged(
            f"the parent run's {key} is damaged ({n} parts that do not make the recorded "
            "digest); submit the sweep file again"
        )
    return text


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ParentRun(SweepStore):
    def find_parent(self) -> str | None:
        if self.parent_id is None:
            runs = self.search(sweep_filter(self.sweep))
            if runs:
                self.parent_id = min(
                    runs, key=lambda r: (r.info.start_time, r.info.run_id)
                ).info.run_id
        return self.parent_id

    def describe_experiment(self, spec: SweepSpec, trials: list[Trial] | None = None) -> None:
        """Tell the MLflow UI what the experiment is: model training (its kind), the sweep's
        description as its note, and with `trials` the saved view of them
        (orchestrator/ledger/ui_view.py)."""
        eid = self.experiment_id(create=True)
        tags = {ExperimentTag.KIND: ExperimentTag.TRAINING}
        if spec.description:
            tags[ExperimentTag.NOTE] = spec.description
        if trials:
            tags |= view_tags(trials, int(time.time() * 1000))
        from mlflow.exceptions import MlflowException

        def already(current: dict[str, str], key: str, value: str) -> bool:
            if key.startswith(ExperimentTag.VIEW_PREFIX):  # its times differ each submit
                return same_view(current.get(key), value)
            return current.get(key) == value

        current = self.client.get_experiment(eid).tags
        for key, value in tags.items():
            if already(current, key, value):
                continue
            try:
                self.client.set_experiment_tag(eid, key, value)
            except MlflowException:  # a second driver set it at once (a unique key)
                if not already(self.client.get_experiment(eid).tags, key, value):
                    raise

    def ensure_parent(
        self,
        spec: SweepSpec,
        spec_yaml: str = "",
        spec_path: str = "",
        overrides: str = "[]",
        trials: list[Trial] | None = None,
    ) -> str:
        """The sweep's parent run (created if missing), tagged with its YAML, path and
        command-line overrides (a JSON list of KEY=VALUE) for `resume`; the experiment
        described for the UI (with the saved view of `trials`)."""
        self.describe_experiment(spec, trials)
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

        tags = {Tag.BACKEND: spec.backend.kind, **long_tag(Tag.OVERRIDES, overrides)}
        if spec_yaml:
            tags |= long_tag(Tag.SPEC_YAML, spec_yaml)
        if spec_path:
            tags[Tag.SPEC_PATH] = spec_path
        items = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, len(items), 100):  # log_batch takes 100 tags at most
            self.client.log_batch(self.parent_id, tags=items[i : i + 100])
        current = self.parent_tags()
        for key in (Tag.OVERRIDES, Tag.SPEC_YAML):  # a whole copy of an older, shorter text
            if key in current and key not in tags and f"{key}{CHUNKS}" in tags:
                self.client.delete_tag(self.parent_id, key)

    def recorded_spec(self) -> RecordedSpec:
        """What `resume` reads back: the sweep file's text (None when none was recorded),
        where it was, and the overrides. A text that does not match its recorded digest
        raises RecordDamaged."""
        tags = self.parent_tags()
        overrides = read_long_tag(tags, Tag.OVERRIDES)
        try:
            parsed = json.loads(overrides) if overrides is not None else []
        except ValueError:  # an older scalelab's tag, cut at 8,000 characters by MLflow
            raise RecordDamaged(
                f"sweep {self.sweep}: its recorded overrides are cut short ({len(overrides):,} "
                "characters, recorded before long texts were split); submit the file again"
            ) from None
        return RecordedSpec(read_long_tag(tags, Tag.SPEC_YAML), tags.get(Tag.SPEC_PATH, ""),
                            [str(o) for o in parsed])  # fmt: skip

    def finish_sweep(self, status: str) -> None:
        if self.parent_id:
            self.set_status(self.parent_id, status)
