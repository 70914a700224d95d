"""Prepared text read as windows, the global sample order, tokenizers (offline)."""

import base64
import inspect
import json
import shutil

import numpy as np
import pytest

from scalelab.jobs.config import DataConfig
from scalelab.jobs.data.reader import permute
from scalelab.jobs.data.tokenizers import load_tokenizer
from scalelab.jobs.data.trial import TrainStream, open_data, prepare, val_batches
from scalelab.models.config import ModelConfig

MODEL = ModelConfig(size="nano", vocab_size=256, block_size=64)


def _rows(batches) -> list[bytes]:
    return [bytes(row.astype(np.uint8)) for b in batches for row in b.x]


def test_windows_are_a_prefix_of_the_train_tokens_and_val_is_separate(home):
    cfg = DataConfig(seq_len=32, val_tokens=256)
    root = prepare(cfg, seed=0, model=MODEL)
    data = open_data(cfg, 0, root, MODEL, train_windows=100)
    assert data.n("train") == 100  # the trial's windows: the first 100, not all prepared
    train = np.concatenate([np.fromfile(root / s.file, "<u2") for s in data.meta.train])
    w = data.get("train", np.array([0, 7]))
    assert np.array_equal(w.x[1], train[7 * 32 : 8 * 32])  # window j starts at token j * L
    assert np.array_equal(w.y[1], train[7 * 32 + 1 : 8 * 32 + 1])
    val = np.fromfile(root / "val.bin", "<u2")
    assert np.array_equal(data.get("val", np.array([1])).x[0], val[32:64])
    text = bytes(w.x[0].astype(np.uint8)).decode("utf-8", "replace")
    assert len(text) == 32
    everything = open_data(cfg.model_copy(update={"val_tokens": 10**6}), 0, root, MODEL)
    assert everything.n("val") == (len(val) - 1) // 32  # a small source: all its validation


def test_validation_set_is_the_same_for_every_seed_and_grows_only_by_appending(home):
    cfg = DataConfig(seq_len=16, val_tokens=160)
    a = open_data(cfg, 0, prepare(cfg, 0, MODEL), MODEL)
    b = open_data(cfg, 5, prepare(cfg, 5, MODEL), MODEL)
    assert _rows(val_batches(a, 160, 16, 4, 0, 1)) == _rows(val_batches(b, 160, 16, 4, 0, 1))
    two = [val_batches(a, 160, 16, 4, rank=r, world=2) for r in (0, 1)]
    assert sum(len(bt.x) for bs in two for bt in bs) == 10


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_permute_is_a_bijection_keyed_by_seed_and_epoch(n):
    idx = np.arange(n)
    orders = {(s, e): permute(idx, n, s, e) for s in (0, 1) for e in (0, 1)}
    for order in orders.values():
        assert np.array_equal(np.sort(order), idx)
    if n >= 64:  # different keys, different orders; and not the identity
        assert len({o.tobytes() for o in orders.values()}) == 4
        assert (orders[0, 0] != idx).mean() > 0.9


def test_sample_order_does_not_depend_on_the_number_of_ranks(home):
    """The union of what 2 ranks read over N steps equals what 1 rank reads; a run of 2
    ranks resumed on 1 rank continues the same sequence; each epoch visits every window."""
    cfg = DataConfig(seq_len=16)
    n_windows, steps = 40, 12  # 12 steps of 8 sequences: 2.4 epochs
    data = open_data(cfg, 0, prepare(cfg, 0, MODEL, n_windows), MODEL, n_windows)
    one = TrainStream(data, 3, micro_batch=8, accum=1, rank=0, world=1)
    two = [TrainStream(data, 3, micro_batch=2, accum=2, rank=r, world=2) for r in (0, 1)]
    by_step_one = [sorted(_rows(one.micro_batches(s))) for s in range(steps)]
    by_step_two = [sorted(_rows(two[0].micro_batches(s)) + _rows(two[1].micro_batches(s)))
                   for s in range(steps)]  # fmt: skip
    assert by_step_one == by_step_two
    resumed = by_step_two[:5] + [sorted(_rows(TrainStream(data, 3, 8, 1, 0, 1).micro_batches(s)))
                                 for s in range(5, steps)]  # fmt: skip
    assert resumed == by_step_one
    first_epoch = one.windows(np.arange(n_windows))
    assert sorted(first_epoch) == list(range(n_windows))
    assert not np.array_equal(first_epoch, one.windows(np.arange(n_windows, 2 * n_windows)) - 0)


