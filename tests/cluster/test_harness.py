"""The cluster test bed itself (tests/lib/cluster.py), on coveds in role all inside the node
hosts (each on the shared PostgreSQL and radosgw, a database and a store prefix each):
node hosts reach the servers and nothing off the machine, a partition cuts a node off and
a heal brings it back, PostgreSQL restarts and S3 outages are survived, the process scan
tells nodes apart and catches a sandbox running twice (a positive control with stand-in
processes), the write log catches writes of a fenced node, and tear-down leaves nothing.
The fault tests (test_faults.py) rely on each of these."""
import errno
import os
import secrets
import signal
import socket
import subprocess
import time

import pytest

import pgserver
from cluster import Cluster, Watcher, cgroup_mounts, why_not, scan_processes, stale_write, two_node_violations
from cove import CoveError, poll, sh, socket_in

WORKLOAD = "sh -c 'while true; do date >> /home/hb; sleep 0.2; done' >/dev/null 2>&1 &"


@pytest.fixture(scope="module")
def cl(cluster_factory):
    return cluster_factory(nodes=2, mode="all")


def sandbox_on(cl, node):
    c = node.client()
    sid = cl.note(c.create(template="busybox", snapshot_interval_s=0)["id"])
    sh(c, sid, WORKLOAD)
    poll(lambda: cl.scan().get(sid), timeout=30, what=f"{sid}'s workload in the scan")
    return c, sid


def test_node_hosts_reach_the_servers_and_nothing_else(cl):
    """Each node host's coved keeps its catalog in PostgreSQL and its snapshots in radosgw,
    both reached over the node's link; a node host has no route off the machine (a
    connect to another address fails at once, no packet sent) and its own loopback."""
    for n in cl.nodes:
        c, sid = sandbox_on(cl, n)
        r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {}, timeout=300)
        assert r.status == 201, r.body[:300]
        assert cl.sql(f"SELECT state FROM sandboxes WHERE id = '{sid}'", db=n.name).strip() \
            == "running"
        assert any(k.startswith(f"{n.name}/") for k in cl.rgw.keys(cl.bucket, f"{n.name}/"))
        routes = subprocess.run(["ip", "-n", n.netns, "-4", "route"], capture_output=True,
                                text=True).stdout
        assert "default" not in routes and f"{cl.subnet}.0/24" in routes, routes
        s = socket_in(n.netns)
        try:
            with pytest.raises(OSError) as e:
                s.connect(("192.0.2.99", 80))
            assert e.value.errno == errno.ENETUNREACH
        finally:
            s.close()
        c.remove(sid, purge=True)


def test_partition_cuts_a_node_off_and_heal_restores_it(cl):
    """With n1's link down, n1 answers nothing (from the host) and reaches nothing (its
    PostgreSQL connects fail), while n2 goes on; after the heal n1 answers again and its
    coved works on PostgreSQL again."""
    n1, n2 = cl.nodes
    c1 = n1.client()
    cl.partition(n1)
    try:
        with pytest.raises((OSError, CoveError)):
            c1.request("GET", "/healthz", auth=False, timeout=2)
        assert n2.client().get("/v1/sandboxes") is not None
        s = socket_in(n1.netns)
        s.settimeout(2)
        try:
            with pytest.raises(OSError):
                s.connect((cl.host_ip, cl.pg.port))
        finally:
            s.close()
    finally:
        cl.heal(n1)
    poll(lambda: c1.request("GET", "/v1/sandboxes", timeout=5).status == 200, timeout=60,
         what="n1 answering after the heal")
    sid = cl.note(c1.create(template="busybox")["id"])
    assert cl.sql(f"SELECT count(*) FROM sandboxes WHERE id = '{sid}'", db="n1").strip() == "1"
    c1.remove(sid, purge=True)


def test_postgres_restart_and_s3_outage_are_survived(cl):
    """PostgreSQL restarted under a node: its API answers again once the server is back.
    radosgw stopped: a snapshot fails with 503 in bounded time and nothing is listed;
    radosgw back: the next snapshot is taken and listed."""
    n = cl.nodes[1]
    c, sid = sandbox_on(cl, n)
    cl.pg_restart()
    poll(lambda: c.request("GET", f"/v1/sandboxes/{sid}", timeout=10).status == 200,
         timeout=120, what="the node's API after the PostgreSQL restart")
    cl.s3_stop()
    try:
        t0 = time.monotonic()
        r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"}, timeout=600)
        assert r.status == 503, r.body[:300]
        assert time.monotonic() - t0 < 600
        assert c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"] == []
    finally:
        cl.s3_start()
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"}, timeout=300)
    assert r.status == 201, r.body[:300]
    assert [s["id"] for s in c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]] == \
        [r.json()["id"]]
    c.remove(sid, purge=True)


