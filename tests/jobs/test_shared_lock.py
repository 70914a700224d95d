"""The lock that holds across the nodes of a shared filesystem (jobs/training/shared_lock.py):
which mounts keep the kernel's locks on one node, told from real /proc/self/mountinfo lines,
and the lock file used there, taken over from an owner that is gone but never from one
that lives."""

import json
import socket
import subprocess
import sys
import time

from scalelab.jobs.training.shared_lock import (
    LockFileTiming,
    lock_file_held,
    mount_of,
    node_local_locks,
    parse_mountinfo,
)

MOUNTINFO = r"""
29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
1091 29 0:53 / /lustre/scratch rw,relatime shared:512 - lustre 10.149.0.1@o2ib:10.149.0.2@o2ib:/scratch rw,localflock,lazystatfs,encrypt
1092 29 0:54 / /lustre/project rw,relatime shared:513 - lustre 10.149.0.1@o2ib:/project rw,noflock,lazystatfs
1093 29 0:55 / /lustre/home rw,relatime shared:514 master:7 - lustre 10.149.0.1@o2ib:/home rw,flock,lazystatfs,encrypt
1094 29 0:56 / /mnt/beegfs rw,relatime - beegfs beegfs_nodev rw,relatime,cfgFile=/etc/beegfs/beegfs-client.conf,_netdev
1095 29 0:57 / /mnt/team\040data rw,relatime shared:516 - beegfs beegfs_nodev rw,relatime,cfgFile=/etc/beegfs/team.conf
1096 29 0:58 / /home rw,relatime shared:517 - nfs nas01:/export/home rw,vers=3,rsize=1048576,wsize=1048576,namlen=255,hard,nolock,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.0.0.5,mountvers=3,mountport=20048,mountproto=tcp,local_lock=all,addr=10.0.0.5
1097 29 0:59 / /shared rw,relatime shared:518 - nfs4 nas01:/shared rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.21,local_lock=none,addr=10.0.0.5
1098 29 0:60 / /work rw,relatime shared:519 - nfs nas02:/work rw,vers=3,hard,proto=tcp,local_lock=flock,addr=10.0.0.6
"""


def test_which_mounts_keep_file_locks_on_one_node(tmp_path):
    mounts = {m.mount_point: m for m in parse_mountinfo(MOUNTINFO)}
    assert mounts["/lustre/scratch"].fstype == "lustre"
    assert "localflock" in mounts["/lustre/scratch"].options
    verdicts = {point: node_local_locks(m) for point, m in mounts.items()}
    assert verdicts["/"] == ""  # ext4: a node's own disk, its locks are all there is
    assert "Lustre mounted localflock" in verdicts["/lustre/scratch"]
    assert "Lustre mounted without flock" in verdicts["/lustre/project"]  # noflock
    assert verdicts["/lustre/home"] == ""  # flock: coherent across the clients
    assert "BeeGFS" in verdicts["/mnt/beegfs"] and "BeeGFS" in verdicts["/mnt/team data"]
    assert "NFS mounted local_lock=all,nolock" in verdicts["/home"]
    assert verdicts["/shared"] == ""  # NFSv4: locks are the protocol's, across clients
    assert "NFS mounted local_lock=flock" in verdicts["/work"]

    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    on = {path: mount_of(path, table).mount_point for path in (
        "/lustre/scratch/me/trials/abc/ckpt", "/lustre/scratchpad/ckpt", "/lustre/home",
        "/mnt/team data/ckpt", "/shared/../home/me",
    )}  # fmt: skip
    assert on == {"/lustre/scratch/me/trials/abc/ckpt": "/lustre/scratch",
                  "/lustre/scratchpad/ckpt": "/", "/lustre/home": "/lustre/home",
                  "/mnt/team data/ckpt": "/mnt/team data", "/shared/../home/me": "/home"}  # fmt: skip


def _owned_by(lock, host: str, pid: int) -> None:
    lock.write_text(json.dumps({"host": host, "pid": pid, "since": time.time(), "token": "t"}))


def test_a_lock_file_of_a_dead_converter_is_taken_over(tmp_path):
    """A converter killed while it held the lock file: on its own host its pid is gone and
    the lock is taken at once; from another host, once the file stopped changing."""
    lock = tmp_path / "universal.lock.held"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _owned_by(lock, socket.gethostname(), dead.pid)
    started = time.monotonic()
    with lock_file_held(lock, LockFileTiming(poll_s=0.05, stale_after_s=60)):
        assert time.monotonic() - started < 5  # not the 60 s a silent owner gets
        assert json.loads(lock.read_text())["pid"] != dead.pid
    assert not lock.exists()

    _owned_by(lock, "node-that-died", 12345)
    started = time.monotonic()
    with lock_file_held(lock, LockFileTiming(poll_s=0.05, stale_after_s=1.0)):
        assert 1.0 <= time.monotonic() - started < 5
        assert json.loads(lock.read_text())["host"] == socket.gethostname()
    assert not lock.exists() and not lock.with_name(lock.name + ".break").exists()


HOLDER = """
import sys, time
from pathlib import Path
from scalelab.jobs.training.shared_lock import LockFileTiming, lock_file_held
with lock_file_held(Path(sys.argv[1]), LockFileTiming(heartbeat_s=0.2)):
    print("held", flush=True)
    time.sleep(2.5)
    print(time.time(), flush=True)
"""


def test_a_lock_file_whose_owner_lives_is_waited_for(tmp_path):
    """A live owner on another node (or here) keeps its file fresh: a waiter that takes a
    file unchanged for 1 s over waits the 2.5 s it is held."""
    lock = tmp_path / "universal.lock.held"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with lock_file_held(lock, LockFileTiming(poll_s=0.05, stale_after_s=1.0)):
            acquired = time.time()
        released = float(holder.stdout.readline())
    finally:
        holder.wait(timeout=30)
    assert acquired >= released