def test_two_seeds_and_seq_lens_read_one_preparation(home):
    """Trials with other seeds and seq_len reuse the shards: nothing is tokenised again."""
    root = prepare(DataConfig(seq_len=32), 0, MODEL)
    stamps = {p.name: p.stat().st_mtime_ns for p in root.iterdir()}
    for seq_len, seed in ((64, 1), (16, 2)):
        assert prepare(DataConfig(seq_len=seq_len), seed, MODEL) == root
    assert {p.name: p.stat().st_mtime_ns for p in root.iterdir()} == stamps


def test_local_jsonl_source(home, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(
        "".join(json.dumps({"body": f"document number {i} "}) + "\n" for i in range(200))
    )
    cfg = DataConfig(source=str(path), text_field="body", seq_len=16, val_tokens=16)
    data = open_data(cfg, 0, prepare(cfg, 0, MODEL), MODEL)
    assert data.n("train") > 0
    text = bytes(data.get("val", np.arange(3)).x.ravel().astype(np.uint8)).decode()
    assert text.startswith("document number 0 \n\ndocument number 20 ")  # every 20th document
    with pytest.raises(ValueError, match="'text' is not a column .*columns: \\['body'\\]"):
        prepare(DataConfig(source=str(path), seq_len=16), 0, MODEL)


def test_gpt2_loads_offline_from_the_installed_vocabulary(tmp_path, monkeypatch):
    # an empty tiktoken cache and an unroutable proxy: nothing may be downloaded
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    tok = load_tokenizer("gpt2")
    assert (tok.vocab_size, tok.eot, tok.fingerprint) == (50257, 50256, "tiktoken:gpt2")
    assert tok.encode_batch(["Hello world"]) == [[15496, 995]]
    assert list(tok.encode_arrays(["Hello world<|endoftext|>"])[0][:2]) == [15496, 995]
    assert tok.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"  # scalelab generate


def test_gpt2_batch_arrays_equal_each_text_encoded_alone_and_survive_pickling():
    """encode_arrays encodes a batch in one call, joined by the end-of-text token; each
    text's ids must be those of encoding it alone, also for text that spells that token.
    Workers get the tokenizer pickled: it must encode the same there."""
    import pickle

    tok = load_tokenizer("gpt2")
    texts = ["Hello world", "", " a<|endoftext|>b", "x\n\n", "  ", "é 12 don't"]
    for batch in (texts, texts[3:], texts[:1]):
        alone = [list(tok.encode_arrays([t])[0]) for t in batch]
        assert [list(a) for a in tok.encode_arrays(batch)] == alone
        assert alone == tok.encode_batch(batch)
    copy = pickle.loads(pickle.dumps(tok))
    assert [list(a) for a in copy.encode_arrays(texts[3:])] == tok.encode_batch(texts[3:])


def test_gpt2_from_a_tokenizer_file_has_the_same_fingerprint(tmp_path):
    from scalelab.jobs.data.tokenizers import _installed_gpt2_folder

    folder = tmp_path / "gpt2"
    shutil.copytree(_installed_gpt2_folder(), folder)
    tok = load_tokenizer("gpt2", str(folder))
    assert tok.fingerprint == "tiktoken:gpt2" and tok.encode_batch(["Hi"]) == [[17250]]
    (folder / "vocab.bpe").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match="is not GPT-2's vocab.bpe"):
        load_tokenizer("gpt2", str(folder))
    with pytest.raises(ValueError, match="tokenizer_file is where the 'gpt2' vocabulary"):
        load_tokenizer("byte", str(folder))


