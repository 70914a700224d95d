"""Whether a sweep's `storage:` can be used, checked by `submit` and `submit --dry-run`
before anything is created (docs/running-on-ray.md, 'Storage without a shared filesystem').

A trial treats storage it cannot reach as empty: an upload that fails is a warning and a
fetch finds nothing, so a bucket that does not exist would only show when a lost node's
trial started again from step 0. So the plan checks it once, with this machine's
credentials: the bucket exists, then a small marker object is written below the storage's
prefix, read back and deleted. Bounded in time: storage that does not answer within
CHECK_TIMEOUT_S is refused too. The answer is one line.
"""

from __future__ import annotations

import threading
import uuid

CHECK_TIMEOUT_S = 30.0
MARKER_PREFIX = ".scalelab-check-"  # the marker object, below the storage's prefix
_BUCKETED = ("S3FileSystem", "GcsFileSystem")  # whose root path starts with a bucket


def storage_refusal(uri: str | None, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """Why the trials could not keep their checkpoints and spools in the storage at `uri`
    (one line, naming it without its query options); None when they can, or without one."""
    if uri is None:
        return None
    answer: list[str | None] = []

    def check() -> None:
        try:
            answer.append(_problem(uri))
        except Exception as e:  # what the filesystem raised says why
            answer.append(_first_line(e))

    # daemon: storage that never answers does not keep the process from exiting
    thread = threading.Thread(target=check, daemon=True, name="scalelab-storage-check")
    thread.start()
    thread.join(timeout_s)
    shown = uri.split("?", 1)[0]
    if not answer:
        return f"storage {shown} did not answer within {timeout_s:.0f} s"
    return None if answer[0] is None else f"storage {shown}: {answer[0]}"


def _problem(uri: str) -> str | None:
    from scalelab.jobs.object_store import Objects

    objects = Objects(uri)
    fs, base = objects.fs, objects.base.rstrip("/")
    if type(fs).__name__ in _BUCKETED:
        import pyarrow.fs as pafs

        bucket = base.split("/", 1)[0]
        if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            return f"bucket {bucket} does not exist (or these credentials cannot see it)"
    token = uuid.uuid4().hex
    marker, data = f"{base}/{MARKER_PREFIX}{token}", f"scalelab storage check {token}".encode()
    name = marker.rsplit("/", 1)[1]
    try:
        with fs.open_output_stream(marker) as out:
            out.write(data)
    except Exception as e:
        return f"cannot write {name}: {_first_line(e)}"
    try:
        with fs.open_input_stream(marker) as f:
            back = f.read()
    except Exception as e:
        return f"cannot read back {name}: {_first_line(e)}"
    try:
        fs.delete_file(marker)
    except Exception as e:
        return f"cannot delete {name}: {_first_line(e)}"
    if back != data:
        return f"{name} read back differs from what was written"
    return None


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