def test_process_scan_tells_nodes_apart(cl):
    """A sandbox's workload shows under the node that runs it, in that node host's own
    cgroups (never the host's cove/ group another node would share), live;
    stopped by SIGSTOP it counts as not running; two sandboxes on two nodes are no
    violation."""
    (c1, s1), (c2, s2) = sandbox_on(cl, cl.nodes[0]), sandbox_on(cl, cl.nodes[1])
    scan = cl.scan()
    assert set(scan[s1]) == {"n1"} and set(scan[s2]) == {"n2"}, scan
    assert all(live for _, live, _ in scan[s1]["n1"])
    # each node host's sandboxes live in its own cgroups, as on a machine of its own
    for sid, n in ((s1, "n1"), (s2, "n2")):
        pid = scan[sid][n][0][0]
        with open(f"/proc/{pid}/cgroup") as f:
            assert f"/cove-cl{cl.tag}-{n}/{sid}" in f.read()
        assert not any(os.path.exists(os.path.join(mp, "cove", sid))
                       for mp in cgroup_mounts())
    assert two_node_violations(scan) == {}
    pids = [p for p, _, _ in scan[s1]["n1"]]
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        poll(lambda: not any(lv for p, lv, _ in cl.scan()[s1]["n1"] if p in pids), timeout=10,
             what="stopped processes counted as not running")
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    c1.remove(s1, purge=True)
    c2.remove(s2, purge=True)


