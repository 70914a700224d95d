"""Bytes per GPU of one trial: model states by ZeRO stage, activations, host RAM, checkpoint
(torch-free; the planner in orchestrator/plan/planner.py puts them together).

Model states follow the ZeRO paper (Rajbhandari et al. 2020, Sec. 3.1): with Psi parameters,
mixed-precision Adam keeps 2 Psi of bf16 parameters, 2 Psi of bf16 gradients and K Psi = 12 Psi
of fp32 optimizer states (a master copy of the weights, the first and second moments);
ZeRO-1 divides the optimizer states by the data-parallel degree N_d, ZeRO-2 the gradients
too, ZeRO-3 the parameters too. Written here the way DeepSpeed 0.19 actually allocates them
(measured on its engines by tests/orchestrator/test_memory_engines.py, each within 10%):

| stage | parameters | gradients | optimizer (fp32 master + Adam moments) |
|---|---|---|---|
| 0, fp32 | 4 Psi | 4 Psi | 8 Psi (Adam updates the weights themselves) |
| 0, bf16 | 2 Psi | 2 Psi | 12 Psi (+ a 4 Psi fp32 copy of the gradients during the step) |
| 1, 2 | b_p Psi | b_g Psi / N_d | 12 Psi / N_d (a fp32 master copy even when training in fp32) |
| 3 | b_p Psi / N_d (+ small tensors whole) | b_g Psi / N_d | 12 Psi / N_d |

b_p: bytes of the model dtype; b_g: of the gradient-accumulation dtype (DeepSpeed's
`data_types.grad_accum_dtype`, default the model dtype). ZeRO-1 here reduce-scatters every
micro-batch into a gradient partition, so it needs what ZeRO-2 needs; with bf16 and fp32
accumulation it becomes DeepSpeed's BF16_Optimizer, which keeps the full gradient in fp32
and each parameter's bf16 gradient beside it (it zeroes them after the step, never frees
them: b_p Psi more, found by the acceptance check's training steps), unless
`bf16.immediate_grad_update` adds each bf16 gradient into the fp32 buffer as backward
produces it and frees it (jobs/training/ds_config.py always sets it). BF16_Optimizer ignores
`reduce_bucket_size` and `overlap_comm`: after the last micro-batch's backward pass it
all-reduces its fp32 gradient buffers (one per optimizer parameter group), a group alone in
place, groups below DeepSpeed's fixed 5e8 elements together through a flat copy: counted
as a transient of b_g min(Psi, 5e8) (an upper bound: a 5.6B model's groups are each past
5e8, reduced in place).
ZeRO-3 keeps tensors smaller than `stage3_param_persistence_threshold` whole on every rank.
Optimizer offload moves the master copy, the moments and a fp32 gradient partition to host
RAM. DeepSpeed's gradient buckets (`reduce_bucket_size` elements, two with `overlap_comm`)
live during the backward pass (ZeRO-1/2) or for the whole run (ZeRO-3, in the
communication dtype: fp32 for bf16 trials, jobs/training/ds_config.py).

Activations follow Korthikanti et al. 2022 (Sec. 4.1: s b h (34 + 5 a s / h) bytes per layer
for 16-bit activations, dropout masks included) adapted to this project's blocks, counted
in elements per token and layer (x16-bit: 2 bytes each):

    dense block, flash/memory-efficient SDPA, no dropout:    16 h
        LN1 input h, QKV input h, Q K V 3h, attention output h (also W_O's input: SDPA
        returns it in the layout the head merge needs), LN2 input h, MLP input h, GELU
        input 4h, second linear's input 4h; plus fp32 LN statistics (4) and SDPA's
        log-sum-exp (a)
    math SDPA (a mask, or no fused kernel):                  + a s (softmax output), no log-sum-exp
    dropout p > 0, a mask per element where it acts (`model.dropout_sites`):
        attention output h, FFN hidden 4h, FFN output h; the attention probabilities
        + 2 a s (mask and dropped copy) with math SDPA, which CPU falls back to for it
        (CUDA's fused kernels keep a random seed instead); the embedding h, once
    each seam's component (models/mechanism.py, `Component.activations`):
        + what it keeps inside every block, and around the updates of the blocks it names
    activation checkpointing (attention and MLP each):       2 h, + what is kept around them

(measured against `torch.autograd.graph.saved_tensors_hooks` by
tests/orchestrator/test_memory_activations.py). The LM head keeps the final norm's input
and output, the logits over the padded vocabulary (models/vocab.py; held by the returned
ModelOutput) and the fp32 log-softmax output (the loss is taken on fp32 logits); the
backward pass adds the fp32 logits gradient and its padded copy in the model dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from scalelab.models.config import ModelConfig
from scalelab.models.vocab import padded_vocab_size

GIB = 2**30
# Elements of a dropout mask per token at each site of a block, in units of d_model
# (the embedding's is counted once, with the LM head; the probabilities' are a s, apart)
DROPOUT_MASK_WIDTH = {
    "embedding": 0, "attention_probs": 0, "attention_out": 1, "ffn_hidden": 4, "ffn_out": 1,
}  # fmt: skip
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_MOMENTS = 8  # exp_avg + exp_avg_sq, fp32
MASTER = 4  # fp32 master copy of the weights

# DeepSpeed 0.19's defaults (deepspeed/runtime/zero/config.py); tests compare them with it.
DS_REDUCE_BUCKET = 500_000_000
DS_PREFETCH_BUCKET = 50_000_000
DS_PERSISTENCE_THRESHOLD = 100_000
# deepspeed/runtime/engine.py's MEMORY_OPT_ALLREDUCE_SIZE: BF16_Optimizer's all-reduce pieces
DS_ALLREDUCE_PIECE = 500_000_000

# A process that imports torch + DeepSpeed and holds a CUDA context: host RAM per rank
# before any model is built (an assumption, not measured here: there is no GPU).
PROCESS_HOST_BYTES = 3 * GIB

Attention = Literal["flash", "math"]
Construction = Literal["full_fp32", "per_module", "sharded"]


# ----------------------------------------------------------------------------- the model


def parameter_sizes(cfg: ModelConfig) -> list[int]:
    """Elements of every parameter tensor of models.build(cfg), tied weights once (the
    test compares this list with the built module's): the backbone's, then what each
    seam's component declares (the output mixing's W_O among them)."""
    d, L = cfg.d_model, cfg.n_layer
    bias = [d] if cfg.bias else []
    norm = [d, *bias]
    block = [*norm, 3 * d * d, *([3 * d] if cfg.has_qkv_bias else []), *norm]
    ffn = cfg.has_ffn_bias
    block += [4 * d * d, *([4 * d] if ffn else []), 4 * d * d, *([d] if ffn else [])]
    sizes = [padded_vocab_size(cfg.vocab_size) * d, cfg.block_size * d] + block * L + norm
    sizes += [n for component in cfg.components for n in component.parameter_sizes(cfg)]
    if cfg.task == "classify":
        sizes += [cfg.n_classes * d, *([cfg.n_classes] if cfg.bias else [])]
    return sizes


# ----------------------------------------------------------------------------- model states


@dataclass(frozen=True)
class ZeroSettings:
    """What decides DeepSpeed's memory, read from a trial's generated DeepSpeed config."""

    stage: int
    param_bytes: int  # the model dtype
    grad_bytes: int  # the gradient-accumulation dtype
    comm_bytes: int  # the communication dtype (ZeRO-3's gradient bucket is in it)
    offload_optimizer: bool
    immediate_grad_update: bool  # BF16_Optimizer frees each bf16 gradient once added
    reduce_bucket_size: int
    overlap_comm: bool
    contiguous_gradients: bool
    persistence_threshold: int
    prefetch_bucket_size: int

    @classmethod
    def from_ds_config(cls, ds: dict[str, Any]) -> ZeroSettings:
        zero = ds.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        model = "bf16" if ds.get("bf16", {}).get("enabled") else "fp32"
        model = "fp16" if ds.get("fp16", {}).get("enabled") else model
        accum = ds.get("data_types", {}).get("grad_accum_dtype") or model
        accum = _dtype_name(accum)
        comm = ds.get("communication_data_type") or model
        offload = (zero.get("offload_optimizer") or {}).get("device", "none") in ("cpu", "nvme")
        return cls(
            stage=stage,
            param_bytes=DTYPE_BYTES[model],
            grad_bytes=DTYPE_BYTES[accum],
            comm_bytes=DTYPE_BYTES[_dtype_name(comm)],
            offload_optimizer=offload and stage > 0,  # stage 0 has no ZeRO optimizer to offload
            immediate_grad_update=bool(ds.get("bf16", {}).get("immediate_grad_update", False)),
            reduce_bucket_size=int(zero.get("reduce_bucket_size", DS_REDUCE_BUCKET)),
            overlap_comm=bool(zero.get("overlap_comm", stage == 3)),
            contiguous_gradients=bool(zero.get("contiguous_gradients", True)),
            persistence_threshold=int(
                zero.get("stage3_param_persistence_threshold", DS_PERSISTENCE_THRESHOLD)
            ),
            prefetch_bucket_size=int(zero.get("stage3_prefetch_bucket_size", DS_PREFETCH_BUCKET)),
        )


def _dtype_name(name: object) -> str:
    """DeepSpeed's spellings of a dtype ('float32', 'fp32', ...) -> a DTYPE_BYTES key."""
    return {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16"}.get(
        str(name), "fp16"
    )


