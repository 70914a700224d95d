"""contract/runs.py's MLflow names against the session's real sqlite store (here to share
it: creating one takes seconds): the filters find exactly a sweep's runs (also for a name
with a quote), the search reads every page."""

import pytest
from mlflow.tracking import MlflowClient

from scalelab.contract.runs import (
    Role,
    Tag,
    quote,
    search_all,
    sweep_experiment,
    sweep_filter,
    sweep_run_name,
    trial_run_name,
    trials_filter,
)
from scalelab.contract.workdir import tracking_uri


def test_names():
    assert sweep_run_name("demo") == "sweep:demo"
    assert trial_run_name("budget+tsa", "nano", "0123456789abcdef") == "budget+tsa-nano-01234567"
    assert quote("demo") == "'demo'" and quote("it's") == '"it\'s"'
    with pytest.raises(ValueError, match="both quote marks"):
        quote("""'"'""")


def test_filters_and_paged_search_on_a_real_store(work_home, sweep_name, tmp_path):
    client = MlflowClient(tracking_uri())
    eid = client.create_experiment(sweep_name, artifact_location=(tmp_path / "a").as_uri())
    for sweep in ("it's", "other"):
        client.create_run(eid, tags={Tag.ROLE: Role.SWEEP, Tag.SWEEP: sweep})
        for _ in range(3):
            client.create_run(eid, tags={Tag.ROLE: Role.TRIAL, Tag.SWEEP: sweep})
    trials = search_all(client, [eid], trials_filter("it's"), page_size=2)
    assert len(trials) == 3 and {r.data.tags[Tag.SWEEP] for r in trials} == {"it's"}
    assert len(search_all(client, [eid], page_size=3)) == 8
    (parent,) = search_all(client, [eid], sweep_filter("it's"))
    assert parent.data.tags[Tag.ROLE] == Role.SWEEP
    assert sweep_experiment(client, "it's").experiment_id == eid
    assert sweep_experiment(client, "absent-" + sweep_name) is None
