"""Whether the hub datasets a sweep names are here, checked at once and bounded in time
(docs/sweep-yaml.md, 'Dry-run').

Each dataset is looked for in the local cache first, with the network off. Offline
(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set) that is the whole check: nothing is asked of the
network. Otherwise every dataset not in the cache is asked of the hub at the same time, one
request each with a short time-out, before the full resolution (`check_hub`): the hub
client's own retry back-off (five retries, ~25-50 s a dataset) is never waited for. A
dataset that is not there, or a hub that does not answer in time, is MissingData: the
dry-run plans the sweep anyway and lists it as a blocker.
"""

from __future__ import annotations

import threading
import time

from scalelab.jobs.config import DataConfig, MissingData

HUB_TIMEOUT_S = 10.0  # for all the sweep's datasets together


def hub_problems(
    configs: list[DataConfig], timeout_s: float = HUB_TIMEOUT_S
) -> dict[str, MissingData]:
    """For each data.source of `configs` (hub names) whose dataset cannot be resolved here
    within `timeout_s`, why; the others are left out."""
    if not configs:
        return {}
    from scalelab.jobs.data.classification import check_hub, hub_offline

    problems: dict[str, MissingData] = {}
    to_ask: dict[str, DataConfig] = {}
    for cfg in configs:
        if cfg.source in problems or cfg.source in to_ask:
            continue
        try:
            check_hub(cfg, cache_only=True)
        except MissingData as e:
            if hub_offline():
                problems[cfg.source] = e
            else:
                to_ask[cfg.source] = cfg
    answers: dict[str, MissingData | None] = {}
    threads = [
        # daemon: a hub that never answers does not keep the process from exiting
        threading.Thread(target=_ask_hub, args=(cfg, timeout_s, answers), daemon=True)
        for cfg in to_ask.values()
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for source, cfg in to_ask.items():
        if source not in answers:
            problems[source] = _late(cfg, timeout_s)
        elif answers[source] is not None:
            problems[source] = answers[source]  # type: ignore[assignment]
    return problems


def _ask_hub(cfg: DataConfig, timeout_s: float, answers: dict[str, MissingData | None]) -> None:
    """One request for the dataset (no retries), then its full resolution."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    from scalelab.jobs.data.classification import check_hub, hub_error, hub_id

    path, _ = hub_id(cfg.source)
    try:
        HfApi().dataset_info(path, timeout=timeout_s)
    except RepositoryNotFoundError as e:
        answers[cfg.source] = hub_error(cfg, e, "the Hugging Face hub has no such dataset")
        return
    except Exception as e:  # no network, no name service, a time-out, a refusal
        answers[cfg.source] = hub_error(cfg, e, "the Hugging Face hub is unreachable")
        return
    try:
        check_hub(cfg)  # the hub answered: its config and files
        answers[cfg.source] = None
    except MissingData as e:
        answers[cfg.source] = e


def _late(cfg: DataConfig, timeout_s: float) -> MissingData:
    from scalelab.jobs.data.classification import hub_error

    return hub_error(
        cfg, f"no answer within {timeout_s:g} s", "the Hugging Face hub did not answer in time"
    )
