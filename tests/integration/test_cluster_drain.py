"""Drain and node loss end to end: one control replica and two nodes (the set-up of
test_cluster_roles.py). `POST /v1/nodes/{name}/drain` moves three sandboxes from one node to
the other one at a time, their files kept, each move audited; `GET /v1/nodes` shows the node
empty and draining. A node killed (kill -9) past its lease TTL and the grace is marked lost
and its running sandbox is recovered on the other node from its last snapshot, with
recovered_from in the API."""
import os
import signal

import pytest

from cove import poll

# the cluster set-up (a control and nodes on PostgreSQL + radosgw) of the cluster core's tests
roles = pytest.importorskip("test_cluster_roles",
                            reason="needs the cluster roles and their test set-up "
                                   "(tests/integration/test_cluster_roles.py)")
cluster, pg, rgw, pytestmark = roles.cluster, roles.pg, roles.rgw, roles.pytestmark
pytestmark = [*pytestmark, pytest.mark.slow]  # minutes: not in the sanitizer pass
exec_out, init_pid, live_nodes = roles.exec_out, roles.init_pid, roles.live_nodes


def nodes_by_name(cc):
    return {n["name"]: n for n in cc.get("/v1/nodes")["nodes"]}


def test_drain_moves_sandboxes_with_their_files(cluster):
    c = cluster
    a = c.start_node("na")
    b = c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    cc = c.control.client
    # everything on na first: nb cordoned while creating
    assert cc.post("/v1/nodes/nb/cordon")["state"] == "cordoned"
    sids = []
    for i in range(3):
        sb = cc.create(template="busybox", snapshot_interval_s=0)
        assert sb["node"] == "na", sb
        assert exec_out(a, sb["id"], f"echo payload-{i} > /root/f; cat /root/f") == \
            f"payload-{i}\n"
        sids.append(sb["id"])
    ns = nodes_by_name(cc)
    assert ns["na"]["sandboxes"] == 3 and ns["na"]["lease"]["live"]
    assert cc.post("/v1/nodes/nb/uncordon")["state"] == "ready"
    r = cc.request("POST", "/v1/nodes/na/drain")
    assert r.status == 202 and r.json()["state"] == "draining"

    def moved():
        for sid in sids:
            sb = cc.get(f"/v1/sandboxes/{sid}")
            if sb["node"] != "nb" or sb["state"] != "running":
                return False
        return True
    poll(moved, timeout=300, what="every sandbox running on nb")
    for i, sid in enumerate(sids):
        assert exec_out(b, sid, "cat /root/f") == f"payload-{i}\n"
        assert init_pid(a, sid) == 0, "still a process on the drained node"
    ns = nodes_by_name(cc)
    assert ns["na"]["state"] == "draining" and ns["na"]["sandboxes"] == 0
    assert ns["nb"]["sandboxes"] == 3
    ev = cc.get("/v1/audit?kind=control")["events"]
    moves = [e for e in ev if e["action"] == "sandbox.move" and not e["verdict"]]
    assert sorted(e["sandbox"] for e in moves) == sorted(sids), ev
    for e in moves:
        d = e["detail"]
        assert d["from"] == "na" and d["to"] == "nb" and d["pause_ms"] <= d["wall_ms"], d
    print("drain moves (wall_ms, pause_ms):", [(e["detail"]["wall_ms"], e["detail"]["pause_ms"])
                                              for e in moves])


def test_lost_node_sandbox_recovered_elsewhere(cluster):
    c = cluster
    a = c.start_node("na")
    poll(lambda: live_nodes(c) == "na", timeout=60, what="na holds a lease")
    cc = c.control.client
    sb = cc.create(template="busybox", snapshot_interval_s=0)
    sid = sb["id"]
    assert exec_out(a, sid, "echo kept > /root/f; cat /root/f") == "kept\n"
    snap = cc.post(f"/v1/sandboxes/{sid}/snapshots", {}, expect=201)
    b = c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    poll(lambda: nodes_by_name(cc)["na"]["state"] == "lost", timeout=120, what="na lost")
    poll(lambda: cc.get(f"/v1/sandboxes/{sid}")["state"] == "running"
         and cc.get(f"/v1/sandboxes/{sid}")["node"] == "nb", timeout=300,
         what="the sandbox recovered on nb")
    got = cc.get(f"/v1/sandboxes/{sid}")
    rf = got["recovered_from"]
    assert rf["snapshot_id"] == snap["id"] and rf["lost_s"] >= 0, got
    assert exec_out(b, sid, "cat /root/f") == "kept\n"
