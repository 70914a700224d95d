"""The one-line errors of task loading (`jobs/downstream/tasks.py`, `packaged.py`)."""


class TaskError(ValueError):
    """A task that cannot be loaded, with the one-line reason."""


class TaskDataMissing(TaskError):
    pass
