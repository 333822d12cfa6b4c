"""Hot pauses (docs/storage.md "Hot pauses and kept layer images"): a sandbox paused with a
full snapshot stays frozen in memory for --pause-hot-s, so a resume from that snapshot is a
thaw of the same processes instead of a CRIU restore. The snapshot is committed before the
pause answers, so nothing depends on the frozen copy: it ends when it ages, when its memory
bound is reached, when the sandbox is resumed from another snapshot, and with coved (a crash
leaves an ordinary paused sandbox that resumes from the store). And kept layer images: a
resume on the node that captured a snapshot clones the layer image it was captured from.

Seen from the host: the counter's process (found by its command line and the sandbox's
cgroup) and its file through /proc/<pid>/root, which the frozen process cannot change. Needs
a working criu >= 4, like tests/integration/test_full_snapshots.py."""
import glob
import os
import subprocess
import time

import pytest
from cove import poll
from test_full_snapshots import count, need_full, new_sandbox, start_counter

pytestmark = pytest.mark.root


def host_pids(sid, needle=b"/tmp/cnt;"):
    """Host pids of the sandbox's processes whose command line has needle, without their
    children that have not exec'd yet (the counter's fork for mv or sleep, frozen at the
    dump before its exec, shows the same command line)."""
    found = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if needle in open(f"/proc/{p}/cmdline", "rb").read() and \
                    sid in open(f"/proc/{p}/cgroup").read():
                status = open(f"/proc/{p}/status").read()
                found[int(p)] = int(status.split("PPid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return sorted(p for p, pp in found.items() if pp not in found)


def host_count(pid):
    """The counter's file as its own process sees it (its root, from the host)."""
    try:
        return int(open(f"/proc/{pid}/root/tmp/cnt").read().strip() or 0)
    except (OSError, ValueError):
        return None


def cpu_ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])  # utime + stime


def thaws(d, sid):
    return [e for e in d.log_lines() if e.get("event") == "sandbox.resume" and sid in e["msg"]
            and "a thaw of its hot pause" in e["msg"]]


def test_a_hot_paused_sandbox_is_frozen_and_resumes_by_a_thaw(coved):
    c = coved.client
    need_full(c)
    sid = new_sandbox(c)
    try:
        start_counter(c, sid)
        (pid,) = host_pids(sid)
        p = c.post(f"/v1/sandboxes/{sid}/pause")
        assert p["sandbox"]["state"] == "paused" and p["snapshot"]["kind"] == "full", p
        # the snapshot is committed before the answer: listed, and the pause names it
        snaps = c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]
        assert snaps[0]["id"] == p["snapshot"]["id"] == c.sandbox(sid)["last_snapshot_id"]
        # the process is still there, frozen: over a window in which the running counter
        # moves ~20 times (0.05 s a step), neither its file nor its CPU time moves
        assert host_pids(sid) == [pid]
        v0, t0 = host_count(pid), cpu_ticks(pid)
        assert v0 is not None and v0 >= 5
        time.sleep(1.0)  # a window of no progress: there is no condition to await
        assert (host_count(pid), cpu_ticks(pid)) == (v0, t0)
        c.expect_error("GET", f"/v1/sandboxes/{sid}/processes", 409, "conflict")
        # resume: the same host process goes on from where it was frozen
        assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
        assert thaws(coved, sid), "the resume was not a thaw"
        poll(lambda: (host_count(pid) or 0) > v0 + 3, what="the thawed counter to go on")
        assert host_pids(sid) == [pid]
        first = count(c, sid)
        assert first > v0  # through the API too, and not a process started afresh at 1
        assert c.exec(sid, "echo fresh")["stdout"] == "fresh\n"
        # a second pause/resume round works the same way
        c.post(f"/v1/sandboxes/{sid}/pause")
        c.post(f"/v1/sandboxes/{sid}/resume")
        assert len(thaws(coved, sid)) == 2
        poll(lambda: count(c, sid) > first + 3, what="the counter after the second thaw")
    finally:
        c.remove(sid, purge=True)
    assert host_pids(sid) == []  # DELETE of it ends the process


