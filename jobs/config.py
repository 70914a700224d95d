"""Typed, frozen configuration of one training job (torch-free).

A trial is a fully resolved `JobConfig`. Its science fields (model, data, train, seed)
define the trial's identity (jobs/identity.py); fields marked `NotIdentity` do not: the
cadence of logs, evaluations and checkpoints, `deepspeed` (how the same computation is laid
out on devices), `eval` (what is measured on the trained model), `data.tokenizer_file`
(where a vocabulary is), `train.compile` (how the same computation is executed),
`train.async_checkpoint` (how checkpoints are written) and `storage` (where they are also
kept: contract/storage.py).

Why one module: a job's whole config is one pydantic tree (the sweep's JSON Schema, the
trial id and the checks read it as one); each class is one section of the YAML.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from scalelab.contract.config import FrozenConfig, NotIdentity
from scalelab.contract.storage import StorageURI
from scalelab.jobs import identity
from scalelab.models.config import ModelConfig

MAX_SEED = 2**32 - 1  # numpy's and most libraries' seed range
# DeepSpeed keys that jobs/training/ds_config.py derives from the science fields, each with the key that
# decides it: deepspeed.extra may not set them (it would change what is computed, silently).
DERIVED_DEEPSPEED_KEYS = {
    "bf16": "train.dtype",
    "fp16": "train.dtype",
    "amp": "train.dtype",
    "torch_autocast": "train.dtype",
    "data_types": "train.grad_accum_dtype",
    "communication_data_type": "train.grad_accum_dtype",
    "seq_parallel_communication_data_type": "train.grad_accum_dtype",
    "prescale_gradients": "train.grad_accum_dtype",
    "gradient_predivide_factor": "train.grad_accum_dtype",
    "gradient_clipping": "train.grad_clip",
    "train_batch_size": "train.global_batch_tokens",
    "train_micro_batch_size_per_gpu": "deepspeed.micro_batch_size",
    "gradient_accumulation_steps": "deepspeed.micro_batch_size",
    "optimizer": "train.lr",
    "scheduler": "train.schedule",
}


class JobCheckError(ValueError):
    """A job input that cannot run, naming the JobConfig keys involved ('data.seq_len'),
    the first the likeliest to change. Raised in validators that span several sections
    (pydantic keeps the exception, so a sweep's error points at the line of the key that
    an axis set) and by the checks of jobs.checks."""

    def __init__(self, keys: str | tuple[str, ...], message: str):
        self.keys = (keys,) if isinstance(keys, str) else keys
        super().__init__(message)

    def __reduce__(self) -> tuple[type, tuple[tuple[str, ...], str]]:
        return type(self), (self.keys, str(self))  # Ray sends a job's exception back pickled


class MissingData(JobCheckError):
    """The data a valid config names is not here: no such file, a hub dataset neither in
    the local cache nor reachable. A dry-run still plans the sweep and lists it as a
    blocker; a submit refuses it (docs/sweep-yaml.md, 'Dry-run')."""


class DataConfig(FrozenConfig):
    """Where tokens come from and how they are cut."""

    source: str = Field(
        "builtin:pydoc",
        description="builtin:pydoc (offline English text shipped with CPython), "
        "builtin:copy / builtin:sort (synthetic sequence tasks), "
        "builtin:classification (synthetic easy/hard classification), "
        "builtin:topics (generated labelled sentences for text classification), a local "
        ".txt/.csv/.jsonl/.parquet file or folder, or hf:<name> / hf:<owner>/<name>[/<config>] "
        "for a datasets hub name",
    )
    text_field: str = "text"
    # Classification (model.task='classify'; jobs/data/classification.py)
    text_pair_field: str | None = Field(
        None, description="second text column (SNLI's hypothesis), joined by pair_separator"
    )
    pair_separator: str = Field("\n", description="text put between the two fields of a pair")
    label_field: str | None = Field(
        None, description="label column (int, bool or string); default 'label'"
    )
    val_split: str | None = Field(
        None,
        description="validation split: None = the dataset's 'validation' split, else its "
        "'test' split, else a seeded val_fraction of train; 'train' forces the seeded split",
    )
    tokenizer: str = Field(
        "byte",
        description="byte (vocab 256), gpt2 (GPT-2 BPE, offline), or a path to a "
        ".tiktoken file or a tokenizers JSON",
    )
    # Placement, not science: where GPT-2's vocabulary is on this machine.
    tokenizer_file: Annotated[str | None, NotIdentity] = Field(
        None,
        description="for tokenizer gpt2 when its vocabulary is not installed: "
        "r50k_base.tiktoken, or a folder with GPT-2's vocab.bpe and encoder.json",
    )
    seq_len: int = Field(256, ge=2)
    val_fraction: float = Field(
        0.05,
        gt=0.0,
        lt=0.5,
        description="classification data without a validation split: the seeded fraction "
        "of train held out (language-model text has a validation split fixed per source "
        "and tokenizer)",
    )
    val_tokens: int = Field(
        65_536, ge=1, description="validation loss is measured on this many tokens"
    )


# Past any real run (frontier runs: ~1e13 tokens in batches of ~1e7): a number beyond these
# is a typo, refused before anything starts rather than when the job allocates it.
MAX_TOKENS = 10**15
MAX_BATCH_TOKENS = 10**9


class BranchSeed(FrozenConfig):
    """A trunk's checkpoint at `step` seeds trial `trial_id` (orchestrator/plan/branching.py)."""

    step: int = Field(ge=1)
    trial_id: str = Field(pattern=r"^[0-9a-f]{16}$")


