"""Tasks load through lm-eval's own TaskManager, offline: the shipped local task, and a
task whose data is not cached fails with one line saying how to cache it."""

import pytest

from scalelab.jobs.downstream import tasks, zen_items


def test_the_shipped_items_are_what_the_builder_makes():
    assert zen_items.DATA.read_text() == zen_items.render(zen_items.items())
    assert len(zen_items.items()) >= 30


def test_the_shipped_task_loads_through_lm_evals_task_manager(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    loaded = tasks.load(["scalelab_zen"])
    task = loaded["tasks"]["scalelab_zen"]
    docs = list(task.test_docs())
    assert len(docs) == len(zen_items.items())
    assert task.doc_to_choice(docs[0])[task.doc_to_target(docs[0])] in {
        r["choices"][r["label"]] for r in zen_items.items()
    }


def test_uncached_task_data_is_one_line_saying_how_to_cache_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    task = tmp_path / "hub_task.yaml"
    task.write_text(
        "task: hub_task\ndataset_path: scalelab-tests/not-cached\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: c\ndoc_to_target: 0\n"
    )
    with pytest.raises(tasks.TaskDataMissing) as e:
        tasks.load([str(task)])
    message = str(e.value)
    assert "\n" not in message and "HF_DATASETS_CACHE" in message and "not cached" in message
