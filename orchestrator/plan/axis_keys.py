"""A sweep axis' dotted keys (`model.size`, `train.lr`): each must name a JobConfig field,
checked one by one so every misspelt key of an axis is reported with the allowed ones."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel

from scalelab.contract.config import FrozenConfig, did_you_mean, sub_config_class
from scalelab.jobs.config import JobConfig

AxisValues = list[Any]


def _dotted_key(key: str) -> str:
    check_dotted_key(key)
    return key


# an axis' keys are checked one by one, so every misspelt key of a grid is reported
AxisKey = Annotated[str, AfterValidator(_dotted_key)]


def check_dotted_key(key: str) -> None:
    """'model.size' must name a JobConfig field; raise with the allowed keys otherwise."""
    cls: type[BaseModel] | None = JobConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        if cls is None:
            raise ValueError(f"{key!r}: {'.'.join(parts[:i])} has no sub-keys")
        keys = cls.config_keys() if issubclass(cls, FrozenConfig) else sorted(cls.model_fields)
        if part not in keys:
            where = ".".join(parts[:i]) or "a job"
            raise ValueError(
                f"{key!r}: {part!r} is not a key of {where}{did_you_mean(part, keys)} "
                f"(allowed: {', '.join(keys)})"
            )
        if cls.__name__ == "DeepSpeedConfig" and part == "extra":
            return  # free-form DeepSpeed keys below
        cls = sub_config_class(cls, part)
