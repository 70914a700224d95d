"""The mechanism registry's API: everything a mechanism's one module declares (torch-free).

The backbone has three seams (docs/architecture.md, 'The model, its three seams and the
mechanisms'); a `Component` sits at one of them and a `Mechanism` is a component with a
name, a config (`model.<name>` in a sweep) and what it adds to the results. The dense
components (models/dense.py) are the defaults at each seam; a mechanism usually derives from
the one it replaces and overrides what differs. `models/catalog.py` is the registry's door.

A mechanism class binds its config class when it is defined, so any process that has
imported the module (a Ray worker unpickling a job, a torchrun rank) can build a model from
that config without registering anything; registering makes the name known to parsing
(`model.<name>` keys, variant names) and to the results.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from scalelab.contract.config import FrozenConfig

if TYPE_CHECKING:
    from torch import nn

    from scalelab.models.config import ModelConfig

DENSE = "dense"  # the variant with no mechanism
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class Seam(str, Enum):
    OUTPUT_MIXING = "output_mixing"  # attention's heads mixed back to d_model (W_O)
    HEAD_SELECTION = "head_selection"  # which heads run, per input
    DEPTH_ROUTING = "depth_routing"  # which blocks each token goes through


class MechanismConfig(FrozenConfig):
    """Base of `model.<name>`: every field is science (part of the trial id)."""


@dataclass(frozen=True)
class ActiveFractions:
    """What inference executes, as fractions of the dense model's work."""

    heads: float = 1.0  # head selection: mean share of heads computed
    ffn_tokens: float = 1.0  # depth routing: share of token passes through routed blocks' FFN


