"""The cluster's properties under faults, on a real cluster (tests/lib/cluster.py): three
`coved --role node` in network-namespace hosts and two `coved --role control` replicas on
one PostgreSQL and one radosgw, leases of 3 s renewed every 0.5 s. Each fault runs while a
background watcher scans every process on the host, and each test ends with the checkers:
no sandbox ever runs on two nodes, no write of a fenced node is accepted, every listed
snapshot restores, every sandbox converges to its desired state.

A part of the cluster that has not landed skips the tests that need it, naming it: coved's
refusal of a role ("not built yet"), a route the control does not have (404 from
/v1/nodes), sandbox traffic a control cannot forward yet."""
import http.client
import re
import threading
import time

import pytest

from cove import Client, CoveError, poll

pytestmark = pytest.mark.slow  # minutes: not in the sanitizer pass

WORKLOAD = "sh -c 'while true; do date +%s%N >> /home/hb; sleep 0.2; done' >/dev/null 2>&1 &"
BIG_MB = 48  # written before a fault meant to land during a capture or a restore
RECOVERY_S = 120  # lease TTL + the lost grace + a restore, on a loaded 2-core machine


@pytest.fixture(scope="module")
def cl(cluster_factory):
    return cluster_factory(nodes=3, controls=2, lease_ttl=3, lease_renew=0.5)


@pytest.fixture
def desired(cl):
    """{sandbox id: state} of the sandboxes a test made; removed afterwards (their snapshots
    stay: the last test restores every one). A node of this machine has room for as many
    sandboxes as it has CPUs, so tests do not keep theirs."""
    d = {}
    yield d
    c = cl.client(0)
    for sid in d:
        try:
            c.remove(sid)
        except (CoveError, OSError, http.client.HTTPException) as e:
            print(f"cleanup of {sid}: {e}")


@pytest.fixture(autouse=True)
def nodes_back(cl):
    """Every node runs again after each test (a test kills or stops some)."""
    yield
    for n in cl.nodes:
        if n.stopped:
            n.sigcont()
        if not n.alive():
            n.start()
            cl.wait_lease(n)


FORWARD_REFUSED = re.compile(r"not built|does not forward|not forwarded")
STAND_INS = set()  # what a test used in place of a part not built yet (printed at the end)


def via(cl, c, sid, method, path, body=None, headers=None, timeout=120):
    """A sandbox traffic request through the control replica c. A control that does not
    forward sandbox traffic yet says so (501/503): then, as a STAND-IN for the data set-up
    only, the same request goes to the node's own listener with the admin key (a node
    before the node API is authenticated takes it); the fault and its checks still go
    through the control and the catalog."""
    r = c.request(method, path, body, headers=headers, timeout=timeout)
    msg = r.error.get("message", "") if r.status >= 400 else ""
    if r.status in (501, 503) and FORWARD_REFUSED.search(msg):
        n = cl.node_of(sid)
        direct = Client(n.port, c.key, host=n.ip)
        r2 = direct.request(method, path, body, headers=headers, timeout=timeout)
        if r2.status in (401, 403, 404):
            pytest.skip(f"sandbox traffic through a control replica not built ({r.status} "
                        f"{msg}) and the node's API refuses the admin key ({r2.status})")
        STAND_INS.add("sandbox traffic sent to the node directly (the control does not "
                      "forward yet)")
        return r2
    return r


def traffic(cl):
    """For the checkers: sandbox traffic through the control (or the stand-in above)."""
    return lambda c, sid, method, path, body: via(cl, c, sid, method, path, body, timeout=300)


def nodes_route(c):
    r = c.request("GET", "/v1/nodes")
    if r.status == 404:
        pytest.skip(f"node admin and node-loss recovery not built (GET /v1/nodes: 404 "
                    f"{r.error.get('message', '')})")
    assert r.status == 200, r.body[:300]
    return r.json()


def exec_ok(cl, c, sid, cmd, timeout=120):
    r = via(cl, c, sid, "POST", f"/v1/sandboxes/{sid}/exec", {"shell": cmd, "wait": True},
            timeout=timeout)
    assert r.status == 200, (sid, cmd, r.status, r.body[:300])
    j = r.json()
    assert j["exit_code"] == 0, j
    return j["stdout"]


