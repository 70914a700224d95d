"""A local task file runs no code: the known ways out of lm-eval's Jinja templates, a
`!function` tag and a metric HF evaluate would load as code are refused in one line when
the task is loaded (for `--tasks`, `eval.downstream` and `eval.in_loop` alike), and every
template is rendered in Jinja's sandbox (the real lm-eval task, its requests built)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from scalelab.jobs.checks import JobCheckError, check_downstream
from scalelab.jobs.config import JobConfig
from scalelab.jobs.downstream import tasks
from scalelab.jobs.downstream.tasks import SHIPPED, TaskError

ESCAPES = [
    "{{ cycler.__init__.__globals__.os.system('touch MARK') }}",
    "{{ joiner.__init__.__globals__.os.system('touch MARK') }}",
    "{{ namespace.__init__.__globals__.os.system('touch MARK') }}",
    "{{ lipsum.__globals__['os'].system('touch MARK') }}",
    "{{ context.__class__.__mro__[1].__subclasses__() }}",
    "{{ (context|attr('__class__')).__mro__ }}",
    "{{ context['__class__'] }}",
    "{% for c in ''.__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch MARK') }}",
]


def _task(folder: Path, name: str = "zen_evil", **fields: object) -> Path:
    """The shipped zen task under another name, with `fields` replaced."""
    cfg = yaml.safe_load((SHIPPED / "scalelab_zen.yaml").read_text())
    cfg |= {"task": name, "dataset_kwargs": {"data_files": {"test": str(SHIPPED / "zen.jsonl")}}}
    cfg |= fields
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # where `touch MARK` would land
    return tmp_path


@pytest.mark.parametrize("template", ESCAPES)
def test_a_template_that_reaches_outside_its_document_is_refused(in_tmp: Path, template: str):
    path = _task(in_tmp, doc_to_text=template)
    with pytest.raises(TaskError, match="a task file runs no code") as refused:
        task = tasks.load([str(path)])["tasks"]["zen_evil"]
        task.build_all_requests(limit=2, rank=0, world_size=1)  # renders doc_to_text
    assert str(refused.value).startswith(f"task file {path}: doc_to_text: ")
    assert "\n" not in str(refused.value)
    assert not (in_tmp / "MARK").exists()
    job = JobConfig.model_validate({
        "model": {"size": "nano", "vocab_size": 256, "block_size": 32},
        "data": {"seq_len": 32},
        "train": {"tokens": 256, "global_batch_tokens": 256},
        "eval": {"in_loop": {"tasks": [str(path)]}, "downstream": {"tasks": [str(path)]}},
    })  # fmt: skip
    with pytest.raises(JobCheckError, match="a task file runs no code"):
        check_downstream(job)  # what submit and --dry-run check


def test_every_template_renders_in_jinjas_sandbox(in_tmp: Path):
    """Past the file check (a template built in code, as lm-eval's own tasks could be), the
    rendering itself refuses the escape."""
    from jinja2.exceptions import SecurityError
    from lm_eval import utils

    tasks.load([str(_task(in_tmp, name="zen_plain"))])
    with pytest.raises(SecurityError):
        utils.apply_template(ESCAPES[0], {"context": "x"})
    assert not (in_tmp / "MARK").exists()
    assert utils.apply_template("{{ context | upper }}: {{ choices[1] }}", {
        "context": "q", "choices": ["a", "b"]}) == "Q: b"  # fmt: skip


def test_function_tags_and_metrics_loaded_as_code_are_refused(in_tmp: Path):
    function = in_tmp / "fn.yaml"
    function.write_text(_task(in_tmp).read_text() + "process_docs: !function os.system\n")
    with pytest.raises(TaskError, match="!function"):
        tasks.load([str(function)])
    script = in_tmp / "evil_metric"  # what HF evaluate would import and run
    script.mkdir()
    (script / "evil_metric.py").write_text("import os\nos.system('touch MARK')\n")
    metric = _task(in_tmp, name="zen_metric", metric_list=[{"metric": str(script)}])
    with pytest.raises(TaskError, match="not one of lm-eval's own metrics"):
        tasks.load([str(metric)])
    filtered = _task(in_tmp, name="zen_filter",
                     filter_list=[{"name": "f", "filter": [{"function": "os.system"}]}])  # fmt: skip
    with pytest.raises(TaskError, match="not one of lm-eval's own filters"):
        tasks.load([str(filtered)])
    assert not (in_tmp / "MARK").exists() and os.getcwd() == str(in_tmp)


def test_the_shipped_and_packaged_tasks_still_load_and_render(in_tmp: Path):
    task = tasks.load(["scalelab_zen"])["tasks"]["scalelab_zen"]
    task.build_all_requests(limit=2, rank=0, world_size=1)
    assert len(task.instances) == 8  # 2 questions x 4 choices
    arc = tasks.load(["arc_easy"])["tasks"]["arc_easy"]
    arc.build_all_requests(limit=1, rank=0, world_size=1)
    assert arc.instances[0].args[0].startswith("Question: ")


FRAGMENTS = [
    "{{", "}}", "{%", "%}", " ", "context", "choices[0]", "label", "cycler", "joiner",
    "lipsum", "namespace()", "self", ".__init__", ".__globals__", ".__class__", ".__mro__",
    "[1]", ".__subclasses__()", ".os.system('touch MARK')", "['os']", "|attr('__class__')",
    "['__class__']", "._TemplateReference__context", "|upper", "|join(',')", "range(3)",
    "''", "for c in", "endfor", "if", "endif", "\n", "\t", "\\x00", "é", "{#", "#}", "|e",
    "~", "(", ")", ".popen('touch MARK').read()", "config", "request",
]  # fmt: skip


def test_fuzzed_task_files_never_run_code_and_fail_in_one_line(in_tmp: Path):
    """300 seeded task files: templates drawn from the fragments above, some with a metric,
    some not YAML or not UTF-8. Each is read as `--tasks FILE` reads it (the file checks),
    and, where they pass, its template is rendered as lm-eval renders it (in the sandbox):
    a TaskError of one line or a template error, never another exception, never the mark."""
    import random

    from jinja2 import TemplateError
    from lm_eval import utils

    from scalelab.jobs.downstream.task_safety import sandbox_templates

    sandbox_templates()
    rng = random.Random(44)
    base = _task(in_tmp, name="zen_fuzz").read_text()
    outcomes = {"refused": 0, "rendered": 0, "template error": 0}
    for case in range(300):
        template = "".join(rng.choices(FRAGMENTS, k=rng.randint(1, 12)))
        path = in_tmp / f"case{case}.yaml"
        kind = rng.random()
        if kind < 0.1:
            path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))))
        elif kind < 0.2:
            metric = rng.choice(["acc", "bleu", "./m", "exact_match", "../x.py", ""])
            path.write_text(base + f"metric_list: [{{metric: {metric!r}}}]\n")
        else:
            cfg = yaml.safe_load(base) | {"doc_to_text": template}
            path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
        try:
            tasks.local_config(path)
        except TaskError as e:
            assert "\n" not in str(e), (case, str(e))
            outcomes["refused"] += 1
            continue
        if kind >= 0.2:
            try:
                utils.apply_template(template, {"context": "c", "choices": ["a"], "label": 0})
                outcomes["rendered"] += 1
            except (TemplateError, TypeError, ValueError):
                outcomes["template error"] += 1
        assert not (in_tmp / "MARK").exists(), (case, template)
    assert not (in_tmp / "MARK").exists()
    assert min(outcomes.values()) > 0, outcomes  # the fuzz reaches every outcome
