"""Trial identity by explicit fields (docs/architecture.md, 'Trial identity'); torch-free.

    trial_id(job) = sha256(canonical_json(identity_tree(job)))[:16]

The identity tree holds `semantics` (bumped when code changes what an unchanged config
computes) and, per section (model, mechanisms, data, train, seed), every science field whose
value differs from its baseline default: the default it had when trials were first recorded
with it (`CHANGED_DEFAULTS`, else today's). Fields marked `NotIdentity` (cadence, placement,
execution) are left out. A sub-config that is present counts even with all defaults
(`budget: {}` is not `budget: null`). So adding a field with a default keeps every id, and
changing a default keeps old and new trials apart.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from scalelab.contract.config import NotIdentity
from scalelab.models.mechanism import mechanism_of

if TYPE_CHECKING:
    from scalelab.jobs.config import JobConfig

# Bumped whenever code changes what an unchanged config computes, so old results are not
# mistaken for new.
# 2: text from shared token shards, a validation split fixed per (source, tokenizer) and a
#    global sample order (issue 12); version 1 trials saw per-seed windows.
# 3: the baseline's defaults of issue 19 (fan-in init, no decay on embeddings, dropout on the
#    FFN hidden layer; see docs/reproducing/baseline.md) and model.parametrization.
SEMANTICS_VERSION = 3
# The rule that turns a JobConfig into its id, recorded on every trial run
# (scalelab.identity_rule): "1" hashed the whole science dump, "2" is this module's rule.
IDENTITY_RULE = "2"
# "<section>.<field>" -> the default the field had before it changed. Empty: no default of a
# science field changed since rule 2 began (the merges of issue 19 (µP, baseline) and issue
# 13 (numerics, speed) added fields with defaults and bumped SEMANTICS_VERSION instead).
# tests/jobs/data/science_defaults.json holds today's defaults: a changed one fails
# test_science_defaults_match_the_snapshot until it is listed here.
CHANGED_DEFAULTS: dict[str, Any] = {}


# (id of a config section, its part of the tree) -> (the section, that part); the section is
# held, so its id is not reused while the memo lives
SectionMemo = dict[tuple[int, str], tuple[Any, dict[str, Any]]]


def identity_tree(
    job: JobConfig, semantics: int = SEMANTICS_VERSION, memo: SectionMemo | None = None
) -> dict[str, Any]:
    """What a trial's id hashes (sections that come out empty are left out). `memo`: the
    parts of the sections already seen, for the trials of one sweep, which share their
    section instances (orchestrator/plan/expand.py); sections are frozen."""

    def once(part: str, cfg: Any, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if memo is None:
            return make()
        seen = memo.get((id(cfg), part))
        if seen is None or seen[0] is not cfg:
            seen = memo[(id(cfg), part)] = (cfg, make())
        return seen[1]

    tree = {
        "semantics": semantics,
        "model": once("model", job.model, lambda: science(job.model, "model")),
        "mechanisms": once("mechanisms", job.model, lambda: _mechanisms(job.model)),
        "data": once("data", job.data, lambda: science(job.data, "data")),
        "train": once("train", job.train, lambda: science(job.train, "train")),
        "seed": science(job, "job", keep=("seed",)).get("seed"),
    }
    return {k: v for k, v in tree.items() if v not in ({}, None)}


def canonical_json(tree: Mapping[str, Any]) -> str:
    return json.dumps(
        tree, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def trial_id(
    job: JobConfig, semantics: int = SEMANTICS_VERSION, memo: SectionMemo | None = None
) -> str:
    """The first 16 hex digits of the sha256 of the canonical identity tree."""
    tree = identity_tree(job, semantics, memo)
    return hashlib.sha256(canonical_json(tree).encode()).hexdigest()[:16]


def science(
    cfg: BaseModel, section: str, skip: tuple[str, ...] = (), keep: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The fields of `cfg` that count: not NotIdentity, and different from their baseline
    default (a config value counts whenever present, as its own science)."""
    out: dict[str, Any] = {}
    for name, field in _counted_fields(type(cfg)):
        if name in skip or (keep is not None and name not in keep):
            continue
        value = getattr(cfg, name)
        if isinstance(value, BaseModel):
            out[name] = science(value, f"{section}.{name}")
            continue
        value = _json(value)
        key = f"{section}.{name}"
        if field.is_required() or key in CHANGED_DEFAULTS:
            default = CHANGED_DEFAULTS.get(key, _MISSING)
        else:
            default = _default_json(type(cfg), name)
        if value != default:
            out[name] = value
    return out


