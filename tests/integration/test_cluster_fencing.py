"""Fencing in the cluster (docs/cluster.md "Leases and fencing"), on the bed of
test_cluster_roles (one control, nodes as processes on loopback, a real PostgreSQL and
radosgw): a node writes about its sandboxes only under a live lease; a control answers for a
node that is gone instead of waiting it out; two callers resuming one sandbox place it once;
a node's guests freeze themselves when the node stops confirming its lease, and run again
only when the node re-confirms it with the sandbox still placed on it."""
import os
import signal
import threading
import time

import pytest

from cove import guest_pid, poll, proc_status as _status
from test_cluster_roles import (Cluster, exec_out, init_pid, live_nodes, pg, rgw,  # noqa: F401
                                sandbox_procs, TTL_S)
from test_guest_fence import descendants

pytestmark = pytest.mark.root

FREEZE_BOUND_S = 60  # frozen within the lease TTL + this, on a loaded 2-core machine
WORKLOAD = "sh -c 'while true; do date +%s%N >> /home/hb; sleep 0.2; done' >/dev/null 2>&1 &"

WRITE_LOG = """
CREATE TABLE cove_test_sbx_writes (seq bigserial, sandbox_id text, old_state text,
  new_state text, na_lease_live boolean, na_epoch bigint);
CREATE FUNCTION cove_test_sbx_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO cove_test_sbx_writes (sandbox_id, old_state, new_state, na_lease_live, na_epoch)
  SELECT NEW.id, OLD.state, NEW.state,
         coalesce(bool_or(lease_expires_at > (extract(epoch from clock_timestamp()) * 1000)
                  ::bigint), false), max(epoch)
  FROM nodes WHERE name = 'na';
  RETURN NEW;
END $$;
CREATE TRIGGER cove_test_sbx_w AFTER UPDATE ON sandboxes FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION cove_test_sbx_log();
"""


@pytest.fixture
def cluster(request, build_dir, templates_dir, pg, rgw, tmp_path):  # noqa: F811
    c = Cluster(build_dir, templates_dir, pg, rgw, str(tmp_path))
    c.start_control()
    yield c
    c.failed = getattr(request.node, "cove_failed", False)
    c.stop()


def lease_lapsed(c, name):
    return c.node_row(name).endswith("|f")


def epoch_of(c, name):
    return int(c.node_row(name).split("|")[1])


def test_restarted_node_settles_only_under_its_lease(cluster):
    """A node killed with SIGKILL and restarted after its lease lapsed settles the sandbox
    rows the catalog still calls running only once it holds a new lease, and leaves alone
    the row of a sandbox placed on another node meanwhile."""
    c = cluster
    a = c.start_node("na")
    c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    c.sql("UPDATE nodes SET state = 'cordoned' WHERE name = 'nb'")
    cc = c.control.client
    mine = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    moved = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert cc.get(f"/v1/sandboxes/{mine}")["node"] == "na"
    assert cc.get(f"/v1/sandboxes/{moved}")["node"] == "na"
    epoch = epoch_of(c, "na")
    port, data = a.port, a.data
    a.kill9()
    poll(lambda: not sandbox_procs(mine) and not sandbox_procs(moved), timeout=60,
         what="the instances ended with their node")
    poll(lambda: lease_lapsed(c, "na"), timeout=60, what="na's lease lapsed")
    # what a node-loss recovery would do with one of them: place it on nb
    c.sql("UPDATE nodes SET state = 'ready' WHERE name = 'nb'")
    c.sql(f"UPDATE placements SET node = 'nb', generation = generation + 1"
          f" WHERE sandbox_id = '{moved}'")
    c.sql(WRITE_LOG)
    c.start_node("na", data=data, port=port)
    poll(lambda: epoch_of(c, "na") > epoch and not lease_lapsed(c, "na"), timeout=60,
         what="na holds a new lease")
    poll(lambda: c.sql(f"SELECT state FROM sandboxes WHERE id = '{mine}'") == "stopped",
         timeout=60, what="na settled its own sandbox")
    log = c.sql("SELECT sandbox_id || ':' || old_state || '>' || new_state || ':' ||"
                " na_lease_live || ':' || na_epoch FROM cove_test_sbx_writes ORDER BY seq")
    rows = [r.split(":") for r in log.splitlines() if r]
    assert [r for r in rows if r[0] == mine], log
    # every change of its rows was made while na held its new lease
    assert all(r[2] == "true" and int(r[3]) > epoch for r in rows if r[0] == mine), log
    # the sandbox placed on nb was not touched by na
    assert not [r for r in rows if r[0] == moved], log
    assert c.sql(f"SELECT state FROM sandboxes WHERE id = '{moved}'") == "running"
    c.sql("DROP TRIGGER cove_test_sbx_w ON sandboxes")
    cc.remove(mine)


