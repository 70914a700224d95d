"""`prepare_source` on real files: resumable after SIGINT / SIGKILL with byte-identical
results, extendable, one writer at a time, and bad input that leaves nothing half-written."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.corpus import write_corpus
from scalelab.jobs.data.prepare import prepare_source
from scalelab.jobs.data.shards import read_manifest
from scalelab.jobs.data.sources import TextSource, stream_dataset
from scalelab.jobs.data.tokenizers import load_tokenizer


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name != "lock"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """4 MB of text as Parquet shards in datasets layout (benchmarks/corpus.py)."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), megabytes=4, shard_mb=1.5)


def _cli(corpus: Path, data: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "scalelab.cli.main", "data", "prepare", str(corpus),
            "--tokenizer", "gpt2", "--shard-tokens", "20000", "--workers", str(workers)]  # fmt: skip


def _env(data: Path) -> dict[str, str]:
    return {**os.environ, "SCALELAB_DATA": str(data), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """The corpus prepared in one uninterrupted run, with one worker process."""
    data = tmp_path_factory.mktemp("reference")
    ref = subprocess.run(_cli(corpus, data, 1), env=_env(data), capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    (root,) = list(data.iterdir())
    assert read_manifest(root).complete and len(read_manifest(root).train) > 10
    return root


def _ctrl_c_as_from_a_terminal() -> None:
    """An ignored SIGINT is inherited across exec: the test process may run with one (a
    pytest-xdist worker whose earlier tests left it so), and then prepare would ignore it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_prepare_continues_to_byte_identical_files(corpus, reference, tmp_path, sig):

    data = tmp_path / "data"
    proc = subprocess.Popen(_cli(corpus, data, 2), env=_env(data), start_new_session=True,
                            preexec_fn=_ctrl_c_as_from_a_terminal,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        roots = list(data.glob("*/manifest.json"))
        if roots and read_manifest(roots[0].parent).train:
            break
        time.sleep(0.01)
    if sig == signal.SIGKILL:
        os.killpg(proc.pid, sig)  # the whole group: workers die with the main process
    else:
        proc.send_signal(sig)  # Ctrl-C reaches the main process; workers ignore it
    _, err = proc.communicate(timeout=120)
    root = data / reference.name  # the same (source, tokenizer) key
    stopped = read_manifest(root)
    assert not stopped.complete, "prepare finished before it could be interrupted"
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "run the same command to continue" in err, err
        assert set(_files(root)) == {"manifest.json", "val.bin"} | {s.file for s in stopped.train}

    again = subprocess.run(_cli(corpus, data, 2), env=_env(data), capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert _files(root) == _files(reference)


def test_max_tokens_then_more_equals_one_run(corpus, tmp_path, monkeypatch):
    source = TextSource.open(str(corpus), "text")
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "steps"))
    for max_tokens in (1, 45_000, 300_000, None):
        root, m = prepare_source(source, "byte", max_tokens=max_tokens, workers=0,
                                 shard_tokens=200_000)  # fmt: skip
        if max_tokens:
            assert m.train_tokens >= max_tokens and not m.complete
            assert m.train_tokens == len(m.train) * 200_000  # stops on a shard boundary
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "once"))
    once, m_once = prepare_source(source, "byte", workers=0, shard_tokens=200_000)
    assert m_once.complete and _files(root) == _files(once)
    assert m_once.documents == sum(1 for _ in _all_docs(source))
    tokens = sum(s.tokens for s in m_once.train) + m_once.validation.tokens
    assert tokens == sum(len(d.encode()) + 2 for d in _all_docs(source))  # bytes + "\n\n"


def test_a_kill_between_the_validation_file_and_the_manifest_is_repaired(corpus, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    """The state a writer killed after replacing val.bin but before the manifest leaves:
    val.bin holds more tokens than the manifest lists. Continuing must not keep them."""
    source = TextSource.open(str(corpus), "text")
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "later"))
    later, _ = prepare_source(source, "byte", max_tokens=600_000, workers=0, shard_tokens=200_000)
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "killed"))
    killed, m = prepare_source(source, "byte", max_tokens=200_000, workers=0, shard_tokens=200_000)
    assert (later / "val.bin").stat().st_size > (killed / "val.bin").stat().st_size
    (killed / "val.bin").write_bytes((later / "val.bin").read_bytes())
    killed, _ = prepare_source(source, "byte", workers=0, shard_tokens=200_000)
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "once"))
    once, _ = prepare_source(source, "byte", workers=0, shard_tokens=200_000)
    assert _files(killed) == _files(once)


def _all_docs(source: TextSource, start: int = 0):
    for batch in source.batches(start):
        yield from (batch.to_pylist() if hasattr(batch, "to_pylist") else batch)


def test_a_second_writer_waits_for_the_first(corpus, tmp_path, monkeypatch):
    """While another process holds the dataset's lock (here: this test), `prepare` waits on
    it, then finds the folder and finishes the work."""
    from filelock import FileLock

    from scalelab.jobs.data.prepare import dataset_root

    data = tmp_path / "data"
    monkeypatch.setenv("SCALELAB_DATA", str(data))
    root = dataset_root(TextSource.open(str(corpus), "text"), "gpt2")
    root.mkdir(parents=True)
    with FileLock(str(root / "lock")):
        waiting = subprocess.Popen(_cli(corpus, data, 1), env=_env(data), text=True,
                                   stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
        line = waiting.stderr.readline()  # blocks until the CLI reports that it waits
        assert line.startswith(f"waiting for another process preparing {root}"), line
        time.sleep(0.5)
        assert waiting.poll() is None and not (root / "manifest.json").exists()
    _, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err
    assert read_manifest(root).complete


def test_bad_sources_are_clear_errors_and_leave_nothing(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "data"))
    with pytest.raises(ValueError, match="no such file or folder"):
        TextSource.open(str(tmp_path / "missing"), "text")
    with pytest.raises(ValueError, match="no files match"):
        TextSource.open(str(tmp_path / "*.parquet"), "text")
    (tmp_path / "empty.jsonl").write_text("")
    pq.write_table(pa.table({"body": ["some text"] * 40}), tmp_path / "wrong.parquet")
    (tmp_path / "wrong.csv").write_text("title,body\na,b\n")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n' * 30)
    cases = {
        "empty.jsonl": "has no training text: 0 documents",
        "blank.jsonl": "has no training text: 30 documents gave 0 tokens",
        "wrong.parquet": "'text' is not a column .*columns: \\['body'\\]",
        "wrong.csv": "'text' is not a column .*columns: \\['title', 'body'\\]",
    }
    for name, message in cases.items():
        with pytest.raises(ValueError, match=message):
            prepare_source(TextSource.open(str(tmp_path / name), "text"), "byte", workers=0)
        assert not any((tmp_path / "data").iterdir()), name  # no folder, no lock, no shard


def test_token_ids_beyond_the_vocabulary_size_are_refused(tmp_path, monkeypatch):
    """A tokenizers vocabulary with a gap: its size is the largest id + 1 (so uint32 shards),
    and ids that would not fit the shard dtype stop preparation instead of wrapping."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from scalelab.jobs.data import tokenise

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "small": 1, "huge": 70_000}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "gap.json"
    tok.save(str(path))
    (tmp_path / "docs.jsonl").write_text('{"text": "small huge small"}\n' * 60)
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "data"))
    root, m = prepare_source(TextSource.open(str(tmp_path / "docs.jsonl"), "text"), str(path),
                             workers=0)  # fmt: skip
    assert m.dtype == "uint32" and m.vocab_size == 70_001
    assert 70_000 in np.fromfile(root / m.train[0].file, "<u4")
    tokenise.init_worker(load_tokenizer(str(path)), "uint16")
    with pytest.raises(ValueError, match="produced token id 70000, which does not fit uint16"):
        tokenise.encode(tokenise.DocBatch(["small huge"], 0, 0))


