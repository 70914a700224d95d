"""The installed package has one import name (docs/architecture.md, 'Packages'): the wheel
holds `scalelab/` only, every module of the repository's package folders is in it, and a
project with its own `models`, `analysis`, `jobs` and `cli` packages imports both its own and
scalelab's, and runs the command, in a fresh venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("cli", "orchestrator", "analysis", "jobs", "models", "kernels", "contract")
USER_PACKAGES = ("models", "analysis", "jobs", "cli")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tracked files (no build/ or egg-info left in the
    checkout)."""
    src = tmp_path_factory.mktemp("src")
    tracked = _run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--disable-pip-version-check", "-q", "-w", str(dist), str(src)])  # fmt: skip
    (found,) = dist.glob("scalelab-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_holds_scalelab_and_all_of_it(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"scalelab"}
    modules = {n.removeprefix("scalelab/") for n in names if n.endswith(".py")}
    ours = {
        p.relative_to(ROOT).as_posix()
        for folder in FOLDERS
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert ours | {"__init__.py", "__main__.py"} == modules
    shipped_tasks = {"jobs/downstream/tasks/scalelab_zen.yaml", "jobs/downstream/tasks/zen.jsonl"}
    assert {f"scalelab/{t}" for t in shipped_tasks} <= set(names)  # `scalelab eval`'s task


@pytest.mark.slow
def test_a_project_with_its_own_models_imports_both(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "-q", "--no-deps", str(wheel)])
    # the dependencies (torch, mlflow, ...) from this venv, after the fresh one's own
    # packages: a plain path, so this venv's editable scalelab is not on it
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    Path(site.stdout.strip(), "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    project = tmp_path / "project"
    for name in USER_PACKAGES:
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(f"WHO = 'the project: {name}'\n")
    code = (
        "import analysis, cli, jobs, models\n"
        "import scalelab, scalelab.analysis.results, scalelab.cli.main, scalelab.jobs.config\n"
        "import scalelab.models.sizes\n"
        "print(models.WHO, analysis.WHO, jobs.WHO, cli.WHO, sep='|')\n"
        "print(scalelab.__file__)\n"
        "print(scalelab.models.sizes.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = _run([str(python), "-c", code], cwd=project, env=env)
    theirs, ours, sizes = done.stdout.splitlines()
    assert theirs == "|".join(f"the project: {n}" for n in ("models", "analysis", "jobs", "cli"))
    installed = Path(site.stdout.strip()) / "scalelab"
    assert Path(ours) == installed / "__init__.py"
    assert Path(sizes) == installed / "models" / "sizes.py"
    # the command, run from inside the project (its folder first on sys.path)
    helped = _run([str(python), "-m", "scalelab", "models"], cwd=project, env=env)
    assert "124M" in helped.stdout

    files = _run([*pip, "show", "-f", "scalelab"], env=env).stdout
    listed = [line.strip() for line in files.split("Files:", 1)[1].splitlines() if line.strip()]
    assert listed and all(
        f.startswith(("scalelab/", "scalelab-")) or f == "../../../bin/scalelab" for f in listed
    ), [f for f in listed if not f.startswith("scalelab")]
    assert "../../../bin/scalelab" in listed  # the entry point


STATE_FILES = ("mlflow.db", "mlruns", "scalelab-runs", "mlartifacts", "ray_results")


def test_the_tree_holds_no_database_or_run_folder():
    """What a run writes (MLflow's sqlite store, whose default is `mlflow.db` in the working
    directory, a run folder) is never part of the source: nothing tracked is one, and the
    repository ignores each, so a run from the checkout cannot add one by accident."""
    tracked = _run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    found = [
        name
        for name in filter(None, tracked)
        if name.endswith((".db", ".db-wal", ".db-shm", ".sqlite"))
        or set(Path(name).parts) & set(STATE_FILES)
    ]
    assert found == [], f"run state is tracked: {found}"
    checked = ["mlflow.db", "sub/mlflow.db", "mlflow.db-wal", "mlruns/0/meta.yaml"]
    checked += ["scalelab-runs/trials/x/job.json", "mlartifacts/1/a", "ray_results/t/r.json"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *checked], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert sorted(ignored) == sorted(checked), f"not ignored: {set(checked) - set(ignored)}"
