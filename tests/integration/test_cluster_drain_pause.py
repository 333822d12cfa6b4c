"""A drain's pause is the drain's, not the user's (one control replica, two nodes: the set-up
of test_cluster_roles.py). The drain pauses a sandbox with a `pause` job but keeps its desired
state `running`; a sandbox its user paused has desired state `paused`. So when the draining
node dies in the middle of a move, the node-loss recovery resumes the drained sandbox running
on another node from the pause's snapshot (the newest committed one), while a sandbox its user
paused on that node stays paused."""
import os
import signal

import pytest

from cove import poll

roles = pytest.importorskip("test_cluster_roles",
                            reason="needs the cluster roles and their test set-up "
                                   "(tests/integration/test_cluster_roles.py)")
cluster, pg, rgw, pytestmark = roles.cluster, roles.pg, roles.rgw, roles.pytestmark
pytestmark = [*pytestmark, pytest.mark.slow]  # minutes: not in the sanitizer pass
exec_out, live_nodes = roles.exec_out, roles.live_nodes


def nodes_by_name(cc):
    return {n["name"]: n for n in cc.get("/v1/nodes")["nodes"]}


def test_node_killed_during_a_drain_pause_resumes_the_sandbox_elsewhere(cluster):
    """kill -9 of the draining node after its pause of a sandbox committed but before it
    reported the job: once the node is lost, the sandbox runs on the other node from that
    pause's snapshot (files written after an earlier snapshot are there); the job table
    tells the drain's pause from the user's; the user-paused sandbox stays paused."""
    c = cluster
    a = c.start_node("na")
    c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    cc = c.control.client
    assert cc.post("/v1/nodes/nb/cordon")["state"] == "cordoned"
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert exec_out(a, sid, "echo early > /root/f; cat /root/f") == "early\n"
    early = cc.post(f"/v1/sandboxes/{sid}/snapshots", {}, expect=201)["id"]
    assert exec_out(a, sid, "echo late > /root/f; cat /root/f") == "late\n"
    uid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert exec_out(a, uid, "echo mine > /root/g; cat /root/g") == "mine\n"
    assert cc.post(f"/v1/sandboxes/{uid}/pause")["sandbox"]["state"] == "paused"
    assert c.sql(f"SELECT desired_state FROM placements WHERE sandbox_id = '{uid}'") == "paused"
    assert cc.post("/v1/nodes/nb/uncordon")["state"] == "ready"

    c.set_hooks("job_hold_ms 600000\n")  # na holds each job after running it, unreported
    r = cc.request("POST", "/v1/nodes/na/drain")
    assert r.status == 202 and r.json()["state"] == "draining"
    poll(lambda: "holding job" in a.log_tail(4000), timeout=180, what="the drain's pause held")
    held = c.sql(f"SELECT kind || ':' || state || ':' || coalesce(args_json, '') FROM jobs"
                 f" WHERE sandbox_id = '{sid}' ORDER BY id DESC LIMIT 1")
    assert held.startswith("pause:claimed:") and '"drain"' in held, held
    assert c.sql(f"SELECT desired_state FROM placements WHERE sandbox_id = '{sid}'") == "running"
    user_job = c.sql(f"SELECT coalesce(args_json, '') FROM jobs WHERE sandbox_id = '{uid}'"
                     f" AND kind = 'pause'")
    assert '"user"' in user_job, user_job
    pause_snap = cc.get(f"/v1/sandboxes/{sid}")["last_snapshot_id"]
    assert pause_snap and pause_snap != early  # the pause's snapshot committed before the hold
    a.kill9()
    c.set_hooks("")
    poll(lambda: nodes_by_name(cc)["na"]["state"] == "lost", timeout=180, what="na lost")

    def recovered():
        sb = cc.get(f"/v1/sandboxes/{sid}")
        return sb["state"] == "running" and sb["node"] == "nb"
    poll(recovered, timeout=300, what="the drained sandbox running on nb")
    sb = cc.get(f"/v1/sandboxes/{sid}")
    assert sb["recovered_from"]["snapshot_id"] == pause_snap, sb
    b = c.nodes["nb"]
    assert exec_out(b, sid, "cat /root/f") == "late\n"

    # the user's paused sandbox: moved off the lost node, still paused, resumable
    poll(lambda: cc.get(f"/v1/sandboxes/{uid}")["node"] == "nb", timeout=120,
         what="the paused sandbox moved off na")
    assert cc.get(f"/v1/sandboxes/{uid}")["state"] == "paused"
    assert c.sql(f"SELECT desired_state FROM placements WHERE sandbox_id = '{uid}'") == "paused"
    assert cc.post(f"/v1/sandboxes/{uid}/resume")["state"] == "running"
    assert exec_out(b, uid, "cat /root/g") == "mine\n"
    cc.remove(sid)
    cc.remove(uid)


def test_a_nodes_own_timeout_settles_the_desired_state(cluster):
    """A node's timer pausing (on_timeout pause) or stopping (kill) a sandbox is the node's
    own decision, written as the placement's desired state under its lease: when that node is
    lost afterwards, the paused one is moved off it still paused and the stopped one stays
    stopped (neither is recovered running elsewhere)."""
    c = cluster
    a = c.start_node("na")
    c.start_node("nb")
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    cc = c.control.client
    assert cc.post("/v1/nodes/nb/cordon")["state"] == "cordoned"
    pid_ = cc.create(template="busybox", snapshot_interval_s=0, timeout_s=3,
                     on_timeout="pause")["id"]
    kid = cc.create(template="busybox", snapshot_interval_s=0, timeout_s=3)["id"]
    assert exec_out(a, pid_, "echo kept > /root/p; cat /root/p") == "kept\n"
    assert cc.post("/v1/nodes/nb/uncordon")["state"] == "ready"
    desired = "SELECT desired_state FROM placements WHERE sandbox_id = '{}'"
    poll(lambda: cc.get(f"/v1/sandboxes/{pid_}")["state"] == "paused", timeout=120,
         what="the sandbox paused by its timeout")
    poll(lambda: cc.get(f"/v1/sandboxes/{kid}")["state"] == "stopped", timeout=120,
         what="the sandbox stopped by its timeout")
    assert c.sql(desired.format(pid_)) == "paused"
    assert c.sql(desired.format(kid)) == "stopped"

    a.kill9()
    poll(lambda: nodes_by_name(cc)["na"]["state"] == "lost", timeout=180, what="na lost")
    poll(lambda: cc.get(f"/v1/sandboxes/{pid_}")["node"] == "nb", timeout=120,
         what="the paused sandbox moved off na")
    assert cc.get(f"/v1/sandboxes/{pid_}")["state"] == "paused"
    sb = cc.get(f"/v1/sandboxes/{kid}")
    assert sb["state"] == "stopped" and sb["error"] == "timeout reached", sb
    assert c.sql(desired.format(kid)) == "stopped"
    assert cc.post(f"/v1/sandboxes/{pid_}/resume")["state"] == "running"
    assert exec_out(c.nodes["nb"], pid_, "cat /root/p") == "kept\n"
    cc.remove(pid_)
    cc.remove(kid)
