"""Sandbox lifecycle through the REST API: create (fields and defaults), get, list with
filters, delete, and the shape of ids (issue 2, shared/API.md "Sandboxes")."""
import re
import time

import pytest

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
