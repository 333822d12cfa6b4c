"""Sandbox timeouts: expiry stops a sandbox; POST …/timeout extends it."""
import time

import pytest

pytestmark = pytest.mark.root


def test_expiry_stops_sandbox_and_exec_is_409(client):
    sb = client.create(template="busybox", timeout_s=2)
    sid = sb["id"]
    try:
        assert sb["state"] == "running"
        stopped = client.wait_state(sid, "stopped", timeout=60)
        assert stopped.get("error"), stopped  # says why
        client.expect_error("POST", f"/v1/sandboxes/{sid}/exec", 409, "conflict",
                            body={"shell": "true", "wait": True})
        client.expect_error("GET", f"/v1/sandboxes/{sid}/files?path=/etc/passwd", 409,
                            "conflict")
        client.expect_error("POST", f"/v1/sandboxes/{sid}/timeout", 409, "conflict",
                            body={"timeout_s": 60})
        assert sid in {s["id"] for s in
                       client.get("/v1/sandboxes?state=stopped")["sandboxes"]}
    finally:
        client.remove(sid)
    client.expect_error("GET", f"/v1/sandboxes/{sid}", 404, "not_found")


def test_extend_keeps_sandbox_alive(client):
    ref = client.create(template="busybox", timeout_s=3)
    ext = client.create(template="busybox", timeout_s=3)
    try:
        out = client.post(f"/v1/sandboxes/{ext['id']}/timeout", {"timeout_s": 60})
        assert out["id"] == ext["id"] and out["timeout_s"] == 60
        assert out["expires_at"] > ext["expires_at"]
        # the reference, created before the extended one with the same 3 s, expires first
        client.wait_state(ref["id"], "stopped", timeout=60)
        # poll a little past the original expiry of ext: stays running
        deadline = time.time() + 1.5
        while time.time() < deadline:
            assert client.sandbox(ext["id"])["state"] == "running"
            time.sleep(0.1)
        assert client.exec(ext["id"], "echo alive")["stdout"] == "alive\n"
        # shortening works too
        client.post(f"/v1/sandboxes/{ext['id']}/timeout", {"timeout_s": 1})
        client.wait_state(ext["id"], "stopped", timeout=60)
    finally:
        client.remove(ref["id"])
        client.remove(ext["id"])


def test_expired_sandbox_processes_are_gone(client):
    sb = client.create(template="busybox", timeout_s=2)
    sid = sb["id"]
    try:
        ev = client.exec(sid, "echo started; sleep 1000", wait=False)
        assert next(ev)["type"] == "start"
        client.wait_state(sid, "stopped", timeout=60)
        # the stream of the running process ends rather than hanging
        rest = list(ev)
        assert rest == [] or rest[-1]["type"] in ("exit", "error"), rest
    finally:
        client.remove(sid)


@pytest.mark.parametrize("bad", [0, -1, "10", 1.5, None, 10 ** 12])
def test_bad_timeout_values(client, sandbox, bad):
    client.expect_error("POST", f"/v1/sandboxes/{sandbox['id']}/timeout", 400, "bad_request",
                        body={"timeout_s": bad})