@dataclass(frozen=True)
class FlopCount:
    """FLOPs per token of one forward pass, by part (models/flops.py states the rules)."""

    attention_qkv: float = 0.0
    attention_context: float = 0.0
    output_mixing: float = 0.0
    mlp: float = 0.0
    mechanisms: float = 0.0  # a mechanism's own networks (budget nets, routers)
    head: float = 0.0  # LM head (or classifier, per token)

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def matmul(self) -> float:
        """Every counted part runs as a matrix multiply (elementwise work is not counted)."""
        return self.total

    def __add__(self, other: FlopCount) -> FlopCount:
        return FlopCount(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class Column:
    """A trials-table column a mechanism adds: `config:<field>` of its config (empty when
    the mechanism is off) or `metric:<name>` (the final value of a logged curve)."""

    name: str
    source: str
    kind: Literal["int", "float", "str"] = "float"
    label: str = ""


@dataclass(frozen=True)
class MetricPlot:
    """A figure of one column against the first of `x` that varies, a line per `series`."""

    name: str
    y: str
    x: tuple[str, ...] = ("n_params",)
    series: str = "variant"
    title: str = ""
    ylim: tuple[float, float] | None = None


@dataclass(frozen=True)
class Activations:
    """Elements per token that a component keeps for the backward pass beyond the backbone's,
    in the activation dtype (orchestrator/plan/memory.py adds them to its activation bytes)."""

    block: float = 0.0  # in every block, inside its two updates: recomputed under checkpointing
    outside: float = 0.0  # in each of `outside_blocks` blocks, around its updates: always kept
    outside_blocks: int = 0


class Component(ABC):
    """What sits at one seam, and what it adds to the model that the planner counts: its
    parameter tensors, forward FLOPs, activations and decode state, and whether it reads
    the training progress. The defaults fit a component that adds nothing."""

    seam: ClassVar[Seam]
    # Its layers read the training progress (ForwardContext.progress: a schedule over the
    # run), so two runs of different lengths differ from the first step: never a shared trunk.
    reads_training_progress: ClassVar[bool] = False

    def parameter_sizes(self, model: ModelConfig) -> list[int]:
        """Elements of every parameter tensor it adds to the model (all layers): the
        planner's list of the built module's tensors (ZeRO partitions them one by one)."""
        return []

    def params(self, model: ModelConfig) -> int:
        """Its exact parameter count: the sum of parameter_sizes (override that, not this)."""
        return sum(self.parameter_sizes(model))

    def forward_flops(self, model: ModelConfig, seq_len: int, active: ActiveFractions) -> FlopCount:
        """FLOPs per token of this component; `active` is already resolved by every seam."""
        return FlopCount()

    def activations(self, model: ModelConfig, seq_len: int) -> Activations:
        """What it keeps for the backward pass, per token, beyond the dense block's."""
        return Activations()

    def decode_state(self, model: ModelConfig) -> int:
        """fp32 elements per sequence and layer it carries from one cached decode step to
        the next, beside the keys and values (models/decode.py's KVCache allocates them)."""
        return 0


class OutputMixing(Component):
    seam = Seam.OUTPUT_MIXING

    @abstractmethod
    def build(self, model: ModelConfig, layer_idx: int) -> nn.Module:
        """(B, T, H * d_head) -> (B, T, d_model)."""

    def selected_head_flops(self, model: ModelConfig) -> float:
        """FLOPs per (token, head) pair when only some heads run: a mixing that is separable
        per head (dense W_O: the head's d_head columns) counts here, any other runs over all
        channels and is counted by forward_flops."""
        return 0.0


class HeadSelection(Component):
    seam = Seam.HEAD_SELECTION

    @abstractmethod
    def build(self, model: ModelConfig, layer_idx: int, out_proj: nn.Module) -> nn.Module:
        """An attention module, forward(x, ctx), that mixes its heads with `out_proj`."""

    def heads(self, model: ModelConfig, active: ActiveFractions) -> float:
        """The share of heads inference computes."""
        return 1.0


class DepthRouting(Component):
    seam = Seam.DEPTH_ROUTING

    @abstractmethod
    def build(self, model: ModelConfig) -> nn.Module:
        """forward(x, blocks, ctx) -> x: runs the blocks."""

    def mlp_passes(self, model: ModelConfig, active: ActiveFractions) -> float:
        """Block FFN passes per token at inference (n_layer when every token runs every block)."""
        return float(model.n_layer)


# A config class -> the mechanism that defined it (set at class definition, every process).
_BY_CONFIG: dict[type[MechanismConfig], type[Mechanism]] = {}
# Registered mechanisms by name (models/catalog.py loads the built-ins and SCALELAB_MECHANISMS).
_REGISTERED: dict[str, type[Mechanism]] = {}
# Keys of `model` that are not mechanisms (models/config.py adds its fields).
_RESERVED: set[str] = set()


def reserve(names: Iterable[str]) -> None:
    _RESERVED.update(names)


class Mechanism:
    """Mixed into a Component: `class ReZero(Mechanism, AllBlocks)`."""

    name: ClassVar[str]  # the variant part, the `model.<name>` key, the metrics' prefix
    config: ClassVar[type[MechanismConfig]]
    order: ClassVar[int]  # position in canonical variant names
    semantics: ClassVar[int] = 1  # bumped when code changes what an unchanged config computes
    metrics: ClassVar[tuple[str, ...]] = ()  # every ctx.add_metric name, each '<name>/...'
    losses: ClassVar[tuple[str, ...]] = ()  # every ctx.add_loss name, each '<name>/...'
    columns: ClassVar[tuple[Column, ...]] = ()
    plots: ClassVar[tuple[MetricPlot, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "config" in cls.__dict__:
            _BY_CONFIG[cls.config] = cls

    def check(self, model: ModelConfig) -> None:
        """Rules across the model's fields; raise ValueError with what is expected."""

    def settings(self, model: ModelConfig) -> MechanismConfig:
        """This mechanism's config in `model`."""
        return model.mechanisms[self.name]


def mechanism_of(config: MechanismConfig) -> Mechanism:
    """The registered mechanism whose config `config` is, else the class that defined it
    last (a class defined with another's config, registered or not, takes no registered
    mechanism's place)."""
    for cls in type(config).__mro__:
        for mechanism in _REGISTERED.values():
            if mechanism.config is cls:
                return mechanism()
        if cls in _BY_CONFIG:
            return _BY_CONFIG[cls]()
    raise TypeError(f"{type(config).__name__} is not the config of a mechanism")


def register(mechanism: type[Mechanism]) -> None:
    """Make a mechanism known by name; its declarations are checked here."""
    name = getattr(mechanism, "name", "")
    problems = []
    if not (isinstance(name, str) and _NAME.match(name)) or name == DENSE:
        problems.append(f"name {name!r} must match {_NAME.pattern} and not be {DENSE!r}")
    if name in _RESERVED:
        problems.append(f"name {name!r} is a model field")
    if not (isinstance(mechanism, type) and issubclass(mechanism, Component)):
        problems.append("must derive from a seam's component (OutputMixing, ...)")
    elif mechanism.params is not Component.params:
        problems.append("declare parameter_sizes (every tensor), not params (their sum)")
    if not issubclass(getattr(mechanism, "config", object), MechanismConfig):
        problems.append("config must be a MechanismConfig subclass")
    others = [m for n, m in _REGISTERED.items() if n != name]
    if not isinstance(getattr(mechanism, "order", None), int):
        problems.append("order must be an int")
    elif any(m.order == mechanism.order for m in others):
        problems.append(f"order {mechanism.order} is taken")
    taken = {c.name for m in others for c in m.columns}
    problems += [f"column {c.name!r} is taken" for c in mechanism.columns if c.name in taken]
    problems += [
        f"{what} {n!r} must start with '{name}/'"
        for what, names in (("metric", mechanism.metrics), ("loss", mechanism.losses))
        for n in names
        if not n.startswith(f"{name}/")
    ]
    if name in _REGISTERED and _REGISTERED[name] is not mechanism:
        problems.append(f"another mechanism is registered as {name!r}")
    if problems:
        raise ValueError(
            f"mechanism {getattr(mechanism, '__name__', mechanism)}: " + "; ".join(problems)
        )
    _REGISTERED[name] = mechanism


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)


@contextmanager
def registered(*mechanisms: type[Mechanism]) -> Iterator[None]:
    """Register `mechanisms` for the duration of a block (tests, scripts)."""
    for mechanism in mechanisms:
        register(mechanism)
    try:
        yield
    finally:
        for mechanism in mechanisms:
            unregister(mechanism.name)


def registry() -> Mapping[str, type[Mechanism]]:
    """What is registered now (models.catalog loads the built-ins first)."""
    return dict(_REGISTERED)