def put(cl, c, sid, data, path="/home/f"):
    r = via(cl, c, sid, "PUT", f"/v1/sandboxes/{sid}/files?path={path}", data,
            headers={"Content-Type": "application/octet-stream"})
    assert r.status in (200, 201, 204), r.body[:300]


def read(cl, c, sid, path="/home/f"):
    r = via(cl, c, sid, "GET", f"/v1/sandboxes/{sid}/files?path={path}")
    assert r.status == 200, r.body[:300]
    return r.body


def new_sandbox(cl, c, desired, content=b"v1\n"):
    """A running busybox sandbox with a workload and /home/f = content."""
    sid = cl.note(c.create(template="busybox", snapshot_interval_s=0)["id"])
    desired[sid] = "running"
    c.wait_state(sid, "running", timeout=120)
    put(cl, c, sid, content)
    exec_ok(cl, c, sid, WORKLOAD)
    poll(lambda: cl.scan().get(sid), timeout=60, what=f"{sid}'s workload on its node")
    return sid


def snapshot(c, sid, kind=None, timeout=300):
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": kind} if kind else {},
                  timeout=timeout)
    assert r.status == 201, r.body[:300]
    return r.json()


def job_claimed(cl, sid, kind):
    """The node name that claimed sid's newest job of kind, once it is claimed."""
    out = cl.sql(f"SELECT claimed_by FROM jobs WHERE sandbox_id = '{sid}' AND kind = '{kind}'"
                 " AND state = 'claimed' ORDER BY id DESC LIMIT 1").strip()
    return out or None


def recovered_elsewhere(cl, c, sid, lost):
    """Waits until sid runs on a node other than lost (its placement moved and observed
    running); skips naming the part when the control has no node-loss recovery."""
    nodes_route(c)

    def moved():
        p = cl.placement(sid)
        return p if p and p[0] != lost.name and p[3] == "running" else None
    return poll(moved, timeout=RECOVERY_S, what=f"{sid} recovered off {lost.name}", every=0.25)


def background(fn, *a):
    box = {}

    def run():
        try:
            box["r"] = fn(*a)
        except BaseException as e:  # looked at by the test
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def runs_nothing_of(cl, node, sid, timeout=60):
    """Within timeout, node holds no live process of sid (a fenced node stops them)."""
    poll(lambda: not any(lv for _, lv, _ in cl.scan().get(sid, {}).get(node.name, [])),
         timeout=timeout, what=f"{node.name} running nothing of {sid}", every=0.2)


# --- the tests ---------------------------------------------------------------------------
def test_cluster_comes_up(cl):
    """Three nodes hold live leases with epochs; both replicas answer the API; a sandbox
    created through one replica is seen by the other and placed on a node."""
    for n in cl.nodes:
        e, left, st = n.lease()
        assert e >= 1 and left > 0 and st == "ready", (n.name, e, left, st)
    c0, c1 = cl.client(0), cl.client(1)
    sid = cl.note(c0.create(template="busybox")["id"])
    assert c1.sandbox(sid)["id"] == sid
    p = poll(lambda: cl.placement(sid), timeout=60, what="a placement")
    assert p[0] in {n.name for n in cl.nodes}
    assert c1.sandbox(sid).get("node") == p[0]
    c0.remove(sid, purge=True)
    cl.no_stale_epoch_write()


