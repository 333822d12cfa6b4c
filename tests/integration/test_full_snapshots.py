"""Full snapshots of ns sandboxes (files + memory + processes, with CRIU; docs/storage.md
"Full snapshots"): a process counting in RAM continues after pause/resume, each fork of a
running process continues on its own, a rewind to a full snapshot brings the process back
as it was, and a coved without CRIU says "files" and keeps files only.

The full-snapshot tests need a working criu >= 4 (scripts/install-deps builds one); when
coved's start-up self-check did not pass they skip, naming what /healthz reported."""
import os

import pytest
from cove import poll

pytestmark = pytest.mark.root

# a shell counting in its own memory: $i lives only in the process; the file is a window
# (written to a temp file and renamed, so that a read never sees it half-written)
COUNTER = ("i=0; while true; do i=$((i+1)); echo $i > /tmp/cnt.t; mv /tmp/cnt.t /tmp/cnt; "
           "echo n=$i; sleep 0.05; done")


def need_full(c):
    kind = c.snapshot_kind()
    if kind != "full":
        pytest.skip(f"this coved has no full snapshots (/healthz snapshots: {kind}): criu >= 4 "
                    "missing or its self-check failed (coved's log, event snapshot.full)")


def count(c, sid):
    r = c.request("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/cnt")
    if r.status != 200:
        return 0
    try:
        return int(r.body.decode().strip() or 0)
    except ValueError:  # read between truncate and write
        return 0


def start_counter(c, sid, past=5):
    """Starts COUNTER in the background (the stream is dropped; the process runs on)."""
    ev = list(c.stream(f"/v1/sandboxes/{sid}/exec", {"shell": COUNTER, "tag": "counter"},
                       max_events=1))
    assert ev and ev[0]["type"] == "start", ev
    poll(lambda: count(c, sid) >= past, what=f"the counter to pass {past}")
    return ev[0]["pid"]


def sandbox_pids(c, sid, needle="/tmp/cnt;"):
    """Pids (in the sandbox) of processes whose command line has needle, from ps there."""
    out = c.exec(sid, ["ps", "-o", "pid,args"])["stdout"].splitlines()[1:]
    return [int(line.split()[0]) for line in out if needle in line]


def running_cmds(c, sid):
    return [p for p in c.get(f"/v1/sandboxes/{sid}/processes")["processes"]
            if p["running"] and "cnt" in " ".join(p["cmd"])]


def new_sandbox(c):
    return c.create(template="busybox", snapshot_interval_s=0)["id"]


def test_pause_resume_keeps_a_running_process(client):
    c = client
    need_full(c)
    sid = new_sandbox(c)
    try:
        start_counter(c, sid)
        last = count(c, sid)
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["sandbox"]["state"] == "paused"
        assert r["snapshot"]["kind"] == "full" and r["snapshot"]["label"] == "pause"
        assert r["snapshot"]["size_bytes"] > 0
        c.expect_error("GET", f"/v1/sandboxes/{sid}/processes", 409, "conflict")
        sb = c.post(f"/v1/sandboxes/{sid}/resume")
        assert sb["state"] == "running"
        first = poll(lambda: count(c, sid), what="the counter file")
        # the counter goes on from where it was: a process started afresh would begin at 1,
        # and nothing ran past the pause's snapshot (the sandbox stays frozen until stopped)
        assert first >= last >= 5, f"counter {first} after resume, {last} before the pause"
        poll(lambda: count(c, sid) > first + 3, what="the counter to keep counting")
        # the node adopted the restored process: it is listed and its output can be followed
        procs = running_cmds(c, sid)
        assert len(procs) == 1, c.get(f"/v1/sandboxes/{sid}/processes")
        pid = procs[0]["pid"]
        evs = list(c.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after=0", max_events=4))
        outs = [int(x[2:]) for x in c.output(evs).decode().split()]
        assert outs and outs[0] > first - 20, (outs, first)  # its in-memory $i, not a new 1
        # and the sandbox works as before: new processes, files
        assert c.exec(sid, "echo fresh")["stdout"] == "fresh\n"
    finally:
        c.remove(sid, purge=True)


def test_snapshot_kind_on_request(client):
    # POST snapshots with kind: "files" (the short pause of rolling snapshots) where full is the
    # default, "full" explicitly; a rewind to the files one brings the files, not the process
    c = client
    need_full(c)
    sid = new_sandbox(c)
    try:
        start_counter(c, sid)
        sf = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"}, expect=201)
        assert sf["kind"] == "files" and sf["pause_ms"] >= 0
        assert len(running_cmds(c, sid)) == 1  # untouched by the files snapshot
        full = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "full"}, expect=201)
        assert full["kind"] == "full" and full["parent_id"] == sf["id"]
        # a second full snapshot of the same instance (no restore in between) is full too
        full2 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"kind": "full"}, expect=201)
        assert full2["kind"] == "full" and full2["parent_id"] == full["id"]
        c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": sf["id"]})
        assert count(c, sid) >= 5  # the counter's file is back, its process is not
        assert running_cmds(c, sid) == [] and sandbox_pids(c, sid) == []
    finally:
        c.remove(sid, purge=True)


