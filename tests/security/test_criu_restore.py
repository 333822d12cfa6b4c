"""A full-snapshot restore must not write where the sandbox points it (docs/storage.md "Full
snapshots"). CRIU runs on the host: a path it re-creates at restore (an unlinked-but-open
file, a "ghost file") that goes through a symlink the sandbox planted in its place would
be resolved in the host's filesystem. The attack: open /tmp/gd/<name>, write to it, make it
setuid, unlink it, remove /tmp/gd, put a symlink (absolute, or relative with enough ../ to
climb out of any root) to a host directory there, keep the fd open; then pause + resume,
fork, or snapshot + rewind. Nothing may appear in the host directory (a world-writable one
the test makes, and /tmp), and the sandbox must end running or paused, never in error."""
import ctypes
import os
import secrets
import shutil
import struct
import tempfile

import pytest
from cove import poll

pytestmark = pytest.mark.root

GOOD_STATES = ("running", "paused")


def need_full(c):
    kind = c.snapshot_kind()
    if kind != "full":
        pytest.skip(f"this coved has no full snapshots (/healthz snapshots: {kind}): the "
                    "attack needs a CRIU restore (criu >= 4 and a passing self-check)")


def link_to(host_dir, relative):
    # ../ twenty times reaches / from any root CRIU may have the sandbox's tree under
    return ("../" * 20 + host_dir.lstrip("/")) if relative else host_dir


class Watch:
    """inotify on host directories: every name created, moved or linked into them (CRIU
    creates a ghost as <name>.cr.<id>.ghost and removes it when the restore fails, so a
    look at the directory afterwards could miss it)."""
    IN_CREATE, IN_MOVED_TO, IN_NONBLOCK = 0x100, 0x80, 0o4000

    def __init__(self, dirs):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK | 0o2000000)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.wd = {}
        for d in dirs:
            w = self.libc.inotify_add_watch(self.fd, d.encode(),
                                            self.IN_CREATE | self.IN_MOVED_TO)
            assert w >= 0, (d, os.strerror(ctypes.get_errno()))
            self.wd[w] = d
        self.seen = []

    def names(self):
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return self.seen
            off = 0
            while off + 16 <= len(buf):
                wd, _mask, _cookie, ln = struct.unpack_from("iIII", buf, off)
                name = buf[off + 16:off + 16 + ln].split(b"\0", 1)[0].decode(errors="replace")
                self.seen.append(os.path.join(self.wd.get(wd, "?"), name))
                off += 16 + ln

    def close(self):
        os.close(self.fd)


@pytest.fixture
def host_targets():
    """(world-writable host dir the test made, a fresh file name, Watch of it and /tmp):
    the places a ghost file could land are <dir>/<name>* and /tmp/<name>*; removed after."""
    d = tempfile.mkdtemp(prefix="cove-ghost-", dir="/tmp")
    os.chmod(d, 0o1777)
    name = "cove-ghost-" + secrets.token_hex(6)
    w = Watch([d, "/tmp"])
    yield d, name, w
    w.close()
    shutil.rmtree(d, ignore_errors=True)
    for f in os.listdir("/tmp"):
        if f.startswith(name):
            try:
                os.unlink(os.path.join("/tmp", f))
            except OSError:
                pass


def plant(c, sid, target, name, relative):
    """A ghost file in the sandbox, held open by a sleeping process: /tmp/gd/<name>, then
    /tmp/gd -> target (a host directory)."""
    script = (
        f"set -e; mkdir -p /tmp/gd; exec 7>/tmp/gd/{name}; echo 'ghost payload' >&7; "
        f"chmod 4755 /tmp/gd/{name}; rm /tmp/gd/{name}; rmdir /tmp/gd; "
        f"ln -s {link_to(target, relative)} /tmp/gd; touch /tmp/armed; exec sleep 100000")
    ev = list(c.stream(f"/v1/sandboxes/{sid}/exec", {"shell": script, "tag": "ghost"},
                       max_events=1))
    assert ev and ev[0]["type"] == "start", ev
    poll(lambda: c.exec(sid, "test -e /tmp/armed && echo y")["stdout"] == "y\n",
         what="the ghost file to be planted")
    # the fd is open on a deleted file, through a directory that is now a symlink
    out = c.exec(sid, "ls -l /proc/$(pidof sleep)/fd/7")["stdout"]
    assert "(deleted)" in out, out


def assert_nothing_on_host(targets):
    host_dir, name, watch = targets
    made = [p for p in watch.names() if os.path.basename(p).startswith(name)]
    assert not made, f"a restore wrote {made} on the host (from the sandbox)"
    for d in (host_dir, "/tmp"):
        found = [f for f in os.listdir(d) if f.startswith(name)]
        assert not found, f"a restore left {found} in the host's {d} (from the sandbox)"


