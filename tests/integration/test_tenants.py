"""Tenants, API keys and quotas (docs/api.md "Tenants"): admin endpoints, keys shown once,
every route of another tenant's ids answering 404 (the list is read from routes.c, so a new
route is covered without editing this file), and quotas answering 429 limit_exceeded."""
import os
import re

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.root


def routes():
    src = open(os.path.join(ROOT, "src", "lib", "api", "routes.c")).read()
    return re.findall(r'\{"(GET|POST|PUT|DELETE)", "([^"]+)"', src)


def new_tenant(client, **body):
    t = client.post("/v1/tenants", body, expect=201)
    k = client.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)
    assert k["key"].startswith("cove_key_") and k["tenant"] == t["id"]
    return t, client.with_key(k["key"]), k


def test_tenant_admin_endpoints(client):
    t, tc, k = new_tenant(client, name="Acme Corp", quotas={"sandboxes": 3})
    assert t["id"].startswith("ten_") and t["name"] == "Acme Corp"
    assert t["quotas"] == {"sandboxes": 3, "cpus": 0, "memory_mb": 0, "storage_mb": 0}
    assert t["usage"]["sandboxes"] == 0
    assert client.get(f"/v1/tenants/{t['id']}")["id"] == t["id"]
    assert t["id"] in [x["id"] for x in client.get("/v1/tenants")["tenants"]]
    # a key is shown once: the list has ids, never the key or its hash
    keys = client.get(f"/v1/tenants/{t['id']}/api-keys")["api_keys"]
    assert [x["id"] for x in keys] == [k["id"]]
    assert "key" not in keys[0] and k["key"] not in str(keys)
    # a tenant key is not an admin key
    for m, p in [("GET", "/v1/tenants"), ("POST", "/v1/tenants"),
                 ("GET", f"/v1/tenants/{t['id']}/api-keys"),
                 ("POST", f"/v1/tenants/{t['id']}/api-keys"),
                 ("PUT", f"/v1/tenants/{t['id']}/quotas"), ("DELETE", f"/v1/tenants/{t['id']}"),
                 ("POST", "/v1/keys"), ("POST", "/v1/keys/rotate")]:
        tc.expect_error(m, p, 403, "unauthorized", body={} if m in ("POST", "PUT") else None)
    assert tc.get("/v1/sandboxes")["sandboxes"] == []
    # quotas update; bad input
    t2 = client.put(f"/v1/tenants/{t['id']}/quotas", {"quotas": {"cpus": 4, "sandboxes": None}})
    assert t2["quotas"]["cpus"] == 4 and t2["quotas"]["sandboxes"] == 0
    client.expect_error("PUT", f"/v1/tenants/{t['id']}/quotas", 400, "bad_request",
                        body={"quotas": {"gpus": 1}})
    client.expect_error("PUT", f"/v1/tenants/{t['id']}/quotas", 400, "bad_request",
                        body={"quotas": {"cpus": -1}})
    client.expect_error("POST", "/v1/tenants", 400, "bad_request", body={"id": "../etc"})
    client.expect_error("POST", "/v1/tenants", 409, "conflict", body={"id": t["id"]})
    client.expect_error("GET", "/v1/tenants/ten_nope", 404, "not_found")
    client.expect_error("POST", f"/v1/tenants/{t['id']}/api-keys", 400, "bad_request",
                        body={"admin": True})
    # revoke the key: 401 from then on
    client.delete(f"/v1/tenants/{t['id']}/api-keys/{k['id']}")
    tc.expect_error("GET", "/v1/sandboxes", 401, "unauthorized")
    client.expect_error("DELETE", f"/v1/tenants/{t['id']}/api-keys/key_nope", 404, "not_found")
    # delete: its keys die with it, the id is not reused
    k2 = client.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)
    client.delete(f"/v1/tenants/{t['id']}")
    client.with_key(k2["key"]).expect_error("GET", "/v1/sandboxes", 401, "unauthorized")
    client.expect_error("GET", f"/v1/tenants/{t['id']}", 404, "not_found")
    assert t["id"] not in [x["id"] for x in client.get("/v1/tenants")["tenants"]]
    client.expect_error("POST", "/v1/tenants", 409, "conflict", body={"id": t["id"]})
    client.expect_error("DELETE", "/v1/tenants/default", 409, "conflict")


