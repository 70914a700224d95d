"""Shared fixtures: one work directory (and MLflow sqlite store) and one Ray per session.

Creating an MLflow database runs its migrations (seconds), and `ray.init` takes 4-6 s, so
both are made once; each test uses its own sweep name.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # jobs_for_tests, importable by Ray workers through PYTHONPATH


@pytest.fixture(scope="session")
def work_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("scalelab-home")
    os.environ["SCALELAB_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from mlflow import MlflowClient

    from scalelab.contract.workdir import tracking_uri

    MlflowClient(tracking_uri()).search_experiments()  # creates the database once
    return home


@pytest.fixture(scope="session")
def ray_session(work_home: Path):
    from scalelab.orchestrator.backends.base import ray_init

    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    # Ray's workers know the test-only mechanism (tests/support/rezero_mechanism.py) as a
    # user's would through SCALELAB_MECHANISMS; this process registers it only where a test
    # says so (models.mechanism.registered).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELAB_MECHANISMS", "rezero_mechanism")
        ray_init("local", embedded=True, workers=64)  # as a sweep of concurrency 64 would
    import ray

    yield ray
    ray.shutdown()


@pytest.fixture
def trial_sleep(work_home: Path) -> Iterator[Callable[[float], None]]:
    """Sets how long `jobs_for_tests.sleepy` sleeps, in this session's Ray workers too."""
    from jobs_for_tests import SLEEP_FILE

    knob = work_home / SLEEP_FILE
    yield lambda seconds: knob.write_text(str(seconds))
    knob.unlink(missing_ok=True)


@pytest.fixture
def sweep_name(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:6]}"


def sweep_yaml(
    name: str, *, seeds: int = 3, backend: str = "", extra: str = "", first_seed: int = 0
) -> str:
    """A tiny sweep: nano models, `seeds` trials (one per seed, from `first_seed`). Trials
    are shared by id across sweeps in the session's work dir: a test that must train its
    own starts its seeds where no other test's are."""
    seed_list = ", ".join(str(i) for i in range(first_seed, first_seed + seeds))
    backend = (
        backend or "{concurrency: 2, max_retries: 2, retry_backoff_s: 0.1, cpus_per_trial: 0.5}"
    )
    return f"""
name: {name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: 4096, global_batch_tokens: 512}}
grid:
  seed: [{seed_list}]
backend: {backend}
{extra}
"""


def wsd_sweep_yaml(name: str, *, seed: int, backend: str) -> str:
    """Budgets 1, 2 and 4x of one wsd trial (orchestrator/plan/branching.py): the longest is the
    trunk, the two shorter ones its cooldown branches."""
    return f"""
name: {name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{global_batch_tokens: 512, schedule: wsd, warmup_steps: 1}}
grid:
  train.tokens: [2048, 4096, 8192]
  seed: [{seed}]
backend: {backend}
"""


def calls(home: Path, run_id: str, what: str = "call") -> int:
    d = home / "calls" / run_id
    return len(list(d.glob(f"{what}-*"))) if d.exists() else 0


CHINCHILLA_LADDER = HERE.parents[1] / "benchmarks" / "data" / "chinchilla_ladder.csv"


@pytest.fixture
def chinchilla(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The real Chinchilla ladder (245 runs, 57M to 16B; tokens int64 C/6N, up to ~5e11)
    imported as sweep 'chin' in a work directory of its own: its trials table."""
    from scalelab.analysis.results import tables
    from scalelab.analysis.results.imports import import_file

    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SCALELAB_DEBUG", raising=False)
    import_file(CHINCHILLA_LADDER, "chin")
    return tables.read_table(tables.TRIALS, "chin")


PYTHIA_LADDER = HERE.parents[1] / "benchmarks" / "data" / "pythia_ladder.csv"


@pytest.fixture
def pythia(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The Pythia suite's zero-shot accuracies (7 sizes, 70M to 12B, 16 checkpoints each;
    no validation loss) imported as sweep 'pythia' in a work directory of its own: its
    trials table."""
    from scalelab.analysis.results import tables
    from scalelab.analysis.results.imports import import_file

    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("SCALELAB_DEBUG", raising=False)
    import_file(PYTHIA_LADDER, "pythia")
    return tables.read_table(tables.TRIALS, "pythia")
