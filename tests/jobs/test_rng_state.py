"""RNG states survive a checkpoint file read with weights_only=True, cached Gaussians too."""

import random

import numpy as np
import torch

from scalelab.jobs.training import rng_state


def _draws() -> tuple:
    return (torch.rand(3).tolist(), np.random.normal(size=3).tolist(), random.gauss(0, 1),
            random.random())  # fmt: skip


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    random.gauss(0, 1)  # leaves a cached second Gaussian (gauss_next) in Python's state
    np.random.normal()  # and one in numpy's legacy state (has_gauss)
    torch.save(rng_state.capture(), tmp_path / "rng.pt")
    expected = _draws()
    _draws()  # move every generator on

    rng_state.restore(torch.load(tmp_path / "rng.pt", weights_only=True))

    assert _draws() == expected
