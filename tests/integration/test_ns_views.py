"""Without lxcfs (not installed, or COVE_LXCFS=off) ns sandboxes still start and work; they
see the host's memory in /proc/meminfo, and coved says why once at start (event
runtime.view)."""
import pytest


@pytest.mark.root
def test_sandboxes_work_without_lxcfs(coved_factory):
    coved = coved_factory(env={"COVE_LXCFS": "/nonexistent/lxcfs"})
    c = coved.client
    view = [ln for ln in coved.log_lines() if ln.get("event") == "runtime.view"]
    assert len(view) == 1 and view[0]["level"] == "warn" and \
        "COVE_LXCFS" in view[0]["msg"], view
    sb = c.create(template="busybox", memory_mb=128, cpus=1)
    try:
        r = c.exec(sb["id"], "grep MemTotal /proc/meminfo; nproc")
        assert r["exit_code"] == 0, r
        with open("/proc/meminfo") as f:
            host = f.readline().split()[1]
        mem, nproc = r["stdout"].split("\n")[:2]
        assert mem.split()[1] == host, "without lxcfs the view is the host's"
        assert nproc == "1", "the cpuset pins the sandbox to its CPUs all the same"
    finally:
        c.remove(sb["id"])
