"""Crash and restart: after kill -9 of coved the sandboxes die on their own, and a restart
on the same data dir reconciles: sandboxes `stopped` with a reason, nothing left on the host
(processes in their uid ranges, cgroups, mounts, loop devices). SIGTERM stops cleanly."""
import glob
import os
import time

import pytest
from cove import poll
from hostutil import loops_under

pytestmark = pytest.mark.root

UID_FIRST = 0x10000000
UID_RANGE = 65536


def host_procs():
    """[(pid, uid, cmdline)] of every host process."""
    out = []
    for st in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(st) as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            with open(st[:-6] + "cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, StopIteration, ValueError):
            continue
        out.append((int(st.split("/")[2]), uid, cmd))
    return out


def procs_in(ranges, ids):
    """Host processes in the uid ranges that are in one of the sandboxes' cgroups: other
    coveds on this host (other test runs) hand out uid ranges of their own, the same ones
    at times, so a uid alone does not say whose sandbox a process is."""
    out = []
    for p, u, c in host_procs():
        if not any(b <= u < b + UID_RANGE for b in ranges):
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                cg = f.read()
        except OSError:
            continue
        if any(f"/{i}" in cg for i in ids):
            out.append((p, u, c))
    return out


def cgroup_dirs(ids):
    return [p for i in ids for p in glob.glob(f"/sys/fs/cgroup/*/cove/{i}") +
            glob.glob(f"/sys/fs/cgroup/cove/{i}")]


def mounts_under(path):
    path = os.path.realpath(path)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == path or mp.startswith(path + "/"):
                out.append(mp)
    return out


def start_sleepers(c, n=3):
    """n sandboxes, each running a long sleep with a marker; returns (ids, uid ranges)."""
    ids, ranges = [], set()
    marker = 900000 + os.getpid() % 90000
    for k in range(n):
        sid = c.create(template="busybox")["id"]
        ids.append(sid)
        ev = c.exec(sid, f"sleep {marker + k}", wait=False, timeout=30)
        assert next(ev)["type"] == "start"
        ev.close()
    for k in range(n):
        found = poll(lambda: [u for _, u, cmd in host_procs() if cmd == f"sleep {marker + k}"],
                     what=f"host process of sleep {marker + k}")
        assert found[0] >= UID_FIRST, "sandbox processes must not run as a host uid below " \
            "the sandbox ranges"
        ranges.add(found[0] - (found[0] - UID_FIRST) % UID_RANGE)
    assert len(ranges) == n, "every sandbox has its own uid range"
    return ids, sorted(ranges)


def assert_host_clean(d, ids, ranges):
    assert procs_in(ranges, ids) == [], "processes left in the sandboxes' uid ranges"
    assert cgroup_dirs(ids) == [], "cgroup dirs left"
    # a lazily unmounted layer frees its loop device when the kernel drops the last
    # reference, which may lag a little: wait for it, with a deadline
    try:
        poll(lambda: loops_under(d.data, ids) == [], timeout=30, what="loop devices detached")
    except AssertionError:
        assert loops_under(d.data, ids) == [], \
            f"loop devices of the sandboxes still attached; {mount_holders(d.data)}"


def mount_holders(path):
    """Which host processes have a mount under path in their mount namespace (a copy of a
    mount in another namespace keeps its filesystem, and so its loop device, alive)."""
    path = os.path.realpath(path)
    mine = os.stat("/proc/self/ns/mnt").st_ino
    out = {}
    for mi in glob.glob("/proc/[0-9]*/mountinfo"):
        pid = mi.split("/")[2]
        try:
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino == mine:
                continue
            with open(mi) as f:
                hits = [line.split()[4] for line in f if path in line]
            if hits:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
                out[pid] = (cmd, hits[:4])
        except OSError:
            continue
    return f"mounts under {path} held in other namespaces by: {out}"


def test_kill9_then_restart_reconciles(coved_factory):
    d = coved_factory()
    c = d.client
    ids, ranges = start_sleepers(c)
    assert procs_in(ranges, ids)
    d.kill9()
    # no coved: the sandboxes must go away by themselves
    poll(lambda: not procs_in(ranges, ids), what="sandbox processes dying after coved's crash")
    c = d.start()
    for sid in ids:
        sb = c.sandbox(sid)
        assert sb["state"] == "stopped", sb
        assert sb.get("error"), sb
        # a stopped sandbox refuses work clearly
        c.expect_error("POST", f"/v1/sandboxes/{sid}/exec", 409, "conflict",
                       body={"shell": "true", "wait": True})
    running = {s["id"] for s in c.get("/v1/sandboxes?state=running")["sandboxes"]}
    assert not running & set(ids)
    assert_host_clean(d, ids, ranges)
    # the data dir holds no mount of a dead sandbox
    assert not [m for m in mounts_under(d.data) if any(i in m for i in ids)], \
        mounts_under(d.data)
    # and a new sandbox works
    sid = c.create(template="busybox")["id"]
    assert c.exec(sid, "echo fresh")["stdout"] == "fresh\n"
    # deleting the stopped ones works too, and removes their state from the data dir (a
    # running sandbox's, the one just made, in the background after DELETE answered)
    for s in ids:
        assert c.remove(s)
    c.remove(sid)

    def left():
        return [os.path.join(r, n) for r, ds, fs in os.walk(d.data) for n in ds + fs
                if any(i in n for i in ids + [sid])]
    try:
        poll(lambda: left() == [], timeout=60, what="the deleted sandboxes' state removed")
    except AssertionError:
        assert left() == [], left()


def test_sigterm_stops_cleanly(coved_factory):
    d = coved_factory()
    c = d.client
    ids, ranges = start_sleepers(c)
    rc = d.terminate(timeout=60)
    assert rc == 0, f"coved exited with {rc} on SIGTERM; log:\n{d.log_tail()}"
    assert_host_clean(d, ids, ranges)
    assert mounts_under(d.data) == [], (mounts_under(d.data), mount_holders(d.data))
    assert loops_under(d.data) == [], (loops_under(d.data), mount_holders(d.data))
    assert not os.path.exists(os.path.join(d.data, "coved.sock")) or True
    # restart: nothing claims to run
    c = d.start()
    for sid in ids:
        assert c.sandbox(sid)["state"] in ("stopped", "error")
    sid = c.create(template="busybox")["id"]
    assert c.exec(sid, "echo ok")["stdout"] == "ok\n"
    c.remove(sid)


def test_sigterm_stops_cleanly_while_a_copy_of_the_mounts_lingers(coved_factory):
    """A process that copied the host's mounts (clone with a new mount namespace, as every
    sandbox's child does until it pivots away) keeps the layers' filesystems, their loop
    devices and so the layer filesystem busy for a while after coved unmounted them: a
    SIGTERM stop waits for that to end rather than leaving the layer filesystem mounted."""
    import subprocess
    d = coved_factory()
    ids, ranges = start_sleepers(d.client, n=2)
    # the copy lives 2 s: longer than the 200 ms coved used to allow, well inside its bound
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "2"])
    try:
        poll(lambda: os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino
             != os.stat("/proc/self/ns/mnt").st_ino, what="the copy of the host's mounts")
        rc = d.terminate(timeout=60)
        assert rc == 0, f"coved exited with {rc} on SIGTERM; log:\n{d.log_tail()}"
    finally:
        holder.wait(timeout=30)
    assert_host_clean(d, ids, ranges)
    assert mounts_under(d.data) == [], (mounts_under(d.data), mount_holders(d.data))