def test_kill9_node_during_snapshot(cl, desired):
    """A node killed with SIGKILL while it takes a snapshot: the snapshot call fails cleanly
    or completes, nothing half is listed; the sandbox is recovered on another node equal to
    its last committed snapshot; no copy ran on two nodes and the dead node's epoch wrote
    nothing after; the node, back, takes a new epoch and runs nothing of it."""
    c = cl.client(0)
    nodes_route(c)  # recovery off a lost node: skip early when not built
    sid = new_sandbox(cl, c, desired, b"v1\n")
    s1 = snapshot(c, sid, kind="files")
    node = cl.node_of(sid)
    epoch = node.lease()[0]
    put(cl, c, sid, b"v2\n")
    # enough new data that the capture takes a while: the kill lands during it
    exec_ok(cl, c, sid, f"dd if=/dev/urandom of=/home/big bs=1M count={BIG_MB} 2>/dev/null")
    with cl.watch():
        t, box = background(snapshot, c, sid, None, 600)
        poll(lambda: job_claimed(cl, sid, "snapshot") == node.name, timeout=120,
             what="the snapshot job claimed", every=0.02)
        node.kill9()
        recovered_elsewhere(cl, c, sid, node)
        t.join(timeout=700)  # the call answers (an error, or the snapshot) in bounded time
        assert not t.is_alive(), "the snapshot call did not answer after its node was lost"
    listed = {s["id"] for s in c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]}
    assert s1["id"] in listed
    expect = {s1["id"]: {"/home/f": b"v1\n"}}
    if "r" in box:  # acknowledged: it must be listed and hold v2
        assert box["r"]["id"] in listed
        expect[box["r"]["id"]] = {"/home/f": b"v2\n"}
    rf = c.sandbox(sid)["recovered_from"]
    cl.recovered_equals_snapshot(sid, expect.get(rf["snapshot_id"], {"/home/f": b"v1\n"}),
                                 traffic=traffic(cl))
    node.start()
    assert cl.wait_lease(node, newer_than=epoch) > epoch
    runs_nothing_of(cl, node, sid)
    cl.every_listed_snapshot_restores(expect, traffic=traffic(cl))
    cl.no_stale_epoch_write()
    cl.converges({sid: "running"})


def test_kill9_node_during_resume(cl, desired):
    """A paused sandbox resumed while the node restoring it is killed with SIGKILL: it
    converges to running on another node with its files as paused, once."""
    c = cl.client(0)
    nodes_route(c)  # recovery off a lost node: skip early when not built
    sid = new_sandbox(cl, c, desired, b"paused\n")
    exec_ok(cl, c, sid, f"dd if=/dev/urandom of=/home/big bs=1M count={BIG_MB} 2>/dev/null")
    p = c.post(f"/v1/sandboxes/{sid}/pause", timeout=300)
    assert p["sandbox"]["state"] == "paused"
    with cl.watch():
        t, box = background(lambda: c.request("POST", f"/v1/sandboxes/{sid}/resume", {},
                                              timeout=600))
        target = poll(lambda: job_claimed(cl, sid, "resume"), timeout=120,
                      what="the resume job claimed", every=0.02)
        victim = cl.node(target)
        victim.kill9()
        recovered_elsewhere(cl, c, sid, victim)
        t.join(timeout=700)
        assert not t.is_alive(), "the resume call did not answer after its node was lost"
        assert box["r"].status in (200, 503, 409), box["r"].body[:300]
    assert read(cl, c, sid) == b"paused\n"
    victim.start()
    cl.wait_lease(victim)
    runs_nothing_of(cl, victim, sid)
    cl.no_stale_epoch_write()
    cl.converges({sid: "running"})


def test_kill9_node_during_drain(cl, desired):
    """A drain killed halfway (the draining node gets SIGKILL after its first sandbox
    moved): every one of its sandboxes ends running on another node, its files intact,
    none on two nodes at any sampled moment."""
    c = cl.client(1)
    nodes_route(c)
    node = next(n for n in cl.nodes if n.alive())
    name = node.name
    others = [n.name for n in cl.nodes if n.name != name]
    for o in others:  # all three on the node to drain
        assert c.request("POST", f"/v1/nodes/{o}/cordon", {}).status == 200
    try:
        sids = [new_sandbox(cl, c, desired, f"drain-{i}\n".encode()) for i in range(3)]
        for s in sids:  # something committed to recover from, whatever the drain reached
            snapshot(c, s)
    finally:
        for o in others:
            c.request("POST", f"/v1/nodes/{o}/uncordon", {})
    assert all(cl.node_of(s).name == name for s in sids)
    mine = sids
    with cl.watch():
        t, box = background(lambda: c.request("POST", f"/v1/nodes/{name}/drain", {},
                                              timeout=900))
        if len(mine) > 1:
            poll(lambda: any(cl.placement(s)[0] != name for s in mine), timeout=300,
                 what="a first sandbox moved off the draining node", every=0.1)
        node.kill9()
        t.join(timeout=1000)
        if "r" in box and box["r"].status == 404:
            pytest.skip(f"drain not built (POST /v1/nodes/{name}/drain: 404)")
        for s in mine:
            recovered_elsewhere(cl, c, s, node)
    for i, s in enumerate(sids):
        assert read(cl, c, s) == f"drain-{i}\n".encode()
    node.start()
    cl.wait_lease(node)
    c.request("POST", f"/v1/nodes/{name}/uncordon", {})
    for s in mine:
        runs_nothing_of(cl, node, s)
    cl.no_stale_epoch_write()
    cl.converges({s: "running" for s in sids})