def test_resume_from_another_snapshot_drops_the_frozen_copy(coved):
    c = coved.client
    need_full(c)
    sid = new_sandbox(c)
    try:
        sf = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"}, expect=201)
        start_counter(c, sid)
        (pid,) = host_pids(sid)
        c.post(f"/v1/sandboxes/{sid}/pause")
        assert host_pids(sid) == [pid]
        c.post(f"/v1/sandboxes/{sid}/resume", {"snapshot_id": sf["id"]})
        assert not thaws(coved, sid)
        # the files snapshot from before the counter: no counter, no file, no frozen copy
        assert host_pids(sid) == [] and count(c, sid) == 0
    finally:
        c.remove(sid, purge=True)


def test_a_hot_pause_ages_into_a_stored_one(coved_factory):
    d = coved_factory(extra_args=("--pause-hot-s", "1"))
    c = d.client
    need_full(c)
    sid = new_sandbox(c)
    start_counter(c, sid)
    (pid,) = host_pids(sid)
    c.post(f"/v1/sandboxes/{sid}/pause")
    v = host_count(pid)
    poll(lambda: [e for e in d.log_lines() if e.get("event") == "sandbox.pause"
                  and sid in e["msg"] and "aged past" in e["msg"]],
         what="the hot pause to end after --pause-hot-s", timeout=60)
    assert host_pids(sid) == []  # its instance was stopped before that was logged
    c.post(f"/v1/sandboxes/{sid}/resume")
    assert not thaws(d, sid)  # restored from the store: the counter goes on from the snapshot
    first = poll(lambda: count(c, sid), what="the restored counter")
    assert v <= first <= v + 40, (v, first)
    poll(lambda: count(c, sid) > first + 3, what="the restored counter to keep counting")
    c.remove(sid, purge=True)


def test_hot_pauses_off_or_over_their_memory_bound_stop_the_instance(coved_factory):
    for args in (("--pause-hot-s", "0"), ("--pause-hot-mb", "1")):
        d = coved_factory(extra_args=args)
        c = d.client
        need_full(c)
        sid = new_sandbox(c)
        start_counter(c, sid)
        # well over the 1 MiB bound whatever the start itself left charged to the sandbox
        # (its files in the page cache count as its memory)
        r = c.exec(sid, "dd if=/dev/urandom of=/home/fill bs=1M count=8 2>/dev/null")
        assert r["exit_code"] == 0, r
        c.post(f"/v1/sandboxes/{sid}/pause")
        assert host_pids(sid) == [], args  # stopped when the pause answered
        c.post(f"/v1/sandboxes/{sid}/resume")
        assert not thaws(d, sid)
        poll(lambda: count(c, sid) > 0, what="the restored counter")
        c.remove(sid, purge=True)
        d.terminate()


def test_kill9_while_hot_paused_resumes_from_the_snapshot(coved_factory):
    d = coved_factory()
    c = d.client
    need_full(c)
    sid = new_sandbox(c)
    start_counter(c, sid)
    (pid,) = host_pids(sid)
    p = c.post(f"/v1/sandboxes/{sid}/pause")
    v = host_count(pid)
    d.kill9()
    c = d.start()
    # the restart removed the frozen leftover; the sandbox is paused at its pause's snapshot
    poll(lambda: host_pids(sid) == [], what="the frozen leftover to be removed")
    sb = c.sandbox(sid)
    assert sb["state"] == "paused" and sb["last_snapshot_id"] == p["snapshot"]["id"], sb
    c.post(f"/v1/sandboxes/{sid}/resume")
    assert not thaws(d, sid)
    first = poll(lambda: count(c, sid), what="the counter restored from the store")
    assert v <= first <= v + 40, (v, first)  # the snapshot's memory, not a fresh 1
    poll(lambda: count(c, sid) > first + 3, what="the restored counter to keep counting")
    c.remove(sid, purge=True)


def test_a_hot_paused_sandbox_has_no_network(build_dir, templates_dir, log_dir):
    # frozen processes send nothing; the egress link goes too, as at a stop (a socket's
    # kernel state cannot retransmit through it), and comes back with the thaw
    from egressenv import running
    with running(build_dir, templates_dir, log_dir, "hot-egress") as (d, up):
        c = d.client
        need_full(c)
        sid = c.create(template="base", snapshot_interval_s=0,
                       egress={"allow": ["allowed.test"]})["id"]
        try:
            def curl():
                r = c.exec(sid, ["/bin/sh", "-c", "curl -sS -m 10 -o /dev/null "
                                 "-w '%{http_code}' http://allowed.test/"])
                return r["exit_code"], r["stdout"]
            assert curl() == (0, "200")
            start_counter(c, sid)
            (pid,) = host_pids(sid)

            def links():
                out = subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-o", "link"],
                                     capture_output=True, text=True, check=True).stdout
                return sorted(line.split(":")[1].strip().split("@")[0]
                              for line in out.splitlines())
            assert len(links()) == 2, links()  # lo and the egress link
            c.post(f"/v1/sandboxes/{sid}/pause")
            assert links() == ["lo"]
            c.post(f"/v1/sandboxes/{sid}/resume")
            assert thaws(d, sid)
            assert len(links()) == 2, links()
            assert curl() == (0, "200")
        finally:
            c.remove(sid, purge=True)


