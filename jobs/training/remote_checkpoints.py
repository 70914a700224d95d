"""A trial's checkpoints and metric spool kept in object storage too (`storage:`;
contract/storage.py), so that a node that never saw the trial's folder resumes it.

Uploading (rank 0, once a checkpoint's local marker is written: on the checkpoint writer's
thread with train.async_checkpoint, else before the save's last barrier): every file the
marker records, then the marker, last. Each object appears whole or not at all (an S3
multipart upload is committed by its last request), so an upload cut short leaves
objects without a marker, and a folder without a marker is never a checkpoint. Then the
remote checkpoints beyond train.keep_checkpoints are removed, each marker first. An upload
that fails is a warning: the checkpoint stays local and the next one is uploaded.

Fetching (every rank of a node before the process group, the first under a lock): the
newest remote checkpoint newer than every complete local one, downloaded into a staging
folder (not a `step*` name: never a candidate), verified by its marker's checksums and
pickle check (jobs.training.checkpoint.verify), then renamed into place. One without its
marker, with a file missing or with a file that does not match is skipped with a one-line
warning, never loaded; the next older is tried.

Each run's spool (jobs/tracking/outbox.py: the writes and how far MLflow has received
them) goes up beside the checkpoints, at every checkpoint and at the trial's end, and comes
down where the trial folder has none, so what MLflow had not received when the node went
is sent from the next one; the spool's positions keep the resumed job from spooling a
replayed step again. A remote spool that is not whole lines of spool writes, or a `sent`
that is not an offset at a line's end of it, is skipped with one warning line like a bad
checkpoint, never failing the attempt: the spool is left out, a bad `sent` counts as 0.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
from pydantic import ValidationError

from scalelab.contract.storage import CHECKPOINTS_DIR, trial_prefix
from scalelab.jobs.object_store import Objects
from scalelab.jobs.tracking.outbox import OUTBOX_DIR
from scalelab.jobs.training import checkpoint
from scalelab.jobs.training.checkpoint import MARKER

log = logging.getLogger(__name__)
TAG = re.compile(r"^step\d{8}$")
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
FETCH_LOCK = "fetch.lock"
STAGING_PREFIX = ".remote-"  # a download in progress (in ckpt/)


class Storage(Objects):
    """One trial's folder in the storage at `uri`."""

    def __init__(self, uri: str, trial_id: str) -> None:
        super().__init__(uri)
        self.uri = f"{self.base_uri}/trials/{trial_id}"  # for messages
        self.root = trial_prefix(self.base, trial_id)

    # -- checkpoints --------------------------------------------------------------------
    def upload(self, tag_dir: Path, keep: int) -> None:
        """Upload the complete checkpoint `tag_dir`, its marker last, and prune the older
        remote ones to `keep`. Never raises: a failure leaves the checkpoint local only."""
        try:
            marker = checkpoint.read_marker(tag_dir)
            dest = self._ckpt(tag_dir.name)
            self._delete_checkpoint(tag_dir.name)  # a step saved again: its marker goes first
            for name in sorted(marker.files):
                self._put_file(tag_dir / name, f"{dest}/{name}")
            self._put_file(tag_dir / MARKER, f"{dest}/{MARKER}")
            self._prune(keep, tag_dir.name)
        except Exception as e:
            log.warning("uploading checkpoint %s to %s failed (kept locally): %s: %s",
                        tag_dir.name, self.uri, type(e).__name__, e)  # fmt: skip

    def uploader(self, trial_dir: Path, keep: int) -> Callable[[Path], None]:
        """What rank 0 calls with a checkpoint just marked complete (checkpoint.save's
        `then`): it, then the spools as of now, go up."""

        def uploaded(tag_dir: Path) -> None:
            self.upload(tag_dir, keep)
            self.upload_spools(trial_dir)

        return uploaded

    def _prune(self, keep: int, current: str) -> None:
        tags = self._tags()
        complete = [t for t in tags if self._exists(f"{self._ckpt(t)}/{MARKER}")]
        for tag in complete[:-keep]:
            self._delete_checkpoint(tag)
        for tag in tags:  # uploads cut short: objects without a marker
            if tag not in complete and tag != current:
                self._delete_checkpoint(tag)

    def fetch(self, ckpt_dir: Path) -> list[str]:
        """Download the newest remote checkpoint that is newer than every complete local
        one and verifies; returns one line per remote checkpoint skipped. Every rank of a
        node may call it: the first does the work, the others then find it done."""
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        with checkpoint.exclusive(ckpt_dir / FETCH_LOCK):
            local = checkpoint.latest(ckpt_dir)
            skipped = []
            for tag in reversed(self._tags()):
                if local is not None and tag <= local.name:
                    break
                problem = self._fetch_one(tag, ckpt_dir)
                if not problem:
                    log.warning("resuming from %s/%s/%s", self.uri, CHECKPOINTS_DIR, tag)
                    break
                line = f"remote {tag} skipped: {problem}"
                log.warning("checkpoint in %s: %s", self.uri, line)
                skipped.append(line)
            return skipped

    def _fetch_one(self, tag: str, ckpt_dir: Path) -> str:
        """Download `tag` into place; the problem that kept it out ('' if none)."""
        src = self._ckpt(tag)
        staging = ckpt_dir / (STAGING_PREFIX + tag)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            try:
                self._get_file(f"{src}/{MARKER}", staging / MARKER)
            except FileNotFoundError:
                return "no marker (an upload cut short)"
            try:
                names = checkpoint.read_marker(staging).files
            except ValidationError as e:
                return f"its marker is not a record with checksums: {e.errors()[0]['msg']}"
            for name in names:  # only the recorded names (checked: no path in them)
                try:
                    self._get_file(f"{src}/{name}", staging / name)
                except FileNotFoundError:
                    return f"{name} is missing"
            problem = checkpoint.verify(staging)
            if problem:
                return problem
            shutil.rmtree(ckpt_dir / tag, ignore_errors=True)  # an unmarked local save
            staging.rename(ckpt_dir / tag)
            return ""
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _tags(self) -> list[str]:
        """The remote checkpoint folders, oldest first."""
        found = self.fs.get_file_info(
            pafs.FileSelector(f"{self.root}/{CHECKPOINTS_DIR}", allow_not_found=True)
        )
        return sorted(i.base_name for i in found if TAG.match(i.base_name))

    def _ckpt(self, tag: str) -> str:
        return f"{self.root}/{CHECKPOINTS_DIR}/{tag}"

    def _delete_checkpoint(self, tag: str) -> None:
        marker = f"{self._ckpt(tag)}/{MARKER}"
        if self._exists(marker):
            self.fs.delete_file(marker)
        if self.fs.get_file_info(self._ckpt(tag)).type == pafs.FileType.Directory:
            self.fs.delete_dir(self._ckpt(tag))  # the folder too: no empty one stays listed

    # -- the spools ----------------------------------------------------------------------
    def upload_spools(self, trial_dir: Path) -> None:
        """Rank 0: every run's spool up to its last complete line (the job may be
        appending), then how far it was sent. Never raises."""
        try:
            for box in sorted((trial_dir / OUTBOX_DIR).glob("*/")):
                if not RUN_ID.match(box.name):
                    continue
                sent = _read(box / "sent")  # before the spool: it never passes the copy's end
                self._put_bytes(_complete_lines(_read(box / "spool.jsonl")),
                                f"{self.root}/{OUTBOX_DIR}/{box.name}/spool.jsonl")  # fmt: skip
                self._put_bytes(sent, f"{self.root}/{OUTBOX_DIR}/{box.name}/sent")
        except Exception as e:
            log.warning("uploading the metric spool to %s failed: %s: %s",
                        self.uri, type(e).__name__, e)  # fmt: skip

    def fetch_spools(self, trial_dir: Path) -> None:
        """Rank 0, before tracking starts: each run's spool this folder lacks. Never raises:
        a remote object that is not what it should be is skipped with one warning line and
        the trial goes on without it. A spool that is not whole lines of spool writes is
        left out (the resumed job spools from its checkpoint on, as without storage); a
        `sent` that is not an offset at the end of one of the spool's lines is taken as 0:
        the whole spool is sent again, and MLflow's database stores keep a point sent twice
        (same metric, step, time and value) once."""
        try:
            found = self.fs.get_file_info(
                pafs.FileSelector(f"{self.root}/{OUTBOX_DIR}", allow_not_found=True)
            )
        except Exception as e:
            log.warning("fetching the metric spools from %s failed (the trial goes on without "
                        "them): %s: %s", self.uri, type(e).__name__, e)  # fmt: skip
            return
        for info in found:
            box = trial_dir / OUTBOX_DIR / info.base_name
            if not RUN_ID.match(info.base_name) or (box / "spool.jsonl").exists():
                continue
            src = f"{self.root}/{OUTBOX_DIR}/{info.base_name}"
            try:
                spool, sent = self._get_bytes(f"{src}/spool.jsonl"), self._get_bytes(f"{src}/sent")
            except Exception as e:
                log.warning("metric spool %s/%s/%s skipped: %s: %s",
                            self.uri, OUTBOX_DIR, info.base_name, type(e).__name__, e)  # fmt: skip
                continue
            if spool is None:
                continue
            if problem := _spool_problem(spool):
                log.warning("metric spool %s/%s/%s/spool.jsonl skipped: %s",
                            self.uri, OUTBOX_DIR, info.base_name, problem)  # fmt: skip
                continue
            offset, problem = _sent_offset(sent, spool)
            if problem:
                log.warning("metric spool %s/%s/%s/sent skipped: %s; the whole spool is sent "
                            "again", self.uri, OUTBOX_DIR, info.base_name, problem)  # fmt: skip
            box.mkdir(parents=True, exist_ok=True)
            (box / "sent").write_text(str(offset))
            (box / "spool.jsonl").write_bytes(spool)


