"""How each weight is initialised and how its learning rate scales with width.

Every parameter has a role, given where its module is built (next to each mechanism, so a
mechanism carries its own scaling); a Linear without one is `hidden`, an Embedding `input`:

    role      shape (fan_in -> fan_out)      examples
    input     fixed -> width                 wte, wpe
    hidden    width -> width                 QKV, first FFN layer, TSA router's first layer
    residual  width -> width, into the       attention W_O, second FFN layer
              residual stream
    output    width -> fixed                 classifier, TSA router's output layer,
                                             BudgetFormer's relevance net and the first
                                             layer of its budget net (d -> budget_hidden)
    fixed     fixed -> fixed                 BudgetFormer's budget net's second layer
    vector    one axis                       biases, LayerNorm gains, Hadamard's alpha/beta

Standard parametrisation (`standard`; docs/reproducing/baseline.md has the ablations):
embeddings N(0, 0.02); Linear weights N(0, 1/(3 fan_in)) (PyTorch's nn.Linear variance,
drawn from a normal: std 0.051 at d 128, 0.0208 at GPT-2's 768), except residual
projections N(0, 0.02^2 / (2 n_layer)) (GPT-2); biases zero; one learning rate.
Three model options reproduce other codebases' init (docs/reproducing/*.md):
`init_std: gpt2` draws the fan-in-rule weights N(0, 0.02) (nanoGPT); `init_distribution:
uniform` draws them from the uniform of the same variance (U(+-1/sqrt(fan_in)) under the
fan-in rule: PyTorch's nn.Linear default); `bias_init: uniform` draws every Linear bias
from PyTorch's default U(+-1/sqrt(fan_in)). Embeddings and residual projections stay normal.

µP (`mup`, Yang et al. 2021, "Tensor Programs V", Table 3 for Adam; m = d_model /
mup_base_width): identical to `standard` at the base width, and as the width grows
- hidden and output matrices: init std and Adam learning rate so that every layer's
  update moves its output by Theta(1) per coordinate: lr x 1/m for hidden, residual and
  output; init std x m^-1/2 for residual (hidden already has it from fan-in) and output
  (which together with fan-in gives var ∝ 1/fan_in^2);
- input, fixed and vector parameters: init and learning rate unchanged;
- the tied LM head reads out logits x 1/m (the embedding stays an input weight);
- attention logits q.k x sqrt(d_head at base) / d_head instead of 1 / sqrt(d_head), the
  base head width being mup_base_width / n_head (width grows at a fixed head count).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from torch import nn

if TYPE_CHECKING:
    from scalelab.models.config import ModelConfig

Role = Literal["input", "hidden", "residual", "output", "fixed", "vector"]
EMBEDDING_STD = 0.02
RESIDUAL_STD = 0.02  # before the 1 / sqrt(2 n_layer) depth factor
WIDTH_ROLE = "width_role"  # attribute a module sets to give its weight a role
_WIDTH_SCALED: frozenset[str] = frozenset({"hidden", "residual", "output"})


def set_role(module: nn.Module, role: Role) -> nn.Module:
    setattr(module, WIDTH_ROLE, role)
    return module


def role_of(module: nn.Module) -> Role:
    default = "input" if isinstance(module, nn.Embedding) else "hidden"
    return getattr(module, WIDTH_ROLE, default)


def width_mult(cfg: ModelConfig) -> float:
    """m = d_model / base width under µP; 1 under the standard parametrisation."""
    return cfg.d_model / cfg.mup_base_width if cfg.parametrization == "mup" else 1.0


def init_std(cfg: ModelConfig, role: Role, fan_in: int) -> float:
    """The standard deviation of a weight of this role at this model's width."""
    if role == "input":
        return EMBEDDING_STD
    if role == "residual":
        std = RESIDUAL_STD / math.sqrt(2 * cfg.n_layer)
    elif cfg.init_std == "gpt2":
        std = EMBEDDING_STD
    else:
        std = 1.0 / math.sqrt(3 * fan_in)
    if role in ("residual", "output"):
        std /= math.sqrt(width_mult(cfg))
    return std


def lr_scale(cfg: ModelConfig, role: Role) -> float:
    """Multiplier on the learning rate for parameters of this role."""
    return 1.0 / width_mult(cfg) if role in _WIDTH_SCALED else 1.0


def logit_scale(cfg: ModelConfig) -> float:
    """Multiplier on the tied LM head's logits."""
    return 1.0 / width_mult(cfg)


def attention_scale(cfg: ModelConfig) -> float | None:
    """Softmax scale of q.k; None: SDPA's default 1 / sqrt(d_head)."""
    if cfg.parametrization != "mup":
        return None
    base_d_head = cfg.mup_base_width / cfg.n_head
    return math.sqrt(base_d_head) / cfg.d_head


def init_module(cfg: ModelConfig, module: nn.Module) -> None:
    """Initialise one Linear or Embedding by its role (other modules keep their own init)."""
    if isinstance(module, nn.Linear):
        role = role_of(module)
        std = init_std(cfg, role, module.in_features)
        if cfg.init_distribution == "uniform" and role not in ("residual", "input"):
            bound = std * math.sqrt(3.0)  # the uniform with variance std^2
            nn.init.uniform_(module.weight, -bound, bound)
        else:
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None and cfg.bias_init == "uniform":
            bound = 1.0 / math.sqrt(module.in_features)
            nn.init.uniform_(module.bias, -bound, bound)
        elif module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=init_std(cfg, "input", 0))


def parameter_roles(model: nn.Module) -> Iterator[tuple[nn.Parameter, Role]]:
    """Every trainable parameter once (tied weights once, by their first module) with its
    role: weights of Linear / Embedding layers by the module's role, everything else (biases,
    norms, Hadamard's alpha and beta) `vector`."""
    seen: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            weight = name == "weight" and isinstance(module, nn.Linear | nn.Embedding)
            yield p, role_of(module) if weight else "vector"