def fill(path, ids):
    out = path
    for name, val in ids.items():
        out = out.replace("{" + name + "}", val)
    return out


BODIES = {
    "exec": {"cmd": ["true"]},
    "timeout": {"timeout_s": 60},
    "mkdir": {"path": "/tmp/x"},
    "move": {"from": "/tmp/a", "to": "/tmp/b"},
    "remove": {"path": "/tmp/a"},
    "snapshots": {},
    "rewind": {"snapshot_id": "SNAP"},
    "fork": {},
    "egress": {"allow": []},
    "signal": {"signal": 15},
    "resize": {"cols": 80, "rows": 24},
}


def test_isolation_every_route(client, coved):
    ta, ca, _ = new_tenant(client, name="A")
    tb, cb, _ = new_tenant(client, name="B")
    sb = ca.create(template="busybox")
    proc = ca.exec(sb["id"], ["sh", "-c", "echo a-secret > /tmp/f; cat /tmp/f"])
    assert proc["stdout"] == "a-secret\n"
    snap = ca.post(f"/v1/sandboxes/{sb['id']}/snapshots", {}, expect=(200, 201))
    snap_id = (snap.get("snapshot") or snap)["id"]
    ids = {"id": sb["id"], "sid": snap_id, "to": snap_id, "pid": str(proc.get("pid", 1)),
           "tid": ta["id"], "kid": "key_aaaaaaaaaaaaaaaaaaaa"}
    checked = 0
    for method, path in routes():
        if "{id}" not in path and "{sid}" not in path:
            continue
        url = fill(path, ids)
        if "/files" in url or "/fs" in url:
            url += "?path=/tmp/f"
        last = path.rstrip("/").split("/")[-1]
        body = BODIES.get(last, {}) if method in ("POST", "PUT") else None
        if isinstance(body, dict) and body.get("snapshot_id") == "SNAP":
            body = {"snapshot_id": snap_id}
        if method == "PUT" and "/files" in url:
            body = b"x"
        r = cb.request(method, url, body)
        assert r.status == 404 and r.error.get("code") == "not_found", \
            f"tenant B {method} {url}: {r.status} {r.body[:200]!r}"
        assert b"a-secret" not in r.body
        checked += 1
        # the same read with A's key finds it: the 404 above is about the tenant, not a
        # malformed URL (streams are left out: they would wait for events)
        if method == "GET" and not url.split("?")[0].endswith(("/events", "/watch")):
            ra = ca.request(method, url)
            assert ra.status != 404, f"tenant A {method} {url}: {ra.status} {ra.body[:200]!r}"
    assert checked >= 25
    # lists: nothing of A
    assert cb.get("/v1/sandboxes")["sandboxes"] == []
    ev = cb.get(f"/v1/audit?sandbox={sb['id']}")
    assert ev.get("events", []) == []
    # key status of another tenant: 404 for a tenant key
    cb.expect_error("GET", f"/v1/keys?tenant={ta['id']}", 404, "not_found")
    cb.expect_error("POST", "/v1/keys/revoke", 404, "not_found", body={"tenant": ta["id"]})
    # revoking is never implied: the tenant must be named
    cb.expect_error("POST", "/v1/keys/revoke", 400, "bad_request", body={})
    assert cb.get("/v1/keys")["state"] in ("none", "active")
    # A still has everything
    assert ca.get(f"/v1/sandboxes/{sb['id']}")["state"] == "running"
    assert ca.get(f"/v1/snapshots/{snap_id}")["id"] == snap_id
    ca.remove(sb["id"], purge=True)


