"""A real S3-compatible server for the `storage:` tests: moto's `moto_server` as a
subprocess on 127.0.0.1, with one bucket; each test takes a prefix of its own (`uri()`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

BUCKET = "scalelab-tests"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",  # moto accepts any; pyarrow needs some
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups for credentials
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3:
    """moto_server on 127.0.0.1 with one bucket; each test gets a prefix of its own."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"127.0.0.1:{port}"
        self.fs = pafs.S3FileSystem(
            endpoint_override=self.endpoint, scheme="http", region="us-east-1",
            access_key="testing", secret_key="testing", allow_bucket_creation=True,
        )  # fmt: skip

    def uri(self) -> str:
        prefix = uuid.uuid4().hex[:12]
        return (
            f"s3://{BUCKET}/{prefix}?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"
        )

    def objects(self, path: str) -> list[str]:
        """The objects below `path`, relative to it, sorted."""
        infos = self.fs.get_file_info(pafs.FileSelector(path, recursive=True))
        return sorted(i.path[len(path) + 1 :] for i in infos if i.type == pafs.FileType.File)


@contextmanager
def moto_server() -> Iterator[S3]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "moto_server did not start"
                time.sleep(0.2)
        server = S3(port)
        server.fs.create_dir(BUCKET)
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