def test_fork_of_a_running_process_diverges(client):
    c = client
    need_full(c)
    sid = new_sandbox(c)
    forks = []
    try:
        start_counter(c, sid)
        r = c.post(f"/v1/sandboxes/{sid}/fork", {"count": 2})
        forks = [s["id"] for s in r["sandboxes"]]
        assert len(forks) == 2 and sid not in forks
        base = {}
        for f in forks:
            base[f] = poll(lambda f=f: count(c, f), what=f"the counter of fork {f}")
            assert base[f] >= 5, f"fork {f}: counter restarted ({base[f]})"
            # a new identity: its own hostname
            assert c.exec(f, "hostname")["stdout"].strip() == f
        # each fork's process goes on by itself, and their states diverge: stop fork 0's
        c.exec(forks[0], "echo only-in-0 > /tmp/mark")
        (p0,) = running_cmds(c, forks[0])  # the restored counter, adopted by the node
        c.post(f"/v1/sandboxes/{forks[0]}/processes/{p0['pid']}/signal", {"signal": "STOP"})
        stopped = poll(lambda: count(c, forks[0]), what="fork 0's counter file")
        poll(lambda: count(c, forks[1]) > base[forks[1]] + 5, what="fork 1 to keep counting")
        assert c.exec(forks[1], "cat /tmp/mark 2>/dev/null || echo none")["stdout"] == "none\n"
        assert c.exec(forks[0], "cat /tmp/mark")["stdout"] == "only-in-0\n"
        assert count(c, forks[0]) == stopped  # fork 0's counter is stopped, fork 1's is not
        assert c.sandbox(sid)["state"] == "running" and count(c, sid) > 0
    finally:
        for f in forks:
            c.remove(f, purge=True)
        c.remove(sid, purge=True)


def test_ten_forks_of_a_full_snapshot_each_run_its_restored_process(client):
    """A fork of 10 restores its ten checkpoints at once (several restores in flight on the
    node): every fork answers, under its own hostname, with the counter restored and going
    on; rounds in a row, so that restores racing each other's helper processes show."""
    c = client
    need_full(c)
    sid = new_sandbox(c)
    forks = []
    try:
        start_counter(c, sid)
        s = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "ten"}, expect=201)
        assert s["kind"] == "full"
        for _ in range(3):
            r = c.ok("POST", f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s["id"], "count": 10},
                     expect=(201,), timeout=300)
            forks = [x["id"] for x in r["sandboxes"]]
            assert len(set(forks)) == 10 and sid not in forks
            for f in forks:
                assert c.sandbox(f)["state"] == "running"
                assert c.exec(f, "hostname")["stdout"].strip() == f
                base = poll(lambda f=f: count(c, f), what=f"the counter of fork {f}")
                assert base >= 5, f"fork {f}: counter restarted ({base})"
                poll(lambda f=f: count(c, f) > base, what=f"fork {f}'s counter to go on")
            for f in forks:
                c.remove(f, purge=True)
            forks = []
    finally:
        for f in forks:
            c.remove(f, purge=True)
        c.remove(sid, purge=True)


def test_rewind_to_a_full_snapshot(client):
    c = client
    need_full(c)
    sid = new_sandbox(c)
    try:
        start_counter(c, sid)
        lo = count(c, sid)  # the snapshot is taken between these two reads
        s1 = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "counting"}, expect=201)
        assert s1["kind"] == "full"
        at_s1 = count(c, sid)
        poll(lambda: count(c, sid) > at_s1 + 40, what="the counter to move on")
        before = count(c, sid)
        r = c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": s1["id"]})
        undo = r["undo_snapshot_id"]
        assert r["sandbox"]["state"] == "running" and undo
        v = poll(lambda: count(c, sid), what="the counter after the rewind")
        # back at the snapshot: near where it was then, not where it was before the rewind
        assert lo <= v <= at_s1 + 2 and v < before, (lo, v, at_s1, before)
        assert len(running_cmds(c, sid)) == 1
        # undo: the state before the rewind comes back, counter included
        c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": undo})
        v2 = poll(lambda: count(c, sid), what="the counter after the undo")
        assert v2 >= before - 5, (v2, before)
    finally:
        c.remove(sid, purge=True)


