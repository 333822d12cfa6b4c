"""The exec starter: a helper process of the guest agent that already sits in the workload's
cgroup and starts plain execs there (docs/performance.md "Where an exec round trip goes"). The
workload shares its uid and pid namespace, so it can kill or stop it: execs must go on working,
run where they belong, and the starter must come back."""
import time

import pytest

pytestmark = pytest.mark.root

PS = "for p in /proc/[0-9]*; do echo $(basename $p) $(cat $p/comm 2>/dev/null); done"


def starter_pids(client, sid):
    r = client.exec(sid, PS)
    assert r["exit_code"] == 0, r
    return [int(l.split()[0]) for l in r["stdout"].splitlines()
            if l.split()[1:] == ["cove-exec"]]


def await_starter(client, sid, not_pid=None, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        pids = [p for p in starter_pids(client, sid) if p != not_pid]
        if pids:
            return pids[0]
        time.sleep(0.1)
    raise AssertionError(f"no exec starter in {sid} after {timeout} s")


def test_exec_runs_in_the_workload_cgroup_as_the_agents_child(client, sandbox):
    sid = sandbox["id"]
    await_starter(client, sid)
    r = client.exec(sid, "echo $PPID; cat /proc/self/cgroup")
    assert r["exit_code"] == 0, r
    lines = r["stdout"].splitlines()
    assert lines[0] == "1", r  # the agent (PID 1) is its parent, not the starter
    # the same cgroups as a process the agent starts itself (with a PTY: never the starter)
    p = client.exec(sid, "cat /proc/self/cgroup", pty={"cols": 80, "rows": 24})
    assert sorted(lines[1:]) == sorted(p["stdout"].replace("\r", "").splitlines()), (r, p)
    assert any(l.endswith("/work") for l in lines[1:]), r


def test_killed_starter_is_replaced_and_execs_go_on(client, sandbox):
    sid = sandbox["id"]
    old = await_starter(client, sid)
    r = client.exec(sid, f"kill -KILL {old}")
    assert r["exit_code"] == 0, r
    for i in range(5):  # every exec answers, the first ones without the starter
        r = client.exec(sid, ["echo", f"after-{i}"])
        assert r["stdout"] == f"after-{i}\n" and r["exit_code"] == 0, r
    new = await_starter(client, sid, not_pid=old)
    assert new != old
    r = client.exec(sid, "kill -KILL -1")  # everything but the agent, the starter too
    r = client.exec(sid, ["echo", "still"])
    assert r["stdout"] == "still\n", r


def test_stopped_starter_does_not_stall_execs(client, sandbox):
    sid = sandbox["id"]
    pid = await_starter(client, sid)
    r = client.exec(sid, f"kill -STOP {pid}")
    assert r["exit_code"] == 0, r
    # a stalled starter would make this exec fail (503) once the agent gives up on it
    r = client.exec(sid, ["echo", "ok"])
    assert r["stdout"] == "ok\n", r
    assert pid in starter_pids(client, sid), "the starter was replaced instead of resumed"