def test_kill9_twice_in_a_row(coved_factory):
    """A crash during the first start after a crash changes nothing. (This found a sandbox
    child cloned while coved died waiting for ever, holding a copy of coved's mounts and
    so every layer's loop device: the child now drops coved's fds and dies with it.)"""
    d = coved_factory()
    ids, ranges = start_sleepers(d.client, n=1)
    d.kill9()
    d.start()
    d.kill9()
    c = d.start()
    assert c.sandbox(ids[0])["state"] == "stopped"
    poll(lambda: not procs_in(ranges, ids), what="no process in the range")
    assert_host_clean(d, ids, ranges)


def test_sigterm_with_open_streams_exits_promptly(coved_factory):
    """Open event streams, a waiting exec, a watch and a half-sent upload do not hold
    coved's shutdown: exit 0, and the host is clean."""
    import socket
    import threading

    d = coved_factory()
    c = d.client
    ids, ranges = start_sleepers(c, n=1)
    sid = ids[0]
    B = f"/v1/sandboxes/{sid}"
    streams = [c.stream(f"{B}/fs/watch?path=/tmp", timeout=120),
               c.exec(sid, "sleep 1000", wait=False, timeout=120)]
    next(streams[1])

    def drain(g):
        try:
            for _ in g:
                pass
        except Exception:  # noqa: BLE001 - the server going away may cut a stream short
            pass

    def wait_exec():
        try:
            c.request("POST", f"{B}/exec", {"shell": "sleep 1000", "wait": True}, timeout=120)
        except Exception:  # noqa: BLE001
            pass

    threads = [threading.Thread(target=drain, args=(g,), daemon=True) for g in streams]
    threads.append(threading.Thread(target=wait_exec, daemon=True))
    for t in threads:
        t.start()
    up = socket.create_connection((c.host, c.port), timeout=60)
    up.sendall((f"PUT {B}/files?path=/tmp/up HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {c.key}\r\nContent-Length: 10000000\r\n\r\n").encode()
               + b"x" * 100000)
    # the waiting exec is running once the process list shows two sleeps
    poll(lambda: len([p for p in c.get(f"{B}/processes")["processes"] if p["running"]]) >= 3,
         what="processes running")
    t0 = time.time()
    rc = d.terminate(timeout=60)
    took = time.time() - t0
    up.close()
    assert rc == 0, f"exit {rc}; log:\n{d.log_tail()}"
    assert took < 30, f"shutdown took {took:.1f} s"
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a client stream still hangs after coved exited"
    assert_host_clean(d, ids, ranges)
    assert mounts_under(d.data) == []


