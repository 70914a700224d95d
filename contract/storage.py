"""`storage:`, where a trial's checkpoints and metric spool are also kept when its nodes share
no filesystem (docs/running-on-ray.md, 'Storage without a shared filesystem'): a URI that
`pyarrow.fs.FileSystem.from_uri` opens, e.g. `s3://bucket/prefix` or `gs://bucket/prefix`.

Its layout mirrors the work directory's (contract/workdir.py):
  <storage>/trials/<trial_id>/checkpoints/<tag>/   a checkpoint's files, its marker last
  <storage>/trials/<trial_id>/outbox/<run_id>/     a run's spool (`sent`, `spool.jsonl`)
  <storage>/data/<dataset folder>/                  prepared token shards (jobs/data/shards.py),
                                                    their manifest.json last

Credentials never go in the URI (it is written into job.json and logged): they come from
the environment, as each filesystem reads it (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_
CREDENTIALS, ...). An S3-compatible server elsewhere than AWS: `?endpoint_override=host:port`
(and `&scheme=http` without TLS) in the URI: pyarrow 24-25 reads no AWS_ENDPOINT_URL(_S3).
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from pydantic import AfterValidator

# the schemes pyarrow.fs.FileSystem.from_uri opens (pyarrow 24-25)
SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file")
SECRET_KEYS = ("access_key", "secret_key", "session_token", "credentials", "sas_token")
CHECKPOINTS_DIR = "checkpoints"
OUTBOX_DIR = "outbox"
DATA_DIR = "data"


def check_uri(uri: str) -> str:
    """`uri` if it is a storage URI without credentials in it, else ValueError."""
    parts = urlsplit(uri)
    if parts.scheme not in SCHEMES:
        raise ValueError(
            f"{uri!r} is not a storage URI: its scheme must be one of {', '.join(SCHEMES)} "
            "(e.g. s3://bucket/prefix)"
        )
    if parts.scheme != "file" and not parts.netloc:
        raise ValueError(f"{uri!r} names no bucket or host (e.g. s3://bucket/prefix)")
    secrets = sorted(k for k in parse_qs(parts.query) if k.lower() in SECRET_KEYS)
    if secrets or parts.password:
        shown = ", ".join(secrets) or "a password"
        raise ValueError(
            f"{uri!r} carries credentials ({shown}): the URI is written into job.json and "
            "logs; give them in the environment (AWS_ACCESS_KEY_ID, ...) instead"
        )
    return uri


StorageURI = Annotated[str, AfterValidator(check_uri)]


def trial_prefix(root: str, trial_id: str) -> str:
    """The trial's folder below the storage's root path (what from_uri returned)."""
    return f"{root.rstrip('/')}/trials/{trial_id}"


def data_prefix(root: str, folder: str) -> str:
    """A prepared dataset's folder (its name under data_dir()) below the storage's root path."""
    return f"{root.rstrip('/')}/{DATA_DIR}/{folder}"
