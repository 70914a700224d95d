"""What a trial's MLflow run records about where it came from: the code version and the
flattened JobConfig. The orchestrator's ledger and the training job both write these into
the same run, so both must use these functions (MLflow refuses a param whose value changes).
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from scalelab.contract.runs import PREFIX
from scalelab.jobs.config import JobConfig
from scalelab.jobs.identity import SEMANTICS_VERSION

PARAM_VALUE_LIMIT = 6000  # MLflow 3's limit on a param value (older servers: 500)


@cache
def code_version() -> str:
    """'semantics<N>+<git sha>' (or '+<package version>' outside a git checkout)."""
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        ref = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        ref = ""
    if not ref:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ref = version("scalelab")
        except PackageNotFoundError:
            ref = "unknown"
    return f"semantics{SEMANTICS_VERSION}+{ref}"


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{'model': {'size': 'nano'}} -> {'model.size': 'nano'}: strings as they are, every other
    leaf as JSON (null, true, 0.001, [..]), cut to MLflow's param length limit."""
    out: dict[str, str] = {}
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    else:
        text = tree if isinstance(tree, str) else json.dumps(tree)
        out[prefix] = text[:PARAM_VALUE_LIMIT]
    return out


def mlflow_params(job: JobConfig) -> dict[str, str]:
    """The run's params: the flattened, fully resolved JobConfig without its unset (null)
    leaves, which are every such field's default: the params rebuild the same JobConfig.
    A trunk's train.branch_seeds, the storage and `eval` are left out: what a later submit
    may change (another budget joins, another bucket, more downstream tasks), where an
    MLflow param may never change."""
    exclude = {"train": {"branch_seeds"}, "storage": True, "eval": True}
    dump = job.model_dump(mode="json", exclude=exclude)
    return {k: v for k, v in flatten(dump).items() if v != "null"}


def parse_param(text: str) -> Any:
    """An MLflow param back to a value: JSON ('0.001', 'null', '"x"') or Python's str()
    of it ('None', 'True'), else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return {"None": None, "True": True, "False": False}.get(text, text)


def unflatten(params: dict[str, str]) -> dict[str, Any]:
    """{'model.tsa.lambda_depth': '0.1'} -> {'model': {'tsa': {'lambda_depth': 0.1}}}."""
    out: dict[str, Any] = {}
    for key, text in params.items():
        if key.startswith(PREFIX):  # scalelab.* params are not the job's
            continue
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                break
            node = nxt
        else:
            node[leaf] = parse_param(text)
    return out