PF_EXITING = 0x4
SIGKILL_BIT = 1 << 8


def dying(pid):
    """The process is gone, a zombie, exiting, or has SIGKILL pending: it never runs user
    code again."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            pend = [int(line.split()[1], 16) for line in f
                    if line.startswith(("SigPnd:", "ShdPnd:"))]
    except OSError:
        return True
    return st[0] in ("Z", "X") or int(st[6]) & PF_EXITING or any(p & SIGKILL_BIT for p in pend)


def test_delete_answers_with_processes_killed_and_a_crash_before_cleanup_leaves_nothing(
        coved_factory, tmp_path):
    """DELETE answers once the sandbox is unreachable and each of its processes is killed
    (SIGKILL pending, exiting, or gone); waiting for them to exit, its unmounts, loop device, cgroups and state dir are left to a background reaper. The test
    hook holds that reaper, coved is killed -9 right after the answer, and the restart's
    reconcile must clean what the reaper never got to: no process, cgroup, mount, loop
    device or state dir of the sandbox is left, and the API does not know the id."""
    hooks = tmp_path / "hooks"
    hooks.write_text("reap_hold_ms 600000\n")
    d = coved_factory(extra_args=["--test-hooks", str(hooks)], env={"COVE_TEST_HOOKS": "1"})
    c = d.client
    ids, ranges = start_sleepers(c, n=1)
    sid = ids[0]
    state = os.path.join(d.data, "sandboxes", sid)
    assert os.path.isdir(state)
    assert c.remove(sid)
    # when DELETE answers: every process of it is killed (or already gone), the id is gone
    alive = [p for p in procs_in(ranges, ids) if not dying(p[0])]
    assert alive == [], f"DELETE answered while sandbox processes still run: {alive}"
    poll(lambda: not procs_in(ranges, ids), what="the killed sandbox processes exiting")
    c.expect_error("GET", f"/v1/sandboxes/{sid}", 404, "not_found")
    c.expect_error("POST", f"/v1/sandboxes/{sid}/exec", 404, "not_found",
                   body={"shell": "true", "wait": True})
    # the reaper is held: the host side is still there (the window this test crashes in)
    assert cgroup_dirs(ids) and os.path.isdir(state), \
        "the cleanup ran before the answer: the crash below would test nothing"
    d.kill9()
    c = d.start()
    c.expect_error("GET", f"/v1/sandboxes/{sid}", 404, "not_found")
    assert sid not in {s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]}
    assert_host_clean(d, ids, ranges)
    assert not [m for m in mounts_under(d.data) if sid in m], mounts_under(d.data)
    assert not os.path.exists(state), "the deleted sandbox's state dir survived the restart"


def test_delete_cleans_up_in_the_background(coved):
    """Without a crash the reaper finishes the job: after DELETE the cgroups, loop device
    and state dir of the sandbox go."""
    c = coved.client
    ids, ranges = start_sleepers(c, n=1)
    state = os.path.join(coved.data, "sandboxes", ids[0])
    assert c.remove(ids[0])
    assert [p for p in procs_in(ranges, ids) if not dying(p[0])] == []
    poll(lambda: not cgroup_dirs(ids) and not os.path.exists(state), timeout=60,
         what="the reaper removing the deleted sandbox's cgroups and state dir")
    assert_host_clean(coved, ids, ranges)
