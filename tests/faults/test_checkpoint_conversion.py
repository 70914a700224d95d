"""Converting a checkpoint for another rank count (issue 26, item 2): a conversion whose
process is killed part-way continues where it stopped, one that finished is never redone, and a checkpoint
that fails its checks is recorded as such and the next older one converted instead. The
trial here was written by 1 rank and is converted for 2 (as 2 ranks resuming it would)."""

import subprocess
import sys
import time

import pytest
import torch

from scalelab.jobs.training import checkpoint, universal

TAG = "step00000008"


def _universal_weights(folder) -> dict:
    """name -> fp32 weight of a conversion's optimized parameters (those with Adam moments
    beside it; a tied copy has its weight alone)."""
    from scalelab.jobs.training.safe_load import weights_only_loading

    weights = {}
    with weights_only_loading():
        for param in sorted((folder / "zero").iterdir()):
            if param.is_dir() and (param / "exp_avg_sq.pt").exists():
                weights[param.name] = torch.load(param / "fp32.pt", weights_only=True)["param"]
    return weights


def _files(folder) -> dict:
    """relative path -> bytes of every file under `folder`."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_conversion_killed_part_way_continues_and_a_finished_one_is_kept(trial_copy, capfd):
    ckpt, tag_dir = trial_copy.ckpt, trial_copy.ckpt / TAG
    out = universal.conversion_dir(ckpt, TAG)
    key = universal.source_key(tag_dir / checkpoint.MARKER)
    extracted = out.with_name(TAG + universal.PARTIAL_SUFFIX) / universal.RESUME_DIR / "extract"
    converter = subprocess.Popen(
        [sys.executable, "-m", "scalelab.jobs.training.universal", str(tag_dir), str(out), key,
         "1", "1"]
    )  # fmt: skip
    try:  # killed as soon as its extract phase (one shard: one rank wrote it) is recorded
        while converter.poll() is None and not list(extracted.glob("*.json")):
            time.sleep(0.002)
        converter.kill()
    finally:
        converter.wait()
    assert converter.returncode == -9, "the converter finished before it could be killed"
    assert not out.exists()
    capfd.readouterr()

    done = checkpoint.prepare_resume(ckpt, world_size=2)  # as each of 2 ranks would

    assert done.startswith(f"{TAG}: converted for 2 rank(s) in"), done
    assert "continuing a conversion cut short (1 extract and " in done
    assert "[scalelab] extract (0, 0, 0): done before, skipped" in capfd.readouterr().err
    assert universal.converted(out, key)
    assert not list(out.parent.glob("*.partial*/"))  # the killed one's leftovers are gone
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    saved = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=TAG)
    converted = _universal_weights(out)
    assert converted.keys() <= saved.keys() and len(converted) > 10
    assert all(torch.equal(w, saved[name]) for name, w in converted.items())
    # the same files as a conversion never cut short
    whole = trial_copy.home / "whole" / TAG
    universal.convert(tag_dir, whole, key, workers=(1, 1))
    resumed, uncut = _files(out), _files(whole)
    assert resumed.keys() == uncut.keys()
    assert [
        name for name in uncut if name != universal.CONVERTED and resumed[name] != uncut[name]
    ] == []

    finished = (out / universal.CONVERTED).stat().st_mtime_ns
    assert checkpoint.prepare_resume(ckpt, world_size=2).endswith("already")
    assert (out / universal.CONVERTED).stat().st_mtime_ns == finished  # kept, not redone


@pytest.mark.slow
def test_a_checkpoint_that_fails_its_checks_is_recorded_and_the_older_one_converted(trial_copy):
    ckpt = trial_copy.ckpt
    bad = ckpt / TAG / "mp_rank_00_model_states.pt"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))

    done = checkpoint.prepare_resume(ckpt, world_size=2)

    assert done.startswith("step00000006: converted for 2 rank(s)")
    key = universal.source_key(ckpt / TAG / checkpoint.MARKER)
    assert str(bad) in universal.failure(universal.conversion_dir(ckpt, TAG), key)
    assert not universal.conversion_dir(ckpt, TAG).exists()
    # every other rank finds both verdicts without checking or converting again
    assert checkpoint.prepare_resume(ckpt, world_size=2).startswith("step00000006: converted")


# A filesystem without working locks, in every process it is put in (through PYTHONPATH):
# flock and lockf fail as on Lustre mounted noflock, NFS without lockd or BeeGFS refusing.
NO_FILE_LOCKS = """
import errno, fcntl, os

def _no_locks(*args, **kwargs):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

fcntl.flock = fcntl.lockf = _no_locks
"""
RACER = """
import json, sys, time
from pathlib import Path
from scalelab.jobs.training import checkpoint
ckpt, ready, go = map(Path, sys.argv[1:4])
ready.touch()
while not go.exists():
    time.sleep(0.005)
done = checkpoint.prepare_resume(ckpt, world_size=2)
print(json.dumps({"done": done, "ended": time.time()}))
"""


@pytest.mark.slow
def test_two_nodes_without_file_locks_convert_once(trial_copy, tmp_path):
    """Two ranks resuming on a filesystem whose flock fails with ENOLCK (before: both died
    on it; with node-local locks both would convert into the same folder at once): one
    converts, the other waits for it and finds the conversion done."""
    import json
    import os

    faults = tmp_path / "no_file_locks"
    faults.mkdir()
    (faults / "sitecustomize.py").write_text(NO_FILE_LOCKS)
    path = os.pathsep.join(p for p in (str(faults), os.environ.get("PYTHONPATH")) if p)
    ckpt, go = trial_copy.ckpt, tmp_path / "go"
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(ckpt), str(tmp_path / f"ready{i}"),
                          str(go)], env=os.environ | {"PYTHONPATH": path},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    try:
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert all(r.poll() is None for r in racers), [r.communicate() for r in racers]
            time.sleep(0.01)
        started = time.time()
        go.touch()
        outputs = [r.communicate(timeout=300) for r in racers]
    finally:
        for r in racers:
            r.kill()
    assert [r.returncode for r in racers] == [0, 0], [err[-3000:] for _, err in outputs]
    results = sorted((json.loads(out.splitlines()[-1]) for out, _ in outputs),
                     key=lambda r: r["done"].endswith("already"))  # fmt: skip
    converter, waiter = (r["done"] for r in results)
    assert converter.startswith(f"{TAG}: converted for 2 rank(s) in"), converter
    assert waiter == f"{TAG}: converted for 2 rank(s) already", waiter
    out = universal.conversion_dir(ckpt, TAG)
    assert universal.converted(out, universal.source_key(ckpt / TAG / checkpoint.MARKER))
    finished = (out / universal.CONVERTED).stat().st_mtime
    assert started < finished <= results[1]["ended"]  # the waiter waited for the conversion
    assert "file locks do not hold across nodes here" in "".join(err for _, err in outputs)
    assert not list(ckpt.rglob("*.held")) and not list(out.parent.glob("*.partial*/"))
