"""SweepSpec -> [Trial]: the product of the axes, each a fully resolved, validated JobConfig.

An axis is a list of options; an option sets some dotted keys (remembering which YAML node
each value came from, so a bad value is reported at its own line). The trials are the
cartesian product of: each `grid` key, the `zip` lists (paired), the `isoflop` budgets x
sizes, and the `variants`. A trial's identity is `JobConfig.trial_id` (science only).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from scalelab.jobs import identity
from scalelab.jobs.config import JobCheckError, JobConfig
from scalelab.jobs.token_budget import total_tokens
from scalelab.models import catalog
from scalelab.models.flops import count_params, train_flops_per_token
from scalelab.orchestrator.plan.spec import (
    DEFAULT_MAX_TRIALS,
    SourceMap,
    SpecError,
    SweepSpec,
    checked_key,
    key_path,
    located_errors,
)

MAX_PROBLEMS = 20
PROGRESS_EVERY = 256  # combinations between two progress calls

# (dotted key, value, YAML key path the value came from)
Setting = tuple[str, Any, tuple[Any, ...]]


@dataclass(frozen=True)
class Trial:
    """One resolved point of the sweep, with what the plan needs to know about it."""

    job: JobConfig
    trial_id: str
    variant: str
    size: str
    n_params: int
    n_nonembed: int
    tokens: int
    flops: float  # training FLOPs (forward + backward) of the whole run
    axes: dict[str, Any] = field(default_factory=dict)  # what the axes set, for display
    # (dotted key, value, YAML key path) of each setting: where a later check's error points
    settings: tuple[Setting, ...] = field(default=(), repr=False, compare=False)
    # a sweep with `tune:`: "tune" (the rate search), "ladder" (the sweep's own trials at a
    # tuned rate) or "pending" (its trials before the search ended: planned, not run);
    # orchestrator/plan/tuning.py
    stage: str = field(default="", compare=False)


def _axes(spec: SweepSpec) -> list[list[list[Setting]]]:
    """One list of options per axis; an option is the settings it applies, in order. The
    variants come first, so that grid or zip keys inside a mechanism's settings (e.g.
    model.tsa.lambda_depth) refine the variant that switched it on."""
    axes: list[list[list[Setting]]] = []
    if spec.variants:
        base_model = spec.base.get("model")
        base_model = base_model if isinstance(base_model, dict) else {}  # else: base's error
        options = []
        for i, name in enumerate(spec.variants):
            where = ("variants", i)
            settings = catalog.variant_settings(name, base_model)
            options.append(
                [("model.attn_out", None, where)]  # the older spelling of output mixing
                + [(f"model.{m}", value, where) for m, value in settings.items()]
            )
        axes.append(options)
    for key, values in spec.grid.items():
        axes.append([[(key, v, ("grid", key, i))] for i, v in enumerate(values)])
    if spec.zip:
        n = len(next(iter(spec.zip.values())))
        axes.append([[(k, vs[i], ("zip", k, i)) for k, vs in spec.zip.items()] for i in range(n)])
    if spec.isoflop is not None:
        iso = spec.isoflop
        axes.append(
            [
                [
                    ("model.size", size, ("isoflop", "sizes", j)),
                    ("train.flops", c, ("isoflop", "flops", i)),
                    ("train.tokens", None, ("isoflop", "flops", i)),
                    ("train.tokens_per_param", None, ("isoflop", "flops", i)),
                ]
                for i, c in enumerate(iso.flops)
                for j, size in enumerate(iso.sizes)
            ]
        )
    return axes


def _without_switched_off(settings: list[Setting]) -> list[Setting]:
    """Drop settings inside a mechanism that this trial's variant switched off: a grid over
    model.tsa.lambda_depth means nothing for the dense variant (its trials then coincide
    and are kept once) and must not switch TSA on."""
    off = [key + "." for key, value, where in settings if where[0] == "variants" and value is None]
    return [s for s in settings if not any(s[0].startswith(prefix) for prefix in off)]


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        child = tree.get(part)
        if child is None:
            child = tree[part] = {}
        elif not isinstance(child, dict):
            return  # base has a non-mapping here (model: "x"): validation reports it there
        tree = child
    if value is None:
        tree.pop(last, None)  # None = leave the field to its default, or the mechanism off
        if last in ("tokens", "tokens_per_param"):
            tree[last] = None  # an explicit None: the other training budgets stay unset
    else:
        tree[last] = _copy_tree(value)


def _copy_tree(value: Any) -> Any:
    """Copy of plain YAML data (dicts, lists, scalars): faster than copy.deepcopy."""
    if isinstance(value, dict):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v) for v in value]
    return value


def _locate(loc: tuple[Any, ...], settings: list[Setting]) -> tuple[Any, ...]:
    """The YAML key path of a JobConfig error location: the axis value that set it, or base."""
    dotted = ".".join(str(p) for p in loc)
    best = None
    for key, _value, where in settings:
        if dotted == key or dotted.startswith(key + "."):
            if best is None or len(key) > len(best[0]):
                best = (key, where)
    if best is None:
        return ("base", *loc)
    key, where = best
    return (*where, *loc[len(key.split(".")) :])


def _context(loc: tuple[Any, ...], settings: list[Setting]) -> str:
    """For an error on a whole section (e.g. base.model): the axis values set inside it."""
    dotted = ".".join(str(p) for p in loc)
    inside = [(key, value, where) for key, value, where in settings if key.startswith(dotted + ".")]
    if not inside:
        return ""
    shown = {key_path(where): value for key, value, where in inside}
    return " (with " + ", ".join(f"{k} = {v!r}" for k, v in shown.items()) + ")"


# JobConfig's sub-configs; many trials share each one (a grid varies a few keys at a time).
SECTIONS = {
    name: info.annotation
    for name, info in JobConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
}


class _Validator:
    """JobConfig.model_validate with each distinct section validated once per sweep.

    A section's instance is passed to JobConfig as is (pydantic does not revalidate
    instances), so only the job-level checks run per trial. When a section is invalid,
    the whole tree is validated again so the errors carry their full location.
    """

    def __init__(self) -> None:
        self.sections: dict[tuple[Any, ...], BaseModel] = {}

    def __call__(self, base: dict[str, Any], settings: list[Setting]) -> JobConfig:
        # the base is the same for every trial: the settings inside a section name it
        keys = {
            name: (name, *((k, repr(v)) for k, v, _ in settings if k.split(".", 1)[0] == name))
            for name in SECTIONS
        }
        if all(key in self.sections for key in keys.values()):  # only job-level keys to build
            top = {k: _copy_tree(v) for k, v in base.items() if k not in SECTIONS}
            for key, value, _ in settings:
                if key.split(".", 1)[0] not in SECTIONS:
                    _set(top, key, value)
            top.update({name: self.sections[key] for name, key in keys.items()})
            return JobConfig.model_validate(top)
        tree = _copy_tree(base)
        for key, value, _ in settings:
            _set(tree, key, value)
        resolved = dict(tree)
        for name, cls in SECTIONS.items():
            sub = tree.get(name, {})
            if not isinstance(sub, dict):
                return JobConfig.model_validate(tree)
            inst = self.sections.get(keys[name])
            if inst is None:
                try:
                    inst = self.sections[keys[name]] = cls.model_validate(sub)
                except ValidationError:
                    return JobConfig.model_validate(tree)
            resolved[name] = inst
        return JobConfig.model_validate(resolved)


def check_size(spec: SweepSpec, source: SourceMap, max_trials: int | None) -> None:
    """Refuse a sweep with more axis combinations than `max_trials`, from the axes' lengths
    alone (before anything is expanded)."""
    n = spec.combinations
    if max_trials is None or n <= max_trials:
        return
    sizes = spec.axis_sizes()
    largest = max(sizes, key=lambda k: sizes[k])
    factors = " x ".join(f"{key_path(k)} {v:,}" for k, v in sizes.items())
    raise SpecError(
        [
            f"{source.where(largest)}: {n:,} trial combinations ({factors}) are more than the "
            f"limit of {max_trials:,}; check the axes, or pass --max-trials {n} to run them all"
        ]
    )


def iter_trials(
    spec: SweepSpec,
    source: SourceMap | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[Trial]:
    """The sweep's distinct trials one at a time, in axis order; `progress(n)` hears how
    many combinations have been looked at. Invalid combinations are collected and raised
    as one SpecError at the end (or at MAX_PROBLEMS): a consumer must not act on the
    trials before the iteration has finished."""
    source = source or SourceMap("<sweep>", None)
    problems: list[str] = []
    seen: set[str] = set()
    validate = _Validator()
    sizes: dict[tuple[int, int], tuple[Any, int, int, float]] = {}  # per shared model instance
    science_memo: identity.SectionMemo = {}  # the id's part of each shared section instance
    for n, combo in enumerate(itertools.product(*_axes(spec)), 1):
        if progress is not None and n % PROGRESS_EVERY == 0:
            progress(n)
        settings = _without_switched_off([s for option in combo for s in option])
        try:
            job = validate(spec.base, settings)
        except ValidationError as e:
            where = functools.partial(_locate, settings=settings)
            for line in located_errors(
                e, source, where, functools.partial(_context, settings=settings)
            ):
                if line not in problems:
                    problems.append(line)
            if len(problems) >= MAX_PROBLEMS:
                break
            continue
        if spec.storage is not None:  # a sweep-level setting every trial's job carries
            job = job.model_copy(update={"storage": spec.storage})
        trial_id = identity.trial_id(job, memo=science_memo)
        if trial_id in seen:
            continue  # two axis combinations that mean the same computation
        seen.add(trial_id)
        size_key = (id(job.model), job.data.seq_len)
        if size_key not in sizes or sizes[size_key][0] is not job.model:
            sizes[size_key] = (
                job.model,
                count_params(job.model),
                count_params(job.model, non_embedding=True),
                train_flops_per_token(job.model, job.data.seq_len),
            )
        _, n_params, n_nonembed, flops_per_token = sizes[size_key]
        tokens = total_tokens(job, n_params)
        yield Trial(
            job=job,
            trial_id=trial_id,
            variant=job.model.variant,
            size=job.model.size,
            n_params=n_params,
            n_nonembed=n_nonembed,
            tokens=tokens,
            flops=tokens * flops_per_token,
            axes={k: v for k, v, _ in settings if v is not None},
            settings=tuple(settings),
        )
    if problems:
        raise SpecError(problems)


def expand(
    spec: SweepSpec,
    source: SourceMap | None = None,
    max_trials: int | None = DEFAULT_MAX_TRIALS,
    progress: Callable[[int], None] | None = None,
) -> list[Trial]:
    """All trials of a sweep, smallest training compute first, each wsd trunk's job naming
    its cooldown branches (orchestrator/plan/branching.py); bad values, and more axis
    combinations than `max_trials` (None: no limit), raise SpecError. A sweep with
    `tune:` has two stages: plan.tuning.expand_sweep."""
    if spec.tune is not None:
        raise ValueError("a sweep with tune: is expanded by plan.tuning.expand_sweep")
    source = source or SourceMap("<sweep>", None)
    check_size(spec, source, max_trials)
    trials = list(iter_trials(spec, source, progress))
    if not trials:
        raise SpecError([f"{source.path}: the sweep has no trials"])
    from scalelab.orchestrator.plan.branching import with_trunks

    return with_trunks(sorted(trials, key=lambda t: (t.flops, t.trial_id)))


def trial_problem(trial: Trial, error: JobCheckError, source: SourceMap) -> str:
    """'file:line: key: message' for a check that failed on one trial: the line of the
    value (an axis's, or base's) that the check names. The message names the values it is
    about, so trials that fail the same way give the same line."""
    relocate = functools.partial(_locate, settings=list(trial.settings))
    loc = relocate(checked_key(error, (), relocate))
    return f"{source.where(loc)}: {key_path(loc)}: {error}"


def gpu_hours(flops: float, mfu: float, peak_flops: float) -> float:
    return flops / (mfu * peak_flops) / 3600.0


def plan_rows(
    spec: SweepSpec, trials: list[Trial], statuses: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One row per trial for `submit --dry-run` (status: the ledger's, or NEW)."""
    statuses = statuses or {}
    est = spec.estimate
    return [
        {
            "trial_id": t.trial_id,
            "variant": t.variant,
            "size": t.size,
            "params": t.n_params,
            "tokens": t.tokens,
            "flops": t.flops,
            "gpu_hours": gpu_hours(t.flops, est.mfu, spec.peak_flops),
            "status": statuses.get(t.trial_id, "NEW"),
        }
        for t in trials
    ]
