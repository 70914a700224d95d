"""Registry of named model sizes (torch-free).

Tiny presets (nano, tiny, micro, mini: a ladder with ~3x parameters per step) run on a
laptop CPU in seconds; the paper ladder follows GPT-3's widths
(Brown et al. 2020, Table 2.1), each of which has a Hadamard matrix (a power of two, or
12/20 times one). The 5.6B depth (27 layers at width 4096) is chosen so the model has
5.65B parameters with GPT-2's vocabulary and a 1024-token context.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SizePreset:
    name: str
    n_layer: int
    d_model: int
    n_head: int
    cpu_sized: bool = False


_PRESETS = (
    SizePreset("nano", n_layer=2, d_model=64, n_head=4, cpu_sized=True),
    SizePreset("tiny", n_layer=3, d_model=96, n_head=4, cpu_sized=True),  # 96 = 12 x 8: Paley
    SizePreset("micro", n_layer=4, d_model=128, n_head=4, cpu_sized=True),
    SizePreset("mini", n_layer=6, d_model=256, n_head=8, cpu_sized=True),
    SizePreset("124M", n_layer=12, d_model=768, n_head=12),
    SizePreset("350M", n_layer=24, d_model=1024, n_head=16),
    SizePreset("760M", n_layer=24, d_model=1536, n_head=16),
    SizePreset("1.3B", n_layer=24, d_model=2048, n_head=16),
    SizePreset("2.7B", n_layer=32, d_model=2560, n_head=32),
    SizePreset("5.6B", n_layer=27, d_model=4096, n_head=32),
)

SIZES: dict[str, SizePreset] = {p.name: p for p in _PRESETS}


def get_size(name: str) -> SizePreset:
    """The preset called `name`; an unknown name lists the known ones."""
    try:
        return SIZES[name]
    except KeyError:
        raise ValueError(f"unknown size preset {name!r}; allowed: {', '.join(SIZES)}") from None
