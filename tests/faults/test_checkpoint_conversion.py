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