def _cgroup_root(controller):
    """(mount point, v2?) of the hierarchy holding controller, or of cgroup2."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            x = line.split()
            fs = x[x.index("-") + 1]
            if fs == "cgroup" and controller in x[-1].split(","):
                return x[4], False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            x = line.split()
            if x[x.index("-") + 1] == "cgroup2":
                return x[4], True
    return None, None


class _Stub:
    """What Watcher needs of a Cluster, over stand-in processes."""

    def __init__(self, pids):
        self.pids = pids

    def node_pids(self):
        return self.pids

    def known_sandboxes(self):
        return set()


def test_two_node_checker_catches_a_double_run():
    """Positive control with stand-in processes (a test double: no cove node can be made to
    run a sandbox twice on purpose): a process in cgroup …/cove/<id> under each of two
    "node" processes is a violation, found by one scan and by the background watcher; once
    one side is stopped (SIGSTOP) or its freezer cgroup is FROZEN it is none."""
    if os.geteuid() != 0:
        pytest.skip("needs root (cgroups)")
    root, v2 = _cgroup_root("pids")
    if not root:
        pytest.skip("no cgroup hierarchy mounted")
    sid = "sbx_harness" + secrets.token_hex(6)
    base = os.path.join(root, f"cove-harness-{os.getpid()}")
    grp = os.path.join(base, "cove", sid)
    os.makedirs(grp)
    fz_root, _ = (None, None) if v2 else _cgroup_root("freezer")
    fz = os.path.join(fz_root, f"cove-harness-{os.getpid()}", "cove", sid) if fz_root else None
    nodes, kids = [], []
    try:
        for _ in range(2):  # a "node" whose child is the "workload"
            p = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], stdout=subprocess.PIPE,
                                 text=True, start_new_session=True)
            nodes.append(p)
            kids.append(int(p.stdout.readline()))
        for k in kids:
            with open(os.path.join(grp, "cgroup.procs"), "w") as f:
                f.write(str(k))
        pids = {nodes[0].pid: "a", nodes[1].pid: "b"}
        bad = two_node_violations(scan_processes(pids))
        assert set(bad.get(sid, {})) == {"a", "b"}, bad
        w = Watcher(_Stub(pids), 0.05)
        w.start()
        poll(lambda: w.samples >= 3, timeout=30, what="3 watcher samples")
        w.stop()
        with pytest.raises(AssertionError, match="two nodes at once"):
            w.check()
        os.kill(kids[1], signal.SIGSTOP)
        poll(lambda: sid not in two_node_violations(scan_processes(pids)), timeout=10,
             what="a stopped copy counted as not running")
        os.kill(kids[1], signal.SIGCONT)
        poll(lambda: sid in two_node_violations(scan_processes(pids)), timeout=10,
             what="the copy running again")
        if fz:
            os.makedirs(fz)
            with open(os.path.join(fz, "cgroup.procs"), "w") as f:
                f.write(str(kids[1]))
            with open(os.path.join(fz, "freezer.state"), "w") as f:
                f.write("FROZEN")
            poll(lambda: open(os.path.join(fz, "freezer.state")).read().strip() == "FROZEN",
                 timeout=10, what="the freezer cgroup FROZEN")
            assert sid not in two_node_violations(scan_processes(pids))
            with open(os.path.join(fz, "freezer.state"), "w") as f:
                f.write("THAWED")
    finally:
        for p in nodes:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for d in (fz, grp, os.path.dirname(grp), base,
                  fz and os.path.dirname(fz), fz and os.path.dirname(os.path.dirname(fz))):
            if d:
                poll(lambda: _rmdir(d), timeout=10, what=f"rmdir {d}")


def _rmdir(d):
    try:
        os.rmdir(d)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno == errno.EBUSY:  # the killed processes are still leaving
            return False
        raise
    return True


def _psql_from(cl, node, db, q):
    """q run over TCP from node's network namespace (so the write log attributes it to
    node), as the superuser with the password."""
    argv = ["nsenter", f"--net=/run/netns/{node.netns}", "--",
            os.path.join(pgserver.PG_BIN, "psql"), "-h", cl.host_ip, "-p", str(cl.pg.port),
            "-U", "postgres", "-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", q]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PGPASSWORD=cl.pg.password))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_write_log_catches_writes_of_a_fenced_node(cl):
    """Writes from a node host's address are logged with the writer's lease and epoch and
    the sandbox's placement at that moment: a write under a live lease on its own sandbox
    passes; the same write with the lease lapsed, a job finished under an older epoch and
    a write to a sandbox placed elsewhere are each caught (rows written here by hand over
    TCP from the node's namespace: role all has no leases of its own)."""
    n1 = cl.nodes[0]
    c = n1.client()
    sid = cl.note(c.create(template="busybox")["id"])
    now = cl.NOW_MS
    cl.sql("TRUNCATE cove_test_writes", db="n1")
    cl.sql(f"INSERT INTO nodes(name, epoch, lease_expires_at) VALUES ('n1', 5, {now} + 600000),"
           f" ('n2', 1, {now} + 600000) ON CONFLICT (name) DO NOTHING;"
           f"INSERT INTO placements(sandbox_id, node, generation, desired_state, updated_at)"
           f" VALUES ('{sid}', 'n1', 1, 'running', {now});"
           f"INSERT INTO jobs(sandbox_id, kind, generation, state, claimed_by, claimed_epoch,"
           f" created_at, updated_at) VALUES ('{sid}', 'start', 1, 'claimed', 'n1', 4, {now},"
           f" {now})", db="n1")
    try:
        touch = f"UPDATE sandboxes SET state = state WHERE id = '{sid}'"
        _psql_from(cl, n1, "n1", touch)
        w = cl.writes("n1")
        assert [x["writer"] for x in w] == ["n1"] and not stale_write(w[0]), w
        cl.no_stale_epoch_write(db="n1")
        cl.sql(f"UPDATE nodes SET lease_expires_at = {now} - 1 WHERE name = 'n1'", db="n1")
        _psql_from(cl, n1, "n1", touch)
        assert "lease lapsed" in stale_write(cl.writes("n1")[-1])
        with pytest.raises(AssertionError, match="fenced or stale"):
            cl.no_stale_epoch_write(db="n1")
        cl.sql(f"UPDATE nodes SET lease_expires_at = {now} + 600000 WHERE name = 'n1'", db="n1")
        _psql_from(cl, n1, "n1", f"UPDATE jobs SET state = 'done' WHERE sandbox_id = '{sid}'")
        assert "epoch 4 < 5" in stale_write(cl.writes("n1")[-1])
        cl.sql(f"UPDATE placements SET node = 'n2' WHERE sandbox_id = '{sid}'", db="n1")
        _psql_from(cl, n1, "n1", touch)
        assert "placed on n2" in stale_write(cl.writes("n1")[-1])
    finally:
        cl.sql(f"DELETE FROM jobs WHERE sandbox_id = '{sid}'; DELETE FROM placements WHERE"
               f" sandbox_id = '{sid}'; DELETE FROM nodes; TRUNCATE cove_test_writes", db="n1")
    c.remove(sid, purge=True)


def test_teardown_removes_everything(build_dir, templates_dir, log_dir):
    """A cluster whose node was killed with SIGKILL while running a sandbox still leaves
    nothing once closed: no namespace, link, bridge, directory, server or process, and no
    cgroup of its sandboxes."""
    why = why_not()
    if why:
        pytest.skip(why)
    cl = Cluster(build_dir, templates_dir, log_dir, nodes=1, mode="all")
    try:
        n = cl.nodes[0]
        sid = cl.note(n.client().create(template="busybox")["id"])
        n.kill9()
        names = (n.netns, n.link, cl.bridge)
        dirs = (cl.dir, cl.pg.dir, os.path.dirname(cl.rgw.dir))
        pids = [p for p, _ in n.pids] + [cl.pg.pid]
    finally:
        failed = cl.close()
    assert not failed, failed
    assert not any(nm in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                        text=True).stdout for nm in names)

    def links_gone():
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        return not any(f" {nm}@" in links or f" {nm}:" in links for nm in names[1:])
    poll(links_gone, timeout=10, what="the links gone")
    assert not any(os.path.exists(d) for d in dirs), dirs
    for p in pids:
        st = None
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            pass
        assert st in (None, "Z"), f"pid {p} still running"
    for mp in cgroup_mounts():
        assert not os.path.exists(os.path.join(mp, "cove", sid)), (mp, sid)
        assert not os.path.exists(os.path.join(mp, n.cgroup_name)), (mp, n.cgroup_name)
