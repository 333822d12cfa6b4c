"""Sandbox lifecycle through the REST API: create (fields and defaults), get, list with
filters, delete, and the shape of ids (docs/api.md "Sandboxes")."""
import re
import time

import pytest

from cove import guest_pid

pytestmark = pytest.mark.root

FIELDS = {"id", "state", "template", "runtime", "created_at", "expires_at", "cpus",
          "memory_mb", "disk_mb", "metadata", "node", "last_snapshot_id"}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def _ts(s):
    return time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S"))


def test_create_has_documented_fields_and_defaults(client):
    sb = client.create(template="busybox")
    try:
        assert FIELDS <= set(sb), f"missing {FIELDS - set(sb)}"
        assert sb["state"] == "running"
        assert sb["template"] == "busybox"
        assert sb["runtime"] == "ns"
        assert (sb["cpus"], sb["memory_mb"], sb["disk_mb"]) == (1, 512, 1024)
        assert sb["timeout_s"] == 300
        assert sb["metadata"] == {}
        assert sb["last_snapshot_id"] is None
        assert RFC3339.match(sb["created_at"]) and RFC3339.match(sb["expires_at"])
        assert _ts(sb["expires_at"]) - _ts(sb["created_at"]) in (299, 300, 301)
        # GET answers the same sandbox
        got = client.sandbox(sb["id"])
        for k in FIELDS | {"timeout_s"}:
            assert got[k] == sb[k], k
        # and it really runs
        assert client.exec(sb["id"], "echo ready")["stdout"] == "ready\n"
    finally:
        client.remove(sb["id"])


def test_create_with_explicit_resources(client):
    sb = client.create(template="busybox", cpus=1, memory_mb=128, disk_mb=64, timeout_s=120,
                       metadata={"owner": "alice", "team": "x"}, env={"GREETING": "hej"})
    try:
        assert (sb["memory_mb"], sb["disk_mb"], sb["timeout_s"]) == (128, 64, 120)
        assert sb["metadata"] == {"owner": "alice", "team": "x"}
        # sandbox env reaches processes
        assert client.exec(sb["id"], "echo $GREETING")["stdout"] == "hej\n"
    finally:
        client.remove(sb["id"])


def test_ids_are_prefixed_and_unguessable(client):
    ids = []
    try:
        for _ in range(3):
            ids.append(client.create(template="busybox")["id"])
        for i in ids:
            assert re.fullmatch(r"sbx_[A-Za-z0-9]{20}", i), i
        assert len(set(ids)) == 3
        # not sequential: the random parts share no long common prefix
        parts = [i[4:] for i in ids]
        assert len({p[:6] for p in parts}) == 3
    finally:
        for i in ids:
            client.remove(i)


def test_list_filters_by_state_and_metadata(client):
    tag = f"run{time.time_ns()}"
    a = client.create(template="busybox", metadata={"suite": tag, "role": "a"})
    b = client.create(template="busybox", metadata={"suite": tag, "role": "b"})
    try:
        def ids(q):
            return {s["id"] for s in client.get("/v1/sandboxes" + q)["sandboxes"]}

        assert {a["id"], b["id"]} <= ids("")
        assert ids(f"?metadata.suite={tag}") == {a["id"], b["id"]}
        assert ids(f"?metadata.suite={tag}&metadata.role=b") == {b["id"]}
        assert ids(f"?metadata.suite={tag}&metadata.role=zzz") == set()
        assert ids(f"?metadata.suite={tag}&state=running") == {a["id"], b["id"]}
        assert ids(f"?metadata.suite={tag}&state=paused,stopped") == set()
        for s in client.get("/v1/sandboxes?state=running")["sandboxes"]:
            assert s["state"] == "running"
            assert FIELDS <= set(s)
    finally:
        client.remove(a["id"])
        client.remove(b["id"])


def test_delete_then_404_everywhere(client):
    sid = client.create(template="busybox")["id"]
    r = client.request("DELETE", f"/v1/sandboxes/{sid}")
    assert r.status == 204 and r.body == b""
    client.expect_error("GET", f"/v1/sandboxes/{sid}", 404, "not_found")
    client.expect_error("DELETE", f"/v1/sandboxes/{sid}", 404, "not_found")
    client.expect_error("POST", f"/v1/sandboxes/{sid}/exec", 404, "not_found",
                        body={"shell": "true", "wait": True})
    assert sid not in {s["id"] for s in client.get("/v1/sandboxes")["sandboxes"]}


def test_delete_kills_running_processes(client):
    sid = client.create(template="busybox")["id"]
    ev = client.exec(sid, "echo up; sleep 1000", wait=False)
    assert next(ev)["type"] == "start"
    client.remove(sid)
    # the stream of a process of a deleted sandbox ends (no hang): read to the end
    rest = list(ev)
    assert all(e["type"] != "exit" or e.get("signal") for e in rest)


def test_concurrent_deletes_one_wins(coved):
    """Racing DELETEs (and execs) of one sandbox: exactly one 204, the rest 404 or 409,
    and coved keeps running (a double stop once freed the instance twice)."""
    import threading

    c = coved.client
    for _ in range(3):
        sid = c.create(template="busybox")["id"]
        ev = c.exec(sid, "sleep 100", wait=False, timeout=60)
        assert next(ev)["type"] == "start"
        res = []

        def call(kind, *a, **kw):
            try:
                res.append((kind, c.request(*a, timeout=60, **kw).status))
            except Exception as e:  # noqa: BLE001 - a dropped connection is a failure
                res.append((kind, repr(e)))

        def delete():
            call("delete", "DELETE", f"/v1/sandboxes/{sid}")

        def run():
            call("exec", "POST", f"/v1/sandboxes/{sid}/exec", {"shell": "echo", "wait": True})

        ts = [threading.Thread(target=delete) for _ in range(6)] + \
             [threading.Thread(target=run) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(90)
        deletes = sorted(s for k, s in res if k == "delete")
        assert deletes == [204] + [404] * 5, res
        assert all(s in (200, 404, 409, 503) for k, s in res if k == "exec"), res
        assert coved.alive()
    assert c.request("GET", "/healthz", auth=False, timeout=10).status == 200


def test_guest_death_marks_sandbox_error_and_node_keeps_serving(coved):
    """The guest (PID 1 of the sandbox) killed from the host: that sandbox becomes `error`
    with a reason; every other sandbox keeps working (the channel I/O thread once
    deadlocked here, freezing all sandboxes)."""
    import os
    import signal

    c = coved.client
    victim = c.create(template="busybox")["id"]
    other = c.create(template="busybox")["id"]
    try:
        guest = guest_pid(c, victim)
        os.kill(guest, signal.SIGKILL)
        sb = c.wait_state(victim, ("error", "stopped"), timeout=60)
        assert sb["state"] == "error" and sb.get("error"), sb
        c.expect_error("POST", f"/v1/sandboxes/{victim}/exec", 503, "unavailable",
                       body={"shell": "true", "wait": True})
        # the rest of the node is unaffected
        assert c.exec(other, "echo still here", timeout=30)["stdout"] == "still here\n"
        new = c.create(template="busybox")["id"]
        assert c.exec(new, "echo new", timeout=30)["stdout"] == "new\n"
        c.remove(new)
    finally:
        c.remove(victim)
        c.remove(other)