def test_a_full_disk_mid_shard_keeps_only_complete_shards(tmp_path, monkeypatch):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)],
                          capture_output=True)  # fmt: skip
    if done.returncode:
        pytest.skip("cannot mount a 600 KB tmpfs here (needs root)")
    try:
        monkeypatch.setenv("SCALELAB_DATA", str(mount))
        source = TextSource.open("builtin:pydoc", "text")  # ~466k tokens: 932 KB of uint16
        with pytest.raises(ValueError, match="disk full while writing .*train-00000[0-9].bin"):
            prepare_source(source, "byte", workers=0, shard_tokens=100_000)
        (root,) = list(mount.iterdir())
        m = read_manifest(root)
        assert m is not None and not m.complete and len(m.train) >= 1
        assert set(_files(root)) == {"manifest.json", "val.bin"} | {s.file for s in m.train}
        for s in m.train:
            assert (root / s.file).stat().st_size == 2 * s.tokens
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_the_streaming_datasets_path_reads_what_the_arrow_reader_reads(corpus):
    """hf: sources go through datasets' streaming mode; the same reader over a local Parquet
    folder gives the documents, and resumes, exactly like the Arrow path."""
    import datasets

    files = sorted(str(p) for p in (corpus / "data").glob("*.parquet"))
    ds = datasets.load_dataset("parquet", data_files={"train": files}, split="train",
                               streaming=True)  # fmt: skip
    arrow = TextSource.open(str(corpus), "text")
    streamed = [d for b in stream_dataset(ds, "text", 1000, where="test") for d in b]
    assert streamed == list(_all_docs(arrow, 1000))
    with pytest.raises(ValueError, match="'body' is not a column of test"):
        next(stream_dataset(ds, "body", 0, where="test"))


