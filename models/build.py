"""models.build(ModelConfig) -> nn.Module: the one entry point to construct a model, whole
in fp32 (`build`), placed straight on its device in its dtype (`build_materialised`, ZeRO
0-2), or partitioned across the ranks from the start (`build_partitioned`, ZeRO-3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

import torch
from torch import nn

from scalelab.models.config import ModelConfig
from scalelab.models.gpt import GPT
from scalelab.models.vocab import pad_vocabulary, padded_vocab_size


def build(cfg: ModelConfig, device: str | torch.device | None = None) -> nn.Module:
    """Build the GPT backbone with the mechanisms `cfg` switches on, its vocabulary padded
    to a multiple of 64 (models/vocab.py: same initial weights, same losses).

    `device='meta'` builds without allocating memory (exact parameter counts of the large
    presets in milliseconds).
    """
    with torch.device(device) if device is not None else nullcontext():
        model = GPT(cfg)
        pad_vocabulary(model)
    return model


def build_materialised(
    cfg: ModelConfig, device: str | torch.device, dtype: torch.dtype = torch.float32
) -> GPT:
    """`build(cfg).to(device, dtype)`, bit for bit after the same seed, without the whole
    model ever in fp32 on the host: built on the meta device, then module by module (in
    GPT.init_weights' order, so the same draws from the same RNG) each module's own
    parameters are drawn in fp32 on the CPU, cast and moved to `device`. The host holds at
    most one module's parameters in fp32 (the embedding, the largest) beyond the model.
    """
    with torch.device("meta"):
        model = GPT(cfg)  # no memory, and no draws: meta tensors consume no random numbers
    placed: dict[int, nn.Parameter] = {}  # a meta parameter's id -> its materialised one
    for module in _children_first(model):
        _materialise_own(model, module, placed, torch.device(device), dtype)
    model.post_init()  # constants only (no draws): the same on any device and dtype
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"{left} were not materialised")
    pad_vocabulary(model)
    return model


def build_partitioned(cfg: ModelConfig, ds_config: dict) -> GPT:
    """ZeRO-3: `build(cfg)`'s values in the config's dtype (bf16, fp16 or fp32), bit for
    bit after the same seed, with no
    rank ever holding the whole model: the modules are constructed under
    `deepspeed.zero.Init` (each parameter partitioned across the ranks as soon as its module
    exists; the constructors' values and draws are discarded, as `GPT` does itself), then,
    module by module in GPT.init_weights' order, every rank draws the module's own
    parameters in fp32 on the CPU as the plain build would and keeps its partition
    (`zero.GatheredParameters`: one module's parameters whole at a time, the embedding the
    largest). Needs DeepSpeed's process group (jobs.training.distributed.init) and the engine's
    config (`ds_config`, stage 3), whose `deepspeed.initialize` then takes the model as is.
    """
    import deepspeed

    # No `dtype=`: DeepSpeed 0.19's zero.Init then ignores the config and, on an accelerator
    # without fp16 (the CPU), makes bf16 whatever dtype was given (Init._set_dtype's
    # `dtype or fp16 if ... else bf16 ...`); from the config alone it takes the config's.
    with torch.random.fork_rng(devices=[]), deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = GPT(cfg)  # init_weights ran on empty partitions
        unpadded = _pad_partitioned_vocabulary(model)
    for module in _children_first(model):
        _draw_partitioned(model, module, unpadded)
    for module in model.modules():  # GPT.post_init, each mechanism's parameters gathered
        if module is not model and hasattr(module, "post_init"):
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
                module.post_init()
    return model


def _pad_partitioned_vocabulary(model: GPT) -> dict[int, torch.Size]:
    """pad_vocabulary for partitioned parameters (run inside zero.Init): a new, padded
    embedding (tied to the LM head again); the padded parameter's id -> the shape the plain
    build draws it in."""
    real, padded = model.cfg.vocab_size, padded_vocab_size(model.cfg.vocab_size)
    if padded == real:
        return {}
    old = model.wte
    model.wte = nn.Embedding(padded, old.embedding_dim)
    if hasattr(model, "lm_head"):
        model.lm_head.weight = model.wte.weight
        model.lm_head.out_features = padded
    return {id(model.wte.weight): torch.Size([real, old.embedding_dim])}


def _draw_partitioned(model: GPT, module: nn.Module, unpadded: dict[int, torch.Size]) -> None:
    """`module`'s own parameters drawn whole in fp32 (in the plain build's shapes: a padded
    vocabulary's rows beyond the real one are zero) and written into their partitions."""
    import deepspeed

    own = {name: p for name, p in module._parameters.items() if p is not None}
    if not own:
        return
    for name, p in own.items():  # NaN until drawn: an unset parameter is caught below
        shape = unpadded.get(id(p), p.ds_shape)
        module._parameters[name] = nn.Parameter(torch.full(shape, float("nan")))
    try:
        if isinstance(module, nn.Linear | nn.Embedding):
            model._init_weights(module)
        elif hasattr(module, "reset_parameters"):  # LayerNorm, Hadamard's alpha and beta
            module.reset_parameters()
        drawn = {name: module._parameters[name].detach() for name in own}
    finally:
        module._parameters.update(own)
    unset = [name for name, value in drawn.items() if torch.isnan(value).any()]
    if unset:
        raise RuntimeError(
            f"{type(module).__name__}.{unset} not initialised by GPT.init_weights "
            "(give the module reset_parameters())"
        )
    with deepspeed.zero.GatheredParameters(list(own.values()), modifier_rank=0):
        for name, p in own.items():
            value = drawn[name].to(p.dtype)
            if value.shape == p.shape:
                p.data.copy_(value)
            else:  # the padded vocabulary
                p.data.zero_()
                p.data[: value.shape[0]].copy_(value)


def _children_first(module: nn.Module) -> Iterator[nn.Module]:
    """The order of nn.Module.apply: each module after its children."""
    for child in module.children():
        yield from _children_first(child)
    yield module


def _materialise_own(
    model: GPT,
    module: nn.Module,
    placed: dict[int, nn.Parameter],
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Draw `module`'s own parameters as GPT.init_weights would, in fp32 on the CPU, and
    place them. A tied parameter drawn again (the LM head's) keeps its one tensor."""
    own = list(module._parameters.items())
    if not own or all(p is None for _, p in own):
        return
    metas = {name: p for name, p in own if p is not None}
    for name, p in metas.items():  # NaN until drawn: an unset parameter is caught below
        module._parameters[name] = nn.Parameter(
            torch.full(p.shape, float("nan")), requires_grad=p.requires_grad
        )
    if isinstance(module, nn.Linear | nn.Embedding):
        model._init_weights(module)
    elif hasattr(module, "reset_parameters"):  # LayerNorm, Hadamard's alpha and beta
        module.reset_parameters()
    for name, meta in metas.items():
        drawn = module._parameters[name]
        if torch.isnan(drawn).any():
            raise RuntimeError(
                f"{type(module).__name__}.{name} is not initialised by GPT.init_weights "
                "(give the module reset_parameters())"
            )
        value = drawn.detach().to(device=device, dtype=dtype)
        if id(meta) in placed:  # tied: drawn again, as in the fp32 build
            placed[id(meta)].data.copy_(value)
        else:
            placed[id(meta)] = nn.Parameter(value, requires_grad=meta.requires_grad)
        module._parameters[name] = placed[id(meta)]
