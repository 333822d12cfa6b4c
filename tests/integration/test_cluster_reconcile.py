"""A node's restart (docs/cluster.md "A node restarted"), on the bed of test_cluster_roles (one
control, a node as a process on loopback, a real PostgreSQL and radosgw): after kill -9 of a
node's coved and a new process under the same name, its start-up reconcile settles the
sandboxes whose instances died with the old process, and the control resumes on that node,
through a resume job, every one whose desired state is `running` from its newest committed
snapshot. One its user paused stays paused; one without a snapshot ends stopped, its reason
in its error and its desired state stopped too."""
import pytest

from cove import poll

roles = pytest.importorskip("test_cluster_roles",
                            reason="needs the cluster roles and their test set-up "
                                   "(tests/integration/test_cluster_roles.py)")
cluster, pg, rgw, pytestmark = roles.cluster, roles.pg, roles.rgw, roles.pytestmark
pytestmark = [*pytestmark, pytest.mark.slow]  # minutes: not in the sanitizer pass
exec_out, live_nodes = roles.exec_out, roles.live_nodes
sandbox_procs, descends = roles.sandbox_procs, roles.descends


def epoch_of(c, name):
    return int(c.node_row(name).split("|")[1])


def placement(c, sid):
    """desired:observed:generation:node of sid's placement"""
    return c.sql(f"SELECT desired_state || ':' || observed_state || ':' || generation || ':' ||"
                 f" node FROM placements WHERE sandbox_id = '{sid}'")


def test_restarted_node_runs_its_sandboxes_again(cluster):
    """kill -9 of a node holding a running sandbox with a committed snapshot, one its user
    paused and a running one without a snapshot, then the node started again: the first runs
    again on that node (a resume job under the new epoch, a new generation) with the files of
    its snapshot and one instance, under the new process; the paused one stays paused; the
    one without a snapshot is stopped with its reason and desired state stopped."""
    c = cluster
    a = c.start_node("na")
    poll(lambda: live_nodes(c) == "na", timeout=60, what="node na holds a lease")
    cc = c.control.client
    run = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert exec_out(a, run, "echo kept > /root/f; cat /root/f") == "kept\n"
    snap = cc.post(f"/v1/sandboxes/{run}/snapshots", {"kind": "files"}, expect=201)["id"]
    held = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert exec_out(a, held, "echo mine > /root/g; cat /root/g") == "mine\n"
    assert cc.post(f"/v1/sandboxes/{held}/pause")["sandbox"]["state"] == "paused"
    bare = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert exec_out(a, bare, "echo gone > /root/h; cat /root/h") == "gone\n"
    gen_run = int(placement(c, run).split(":")[2])
    held_before = placement(c, held)
    epoch = epoch_of(c, "na")

    port, data = a.port, a.data
    a.kill9()
    poll(lambda: not sandbox_procs(run) and not sandbox_procs(bare), timeout=60,
         what="the instances ended with their node")
    a2 = c.start_node("na", data=data, port=port)
    poll(lambda: epoch_of(c, "na") > epoch and live_nodes(c) == "na", timeout=120,
         what="na holds a new lease")

    def running_again():
        sb = cc.get(f"/v1/sandboxes/{run}")
        return sb["state"] == "running" and sb["node"] == "na"
    poll(running_again, timeout=300, what="the sandbox with a snapshot running again on na")
    assert exec_out(a2, run, "cat /root/f") == "kept\n"
    desired, observed, gen, node = placement(c, run).split(":")
    assert (desired, node) == ("running", "na") and int(gen) > gen_run, placement(c, run)
    job = c.sql(f"SELECT kind || ':' || state || ':' || claimed_epoch FROM jobs"
                f" WHERE sandbox_id = '{run}' ORDER BY id DESC LIMIT 1")
    assert job == f"resume:done:{epoch_of(c, 'na')}", job
    assert cc.get(f"/v1/sandboxes/{run}")["last_snapshot_id"] == snap
    procs = sandbox_procs(run)
    assert procs and all(descends(p, a2.proc.pid) for p in procs), procs

    # the one its user paused: untouched
    sb = cc.get(f"/v1/sandboxes/{held}")
    assert sb["state"] == "paused", sb
    assert placement(c, held) == held_before
    assert not sandbox_procs(held)

    # the one without a snapshot: stopped, with why, and nothing wants it running
    poll(lambda: cc.get(f"/v1/sandboxes/{bare}")["state"] == "stopped", timeout=120,
         what="the sandbox without a snapshot stopped")
    sb = cc.get(f"/v1/sandboxes/{bare}")
    assert "no snapshot" in (sb.get("error") or ""), sb
    assert placement(c, bare).split(":")[0] == "stopped", placement(c, bare)
    assert not sandbox_procs(bare)

    # the paused one still resumes on the user's word, with its files
    assert cc.post(f"/v1/sandboxes/{held}/resume")["state"] == "running"
    assert exec_out(a2, held, "cat /root/g") == "mine\n"
    for sid in (run, held, bare):
        cc.remove(sid)
