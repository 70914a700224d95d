"""A process reading the sqlite store (the MLflow UI, `scalelab status` paging through runs)
while the driver writes it: the store keeps a write-ahead log (jobs/tracking/mlflow_store.py), so
a reader in the middle of a read does not stop the ledger's writes. In sqlite's default
rollback-journal mode the reader's lock held every write back until sqlite gave up with
"database is locked"."""

from __future__ import annotations

import subprocess
import sys

from scalelab.orchestrator.ledger import Ledger

READ_AND_HOLD = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN")
con.execute("SELECT count(*) FROM runs").fetchall()  # a read transaction, left open
print("reading", flush=True)
time.sleep(60)
"""


def test_a_reader_in_the_middle_of_a_read_does_not_hold_back_the_ledger(tmp_path, empty_store):
    db = tmp_path / "mlflow.db"
    uri = empty_store(db)
    ledger = Ledger("reader", tracking_uri=uri)
    run_id = ledger.client.create_run(ledger.experiment_id(create=True)).info.run_id
    reader = subprocess.Popen(
        [sys.executable, "-c", READ_AND_HOLD, str(db)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout.readline().strip() == "reading"
        ledger.set_tags(run_id, {"scalelab.attempts": "1"})
        ledger.set_status(run_id, "SCHEDULED")
        ledger.set_status(run_id, "FINISHED")
        assert reader.poll() is None  # the read was still open through every write
    finally:
        reader.kill()
        reader.wait()
    run = Ledger("reader", tracking_uri=uri).client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["scalelab.attempts"] == "1"
