"""The KV cache holds the decode state each component declares (`Component.decode_state`,
models/decode.py): what a mechanism carries from one decode step to the next, found by
asking the model's components, not by the mechanism's name."""

from __future__ import annotations

import pytest
import torch
from made_mechanisms import mechanism
from rezero_mechanism import ReZero

from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.decode import KVCache
from scalelab.models.dense import AllBlocks, AllHeads
from scalelab.models.mechanism import registered

_Counting = mechanism(  # carries 3 numbers per sequence and layer between decode steps
    "counting_test", AllHeads, 911, decode_state=lambda self, model: 3
)
_Carrying = mechanism("carrying_test", AllBlocks, 912, decode_state=lambda self, model: 1)


def _cache(**mechanisms: dict) -> KVCache:
    cfg = ModelConfig(size="nano", vocab_size=64, block_size=16, **mechanisms)
    return KVCache.allocate(build(cfg).eval(), batch=2, capacity=8)


def test_the_cache_allocates_the_declared_decode_state():
    with registered(_Counting, ReZero):
        cfg = ModelConfig(size="nano")
        state = _cache(counting_test={}).pool_sum
        assert state.shape == (cfg.n_layer, 2, 3) and state.dtype == torch.float32
        assert not state.any()  # a running state starts at zero
        assert _cache().pool_sum is None
        assert _cache(rezero={}).pool_sum is None  # declares none
    assert _cache(budget={}).pool_sum.shape == (cfg.n_layer, 2, cfg.d_model)


def test_two_components_with_decode_state_are_refused():
    with registered(_Counting, _Carrying), pytest.raises(NotImplementedError, match="one"):
        _cache(counting_test={}, carrying_test={})
