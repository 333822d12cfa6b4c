"""The node admin surface (docs/api.md "Nodes") on a coved in one process (role all): it has
no cluster nodes, so GET /v1/nodes lists none and cordon/uncordon/drain of any name answer
404; every node call needs an admin key; cove nodes prints the same (a table, or the JSON).
The decisions themselves (placement, drain, node loss) are in tests/unit/test_nodes.c and
tests/integration/test_pg_nodes.py."""
import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = json.load(open(os.path.join(ROOT, "docs", "openapi.json")))


def documented(path, method, status):
    return str(status) in SPEC["paths"][path][method]["responses"]


def tenant_client(client):
    t = client.post("/v1/tenants", {"name": "nodes-test"}, expect=201)
    k = client.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)
    return client.with_key(k["key"])


def test_nodes_in_role_all(client):
    assert client.get("/v1/nodes") == {"nodes": []}
    for action in ("cordon", "uncordon", "drain"):
        e = client.expect_error("POST", f"/v1/nodes/n1/{action}", 404, "not_found")
        assert "role all" in e["message"]
        assert documented(f"/v1/nodes/{{name}}/{action}", "post", 404)
    client.expect_error("POST", "/v1/nodes/n1/reboot", 404, "not_found")  # no such route


def test_nodes_need_an_admin_key(client):
    tc = tenant_client(client)
    tc.expect_error("GET", "/v1/nodes", 403, "unauthorized")
    for action in ("cordon", "uncordon", "drain"):
        tc.expect_error("POST", f"/v1/nodes/n1/{action}", 403, "unauthorized")
        assert documented(f"/v1/nodes/{{name}}/{action}", "post", 403)
    assert documented("/v1/nodes", "get", 403)


def test_sandbox_json_has_no_recovered_from_unless_recovered(client, sandbox):
    sb = client.sandbox(sandbox["id"])
    assert sb["node"] == "local"
    assert "recovered_from" not in sb


def test_cove_nodes_cli(build_dir, coved):
    env = dict(os.environ, COVE_URL=f"http://127.0.0.1:{coved.port}",
               COVE_API_KEY=coved.client.key)
    env.pop("COVE_DATA_DIR", None)
    cove = os.path.join(build_dir, "cove")

    def run(*args):
        return subprocess.run([cove, *args], env=env, capture_output=True, text=True,
                              timeout=60)

    r = run("nodes", "ls")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["NAME", "STATE", "LEASE", "EPOCH", "CPUS", "MEMORY_MB",
                                "DISK_MB", "SANDBOXES"]
    r = run("nodes", "ls", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"nodes": []}, r.stdout
    r = run("nodes", "drain", "n1")
    assert r.returncode == 1 and "no node n1" in r.stderr, r.stderr
    assert run("nodes", "drain").returncode == 2
    assert run("nodes", "reboot", "n1").returncode == 2
    assert run("nodes", "--help").returncode == 0
