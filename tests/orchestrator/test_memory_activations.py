"""The planner's activation bytes per token and layer (orchestrator/plan/memory.py) against what
autograd really keeps: every tensor a forward pass saves for backward, seen through
`torch.autograd.graph.saved_tensors_hooks`, counted once per storage, parameters left out.

Per layer = the difference between an L+2-layer and an L-layer model of the same width,
divided by 2 layers and the tokens; what is left at L layers is the embedding and LM head.
"""

import pytest
import torch
from saved_tensors import saved_bytes
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalelab.models.config import ModelConfig
from scalelab.orchestrator.plan.memory import activation_model

B, T = 2, 64


def _measured(model: dict, checkpointing: bool = False, dtype=torch.float32):
    """Saved bytes per token of the 2- and the 4-layer model, and the two configs."""
    cfgs = [ModelConfig(size="micro", n_layer=n, vocab_size=256, block_size=T, **model)
            for n in (2, 4)]  # fmt: skip
    return [saved_bytes(c, B, checkpointing, dtype) / (B * T) for c in cfgs], cfgs


def _assert_estimate_matches_saved_tensors(
    model: dict, checkpointing: bool, attention: str, dtype=torch.float32
) -> float:
    """Per token-layer and whole-model saved bytes within 10% of the estimate; returns the
    measured bytes per token and layer."""
    (two, four), cfgs = _measured(model, checkpointing, dtype)
    act_bytes = torch.finfo(dtype).bits // 8
    est = [activation_model(c, T, act_bytes, checkpointing, attention, "cpu") for c in cfgs]
    per_layer = (four - two) / 2  # both added blocks are routed when TSA is on
    assert per_layer == pytest.approx(est[1].layer + est[1].gated, rel=0.10)
    assert two == pytest.approx(est[0].saved_per_token(), rel=0.10)
    assert four == pytest.approx(est[1].saved_per_token(), rel=0.10)
    return per_layer


CASES = [
    ({}, False),
    ({}, True),
    ({"attn_out": "hadamard"}, False),
    ({"budget": {}}, False),
    ({"budget": {}, "n_head": 8}, False),
    ({"budget": {}}, True),
    ({"tsa": {}}, False),
    ({"tsa": {}}, True),
    ({"attn_out": "hadamard", "budget": {}, "tsa": {}}, False),
]


@pytest.mark.parametrize(("model", "checkpointing"), CASES)
def test_activation_bytes_per_token_layer_match_saved_tensors(model, checkpointing):
    _assert_estimate_matches_saved_tensors(model, checkpointing, "flash")


def test_math_attention_keeps_the_softmax_and_dropout_masks():
    with sdpa_kernel(SDPBackend.MATH):
        plain = _assert_estimate_matches_saved_tensors({}, False, "math")
        _assert_estimate_matches_saved_tensors({"dropout": 0.1}, False, "math")
    assert plain > 1.1 * _assert_estimate_matches_saved_tensors(
        {}, False, "flash"
    )  # the T x T scores cost at this size


def test_bf16_halves_the_activations_but_not_the_fp32_statistics():
    assert _assert_estimate_matches_saved_tensors(
        {}, False, "flash", torch.bfloat16
    ) < 0.55 * _assert_estimate_matches_saved_tensors({}, False, "flash")


@pytest.mark.parametrize(
    "sites",
    [("attention_out",), ("ffn_hidden",), ("ffn_out",), ("embedding",), ("attention_probs",)],
)
def test_dropout_masks_are_counted_where_model_dropout_sites_put_them(sites):
    """Each site's masks, alone: what dropout adds per token (layer and whole model) over
    the same model without it, against what the planner adds (before: 2h per layer for
    any sites, the FFN hidden layer's 4h mask counted as 2h)."""
    (two, four), cfgs = _measured({"dropout": 0.1, "dropout_sites": sites})
    (two_0, four_0), cfgs_0 = _measured({})
    est = [activation_model(c, T, 4, False, "flash", "cpu") for c in (*cfgs, *cfgs_0)]
    per_layer = ((four - two) - (four_0 - two_0)) / 2
    assert per_layer == pytest.approx(est[1].layer - est[3].layer, abs=1)
    assert two - two_0 == pytest.approx(est[0].saved_per_token() - est[2].saved_per_token(), abs=1)
