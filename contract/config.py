"""The base of every scalelab config, and its one-line error messages.

Every config class (model, job, sweep, backend) derives from `FrozenConfig`: immutable,
unknown keys, NaN and infinities are errors. `format_config_error` turns pydantic's
`ValidationError` into one line per problem naming the dotted key, and for an unknown key
the closest allowed key ("did you mean") and the keys allowed at that depth
(docs/architecture.md, 'Configs').
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class NotIdentity:
    """Marks a config field that does not change what a trial computes (cadence, placement,
    execution): `x: Annotated[int, NotIdentity] = 10`. The trial id leaves it out
    (jobs/identity.py; docs/architecture.md, 'Trial identity')."""


# Every FrozenConfig subclass by class name: a ValidationError names its model by title only.
_CONFIG_CLASSES: dict[str, type[BaseModel]] = {}


class FrozenConfig(BaseModel):
    """Base of every scalelab config: immutable; unknown keys, NaN and infinities are errors."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        _CONFIG_CLASSES[cls.__name__] = cls

    @classmethod
    def sub_config_class(cls, key: str) -> type[BaseModel] | None:
        """The config class of the value under `key`, if it is a config (a config whose
        keys are not all fields, like the model's mechanisms, answers for them)."""
        field = cls.model_fields.get(key)
        return config_class_of(field.annotation) if field else None

    @classmethod
    def config_keys(cls) -> list[str]:
        """Every key this config accepts."""
        return sorted(cls.model_fields)


def format_config_error(error: ValidationError, source: str = "config") -> str:
    """One line per problem: '<source>: <dotted.key>: <message>'."""
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            allowed = allowed_keys(error.title, item["loc"])
            message = "unknown key" + did_you_mean(str(item["loc"][-1]), allowed)
            if allowed:
                message += f" (allowed: {', '.join(allowed)})"
        elif item["type"] == "literal_error":
            message = f"{message}, got {item.get('input')!r}"
        lines.append(f"{source}: {key}: {message}")
    return "\n".join(lines)


def did_you_mean(key: str, allowed: list[str]) -> str:
    """', did you mean 'n_layer'?' for a misspelt key close to one allowed, else ''."""
    close = difflib.get_close_matches(key, allowed, n=1)
    return f", did you mean {close[0]!r}?" if close else ""


def allowed_keys(title: str, loc: tuple) -> list[str]:
    """The keys of the config at `loc[:-1]` below the config class named `title`."""
    cls = _CONFIG_CLASSES.get(title)
    for part in loc[:-1]:
        if cls is None:
            return []
        cls = sub_config_class(cls, str(part))
    if cls is None:
        return []
    return cls.config_keys() if issubclass(cls, FrozenConfig) else sorted(cls.model_fields)


def sub_config_class(cls: type[BaseModel], key: str) -> type[BaseModel] | None:
    """The config class under `key` of `cls` (FrozenConfig.sub_config_class, or the field's)."""
    if issubclass(cls, FrozenConfig):
        return cls.sub_config_class(key)
    field = cls.model_fields.get(key)
    return config_class_of(field.annotation) if field else None


def config_class_of(annotation: object) -> type[BaseModel] | None:
    """The config class inside a field's annotation (`BudgetConfig | None` -> BudgetConfig)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = config_class_of(arg)
        if found:
            return found
    return None
