"""models.build(ModelConfig) -> nn.Module: the one entry point to construct a model, whole
in fp32 (`build`) or placed straight on its device in its dtype (`build_materialised`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

import torch
from torch import nn

from models.config import ModelConfig
from models.gpt import GPT
from models.vocab import pad_vocabulary


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
