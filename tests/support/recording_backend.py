"""A backend in one file: trials on this machine's embedded Ray, as `local` runs them, and
a record of every trial it starts under its own option, `label`.

    backend: {kind: recording, label: nightly, concurrency: 2}

Registered by the process that validates and drives the sweep (the driver; Ray's workers
never need a backend): `register(RecordingBackend)`, or `with registered(...)` in a test.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from scalelab.orchestrator.backends.base import Backend, RayTaskOptions, ray_init

STARTED: list[tuple[str, str]] = []  # (label, trial id) of every trial started in this process


class RecordingOptions(RayTaskOptions):
    """`backend: {kind: recording, label: ..., ...}`: every key of `local`, and `label`."""

    kind: Literal["recording"] = "recording"
    label: str = Field(min_length=1, description="what the trials it starts are recorded under")

    trials_run_here: ClassVar[bool] = True  # an embedded Ray on this machine


class RecordingBackend(Backend):
    kind = "recording"
    options = RecordingOptions

    def start(self) -> None:
        self.owns_ray = ray_init("local", embedded=True, workers=self.cfg.concurrency)

    def launch_many(self, items: list[Any]) -> list[tuple[Any, str]]:
        STARTED.extend((self.cfg.label, trial.trial_id) for trial, _, _ in items)
        return super().launch_many(items)  # Ray tasks that call jobs.launch.launch