class TrainConfig(FrozenConfig):
    """The optimisation: budgets, batch, schedule, precision, logging cadence."""

    tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="training tokens; or give tokens_per_param or flops"
    )
    tokens_per_param: float | None = Field(None, gt=0)
    flops: float | None = Field(None, gt=0, description="training compute budget in FLOPs")
    global_batch_tokens: int = Field(8192, ge=1, le=MAX_BATCH_TOKENS)
    lr: float = Field(3e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_fraction: float = Field(0.05, ge=0, lt=1)
    warmup_steps: int | None = Field(
        None,
        ge=0,
        description="warm-up length in optimizer steps, instead of warmup_fraction x steps "
        "(wsd trials that differ only in their budget share a trunk only with equal warm-ups)",
    )
    schedule: Literal["cosine", "linear", "constant", "wsd"] = Field(
        "cosine",
        description="after the warm-up: cosine or linear decay to min_lr_ratio x lr, constant, "
        "or wsd (warmup-stable-decay: lr until the last cooldown_fraction of the steps, then "
        "a cooldown_shape decay to min_lr_ratio x lr; jobs/schedule.py)",
    )
    cooldown_fraction: float = Field(
        0.2, gt=0, le=1, description="train.schedule='wsd': the share of the steps that decay"
    )
    cooldown_shape: Literal["1-sqrt", "linear"] = Field(
        "1-sqrt", description="train.schedule='wsd': the decay's shape, 1 - sqrt(x) or 1 - x"
    )
    branch: Annotated[bool, NotIdentity] = Field(
        True,
        description="train.schedule='wsd': share one trunk with the sweep's trials that differ "
        "only in their budget, each cooling down from the trunk's checkpoint at its cooldown "
        "start (orchestrator/plan/branching.py). Placement, not in the trial id",
    )
    branch_seeds: Annotated[tuple[BranchSeed, ...], NotIdentity] = Field(
        (),
        description="set by the orchestrator on a trunk, not by hand: at each step, its "
        "checkpoint and curve so far seed the trial it names (placement, not in the trial id)",
    )
    weight_decay: float = Field(0.1, ge=0)
    weight_decay_on: Literal["matrices", "all"] = Field(
        "matrices",
        description="which parameters weight decay applies to: matrices (Linear weights; "
        "not embeddings nor the tied head, biases, norms, gains) or all (every parameter, "
        "as MLX's AdamW does when given the whole model, e.g. the TSA authors' MLX runs)",
    )
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = Field(1.0, ge=0)
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    # Resolved on validation (None for fp32 models, whose ids do not name it: their gradients
    # are fp32 anyway); a bf16/fp16 trial's id names it.
    grad_accum_dtype: Literal["fp32", "bf16"] | None = Field(
        None,
        description="with dtype bf16 or fp16: the dtype gradients are accumulated over "
        "micro-batches and reduced across ranks in (DeepSpeed's data_types.grad_accum_dtype "
        "and communication_data_type); default fp32. bf16 (with dtype bf16 only) is "
        "DeepSpeed's own default, kept for comparison and for ZeRO stage 0",
    )
    compile: Annotated[bool, NotIdentity] = Field(
        False,
        description="torch.compile the model (execution, not science: not in the trial id)",
    )
    log_interval: Annotated[int, NotIdentity] = Field(10, ge=1)
    progress_interval_s: Annotated[float, NotIdentity] = Field(
        10.0,
        gt=0,
        description="a progress line (step, tokens, loss, tokens/s, MFU, ETA) in the trial's "
        "log every this many seconds of wall time, and after the first and the last step",
    )
    eval_interval: Annotated[int, NotIdentity] = Field(100, ge=1)
    checkpoint_interval: Annotated[int, NotIdentity] = Field(200, ge=1)
    keep_checkpoints: Annotated[int, NotIdentity] = Field(2, ge=1)
    async_checkpoint: Annotated[bool, NotIdentity] = Field(
        False,
        description="write checkpoints on a background thread: the step waits only for the "
        "state's copy to host memory; the checkpoint counts once written, flushed and "
        "digested (jobs/training/async_save.py). Placement, not in the trial id",
    )
    divergence_factor: float = Field(
        4.0, gt=1, description="stop if loss exceeds this x its running min"
    )
    early_exit_alphas: tuple[float, ...] = Field(
        (),
        description="after training, evaluate the LM with confidence early exit "
        "(models.early_exit) at these active fractions alpha in (0, 1]; logs "
        "early_exit/val_loss_a<alpha> and early_exit/alpha_a<alpha>",
    )

    @field_validator("early_exit_alphas")
    @classmethod
    def _alphas_in_unit_interval(cls, alphas: tuple[float, ...]) -> tuple[float, ...]:
        bad = [a for a in alphas if not 0.0 < a <= 1.0]
        if bad or len(set(alphas)) != len(alphas):
            raise ValueError(f"need distinct active fractions in (0, 1], got {list(alphas)}")
        return alphas

    @model_validator(mode="after")
    def _gradient_dtype(self) -> TrainConfig:
        accum = self.grad_accum_dtype
        if self.dtype == "fp32":
            if accum == "bf16":
                raise ValueError("grad_accum_dtype='bf16' needs dtype='bf16' (fp32 models "
                                 "accumulate their fp32 gradients in fp32)")  # fmt: skip
            self.__dict__["grad_accum_dtype"] = None  # frozen: resolved once, here
        elif accum is None:
            self.__dict__["grad_accum_dtype"] = "fp32"
        elif accum != "fp32" and accum != self.dtype:
            raise ValueError(f"grad_accum_dtype={accum!r} needs dtype={accum!r} or 'fp32'")
        return self

    @model_validator(mode="after")
    def _cooldown_needs_wsd(self) -> TrainConfig:
        fields = type(self).model_fields
        given = [k for k in ("cooldown_fraction", "cooldown_shape")
                 if getattr(self, k) != fields[k].default]  # fmt: skip
        if given and self.schedule != "wsd":
            raise ValueError(
                f"{' and '.join(sorted(given))} shape the cooldown of train.schedule='wsd' "
                f"(this trial's schedule is {self.schedule!r}): set schedule: wsd or drop them"
            )
        return self

    @model_validator(mode="after")
    def _one_budget(self) -> TrainConfig:
        given = [k for k in ("tokens", "tokens_per_param", "flops") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one training budget of tokens, tokens_per_param, flops (got {given or 'none'})"
            )
        return self


class DeepSpeedConfig(FrozenConfig):
    """How the computation is sharded; placement, not science."""

    zero_stage: Literal[0, 1, 2, 3] = 0
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="sequences per rank per forward; None: the whole per-rank share "
        "(no gradient accumulation). The global batch stays train.global_batch_tokens",
    )
    offload_optimizer: bool = False
    activation_checkpointing: bool = False
    # Gradient buckets and communication (docs/running-on-slurm.md, "Gradient memory and
    # communication"); jobs/training/ds_config.py writes them, orchestrator/plan/memory.py counts them.
    overlap_comm: bool = Field(
        True,
        description="ZeRO-1/2 without BF16_Optimizer, and ZeRO-3: reduce gradient buckets "
        "while the backward pass runs (zero_optimization.overlap_comm; ZeRO-1/2 then keep "
        "two buckets instead of one). BF16_Optimizer reduces after the backward pass anyway",
    )
    reduce_bucket_size: int | None = Field(
        None,
        ge=1,
        description="elements per gradient-reduction bucket (zero_optimization."
        "reduce_bucket_size; None: DeepSpeed's 5e8). ZeRO-1/2 without BF16_Optimizer keep one "
        "(two with overlap_comm) during the backward pass, ZeRO-3 one for the whole run; "
        "BF16_Optimizer ignores it (fixed 5e8-element all-reduce pieces)",
    )
    dist_timeout_minutes: float = Field(
        30.0,
        gt=0,
        le=24 * 60,
        description="how long a collective waits for a slow rank before the job fails "
        "(torch's default: 10 min under NCCL). 30 covers the longest one-sided waits of the "
        "5.6B ladder rung on 64 GPUs: a synchronous checkpoint and a universal-checkpoint "
        "load after a rank-count change (docs/training.md, 'Checkpoints')",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="raw DeepSpeed keys, merged last"
    )


