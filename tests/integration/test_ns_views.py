"""Without lxcfs (not installed, or COVE_LXCFS=off) ns sandboxes still start and work; they
see the host's memory in /proc/meminfo, and coved says why once at start (event
runtime.view). A start detaches the mounts of lxcfs daemons that died."""
import errno
import os
import subprocess
import time

import pytest

from cove import poll

LXCFS = "/usr/bin/lxcfs"
ROOT = "/run/cove-lxcfs"  # runtime/ns.c NS_LXCFS_ROOT


@pytest.mark.root
def test_sandboxes_work_without_lxcfs(coved_factory):
    coved = coved_factory(env={"COVE_LXCFS": "/nonexistent/lxcfs"})
    c = coved.client
    view = [ln for ln in coved.log_lines() if ln.get("event") == "runtime.view"]
    assert len(view) == 1 and view[0]["level"] == "warn" and \
        "COVE_LXCFS" in view[0]["msg"], view
    sb = c.create(template="busybox", memory_mb=128, cpus=1)
    try:
        r = c.exec(sb["id"], "grep MemTotal /proc/meminfo; nproc")
        assert r["exit_code"] == 0, r
        with open("/proc/meminfo") as f:
            host = f.readline().split()[1]
        mem, nproc = r["stdout"].split("\n")[:2]
        assert mem.split()[1] == host, "without lxcfs the view is the host's"
        assert nproc == "1", "the cpuset pins the sandbox to its CPUs all the same"
    finally:
        c.remove(sb["id"])


def _mounted(mp):
    with open("/proc/self/mountinfo") as f:
        return any(ln.split()[4] == mp for ln in f)


def _lxcfs(mp, pidfile):
    os.makedirs(mp, exist_ok=True)
    p = subprocess.Popen([LXCFS, "--foreground", "--pidfile", pidfile, mp],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    poll(lambda: os.path.exists(os.path.join(mp, "proc/meminfo")), timeout=30,
         what=f"lxcfs mounted at {mp}")
    return p


@pytest.mark.root
@pytest.mark.skipif(not os.access(LXCFS, os.X_OK), reason=f"{LXCFS} not installed")
def test_a_start_detaches_dead_lxcfs_mounts_and_leaves_live_ones(coved_factory, tmp_path):
    """An lxcfs mount point whose daemon died (a coved killed with SIGKILL whose data dir was
    then deleted: no start on it will reap it) stays in the host's mount table, which every
    sandbox start copies. A coved's start detaches such dead mounts under /run/cove-lxcfs and
    leaves a live one (another coved's) serving."""
    tag = f"test-{os.getpid()}-{time.time_ns()}"
    dead, live = f"{ROOT}/{tag}-dead", f"{ROOT}/{tag}-live"
    procs = []
    try:
        d = _lxcfs(dead, str(tmp_path / "dead.pid"))
        procs.append(d)
        d.kill()
        d.wait()
        with pytest.raises(OSError) as e:
            os.statvfs(dead)
        assert e.value.errno == errno.ENOTCONN, e.value
        assert _mounted(dead)
        procs.append(_lxcfs(live, str(tmp_path / "live.pid")))
        coved_factory()
        assert not _mounted(dead), "the dead lxcfs mount is still in the host's mount table"
        assert not os.path.exists(dead)
        assert _mounted(live), "a live lxcfs mount was detached"
        with open(os.path.join(live, "proc/meminfo")) as f:
            assert f.readline().startswith("MemTotal:")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        for mp in (dead, live):
            subprocess.run(["umount", "-l", mp], capture_output=True)
            try:
                os.rmdir(mp)
            except OSError:
                pass
