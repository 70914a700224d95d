"""Sweep YAML -> validated `SweepSpec` (torch-free).

A sweep is a `base` JobConfig (possibly partial) plus axes that vary it: `grid`
(cartesian product over dotted keys), `zip` (paired lists), `isoflop` (compute budgets x
model sizes, Chinchilla's IsoFLOP design) and `variants` (mechanism combinations
from models/catalog.py). Every problem is reported as `file:line: key.path: message`, found by
mapping pydantic's error locations back onto the YAML nodes.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    PlainValidator,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from scalelab.contract.config import (
    FrozenConfig,
    format_config_error,
)
from scalelab.contract.runs import SWEEP_NAME_MAX, SWEEP_NAME_PATTERN
from scalelab.contract.storage import StorageURI
from scalelab.jobs.config import JobCheckError, JobConfig
from scalelab.jobs.gpus import gpu_spec
from scalelab.models import catalog
from scalelab.models.mechanism import DENSE
from scalelab.models.sizes import get_size
from scalelab.orchestrator.backends import registry
from scalelab.orchestrator.backends.base import BackendOptions
from scalelab.orchestrator.plan.axis_keys import AxisKey, AxisValues, check_dotted_key
from scalelab.orchestrator.plan.sweep_file import SourceMap, SpecError, load_yaml, read_sweep
from scalelab.orchestrator.plan.tune_spec import TuneSpec

__all__ = [
    "AxisKey",
    "SourceMap",
    "SpecError",
    "SweepSpec",
    "TuneSpec",
    "check_dotted_key",
    "load_spec",
    "parse_spec",
]

DEFAULT_GPU = "H100 SXM"  # the peak assumed when a sweep names no GPU

DEFAULT_MAX_TRIALS = 1_000  # more trials than this need --max-trials (docs/sweep-yaml.md)


# ---------------------------------------------------------------- the schema


def _without_required(schema: Any) -> Any:
    """JobConfig's JSON Schema with no required keys: `base` may leave fields to the axes."""
    if isinstance(schema, dict):
        return {k: _without_required(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_without_required(v) for v in schema]
    return schema


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    """Replace '$ref' by the definition itself (the job configs are not recursive)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inline_refs(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline_refs(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


class _PartialJobSchema:
    """`base`'s JSON Schema: JobConfig's without required keys, made when asked (it lists
    the registered mechanisms, so importing this module must not make it)."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        job = JobConfig.model_json_schema()
        return _without_required(_inline_refs(job, job.get("$defs", {})))


Base = Annotated[dict[str, Any], _PartialJobSchema()]


class IsoFlopAxis(FrozenConfig):
    """IsoFLOP design: for each compute budget C and size N, tokens D = C / (6N-ish FLOPs)."""

    flops: list[Annotated[float, Field(gt=0)]] = Field(
        min_length=1, description="training compute budgets in FLOPs"
    )
    sizes: list[str] = Field(min_length=1, description="model size presets")

    @field_validator("sizes")
    @classmethod
    def _known_sizes(cls, names: list[str]) -> list[str]:
        for name in names:
            get_size(name)
        return names


class _BackendSchema:
    """`backend`'s JSON Schema: one of the registered backends' options, made when asked
    (orchestrator/backends/registry.py)."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return registry.options_schema(handler)


# `backend:` is validated by the options class of the backend its `kind` names, looked up in
# the registry as the sweep is validated (a backend registered later is known then)
BackendField = Annotated[
    SerializeAsAny[BackendOptions], PlainValidator(registry.parse_options), _BackendSchema()
]


class EstimateConfig(FrozenConfig):
    """Assumptions behind the plan (orchestrator/plan/planner.py): time and memory per trial."""

    mfu: float = Field(0.4, gt=0, le=1, description="assumed model FLOPs utilisation")
    peak_flops: float | None = Field(
        None,
        gt=0,
        description="per GPU; default: backend.gpu's dense bf16 peak, else H100 SXM's 989e12",
    )
    memory_headroom: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="share of each GPU's memory kept free (CUDA context, NCCL, fragmentation)",
    )
    attention: Literal["flash", "math"] = Field(
        "flash",
        description="the attention kernel's memory: flash/memory-efficient SDPA (no T x T "
        "matrix) or math (softmax scores kept)",
    )


class SweepSpec(FrozenConfig):
    """One sweep YAML."""

    name: str = Field(pattern=SWEEP_NAME_PATTERN, max_length=SWEEP_NAME_MAX)
    experiment: str | None = Field(
        None,
        min_length=1,
        max_length=256,  # MLflow's experiments.name column
        description="MLflow experiment; default: name",
    )
    description: str = ""
    base: Base = Field(description="a (partial) JobConfig the axes fill in")
    variants: list[Annotated[str, AfterValidator(catalog.canonical_variant)]] | None = Field(
        None, description="mechanism presets, e.g. dense, hadamard, budget+tsa"
    )
    grid: dict[AxisKey, AxisValues] = Field(
        default_factory=dict, description="dotted key -> values; the cartesian product"
    )
    zip: dict[AxisKey, AxisValues] = Field(
        default_factory=dict, description="dotted key -> values; lists of equal length, paired"
    )
    isoflop: IsoFlopAxis | None = None
    backend: BackendField = Field(
        default_factory=registry.default_options,
        description="where trials run: kind (local, ray, slurm, or another registered backend) "
        "and its options",
    )
    storage: StorageURI | None = Field(
        None,
        description="object storage (a pyarrow.fs URI: s3://bucket/prefix, gs://...) that "
        "every trial's checkpoints and metric spool are also kept in, for nodes that share no "
        "filesystem (docs/running-on-ray.md); default: the work directory alone",
    )
    estimate: EstimateConfig = EstimateConfig()
    tune: TuneSpec | None = Field(
        None,
        description="search each variant's learning rate at small width first, then run "
        "the sweep at each one's own rate (docs/sweep-yaml.md, 'Tuning the learning rate')",
    )

    @property
    def experiment_name(self) -> str:
        return self.experiment or self.name

    def axis_sizes(self) -> dict[tuple[Any, ...], int]:
        """The number of options of each axis, by its YAML key path (in expansion order)."""
        sizes: dict[tuple[Any, ...], int] = {}
        if self.variants:
            sizes[("variants",)] = len(self.variants)
        sizes.update({("grid", key): len(values) for key, values in self.grid.items()})
        if self.zip:
            sizes[("zip",)] = len(next(iter(self.zip.values())))
        if self.isoflop is not None:
            sizes[("isoflop",)] = len(self.isoflop.flops) * len(self.isoflop.sizes)
        return sizes

    @property
    def combinations(self) -> int:
        """Axis combinations, known without expanding: the trials are at most this many
        (combinations that mean the same computation are kept once)."""
        return math.prod(self.axis_sizes().values())

    @property
    def peak_flops(self) -> float:
        """Per-GPU peak of the plan: estimate.peak_flops, else backend.gpu's, else H100 SXM's."""
        if self.estimate.peak_flops is not None:
            return self.estimate.peak_flops
        return gpu_spec(self.backend.gpu or DEFAULT_GPU).bf16_flops

    @field_validator("variants")
    @classmethod
    def _distinct_variants(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        if not names:  # given, and empty: an empty axis, which would have trained dense
            raise ValueError(
                "needs at least one variant (e.g. [dense, hadamard]); leave the key out to "
                "train base's model"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"variants are repeated: {names}")
        return names

    @field_validator("grid", "zip")
    @classmethod
    def _axes_have_values(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in axes.items():
            if not values:
                raise ValueError(f"{key}: needs at least one value")
        return axes

    @model_validator(mode="after")
    def _axes_consistent(self) -> SweepSpec:
        if self.zip and len({len(v) for v in self.zip.values()}) > 1:
            lengths = {k: len(v) for k, v in self.zip.items()}
            raise ValueError(f"zip lists must have equal lengths, got {lengths}")
        keys = list(self.grid) + list(self.zip)
        if self.isoflop is not None:
            keys += ["model.size", "train.tokens"]
        if self.variants:  # the variants axis sets every mechanism's key
            keys += ["model.attn_out", *(f"model.{m.name}" for m in catalog.mechanisms())]
        clash = sorted({k for k in keys if keys.count(k) > 1})
        if clash:
            raise ValueError(f"these keys are set by more than one axis: {clash}")
        if self.tune is not None:
            if "train.lr" in keys:
                raise ValueError("train.lr is tuned (tune.lr): no axis may set it too")
            names = self.variants or [DENSE]
            if self.tune.baseline not in names:
                raise ValueError(
                    f"tune.baseline {self.tune.baseline!r} is not one of the variants {names}"
                )
        return self


# ---------------------------------------------------------------- the file


def parse_spec(
    text: str, path: str = "<sweep>", overrides: list[str] | tuple[str, ...] = ()
) -> tuple[SweepSpec, SourceMap]:
    """Validate a sweep's text, with command-line `overrides` (KEY=VALUE, orchestrator/
    overrides.py) set first."""
    from scalelab.orchestrator.plan.overrides import apply_overrides

    data, source = load_yaml(text, path)
    if not isinstance(data, dict):
        raise SpecError([f"{path}:1: a sweep is a mapping (name:, base:, grid:, ...)"])
    data, source, problems = apply_overrides(
        data, source, list(overrides), set(SweepSpec.model_fields)
    )
    try:
        spec = SweepSpec.model_validate(copy.deepcopy(data))
    except ValidationError as e:
        raise SpecError(
            problems + located_errors(e, source) + unknown_base_keys(data, source)
        ) from None
    if problems:
        raise SpecError(problems)
    return spec, source


def unknown_base_keys(data: dict[str, Any], source: SourceMap) -> list[str]:
    """The unknown keys under `base`, and bad values of base keys an axis sets (no trial
    would ever validate them), found without the axes: reported with the sweep's other
    errors, so a file's mistakes all show at once (the rest of base is checked per trial,
    once the axes have filled it in: orchestrator/plan/expand.py)."""
    base = data.get("base")
    if not isinstance(base, dict):
        return []
    swept = {str(k) for section in ("grid", "zip") if isinstance(data.get(section), dict)
             for k in data[section]}  # fmt: skip
    if data.get("isoflop") is not None:
        swept |= {"model.size", "train.flops"}
    try:
        JobConfig.model_validate(base)
    except ValidationError as e:
        found = [
            i
            for i in e.errors()
            if i["type"] == "extra_forbidden"
            or (i["type"] != "missing" and ".".join(map(str, i["loc"][:2])) in swept)
        ]
        if found:
            only = ValidationError.from_exception_data(e.title, found)
            return located_errors(only, source, lambda loc: ("base", *loc))
    return []


def load_spec(path: str | Path) -> tuple[SweepSpec, SourceMap]:
    """Read, parse and validate a sweep file (axes are checked later, by expand)."""
    return parse_spec(read_sweep(path), str(path))


def key_path(loc: tuple[Any, ...]) -> str:
    """('grid', 'model.size', 2) -> 'grid.model.size[2]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def located_errors(
    error: ValidationError,
    source: SourceMap,
    relocate: Callable[[tuple[Any, ...]], tuple[Any, ...]] = lambda loc: loc,
    context: Callable[[tuple[Any, ...]], str] = lambda loc: "",
) -> list[str]:
    """pydantic errors -> 'file:line: key.path: message', one per problem; `relocate` maps
    a location in the validated object to the YAML key path the value came from."""
    messages = format_config_error(error, "").splitlines()
    out = []
    for item, message in zip(error.errors(), messages, strict=True):
        at = tuple(p for p in item["loc"] if p != "[key]")  # a dict key's own error
        cause = (item.get("ctx") or {}).get("error")
        if isinstance(cause, JobCheckError):  # a check across sections names its keys
            at = checked_key(cause, at, relocate)
        loc = relocate(at)
        text = message.split(": ", 2)[-1] if message.startswith(": ") else message
        out.append(f"{source.where(loc)}: {key_path(loc)}: {text}{context(at)}")
    return out


def checked_key(
    error: JobCheckError,
    at: tuple[Any, ...],
    relocate: Callable[[tuple[Any, ...]], tuple[Any, ...]],
) -> tuple[Any, ...]:
    """The location (under `at`) of the key a check names that an axis set, else its first."""
    candidates = [(*at, *key.split(".")) for key in error.keys]
    return next((c for c in candidates if relocate(c)[:1] != ("base",)), candidates[0])
