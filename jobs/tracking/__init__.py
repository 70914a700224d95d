"""A trial's MLflow record: the spool, its sender, the store, logs and provenance."""