def for_job(uri: str | None, trial_id: str) -> Storage | None:
    return Storage(uri, trial_id) if uri else None


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _complete_lines(data: bytes) -> bytes:
    return data[: data.rfind(b"\n") + 1]


# the fields each kind of spool write needs (jobs/tracking/outbox.py), and their types
_SPOOL_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "metric": {"key": str, "value": (int, float), "step": int, "tokens": int, "ts": int},
    "param": {"key": str, "value": str},
    "tag": {"key": str, "value": str},
    "status": {"status": str},
}


def _spool_problem(spool: bytes) -> str:
    """Why the bytes of a remote spool are not a spool ('' when they are): each complete
    line one spool write (a last line without its end is left for later, as locally)."""
    for number, raw in enumerate(spool.split(b"\n")[:-1], 1):
        try:
            item = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError too
            return f"line {number} is not JSON"
        fields = _SPOOL_FIELDS.get(item.get("kind")) if isinstance(item, dict) else None
        if fields is None or not all(
            isinstance(item.get(k), t) and not isinstance(item.get(k), bool)
            for k, t in fields.items()
        ):
            return f"line {number} is not a spool write"
    return ""


def _sent_offset(sent: bytes | None, spool: bytes) -> tuple[int, str]:
    """How far the spool reached MLflow, from the remote `sent` (absent: 0), and why that
    object was not taken ('' when it was)."""
    if not sent:
        return 0, ""
    try:
        offset = int(sent.decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError too
        return 0, f"{sent[:40]!r} is not a byte offset"
    if offset < 0 or offset > len(spool) or (offset and spool[offset - 1 : offset] != b"\n"):
        return 0, f"{offset} is not the end of a line of the {len(spool)}-byte spool"
    return offset, ""
