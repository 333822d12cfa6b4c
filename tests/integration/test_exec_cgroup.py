"""Where an exec'd process lands: the workload's memory group (cove/<id>/work), which the guest
moves it into before it execs (docs/performance.md "The first exec of a fresh sandbox")."""
import os

import pytest

from hostutil import cgroup_file

pytestmark = pytest.mark.root


def _memory_line(client, sid):
    r = client.exec(sid, ["cat", "/proc/self/cgroup"])
    assert r["exit_code"] == 0, r
    lines = [ln for ln in r["stdout"].splitlines() if ln.split(":")[1:2] in (["memory"], [""])]
    assert lines, r["stdout"]
    return lines[0].split(":", 2)[2]


def test_exec_runs_in_the_work_group(client, sandbox):
    assert _memory_line(client, sandbox["id"]).rstrip("/").endswith("/work")


def test_v1_child_moves_itself_through_tasks(client, sandbox):
    """On cgroup v1 the guest's child moves itself through work/tasks (a thread move, which
    takes no host-wide lock), not work/cgroup.procs: with cgroup.procs taken back from the
    sandbox, an exec still lands in work."""
    sid = sandbox["id"]
    procs = cgroup_file(f"{sid}/work", "memory", "cgroup.procs")
    tasks = cgroup_file(f"{sid}/work", "memory", "tasks")
    if not procs or not tasks:
        pytest.skip("no cgroup v1 memory hierarchy here (v2 has no tasks file)")
    st = os.stat(tasks)
    assert st.st_uid == os.stat(procs).st_uid != 0, "work/tasks is not delegated to the sandbox"
    os.chown(procs, 0, -1)  # the sandbox's root can no longer write cgroup.procs
    try:
        assert _memory_line(client, sid).rstrip("/").endswith("/work")
    finally:
        os.chown(procs, st.st_uid, -1)


def test_full_snapshot_right_after_the_first_exec(client):
    """A full snapshot (CRIU) of a sandbox taken right after its first exec, with that exec's
    process still running in work, resumes; after it, that process is still in work and new
    execs land there too (v1: work/tasks delegated again)."""
    c = client
    kind = c.snapshot_kind()
    if kind != "full":
        pytest.skip(f"this coved has no full snapshots (/healthz snapshots: {kind})")
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        ev = list(c.stream(f"/v1/sandboxes/{sid}/exec", {"cmd": ["sleep", "600"]},
                           max_events=1))
        assert ev and ev[0]["type"] == "start", ev
        pid = ev[0]["pid"]
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["snapshot"]["kind"] == "full", r
        assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
        r = c.exec(sid, ["cat", f"/proc/{pid}/cgroup"])
        assert r["exit_code"] == 0, r
        mem = [ln for ln in r["stdout"].splitlines() if ln.split(":")[1:2] in (["memory"], [""])]
        assert mem and mem[0].rstrip("/").endswith("/work"), r["stdout"]
        assert _memory_line(c, sid).rstrip("/").endswith("/work")
        tasks = cgroup_file(f"{sid}/work", "memory", "tasks")
        procs = cgroup_file(f"{sid}/work", "memory", "cgroup.procs")
        if tasks and procs:
            assert os.stat(tasks).st_uid == os.stat(procs).st_uid != 0
    finally:
        c.remove(sid, purge=True)