@dataclass(frozen=True)
class ModelStates:
    """Bytes per rank. `params`, `grads`, `optimizer` and `buffers` are on the GPU;
    `host` is what optimizer offload keeps in host RAM; `step_transient` exists only after the
    backward pass (BF16_Optimizer's all-reduce copy) or
    during the optimizer step, `gathered` (ZeRO-3) only during forward and backward."""

    params: int
    grads: int
    optimizer: int
    buckets: int  # gradient buckets (reduce_bucket_size elements)
    staging: int  # optimizer offload's low-precision partition and gradient copies
    host: int
    step_transient: int
    gathered: int

    @property
    def buffers(self) -> int:
        return self.buckets + self.staging

    @property
    def resident(self) -> int:
        """Parameters + gradients + optimizer states, wherever they are (GPU and host)."""
        return self.params + self.grads + self.optimizer + self.host


def model_state_bytes(sizes: list[int], z: ZeroSettings, world: int) -> ModelStates:
    """Parameter, gradient and optimizer bytes per rank (module docstring's table)."""
    psi, n = sum(sizes), world
    bp, bg = z.param_bytes, z.grad_bytes
    part = sum(math.ceil(s / n) for s in sizes)  # this rank's share, tensor by tensor
    if z.stage == 0:
        mixed = bp < 4
        return ModelStates(
            params=bp * psi,
            grads=bp * psi,
            optimizer=(MASTER * mixed + ADAM_MOMENTS) * psi,
            buckets=0,
            staging=0,
            host=0,
            step_transient=4 * psi if mixed else 0,  # fp32 .grad copies (unfused optimizer)
            gathered=0,
        )
    full_grads, reduce_copy = False, 0
    if z.stage == 3:
        # every tensor has its partition; the small ones are also kept whole on every rank
        params = bp * (part + sum(s for s in sizes if s < z.persistence_threshold))
        grads = bg * part
        largest = max(sizes)
        gathered = bp * (largest + min(z.prefetch_bucket_size, psi))
        buckets = z.comm_bytes * z.reduce_bucket_size  # allocated once, kept
    else:
        # ZeRO-1 accumulating in another dtype than the model's keeps whole gradients: in
        # BF16_Optimizer (bf16 with fp32 accumulation) or in each parameter's grad_accum
        full_grads = z.stage == 1 and bg != bp
        bf16_optimizer = full_grads and bp == 2 and bg == 4 and not z.offload_optimizer
        params = bp * psi
        grads = bg * (psi if full_grads else part)
        if bf16_optimizer and not z.immediate_grad_update:
            grads += bp * psi  # each parameter's bf16 .grad too (zeroed, never freed)
        if bf16_optimizer:  # the all-reduce's flat copy after the backward pass
            reduce_copy = bg * min(psi, DS_ALLREDUCE_PIECE)
        gathered = 0
        bucket_bytes = bg if full_grads else bp
        copies = 2 if z.overlap_comm else 1  # allocated for each backward pass
        buckets = 0
        if z.contiguous_gradients and not bf16_optimizer:
            buckets = bucket_bytes * z.reduce_bucket_size * copies
    states = (MASTER + ADAM_MOMENTS) * part
    if z.offload_optimizer:  # master, moments and a fp32 gradient partition go to the host
        if full_grads and n > 1:
            # each parameter's `grad_accum` is a view into the contiguous gradient bucket it
            # was reduced in, so whole buckets stay alive between steps (measured on 2 ranks:
            # one 2 GB fp32 bucket for a 4.8M-parameter model; on 1 rank, no reduction)
            buckets_held = math.ceil(psi / z.reduce_bucket_size) * z.reduce_bucket_size
            grads = bg * (buckets_held if z.contiguous_gradients else psi)
        staging = bp * part + 2 * bp * max(sizes) if z.stage < 3 else 0
        return ModelStates(
            params=params,
            grads=grads if z.stage == 3 or full_grads else 0,
            optimizer=0,
            buckets=buckets,
            staging=staging,
            host=states + 4 * part,
            step_transient=0,
            gathered=gathered,
        )
    return ModelStates(
        params=params,
        grads=grads,
        optimizer=states,
        buckets=buckets,
        staging=0,
        host=0,
        # the gradient partition converted to fp32; BF16_Optimizer's all-reduce copy (neither
        # overlaps the activations' peak: both come after the backward pass)
        step_transient=max(4 * part if bg < 4 else 0, reduce_copy),
        gathered=gathered,
    )


