"""Resource attacks stay inside their sandbox: a fork bomb hits pids.max, a memory bomb is
OOM-killed inside (PID 1 survives), a disk fill stops at disk_mb with ENOSPC. Meanwhile
coved and other sandboxes stay responsive. Bounds are generous (2 shared cores)."""
import os
import time

import pytest

from hostutil import cgroup_file
from secutil import read_kv, sh


def _du_bytes(path):
    """Allocated bytes under path, on its own filesystem only (a sandbox's loop-mounted
    layer is counted once, as its image file)."""
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [n for n in dirs if not os.path.ismount(os.path.join(root, n))]
        for n in dirs + files:
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            total += st.st_blocks * 512
    return total


def _wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.time() > deadline:
            pytest.fail(f"{what} not within {timeout} s")
        time.sleep(0.2)


@pytest.mark.root
@pytest.mark.slow
def test_fork_bomb_contained(client, coved):
    bomb = client.create(template="busybox")
    other = client.create(template="busybox")
    try:
        sid = bomb["id"]
        ev = cgroup_file(sid, "pids", "pids.events")
        mx = cgroup_file(sid, "pids", "pids.max")
        if not ev or not mx:
            pytest.skip("no pids cgroup for the sandbox on this host")
        limit = open(mx).read().strip()
        assert limit != "max", "the sandbox has no pids limit"
        sh(client, sid, "(f(){ f|f& }; f) >/dev/null 2>&1 </dev/null &")
        # the bomb runs into pids.max (the kernel counts refused forks in pids.events)
        _wait_for(lambda: read_kv(ev).get("max", 0) > 0, 120, "pids.max reached")
        cur = cgroup_file(sid, "pids", "pids.current")
        assert int(open(cur).read()) <= int(limit)
        # coved and another sandbox still answer while the bomb runs
        t = time.time()
        assert client.request("GET", "/healthz", auth=False, timeout=30).status == 200
        assert sh(client, other["id"], "echo fine", timeout=60)["stdout"] == "fine\n"
        assert time.time() - t < 60, "coved too slow while a fork bomb runs"
        # deleting the bomb's sandbox kills it
        client.remove(sid)
        _wait_for(lambda: cgroup_file(sid, "pids", "pids.current") is None or
                  int(open(cgroup_file(sid, "pids", "pids.current")).read() or 0) == 0,
                  60, "bomb processes gone after DELETE")
        assert sh(client, other["id"], "echo still")["stdout"] == "still\n"
    finally:
        client.remove(bomb["id"])
        client.remove(other["id"])


@pytest.mark.root
@pytest.mark.slow
def test_memory_bomb_oom_killed_inside(client, coved):
    sb = client.create(template="busybox", memory_mb=64)
    try:
        sid = sb["id"]
        r = sh(client, sid, "head -c 2000m /dev/zero | tail > /dev/null; echo rc=$?",
               timeout=300)
        # tail, which buffers everything, is OOM-killed: 128 + SIGKILL
        assert "rc=137" in r["stdout"], f"memory bomb not killed by the OOM killer: {r}"
        # PID 1 (the guest) survived and the sandbox still execs
        r = sh(client, sid, "cat /proc/1/cmdline | tr '\\0' ' '; echo; echo alive")
        assert r["stdout"].startswith("/dev/.cove-guest") and r["stdout"].endswith("alive\n"), r
        # the OOM happened in the workload's own group (cove/<id>/work), where it is counted
        oc = cgroup_file(f"{sid}/work", "memory", "memory.events") or \
            cgroup_file(f"{sid}/work", "memory", "memory.oom_control")
        if oc:
            assert read_kv(oc).get("oom_kill", 1) >= 1, f"{oc}: {open(oc).read()}"
        assert coved.alive()
    finally:
        client.remove(sb["id"])


@pytest.mark.root
@pytest.mark.slow
def test_disk_fill_stops_at_disk_mb(coved_factory):
    # a coved of its own without warm pools, so the data dir grows only by this sandbox
    coved = coved_factory(extra_args=["--pool", "0"])
    client = coved.client
    sb = client.create(template="busybox", disk_mb=64)
    try:
        sid = sb["id"]
        before = _du_bytes(coved.data)
        r = sh(client, sid, "dd if=/dev/zero of=/big bs=1M 2>&1; echo rc=$?; sync",
               timeout=300)
        out = r["stdout"]
        assert "No space left on device" in out and "rc=0" not in out, \
            f"disk fill not stopped with ENOSPC: {out[-500:]}"
        grown = _du_bytes(coved.data) - before
        assert grown <= (64 + 16) << 20, \
            f"the data dir grew by {grown >> 20} MiB for a 64 MiB disk"
        # the sandbox works again once the file is gone
        r = sh(client, sid, "rm /big && dd if=/dev/zero of=/small bs=1M count=4 2>/dev/null"
                            " && echo ok")
        assert r["stdout"] == "ok\n", r
        assert client.request("GET", "/healthz", auth=False).status == 200
    finally:
        client.remove(sb["id"])
