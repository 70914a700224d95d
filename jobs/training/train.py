"""One trial: `run(job, run_id) -> TrainResult`, and the process entry `python -m scalelab.jobs.training.train`.

Order of work: read the launcher's environment and check every input (devices, batch
division, data source, tokenizer) before any process group, file or MLflow run exists; then
make the data ready (every rank, before the process group: the first to take the data's
file lock tokenises, the others wait on the lock, never in a collective), fetch the newest
checkpoint from the job's `storage` if the folder has none as new (jobs.training.remote_checkpoints),
convert the checkpoint to resume from if it was written by another rank count (the same way), build the model,
wrap it in a DeepSpeed engine, resume from the newest checkpoint that verifies, on any rank
count (jobs.training.checkpoint), and train with logging, validation, checkpoints, divergence checks
and preemption handling. trials/<trial_id>/ gets job.json, deepspeed.json, curves.jsonl,
ckpt/ and result.json (written last).

Why one module: the training loop is one object (`_Trainer`) whose steps share its engine,
data and tracker; its set-up, checkpoints and evaluation live in the modules it calls.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scalelab.contract import runs
from scalelab.contract.outcome import EXIT_REFUSED, Ending, EnvironmentRefused, exit_code
from scalelab.contract.runs import EXPERIMENT_ENV, STANDALONE_EXPERIMENT, Metric, Status, Tag
from scalelab.contract.workdir import IDENTITY_FILE, JOB_FILE, RESULT_FILE, trial_dir
from scalelab.jobs import identity
from scalelab.jobs.checks import preflight
from scalelab.jobs.config import BranchSeed, JobConfig
from scalelab.jobs.data.device_inputs import prefetched
from scalelab.jobs.data.reader import prefix_stable_extent
from scalelab.jobs.data.trial import (
    Batch,
    TrainStream,
    open_data,
    prepare,
    train_windows,
    val_batches,
)
from scalelab.jobs.downstream.in_loop import open_in_loop
from scalelab.jobs.token_budget import total_steps, total_tokens
from scalelab.jobs.tracking.provenance import code_version, mlflow_params
from scalelab.jobs.tracking.tracker import Tracker
from scalelab.jobs.training import branch_seed, checkpoint, distributed, universal
from scalelab.jobs.training.accounting import device_peak_flops, mfu_metrics
from scalelab.jobs.training.branch_seed import BRANCHED_FROM
from scalelab.jobs.training.distributed import DistEnv
from scalelab.jobs.training.ds_config import BatchPlan, deepspeed_config
from scalelab.jobs.training.optim import adamw, lr_at, set_lr
from scalelab.jobs.training.preemption import PreemptionFlag, PreemptionVote
from scalelab.jobs.training.progress import Progress
from scalelab.jobs.training.remote_checkpoints import Storage, for_job
from scalelab.jobs.training.step_metrics import MetricWindow, Reduced
from scalelab.jobs.training.validation import evaluate, evaluate_binarised, evaluate_early_exit
from scalelab.models.flops import count_params, train_flops_per_token, train_flops_per_token_causal
from scalelab.models.hadamard_layers import kernels_used

DS_CONFIG_FILE = "deepspeed.json"
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainResult:
    status: Ending
    reason: str
    trial_id: str
    run_id: str | None
    steps: int
    tokens: int
    flops: float
    final_val_loss: float | None
    best_val_loss: float | None
    n_params: int
    n_nonembed: int
    wall_time_s: float
    final_metrics: dict[str, float] = field(default_factory=dict)  # e.g. early_exit/*
    metrics_pending: int = 0  # MLflow writes still spooled (MLflow was unreachable)
    diverged: bool = False  # deterministic: the same trial diverges again, never retried


def check_job(job: JobConfig, env: DistEnv) -> BatchPlan:
    """Every input error, raised before anything is started or written: the devices here,
    then the checks the orchestrator also runs before submitting (jobs/checks.py)."""
    distributed.check_devices(env)
    return preflight(job, env.world_size, env.device)


def run(job: JobConfig, run_id: str | None = None) -> TrainResult:
    """Train one trial to its budget (or until preempted / diverged)."""
    t0 = time.time()
    env = distributed.read_environment()
    try:
        plan = check_job(job, env)
        windows = _train_windows(job)
        prepare(job.data, job.seed, job.model, windows, job.storage)  # before any collective
        ckpt_dir = trial_dir(job.trial_id) / "ckpt"
        storage = for_job(job.storage, job.trial_id)
        fetched = storage.fetch(ckpt_dir) if storage else []  # likewise (one rank a node)
        checkpoint.prepare_resume(ckpt_dir, env.world_size)  # likewise
        distributed.init(env, job.deepspeed.dist_timeout_minutes)
        return _Trainer(job, env, plan, t0, storage, fetched).train(run_id)
    finally:
        distributed.shutdown(env)


def _train_windows(job: JobConfig) -> int:
    """Windows the trial reads: a wsd trial's prefix-stable order reads to its block's end."""
    windows = train_windows(total_tokens(job), job.train.global_batch_tokens, job.data.seq_len)
    return prefix_stable_extent(windows) if job.train.schedule == "wsd" else windows


def _checkpointed(fn: Any) -> Any:
    from torch.utils.checkpoint import checkpoint as ckpt

    return lambda *args: ckpt(fn, *args, use_reentrant=False)


class _Trainer:
    def __init__(self, job: JobConfig, env: DistEnv, plan: BatchPlan, t0: float,
                 storage: Storage | None = None,
                 remote_skipped: list[str] | tuple[str, ...] = ()) -> None:  # fmt: skip
        self.job, self.env, self.plan, self.t0 = job, env, plan, t0
        self.storage = storage if env.is_main else None  # rank 0 uploads (`then` of a save)
        self.remote_skipped = tuple(remote_skipped)
        self.dir = trial_dir(job.trial_id)
        self.ckpt_dir = self.dir / "ckpt"
        self.steps = total_steps(job)
        self.step_tokens = job.train.global_batch_tokens
        self.flops_per_token = train_flops_per_token(job.model, job.data.seq_len)
        self.causal_flops_per_token = train_flops_per_token_causal(job.model, job.data.seq_len)
        self.n_params = count_params(job.model)
        self.n_nonembed = count_params(job.model, non_embedding=True)
        self.tracker = Tracker(self.dir, enabled=env.is_main)
        self.diverged = False
        timeout_s = job.deepspeed.dist_timeout_minutes * 60
        self.writer = checkpoint.BackgroundWriter(timeout_s) if job.train.async_checkpoint else None
        self.kernels_reported: dict[str, object] = {}
        self.seeds: dict[int, list[BranchSeed]] = {}  # a trunk's cooldown branches by step
        for b in job.train.branch_seeds:
            self.seeds.setdefault(b.step, []).append(b)

    # -- set-up -----------------------------------------------------------------------
    def _open_data(self) -> None:
        """Memory-map the data and build this rank's streams. run() made the data ready before
        the process group started; here prepare() only finds its folder (no lock, no work)."""
        job, env, windows = self.job, self.env, _train_windows(self.job)
        root = prepare(job.data, job.seed, job.model, windows, job.storage)
        self.data = open_data(job.data, job.seed, root, job.model, windows)
        self.stream = TrainStream(
            self.data, job.seed, self.plan.micro_batch, self.plan.accum, env.rank,
            env.world_size, prefix_stable=job.train.schedule == "wsd",
        )  # fmt: skip
        self.val = val_batches(
            self.data, job.data.val_tokens, job.data.seq_len, self.plan.micro_batch, env.rank,
            env.world_size,
        )  # fmt: skip

    def _build_engine(self) -> None:
        import deepspeed

        job = self.job
        torch.manual_seed(job.seed)  # identical initial weights on every rank
        self.ds_config = deepspeed_config(job, self.plan, self.env.device)
        model = self._built_model()
        if job.deepspeed.activation_checkpointing:
            for block in model.blocks:
                block.mlp_update = _checkpointed(block.mlp_update)
                block.attn_update = _checkpointed(block.attn_update)
        universal.record_info(model)  # lets a checkpoint be resumed on another rank count
        self.optimizer = adamw(model, job.train)
        self.engine, *_ = deepspeed.initialize(
            model=model, optimizer=self.optimizer, config=self.ds_config, dist_init_required=False
        )
        if job.train.compile:  # the module compiled in place: its state-dict keys stay
            self.engine.compile()
        torch.manual_seed(job.seed * 1000 + 1 + self.env.rank)  # per-rank noise (dropout, ...)

    def _built_model(self) -> torch.nn.Module:
        """ZeRO 0-2 keep the whole model on every rank: it is placed on the rank's device in
        the compute dtype one module at a time, never whole in fp32 on the host; ZeRO-3
        builds it partitioned across the ranks (deepspeed.zero.Init), one module whole at a
        time. The initial values are the same either way (models/build.py)."""
        from scalelab.models.build import build_materialised, build_partitioned

        dtype = COMPUTE_DTYPES[self.job.train.dtype]
        if self.job.deepspeed.zero_stage == 3:
            return build_partitioned(self.job.model, self.ds_config)
        return build_materialised(self.job.model, self.env.device, dtype)

    def _write_job_files(self) -> None:
        if not self.env.is_main:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / JOB_FILE).write_text(self.job.model_dump_json(indent=2))
        (self.dir / IDENTITY_FILE).write_text(identity.canonical_json(self.job.identity_tree()))
        (self.dir / DS_CONFIG_FILE).write_text(json.dumps(self.ds_config, indent=2))

    def _start_tracking(self, run_id: str | None, resume_tokens: int) -> str | None:
        job = self.job
        tags = {
            Tag.TRIAL_ID: job.trial_id,
            Tag.VARIANT: job.model.variant,
            Tag.SIZE: job.model.size,
            Tag.CODE_VERSION: code_version(),
            Tag.WORLD_SIZE: str(self.env.world_size),
        }
        if run_id is None:  # a run of its own; a scheduler's run keeps its placement tags
            slurm_job = os.environ.get("SLURM_JOB_ID")
            tags[Tag.BACKEND] = "local"
            tags[Tag.JOB_REF] = runs.job_ref("slurm", slurm_job) if slurm_job else ""
            tags[Tag.IDENTITY_RULE] = identity.IDENTITY_RULE
        params = mlflow_params(job)
        run_id = self.tracker.start(
            run_id,
            experiment=os.environ.get(EXPERIMENT_ENV, STANDALONE_EXPERIMENT),
            run_name=runs.trial_run_name(job.model.variant, job.model.size, job.trial_id),
            tags=tags,
            params=params,
            resume_tokens=resume_tokens,  # points logged after it are logged again
        )
        if self.env.world_size > 1:
            box = [run_id]
            dist.broadcast_object_list(box, src=0)
            run_id = box[0]
        return run_id

    def _resume(self) -> dict[str, Any]:
        """The newest usable checkpoint's loop state (a fresh one if none); checkpoints that
        fail verification or loading are set aside (jobs.training.checkpoint) and reported."""
        fresh = {"step": 0, "tokens": 0, "flops": 0.0, "best_val": None, "min_loss": None}
        resumed = checkpoint.resume(self.engine, self.env, self.ckpt_dir)
        self.skipped_checkpoints = self.remote_skipped + resumed.skipped
        if resumed.state is None and resumed.engine_touched:
            self._build_engine()  # a failed load may have left part of its state behind
        return resumed.state or fresh

    # -- the loop ---------------------------------------------------------------------
    def train(self, run_id: str | None) -> TrainResult:
        self.in_loop = open_in_loop(self.job)  # its task data is here, before any step
        self._open_data()
        self._build_engine()
        state = self._resume()
        run_id = run_id or state.get("run_id")
        self._write_job_files()
        if self.storage is not None:  # the spool a lost node could not send, sent from here
            self.storage.fetch_spools(self.dir)
        run_id = self._start_tracking(run_id, state["tokens"])
        state["run_id"] = run_id
        if state.get(BRANCHED_FROM):  # seeded by a trunk (jobs/training/branch_seed.py)
            trunk = state[BRANCHED_FROM]
            self.tracker.set_tag(Tag.BRANCHED_FROM, f"{trunk['trial_id']}@{trunk['step']}")
        if self.skipped_checkpoints:
            self.tracker.set_tag(
                Tag.CHECKPOINTS_SKIPPED, " | ".join(self.skipped_checkpoints)[:5000]
            )
        if state["step"] in self.seeds:  # preempted right at a seed step: seed them now
            self._seed_branches(state["step"])
        try:
            with PreemptionFlag() as flag:
                status, reason, final_val = self._loop(state, flag)
            if self.writer is not None:
                self.writer.wait()  # the last checkpoint is on disk before the result says so
            final_metrics = self._final_evaluation(state) if status == Status.FINISHED else {}
        except BaseException as e:
            if self.writer is not None:
                self.writer.abandon()  # unmarked, so never resumed; the older ones stay
            self.tracker.set_tag(Tag.ERROR, f"{type(e).__name__}: {e}"[:5000])
            self.tracker.finish(Status.FAILED)
            if self.storage is not None:
                self.storage.upload_spools(self.dir)
            raise
        result = TrainResult(
            status=status,
            reason=reason,
            trial_id=self.job.trial_id,
            run_id=run_id,
            steps=state["step"],
            tokens=state["tokens"],
            flops=state["flops"],
            final_val_loss=final_val,
            best_val_loss=state["best_val"],
            n_params=self.n_params,
            n_nonembed=self.n_nonembed,
            wall_time_s=time.time() - self.t0,
            final_metrics=final_metrics,
            metrics_pending=self.tracker.pending(),
            diverged=self.diverged,
        )
        # result.json first: a run MLflow shows ended has its result (the final status
        # reaches MLflow inside finish()); then again, with what the spool still holds
        self._write_result(result)
        self.tracker.finish(None if status == Status.PREEMPTED else status)
        result = replace(result, metrics_pending=self.tracker.pending())
        self._write_result(result)
        if self.storage is not None:  # the spool as the run ended, for whoever sends it
            self.storage.upload_spools(self.dir)
        return result

    def _write_result(self, result: TrainResult) -> None:
        if self.env.is_main:
            tmp = self.dir / (RESULT_FILE + ".tmp")
            tmp.write_text(json.dumps(asdict(result), indent=2))
            tmp.replace(self.dir / RESULT_FILE)

    def _loop(self, state: dict[str, Any], flag: PreemptionFlag) -> tuple:
        """Steps until the budget. Nothing is read back from the device except at sync steps
        (log, eval, checkpoint and the last step; jobs/training/step_metrics.py), where the losses are
        checked for divergence, and for a progress line (jobs/training/progress.py). Before every step's update the ranks vote on whether one was
        signalled (jobs/training/preemption.py, on the host): if so the step ends in a checkpoint."""
        env, engine, t = self.env, self.engine, self.job.train
        peak, accum = device_peak_flops(env.device), self.plan.accum
        # the log window's sums over its steps (host), in the loop state: a checkpoint inside
        # a window carries them, so the point logged after a resume is the whole window's
        log = state.setdefault("log_window", _new_log_window())
        timed_steps, log_t = 0, time.perf_counter()  # this process's steps, for tokens/s
        final_val = state.get("last_val")
        inputs = prefetched(self._micro_batches(state["step"]), env.device, ahead=accum)
        window = MetricWindow(accum, state["step"])
        vote = PreemptionVote(env)
        first_step = state["step"]
        progress = Progress(
            steps=self.steps, step_tokens=self.step_tokens, first_step=first_step,
            interval_s=t.progress_interval_s, flops_per_token=self.flops_per_token,
            world_size=env.world_size, peak_flops=peak, is_main=env.is_main,
        )  # fmt: skip
        while state["step"] < self.steps:
            step = state["step"]
            lr = lr_at(step, self.steps, t)
            set_lr(self.optimizer, lr)
            fraction = step / self.steps
            done = step + 1
            sync = done == self.steps or done in self.seeds or any(
                done % every == 0 for every in (t.log_interval, t.eval_interval, t.checkpoint_interval)
            )  # fmt: skip
            for a in range(accum):
                x, y, kw = next(inputs)  # kw: pad_mask for classification
                out = engine(x, y, progress=fraction, **kw)
                window.add(out)
                if a == accum - 1:
                    window.end_step()
                    last = done == self.steps
                    preempt, timed = (False, False) if last else vote.cast(flag, progress.due())
                    report = preempt or progress.wanted(done, timed)
                    if sync or preempt:  # decide before the update: the state is still good
                        reduced = window.reduce(env.world_size)
                        window = MetricWindow(accum, done)
                        progress.add(reduced)
                        problem = self._divergence(reduced, state)
                        if problem:
                            self._save(state)
                            self.tracker.set_tag(Tag.ERROR, problem)
                            self.tracker.set_tag(Tag.DIVERGED, "1")
                            self.diverged = True
                            return Status.FAILED, problem, None
                        sums = log["sums"]
                        for k, v in reduced.means.items():
                            sums[k] = sums.get(k, 0.0) + v * reduced.steps
                        log["steps"] += reduced.steps
                        timed_steps += reduced.steps
                    elif report:  # a look only: the window goes on, its logged means unchanged
                        progress.add(window.reduce(env.world_size))
                engine.backward(out.loss)
                engine.step()
            state["step"] = done
            state["tokens"] += self.step_tokens
            state["flops"] += self.step_tokens * self.flops_per_token
            if done == first_step + 1 or sync or preempt:
                self._report_kernels()  # after the first step: every kernel has run once
            if report:
                progress.report(done, state["tokens"], lr)
            if not (sync or preempt):
                continue
            if done % t.log_interval == 0 or done == self.steps:
                tok_s = timed_steps * self.step_tokens / (time.perf_counter() - log_t)
                point = {k: v / log["steps"] for k, v in log["sums"].items()}
                point |= {
                    "train/lr": lr,
                    "compute/flops": state["flops"],
                    "compute/tokens": state["tokens"],
                    "perf/tokens_per_s": tok_s,
                }
                point |= mfu_metrics(
                    tok_s, self.flops_per_token, self.causal_flops_per_token, env.world_size, peak
                )
                self.tracker.log(done, state["tokens"], state["flops"], point)
                log = state["log_window"] = _new_log_window()
                timed_steps, log_t = 0, time.perf_counter()
            if done % t.eval_interval == 0 or done == self.steps:
                final_val = self._validate(state, fraction)
            if preempt:
                self._save(state)
                sig = flag.signal or 0
                return Status.PREEMPTED, f"signal {sig} (checkpointed at step {done})", final_val
            if done % t.checkpoint_interval == 0 or done == self.steps or done in self.seeds:
                self._save(state)
            if done in self.seeds:
                self._seed_branches(done)
        return Status.FINISHED, "", final_val

    def _report_kernels(self) -> None:
        """Which Hadamard kernel ran (models/hadamard_layers.py `kernels_used`) on the run's
        tag, and why `auto` fell back to the torch path where it did; after the first step
        and at sync steps."""
        used = kernels_used()
        if not used or used == self.kernels_reported:
            return
        self.kernels_reported = used
        value = "+".join(sorted({u.backend for u in used.values()}))
        fallbacks = [f"{label}: {u.fallback}" for label, u in used.items() if u.fallback]
        if fallbacks:
            value += " (auto fell back from triton: " + "; ".join(fallbacks) + ")"
            # each rank its own line in the trial's log, whatever the warning filters say
            print(f"rank {self.env.rank}: Hadamard transform on {value}", file=sys.stderr)
        self.tracker.set_tag(Tag.HADAMARD_BACKEND, value[:5000])

    def _micro_batches(self, first_step: int) -> Iterator[Batch]:
        """This rank's micro-batches from `first_step` to the end, in order."""
        for step in range(first_step, self.steps):
            yield from self.stream.micro_batches(step)

    def _divergence(self, reduced: Reduced, state: dict[str, Any]) -> str:
        """The first step of the window whose loss is not finite or exceeds
        divergence_factor x the running minimum (state['min_loss'] follows the steps)."""
        for i, loss in enumerate(reduced.step_losses):
            step = reduced.first_step + i
            if not math.isfinite(loss):
                return f"diverged: non-finite loss {loss} at step {step}"
            low = state["min_loss"]
            if low is not None and loss > self.job.train.divergence_factor * low:
                return (
                    f"diverged: loss {loss:.4g} at step {step} exceeds "
                    f"{self.job.train.divergence_factor} x its minimum {low:.4g}"
                )
            state["min_loss"] = loss if low is None else min(low, loss)
        return ""

    def _validate(self, state: dict[str, Any], progress: float) -> float:
        metrics = evaluate(self.engine, self.val, self.env, progress)  # + val/accuracy
        if self.in_loop is not None:  # every rank the same items: ZeRO-3's gathers line up
            metrics |= self.in_loop.score(self.engine.module)
        val = metrics["val/loss"]
        state["best_val"] = val if state["best_val"] is None else min(state["best_val"], val)
        state["last_val"] = val
        self.tracker.log(state["step"], state["tokens"], state["flops"], metrics)
        gflop = int(state["flops"] / 1e9)  # the UI's x-axis becomes compute
        self.tracker.log(gflop, state["tokens"], state["flops"], {Metric.VAL_LOSS_AT_GFLOP: val})
        return val

    def _final_evaluation(self, state: dict[str, Any]) -> dict[str, float]:
        """The early-exit baseline at train.early_exit_alphas (models.early_exit), and a TSA
        model validated with soft gates read out with its binary ones."""
        metrics = evaluate_binarised(self.engine, self.val, self.env, progress=1.0)
        alphas = self.job.train.early_exit_alphas
        if alphas:
            metrics |= evaluate_early_exit(self.engine, self.val, self.env, alphas)
        if metrics:
            self.tracker.log(state["step"], state["tokens"], state["flops"], metrics)
        return metrics

    def _seed_branches(self, step: int) -> None:
        """A trunk at a branch's cooldown start: its checkpoint of this step seeds the branch
        (jobs/training/branch_seed.py), once the checkpoint is complete."""
        if self.writer is not None:
            self.writer.wait()
        if self.env.is_main:
            tag_dir = checkpoint.latest(self.ckpt_dir)
            for b in self.seeds[step]:
                branch_seed.seed(tag_dir, self.job.trial_id, b)
        distributed.barrier(self.env)

    def _save(self, state: dict[str, Any]) -> None:
        keep = self.job.train.keep_checkpoints
        then = self.storage.uploader(self.dir, keep) if self.storage else None
        checkpoint.save(self.engine, self.env, self.ckpt_dir, state, keep, self.writer, then)


def _new_log_window() -> dict[str, Any]:
    return {"steps": 0, "sums": {}}


def load_job(path: str | Path) -> JobConfig:
    """A JobConfig from a YAML or JSON file."""
    import yaml

    text = Path(path).read_text()
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    return JobConfig.model_validate(data)


def main(argv: list[str] | None = None) -> int:
    """`python -m scalelab.jobs.training.train CONFIG [RUN_ID]` under any launcher; exit 75 =
    requeue me, 78 = this node cannot run the trial as placed (jobs/training/devices.py)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        result = run(load_job(argv[0]), argv[1] if len(argv) > 1 else None)
    except EnvironmentRefused as e:
        print(f"[scalelab] refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps(asdict(result)))
    return exit_code(result.status)


if __name__ == "__main__":
    sys.exit(main())