# ----------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class ActivationModel:
    """Bytes kept for the backward pass, per token."""

    layers: int
    layer: float  # of one block
    routed: int  # blocks around whose updates a component keeps activations (Activations
    gated: float  # .outside_blocks), each with these bytes (their mean, were there several)
    head: float  # the final norm, the LM head and the loss (token ids included)
    logits: float  # held outside autograd (ModelOutput) + the backward's logits gradient
    recompute: float  # activation checkpointing: one block's full activations, recomputed

    def saved_per_token(self) -> float:
        """What autograd saves: the blocks and the head."""
        return self.layers * self.layer + self.routed * self.gated + self.head

    def per_token(self) -> float:
        return self.saved_per_token() + self.logits + self.recompute

    def bytes(self, tokens: int) -> int:
        """Peak bytes for a micro-batch of `tokens` tokens (at the start of backward)."""
        return int(tokens * self.per_token())


def activation_model(
    cfg: ModelConfig,
    seq_len: int,
    act_bytes: int,
    checkpointing: bool,
    attention: Attention = "flash",
    device: Literal["cuda", "cpu"] = "cuda",
) -> ActivationModel:
    """Activation bytes per token (module docstring). `device` decides what a dropout mask
    costs: one byte per element on CUDA (native dropout), the activation dtype on CPU."""
    h, a, s = cfg.d_model, cfg.n_head, seq_len
    sites = cfg.dropout_sites if cfg.dropout > 0 else ()
    mask = 1 if device == "cuda" else act_bytes
    if device == "cpu" and "attention_probs" in sites:
        attention = "math"  # CPU's fused SDPA has no dropout (measured: the softmax is kept)
    full = 16 * h * act_bytes + 4 * 4  # + fp32 LayerNorm mean and rstd, two norms
    full += a * s * act_bytes if attention == "math" else a * 4  # softmax, or fp32 log-sum-exp
    full += mask * h * sum(DROPOUT_MASK_WIDTH[site] for site in sites)
    if attention == "math" and "attention_probs" in sites:
        full += a * s * (mask + act_bytes)
    declared = [c.activations(cfg, s) for c in cfg.components]
    full += sum(x.block for x in declared) * act_bytes
    routed = max(x.outside_blocks for x in declared)
    around = sum(x.outside * x.outside_blocks for x in declared) * act_bytes
    gated = around / routed if routed else 0.0
    if cfg.task == "lm":
        v, padded = cfg.vocab_size, padded_vocab_size(cfg.vocab_size)
        head = 2 * h * act_bytes + 2 * 4 + v * 4 + 8
        logits = 2 * padded * act_bytes + v * 4
    else:
        head, logits = 2 * h * act_bytes + 2 * 4 + 8, 0.0
    if "embedding" in sites:
        head += mask * h
    return ActivationModel(
        layers=cfg.n_layer,
        layer=2 * h * act_bytes if checkpointing else full,
        routed=routed,
        gated=gated,
        head=head,
        logits=logits,
        recompute=full if checkpointing else 0.0,
    )


