"""`scalelab generate`: sample from a finished trial's checkpoint (KV-cache decoding)."""

from __future__ import annotations

import typer

from scalelab.cli.console import fail

DEFAULT_NEW_TOKENS = 64


def generate(
    target: str = typer.Argument(
        ...,
        metavar="TRIAL_OR_CHECKPOINT",
        help="A trial's run name (as `status` shows it), its id (or a unique prefix) under "
        "$SCALELAB_HOME/trials, a trial folder (its newest complete checkpoint is used), or "
        "one checkpoint folder trials/<id>/ckpt/step<N>.",
    ),
    sweep: str = typer.Option(
        None, "--sweep", help="The sweep of the run name, where two sweeps have one so named."
    ),
    prompt: str = typer.Option(
        ..., "--prompt", "-p", help="Text to continue, encoded with the trial's tokenizer."
    ),
    max_new_tokens: int = typer.Option(
        None,
        "--max-new-tokens",
        min=1,
        help="Tokens to sample. Default: 64, or fewer where the context ends sooner.",
    ),
    temperature: float = typer.Option(
        1.0, min=0.0, help="Softmax temperature; 0 takes the most likely token (greedy)."
    ),
    top_k: int = typer.Option(None, "--top-k", min=1, help="Sample among the k most likely."),
    seed: int = typer.Option(0, min=0, help="Seed of the sampling (same seed, same text)."),
    num_samples: int = typer.Option(
        1, "--num-samples", "-n", min=1, help="Continuations of the prompt, decoded as a batch."
    ),
    device: str = typer.Option("auto", help="cpu, cuda, or auto (cuda when present)."),
) -> None:
    """Sample continuations of --prompt from a trained trial.

    Loads the checkpoint's consolidated weights (any ZeRO stage, any rank count) after
    checking its files against their recorded checksums; every file loads weights-only, so
    nothing in a trial folder can run code. Decodes with the KV cache of models/decode.py
    (prefill once, then one cached step per token; docs/inference.md). Prints each sample
    (prompt and continuation, cut at the end-of-text token if the tokenizer has one),
    separated by a line '---'. A bad trial, checkpoint or prompt exits 2 with one line."""
    import torch

    from scalelab.jobs.data.tokenizers import load_tokenizer
    from scalelab.jobs.training.trained_model import TrialError, load_model
    from scalelab.models.generate import SamplingConfig
    from scalelab.models.generate import generate as sample
    from scalelab.orchestrator.door import located_trial

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device not in ("cpu", "cuda"):
        raise fail(f"--device: expected cpu, cuda or auto, got {device!r}")
    elif device == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda: no CUDA device is visible")
    try:
        located = located_trial(target, sweep)
        job = located.job
        if job.model.task != "lm":
            raise TrialError(f"trial {job.trial_id} trains a classifier; generate needs an LM")
        tokenizer = load_tokenizer(job.data.tokenizer, job.data.tokenizer_file)
        ids, max_new_tokens = _prompt_ids(
            tokenizer.encode_batch([prompt])[0], prompt, job.model, max_new_tokens
        )
        model = load_model(located, device)
    except ValueError as e:  # TrialError, and the tokenizer's own one-line errors
        raise fail(str(e)) from None
    cfg = SamplingConfig(
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed
    )
    batch = torch.tensor([ids] * num_samples, device=device)
    out = sample(model, batch, cfg).tolist()
    texts = []
    for row in out:
        new = row[len(ids) :]
        if tokenizer.eot is not None and tokenizer.eot in new:
            new = new[: new.index(tokenizer.eot)]
        texts.append(tokenizer.decode(ids + new))
    print("\n---\n".join(texts))


def _prompt_ids(
    ids: list[int], prompt: str, model: object, max_new_tokens: int | None
) -> tuple[list[int], int]:
    """The prompt's token ids and the tokens to sample, or a one-line error saying what
    does not fit."""
    if not ids:
        raise ValueError(f"--prompt {prompt!r} encodes to no tokens: give text to continue")
    outside = [i for i in ids if i >= model.vocab_size]
    if outside:
        raise ValueError(
            f"--prompt encodes to token id {outside[0]}, outside the model's vocabulary "
            f"(vocab_size {model.vocab_size})"
        )
    # the last sampled token is never fed back: the context holds prompt + n - 1 tokens
    if max_new_tokens is None:
        max_new_tokens = max(1, min(DEFAULT_NEW_TOKENS, model.block_size + 1 - len(ids)))
    if len(ids) + max_new_tokens - 1 > model.block_size:
        raise ValueError(
            f"--prompt is {len(ids)} tokens: with {max_new_tokens} new token(s) it does not "
            f"fit the model's context block_size {model.block_size} (at most "
            f"{max(model.block_size + 1 - max_new_tokens, 0)} prompt tokens for "
            f"{max_new_tokens} new token(s))"
        )
    return ids, max_new_tokens


def register(app: typer.Typer) -> None:
    app.command()(generate)
