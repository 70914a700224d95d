"""A trained trial as an lm-evaluation-harness model (`TemplateLM`, registered as `scalelab`).

Log-likelihoods run one of two ways, both the eval-mode forward's function
(tests/jobs/downstream/test_adapter.py checks them against a plain forward, every variant):

- cached: requests are grouped by their context; a context is prefilled once into the KV
  cache of models/decode.py, the cache is copied to every continuation of the group (a
  multiple-choice question's choices) and the continuations run as one batch, right-padded;
- uncached: `GPT.forward` over context + continuation, `batch_size` sequences at a time,
  right-padded (causal: a padded position is never read by a real one). Soft mode always
  runs this way (models/decode.py has BudgetFormer's hard path only).

`cache=None` (the default) chooses per context (`_score`), True and False force one way.

`generate_until` is greedy with the KV cache (prefill, then one cached step per token),
stopping at an `until` string or the end-of-text token. A pair longer than the model's
context keeps its last `block_size` tokens, as lm-eval's own HF model does; a continuation
longer than the context is scored in chunks of `block_size` tokens (`_windows`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import Tensor, nn
from tqdm import tqdm

from scalelab.jobs.data.tokenizers import Tokenizer
from scalelab.jobs.downstream.executed import Executed, Mode, set_mode
from scalelab.models.context import ForwardContext
from scalelab.models.decode import KVCache, forward_cached

Request = tuple[tuple[str, str] | None, list[int], list[int]]
Item = tuple[list[int], list[int]]  # (model input, continuation)
DEFAULT_MAX_GEN = 32
CACHE_MIN_SAVED = 256  # tokens of forward a shared context must save to run cached


@register_model("scalelab")
class TrialLM(TemplateLM):
    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        *,
        mode: Mode = "inference",
        cache: bool | None = None,
        batch_size: int = 16,
    ) -> None:
        super().__init__()
        self.model = model
        self.tok = tokenizer
        set_mode(model, mode)
        self.mode = mode
        self.cache = cache  # None: per context, where sharing it saves enough (_score)
        if self.cache and mode != "inference":
            raise ValueError("the KV cache computes the inference path: use mode='inference'")
        self.batch_size = batch_size
        self.block_size = model.cfg.block_size
        self._device = model.wte.weight.device
        self.executed = Executed.attach(model, mode)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """`lm_eval --model scalelab --model_args trial=ID[,mode=soft][,cache=false]`."""
        from lm_eval.utils import simple_parse_args_string

        from scalelab.jobs.data.tokenizers import load_tokenizer
        from scalelab.jobs.training.trained_model import load_model, locate

        args = simple_parse_args_string(arg_string)
        located = locate(str(args.pop("trial")))
        device = args.pop("device", None) or (additional_config or {}).get("device") or "cpu"
        job = located.job
        tokenizer = load_tokenizer(job.data.tokenizer, job.data.tokenizer_file)
        return cls(load_model(located, device), tokenizer, **args)

    # --- tokens ----------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tok.eot if self.tok.eot is not None else self.tok.separator[-1]

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs
    ) -> list[int]:
        return self.tok.encode_batch([string])[0]

    def tok_decode(self, tokens: Iterable[int], **kwargs) -> str:
        return self.tok.decode(list(tokens))

    # --- log-likelihoods -------------------------------------------------------------
    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        windows = [
            (r, w) for r, (_, ctx, cont) in enumerate(requests) for w in self._windows(ctx, cont)
        ]
        bar = tqdm(total=len(windows), disable=disable_tqdm, desc="log-likelihoods")
        logp = [0.0] * len(requests)
        greedy = [True] * len(requests)
        with torch.no_grad():
            for index, (score, is_greedy) in self._score([w for _, w in windows]):
                r = windows[index][0]
                logp[r] += score
                greedy[r] = greedy[r] and is_greedy
                bar.update(1)
        bar.close()
        return list(zip(logp, greedy, strict=True))

    def _windows(self, ctx: list[int], cont: list[int]) -> list[Item]:
        """(model input, scored tokens) covering the continuation: one window when context
        + continuation fit (the input is their last block_size tokens before the last one);
        a continuation longer than block_size in chunks, each token conditioned on the
        block_size tokens before it at most (as lm-eval's rolling windows)."""
        if not cont:
            raise ValueError("lm-eval asked for the log-likelihood of an empty continuation")
        if not ctx:
            raise ValueError("lm-eval gave an empty context (it passes the prefix token)")
        full, out = ctx + cont, []
        for start in range(len(ctx), len(full), self.block_size):
            end = min(start + self.block_size, len(full))
            out.append((full[max(0, end - 1 - self.block_size) : end - 1], full[start:end]))
        return out

    def _score(self, inputs: list[Item]) -> Iterator[tuple[int, tuple[float, bool]]]:
        """Contexts shared by several continuations run cached (cache=True, or by default
        where the shared context saves CACHE_MIN_SAVED tokens of forward), the rest as
        batched full forwards: on a small model a forward's cost is mostly per call, and
        the cached path makes two calls per context (docs/benchmarks.md, lm-eval)."""
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (seq, cont) in enumerate(inputs):
            groups[tuple(seq[: len(seq) - len(cont) + 1])].append(i)
        full: list[int] = []
        for prefix, members in groups.items():
            saved = (len(members) - 1) * len(prefix)
            if self.cache is False or self.mode != "inference":
                full += members
            elif self.cache or saved >= CACHE_MIN_SAVED:
                for start in range(0, len(members), self.batch_size):
                    chunk = members[start : start + self.batch_size]
                    yield from self._score_group(list(prefix), chunk, inputs)
            else:
                full += members
        yield from self._score_full(inputs, full)

    def _score_full(
        self, inputs: list[Item], which: list[int]
    ) -> Iterator[tuple[int, tuple[float, bool]]]:
        order = sorted(which, key=lambda i: -len(inputs[i][0]))  # like lengths together
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            seqs = [inputs[i][0] for i in batch]
            idx, mask = self._padded(seqs)
            self.executed.mask = mask
            hidden = self._hidden(idx)
            spans = [
                (len(seqs[row]) - len(inputs[i][1]), len(seqs[row])) for row, i in enumerate(batch)
            ]
            # one readout for the batch's scored positions: it reads the d x vocab weight once
            logits = self.model.readout(
                torch.cat([hidden[r, a:b] for r, (a, b) in enumerate(spans)])
            )
            logp, best = _log_probs(logits)
            offset = 0
            for i, (a, b) in zip(batch, spans, strict=True):
                rows = slice(offset, offset + b - a)
                yield i, self._continuation_score(logp[rows], best[rows], inputs[i][1])
                offset += b - a

    def _hidden(self, idx: Tensor) -> Tensor:
        """`GPT.forward`'s final hidden states (B, T, d), before the readout: the readout
        (a d x vocab matmul per position) runs at the scored positions only."""
        ctx = ForwardContext(progress=1.0)
        ctx.readout = self.model.readout
        return self.model.depth(self.model.embed(idx), self.model.blocks, ctx)

    def _score_group(
        self, prefix: list[int], members: list[int], inputs: list[Item]
    ) -> Iterator[tuple[int, tuple[float, bool]]]:
        """One context prefilled once; its continuations as one batch on copies of the cache."""
        rests = [inputs[i][0][len(prefix) :] for i in members]
        longest = max(map(len, rests))
        cache = KVCache.allocate(self.model, 1, len(prefix) + longest)
        self.executed.mask = None
        first = forward_cached(self.model, self._tensor([prefix]), cache, logits="last")
        logits = first.expand(len(members), -1).unsqueeze(1)  # (G, 1, V): predicts cont[0]
        if longest:
            idx, mask = self._padded(rests)
            self.executed.mask = mask
            rest = forward_cached(self.model, idx, _repeat(cache, len(members)))
            logits = torch.cat([logits, rest], dim=1)
        logp, best = _log_probs(logits)
        for row, i in enumerate(members):
            cont = inputs[i][1]
            n = len(cont)
            yield i, self._continuation_score(logp[row, :n], best[row, :n], cont)

    def _continuation_score(
        self, logp: Tensor, best: Tensor, cont: list[int]
    ) -> tuple[float, bool]:
        """(sum of the continuation's token log-probs, whether each token is the argmax)."""
        target = self._tensor([cont])[0]
        picked = logp.gather(1, target[:, None]).squeeze(1)
        return float(picked.sum()), bool((best == target).all())

    def _padded(self, seqs: list[list[int]]) -> tuple[Tensor, Tensor]:
        """Right-padded ids (B, T) and the mask of the real tokens."""
        width = max(map(len, seqs))
        idx = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.bool)
        for row, s in enumerate(seqs):
            idx[row, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[row, : len(s)] = True
        return idx.to(self._device), mask.to(self._device)

    def _tensor(self, rows: list[list[int]]) -> Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self._device)

    # --- rolling log-likelihood (perplexity tasks) ------------------------------------
    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """A document's log-likelihood: disjoint windows of block_size tokens, each
        conditioned on the tokens before it within its window (lm-eval's own windows)."""
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="rolling log-likelihoods"):
            (text,) = req.args
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    self.tok_encode(text), self.prefix_token_id, self.block_size, 1
                )
            ]
            scored = self._loglikelihood_tokens(
                [(None, ctx, cont) for ctx, cont in windows], disable_tqdm=True
            )
            out.append(sum(logp for logp, _ in scored))
        return out

    # --- generation ------------------------------------------------------------------
    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations with the KV cache, cut at the first `until` string."""
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="generate_until"):
            context, kwargs = req.args
            out.append(self._greedy(context, dict(kwargs or {})))
        return out

    def _greedy(self, context: str, kwargs: dict) -> str:
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        eot = self.tok.decode([self.tok.eot]) if self.tok.eot is not None else None
        if eot and eot not in until:
            until.append(eot)
        max_new = int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN))
        ids = self.tok_encode(context)[-self.block_size :] or [self.prefix_token_id]
        max_new = max(1, min(max_new, self.block_size + 1 - len(ids)))
        ids = ids[-(self.block_size + 1 - max_new) :]
        cache = KVCache.allocate(self.model, 1, len(ids) + max_new - 1)
        self.executed.mask = None
        new: list[int] = []
        with torch.no_grad():
            logits = forward_cached(self.model, self._tensor([ids]), cache, logits="last")
            for step in range(max_new):
                token = int(logits[0].argmax())
                new.append(token)
                text = self.tok.decode(new)
                if token == self.tok.eot or any(u in text for u in until):
                    break
                if step + 1 < max_new:
                    logits = forward_cached(self.model, self._tensor([[token]]), cache, "last")
        text = self.tok.decode(new)
        for u in until:
            text = text.split(u)[0]
        return text


def _log_probs(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Log-softmax over the vocabulary (fp32) and the argmax, for all rows in one call each."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp, logp.argmax(dim=-1)


def _repeat(cache: KVCache, n: int) -> KVCache:
    """A copy of a batch-1 cache for n sequences (each goes on from the same context)."""
    pool = None if cache.pool_sum is None else cache.pool_sum.repeat(1, n, 1)
    return KVCache(cache.k.repeat(1, n, 1, 1, 1), cache.v.repeat(1, n, 1, 1, 1), pool, cache.length)