def test_step_on_a_killed_node_answers_unavailable(cluster):
    """A snapshot asked of a sandbox whose node was killed answers 503 unavailable naming
    the node as soon as the node's lease lapsed, long before the step's own timeout."""
    c = cluster
    a = c.start_node("na")
    poll(lambda: live_nodes(c) == "na", timeout=60, what="node na holds a lease")
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    a.kill9()
    # the client gives up well before the step's timeout (180 s): a control that waits the
    # whole timeout for a dead node fails this
    r = cc.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"}, timeout=90)
    assert r.status == 503, (r.status, r.body[:300])
    assert r.error.get("code") == "unavailable" and "na" in r.error.get("message", ""), r.error
    # a delete of it too (its own, shorter, timeout)
    r = cc.request("DELETE", f"/v1/sandboxes/{sid}", timeout=90)
    assert r.status == 503 and "na" in r.error.get("message", ""), (r.status, r.body[:300])


def test_two_callers_resume_one_sandbox_once(cluster):
    """Two calls resuming the same paused sandbox at once: one resumes it, the other
    answers 409 conflict; the sandbox is placed once (generation + 1) and runs on one
    node. Three rounds, both nodes ready (each call may pick either)."""
    c = cluster
    c.start_node("na")
    c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    exec_out(c.nodes["na"], sid, "echo race > /home/f")
    for _ in range(3):
        p = cc.post(f"/v1/sandboxes/{sid}/pause", timeout=300)
        assert p["sandbox"]["state"] == "paused"
        gen = int(c.sql(f"SELECT generation FROM placements WHERE sandbox_id = '{sid}'"))
        go = threading.Barrier(2)
        box = [None, None]

        def resume(i):
            go.wait()
            box[i] = cc.request("POST", f"/v1/sandboxes/{sid}/resume", {}, timeout=600)
        ts = [threading.Thread(target=resume, args=(i,)) for i in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=700)
        assert sorted(r.status for r in box) == [200, 409], \
            ([(r.status, r.body[:200]) for r in box], gen, c.sql(
                f"SELECT id, kind, generation, state FROM jobs WHERE sandbox_id = '{sid}'"
                f" ORDER BY id"))
        lost = next(r for r in box if r.status == 409)
        assert lost.error.get("code") == "conflict" and lost.error.get("message")
        won = next(r for r in box if r.status == 200).json()
        node, g = c.sql(f"SELECT node || ':' || generation FROM placements"
                        f" WHERE sandbox_id = '{sid}'").split(":")
        assert int(g) == gen + 1 and won["node"] == node, (gen, node, g, won)
        assert c.sql(f"SELECT count(*) FROM jobs WHERE sandbox_id = '{sid}' AND kind = 'resume'"
                     f" AND generation > {gen}") == "1"
        others = [n for n in c.nodes.values() if n is not c.nodes[node]]
        assert all(init_pid(o, sid) == 0 for o in others)
        assert exec_out(c.nodes[node], sid, "cat /home/f") == "race\n"
    cc.remove(sid)


