"""A template's start_cmd and ready_cmd: every new sandbox of it runs start_cmd as a listed
process, and is running (and its create answers) only once ready_cmd exits 0; a ready_cmd
that never passes fails the create within ready_timeout_s and leaves no sandbox."""
import time
import uuid

import pytest

from cove import poll


def build(client, name, timeout=300, **body):
    out = client.post("/v1/templates", {"name": name, **body}, expect=(202,))
    assert out == {"name": name, "state": "building"}
    return poll(lambda: (t := client.get(f"/v1/templates/{name}"))["state"] != "building" and t,
                timeout=timeout, what=f"template {name} built")


@pytest.fixture(scope="module")
def base_sandbox(client):
    """A base sandbox (python3, curl) whose files the templates below are saved from."""
    sb = client.create(template="base")
    yield sb["id"]
    client.remove(sb["id"])


def ids_of(client, name):
    return [s["id"] for s in client.get("/v1/sandboxes")["sandboxes"]
            if s["template"] == name and s["state"] not in ("stopped",)]


def test_start_cmd_runs_and_create_waits_for_ready(client, base_sandbox):
    name = "srv-" + uuid.uuid4().hex[:8]
    t = build(client, name, **{"from": {"sandbox": base_sandbox},
                               "start_cmd": "cd /tmp && exec python3 -m http.server 8000",
                               "ready_cmd": "curl -sf localhost:8000", "ready_timeout_s": 120})
    try:
        assert t["state"] == "ready", t
        assert t["start_cmd"] == "cd /tmp && exec python3 -m http.server 8000"
        assert t["ready_cmd"] == "curl -sf localhost:8000" and t["ready_timeout_s"] == 120
        sb = client.create(template=name)
        try:
            assert sb["state"] == "running", sb
            # right after the create answered: the server answers, no waiting here
            r = client.exec(sb["id"], "curl -sf localhost:8000")
            assert r["exit_code"] == 0, r
            procs = client.get(f"/v1/sandboxes/{sb['id']}/processes")["processes"]
            start = [p for p in procs if p.get("tag") == "start"]
            assert len(start) == 1 and start[0]["running"], procs
        finally:
            client.remove(sb["id"])
    finally:
        client.ok("DELETE", f"/v1/templates/{name}")


def test_ready_cmd_that_never_passes_fails_the_create_and_leaves_nothing(client, base_sandbox):
    name = "never-" + uuid.uuid4().hex[:8]
    t = build(client, name, **{"from": {"sandbox": base_sandbox},
                               "ready_cmd": "echo not yet; exit 7", "ready_timeout_s": 2})
    try:
        assert t["state"] == "ready", t
        t0 = time.monotonic()
        e = client.expect_error("POST", "/v1/sandboxes", 503, "unavailable",
                                {"template": name})
        assert time.monotonic() - t0 < 180  # bounded (2 s of tries), not hanging
        assert "ready_cmd did not exit 0 within 2 s" in e["message"], e
        assert "exited with 7: not yet" in e["message"], e
        assert ids_of(client, name) == []
    finally:
        client.ok("DELETE", f"/v1/templates/{name}")


@pytest.mark.parametrize("body,why", [
    ({"start_cmd": ""}, "start_cmd must be a shell command"),
    ({"ready_cmd": 3}, "ready_cmd must be a shell command"),
    ({"start_cmd": "x" * 5000}, "start_cmd must be a shell command of 1..4096 bytes"),
    ({"ready_timeout_s": 5}, "ready_timeout_s must be 1..3600, with ready_cmd"),
    ({"ready_cmd": "true", "ready_timeout_s": 0}, "ready_timeout_s must be 1..3600"),
])
def test_bad_start_and_ready_fields_are_refused(client, body, why):
    e = client.expect_error("POST", "/v1/templates", 400, "bad_request",
                            {"name": "badrun", "from": {"sandbox": "sbx_x"}, **body})
    assert why in e["message"], e
