"""Test-wide settings: offline, no telemetry, few threads (the CI machine has 2 cores)."""

import os
import sys
from pathlib import Path

# Test support modules (the test-only mechanism, ...): importable here and, through
# PYTHONPATH, by Ray workers and subprocesses.
SUPPORT = Path(__file__).resolve().parent / "support"
sys.path.insert(0, str(SUPPORT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")])
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# pytest-xdist's workers start with COLUMNS=80 whatever the terminal, and the CLI honours
# COLUMNS (cli/console.py): tests that depend on a width set it themselves
os.environ.pop("COLUMNS", None)

import pytest  # noqa: E402
from empty_store import empty_store  # noqa: E402, F401
from slurm_cluster import SlurmCluster, slurm_cluster, two_node_cluster  # noqa: E402, F401

# Tests that share one expensive thing run in one pytest-xdist worker (`make test` runs two,
# --dist loadgroup): the single-node SLURM (its CPUs, and start.sh's first-time install)
# and the session fixture that trains a trial. A test that uses a module fixture (a trained
# trial, a spooled home) stays with the rest of its file, so that fixture is built once;
# every other test is a group of its own, handed out alone: whole files as units left one
# worker idle while the other ran a long file to its end (pytest 22 min against 20).
SHARED_FIXTURE_GROUPS = {"slurm_cluster": "slurm", "checkpointed_trial": "checkpointed-trial"}


def _worker_group(item: pytest.Item) -> str:
    if item.get_closest_marker("slurm"):
        return "slurm"
    for fixture, group in SHARED_FIXTURE_GROUPS.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    if _uses_a_module_fixture(item):
        return item.nodeid.split("::")[0]
    return item.nodeid


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope == "module" for defs in definitions for d in defs)


def _heaviest_groups_first(items: list[pytest.Item]) -> None:
    """Order the groups by their number of slow tests, then of tests (most first), keeping
    each group's own order. `make test` hands groups out in collection order
    (--no-loadscope-reorder), so the long groups start early and the last ones given out
    are quick: a long group handed out last would run alone while the other worker idles.
    (pytest-xdist's own reorder goes by number of tests, which put one-test groups of a
    minute or more at the end.)"""
    slow: dict[str, int] = {}
    count: dict[str, int] = {}
    for item in items:
        group = item.get_closest_marker("xdist_group").args[0]
        slow[group] = slow.get(group, 0) + bool(item.get_closest_marker("slow"))
        count[group] = count.get(group, 0) + 1
    rank = {g: i for i, g in enumerate(sorted(count, key=lambda g: (-slow[g], -count[g])))}
    items.sort(key=lambda item: rank[item.get_closest_marker("xdist_group").args[0]])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Worker groups (heaviest first under --dist loadgroup); GPU tests skip where there is
    no CUDA device, the rest always runs."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    if getattr(config.option, "dist", "no") == "loadgroup":  # a plain run keeps file order
        _heaviest_groups_first(items)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class _GroupsCheck:
    """Under `--dist loadgroup`, stops at once when pytest-xdist did not tag the tests with
    their group: it then hands out every test on its own, silently (pytest-xdist#1386, with
    pytest 9.2's node ids), so shared fixtures are built on both workers and the SLURM tests
    run side by side. requirements/constraints.txt pins a pytest it works with."""

    @pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, on the controller
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        if node.config.getvalue("dist") != "loadgroup":
            return
        ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
        if ungrouped:
            pytest.exit(
                f"pytest-xdist did not group {len(ungrouped)} tests (e.g. {ungrouped[0]}): "
                "--dist loadgroup needs the pytest of requirements/constraints.txt",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_GroupsCheck(), "scalelab-groups-check")
