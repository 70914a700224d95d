"""The MLflow names the orchestrator and the jobs agree on (docs/architecture.md, 'MLflow
schema'): tag and param keys, run roles, statuses, run names and the filters that find
them. Spelled here only (tests/test_layers.py checks it); no mlflow import.

Experiment = sweep; the sweep's parent run is `sweep:<name>`, with a child run per trial.
The ledger and scheduler write the placement tags (`backend`, `job_ref`); a job attached
to a run they created never overwrites them.
"""

from __future__ import annotations

from typing import Any

PREFIX = "scalelab."


class Tag:
    """Keys of scalelab's run tags."""

    ROLE = "scalelab.role"  # Role.SWEEP or Role.TRIAL
    SWEEP = "scalelab.sweep"
    TRIAL_ID = "scalelab.trial_id"
    VARIANT = "scalelab.variant"
    SIZE = "scalelab.size"
    BACKEND = "scalelab.backend"  # local | ray | slurm: where the trial runs
    JOB_REF = "scalelab.job_ref"  # the backend's handle of the attempt (job_ref())
    CODE_VERSION = "scalelab.code_version"
    WORLD_SIZE = "scalelab.world_size"
    ERROR = "scalelab.error"  # why a trial failed
    EVAL_ERROR = "scalelab.eval_error"  # why a finished trial's eval.downstream step failed
    ATTEMPTS = "scalelab.attempts"
    CANCEL = "scalelab.cancel"  # "1": cancel requested
    PREEMPTED = "scalelab.preempted"  # time of the last preemption (UTC, ISO 8601)
    OUTBOX_PENDING = "scalelab.outbox_pending"  # points still spooled on a node
    TRAINED_IN_RUN = "scalelab.trained_in_run"  # the run a shared trial folder trained in
    WAITING_FOR = "scalelab.waiting_for"  # "sweep <name>": whose driver trains it now
    CHECKPOINTS_SKIPPED = "scalelab.checkpoints_skipped"
    IDENTITY_RULE = "scalelab.identity_rule"  # the rule its trial id was computed by
    TRIAL_ID_PREV = "scalelab.trial_id_prev"  # the id before `scalelab migrate` re-keyed it
    SUPERSEDED_BY = "scalelab.superseded_by"  # the trial id that holds its science now
    DIVERGED = "scalelab.diverged"  # "1": the loss diverged (deterministic: not retried)
    REFUSED = "scalelab.refused"  # "1": its node could not run it as placed (not retried)
    HADAMARD_BACKEND = "scalelab.hadamard_backend"  # the kernel(s) that ran; why auto fell back
    BRANCHED_FROM = "scalelab.branched_from"  # "<trunk id>@<step>": a wsd cooldown branch
    STAGE = "scalelab.stage"  # a sweep with `tune:`: tune, ladder or tune+ladder
    SWEPT = "scalelab.swept"  # JSON {dotted key: value} of the settings its axes vary
    TOKENS = "scalelab.tokens"  # the trial's resolved token budget
    STARTED = "scalelab.started"  # its first launch (UTC, ISO 8601): its run was created then
    STARTED_MS = "scalelab.started_ms"  # read only: epoch ms, as older runs have it
    QUEUED_S = "scalelab.queued_s"  # from its placeholder's creation to that launch
    # its run time is the sum of its attempts' (contract/trial_time.py):
    LAUNCHED = "scalelab.launched"  # its latest attempt's launch (UTC, ISO 8601)
    ATTEMPT_ENDED = "scalelab.attempt_ended"  # that attempt's end, when its run did not end
    EARLIER_S = "scalelab.earlier_s"  # running seconds of its attempts before the latest
    RUN_S = "scalelab.run_s"  # its run time in seconds (the sum of its attempts), once ended
    N_TRIALS = "scalelab.n_trials"  # on the parent
    SPEC_YAML = "scalelab.spec_yaml"  # on the parent: the sweep file's text
    SPEC_PATH = "scalelab.spec_path"
    OVERRIDES = "scalelab.overrides"  # on the parent: the submit's KEY=VALUE list, JSON
    DRIVER_PREFIX = "scalelab.driver."  # on the parent: one heartbeat per driver
    SHARD = "scalelab.shard"  # on a trial-claims run: its trial ids' first two hex digits mod 64
    RUN_NAME = "mlflow.runName"
    PARENT_RUN_ID = "mlflow.parentRunId"
    RUN_COLOR = "mlflow.runColor"  # the run's colour in the UI's table and charts: its variant's


class ExperimentTag:
    """MLflow's own experiment tags that scalelab sets."""

    KIND = "mlflow.experimentKind"  # the UI's view of the experiment
    TRAINING = "custom_model_development"  # KIND's value for model training
    NOTE = "mlflow.note.content"  # the experiment's description (the sweep's)
    VIEW_PREFIX = "mlflow.sharedViewState."  # + id: a saved view of the runs (its "Views" menu)
    TRIALS_VIEW = "scalelab-trials"  # the id of scalelab's view: trials by variant


# Matplotlib's tab10, hex: the i-th variant of a sweep is drawn in VARIANT_COLOURS[i % 10] in
# the MLflow UI (Tag.RUN_COLOR) as in the plots (analysis/plots.py).
VARIANT_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


