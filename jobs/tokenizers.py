"""Tokenizers by name: byte-level (vocab 256), GPT-2 BPE via tiktoken (or a local
.tiktoken file), or any Hugging Face `tokenizers` JSON file."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# GPT-2's pre-tokeniser split (tiktoken's r50k_base / gpt2 pat_str).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"


@dataclass(frozen=True)
class Tokenizer:
    name: str  # what the config said
    fingerprint: str  # identifies the vocabulary (part of the shard key)
    vocab_size: int
    eot: int | None  # document separator token, if the vocabulary has one
    encode_batch: Callable[[list[str]], list[list[int]]]


def load_tokenizer(spec: str) -> Tokenizer:
    """'byte', 'gpt2', a path to a .tiktoken file, or a path to a tokenizers JSON file."""
    if spec == "byte":
        return Tokenizer(
            "byte", "byte", 256, None, lambda texts: [list(t.encode("utf-8")) for t in texts]
        )
    if spec == "gpt2":
        return _tiktoken_gpt2()
    path = Path(spec).expanduser()
    if path.suffix == ".tiktoken":
        return _tiktoken_file(path)
    if path.suffix == ".json":
        return _tokenizers_json(path)
    raise ValueError(
        f"unknown tokenizer {spec!r}; allowed: 'byte', 'gpt2', a path to a .tiktoken file, "
        "or a path to a tokenizers .json file"
    )


def _tiktoken_gpt2() -> Tokenizer:
    import tiktoken

    try:
        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests' ConnectionError when offline, or a corrupt cache
        raise ValueError(
            "tokenizer 'gpt2' could not be loaded: tiktoken downloads its encoding files on "
            f"first use and that failed ({type(e).__name__}). This machine looks offline. "
            "Either copy tiktoken's cache (TIKTOKEN_CACHE_DIR) from a connected machine, or "
            "give the tokenizer as a path to a local .tiktoken file (e.g. r50k_base.tiktoken)"
        ) from None
    return Tokenizer(
        "gpt2",
        "tiktoken:gpt2",
        enc.n_vocab,
        enc.eot_token,
        lambda texts: enc.encode_ordinary_batch(texts, num_threads=1),
    )


def _tiktoken_file(path: Path) -> Tokenizer:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    if not path.is_file():
        raise ValueError(f"tokenizer file {path} does not exist")
    ranks = load_tiktoken_bpe(str(path))
    eot = max(ranks.values()) + 1
    enc = tiktoken.Encoding(
        name=path.stem, pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: eot}
    )
    return Tokenizer(
        str(path),
        "tiktoken-file:" + _sha(path),
        enc.n_vocab,
        eot,
        lambda texts: enc.encode_ordinary_batch(texts, num_threads=1),
    )


def _tokenizers_json(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    if not path.is_file():
        raise ValueError(f"tokenizer file {path} does not exist")
    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as e:
        raise ValueError(f"{path} is not a tokenizers JSON file: {e}") from None
    eot = next(
        (i for t in (ENDOFTEXT, "</s>", "<eos>") if (i := tok.token_to_id(t)) is not None), None
    )
    return Tokenizer(
        str(path),
        "tokenizers:" + _sha(path),
        tok.get_vocab_size(),
        eot,
        lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)],
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
