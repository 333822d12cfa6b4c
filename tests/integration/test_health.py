"""The harness itself: coved starts, answers /healthz, and refuses requests without a key."""


def test_healthz(client):
    r = client.request("GET", "/healthz", auth=False)
    assert r.status == 200
    # snapshots: what a snapshot of a running sandbox keeps here (CRIU self-check result)
    assert r.json()["ok"] is True and r.json()["snapshots"] in ("full", "files", "checking")
    assert set(r.json()) == {"ok", "snapshots"}


def test_no_key_is_401_with_error_shape(client):
    e = client.expect_error("GET", "/v1/sandboxes", 401, "unauthorized", auth=False)
    assert isinstance(e["message"], str)


def test_wrong_key_is_401(client):
    r = client.request("GET", "/v1/sandboxes", key="cove_not_a_real_key")
    assert r.status == 401
    assert r.error.get("code") == "unauthorized"


def test_admin_key_lists_sandboxes(client):
    assert "sandboxes" in client.get("/v1/sandboxes")
