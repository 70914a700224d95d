"""The notebook's submit counts a trial another sweep had trained (its run copies the
trained curve, scheduler._adopt_trained) as finished, and says it was reused: its
`outcome.finished` is empty, which `len(run.outcome.finished)` read as nothing done; the
opening line does not count it among the trials to train."""

from __future__ import annotations

from conftest import sweep_yaml

import scalelab

BACKEND = "{concurrency: 1, cpus_per_trial: 0.5, max_retries: 0}"


def test_the_notebook_counts_a_trial_reused_from_another_sweep(
    tmp_path, work_home, ray_session, sweep_name, capsys
):
    paths = []
    for name in (f"{sweep_name}-a", f"{sweep_name}-b"):  # the same trial: seed 9300
        path = tmp_path / f"{name}.yaml"
        path.write_text(sweep_yaml(name, seeds=1, first_seed=9300, backend=BACKEND))
        paths.append(path)
    first = scalelab.submit(scalelab.load_sweep(paths[0]))
    assert first.ok and len(first.outcome.finished) == 1, first
    assert f"sweep {sweep_name}-a: 1 finished, 0 skipped" in capsys.readouterr().out

    second = scalelab.submit(scalelab.load_sweep(paths[1]))
    printed = capsys.readouterr().out
    assert second.ok and second.outcome.reused == first.outcome.finished, second.outcome
    assert second.outcome.finished == []  # trained elsewhere: only its curve was copied
    assert f"sweep {sweep_name}-b: 0 of 1 trials to train, 1 trained before in another " in (
        printed
    )  # the opening line: nothing is trained
    assert ": finished (1/1)" in printed  # the trial's line
    assert f"sweep {sweep_name}-b: 1 finished (1 reused from other sweeps)" in printed, printed
