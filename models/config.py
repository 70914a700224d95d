"""Typed, frozen configuration of one model (torch-free: the CLI and orchestrator import it).

The backbone's fields, plus one key per active mechanism: `model.<name>: {...}` with that
mechanism's config (models/mechanism.py; the names come from models/catalog.py); absent or
null means off, and no mechanism at all is the dense GPT baseline. `attn_out: <name>` is
still read as `<name>: {}` for an output-mixing mechanism (older sweeps and job.json).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import (
    PrivateAttr,
    SerializationInfo,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

from scalelab.contract.config import FrozenConfig
from scalelab.models import catalog
from scalelab.models.mechanism import DENSE, Component, MechanismConfig, Seam, mechanism_of, reserve
from scalelab.models.sizes import SIZES, SizePreset, get_size

_ERROR_TYPES = frozenset(get_args(ErrorType))
LEGACY_OUTPUT_MIXING = "attn_out"  # `attn_out: hadamard` = `hadamard: {}`; never written
# Where dropout acts (docs/sweep-yaml.md, "model: the layout options"), in this order.
DropoutSite = Literal["embedding", "attention_probs", "attention_out", "ffn_hidden", "ffn_out"]
DROPOUT_SITES: tuple[str, ...] = get_args(DropoutSite)


class ModelConfig(FrozenConfig):
    """One model: a size preset (optionally overridden) plus the chosen mechanisms."""

    size: str
    n_layer: int | None = None  # None: the preset's value (filled in on validation)
    d_model: int | None = None
    n_head: int | None = None
    vocab_size: int = 50257
    block_size: int = 1024
    task: Literal["lm", "classify"] = "lm"
    n_classes: int | None = None
    dropout: float = 0.0
    bias: bool = True
    # The layout choices in which the papers' code differs from scalelab's defaults
    # (docs/reproducing/*.md list each paper's); at their defaults the ids do not change.
    dropout_sites: tuple[DropoutSite, ...] = ("embedding", "attention_probs", "ffn_hidden")
    qkv_bias: bool | None = None  # None: `bias`
    attn_out_bias: bool | None = None  # the dense W_O's bias; None: `bias`
    ffn_bias: bool | None = None  # both FFN layers; None: `bias`
    bias_init: Literal["zero", "uniform"] = "zero"  # uniform: PyTorch's U(+-1/sqrt(fan_in))
    # fan-in-rule weights (models/parametrization.py) drawn normal, or uniform of equal variance
    init_distribution: Literal["normal", "uniform"] = "normal"
    # Linear weights outside the residual projections: 1/(3 fan_in) variance, or GPT-2's 0.02
    init_std: Literal["fan_in", "gpt2"] = "fan_in"
    # How init and per-layer learning rates scale with width (models/parametrization.py):
    # 'mup' keeps the optimum learning rate found at mup_base_width for wider models.
    parametrization: Literal["standard", "mup"] = "standard"
    mup_base_width: int | None = None  # the d_model that µP's multipliers are relative to
    # The active mechanisms by name (set by _validate_mechanisms; dumped flat, in variant order).
    _active: dict[str, MechanismConfig] = PrivateAttr(default_factory=dict)

    @field_validator("size")
    @classmethod
    def _known_size(cls, name: str) -> str:
        get_size(name)  # raises with the list of presets
        return name

    @field_validator("vocab_size", "block_size", "n_layer", "d_model", "n_head", "mup_base_width")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"must be a positive integer, got {value}")
        return value

    @field_validator("dropout")
    @classmethod
    def _probability(cls, value: float) -> float:
        if not 0.0 <= value < 1.0:
            raise ValueError(f"must be in [0, 1), got {value}")
        return value

    @field_validator("dropout_sites")
    @classmethod
    def _canonical_sites(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Each site once, in canonical order: a spelling's order does not change the id."""
        return tuple(site for site in DROPOUT_SITES if site in value)

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        preset = get_size(self.size)
        for key in ("n_layer", "d_model", "n_head"):
            if getattr(self, key) is None:
                self.__dict__[key] = getattr(preset, key)  # frozen: resolve once, here
        if self.d_model % self.n_head != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_head={self.n_head}; "
                f"allowed n_head values: {_divisors(self.d_model)}"
            )
        if (self.parametrization == "mup") != (self.mup_base_width is not None):
            raise ValueError(
                "mup_base_width goes with parametrization='mup' (the width its learning rate "
                f"was tuned at), got parametrization={self.parametrization!r} and "
                f"mup_base_width={self.mup_base_width}"
            )
        if self.task == "classify" and (self.n_classes is None or self.n_classes < 2):
            raise ValueError("task='classify' needs n_classes >= 2")
        if self.task == "lm" and self.n_classes is not None:
            raise ValueError("n_classes is only allowed with task='classify'")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _validate_mechanisms(cls, data: Any, handler: Any) -> ModelConfig:
        """Validate each `<mechanism>: {...}` key with its config class and the backbone
        with pydantic; every problem of both comes out in one ValidationError, at its own
        key (an unknown key is pydantic's extra_forbidden, as for any config)."""
        if not isinstance(data, Mapping):
            return handler(data)
        rest = dict(data)
        chosen: dict[str, MechanismConfig] = {}
        errors: list[InitErrorDetails] = []
        legacy = rest.pop(LEGACY_OUTPUT_MIXING, DENSE)
        for key in [k for k in rest if k not in cls.model_fields]:
            mechanism = catalog.get(key) if isinstance(key, str) else None
            if mechanism is None:
                continue  # left to pydantic: unknown key
            value = rest.pop(key)
            if value is None:
                continue
            try:
                chosen[key] = mechanism.config.model_validate(
                    value.model_dump() if isinstance(value, MechanismConfig) else value
                )
            except ValidationError as e:
                errors += _details(e, (key,))
        if legacy != DENSE:
            mixing = [m.name for m in catalog.mechanisms() if m.seam is Seam.OUTPUT_MIXING]
            if legacy in mixing:
                chosen.setdefault(legacy, catalog.get(legacy).config())
            else:
                expected = " or ".join(repr(n) for n in [DENSE, *mixing])
                errors.append(_literal_error(LEGACY_OUTPUT_MIXING, legacy, expected))
        try:
            model = handler(rest)
        except ValidationError as e:
            errors = _details(e, ()) + errors
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        model._active = dict(sorted(chosen.items(), key=lambda kv: mechanism_of(kv[1]).order))
        return model

    @model_validator(mode="after")
    def _mechanisms_fit(self) -> ModelConfig:
        """At most one mechanism per seam, and each one's rules across the model's fields."""
        seams: dict[Seam, str] = {}
        for name, config in self._active.items():
            mechanism = mechanism_of(config)
            if mechanism.seam in seams:
                raise ValueError(
                    f"{seams[mechanism.seam]} and {name} both replace the "
                    f"{mechanism.seam.value} seam; choose one"
                )
            seams[mechanism.seam] = name
            mechanism.check(self)
        return self

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        """The backbone's fields, then each active mechanism's config under its name."""
        out = handler(self)
        for name, config in self._active.items():
            out[name] = config.model_dump(mode=info.mode)
        return out

    def __getattr__(self, name: str) -> Any:
        """`cfg.<mechanism>`: its config, or None when that registered mechanism is off."""
        if not name.startswith("_"):
            try:
                chosen = object.__getattribute__(self, "__pydantic_private__")["_active"]
            except (AttributeError, KeyError, TypeError):
                chosen = {}
            if name in chosen:
                return chosen[name]
            if catalog.get(name) is not None:
                return None
        return super().__getattr__(name)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        """The backbone's fields and one optional key per registered mechanism."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        mixing = [DENSE]
        for mechanism in catalog.mechanisms():
            sub = handler(mechanism.config.__pydantic_core_schema__)
            target["properties"][mechanism.name] = {"anyOf": [sub, {"type": "null"}]}
            if mechanism.seam is Seam.OUTPUT_MIXING:
                mixing.append(mechanism.name)
        target["properties"][LEGACY_OUTPUT_MIXING] = {
            "enum": mixing,
            "deprecated": True,
            "description": "older spelling of `<output-mixing mechanism>: {}`",
        }
        return schema

    @classmethod
    def sub_config_class(cls, key: str) -> type | None:
        found = catalog.get(key) if key not in cls.model_fields else None
        return found.config if found else super().sub_config_class(key)

    @classmethod
    def config_keys(cls) -> list[str]:
        names = [m.name for m in catalog.mechanisms()]
        return sorted([*cls.model_fields, LEGACY_OUTPUT_MIXING, *names])

    @property
    def mechanisms(self) -> Mapping[str, MechanismConfig]:
        """The active mechanisms' configs by name, in variant order."""
        return dict(self._active)

    def component(self, seam: Seam) -> Component:
        """What sits at `seam`: the active mechanism there, else the dense default."""
        for config in self._active.values():
            mechanism = mechanism_of(config)
            if mechanism.seam is seam:
                return mechanism
        return catalog.default(seam)

    @property
    def components(self) -> tuple[Component, ...]:
        """What sits at every seam, in the order of `Seam`: each one's `component`."""
        return tuple(self.component(seam) for seam in Seam)

    @property
    def attn_out(self) -> str:
        """The output-mixing mechanism's name, or 'dense'."""
        found = [n for n, c in self._active.items() if mechanism_of(c).seam is Seam.OUTPUT_MIXING]
        return found[0] if found else DENSE

    @property
    def preset(self) -> SizePreset:
        return get_size(self.size)

    @property
    def causal(self) -> bool:
        return self.task == "lm"

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_attn_out_bias(self) -> bool:
        return self.bias if self.attn_out_bias is None else self.attn_out_bias

    @property
    def has_ffn_bias(self) -> bool:
        return self.bias if self.ffn_bias is None else self.ffn_bias

    def dropout_at(self, site: str) -> float:
        """The dropout probability at `site` (0 where dropout does not act)."""
        assert site in DROPOUT_SITES, site
        return self.dropout if site in self.dropout_sites else 0.0

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def variant(self) -> str:
        """Canonical variant name, e.g. 'dense', 'hadamard', 'hadamard+budget+tsa'."""
        return "+".join(self._active) or DENSE


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 128) + 1) if n % k == 0]


def _details(error: ValidationError, prefix: tuple[Any, ...]) -> list[InitErrorDetails]:
    """A ValidationError's problems, re-rooted under `prefix`, to be raised again."""
    out = []
    for item in error.errors(include_url=False):
        known = item["type"] in _ERROR_TYPES  # else a custom error: rebuilt with its message
        detail: InitErrorDetails = {
            "type": item["type"] if known else PydanticCustomError(item["type"], item["msg"]),
            "loc": (*prefix, *item["loc"]),
            "input": item["input"],
        }
        if "ctx" in item and known:
            detail["ctx"] = item["ctx"]
        out.append(detail)
    return out


def _literal_error(key: str, value: Any, expected: str) -> InitErrorDetails:
    return {
        "type": PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": expected}
        ),
        "loc": (key,),
        "input": value,
    }


reserve([*ModelConfig.model_fields, LEGACY_OUTPUT_MIXING])

__all__ = ["SIZES", "ModelConfig"]