def test_without_criu_snapshots_are_files(coved_factory):
    d = coved_factory(env={"COVE_CRIU": "off"})
    c = d.client
    assert c.snapshot_kind() == "files"
    assert "cove_full_snapshots 0" in c.request("GET", "/metrics", auth=False).body.decode()
    logs = [e for e in d.log_lines() if e.get("event") == "snapshot.full"]
    assert logs and "COVE_CRIU=off" in logs[-1]["msg"]
    sid = new_sandbox(c)
    try:
        start_counter(c, sid)
        # a full snapshot asked for where the node cannot take one: refused, nothing taken
        e = c.expect_error("POST", f"/v1/sandboxes/{sid}/snapshots", 409, "conflict",
                           body={"kind": "full"})
        assert "cannot take full snapshots" in e["message"], e
        assert c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"] == []
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["snapshot"]["kind"] == "files"
        c.post(f"/v1/sandboxes/{sid}/resume")
        # files only: the counter's file is back, its process is not
        assert count(c, sid) >= 5
        assert running_cmds(c, sid) == []
        assert sandbox_pids(c, sid) == []
    finally:
        c.remove(sid, purge=True)


# in the sandbox: a loopback server, and a client holding a TCP connection through the egress
# proxy to the upstream's echo port (opened with an HTTP request line: the proxy reads its
# Host); on /tmp/go it uses the connection again and says how
LOOP_SERVER = ("import socket\n"
               "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
               "s.bind(('127.0.0.1', 8080)); s.listen(8)\n"
               "while True:\n"
               "    c, _ = s.accept(); c.sendall(b'pong\\n'); c.close()\n")
HOLDER = ("import os, socket, time\n"
          "c = socket.create_connection(('allowed.test', 7000), timeout=10)\n"
          "hello = b'GET / HTTP/1.1\\r\\nHost: allowed.test:7000\\r\\n\\r\\n'\n"
          "c.sendall(hello); got = b''\n"
          "while len(got) < len(hello): got += c.recv(100)\n"
          "open('/tmp/hold.t', 'w').write('connected'); os.rename('/tmp/hold.t', '/tmp/hold')\n"
          "while not os.path.exists('/tmp/go'): time.sleep(0.05)\n"
          "try:\n"
          "    c.sendall(b'b'); r = 'echo' if c.recv(10) == b'b' else 'eof'\n"
          "except OSError as e:\n"
          "    r = 'error %d' % e.errno\n"
          "open('/tmp/hold.t', 'w').write(r); os.rename('/tmp/hold.t', '/tmp/hold')\n")


def test_full_snapshot_of_a_sandbox_with_egress(build_dir, templates_dir, log_dir):
    # criu leaves the network namespace's set-up behind: the restore comes up with loopback
    # only, the node attaches a new egress link, connections through the proxy are closed
    from egressenv import running
    with running(build_dir, templates_dir, log_dir, "full-egress") as (d, up):
        c = d.client
        need_full(c)
        sid = c.create(template="base", snapshot_interval_s=0,
                       egress={"allow": ["allowed.test"]})["id"]
        try:
            def sh_(cmd):
                r = c.exec(sid, ["/bin/sh", "-c", cmd])
                return r["exit_code"], r["stdout"]
            c.put_file(sid, "/tmp/srv.py", LOOP_SERVER.encode())
            c.put_file(sid, "/tmp/hold.py", HOLDER.encode())
            for f in ("srv", "hold"):
                ev = list(c.stream(f"/v1/sandboxes/{sid}/exec",
                                   {"shell": f"exec python3 /tmp/{f}.py", "tag": f},
                                   max_events=1))
                assert ev and ev[0]["type"] == "start", ev
            poll(lambda: sh_("cat /tmp/hold")[1] == "connected", what="the held connection")
            ping = ("python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', "
                    "8080), timeout=5); print(s.recv(10).decode(), end='')\"")
            poll(lambda: sh_(ping + " 2>/dev/null")[1] == "pong\n", what="the loopback server")
            start_counter(c, sid)
            last = count(c, sid)
            r = c.post(f"/v1/sandboxes/{sid}/pause")
            assert r["snapshot"]["kind"] == "full", r["snapshot"]
            assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
            first = poll(lambda: count(c, sid), what="the counter file")
            assert first >= last >= 5, (first, last)
            # loopback is up and the restored listener answers
            assert sh_(ping) == (0, "pong\n")
            # the new egress link: the policy holds (allowed works, other refused)
            rc, out = sh_("curl -sS -m 10 http://allowed.test/")
            assert rc == 0 and out, out
            assert sh_("curl -sS -m 5 http://other.test/ >/dev/null 2>&1; echo $?")[1] != "0\n"
            # the connection held across the pause comes back closed (its peer did not wait),
            # an error for its process, not a hang
            sh_("touch /tmp/go")
            res = poll(lambda: (lambda v: v if v not in ("", "connected") else None)(
                sh_("cat /tmp/hold")[1]), what="the held connection's fate")
            assert res != "echo", res
            # a socket bound to the link's address cannot be bound again at restore: files
            c.put_file(sid, "/tmp/udp.py", b"import socket, time\n"
                       b"u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                       b"u.connect(('allowed.test', 9999)); open('/tmp/udp', 'w').close()\n"
                       b"time.sleep(3600)\n")
            list(c.stream(f"/v1/sandboxes/{sid}/exec", {"shell": "exec python3 /tmp/udp.py"},
                          max_events=1))
            poll(lambda: sh_("test -e /tmp/udp && echo y")[1] == "y\n", what="the UDP socket")
            s = c.post(f"/v1/sandboxes/{sid}/snapshots", {}, expect=201)
            assert s["kind"] == "files", s
            warn = [e for e in d.log_lines()
                    if e.get("event") == "snapshot.full" and sid in e["msg"]]
            assert warn and "link address" in warn[-1]["msg"], warn[-1:]
            assert len(running_cmds(c, sid)) == 1  # the refused dump left the counter alone
        finally:
            c.remove(sid, purge=True)