def test_quotas(client):
    t, tc, _ = new_tenant(client, quotas={"sandboxes": 2, "cpus": 2, "memory_mb": 768,
                                          "storage_mb": 4096})
    a = tc.create(template="busybox", memory_mb=256, disk_mb=1024)
    e = tc.expect_error("POST", "/v1/sandboxes", 429, "limit_exceeded",
                        body={"template": "busybox", "memory_mb": 600})
    assert "memory_mb" in e["message"]
    b = tc.create(template="busybox", memory_mb=256, disk_mb=1024)
    e = tc.expect_error("POST", "/v1/sandboxes", 429, "limit_exceeded",
                        body={"template": "busybox", "memory_mb": 64})
    assert "sandboxes" in e["message"]
    # nothing was made by the refusals
    assert len(tc.get("/v1/sandboxes")["sandboxes"]) == 2
    usage = client.get(f"/v1/tenants/{t['id']}")["usage"]
    assert usage == {"sandboxes": 2, "cpus": 2, "memory_mb": 512, "storage_mb": 2048}
    # fork counts every copy
    tc.expect_error("POST", f"/v1/sandboxes/{a['id']}/fork", 429, "limit_exceeded", body={})
    tc.remove(b["id"], purge=True)
    e = tc.expect_error("POST", f"/v1/sandboxes/{a['id']}/fork", 429, "limit_exceeded",
                        body={"count": 2})
    # pause frees cpus/memory but not the sandbox slot; resume is admitted again
    tc.post(f"/v1/sandboxes/{a['id']}/pause", {})
    c = tc.create(template="busybox", memory_mb=600, disk_mb=1024)
    e = tc.expect_error("POST", f"/v1/sandboxes/{a['id']}/resume", 429, "limit_exceeded",
                        body={})
    assert "memory_mb" in e["message"]
    tc.remove(c["id"], purge=True)
    assert tc.post(f"/v1/sandboxes/{a['id']}/resume", {})["state"] == "running"
    tc.remove(a["id"], purge=True)


def test_cli_tenants_and_keys(coved, build_dir, tmp_path):
    """`cove tenants` and `cove keys` drive the same endpoints."""
    import json
    import subprocess

    env = dict(os.environ, COVE_URL=f"http://127.0.0.1:{coved.port}",
               COVE_API_KEY=coved.client.key)

    def cove(*args, key=None, ok=True):
        e = dict(env, COVE_API_KEY=key) if key else env
        r = subprocess.run([os.path.join(build_dir, "cove"), *args], env=e,
                           capture_output=True, text=True, timeout=60)
        if ok:
            assert r.returncode == 0, (args, r.stderr)
        return r

    tid = cove("tenants", "create", "--name", "cli co", "--sandboxes", "1").stdout.strip()
    assert tid.startswith("ten_")
    key = cove("tenants", "key", tid).stdout.strip()
    assert key.startswith("cove_key_")
    assert tid in cove("tenants", "ls").stdout
    st = json.loads(cove("keys", "status", "--json", key=key).stdout)
    assert st["tenant"] == tid and st["state"] in ("none", "active")
    kf = tmp_path / "k.kek"
    kf.write_bytes(os.urandom(32))
    os.chmod(kf, 0o600)
    out = cove("keys", "add", "--tenant", tid, "--provider", "local", "--key-file", str(kf)).stdout
    assert tid in out and "local:" in out
    out = cove("keys", "rotate", "--tenant", tid).stdout
    assert " v3 " in out or "v3" in out
    assert tid in cove("keys", "list").stdout
    # a tenant key may not add keys; usage errors exit 2
    r = cove("keys", "add", "--provider", "local", key=key, ok=False)
    assert r.returncode == 1 and "unauthorized" in r.stderr
    assert cove("keys", "frob", ok=False).returncode == 2
    assert cove("keys", "add", ok=False).returncode == 2
    sb = json.loads(cove("create", "--template", "busybox", "--encrypted", "--json",
                         key=key).stdout)
    assert sb["storage_encrypted"] is True
    cove("rm", sb["id"], key=key)
    out = cove("keys", "revoke", "--policy", "finish", key=key).stdout
    assert "revoked" in out and "policy finish" in out
    r = cove("create", "--template", "busybox", key=key, ok=False)
    assert r.returncode == 1 and "key_revoked" in r.stderr
    kid = key[5:29]
    assert kid in cove("tenants", "keys", tid).stdout
    cove("tenants", "revoke-key", tid, kid)
    assert "revoked" in cove("tenants", "keys", tid).stdout
    cove("tenants", "rm", tid)
    assert tid not in cove("tenants", "ls").stdout