def assert_sane(c, sid):
    st = c.sandbox(sid)["state"]
    assert st in GOOD_STATES, f"sandbox {sid} ended {st}"


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
@pytest.mark.parametrize("to_tmp", [False, True], ids=["test-dir", "tmp"])
def test_pause_resume_writes_no_ghost_file_on_the_host(client, coved, host_targets, relative, to_tmp):
    c = client
    need_full(c)
    host_dir, name, _ = host_targets
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        plant(c, sid, "/tmp" if to_tmp else host_dir, name, relative)
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["sandbox"]["state"] == "paused"
        c.request("POST", f"/v1/sandboxes/{sid}/resume")
        assert_nothing_on_host(host_targets)
        assert_sane(c, sid)
        assert c.sandbox(sid)["state"] == "running"
        # the dump was refused (a files snapshot instead), with the reason in the log
        assert r["snapshot"]["kind"] == "files", r["snapshot"]
        warn = [e for e in coved.log_lines()
                if e.get("event") == "snapshot.full" and sid in e.get("msg", "")]
        assert warn and "deleted" in warn[-1]["msg"], warn[-1:]
    finally:
        c.remove(sid, purge=True)
    assert_nothing_on_host(host_targets)


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
@pytest.mark.parametrize("to_tmp", [False, True], ids=["test-dir", "tmp"])
def test_fork_writes_no_ghost_file_on_the_host(client, host_targets, relative, to_tmp):
    c = client
    need_full(c)
    host_dir, name, _ = host_targets
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    forks = []
    try:
        plant(c, sid, "/tmp" if to_tmp else host_dir, name, relative)
        r = c.request("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1})
        forks = [s["id"] for s in (r.json().get("sandboxes") or [])] if r.status < 300 else []
        assert_nothing_on_host(host_targets)
        assert r.status in (200, 201), (r.status, r.body[:300])
        assert len(forks) == 1
        for s in [sid] + forks:
            assert_sane(c, s)
    finally:
        for s in forks:
            c.remove(s, purge=True)
        c.remove(sid, purge=True)
    assert_nothing_on_host(host_targets)


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
@pytest.mark.parametrize("to_tmp", [False, True], ids=["test-dir", "tmp"])
def test_rewind_writes_no_ghost_file_on_the_host(client, host_targets, relative, to_tmp):
    c = client
    need_full(c)
    host_dir, name, _ = host_targets
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        plant(c, sid, "/tmp" if to_tmp else host_dir, name, relative)
        snap = c.post(f"/v1/sandboxes/{sid}/snapshots", {}, expect=201)
        c.request("POST", f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": snap["id"]})
        assert_nothing_on_host(host_targets)
        assert_sane(c, sid)
    finally:
        c.remove(sid, purge=True)
    assert_nothing_on_host(host_targets)


UNIX_GHOST = """import os, socket, sys, time
target = sys.argv[1]
os.makedirs("/tmp/sd")
s = socket.socket(socket.AF_UNIX)
s.bind("/tmp/sd/" + sys.argv[2])
s.listen()
os.unlink("/tmp/sd/" + sys.argv[2])
os.rmdir("/tmp/sd")
os.symlink(target, "/tmp/sd")
open("/tmp/armed", "w").close()
time.sleep(100000)
"""

KEEPS = """import os, socket, time
m = os.memfd_create("keep")
os.write(m, b"memory")
s = socket.socket(socket.AF_UNIX)
s.bind("/tmp/ok.sock")
s.listen()
f = open("/tmp/open-file", "w")
open("/tmp/armed", "w").close()
time.sleep(100000)
"""


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_unix_socket_name_redirected_by_a_symlink_is_not_restored(client, coved, host_targets,
                                                                    relative):
    # CRIU binds a unix socket's name again at restore: a name whose directory the sandbox
    # replaced by a symlink to a host directory makes the dump fall back to files
    c = client
    need_full(c)
    host_dir, name, _ = host_targets
    sid = c.create(template="base", snapshot_interval_s=0)["id"]
    try:
        c.put_file(sid, "/tmp/ug.py", UNIX_GHOST.encode())
        ev = list(c.stream(f"/v1/sandboxes/{sid}/exec",
                           {"shell": f"exec python3 /tmp/ug.py {link_to(host_dir, relative)} "
                                     f"{name}"}, max_events=1))
        assert ev and ev[0]["type"] == "start", ev
        poll(lambda: c.exec(sid, "test -e /tmp/armed && echo y")["stdout"] == "y\n",
             what="the socket to be bound and its directory swapped")
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        c.request("POST", f"/v1/sandboxes/{sid}/resume")
        assert_nothing_on_host(host_targets)
        assert c.sandbox(sid)["state"] == "running"
        assert r["snapshot"]["kind"] == "files", r["snapshot"]
        warn = [e for e in coved.log_lines()
                if e.get("event") == "snapshot.full" and sid in e.get("msg", "")]
        assert warn and "unix socket" in warn[-1]["msg"], warn[-1:]
    finally:
        c.remove(sid, purge=True)


def test_memfd_bound_socket_and_open_file_keep_full_snapshots(client):
    # the refusals are narrow: a memfd (no path), a unix socket at its real name and an open
    # file that still has its name are restored as before
    c = client
    need_full(c)
    sid = c.create(template="base", snapshot_interval_s=0)["id"]
    try:
        c.put_file(sid, "/tmp/keeps.py", KEEPS.encode())
        ev = list(c.stream(f"/v1/sandboxes/{sid}/exec", {"shell": "exec python3 /tmp/keeps.py"},
                           max_events=1))
        assert ev and ev[0]["type"] == "start", ev
        poll(lambda: c.exec(sid, "test -e /tmp/armed && echo y")["stdout"] == "y\n",
             what="the memfd, socket and file")
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["snapshot"]["kind"] == "full", r["snapshot"]
        assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
        assert c.exec(sid, "pgrep -f keeps.py >/dev/null && echo up")["stdout"] == "up\n"
    finally:
        c.remove(sid, purge=True)
