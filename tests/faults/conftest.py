"""The fault suite: each test provokes one fault with the real component (a server stopped,
a process killed, a file corrupted, a hostile input) and checks that nothing is lost and
nobody is let in. docs/reliability.md lists what each test guarantees."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/faults/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.faults)
