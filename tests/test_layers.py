"""The house's rules, read from the source (docs/architecture.md, 'Layers').

Every import of ours is spelled `scalelab.<package>` (one import name). A package imports
only downwards (cli -> analysis -> orchestrator -> jobs -> models -> kernels, and everyone may
import contract, which imports nothing of ours); no import cycles, none hidden
behind strings; the modules the CLI needs at start load no heavy library; the names of the
orchestrator <-> job contract (MLflow tags, statuses, the parent run's name) are spelled in
contract/ only. The allowlists below name what is not there yet (issue 16's later steps
empty them); a new entry needs a reason.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "orchestrator", "analysis", "jobs", "models", "kernels", "contract")
NAME = "scalelab"  # the import name; module names below are relative to it
ALLOWED = {
    "cli": {"orchestrator", "analysis", "jobs", "models", "contract"},
    "orchestrator": {"jobs", "models", "contract"},
    # analysis answers about sweeps the orchestrator defines (their plans, their spools); the
    # orchestrator never imports analysis
    "analysis": {"orchestrator", "jobs", "models", "contract"},
    "jobs": {"models", "contract"},
    "models": {"kernels", "contract"},
    "kernels": set(),
    "contract": set(),
}
# Cycles that exist today, each as its set of modules (none: a new one is a defect).
KNOWN_CYCLES: set[frozenset[str]] = set()
# Modules that turn a string into code: the modules SCALELAB_MECHANISMS and SCALELAB_BACKENDS
# name (contract/plugins.py; read from the environment only), and the job
# reference of `jobs.launch` (the CLI's developer hook `--job module:function`); never a
# sweep or trial file.
STRING_IMPORTS = {"contract/plugins.py", "jobs/launch.py"}
# Imported when the CLI starts (scalelab --help, status, cancel, submit --dry-run's parse).
TORCH_FREE = (
    "cli.main",
    "orchestrator.plan.spec",
    "orchestrator.plan.expand",
    "orchestrator.ledger",
    "orchestrator.scheduler",
    "orchestrator.backends",
    "jobs.launch",
    "analysis.results",
    "analysis.report",
    "analysis.plots",
    "models.config",
    "models.flops",
    "models.mechanism",
    "models.catalog",
    "models.dense",  # the built-ins' declarations: validating a sweep's variants loads them
    "models.hadamard",
    "models.budget",
    "models.tsa",
    "jobs.config",
    "contract.workdir",
    "contract.config",
    "contract.runs",
    "contract.outcome",
)
HEAVY = ("torch", "ray", "mlflow", "pyarrow", "matplotlib", "scipy", "deepspeed", "submitit")
HEAVY += ("datasets",)
# Files that still spell contract names themselves. slurm.py: SLURM's job states (RUNNING)
# share a name with a run status. The results module moves in issue 16 steps 7-8, where it
# takes its names from contract.runs.
SPELLED_OUTSIDE_CONTRACT = {
    "orchestrator/backends/slurm.py",
    "analysis/results/sync.py",
}


def _modules() -> dict[str, Path]:
    """Every project module by dotted name below `scalelab` (packages by their own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else []:
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that `name` imports, at module level or inside functions (not
    under `if TYPE_CHECKING:`); `from pkg import x` counts as an import of pkg.x when that
    is a module, else of pkg."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    edges = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue  # annotations only: no import at run time
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = [NAME, *here.split(".")]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            ours = base.removeprefix(NAME + ".")
            targets = [
                f"{base}.{a.name}" if f"{ours}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != NAME:
                continue  # not ours (relative imports are resolved to ours above)
            target = target.removeprefix(NAME).removeprefix(".")
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _bare_imports(path: Path) -> list[str]:
    """Imports of a package of ours by its folder's name (`from models import ...`): outside
    the repository that name is whatever else the environment has. Code in strings (run by
    `python -c` in a subprocess) counts too."""
    tree = ast.parse(path.read_text(), str(path))
    return _bare_imports_in(tree, path) + [
        line
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value
        for code in [_parsed(node.value)]
        if code is not None
        for line in _bare_imports_in(code, path, node.lineno - 1)
    ]


def _parsed(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _bare_imports_in(tree: ast.Module, path: Path, offset: int = 0) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno + offset}: {n}" for n in names
                  if n.split(".")[0] in PACKAGES]  # fmt: skip
    return found


def test_every_import_uses_the_one_import_name():
    files = [
        p
        for p in ROOT.rglob("*.py")
        if not {".venv", "build"} & set(p.parts)
        and p != ROOT / "tests" / "test_packaging.py"  # a user's project, with its own `models`
    ]
    bare = [line for path in files for line in _bare_imports(path)]
    assert not bare, "import these as scalelab.<package>:\n" + "\n".join(bare)


# Everything outside the orchestrator that drives or reads sweeps (the CLI, the results
# side, the notebook API) reaches the orchestrator through its one door
# (docs/architecture.md, 'The doors').
OUTSIDE_THE_ORCHESTRATOR = ("cli", "analysis", "__init__.py", "__main__.py")
DOOR = f"{NAME}.orchestrator.door"


def _orchestrator_imports(path: Path, root: Path = ROOT) -> list[str]:
    """`scalelab.orchestrator...` imports in a file, type-only ones included, as dotted
    module names (`from scalelab.orchestrator import door` is the door)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
            if node.module == f"{NAME}.orchestrator":
                names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                  if n.startswith(f"{NAME}.orchestrator") and n != DOOR]  # fmt: skip
    return found


def test_callers_outside_the_orchestrator_go_through_its_door():
    files = [
        path
        for where in OUTSIDE_THE_ORCHESTRATOR
        for path in (
            [ROOT / where] if where.endswith(".py") else sorted((ROOT / where).rglob("*.py"))
        )
    ]
    wrong = [line for path in files for line in _orchestrator_imports(path)]
    assert not wrong, "import scalelab.orchestrator.door instead:\n" + "\n".join(wrong)


def test_the_door_check_sees_a_side_entrance(tmp_path: Path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "from scalelab.orchestrator import door, ledger\n"
        "def f():\n    from scalelab.orchestrator.plan.spec import SpecError\n"
        "import scalelab.orchestrator.door\n"
    )
    found = [line.rsplit(": ", 1)[-1] for line in _orchestrator_imports(sneaky, tmp_path)]
    assert found == [f"{NAME}.orchestrator.ledger", f"{NAME}.orchestrator.plan.spec"]


def test_packages_import_only_downwards():
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in _graph().items()
        for target in targets
        if (a := source.split(".")[0]) != (b := target.split(".")[0]) and b not in ALLOWED[a]
    )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_import_cycles_beyond_the_known_ones():
    cycles = set(_cycles(_graph()))
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    gone = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert not new, f"new import cycles: {new}"
    assert not gone, f"cycles gone: remove them from KNOWN_CYCLES: {gone}"


def test_no_string_imports_outside_the_allowlist():
    found = set()
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in ("import_module", "__import__"):
                    found.add(path.relative_to(ROOT).as_posix())
    assert found == STRING_IMPORTS


def test_cli_starts_without_heavy_libraries():
    modules = [
        m for m in TORCH_FREE if m.split(".")[0] in {p for p in PACKAGES if (ROOT / p).is_dir()}
    ]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module('{NAME}.' + m)\n"
        f"print(json.dumps(sorted(h for h in {HEAVY!r} if h in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.splitlines()[-1]) == []


# MLflow names of the orchestrator <-> job contract: tag and param keys, the parent run's name.
CONTRACT_PREFIXES = ("scalelab.", "sweep:")
RUN_STATUSES = {"SCHEDULED", "RUNNING", "FINISHED", "FAILED", "KILLED", "PREEMPTED"}


def _contract_spellings(path: Path) -> list[str]:
    """String constants (docstrings and other bare string statements left out) that spell a
    contract name or are a bare run status."""
    tree = ast.parse(path.read_text())
    bare = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in bare
        and (node.value.startswith(CONTRACT_PREFIXES) or node.value in RUN_STATUSES)
        and not _module_path(node.value)
    ]


def _module_path(value: str) -> bool:
    """'scalelab.jobs.training.train:run': one of our modules, not an MLflow name."""
    parts = value.split(":")[0].split(".")
    return len(parts) > 1 and parts[0] == NAME and parts[1] in PACKAGES


def test_mlflow_names_are_spelled_only_in_the_contract():
    spelled = {}
    for path in _modules().values():
        where = path.relative_to(ROOT).as_posix()
        if not where.startswith("contract/") and _contract_spellings(path):
            spelled[where] = _contract_spellings(path)
    unexpected = {k: v for k, v in spelled.items() if k not in SPELLED_OUTSIDE_CONTRACT}
    assert not unexpected, "use contract.runs instead of:\n" + "\n".join(
        line for lines in unexpected.values() for line in lines
    )
    stale = SPELLED_OUTSIDE_CONTRACT - set(spelled)
    assert not stale, f"spelled in the contract now: remove from the allowlist: {sorted(stale)}"


# Modules that import a mechanism's modules directly, with why (everything else asks
# models/catalog.py or the config's component at a seam). A built-in mechanism's modules: its
# declaration (torch-free), its arithmetic, and its torch modules (*_layers).
MECHANISM_MODULES = {
    *("models.hadamard", "models.hadamard_layers"),
    *("models.budget", "models.budget_flops", "models.budget_layers"),
    *("models.tsa", "models.tsa_counts", "models.tsa_layers"),
}
IMPORTS_MECHANISMS = {
    "models.catalog": "the registry's door: loads the built-ins",
    "models.decode": "a per-token decoding step for each built-in's module",
    "models.early_exit": "the baseline TSA is compared with reuses TSA's sparse FFN",
    "jobs.training.validation": "early exit's TLOps saved, defined as TSA's",
    "jobs.training.train": "which Hadamard kernel ran (and why auto fell back), on the run",
    "jobs.downstream.executed": "evaluation's mode and what ran (TSA's routers, budget nets)",
}


def test_mechanism_modules_are_imported_only_where_listed():
    importers = {
        source
        for source, targets in _graph().items()
        if targets & MECHANISM_MODULES and source not in MECHANISM_MODULES
    }
    assert importers == set(IMPORTS_MECHANISMS)