def workload_states(gpid):
    states = []
    for p in descendants(gpid):
        try:
            states.append(_status(p, "State")[0])
        except (OSError, StopIteration):
            pass
    return states


def hb_size(gpid):
    try:
        return os.stat(f"/proc/{gpid}/root/home/hb").st_size
    except OSError:
        return None


def killed(pid):
    """pid has SIGKILL pending (it is being ended), or is gone already."""
    try:
        return any(int(_status(pid, k), 16) & (1 << (signal.SIGKILL - 1))
                   for k in ("SigPnd", "ShdPnd"))
    except (OSError, StopIteration):
        return True


def test_stopped_node_guests_freeze_and_thaw_with_the_lease(cluster):
    """A node stopped (SIGSTOP) past its lease TTL: its sandbox's processes stop (State T)
    by themselves within the TTL + a bound. On SIGCONT with the placement unchanged they run
    again once the node re-confirmed its lease; stopped again with the sandbox placed on
    another node meanwhile, they stay stopped until the node ends them."""
    c = cluster
    a = c.start_node("na")
    c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    c.sql("UPDATE nodes SET state = 'cordoned' WHERE name = 'nb'")
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert cc.get(f"/v1/sandboxes/{sid}")["node"] == "na"
    g = guest_pid(cc, sid)
    cc.exec(sid, WORKLOAD)
    poll(lambda: (hb_size(g) or 0) > 0, timeout=30, what="the workload writes")

    def frozen():
        st = workload_states(g)
        return bool(st) and all(s == "T" for s in st)

    # 1: stopped past the TTL, the placement unchanged
    epoch = epoch_of(c, "na")
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        poll(frozen, timeout=TTL_S + FREEZE_BOUND_S, what="the guest froze its processes",
             every=0.05)
        poll(lambda: lease_lapsed(c, "na"), timeout=60, what="na's lease lapsed")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    poll(lambda: not lease_lapsed(c, "na"), timeout=60, what="na re-confirmed its lease")
    assert epoch_of(c, "na") >= epoch
    poll(lambda: not any(s == "T" for s in workload_states(g)), timeout=60,
         what="the processes run again")
    n0 = hb_size(g)
    poll(lambda: (hb_size(g) or 0) > n0, timeout=30, what="the workload writes again")
    assert "hb" in exec_out(a, sid, "ls /home")

    # 2: stopped past the TTL, the sandbox placed elsewhere meanwhile
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        poll(frozen, timeout=TTL_S + FREEZE_BOUND_S, what="the guest froze its processes again",
             every=0.05)
        poll(lambda: lease_lapsed(c, "na"), timeout=60, what="na's lease lapsed")
        c.sql("UPDATE nodes SET state = 'ready' WHERE name = 'nb'")
        c.sql(f"UPDATE placements SET node = 'nb', generation = generation + 1"
              f" WHERE sandbox_id = '{sid}'")
        workload = descendants(g)
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    # until they are gone, none of its processes runs again: each is stopped by its guest
    # (T) or in the node's cgroup freeze (D) until it ends, and the workload writes nothing
    hb = hb_size(g)
    deadline = time.time() + 120
    while any(os.path.exists(f"/proc/{p}") for p in workload):
        for p in workload:
            try:
                st = _status(p, "State")[0]
            except (OSError, StopIteration):
                continue
            # R is allowed only on the way out: a stopped task that gets SIGKILL is woken to
            # exit (it runs no code of its own again); the workload's writes are checked below
            assert st in ("T", "D", "Z", "X") or (st == "R" and killed(p)), \
                f"process {p} of the moved sandbox runs: {st}"
        now = hb_size(g)
        assert now is None or now == hb, f"the moved sandbox's workload wrote ({hb} → {now})"
        assert time.time() < deadline, "the moved sandbox's processes were not ended"
        time.sleep(0.05)
    poll(lambda: init_pid(a, sid) == 0, timeout=60, what="the moved sandbox stopped on na")
    assert "fenced itself" in a.log_tail(40000)