class DownstreamEval(FrozenConfig):
    """lm-eval tasks run on the trial once it has trained, as a step of the trial: its
    scores go to the trial's run, tasks whose scores the run holds are skipped
    (docs/evaluation.md, 'In a sweep')."""

    tasks: tuple[str, ...] = Field(
        ...,
        min_length=1,
        description="lm-eval task or group names (piqa, hellaswag, arc_easy, blimp), "
        "scalelab_zen (shipped, offline), or paths to local task YAMLs",
    )
    limit: int | None = Field(None, ge=1, description="items per task (all when unset)")
    mode: Literal["inference", "soft"] = Field(
        "inference",
        description="TSA and BudgetFormer on their inference path (sparse tokens, top-k "
        "heads) or in their soft, training-time mode",
    )
    batch_size: int = Field(16, ge=1, description="sequences per forward")

    @field_validator("tasks")
    @classmethod
    def _named(cls, tasks: tuple[str, ...]) -> tuple[str, ...]:
        return _task_names(tasks)


def _task_names(tasks: tuple[str, ...]) -> tuple[str, ...]:
    if any(not t.strip() for t in tasks):
        raise ValueError("a task name is empty")
    if len(set(tasks)) != len(tasks):
        raise ValueError("a task is named twice")
    return tasks