def test_a_restored_sandbox_keeps_its_confinement(client):
    # what CRIU restores must be the same box: seccomp, the user namespace map's shape, the
    # read-only /dev and guest binary, a writable root owned by the sandbox's root, its cgroup
    c = client
    need_full(c)
    sid = new_sandbox(c)
    try:
        start_counter(c, sid)
        probe = ("grep Seccomp: /proc/self/status; grep Seccomp: /proc/{pid}/status;"
                 " cat /proc/self/uid_map; touch /dev/x 2>&1 | grep -c Read-only;"
                 " echo data > /root-owned && stat -c '%u %g' /root-owned;"
                 " echo x >> /dev/.cove-guest 2>/dev/null || echo guest-ro")
        (pid,) = sandbox_pids(c, sid)
        before = c.exec(sid, probe.format(pid=pid))["stdout"].split("\n")
        c.post(f"/v1/sandboxes/{sid}/pause")
        c.post(f"/v1/sandboxes/{sid}/resume")
        assert sandbox_pids(c, sid) == [pid]  # the same process, the same pid
        after = c.exec(sid, probe.format(pid=pid))["stdout"].split("\n")
        assert after[0].split() == ["Seccomp:", "2"], after
        assert after[1].split() == ["Seccomp:", "2"], after  # the restored process too
        assert after[2].split()[0::2] == ["0", "65536"], after  # root ↔ a private range
        assert after[3:6] == ["1", "0 0", "guest-ro"], after
        assert before[3:6] == after[3:6]
        # seen from the host: the restored counter is in the sandbox's cgroup
        hosts = []
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and b"/tmp/cnt;" in open(f"/proc/{p}/cmdline", "rb").read():
                    hosts.append(open(f"/proc/{p}/cgroup").read())
            except OSError:
                pass
        mine = [h for h in hosts if sid in h]
        assert len(mine) == 1, hosts
    finally:
        c.remove(sid, purge=True)


def test_full_snapshot_survives_a_coved_crash(coved_factory):
    # a full snapshot is durable like any: after kill -9 of coved the sandbox is paused at
    # it (docs/api.md), and a resume brings its processes back as they were then
    d = coved_factory()
    c = d.client
    need_full(c)
    sid = new_sandbox(c)
    start_counter(c, sid)
    lo = count(c, sid)
    s = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "before the crash"}, expect=201)
    hi = count(c, sid)
    assert s["kind"] == "full"
    d.kill9()
    c = d.start()
    assert c.snapshot_kind() == "full"
    sb = c.sandbox(sid)
    assert sb["state"] == "paused" and sb["last_snapshot_id"] == s["id"], sb
    c.post(f"/v1/sandboxes/{sid}/resume")
    v = poll(lambda: count(c, sid), what="the counter after the resume")
    assert lo <= v <= hi + 2, (lo, v, hi)  # from the snapshot's memory, not from 1
    poll(lambda: count(c, sid) > v + 3, what="the counter to keep counting")
    c.remove(sid, purge=True)


def test_operations_right_after_start_wait_for_the_self_check(coved_factory):
    # a full snapshot's restore (and a pause) in the first seconds after coved starts, while
    # /healthz still says "checking", waits for the self-check instead of failing or
    # quietly taking files: here a fork right after a restart
    d = coved_factory()
    c = d.client
    need_full(c)
    sid = new_sandbox(c)
    start_counter(c, sid)
    s = c.post(f"/v1/sandboxes/{sid}/snapshots", {}, expect=201)
    assert s["kind"] == "full"
    d.terminate()
    c = d.start()  # returns as soon as /healthz answers: the check has only begun
    (f,) = [x["id"] for x in c.post(f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s["id"]})
            ["sandboxes"]]
    v = poll(lambda: count(c, f), what="the fork's counter")
    assert v >= 5
    c.remove(f, purge=True)
    c.remove(sid, purge=True)
