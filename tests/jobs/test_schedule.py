"""The wsd learning-rate schedule (jobs/schedule.py) and the prefix-stable data order a wsd
trial reads (jobs/data/reader.py): values at known steps, validation, stable ids."""

import math

import numpy as np
import pytest
from pydantic import ValidationError

from scalelab.jobs.checks import check_budget
from scalelab.jobs.config import JobCheckError, TrainConfig
from scalelab.jobs.data.reader import PREFIX_BLOCK, prefix_stable_extent, prefix_stable_order
from scalelab.jobs.schedule import cooldown_start, lr_at


def _wsd(**kw) -> TrainConfig:
    return TrainConfig(tokens=1, lr=1.0, min_lr_ratio=0.1, schedule="wsd", **kw)


def test_wsd_warms_up_holds_then_cools_down_in_its_shape():
    t = _wsd(warmup_steps=2)  # 20 steps: cooldown 0.2 x 20 = 4 steps from step 16
    assert cooldown_start(20, t) == 16
    lrs = [lr_at(s, 20, t) for s in range(20)]
    assert lrs[:2] == [0.5, 1.0] and lrs[2:16] == [1.0] * 14
    # 1-sqrt: 0.1 + 0.9 (1 - sqrt(k / 4)) for k = 1..4, ending at min_lr exactly
    expected = [0.1 + 0.9 * (1 - math.sqrt(k / 4)) for k in (1, 2, 3, 4)]
    assert lrs[16:] == pytest.approx(expected) and lrs[-1] == pytest.approx(0.1)
    linear = [lr_at(s, 20, _wsd(warmup_steps=2, cooldown_shape="linear")) for s in range(16, 20)]
    assert linear == pytest.approx([0.775, 0.55, 0.325, 0.1])
    # before its cooldown the rate does not depend on the trial's length
    longer = _wsd(warmup_steps=2, cooldown_fraction=0.5)
    assert [lr_at(s, 40, longer) for s in range(16)] == lrs[:16]
    assert cooldown_start(40, longer) == 20


def test_wsd_fields_are_checked_and_leave_other_ids_alone(tiny_job):
    with pytest.raises(ValidationError, match="schedule='wsd'"):
        TrainConfig(tokens=1, cooldown_fraction=0.3)  # a cosine trial has no cooldown
    with pytest.raises(ValidationError):
        _wsd(cooldown_shape="sqrt")
    with pytest.raises(ValidationError):
        _wsd(cooldown_fraction=0.0)
    job = tiny_job(train__schedule="wsd", train__warmup_steps=7)  # 8 steps, cooldown from 6
    with pytest.raises(JobCheckError, match="runs into the cooldown") as e:
        check_budget(job)
    assert e.value.keys[0] == "train.warmup_steps"
    cosine = tiny_job()
    assert "cooldown_fraction" not in cosine.identity_tree()["train"]
    assert tiny_job(train__branch=False).trial_id == cosine.trial_id
    wsd = tiny_job(train__schedule="wsd")
    assert wsd.identity_tree()["train"]["schedule"] == "wsd"
    assert tiny_job(train__schedule="wsd", train__cooldown_shape="linear").trial_id != wsd.trial_id


def test_the_prefix_stable_order_is_a_permutation_whatever_the_budget():
    assert prefix_stable_extent(1) == PREFIX_BLOCK
    assert prefix_stable_extent(PREFIX_BLOCK + 1) == 2 * PREFIX_BLOCK
    assert prefix_stable_extent(3 * PREFIX_BLOCK) == 4 * PREFIX_BLOCK
    n = 4 * PREFIX_BLOCK
    order = prefix_stable_order(np.arange(n), n, seed=5)
    assert sorted(order) == list(range(n))  # each window once
    assert sorted(order[:PREFIX_BLOCK]) == list(range(PREFIX_BLOCK))  # blocks stay blocks
    # a smaller trial (fewer windows to read) reads the same prefix
    assert (prefix_stable_order(np.arange(100), 2 * PREFIX_BLOCK, 5) == order[:100]).all()