def test_parquet_rows_read_by_workers_resume_at_any_document(tmp_path):
    """Parquet is handed out as row ranges the tokeniser reads itself: from any document
    on, across files and row groups small and large (cut into GROUP_ITEMS items), they
    give exactly the documents in order, and an item never exceeds a group's share."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from scalelab.jobs.data.sources import GROUP_ITEMS, READ_BATCH

    docs = [None if i % 7 == 0 else f"doc {i}" for i in range(30_000)]
    big = READ_BATCH * GROUP_ITEMS + 1_000  # items of ceil(big / GROUP_ITEMS) rows
    pq.write_table(pa.table({"text": docs[:20_000]}), tmp_path / "a.parquet",
                   row_group_size=big)  # fmt: skip
    pq.write_table(pa.table({"text": docs[20_000:]}), tmp_path / "b.parquet", row_group_size=700)
    source = TextSource.open(str(tmp_path), "text")
    for start in (0, 1, 511, 512, big - 1, big, big + 1, 19_999, 20_000, 20_701, 29_999, 30_000):
        assert [d for b in source.batches(start) for d in b] == docs[start:], start
    sizes = [len(item) for item in source.work(0)]
    assert sum(sizes) == len(docs) and max(sizes) == -(-big // GROUP_ITEMS)


def test_hub_source_offline_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "data"))
    source = TextSource.open("hf:nobody/no-such-dataset", "text")
    with pytest.raises(ValueError, match="could not be loaded: HF_DATASETS_OFFLINE"):
        prepare_source(source, "byte", workers=0)
    assert not any((tmp_path / "data").iterdir())


def test_manifest_records_counts_and_the_validation_rule(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path))
    root, m = prepare_source(TextSource.open(str(corpus), "text"), "gpt2", workers=0,
                             shard_tokens=300_000)  # fmt: skip
    raw = json.loads((root / "manifest.json").read_text())
    assert raw["tokenizer_fingerprint"] == "tiktoken:gpt2" and raw["dtype"] == "uint16"
    assert raw["validation"]["rule"].startswith("pieces whose index is a multiple of 20")
    assert all(s["tokens"] == 300_000 for s in raw["train"][:-1])
    assert sum(s["documents"] for s in raw["train"]) + raw["validation"]["documents"] == sum(
        1 for _ in _all_docs(TextSource.open(str(corpus), "text"))
    )
    assert m.separator == [50256]  # one end-of-text after every document, none elsewhere
    tokens = np.concatenate([np.fromfile(root / f, "<u2") for f in [*(s.file for s in m.train),
                                                                    "val.bin"]])  # fmt: skip
    assert (tokens == 50256).sum() == m.documents


def test_an_interrupt_between_a_shard_and_its_manifest_leaves_only_listed_files(
    corpus, tmp_path, monkeypatch
):
    """Ctrl-C can land after a shard's rename and before the manifest that lists it (the
    window is too narrow to hit on purpose with a real signal, so the manifest write raises).
    The folder must hold only what the manifest lists, as after any other stop."""
    import scalelab.jobs.data.prepare as prepare

    source = TextSource.open(str(corpus), "text")
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "data"))
    prepare_source(source, "byte", max_tokens=200_000, workers=0, shard_tokens=200_000)
    real_write = prepare.write_manifest

    def interrupted(root: Path, m) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "write_manifest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_source(source, "byte", workers=0, shard_tokens=200_000)
    monkeypatch.setattr(prepare, "write_manifest", real_write)
    root = next((tmp_path / "data").iterdir())
    listed = read_manifest(root)
    assert [s.file for s in listed.train] == ["train-000000.bin"]
    assert set(_files(root)) == {"manifest.json", "val.bin", "train-000000.bin"}
