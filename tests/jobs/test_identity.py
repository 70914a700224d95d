"""Trial identity by explicit fields (jobs/identity.py): what changes an id and what not."""

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from scalelab.jobs import identity
from scalelab.jobs.config import DataConfig, JobConfig, TrainConfig, load_recorded
from scalelab.models import catalog
from scalelab.models.budget import BudgetConfig, BudgetFormer
from scalelab.models.config import ModelConfig
from scalelab.models.mechanism import register, registered, unregister
from scalelab.models.tsa import TSAConfig

DATA = Path(__file__).parent / "data"
DEMO_V0 = Path(__file__).parents[1] / "orchestrator" / "data" / "demo_v0_jobs.json"
SECTIONS = {
    "model": ModelConfig,
    "model.budget": BudgetConfig,
    "model.tsa": TSAConfig,
    "data": DataConfig,
    "train": TrainConfig,
}


def _recorded_jobs() -> dict[str, dict]:
    """The demo's 24 job.json dicts with the ids they were recorded under (rule 1)."""
    return json.loads(DEMO_V0.read_text())


class NewBudget(BudgetConfig):
    new_knob: float = 0.5


class NewBudgetFormer(BudgetFormer):
    config = NewBudget


@contextmanager
def budget_replaced_by_a_newer_version():
    catalog.mechanisms()  # the built-ins are registered
    unregister("budget")
    try:
        with registered(NewBudgetFormer):
            yield
    finally:
        register(BudgetFormer)


class NewModel(ModelConfig):
    new_width_rule: str = "old"


class NewData(DataConfig):
    shuffle_buffer: int = 0


class NewTrain(TrainConfig):
    z_loss: float = 0.0


class NewJob(JobConfig):
    model: NewModel
    data: NewData = NewData()
    train: NewTrain


def test_a_new_defaulted_field_keeps_every_id():
    for recorded in _recorded_jobs().values():
        job = JobConfig.model_validate(recorded)
        with budget_replaced_by_a_newer_version():
            newer = NewJob.model_validate(recorded)
        assert newer.trial_id == job.trial_id
    changed = {**recorded, "train": {**recorded["train"], "z_loss": 1e-4}}
    assert NewJob.model_validate(changed).trial_id != job.trial_id  # once set, it counts


def test_cadence_and_placement_keep_the_id(tiny_job):
    base = tiny_job().trial_id
    for override in (
        {"train__log_interval": 7},
        {"train__eval_interval": 3},
        {"train__checkpoint_interval": 5},
        {"train__keep_checkpoints": 9},
        {"train__compile": True},
        {"data__tokenizer_file": "/somewhere/r50k_base.tiktoken"},
        {"deepspeed__zero_stage": 2, "deepspeed__micro_batch_size": 2},
    ):
        assert tiny_job(**override).trial_id == base, override


def test_science_and_numerics_change_the_id(tiny_job):
    ids = [
        tiny_job().trial_id,
        tiny_job(train__lr=1e-3).trial_id,
        tiny_job(train__dtype="bf16").trial_id,
        tiny_job(train__dtype="bf16", train__grad_accum_dtype="bf16").trial_id,
        tiny_job().model_copy(update={"seed": 1}).trial_id,
        tiny_job(data__val_tokens=512).trial_id,
        tiny_job(model__budget={}).trial_id,
        tiny_job(model__tsa={}).trial_id,
        tiny_job(model__attn_out="hadamard").trial_id,
        tiny_job(train__early_exit_alphas=[0.7]).trial_id,
        tiny_job(train__divergence_factor=3.0).trial_id,
    ]
    assert len(set(ids)) == len(ids)


def test_none_and_empty_sub_configs_differ_spelled_defaults_do_not(tiny_job):
    off, on = tiny_job(), tiny_job(model__budget={})
    assert on.identity_tree()["mechanisms"] == {"budget": {}}
    assert "mechanisms" not in off.identity_tree()
    assert tiny_job(model__budget={"s_min": 0.1}).trial_id == on.trial_id  # the default
    assert tiny_job(model__budget={"s_min": 0.2}).trial_id != on.trial_id
    assert tiny_job(train__grad_accum_dtype="fp32").trial_id == off.trial_id  # fp32: resolved


def test_yaml_spellings_of_one_float_give_one_id(tiny_job):
    spellings = [yaml.safe_load(f"lr: {text}")["lr"] for text in ("1.0e-3", "0.001", "1e-3")]
    assert len({tiny_job(train__lr=lr).trial_id for lr in spellings}) == 1


def _defaults() -> dict[str, object]:
    out = {}
    for section, cls in SECTIONS.items():
        for name, field in cls.model_fields.items():
            if not field.is_required():
                value = field.get_default(call_default_factory=True)
                out[f"{section}.{name}"] = identity._json(value)
    out["job.seed"] = JobConfig.model_fields["seed"].default
    return out


def test_science_defaults_match_the_snapshot():
    """A default that changes must be listed in CHANGED_DEFAULTS with its old value (or
    trials recorded before would silently change science); a new field is added here."""
    snapshot = json.loads((DATA / "science_defaults.json").read_text())
    now = _defaults()
    changed = {
        k: (snapshot[k], now[k])
        for k in snapshot.keys() & now.keys()
        if snapshot[k] != now[k] and identity.CHANGED_DEFAULTS.get(k) != snapshot[k]
    }
    assert not changed, f"defaults changed: add the old values to CHANGED_DEFAULTS: {changed}"
    new = sorted(now.keys() - snapshot.keys())
    assert not new, f"new fields: add them to tests/jobs/data/science_defaults.json: {new}"


def test_a_changed_default_keeps_old_trials_apart(tiny_job, monkeypatch):
    before = tiny_job()
    recorded = before.model_dump(mode="json")
    del recorded["train"]["weight_decay"]  # a job.json written before the field existed
    monkeypatch.setitem(identity.CHANGED_DEFAULTS, "train.weight_decay", 0.0)
    old = load_recorded(recorded)
    assert old.train.weight_decay == 0.0  # it ran with the old default
    assert old.trial_id != before.trial_id  # ... so it is not today's default trial
    assert "weight_decay" not in old.identity_tree()["train"]  # its id did not move
    assert before.identity_tree()["train"]["weight_decay"] == 0.1  # today's default counts
    assert tiny_job(train__weight_decay=0.0).trial_id == old.trial_id


def test_legacy_rule_reproduces_recorded_ids():
    recorded = _recorded_jobs()
    assert len(recorded) == 24
    for old_id, job in recorded.items():
        assert identity.legacy_trial_id(load_recorded(job)) == old_id


def test_the_pre_image_is_small_and_explicit(tiny_job):
    tree = tiny_job(model__budget={}).identity_tree()
    assert tree["semantics"] == identity.SEMANTICS_VERSION
    assert tree["model"] == {
        "size": "nano", "n_layer": 2, "d_model": 64, "n_head": 4, "vocab_size": 256,
        "block_size": 32,
    }  # fmt: skip
    assert "log_interval" not in tree["train"] and "seed" not in tree


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_section_has_defaults_in_the_snapshot(section):
    snapshot = json.loads((DATA / "science_defaults.json").read_text())
    assert any(k.startswith(f"{section}.") for k in snapshot)
