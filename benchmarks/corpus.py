"""A text corpus in Hugging Face datasets layout, generated from text that ships with Python
(the standard library's source, pydoc's help topics, installed packages' descriptions), so
tests and benchmarks need no download and nothing generated is committed.

    corpus/README.md
    corpus/data/train-00000-of-00007.parquet ...   column `text` (and `id`), like FineWeb

Documents are 500-8000 characters cut from that text in a seeded order; later passes cut at
other places, so a large corpus is not one text repeated.
"""

from __future__ import annotations

import math
import random
import sysconfig
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path


def base_texts() -> list[str]:
    """About 34 MB of text: stdlib modules, pydoc topics, package descriptions."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    from pydoc_data.topics import topics

    texts += [topics[k] for k in sorted(topics)]
    texts += sorted(d.metadata.get_payload() or "" for d in metadata.distributions())
    return [t for t in texts if t.strip()]


def documents(megabytes: float, seed: int = 0) -> Iterator[str]:
    rng = random.Random(seed)
    texts, left = base_texts(), int(megabytes * 1e6)
    while left > 0:
        order = list(range(len(texts)))
        rng.shuffle(order)
        for i in order:
            text, at = texts[i], 0
            while at < len(text) and left > 0:
                size = rng.randint(500, 8000)
                doc = text[at : at + size]
                at += size
                left -= len(doc.encode())
                yield doc
            if left <= 0:
                return


def write_corpus(folder: Path, megabytes: float, seed: int = 0, shard_mb: float = 32) -> Path:
    """Write about `megabytes` of text as Parquet shards under folder/data; return folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = max(1, math.ceil(megabytes / shard_mb))
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(
        f"# generated corpus\n\n{megabytes} MB of Python's own text (benchmarks/corpus.py).\n"
    )
    docs = documents(megabytes, seed)
    per_shard = megabytes * 1e6 / shards
    n = 0
    for s in range(shards):
        batch, size = [], 0
        for doc in docs:
            batch.append(doc)
            size += len(doc.encode())
            if size >= per_shard and s < shards - 1:
                break
        table = pa.table({"text": batch, "id": list(range(n, n + len(batch)))})
        pq.write_table(table, folder / "data" / f"train-{s:05d}-of-{shards:05d}.parquet",
                       row_group_size=2048)  # fmt: skip
        n += len(batch)
    return folder
