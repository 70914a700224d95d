"""The lm-eval adapter (jobs/downstream/adapter.py) scores a (context, continuation) pair as
the sum of the model's own token log-probs from one full forward, for every variant, by its
cached and its uncached path; greedy generation is the project's greedy decoding."""

import pytest
import torch
from varied_models import varied_model

from scalelab.jobs.data.tokenizers import load_tokenizer
from scalelab.jobs.downstream.adapter import TrialLM
from scalelab.models import catalog
from scalelab.models.generate import SamplingConfig, generate

VOCAB = 64


def requests(seed: int = 1) -> list:
    """Two contexts with three continuations each (1-4 tokens), a pair longer than the
    model's context (truncated on the left), and a continuation longer than it (chunks)."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    out = [(None, ctx, ids(n)) for ctx in (ids(9), ids(4)) for n in (1, 3, 4)]
    return out + [(None, ids(30), ids(5)), (None, ids(3), ids(40))]


def reference(model: torch.nn.Module, ctx: list[int], cont: list[int]) -> float:
    """Sum of the continuation's token log-probs from one full forward over its window (a
    continuation longer than the context: one forward per block_size tokens of it)."""
    full, B, total = ctx + cont, model.cfg.block_size, 0.0
    for start in range(len(ctx), len(full), B):
        end = min(start + B, len(full))
        with torch.no_grad():
            logits = model(torch.tensor([full[max(0, end - 1 - B) : end - 1]])).logits
        logp = torch.log_softmax(logits[0, start - end :].float(), dim=-1)
        total += float(logp.gather(1, torch.tensor(full[start:end])[:, None]).sum())
    return total


@pytest.mark.parametrize("variant", catalog.variants())
def test_loglikelihood_is_the_sum_of_the_forwards_token_log_probs(variant):
    model = varied_model(variant, vocab=VOCAB)
    reqs = requests()
    want = [reference(model, ctx, cont) for _, ctx, cont in reqs]
    byte = load_tokenizer("byte")
    cached = TrialLM(model, byte, cache=True, batch_size=2)._loglikelihood_tokens(
        reqs, disable_tqdm=True
    )
    uncached = TrialLM(model, byte, cache=False, batch_size=3)._loglikelihood_tokens(
        reqs, disable_tqdm=True
    )
    for scores in (cached, uncached):
        torch.testing.assert_close([s for s, _ in scores], want, rtol=1e-4, atol=1e-4)
    assert [g for _, g in cached] == [g for _, g in uncached]


def test_what_ran_is_reported_per_mode():
    model = varied_model("budget+tsa", vocab=VOCAB)
    inference = TrialLM(model, load_tokenizer("byte"))
    inference._loglikelihood_tokens(requests(), disable_tqdm=True)
    ran = inference.executed.summary()
    assert ran["mode"] == "inference" and 0.0 < ran["tsa_alpha"] < 1.0
    assert 1.0 <= ran["budget_heads"] <= model.cfg.n_head
    soft = TrialLM(model, load_tokenizer("byte"), mode="soft")
    assert model.depth.sparse_inference is False
    scores = soft._loglikelihood_tokens(requests(), disable_tqdm=True)
    assert soft.executed.summary()["mode"] == "soft"
    assert all(torch.isfinite(torch.tensor(s)) for s, _ in scores)
    with pytest.raises(ValueError, match="inference path"):
        TrialLM(model, load_tokenizer("byte"), mode="soft", cache=True)


class _Request:
    def __init__(self, *args):
        self.args = args


@pytest.mark.parametrize("variant", ["dense", "budget+tsa"])
def test_generate_until_is_greedy_decoding_cut_at_the_stop_string(variant):
    model = varied_model(variant, seed=2, vocab=256)
    lm = TrialLM(model, load_tokenizer("byte"))
    prompt = "The zen of "
    ids = torch.tensor([list(prompt.encode())])
    greedy = generate(model, ids, SamplingConfig(max_new_tokens=8, temperature=0.0))
    want = bytes(greedy[0, ids.size(1) :].tolist()).decode("utf-8", errors="replace")
    (text,) = lm.generate_until([_Request(prompt, {"until": [], "max_gen_toks": 8})], True)
    assert text == want
    stop = want[3]
    (cut,) = lm.generate_until([_Request(prompt, {"until": [stop], "max_gen_toks": 8})], True)
    assert cut == want.split(stop)[0]
