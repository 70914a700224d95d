"""What every layer agrees on (docs/architecture.md, 'The contract'): the config base, the
work directory's layout, the MLflow names of runs, tags and statuses, how a trial ends.

A leaf: imports the standard library and pydantic only, so orchestrator, jobs and models
can all import it.
"""
