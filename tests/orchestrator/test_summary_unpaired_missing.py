"""A variant whose unpaired gain cannot be fitted says so in its cell of the gains table
and why in a note, instead of leaving the cell blank beside a paired gain (three sizes,
one seed: a fifth of the bootstrap's resamples hold a single compute value)."""

from __future__ import annotations

from synthetic_sweep import write_sweep

from scalelab.analysis.report import summarise_sweep


def test_a_missing_unpaired_gain_is_said_in_its_cell_and_a_note(work_home):
    write_sweep("unpaired-missing", sizes=("nano", "micro", "mini"), tokens_per_param=(20,),
                multipliers={"dense": 1.0, "hadamard": 0.8}, steps=3)  # fmt: skip
    printed = summarise_sweep("unpaired-missing").splitlines()
    (row,) = [line for line in printed if line.startswith("│ hadamard")]
    assert "0.79×" in row and "none (see note)" in row  # the paired gain, then no unpaired
    (note,) = [line for line in printed if line.startswith("note: unpaired gain of hadamard")]
    assert "resampled fits failed" in note
