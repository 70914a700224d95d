"""Sweep YAML validation and expansion: errors name the file, line and key; ids hash science."""

from __future__ import annotations

import json

import pytest

from scalelab.jobs.config import JobConfig
from scalelab.models.flops import train_flops_per_token
from scalelab.orchestrator.plan.expand import expand, plan_rows
from scalelab.orchestrator.plan.spec import SpecError, SweepSpec, load_spec, parse_spec

BASE = """
name: s
base:
  model: {size: nano, vocab_size: 256, block_size: 64}
  train: {tokens: 4096}
  data: {seq_len: 64}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as e:
        spec, source = parse_spec(text, "x.yaml")
        expand(spec, source)
    return e.value.problems


def test_typo_in_base_points_at_its_line():
    text = BASE.replace("block_size: 64}", "block_size: 64, atn_out: dense}")
    (line,) = problems(text)
    assert line.startswith("x.yaml:4: base.model.atn_out: unknown key")
    assert "attn_out" in line  # the allowed keys are listed


def test_bad_grid_value_points_at_the_value_line():
    text = BASE + "grid:\n  model.size:\n    - nano\n    - giant\n"
    (line,) = problems(text)
    assert line.startswith("x.yaml:10: grid.model.size[1]:")
    assert "giant" in line and "micro" in line


def test_unknown_grid_key_unknown_backend_and_variant_are_all_reported():
    text = BASE + "grid: {model.sise: [nano]}\nvariants: [dense, hadamrd]\nbackend: {kind: k8s}\n"
    lines = problems(text)
    assert len(lines) == 3
    joined = "\n".join(lines)
    assert "x.yaml:7: grid" in joined and "'sise' is not a key of model" in joined
    assert "x.yaml:8: variants[1]" in joined and "hadamrd" in joined
    assert "x.yaml:9: backend.kind" in joined and "'slurm'" in joined


def test_impossible_combination_is_reported_at_the_variant():
    # budget (set by the variants axis) keeps base's impossible TSA: one layer has no routers
    text = BASE.replace("block_size: 64}", "block_size: 64, n_layer: 1}") + "variants: [tsa]\n"
    (line,) = problems(text)
    assert line.startswith("x.yaml:4: base.model:") and "n_layer >= 2" in line
    assert "variants[0]" in line  # names the axis value that switched TSA on


def test_malformed_yaml_and_duplicate_keys():
    (line,) = problems("name: s\nbase: {model: [1, 2}\n")
    assert line.startswith("x.yaml:2: malformed YAML")
    (line,) = problems(BASE + "name: t\n")
    assert line.startswith("x.yaml:7: duplicate key 'name'")


def test_yaml_bomb_is_refused_before_it_expands():
    rows = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    (line,) = problems("\n".join(rows))  # 9**9 strings if expanded
    assert "YAML bomb" in line


def test_non_mapping_and_missing_file(tmp_path):
    (line,) = problems("- a\n- b\n")
    assert "a sweep is a mapping" in line
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


def test_grid_zip_variants_product_and_compute_order():
    text = (
        BASE
        + "variants: [dense, hadamard+tsa]\n"
        + "grid: {model.size: [micro, nano], seed: [0, 1]}\n"
        + "zip: {train.lr: [1.0e-3, 2.0e-3], train.warmup_fraction: [0.0, 0.1]}\n"
    )
    spec, source = parse_spec(text)
    trials = expand(spec, source)
    assert len(trials) == 2 * 2 * 2 * 2
    assert len({t.trial_id for t in trials}) == 16
    assert [t.flops for t in trials] == sorted(t.flops for t in trials)
    pairs = {(t.job.train.lr, t.job.train.warmup_fraction) for t in trials}
    assert pairs == {(1e-3, 0.0), (2e-3, 0.1)}  # zipped, not crossed
    assert {t.variant for t in trials} == {"dense", "hadamard+tsa"}


def test_variant_keeps_base_mechanism_settings():
    text = BASE.replace("block_size: 64}", "block_size: 64, budget: {s_min: 0.3}}")
    spec, source = parse_spec(text + "variants: [dense, budget]\n")
    by_variant = {t.variant: t for t in expand(spec, source)}
    assert by_variant["dense"].job.model.budget is None
    assert by_variant["budget"].job.model.budget.s_min == 0.3


def test_isoflop_turns_budgets_into_tokens():
    text = BASE + "isoflop: {flops: [1.0e12, 4.0e12], sizes: [nano, micro]}\n"
    spec, source = parse_spec(text)
    trials = expand(spec, source)
    assert len(trials) == 4
    for t in trials:
        assert t.job.train.tokens is None and t.job.train.flops in (1e12, 4e12)
        per_token = train_flops_per_token(t.job.model, t.job.data.seq_len)
        assert t.tokens == int(t.job.train.flops // per_token)
        assert t.flops == pytest.approx(t.job.train.flops, rel=1e-3)
    nano = sorted(t.tokens for t in trials if t.size == "nano")
    micro = sorted(t.tokens for t in trials if t.size == "micro")
    assert nano[0] > micro[0]  # same compute: the smaller model sees more tokens


def test_zip_lengths_and_axis_clash():
    assert "equal lengths" in problems(BASE + "zip: {seed: [0, 1], train.lr: [0.1]}\n")[0]
    clash = problems(
        BASE + "grid: {model.size: [nano]}\nisoflop: {flops: [1.0e12], sizes: [nano]}\n"
    )
    assert "more than one axis" in clash[0]


def test_trial_id_ignores_placement_but_not_science():
    spec, source = parse_spec(BASE + "grid: {seed: [0, 1]}\n")
    ids = [t.trial_id for t in expand(spec, source)]
    placed = BASE.replace("name: s", "name: other") + (
        "  deepspeed: {zero_stage: 2}\ngrid: {seed: [0, 1]}\nbackend: {kind: slurm, slurm: {partition: gpu}}\n"
    )
    spec2, source2 = parse_spec(placed)
    assert sorted(t.trial_id for t in expand(spec2, source2)) == sorted(ids)
    science = BASE.replace("tokens: 4096", "tokens: 8192") + "grid: {seed: [0, 1]}\n"
    spec3, source3 = parse_spec(science)
    assert not set(ids) & {t.trial_id for t in expand(spec3, source3)}
    job = JobConfig.model_validate(
        {
            "model": {"size": "nano", "vocab_size": 256, "block_size": 64},
            "train": {"tokens": 4096},
            "data": {"seq_len": 64},
        }
    )
    assert job.trial_id in ids  # the same rule as JobConfig's own


def test_plan_rows_and_schema():
    spec, source = parse_spec(BASE + "grid: {seed: [0, 1]}\n")
    trials = expand(spec, source)
    rows = plan_rows(spec, trials, {trials[0].trial_id: "FINISHED"})
    assert [r["status"] for r in rows] == ["FINISHED", "NEW"]
    expected_h = trials[0].flops / (spec.estimate.mfu * spec.peak_flops) / 3600
    assert rows[0]["gpu_hours"] == pytest.approx(expected_h)
    schema = SweepSpec.model_json_schema()
    json.dumps(schema)
    assert schema["additionalProperties"] is False
    assert "model" in schema["properties"]["base"]["properties"]


def test_grid_inside_a_mechanism_refines_only_the_variants_that_switch_it_on():
    text = BASE + (
        "variants: [dense, tsa, hadamard+tsa]\ngrid:\n  model.tsa.lambda_depth: [0.0, 0.01, 0.05]\n"
    )
    spec, source = parse_spec(text, "x.yaml")
    trials = expand(spec, source)
    by_variant: dict[str, list[float | None]] = {}
    for t in trials:
        tsa = t.job.model.tsa
        by_variant.setdefault(t.variant, []).append(tsa.lambda_depth if tsa else None)
    assert by_variant["dense"] == [None]  # one dense trial, TSA never switched on
    assert sorted(by_variant["tsa"]) == [0.0, 0.01, 0.05]
    assert sorted(by_variant["hadamard+tsa"]) == [0.0, 0.01, 0.05]
    assert len({t.trial_id for t in trials}) == len(trials) == 7


def test_slurm_warning_must_come_before_the_time_limit():
    backend = "backend: {kind: slurm, slurm: {time_min: 2, signal_delay_s: %d}}\n"
    (line,) = problems(BASE + backend % 120)
    assert line.startswith("x.yaml:") and "backend.slurm" in line
    assert "signal_delay_s (120) must be shorter than time_min (2 min = 120 s)" in line
    spec, _ = parse_spec(BASE + backend % 60, "x.yaml")
    assert spec.backend.slurm.signal_delay_s == 60


def test_overrides_make_the_same_trials_as_the_same_values_in_the_file():
    in_file = BASE.replace("tokens: 4096}", "tokens: 4096, lr: 3.0e-4}") + (
        "grid: {seed: [0, 1], model.size: [nano, micro]}\nbackend: {concurrency: 4}\n"
    )
    on_line = BASE + "grid: {seed: [0, 1]}\n"
    overrides = ["train.lr=3e-4", "backend.concurrency=4", "grid.model.size=[nano, micro]"]
    a, a_source = parse_spec(in_file, "x.yaml")
    b, b_source = parse_spec(on_line, "x.yaml", overrides)
    ids = [t.trial_id for t in expand(a, a_source)]
    assert len(ids) == 4 and ids == [t.trial_id for t in expand(b, b_source)]
    assert b.backend.concurrency == 4 and b.base["train"]["lr"] == "3e-4"  # YAML 1.1 text


def test_every_bad_override_is_reported_at_once_naming_it():
    text = BASE + "grid: {seed: [0, 1]}\n"
    found = problems_with(text, ["train.lr=abc", "backend.concurency=3", "seed=5", "nokey"])
    assert found[0].startswith("override 'seed=5': seed is swept by grid.seed")
    assert found[1].startswith("override 'nokey': expected KEY=VALUE")
    assert found[2].startswith("override 'backend.concurency=3': backend.concurency: unknown")
    found = problems_with(text, ["train.lr=abc", "train.lrr=1"])
    assert found[0].startswith("override 'train.lr=abc': base.train.lr: Input should be a valid")
    assert found[1].startswith("override 'train.lrr=1': base.train.lrr: unknown key")


def problems_with(text: str, overrides: list[str]) -> list[str]:
    with pytest.raises(SpecError) as e:
        spec, source = parse_spec(text, "x.yaml", overrides)
        expand(spec, source)
    return e.value.problems


def test_every_error_of_a_file_at_once_with_did_you_mean():
    # a misspelt top-level key, two misspelt grid keys and a misspelt base key
    text = BASE.replace("{tokens: 4096}", "{tokens: 4096, lrr: 0.1}")
    text += "grid: {train.lrr: [0.1], model.sise: [nano]}\nbackedn: {kind: local}\n"
    lines = problems(text)
    assert len(lines) == 4, lines
    by_key = {line.split(": ")[1]: line for line in lines}
    assert by_key["backedn"].startswith("x.yaml:8: ")
    assert "did you mean 'backend'?" in by_key["backedn"]
    assert "'lrr' is not a key of train, did you mean 'lr'?" in by_key["grid.train.lrr"]
    assert "did you mean 'size'?" in by_key["grid.model.sise"]
    assert by_key["base.train.lrr"].startswith("x.yaml:5: ")
    assert "did you mean 'lr'?" in by_key["base.train.lrr"]


def test_unknown_key_far_from_every_allowed_one_gets_no_guess():
    (line,) = problems(BASE + "zzzzqq: 1\n")
    assert "unknown key (allowed: " in line and "did you mean" not in line


def test_custom_resources_per_trial_are_checked_at_their_line():
    ray = "backend: {kind: ray, address: auto, resources_per_trial: {fake_gpu: 1}}\n"
    spec, _ = parse_spec(BASE + ray, "x.yaml")
    assert spec.backend.resources_per_trial == {"fake_gpu": 1.0}
    (line,) = problems(BASE + ray.replace("fake_gpu: 1", "GPU: 1"))
    assert line.startswith("x.yaml:7: backend.resources_per_trial") and "gpus_per_trial" in line
    (line,) = problems(BASE + ray.replace("fake_gpu: 1", "fake_gpu: 0"))
    assert "must be > 0" in line
    (line,) = problems(BASE + "backend: {kind: slurm, resources_per_trial: {fake_gpu: 1}}\n")
    assert "'local' or 'ray'" in line


BATCHED = BASE.replace("tokens: 4096}", "tokens: 4096, global_batch_tokens: 512}")


def test_eval_downstream_is_checked_at_its_line_and_not_in_the_trial_id(tmp_path):
    from scalelab.orchestrator.plan.job_checks import check_trials

    spec, source = parse_spec(BATCHED + "grid: {seed: [0, 1]}\n")
    ids = [t.trial_id for t in expand(spec, source)]
    evaluated = (
        BATCHED
        + "  eval: {downstream: {tasks: [scalelab_zen, piqa], limit: 8}}\ngrid: {seed: [0, 1]}\n"
    )
    spec2, source2 = parse_spec(evaluated)
    trials = expand(spec2, source2)
    assert [t.trial_id for t in trials] == ids  # the trained model is the same
    assert trials[0].job.eval.downstream.tasks == ("scalelab_zen", "piqa")
    check_trials(spec2, trials, source2)  # shipped and hub names pass without the hub

    gone = evaluated.replace("piqa", str(tmp_path / "gone.yaml"))
    spec3, source3 = parse_spec(gone, "x.yaml")
    with pytest.raises(SpecError) as e:
        check_trials(spec3, expand(spec3, source3), source3)
    (line,) = e.value.problems
    assert line.startswith("x.yaml:7: base.eval.downstream.tasks:") and "does not exist" in line

    twice = problems(BASE + "  eval: {downstream: {tasks: [piqa, piqa]}}\n")
    assert "named twice" in twice[0]
    classifier = BASE.replace("block_size: 64}", "block_size: 64, task: classify, n_classes: 2}")
    (line,) = problems(classifier + "  eval: {downstream: {tasks: [piqa]}}\n")
    assert "eval.downstream scores a language model" in line