def test_sigstop_past_lease_then_sigcont(cl, desired):
    """A node stopped with SIGSTOP past its lease: its sandbox's workload freezes (the
    guest fences itself) before a copy starts elsewhere; after SIGCONT the node finds
    itself fenced (a new epoch), runs nothing of the moved sandbox, and the writes it
    attempted with the old epoch were refused."""
    c = cl.client(0)
    nodes_route(c)  # recovery off a lost node: skip early when not built
    sid = new_sandbox(cl, c, desired, b"stop\n")
    snapshot(c, sid, kind="files")
    node = cl.node_of(sid)
    epoch = node.lease()[0]
    with cl.watch() as w:
        node.sigstop()
        try:
            cl.wait_lease_lapsed(node)
            recovered_elsewhere(cl, c, sid, node)
        finally:
            node.sigcont()
        cl.wait_lease(node, newer_than=epoch)
        runs_nothing_of(cl, node, sid)
    assert w.max_owners.get(sid, 0) >= 1
    assert read(cl, c, sid) == b"stop\n"
    cl.no_stale_epoch_write()
    cl.converges({sid: "running"})


def test_partition_shorter_than_lease_changes_nothing(cl, desired):
    """A node cut off for less than its lease TTL keeps its lease and its sandbox: nothing
    moves, the sandbox answers again through both replicas after the heal."""
    c = cl.client(0)
    sid = new_sandbox(cl, c, desired, b"short\n")
    node = cl.node_of(sid)
    epoch = node.lease()[0]
    gen = cl.placement(sid)[1]
    with cl.watch():
        cl.partition(node)
        time.sleep(cl.lease_renew * 2)  # the fault's length is the test's input
        cl.heal(node)
    cl.wait_lease(node)
    assert node.lease()[0] == epoch
    assert cl.placement(sid)[:2] == (node.name, gen)
    assert read(cl, cl.client(1), sid) == b"short\n"
    cl.no_stale_epoch_write()


def test_partition_past_lease_then_heal(cl, desired):
    """A node partitioned (its link down) past its lease: its sandbox is recovered
    elsewhere; the node fences itself (it cannot renew) and after the heal runs nothing
    of it, under a new epoch; every sandbox converges."""
    c = cl.client(1)
    nodes_route(c)  # recovery off a lost node: skip early when not built
    sid = new_sandbox(cl, c, desired, b"part\n")
    snapshot(c, sid, kind="files")
    node = cl.node_of(sid)
    epoch = node.lease()[0]
    with cl.watch():
        cl.partition(node)
        try:
            cl.wait_lease_lapsed(node)
            recovered_elsewhere(cl, c, sid, node)
        finally:
            cl.heal(node)
        cl.wait_lease(node, newer_than=epoch)
        runs_nothing_of(cl, node, sid)
    assert read(cl, c, sid) == b"part\n"
    cl.no_stale_epoch_write()
    cl.converges(dict(desired))


def test_postgres_restart_during_activity(cl, desired):
    """PostgreSQL restarted while sandboxes are created and run commands through both
    replicas: calls fail cleanly (503) while it is down, every create that was answered
    201 ends running, leases come back, nothing ran twice."""
    c0, c1 = cl.client(0), cl.client(1)
    made, errors, stop = [], [], threading.Event()

    def churn(c):
        while not stop.is_set():
            try:  # create, list, delete: at most one sandbox each at a time (capacity)
                r = c.request("POST", "/v1/sandboxes", {"template": "busybox"}, timeout=120)
                if r.status in (200, 201):
                    sid = cl.note(r.json()["id"])
                    made.append(sid)
                    desired[sid] = "running"
                    cl.converges({sid: "running"}, client=c)
                    # a 503 may come after the stop job was committed (the wait for it met
                    # PostgreSQL going down): the client retries until it gets an answer,
                    # 204, or 404 once the first attempt's stop went through
                    def deleted():
                        rr = c.request("DELETE", f"/v1/sandboxes/{sid}", timeout=120)
                        if rr.status not in (200, 204, 404, 503):
                            errors.append(("delete", rr.status, rr.body[:200]))
                        return rr.status != 503
                    poll(deleted, timeout=300, every=0.5, what=f"an answer to DELETE {sid}")
                    desired.pop(sid, None)
                elif r.status != 503:
                    errors.append((r.status, r.body[:200]))
            except (OSError, http.client.HTTPException) as e:
                errors.append(repr(e))
    ts = [threading.Thread(target=churn, args=(c,), daemon=True) for c in (c0, c1)]
    with cl.watch():
        for t in ts:
            t.start()
        poll(lambda: len(made) >= 1, timeout=120, what="a first create")
        cl.pg_restart()
        n0 = len(made)
        poll(lambda: len(made) > n0, timeout=180, what="a create after the restart")
        stop.set()
        for t in ts:
            t.join(timeout=300)
    assert not errors, errors[:5]
    for n in cl.nodes:
        cl.wait_lease(n)
    cl.converges(dict(desired))
    cl.no_stale_epoch_write()


