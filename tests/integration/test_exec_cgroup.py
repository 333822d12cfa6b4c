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