def _mechanisms(model: Any) -> dict[str, Any]:
    """The active mechanisms, each with its own science, and its `semantics` when not 1."""
    out: dict[str, Any] = {}
    for name, cfg in model.mechanisms.items():
        out[name] = science(cfg, f"model.{name}")
        semantics = mechanism_of(cfg).semantics
        if semantics != 1:
            out[name]["_semantics"] = semantics
    return out


_MISSING = object()
# The layout options of issue 31 (docs/reproducing/*.md), never in rule 1's dump.
_MODEL_FIELDS_SINCE_RULE_2 = (
    "dropout_sites", "qkv_bias", "attn_out_bias", "ffn_bias", "bias_init", "init_distribution",
    "init_std",
)  # fmt: skip


def _json(value: Any) -> Any:
    """A field value as pydantic's JSON mode gives it (tuples as lists, literals as str)."""
    if type(value) in _JSON_SCALARS:  # the same after a round trip: most fields, and fast
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value)) if value is not None else None


_JSON_SCALARS = (str, int, float, bool)


@functools.cache
def _counted_fields(cls: type[BaseModel]) -> tuple[tuple[str, Any], ...]:
    """(name, field) of the fields of `cls` not marked NotIdentity."""
    return tuple(
        (name, field)
        for name, field in cls.model_fields.items()
        if not any(m is NotIdentity or isinstance(m, NotIdentity) for m in field.metadata)
    )


@functools.cache
def _default_json(cls: type[BaseModel], name: str) -> Any:
    """A field's default, as `_json` gives it: the same for every trial of a sweep of
    thousands (not to be mutated)."""
    return _json(cls.model_fields[name].get_default(call_default_factory=True))


def legacy_trial_id(job: JobConfig, semantics: int = SEMANTICS_VERSION) -> str:
    """Rule "1", frozen: the sha256 of the whole science dump (every field of model, data
    without tokenizer_file, train without compile, empty early_exit_alphas and unresolved
    grad_accum_dtype left out, seed, semantics; fields added since, like async_checkpoint
    and progress_interval_s, never were in it). Only `scalelab migrate` uses it, to
    recognise trials recorded before rule 2."""
    added = {"compile", "async_checkpoint", "progress_interval_s", "warmup_steps",
             "cooldown_fraction", "cooldown_shape", "branch", "branch_seeds",
             "weight_decay_on"}  # fmt: skip
    train = job.train.model_dump(mode="json", exclude=added)
    if not train.get("early_exit_alphas"):
        train.pop("early_exit_alphas", None)
    if train.get("grad_accum_dtype") is None:
        train.pop("grad_accum_dtype", None)
    model = job.model.model_dump(mode="json")
    for name in _MODEL_FIELDS_SINCE_RULE_2:
        model.pop(name, None)
    if isinstance(model.get("tsa"), dict):
        model["tsa"].pop("router_activation", None)
    # rule 1 knew three mechanisms, as fields: attn_out, budget and tsa (null when off)
    model["attn_out"] = "hadamard" if "hadamard" in model else "dense"
    model.pop("hadamard", None)
    model.setdefault("budget", None)
    model.setdefault("tsa", None)
    dump = {
        "model": model,
        "data": job.data.model_dump(mode="json", exclude={"tokenizer_file"}),
        "train": train,
        "seed": job.seed,
        "semantics": semantics,
    }
    canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_changed_defaults(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded job dict with each field missing from it set to the default it had before
    that default changed (CHANGED_DEFAULTS), so an old trial keeps its old science."""
    out = json.loads(json.dumps(recorded))
    for key, old in CHANGED_DEFAULTS.items():
        *path, name = key.split(".")
        node = out
        for part in path[1:] if path and path[0] == "job" else path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and name not in node:
            node[name] = old
    return out