# ----------------------------------------------------------------------------- host, disk


def host_bytes_per_rank(
    n_params: int, world: int, construction: Construction, offloaded: int, largest: int = 0
) -> int:
    """Host RAM one rank needs at its peak: the process itself, the model as it is built
    before DeepSpeed moves it to the GPU, and the offloaded optimizer states.

    'full_fp32': every rank builds the whole model in fp32 (models.build.build);
    'per_module': the model goes to the GPU one module at a time, drawn in fp32 on the host
    (jobs/training/train.py at every ZeRO stage: models.build.build_materialised, build_partitioned):
    the `largest` parameter tensor's 4 bytes per element; 'sharded': each rank materialises
    only its share, on the host."""
    if construction == "full_fp32":
        built = 4 * n_params
    elif construction == "per_module":
        built = 4 * largest
    else:
        built = math.ceil(4 * n_params / world)
    return PROCESS_HOST_BYTES + built + offloaded


def checkpoint_bytes(n_params: int, z: ZeroSettings) -> int:
    """One checkpoint on disk (all ranks' files): the module's weights in the model dtype
    (not under ZeRO-3, whose module files hold no weights: the fp32 partitions are the
    weights), the fp32 master copy where the engine keeps one, and Adam's two moments."""
    weights = z.param_bytes * n_params if z.stage < 3 else 0
    master = MASTER * n_params if (z.param_bytes < 4 or z.stage > 0) else 0
    return weights + master + ADAM_MOMENTS * n_params
