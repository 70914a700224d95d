"""Everything that rewrites a sweep's results tables (`results import`, `results sync`, and
`scalelab eval`'s re-sync, which is a sync) holds one lock per sweep across its
read-modify-write: an import made while a sync is between reading the tables and writing
them waits for it, and both sets of rows survive. Real processes: the sync and the import
run as `python -m scalelab` commands; the sync is held up by a real slow read (one trial's
curves file is a named pipe, as a stalled network filesystem would hold it), never by a hook.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from synthetic_sweep import write_sweep

from scalelab.analysis.results import ResultsError, tables
from scalelab.analysis.results.imports import import_file
from scalelab.contract import workdir

WAIT_S = 60.0  # what a step may take on a loaded machine before the test gives up


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def _scalelab(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "scalelab", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)  # fmt: skip


def _csv(path: Path, names: list[str]) -> Path:
    rows = "".join(
        f"{(i + 1) * 10**7},{2 * 10**9},{3.5 - i / 10},{n}\n" for i, n in enumerate(names)
    )
    path.write_text("N,tokens,loss,name\n" + rows)
    return path


def _names(sweep: str) -> set[str]:
    return set(tables.read_table(tables.TRIALS, sweep, columns=["name"])["name"].to_pylist())


def _open_writer(fifo: Path, proc: subprocess.Popen) -> int:
    """The write end of `fifo`, once a reader has opened it (the sync is reading it)."""
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads it yet
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
    raise AssertionError("the sync never read the trial's curves")


def test_an_import_during_a_sync_waits_and_both_keep_their_rows(home: Path, tmp_path: Path):
    trials = write_sweep("race", sizes=("nano",), tokens_per_param=(10, 20), steps=4)
    import_file(_csv(tmp_path / "a.csv", ["a1", "a2"]), "race")  # what the import replaces
    curves = workdir.trial_dir(trials[0].trial_id) / workdir.CURVES_FILE
    data = curves.read_bytes()
    curves.unlink()
    os.mkfifo(curves)
    b = _csv(tmp_path / "b.csv", ["b1", "b2", "b3"])

    sync = _scalelab("results", "sync", "race")
    fd = _open_writer(curves, sync)  # the sync has read the tables and waits on this file
    try:
        imp = _scalelab("results", "import", str(b), "--sweep", "race", "--join-trained")
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(imp.stderr), daemon=True)
        reader.start()
        end = time.monotonic() + WAIT_S  # it waits for the sync, or (unlocked) it is done
        while imp.poll() is None and not any("waiting" in s for s in said):
            assert time.monotonic() < end, said
            time.sleep(0.05)
        os.set_blocking(fd, True)
        os.write(fd, data)
    finally:
        os.close(fd)
    assert sync.wait(WAIT_S) == 0, sync.communicate()
    assert imp.wait(WAIT_S) == 0, (imp.stdout.read(), said)
    reader.join(WAIT_S)
    trained = {t.trial_id for t in trials}
    table = tables.read_table(tables.TRIALS, "race").to_pylist()
    assert {r["trial_id"] for r in table if r["curves_source"] != "imported"} == trained
    assert _names("race") - {r["name"] for r in table if r["trial_id"] in trained} == {
        "b1", "b2", "b3"
    }  # fmt: skip
    assert any("waiting for another process" in s for s in said), said


def test_a_writer_waits_a_bounded_time_then_says_who_holds_it(home: Path, tmp_path: Path):
    import_file(_csv(tmp_path / "a.csv", ["a1"]), "held")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom scalelab.analysis.results import tables\n"
         "with tables.tables_lock('held'):\n    print('held', flush=True)\n    time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        start = time.monotonic()
        with pytest.raises(ResultsError) as e:
            import_file(_csv(tmp_path / "b.csv", ["b1"]), "held", wait_s=0.5)
        assert time.monotonic() - start < 10
        message = str(e.value)
        assert len(message.splitlines()) == 1
        assert "another process" in message and "0.5 s" in message
    finally:
        holder.kill()
        holder.wait()
    assert _names("held") == {"a1"}  # nothing written by the import that gave up
    import_file(_csv(tmp_path / "b.csv", ["b1"]), "held")  # the holder died: the lock is free
    assert _names("held") == {"b1"}
