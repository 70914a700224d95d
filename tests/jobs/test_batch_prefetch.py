"""Issue 26, item 6a: training batches are contiguous (pinned for a GPU) and read one step
ahead on a background thread, without changing the batch sequence or a resume's position."""

import threading

import numpy as np
import pytest
import torch

from scalelab.jobs.config import DataConfig
from scalelab.jobs.data.batch import Batch
from scalelab.jobs.data.device_inputs import prefetched, read_ahead
from scalelab.jobs.data.trial import TrainStream, open_data, prepare
from scalelab.models.config import ModelConfig

MODEL = ModelConfig(size="nano", vocab_size=256, block_size=64)
STEPS, MICRO, ACCUM = 6, 2, 3


@pytest.fixture
def stream(home) -> TrainStream:
    cfg = DataConfig(seq_len=16, val_tokens=64)
    data = open_data(cfg, 0, prepare(cfg, 0, MODEL), MODEL, train_windows=24)  # 2 epochs
    return TrainStream(data, seed=3, micro_batch=MICRO, accum=ACCUM, rank=1, world=2)


def _micro_batches(stream: TrainStream, first: int):
    for step in range(first, STEPS):
        yield from stream.micro_batches(step)


def _tokens(inputs) -> list[tuple[bytes, bytes]]:
    return [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y, _ in inputs]


def test_training_batches_are_contiguous(stream):
    """Views of one window array were strided: torch kept the strides and pinning copied
    them through another pageable temporary."""
    for b in stream.micro_batches(0):
        assert b.x.flags.c_contiguous and b.y.flags.c_contiguous
        assert np.array_equal(b.x[:, 1:], b.y[:, :-1])  # y is x shifted by one token
    for x, y, _ in prefetched(stream.micro_batches(0), "cpu", ahead=ACCUM):
        assert x.is_contiguous() and y.is_contiguous() and x.dtype == torch.int64
    strided = np.arange(40).reshape(4, 10)[:, ::2]
    assert Batch(strided, strided).x.flags.c_contiguous  # any source's batch


def test_read_ahead_gives_the_same_sequence_from_a_background_thread(stream):
    readers = set()

    def batches():
        for b in _micro_batches(stream, 0):
            readers.add(threading.get_ident())
            yield b

    plain = _tokens(prefetched(_micro_batches(stream, 0), "cpu"))
    ahead = _tokens(prefetched(batches(), "cpu", ahead=ACCUM))
    assert ahead == plain and len(plain) == STEPS * ACCUM
    assert readers and threading.get_ident() not in readers  # read off the training thread
    # a resumed run starts its reader at its step: the tail of the same sequence
    resumed = _tokens(prefetched(_micro_batches(stream, 4), "cpu", ahead=ACCUM))
    assert resumed == plain[4 * ACCUM :]


def test_read_ahead_stays_at_most_its_depth_ahead_and_stops_when_closed():
    produced, handed = [], 0

    def batches():
        for i in range(100):
            produced.append(i)
            yield Batch(np.full((1, 4), i), np.full((1, 4), i))

    it = read_ahead(batches(), pin=False, ahead=2)
    for _ in range(3):
        next(it)
        handed += 1
    deadline = threading.Event()
    deadline.wait(0.3)  # the reader fills its queue meanwhile
    assert handed < len(produced) <= handed + 2 + 1  # the queue, plus one being put
    it.close()
    stopped = len(produced)
    deadline.wait(0.3)
    assert len(produced) == stopped  # closed: it reads no further


def test_an_error_while_reading_is_raised_on_the_training_thread():
    def batches():
        yield Batch(np.zeros((1, 4), np.int64), np.zeros((1, 4), np.int64))
        raise ValueError("shard 3 is truncated")

    it = read_ahead(batches(), pin=False, ahead=2)
    next(it)  # the batch before it comes first
    with pytest.raises(ValueError, match="shard 3"):
        next(it)
    with pytest.raises(ValueError, match="shard 3"):
        list(prefetched(batches(), "cpu", ahead=2))


@pytest.mark.gpu  # skipped without a CUDA device (tests/conftest.py)
def test_batches_are_read_into_pinned_memory_for_a_gpu(stream):
    hosts = list(read_ahead(stream.micro_batches(0), pin=True, ahead=ACCUM))
    assert all(x.is_pinned() and y.is_pinned() for x, y, _ in hosts)
    on_gpu = list(prefetched(stream.micro_batches(0), "cuda", ahead=ACCUM))
    assert _tokens((x.cpu(), y.cpu(), kw) for x, y, kw in on_gpu) == _tokens(
        prefetched(stream.micro_batches(0), "cpu")
    )
