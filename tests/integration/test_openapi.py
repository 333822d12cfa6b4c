"""docs/openapi.json against the running server: every route of the server is documented
and every documented operation exists, and real answers match the documented schemas and
error statuses."""
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = json.load(open(os.path.join(ROOT, "docs", "openapi.json")))
SCHEMAS = SPEC["components"]["schemas"]

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def check(value, schema, where="$"):
    """A small JSON-schema subset validator: $ref, type (incl. lists), required,
    properties, additionalProperties, items, enum, minimum, minItems."""
    if "$ref" in schema:
        return check(value, SCHEMAS[schema["$ref"].split("/")[-1]], where)
    t = schema.get("type")
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        ok = False
        for one in ts:
            if one == "integer":
                ok |= isinstance(value, int) and not isinstance(value, bool)
            elif one == "number":
                ok |= isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok |= isinstance(value, TYPES[one])
        assert ok, f"{where}: {value!r} is not {t}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    if "minimum" in schema and isinstance(value, int):
        assert value >= schema["minimum"], f"{where}: {value} < {schema['minimum']}"
    if isinstance(value, dict):
        for k in schema.get("required", []):
            assert k in value, f"{where}: missing {k!r} (has {sorted(value)})"
        props = schema.get("properties", {})
        for k, v in value.items():
            if k in props:
                check(v, props[k], f"{where}.{k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                check(v, schema["additionalProperties"], f"{where}.{k}")
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0), f"{where}: too few items"
        for i, v in enumerate(value):
            check(v, schema.get("items", {}), f"{where}[{i}]")


def response_schema(path, method, status, ctype="application/json"):
    op = SPEC["paths"][path][method]
    resp = op["responses"][str(status)]
    return resp["content"][ctype]["schema"]


def server_routes():
    src = open(os.path.join(ROOT, "src", "lib", "api", "routes.c")).read()
    return {(m.lower(), p) for m, p in re.findall(r'\{"(GET|POST|PUT|DELETE)", "([^"]+)"', src)}


def test_every_route_is_documented_and_every_documented_route_exists():
    documented = {(m, p) for p, ops in SPEC["paths"].items() for m in ops if m != "parameters"}
    assert server_routes() == documented


def test_documented_paths_answer(client, sandbox):
    """No documented path answers 404 'no such endpoint' or 405 for its method."""
    sid = sandbox["id"]
    for path, ops in SPEC["paths"].items():
        for method in ops:
            if method == "parameters" or method == "delete":
                continue
            url = path.replace("{id}", sid).replace("{pid}", "1")
            if method == "get" and url.endswith(("/events", "/watch")):
                continue  # streams: covered below
            if "{" in url:
                continue
            sep = "&" if "?" in url else "?"
            r = client.request(method.upper(), url + sep + "path=/tmp", body={} if method != "get" else None)
            assert r.status != 405, f"{method} {path}: 405"
            if r.status == 404:
                assert r.error.get("message") != "no such endpoint", f"{method} {path}"


