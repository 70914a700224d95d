"""A task file is data, never code (docs/reliability.md, "What a sweep file or a trial folder
can make scalelab run"; docs/evaluation.md).

lm-eval renders a task's `doc_to_text`, `doc_to_target`, `doc_to_choice` and friends with
an unsandboxed Jinja environment, where `{{ cycler.__init__.__globals__.os.system(...) }}`
runs a shell command; and a metric its registry does not know is looked up with HF
`evaluate.load(name)`, which runs the Python file a local path names. So, for a local task
file (a path given to `--tasks`, `eval.downstream` or `eval.in_loop`):

- its YAML is read with `yaml.safe_load` (no `!function`, no Python object);
- every template in it is parsed and refused where it reaches for an attribute or item
  whose name starts with `_`, uses the `attr` filter, or names Jinja's own globals
  (`cycler`, `joiner`, `namespace`, `lipsum`): the known ways out of a template;
- its metrics and filters must be ones lm-eval registers; `hf_evaluate` is refused;

and every template lm-eval renders in this process, any task's, goes through Jinja's
`SandboxedEnvironment` (`sandbox_templates`), which refuses unsafe attributes at render
time: the check above says no early, in one line; the sandbox holds if it misses a way.
"""

from __future__ import annotations

from typing import Any

from scalelab.jobs.downstream.errors import TaskError

ESCAPE_GLOBALS = frozenset({"cycler", "joiner", "namespace", "lipsum", "self"})


def check_config(cfg: dict[str, Any], where: str) -> None:
    """TaskError (one line) for the first thing in a local task config that could run code."""
    for path, text in _strings(cfg, ()):
        if "{{" in text or "{%" in text:
            problem = template_problem(text)
            if problem:
                raise TaskError(f"{where}: {'.'.join(path)}: {problem}; a task file runs no code")
    _check_metrics(cfg, where)
    _check_filters(cfg, where)


def template_problem(text: str) -> str | None:
    """Why a Jinja template may reach outside its document; None when it cannot."""
    from jinja2 import TemplateSyntaxError, nodes
    from jinja2.sandbox import SandboxedEnvironment

    try:
        tree = SandboxedEnvironment().parse(text)
    except TemplateSyntaxError as e:
        return f"not a template ({e.message})"
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Name, nodes.Filter)):
        if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
            return f"reads the attribute {node.attr!r}"
        if isinstance(node, nodes.Getitem):
            key = node.arg
            if isinstance(key, nodes.Const) and str(key.value).startswith("_"):
                return f"reads the item {key.value!r}"
        if isinstance(node, nodes.Name) and node.name in ESCAPE_GLOBALS:
            return f"uses Jinja's {node.name!r}"
        if isinstance(node, nodes.Filter) and node.name == "attr":
            return "uses the 'attr' filter"
    return None


def _strings(value: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], str]]:
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, (*path, str(k)))]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in _strings(v, (*path, str(i)))]
    return []


def _check_metrics(cfg: dict[str, Any], where: str) -> None:
    import lm_eval.api.metrics  # noqa: F401  (fills the registry)
    from lm_eval.api.registry import metric_registry

    for entry in cfg.get("metric_list") or []:
        if not isinstance(entry, dict):
            raise TaskError(f"{where}: metric_list: each entry is a mapping with a 'metric'")
        name = entry.get("metric")
        if entry.get("hf_evaluate") or not isinstance(name, str) or name not in metric_registry:
            raise TaskError(
                f"{where}: metric {name!r} is not one of lm-eval's own metrics (HF evaluate "
                "would load it as code); a task file runs no code"
            )


def _check_filters(cfg: dict[str, Any], where: str) -> None:
    import lm_eval.filters  # noqa: F401  (fills the registry)
    from lm_eval.api.registry import filter_registry

    for pipeline in cfg.get("filter_list") or []:
        steps = pipeline.get("filter", []) if isinstance(pipeline, dict) else [None]
        for step in steps:
            name = step.get("function") if isinstance(step, dict) else None
            if not isinstance(name, str) or name not in filter_registry:
                raise TaskError(f"{where}: filter {name!r} is not one of lm-eval's own filters")


def sandbox_templates() -> None:
    """lm-eval's template environment made a `SandboxedEnvironment` with the same settings
    and filters (process-wide, once)."""
    import lm_eval.utils
    from jinja2 import BaseLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    if isinstance(lm_eval.utils.env, SandboxedEnvironment):
        return
    env = SandboxedEnvironment(
        loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True
    )
    env.filters.update(lm_eval.utils.env.filters)
    lm_eval.utils.env = env
