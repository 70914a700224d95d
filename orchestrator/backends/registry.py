"""The backends by kind: a sweep's `backend: {kind: K, ...}` is validated by the options
class of the backend registered as K, which then runs its trials.

A backend is one module: its options class (a `BackendOptions` with `kind: Literal["K"]`
and its own keys) and its `Backend` subclass (`kind = "K"`, `options = ...`; start,
launch_many, cancel, stop), registered with `register`. The built-ins are in BUILTIN; a
backend outside scalelab is registered by the process that validates and drives its sweeps
(the driver: Ray's workers run trials, never a backend), e.g. `with registered(MyBackend):`
in a test, or for the CLI by naming its module in the SCALELAB_BACKENDS environment variable
(comma-separated importable modules: every Backend with a `kind` they define is registered
on first use; only the environment names code to import, never a sweep or trial file). Nothing is cached that `register`/`unregister` could leave stale: the spec
validates `backend` (`parse_options`) and writes its JSON Schema (`options_schema`) from the
registry as it is when asked. Torch-free to import.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

from scalelab.contract.config import FrozenConfig, did_you_mean, sub_config_class
from scalelab.contract.plugins import defined_classes
from scalelab.orchestrator.backends.base import Backend, BackendError, BackendOptions
from scalelab.orchestrator.backends.local import LocalBackend
from scalelab.orchestrator.backends.ray import RayClusterBackend
from scalelab.orchestrator.backends.slurm import SlurmBackend

BUILTIN: tuple[type[Backend], ...] = (LocalBackend, RayClusterBackend, SlurmBackend)
DEFAULT_KIND = "local"  # a sweep's backend without `kind`
_KIND = re.compile(r"^[a-z][a-z0-9_]*$")
_REGISTERED: dict[str, type[Backend]] = {}
BACKENDS_ENV = "SCALELAB_BACKENDS"
_loaded: set[str] = set()  # modules of SCALELAB_BACKENDS whose backends are registered
_ERROR_TYPES = frozenset(get_args(ErrorType))


def register(backend: type[Backend]) -> None:
    """Make a backend known by its kind; its declarations are checked here."""
    kind = getattr(backend, "kind", None)
    problems = []
    if not (isinstance(backend, type) and issubclass(backend, Backend)):
        problems.append("must derive from orchestrator.backends.base.Backend")
    if not (isinstance(kind, str) and _KIND.match(kind)):
        problems.append(f"kind {kind!r} must match {_KIND.pattern}")
    options = getattr(backend, "options", None)
    if not (isinstance(options, type) and issubclass(options, BackendOptions)):
        problems.append("options must be a BackendOptions subclass")
    else:
        field = options.model_fields["kind"]
        if get_args(field.annotation) != (kind,) or field.default != kind:
            problems.append(f'its options must declare kind: Literal["{kind}"] = "{kind}"')
    if kind in _REGISTERED and _REGISTERED[kind] is not backend:
        problems.append(f"another backend is registered as {kind!r}")
    if problems:
        raise ValueError(f"backend {getattr(backend, '__name__', backend)}: " + "; ".join(problems))
    _REGISTERED[kind] = backend


def unregister(kind: str) -> None:
    if kind == DEFAULT_KIND:
        raise ValueError(f"{DEFAULT_KIND!r} is the default backend; it stays registered")
    _REGISTERED.pop(kind, None)


@contextmanager
def registered(*backends: type[Backend]) -> Iterator[None]:
    """Register `backends` for the duration of a block (tests, scripts)."""
    added = [b for b in backends if _REGISTERED.get(getattr(b, "kind", None)) is not b]
    for backend in backends:
        register(backend)
    try:
        yield
    finally:
        for backend in added:
            unregister(backend.kind)


def _load_from_environment() -> None:
    """Register the backends of the modules SCALELAB_BACKENDS names, once each."""
    for backend in defined_classes(BACKENDS_ENV, Backend, _loaded, _declares_kind):
        register(backend)


def _declares_kind(backend: type[Backend]) -> bool:
    return isinstance(backend.__dict__.get("kind"), str)  # a backend, not a base


def registry() -> Mapping[str, type[Backend]]:
    """What is registered now, by kind."""
    _load_from_environment()
    return dict(_REGISTERED)


def backend_class(kind: str) -> type[Backend]:
    """The backend registered as `kind`; BackendError (naming the registered kinds) if none."""
    _load_from_environment()
    try:
        return _REGISTERED[kind]
    except KeyError:
        raise BackendError(f"unknown backend {kind!r}; allowed: {', '.join(_REGISTERED)}") from None


def default_options() -> BackendOptions:
    """A sweep's backend when it names none."""
    return _REGISTERED[DEFAULT_KIND].options()