class Param:
    CLAIM_PREFIX = "scalelab.claim."  # + epoch: the driver that owns the trial (write-once)
    # on a trial-claims run, + "<trial id>.<epoch>": the driver (of any sweep) that trains the
    # trial (write-once), and the same key under TRIAL_RELEASE_PREFIX once it let it go
    TRIAL_CLAIM_PREFIX = "scalelab.trial_claim."
    TRIAL_RELEASE_PREFIX = "scalelab.trial_release."
    IDENTITY = "scalelab.identity"  # the canonical identity tree the trial id hashes
    N_PARAMS = "n_params"
    TOKENS = "tokens"


class Role:
    SWEEP = "sweep"
    TRIAL = "trial"
    SUPERSEDED = "superseded"  # a trial run whose science another run of the sweep holds
    TRIAL_CLAIMS = "trial-claims"  # the runs of TRIAL_CLAIMS_EXPERIMENT (one per Tag.SHARD)


class Status:
    """MLflow run statuses, and PREEMPTED: a job's outcome (the run stays RUNNING), and
    STARTING: what the views show of a SCHEDULED run whose latest attempt was launched and
    whose process is not running yet (`contract.trial_time.shown_status`), never written to
    MLflow, whose statuses are fixed."""

    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    PREEMPTED = "PREEMPTED"
    STARTING = "STARTING"


TERMINAL = frozenset({Status.FINISHED, Status.FAILED, Status.KILLED})


class Metric:
    """Metric names that more than one package reads."""

    VAL_LOSS_AT_GFLOP = "val/loss_at_gflop"  # val/loss with step = GFLOPs (MLflow refuses '@')
    EARLY_EXIT_PREFIX = (
        "early_exit/"  # jobs/training/validation.py's early-exit baseline, per alpha
    )
    EVAL_PREFIX = "eval/"  # downstream scores, eval/<task>/<metric> (`scalelab eval`)
    # tasks scored during training (eval.in_loop): downstream/<task>_acc, _acc_norm, _bpb
    IN_LOOP_PREFIX = "downstream/"


STANDALONE_EXPERIMENT = "scalelab-train"  # a job started without a sweep
# which driver trains a trial, whatever sweeps list it (orchestrator/ledger/trial_claims.py)
TRIAL_CLAIMS_EXPERIMENT = "scalelab-trial-claims"
EXPERIMENT_ENV = "SCALELAB_EXPERIMENT"


# A sweep's name: the sweep file's `name`, a folder of the results tables, an experiment.
SWEEP_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
SWEEP_NAME_MAX = 100


def sweep_name_problem(name: str) -> str | None:
    """Why `name` cannot be a sweep's name; None when it can."""
    import re

    if len(name) > SWEEP_NAME_MAX or not re.fullmatch(SWEEP_NAME_PATTERN, name):
        shown = name if len(name) <= 60 else name[:60] + "..."
        return (
            f"{shown!r} is not a sweep name (a letter or digit, then letters, digits, _ . -; "
            f"at most {SWEEP_NAME_MAX} characters)"
        )
    return None


def sweep_run_name(sweep: str) -> str:
    return f"sweep:{sweep}"


def trial_run_name(variant: str, size: str, trial_id: str) -> str:
    return f"{variant}-{size}-{trial_id[:8]}"


def job_ref(kind: str, ident: str) -> str:
    """A backend's handle of one attempt: 'slurm:123', 'ray:<task name>'."""
    return f"{kind}:{ident}"


def quote(value: str) -> str:
    """`value` as a literal of an MLflow filter string. MLflow's parser has no escapes: a
    value is quoted with whichever quote it does not contain."""
    for mark in ("'", '"'):
        if mark not in value:
            return f"{mark}{value}{mark}"
    raise ValueError(f"an MLflow filter cannot match a value with both quote marks: {value!r}")


def tag_filter(key: str, value: str) -> str:
    return f"tags.`{key}` = {quote(value)}"


def sweep_filter(sweep: str) -> str:
    """The parent run of `sweep`."""
    return f"{tag_filter(Tag.ROLE, Role.SWEEP)} and {tag_filter(Tag.SWEEP, sweep)}"


def trials_filter(sweep: str) -> str:
    """The trial runs of `sweep`."""
    return f"{tag_filter(Tag.ROLE, Role.TRIAL)} and {tag_filter(Tag.SWEEP, sweep)}"


def cancelled_filter(sweep: str) -> str:
    return f"{tag_filter(Tag.SWEEP, sweep)} and {tag_filter(Tag.CANCEL, '1')}"


def search_all(
    client: Any, experiment_ids: list[str], filter_string: str = "", page_size: int = 10_000
) -> list[Any]:
    """Every run that matches, page by page (`client`: an MlflowClient)."""
    runs, token = [], None
    while True:
        page = client.search_runs(
            experiment_ids, filter_string, max_results=page_size, page_token=token
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def sweep_experiment(client: Any, sweep: str) -> Any | None:
    """The experiment that holds `sweep`'s parent run (whatever it is called), or None."""
    for exp in client.search_experiments():
        if client.search_runs([exp.experiment_id], sweep_filter(sweep), max_results=1):
            return exp
    return None