def test_s3_stopped_during_snapshot(cl, desired):
    """radosgw stopped while a snapshot is taken: the call fails cleanly (503) or completes
    after radosgw is back; a snapshot is listed only complete; afterwards snapshots work
    and every listed one restores."""
    c = cl.client(0)
    sid = new_sandbox(cl, c, desired, b"s3\n")
    exec_ok(cl, c, sid, "dd if=/dev/urandom of=/home/big bs=1M count=8 2>/dev/null")
    before = {s["id"] for s in c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]}
    cl.s3_stop()
    try:
        r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"}, timeout=600)
        assert r.status in (201, 503), r.body[:300]
        listed = {s["id"] for s in c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]}
        if r.status == 503:
            assert listed == before, (before, listed)
    finally:
        cl.s3_start()
    s2 = snapshot(c, sid, kind="files")
    checked = cl.every_listed_snapshot_restores({s2["id"]: {"/home/f": b"s3\n"}},
                                                traffic=traffic(cl))
    assert s2["id"] in checked
    cl.no_stale_epoch_write()


def test_two_replicas_race_to_resume(cl, desired):
    """Both replicas resume the same paused sandbox at once: one wins, the other answers
    the same sandbox or a clean 409 conflict; it runs on exactly one node, placed once."""
    c0, c1 = cl.client(0), cl.client(1)
    sid = new_sandbox(cl, c0, desired, b"race\n")
    c0.post(f"/v1/sandboxes/{sid}/pause", timeout=300)
    gen = cl.placement(sid)[1]
    go = threading.Barrier(2)

    def resume(c):
        go.wait()
        return c.request("POST", f"/v1/sandboxes/{sid}/resume", {}, timeout=600)
    with cl.watch():
        (t0, b0), (t1, b1) = background(resume, c0), background(resume, c1)
        t0.join(timeout=700)
        t1.join(timeout=700)
    rs = [b["r"] for b in (b0, b1)]
    assert sorted(r.status for r in rs) in ([200, 200], [200, 409]), \
        [(r.status, r.body[:200]) for r in rs]
    for r in rs:
        if r.status == 409:
            assert r.error.get("code") == "conflict" and r.error.get("message")
    oks = [r.json() for r in rs if r.status == 200]
    assert len({o.get("node") for o in oks}) == 1, oks
    p = cl.placement(sid)
    assert p[1] == gen + 1, (gen, p)
    owners = {o for o, ps in cl.scan().get(sid, {}).items() if any(lv for _, lv, _ in ps)}
    assert owners <= {p[0]}, owners
    assert read(cl, c1, sid) == b"race\n"
    cl.no_stale_epoch_write()


def test_every_listed_snapshot_restores_after_the_faults(cl):
    """After every fault above: every snapshot the API lists (the tests' sandboxes are
    deleted, their snapshots stay) restores and runs; the node writes of the whole module
    were logged and none came from a stale node; nothing runs on two nodes."""
    c = cl.client(1)
    checked = cl.every_listed_snapshot_restores(client=c, traffic=traffic(cl))
    if not checked:
        pytest.skip("no snapshot was taken by the tests above (they skipped)")
    assert cl.no_stale_epoch_write() > 0
    cl.no_sandbox_on_two_nodes()
    if STAND_INS:
        print(f"stand-ins used by this module: {sorted(STAND_INS)}")