def test_isolation_e2b_surface(coved_factory):
    """The E2B-compatible API (X-API-KEY: e2b_<hex of a cove key>) scopes by tenant too."""
    import http.client
    import json

    from cove import free_port

    port = free_port()
    d = coved_factory(extra_args=["--e2b-api-listen", f"127.0.0.1:{port}",
                                  "--e2b-sandbox-listen", "none"])
    _, ca, ka = new_tenant(d.client)
    _, cb, kb = new_tenant(d.client)
    sb = ca.create(template="busybox")

    def e2b(key, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        h = {"X-API-KEY": "e2b_" + key.encode().hex(), "Content-Type": "application/json"}
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
        r = c.getresponse()
        out = (r.status, r.read())
        c.close()
        return out

    src = open(os.path.join(ROOT, "src", "lib", "api", "e2b.c")).read()
    routes = re.findall(r'\{"(GET|POST|DELETE|PUT|PATCH)", "([^"]*\{id\}[^"]*)"', src)
    assert len(routes) >= 8
    bodies = {"timeout": {"timeout": 60}, "connect": {"timeout": 60}}
    for method, path in routes:
        url = path.replace("{id}", sb["id"])
        body = bodies.get(url.rsplit("/", 1)[-1], {}) if method != "GET" else None
        status, data = e2b(kb["key"], method, url, body)
        assert status == 404, f"tenant B E2B {method} {url}: {status} {data[:200]!r}"
    status, data = e2b(kb["key"], "GET", "/sandboxes")
    assert status == 200 and sb["id"] not in data.decode()
    status, _ = e2b(ka["key"], "GET", f"/sandboxes/{sb['id']}")
    assert status == 200
    assert ca.sandbox(sb["id"])["state"] == "running"


def test_admin_reads_any_tenants_audit(coved, build_dir):
    """GET /v1/audit?tenant=T: an admin reads T's chain (a deleted tenant's too), 404 for a
    tenant that never existed; a tenant key naming another tenant gets 404 and sees only its
    own events; `cove audit --tenant` does the same."""
    import json
    import subprocess

    admin = coved.client
    ta, ca, _ = new_tenant(admin)
    tb, cb, kb = new_tenant(admin)
    s = ca.create(template="busybox")
    ca.remove(s["id"])
    ev = admin.get(f"/v1/audit?tenant={ta['id']}")["events"]
    assert ev and all(e["tenant"] == ta["id"] for e in ev)
    acts = {(e["kind"], e["action"], e["sandbox"]) for e in ev}
    assert ("control", "create", s["id"]) in acts and ("control", "delete", s["id"]) in acts
    # without the parameter an admin reads its own tenant's chain, as before
    own = admin.get("/v1/audit")["events"]
    assert all(e["tenant"] == "default" for e in own)
    assert s["id"] not in json.dumps(own)
    # the other filters apply to the named tenant
    ev2 = admin.get(f"/v1/audit?tenant={ta['id']}&kind=control&sandbox={s['id']}")["events"]
    assert {e["action"] for e in ev2} >= {"create", "delete"}
    assert all(e["sandbox"] == s["id"] for e in ev2)
    admin.expect_error("GET", "/v1/audit?tenant=ten_neverexisted", 404, "not_found")
    # a tenant key: its own tenant by name is fine, any other is 404 (as for other ids)
    assert all(e["tenant"] == tb["id"] for e in cb.get(f"/v1/audit?tenant={tb['id']}")["events"])
    e = cb.expect_error("GET", f"/v1/audit?tenant={ta['id']}", 404, "not_found")
    assert ta["id"] in e["message"]
    cb.expect_error("GET", "/v1/audit?tenant=default", 404, "not_found")
    # a deleted tenant's events outlive it
    admin.request("DELETE", f"/v1/tenants/{ta['id']}")
    ev3 = admin.get(f"/v1/audit?tenant={ta['id']}")["events"]
    assert ("tenant", "delete") in {(x["kind"], x["action"]) for x in ev3}
    # the CLI
    env = dict(os.environ, COVE_URL=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=admin.key)
    cli = os.path.join(build_dir, "cove")
    r = subprocess.run([cli, "audit", "--tenant", ta["id"], "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert lines and all(x["tenant"] == ta["id"] for x in lines)
    r = subprocess.run([cli, "audit", "--tenant", ta["id"]], env=dict(env, COVE_API_KEY=kb["key"]),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not_found" in r.stderr
