"""Checkpoint digests at ladder scale (issue 26, 6c): a rank hashes its files on several
threads at once, the files are shared out by size, and the digests are SHA-256's."""

import hashlib
import os
import threading

import pytest

from scalelab.jobs.training import checksums


def test_files_are_hashed_in_parallel_with_the_same_digests(tmp_path):
    """Two named pipes, fed in the opposite order to the one a sequential reader would
    take: only readers that have both pipes open at once get through (a sequential one
    blocks on the first pipe, whose writer waits for the second to be read)."""
    data = {"a.pt": os.urandom(3 << 20), "b.pt": os.urandom(1 << 20)}
    for name in data:
        os.mkfifo(tmp_path / name)

    def feed() -> None:
        for name in ("b.pt", "a.pt"):
            with open(tmp_path / name, "wb") as f:  # blocks until a reader opens it
                f.write(data[name])

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    got = {}
    reader = threading.Thread(
        target=lambda: got.update(checksums.digests(tmp_path, ["a.pt", "b.pt"], threads=2)),
        daemon=True,
    )
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "the files were read one after the other"
    assert got == {
        name: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for name, b in data.items()
    }


def test_regular_files_digest_the_same_on_one_thread_or_several(tmp_path):
    names = [f"f{i}.pt" for i in range(5)]
    for i, name in enumerate(names):
        (tmp_path / name).write_bytes(os.urandom(1000 * (i + 1)) if i else b"")
    assert checksums.digests(tmp_path, names, threads=3) == checksums.digests(tmp_path, names)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_the_files_are_shared_out_by_size_once_each(world):
    """The ladder's shape: one big model file beside a shard per rank; the big file is
    one rank's whole share, and every file is hashed by exactly one rank."""
    sizes = {"mp_rank_00_model_states.pt": 11 << 30}
    sizes |= {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": 1 << 30 for r in range(8)}
    sizes |= {f"rng_rank{r}.pt": 15_000 for r in range(8)}
    shares = [checksums.share(sizes, r, world) for r in range(world)]
    assert sorted(n for s in shares for n in s) == sorted(sizes)
    loads = [sum(sizes[n] for n in s) for s in shares]
    if world > 1:
        assert shares[0][0] == "mp_rank_00_model_states.pt"
        assert loads[0] == max(loads) and max(loads[1:]) - min(loads[1:]) <= 1 << 30
    assert checksums.share(sizes, 0, world) == shares[0]  # the same split every time