def test_answers_match_schemas(client, sandbox):
    sid = sandbox["id"]
    check(sandbox, response_schema("/v1/sandboxes", "post", 201))
    check(client.get(f"/v1/sandboxes/{sid}"), response_schema("/v1/sandboxes/{id}", "get", 200))
    check(client.get("/v1/sandboxes"), response_schema("/v1/sandboxes", "get", 200))
    check(client.get("/v1/templates"), response_schema("/v1/templates", "get", 200))
    check(client.get("/healthz", auth=False), response_schema("/healthz", "get", 200))

    r = client.request("POST", f"/v1/sandboxes/{sid}/exec", {"shell": "echo hi; exit 3", "wait": True})
    assert r.status == 200
    check(r.json(), response_schema("/v1/sandboxes/{id}/exec", "post", 200))
    assert r.json()["exit_code"] == 3

    events = list(client.stream(f"/v1/sandboxes/{sid}/exec", {"shell": "echo a; echo b >&2"}))
    ev_schema = response_schema("/v1/sandboxes/{id}/exec", "post", 200, "application/x-ndjson")
    for e in events:
        check(e, ev_schema)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    pid = events[0]["pid"]
    replay = list(client.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after=1", method="GET"))
    assert replay == events[1:]

    check(client.get(f"/v1/sandboxes/{sid}/processes"),
          response_schema("/v1/sandboxes/{id}/processes", "get", 200))
    entry = client.put_file(sid, "/tmp/o.txt", b"x" * 10, mode=0o600)
    check(entry, response_schema("/v1/sandboxes/{id}/files", "put", 200))
    assert entry["size"] == 10 and entry["mode"] == 0o600
    check(client.get(f"/v1/sandboxes/{sid}/fs?path=/tmp&depth=2"),
          response_schema("/v1/sandboxes/{id}/fs", "get", 200))
    check(client.post(f"/v1/sandboxes/{sid}/fs/mkdir", {"path": "/tmp/d1/d2"}),
          response_schema("/v1/sandboxes/{id}/fs/mkdir", "post", 200))
    check(client.post(f"/v1/sandboxes/{sid}/fs/move", {"from": "/tmp/o.txt", "to": "/tmp/d1/o.txt"}),
          response_schema("/v1/sandboxes/{id}/fs/move", "post", 200))
    check(client.post(f"/v1/sandboxes/{sid}/fs/remove", {"path": "/tmp/d1", "recursive": True}),
          response_schema("/v1/sandboxes/{id}/fs/remove", "post", 200))
    check(client.post(f"/v1/sandboxes/{sid}/timeout", {"timeout_s": 600}),
          response_schema("/v1/sandboxes/{id}/timeout", "post", 200))


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/v1/sandboxes", b"{", 400),
    ("POST", "/v1/sandboxes", {"template": 7}, 400),
    ("GET", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa", None, 404),
    ("DELETE", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa", None, 404),
    ("POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/exec", {"shell": "true"}, 404),
    ("POST", "/v1/templates", {}, 400),
])
def test_errors_are_documented(client, method, path, body, status):
    if isinstance(body, bytes):
        r = client.request(method, path, body, headers={"Content-Type": "application/json"})
    else:
        r = client.request(method, path, body)
    assert r.status == status, r.body[:200]
    check(r.json(), SCHEMAS["Error"])
    spec_path = re.sub(r"sbx_[a-z]+", "{id}", path)
    assert str(status) in SPEC["paths"][spec_path][method.lower()]["responses"], \
        f"{method} {spec_path} answers {status}, which is not documented"


def test_tenant_and_key_answers_match_schemas(client):
    t = client.post("/v1/tenants", {"quotas": {"cpus": 2}}, expect=201)
    check(t, response_schema("/v1/tenants", "post", 201))
    check(client.get("/v1/tenants"), response_schema("/v1/tenants", "get", 200))
    check(client.get(f"/v1/tenants/{t['id']}"), response_schema("/v1/tenants/{tid}", "get", 200))
    check(client.put(f"/v1/tenants/{t['id']}/quotas", {"quotas": {"sandboxes": 1}}),
          response_schema("/v1/tenants/{tid}/quotas", "put", 200))
    k = client.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)
    check(k, response_schema("/v1/tenants/{tid}/api-keys", "post", 201))
    check(client.get(f"/v1/tenants/{t['id']}/api-keys"),
          response_schema("/v1/tenants/{tid}/api-keys", "get", 200))
    tc = client.with_key(k["key"])
    check(tc.get("/v1/keys"), response_schema("/v1/keys", "get", 200))
    check(client.post("/v1/keys/rotate", {"tenant": t["id"]}),
          response_schema("/v1/keys/rotate", "post", 200))
    check(client.get(f"/v1/keys?tenant={t['id']}"), response_schema("/v1/keys", "get", 200))
    check(client.get("/v1/keys?all=true"), {"$ref": "#/components/schemas/KeyStatusList"})
    r = tc.post("/v1/keys/revoke", {"tenant": t["id"], "policy": "finish"})
    check(r, response_schema("/v1/keys/revoke", "post", 200))
    e = tc.request("POST", "/v1/sandboxes", {"template": "busybox"})
    assert e.status == 403 and "403" in SPEC["paths"]["/v1/sandboxes"]["post"]["responses"]
    check(e.json(), response_schema("/v1/sandboxes", "post", 403))
    client.delete(f"/v1/tenants/{t['id']}")