# ------------------------------------------------------- the spec's `backend:` mapping


def parse_options(value: Any) -> BackendOptions:
    """A sweep's `backend:` mapping -> the options of the backend its `kind` names (default
    'local'). Every problem is raised at once, at its key: a kind no backend is registered
    as (with the registered kinds), a key of another kind's options (naming that kind), an
    unknown key (with the kind's keys), and the options' own errors."""
    if isinstance(value, BackendOptions):
        return value
    _load_from_environment()
    kinds = list(_REGISTERED)
    if not isinstance(value, Mapping):
        raise PydanticCustomError(
            "dict_type", "Input should be a mapping: kind ({kinds}) and its options",
            {"kinds": ", ".join(kinds)},
        )  # fmt: skip
    kind = value.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str) or kind not in _REGISTERED:
        error = PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": _either(kinds)}
        )
        raise _invalid([{"type": error, "loc": ("kind",), "input": kind}])
    options = _REGISTERED[kind].options
    errors: list[InitErrorDetails] = []
    own = {}
    for key, item in value.items():
        if key in options.model_fields:
            own[key] = item
            continue
        others = [k for k, b in _REGISTERED.items() if key in b.options.model_fields]
        if others and item is None:
            continue  # another kind's key left unset (`address: null` on local), as ever
        if others:
            needs = f"kind={others[0]!r}" if len(others) == 1 else f"kind {_either(others)}"
            errors.append(_wrong_kind((key,), item, f"{key!r} needs {needs}, got kind={kind!r}"))
        else:
            errors.append(_unknown_key(options, (key,), item))
    try:
        found = options.model_validate(own)
    except ValidationError as e:
        errors = _details(e, options) + errors
    if errors:
        raise _invalid(errors)
    return found


def _either(names: list[str]) -> str:
    """['a', 'b', 'c'] -> "'a', 'b' or 'c'" (as pydantic words a Literal's values)."""
    return " or ".join(", ".join(repr(n) for n in names).rsplit(", ", 1))


def _invalid(errors: list[InitErrorDetails]) -> ValidationError:
    return ValidationError.from_exception_data("BackendOptions", errors)


def _wrong_kind(loc: tuple[Any, ...], value: Any, message: str) -> InitErrorDetails:
    return {"type": PydanticCustomError("wrong_kind", "{message}", {"message": message}),
            "loc": loc, "input": value}  # fmt: skip


def _unknown_key(
    options: type[BackendOptions], loc: tuple[Any, ...], value: Any
) -> InitErrorDetails:
    """An unknown key, worded as contract.config.format_config_error words one, with the
    keys of the config it is in, found from the kind's options class (which a lookup from
    SweepSpec's `backend` field cannot know)."""
    cls: type[BaseModel] | None = options
    for part in loc[:-1]:
        cls = sub_config_class(cls, str(part)) if cls is not None else None
    allowed = [] if cls is None else cls.config_keys() if issubclass(cls, FrozenConfig) else []
    message = "unknown key" + did_you_mean(str(loc[-1]), allowed)
    if allowed:
        message += f" (allowed: {', '.join(allowed)})"
    return {"type": PydanticCustomError("unknown_key", "{message}", {"message": message}),
            "loc": loc, "input": value}  # fmt: skip


def _details(error: ValidationError, options: type[BackendOptions]) -> list[InitErrorDetails]:
    """The options' problems, to be raised again with the others (as models/config.py)."""
    out: list[InitErrorDetails] = []
    for item in error.errors(include_url=False):
        if item["type"] == "extra_forbidden":
            out.append(_unknown_key(options, item["loc"], item["input"]))
            continue
        known = item["type"] in _ERROR_TYPES  # else a custom error: rebuilt with its message
        detail: InitErrorDetails = {
            "type": item["type"] if known else PydanticCustomError(item["type"], item["msg"]),
            "loc": item["loc"],
            "input": item["input"],
        }
        if "ctx" in item and known:
            detail["ctx"] = item["ctx"]
        out.append(detail)
    return out


def options_schema(handler: Any) -> dict[str, Any]:
    """`backend`'s JSON Schema: one of the registered kinds' options; `kind` is required
    except for the default kind's, so a mapping matches exactly one."""
    _load_from_environment()
    members = []
    for kind, backend in _REGISTERED.items():
        ref = handler(backend.options.__pydantic_core_schema__)
        if kind != DEFAULT_KIND:
            target = handler.resolve_ref_schema(ref)
            target["required"] = sorted({*target.get("required", []), "kind"})
        members.append(ref)
    return {"oneOf": members}


for _builtin in BUILTIN:
    register(_builtin)
