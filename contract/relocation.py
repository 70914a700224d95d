"""A runs folder that travels (docs/architecture.md, 'Work directory').

MLflow's sqlite store keeps absolute artifact locations: an experiment's
`artifact_location` and every run's `artifact_uri` name `file:///<home>/artifacts/...`. A
copied or moved `$SCALELAB_HOME` (a cluster's folder brought to a laptop) would go on
writing reports, plots and evaluations into the original folder, or fail where it is gone.
So the home records where it is (`home.path`); opened anywhere else, the store's artifact
locations under the old home are rewritten to the new one, in one transaction, and the
record follows (a store older than the record tells where it was by its experiments'
artifact locations; a folder without a store records nothing, so a dry run writes nothing). Locations outside the home (a team's server, object storage) are left as
they are. Idempotent: two processes opening a moved home at once rewrite nothing twice.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

MARKER = "home.path"


def follow_moved_home(home: Path, database: Path) -> None:
    """Rewrite the artifact locations of `database` when `home` was recorded elsewhere."""
    marker = home / MARKER
    here = str(home)
    try:
        recorded = marker.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        if not database.exists():
            return  # no store yet, nothing to follow (and nothing written: a dry run)
        recorded = _home_in_store(database)  # a store older than the marker
    except OSError:
        return  # an unreadable marker: leave the store as it is
    if recorded == here:
        return
    if recorded and database.exists():
        moved = _rewrite(database, Path(recorded).as_uri(), home.as_uri())
        if moved:
            print(f"scalelab: this runs folder was at {recorded}; {moved} artifact "
                  f"location(s) now point into {here}", file=sys.stderr)  # fmt: skip
    tmp = marker.with_name(f"{MARKER}.{id(marker)}.tmp")
    try:
        tmp.write_text(here + "\n", encoding="utf-8")
        tmp.replace(marker)
    except OSError:
        pass  # a read-only copy: it is read where it is, nothing is written


def _home_in_store(database: Path) -> str | None:
    """The folder the store's artifacts were under (`<home>/artifacts`), read from its
    experiments; None when it names none."""
    from urllib.parse import unquote, urlparse

    try:
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)
        try:
            rows = connection.execute("SELECT artifact_location FROM experiments").fetchall()
        finally:
            connection.close()
    except sqlite3.Error:
        return None
    for (location,) in rows:
        url = urlparse(location or "")
        if url.scheme == "file" and url.path.rstrip("/").endswith("/artifacts"):
            return str(Path(unquote(url.path)).parent)
    return None


def _rewrite(database: Path, old: str, new: str) -> int:
    """`old` -> `new` at the start of every artifact location; how many were moved."""
    old, new = old.rstrip("/") + "/", new.rstrip("/") + "/"
    connection = sqlite3.connect(database, timeout=30)
    try:
        with connection:  # one transaction
            tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
            moved = 0
            for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
                if table not in tables:
                    continue
                cursor = connection.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                    f"WHERE substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, len(old), old),
                )
                moved += cursor.rowcount
            return moved
    except sqlite3.Error:
        return 0  # not a store we can rewrite: MLflow says what is wrong with it
    finally:
        connection.close()