class InLoopEval(FrozenConfig):
    """Multiple-choice tasks scored at every validation while the trial trains, on a fixed
    subset of each (docs/evaluation.md, 'During training')."""

    tasks: tuple[str, ...] = Field(
        ...,
        min_length=1,
        description="multiple-choice lm-eval task names (piqa, arc_easy, hellaswag), "
        "scalelab_zen, or paths to local task YAMLs",
    )
    items: int = Field(100, ge=1, description="questions per task: its first ITEMS documents")
    batch_size: int = Field(32, ge=1, description="sequences per forward")

    @field_validator("tasks")
    @classmethod
    def _named(cls, tasks: tuple[str, ...]) -> tuple[str, ...]:
        return _task_names(tasks)


class EvalConfig(FrozenConfig):
    """What is measured on the model beyond the validation loss (not in the trial id: the
    trained model is the same)."""

    downstream: DownstreamEval | None = None
    in_loop: InLoopEval | None = None


class JobConfig(FrozenConfig):
    """One fully resolved trial."""

    model: ModelConfig
    data: DataConfig = DataConfig()
    train: TrainConfig
    deepspeed: Annotated[DeepSpeedConfig, NotIdentity] = DeepSpeedConfig()
    seed: int = Field(0, ge=0, le=MAX_SEED)
    eval: Annotated[EvalConfig, NotIdentity] = EvalConfig()
    storage: Annotated[StorageURI | None, NotIdentity] = Field(
        None,
        description="object storage the trial's checkpoints and metric spool are also kept in "
        "(a pyarrow.fs URI, e.g. s3://bucket/prefix), for nodes that share no filesystem; "
        "set by the sweep's `storage:` (docs/running-on-ray.md)",
    )

    @model_validator(mode="after")
    def _sections_agree(self) -> JobConfig:
        """The checks that need more than one section (each names the key to change)."""
        data, train, model = self.data, self.train, self.model
        derived = [k for k in self.deepspeed.extra if k in DERIVED_DEEPSPEED_KEYS]
        if derived:
            decided_by = ", ".join(f"{k!r} by {DERIVED_DEEPSPEED_KEYS[k]}" for k in derived)
            raise JobCheckError(
                "deepspeed.extra",
                f"deepspeed.extra may not set {', '.join(map(repr, derived))}: scalelab "
                f"derives them from the trial's science fields ({decided_by}; "
                "jobs/training/ds_config.py), so the trial id says what was computed",
            )
        if train.early_exit_alphas and model.task != "lm":
            raise JobCheckError(
                "train.early_exit_alphas",
                "train.early_exit_alphas needs model.task='lm' (it reads out tokens)",
            )
        for name, wanted in (("downstream", self.eval.downstream), ("in_loop", self.eval.in_loop)):
            if wanted is not None and model.task != "lm":
                raise JobCheckError(
                    (f"eval.{name}", "model.task"),
                    f"eval.{name} scores a language model; model.task='classify' has none",
                )
        if data.seq_len > model.block_size:
            raise JobCheckError(
                ("data.seq_len", "model.block_size"),
                f"data.seq_len={data.seq_len} exceeds model.block_size={model.block_size}",
            )
        if train.global_batch_tokens % data.seq_len:
            raise JobCheckError(
                ("train.global_batch_tokens", "data.seq_len"),
                f"train.global_batch_tokens={train.global_batch_tokens} is not a multiple of "
                f"data.seq_len={data.seq_len}",
            )
        return self

    def identity_tree(self) -> dict[str, Any]:
        """What the trial id hashes (jobs/identity.py)."""
        return identity.identity_tree(self)

    @property
    def trial_id(self) -> str:
        """sha256 of the canonical JSON of the identity tree, first 16 hex digits."""
        return identity.trial_id(self)


def load_recorded(recorded: dict[str, Any]) -> JobConfig:
    """A JobConfig from a recorded job.json (or its MLflow params), each field missing from it
    at the default it had when the trial ran (jobs/identity.py, CHANGED_DEFAULTS)."""
    return JobConfig.model_validate(identity.with_changed_defaults(recorded))
