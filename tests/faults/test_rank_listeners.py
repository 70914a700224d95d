"""A trial of several ranks on one machine listens on loopback only (docs/reliability.md,
"What listens where"): under torchrun its rendezvous store listened on every interface.
Real DeepSpeed on 2 gloo ranks, started the way the local and Ray backends start them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from faults.listeners import listeners_of, off_loopback

from scalelab.jobs.config import JobConfig

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

RUN_TWO_RANKS = """
import json, sys
from scalelab.jobs.config import JobConfig
from scalelab.jobs.launch import run_ranks
job = JobConfig.model_validate_json(open(sys.argv[1]).read())
print(json.dumps(run_ranks(job, None, 2)))
"""


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie, since the tree was listed
        return ""


def test_a_two_rank_trial_listens_on_loopback_only(tmp_path: Path, monkeypatch, empty_store):
    job = JobConfig.model_validate(
        {
            "model": {"size": "nano", "vocab_size": 256, "block_size": 32},
            "data": {"source": "builtin:pydoc", "seq_len": 32, "val_tokens": 256},
            "train": {"tokens": 256 * 4, "global_batch_tokens": 256, "eval_interval": 4},
            "deepspeed": {"zero_stage": 2},
        }
    )
    (tmp_path / "job.json").write_text(job.model_dump_json())
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(tmp_path / "mlflow.db"))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    proc = subprocess.Popen([sys.executable, "-c", RUN_TWO_RANKS, str(tmp_path / "job.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    root = psutil.Process(proc.pid)
    listening: dict[tuple[int, str], set[tuple[str, int]]] = {}
    ranks_seen: set[int] = set()
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        ranks_seen |= {p.pid for p in tree[1:] if "scalelab.jobs.training.train" in _cmdline(p)}
        for key, socks in listeners_of(tree).items():
            listening.setdefault(key, set()).update(socks)
        time.sleep(0.2)
    out, err = proc.communicate()
    assert proc.returncode == 0 and json.loads(out.splitlines()[-1])["status"] == "FINISHED", err[
        -3000:
    ]
    assert len(ranks_seen) >= 2 and listening, "no ranks or sockets seen: a vacuous check"
    assert not off_loopback(listening), off_loopback(listening)
    # rank 1 printed into its own log (issue 26, item 8), rank 0 where its parent does
    rank1 = tmp_path / "home" / "trials" / job.trial_id / "logs" / "rank1.log"
    assert rank1.read_text().splitlines()[0].endswith(" rank 1")