def test_local_tiktoken_file(tmp_path):
    path = tmp_path / "bytes.tiktoken"
    path.write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    tok = load_tokenizer(str(path))
    assert tok.vocab_size == 257 and tok.eot == 256
    assert tok.encode_batch(["hi"]) == [[ord("h"), ord("i")]]
    assert tok.decode([ord("h"), ord("i")]) == "hi"
    byte = load_tokenizer("byte")
    assert byte.decode(byte.encode_batch(["né"])[0]) == "né" and byte.decode([0xC3]) == "\ufffd"


def test_synthetic_sort_task_is_deterministic(home):
    cfg = DataConfig(source="builtin:sort", seq_len=20)
    job_model = ModelConfig(size="nano", vocab_size=32, block_size=32)
    data = open_data(cfg, 7, prepare(cfg, 7, job_model), job_model)
    a, b = data.get("train", np.arange(4)), data.get("train", np.arange(4))
    assert np.array_equal(a.x, b.x)
    assert np.array_equal(np.sort(a.x[:, :10], axis=1), a.y[:, 10:])  # the answer is sorted
    assert (a.y[:, :10] == -100).all()
    stream = TrainStream(data, 7, micro_batch=4, accum=1, rank=0, world=1)
    assert np.array_equal(stream.micro_batches(0)[0].x, a.x)  # generated: position i is i


def test_classification_source_needs_classify_model():
    with pytest.raises(ValueError, match="task='classify'"):
        prepare(
            DataConfig(source="builtin:classification"), 0, ModelConfig(size="nano", vocab_size=32)
        )


@pytest.mark.slow
def test_trials_of_other_seeds_and_seq_len_read_the_same_shards(home, tmp_path, tiny_job):
    """Two real trials on one local corpus: the first prepares it, the second (another seed
    and seq_len) reads the same shards without tokenising anything again."""
    from scalelab.jobs.training.train import run

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"line {i} of a small corpus. " * 8}) + "\n"
                              for i in range(400)))  # fmt: skip
    first = run(tiny_job(data__source=str(corpus)))
    (root,) = list((home / "data").iterdir())
    stamps = {p.name: p.stat().st_mtime_ns for p in root.iterdir()}
    other = tiny_job(data__source=str(corpus), data__seq_len=16).model_copy(update={"seed": 3})
    second = run(other)
    assert first.status == second.status == "FINISHED"
    assert [p.name for p in (home / "data").iterdir()] == [root.name]
    assert {p.name: p.stat().st_mtime_ns for p in root.iterdir()} == stamps


SPLIT_TEXT = (
    "It's   12345 apples,\n\n  they'll  say\t\tdon't  \n  x  \u00e9t\u00e9 \u2014 \U0001f600!!  \n"
)


def test_gpt2_splits_text_as_tiktokens_own_gpt2_does():
    """GPT2_PATTERN (GPT-2's release) and tiktoken's r50k_pat_str give the same ids."""
    from tiktoken_ext.openai_public import r50k_pat_str

    from scalelab.jobs.data.tokenizers import gpt2_encoding

    tiktokens = gpt2_encoding(pat_str=r50k_pat_str)
    for text in (
        SPLIT_TEXT,
        SPLIT_TEXT * 3,
        " " * 50 + "x",
        "\n" * 9,
        "a\t\t",
        inspect.getsource(np.pad),
    ):
        assert load_tokenizer("gpt2").encode_batch([text]) == [tiktokens.encode_ordinary(text)]


def test_gpt2_ranks_in_a_tiktoken_file_encode_like_the_installed_gpt2(tmp_path):
    """A .tiktoken file is split the GPT-2 way: the same ids as the built-in gpt2."""
    from scalelab.jobs.data.tokenizers import gpt2_encoding

    ranks = gpt2_encoding()._mergeable_ranks
    path = tmp_path / "r50k_base.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    assert load_tokenizer(str(path)).encode_batch([SPLIT_TEXT]) == load_tokenizer(
        "gpt2"
    ).encode_batch([SPLIT_TEXT])