def kept_images(d, snap_id):
    return glob.glob(os.path.join(d.data, "ns", "lfs", "snap", f"tm-snap-keep-*-{snap_id}-*"))


def test_a_resume_here_clones_the_kept_layer_image(coved_factory):
    # the layer a files snapshot was captured from stays on the node: a resume to it clones
    # that image instead of rebuilding it from the store, with the snapshot's files exactly
    d = coved_factory()
    c = d.client
    sid = new_sandbox(c)
    c.put_file(sid, "/home/a.txt", b"in the snapshot\n")
    sf = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"}, expect=201)
    assert kept_images(d, sf["id"])
    c.put_file(sid, "/home/b.txt", b"after it\n")
    c.exec(sid, "rm /home/a.txt")
    p = c.post(f"/v1/sandboxes/{sid}/pause")["snapshot"]
    c.post(f"/v1/sandboxes/{sid}/resume", {"snapshot_id": sf["id"]})
    cloned = [e for e in d.log_lines() if e.get("event") == "snapshot.restore"
              and sf["id"] in e["msg"] and "kept image" in e["msg"]]
    assert cloned, "the resume rebuilt the layer from the store"
    # the clone is mounted once, by the restore, and the start runs on that mount (as on a
    # store restore's warm layer), not mounted again by the start
    assert cloned[-1]["msg"].endswith(", mounted"), cloned[-1]["msg"]
    assert c.get_file(sid, "/home/a.txt").body == b"in the snapshot\n"
    assert c.request("GET", f"/v1/sandboxes/{sid}/files?path=/home/b.txt").status == 404
    # deleting a snapshot deletes its image; a restart sweeps the others
    assert kept_images(d, p["id"])
    c.delete(f"/v1/snapshots/{p['id']}")
    assert not kept_images(d, p["id"])
    assert kept_images(d, sf["id"])
    d.terminate()
    c = d.start()
    assert not glob.glob(os.path.join(d.data, "ns", "lfs", "snap", "tm-snap-keep-*"))
    c.remove(sid, purge=True)


def test_a_revoked_key_ends_the_hot_pause_and_its_clear_copies(coved_factory):
    """A hot pause holds the sandbox's files in clear (its layer, its kept image): the
    tenant's key revoked, the frozen processes end, the kept images of its sandboxes go, and
    the sandbox stays paused at its snapshot, whose resume the key gate refuses."""
    d = coved_factory()
    admin = d.client
    need_full(admin)
    t = admin.post("/v1/tenants", {}, expect=201)
    c = admin.with_key(admin.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)["key"])
    sid = new_sandbox(c)
    start_counter(c, sid)
    (pid,) = host_pids(sid)
    snap = c.post(f"/v1/sandboxes/{sid}/pause")["snapshot"]
    assert host_pids(sid) == [pid], "the pause was not a hot one"
    mine = os.path.join(d.data, "ns", "lfs", "snap", f"tm-snap-keep-{sid}-*")
    assert glob.glob(mine), "no kept image of the pause's layer: the check below is blind"
    st = c.post("/v1/keys/revoke", {"tenant": t["id"]})
    assert st["state"] == "revoked"
    poll(lambda: host_pids(sid) == [], what="the frozen processes to end with the revocation")
    assert not glob.glob(mine), "a kept image of the revoked tenant's sandbox is left"
    assert c.sandbox(sid)["state"] == "paused"
    assert c.sandbox(sid)["last_snapshot_id"] == snap["id"]
    c.expect_error("POST", f"/v1/sandboxes/{sid}/resume", 403, "key_revoked", body={})
    assert c.sandbox(sid)["state"] == "paused"
    assert not thaws(d, sid)
