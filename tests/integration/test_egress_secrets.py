"""Egress secrets, TLS interception and credential injection, leases, control audit
(docs/egress.md): a credential reaches the upstream test server for its bound host over
verified TLS and never another host; the value never enters the sandbox (env, files,
process memory, snapshots) nor any API answer; leases expire; live policy changes stop
injection. Upstream servers live in their own network namespace (tests/lib/egressenv.py)
and record every request they get."""
import os
import re
import subprocess
import time

import pytest

from egressenv import audit, running, sandboxes, wait_audit

pytestmark = pytest.mark.root

VALUE = "ghp_S3cr3tV4lue_" + os.urandom(8).hex()
PVALUE = "sk-live-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def env(build_dir, templates_dir, log_dir):
    with running(build_dir, templates_dir, log_dir, "egress-secrets", tls_ca=True) as e:
        c = e[0].client
        c.put("/v1/secrets/GH", {"value": VALUE, "hosts": ["allowed.test", "bad.test"],
                                 "inject": {"header": "Authorization",
                                            "format": "Bearer {value}"}})
        c.put("/v1/secrets/TOK", {"value": PVALUE, "hosts": ["allowed.test"],
                                  "inject": {"placeholder": True}})
        yield e


@pytest.fixture
def mk(env):
    with sandboxes(env[0].client) as make:

        def mk_(allow=("allowed.test", "other.test"), secrets=("GH", "TOK"), template="base"):
            return make(template=template, egress={"allow": list(allow), "secrets": list(secrets)})

        yield mk_


def run(c, sid, script, timeout=60):
    r = c.exec(sid, ["/bin/sh", "-c", script], timeout=timeout)
    return r["exit_code"], r["stdout"], r["stderr"]


def reqs(up, since, path=None):
    return [r for r in up.requests()[since:] if path is None or r["path"].startswith(path)]


def auth_of(r):
    return r["headers"].get("Authorization")


def test_secret_api_never_returns_the_value(env):
    d, _ = env
    c = d.client
    r = c.put("/v1/secrets/API_KEY", {"value": "zz-" + VALUE, "hosts": ["*.allowed.test"],
                                      "inject": {"header": "X-Api-Key", "format": "{value}"}})
    assert r["name"] == "API_KEY" and r["hosts"] == ["*.allowed.test"]
    assert r["inject"] == {"header": "X-Api-Key", "format": "{value}"}
    one = c.get("/v1/secrets/API_KEY")
    lst = c.get("/v1/secrets")
    names = [s["name"] for s in lst["secrets"]]
    assert "API_KEY" in names and "GH" in names
    for resp in (r, one, lst):
        assert VALUE not in str(resp) and "value" not in str(resp).replace("{value}", "")
    for name, body in (
            ("1bad", {"value": "x", "hosts": ["a.test"], "inject": {"placeholder": True}}),
            ("OK", {"value": "x", "hosts": ["10.0.0.0/8"], "inject": {"placeholder": True}}),
            ("OK", {"value": "x", "hosts": [], "inject": {"placeholder": True}}),
            ("OK", {"value": "a\r\nb", "hosts": ["a.test"], "inject": {"placeholder": True}}),
            ("OK", {"value": "x", "hosts": ["a.test"], "inject": {"header": "Host"}}),
            ("OK", {"value": "x", "hosts": ["a.test"],
                    "inject": {"header": "X", "format": "no placeholder"}}),
            ("OK", {"value": "x", "hosts": ["a.test"], "inject": {}}),
            ("OK", {"value": "x", "hosts": ["a.test"], "inject": {"placeholder": True},
                    "extra": 1})):
        e = c.expect_error("PUT", f"/v1/secrets/{name}", 400, "bad_request", body)
        assert "a\r\nb" not in str(e)
    c.expect_error("POST", "/v1/sandboxes", 400, "bad_request",
                   {"template": "busybox", "egress": {"allow": [], "secrets": ["NOPE"]}})
    c.delete("/v1/secrets/API_KEY")
    c.expect_error("GET", "/v1/secrets/API_KEY", 404, "not_found")
    # encrypted at rest: the catalog (and its WAL) never holds the value in clear
    seen = 0
    for f in os.listdir(d.data):
        p = os.path.join(d.data, f)
        if os.path.isfile(p) and os.path.getsize(p) < (64 << 20):
            with open(p, "rb") as fh:
                data = fh.read()
            seen += b"egress_docs" in data
            assert VALUE.encode() not in data, p
    assert seen
    ev = [e for e in audit(c, "") if e["kind"] == "control" and e["action"].startswith("secret")]
    assert VALUE not in str(ev)


def test_header_credential_only_for_its_bound_host(env, mk):
    d, up = env
    c = d.client
    sid = mk()
    n0 = len(up.requests())
    # no -k for the intercepted host: the sandbox trusts the node CA through its bundle
    # (other.test is spliced: the sandbox sees the test server's self-signed certificate)
    rc, out, err = run(c, sid, "curl -sS -m 10 https://allowed.test/h1 && "
                               "curl -sS -m 10 -k https://other.test/h2 && "
                               "curl -sS -m 10 -k -L 'https://allowed.test/redirect?to="
                               "https://other.test/h3' && "
                               "curl -sS -m 10 http://allowed.test/h4")
    assert rc == 0, err
    got = {r["path"]: r for r in reqs(up, n0)}
    assert auth_of(got["/h1"]) == f"Bearer {VALUE}" and got["/h1"]["tls"]
    assert auth_of(got["/h2"]) is None
    assert auth_of(got["/h3"]) is None  # the redirect's other host
    assert auth_of(got["/h4"]) is None  # plain HTTP: never
    ev = wait_audit(c, sid, lambda e: e["action"] == "inject" and e["verdict"] == "allow")
    assert ev and ev[0]["detail"]["secret"] == "GH" and ev[0]["detail"]["sni"] == "allowed.test"
    assert VALUE not in str(audit(c, sid))
    # the sandbox negotiated HTTP/1.1 even when offering h2
    rc, out, err = run(c, sid, "curl -sS -m 10 --http2 -o /dev/null -w '%{http_version}' "
                               "https://allowed.test/h5")
    assert rc == 0 and out == "1.1", err


def test_sni_and_host_must_agree_on_an_intercepted_connection(env, mk):
    d, up = env
    c = d.client
    sid = mk()
    n0 = len(up.requests())
    rc, out, _ = run(c, sid, "curl -sS -m 10 -w ' %{http_code}' -H 'Host: other.test' "
                             "https://allowed.test/front")
    assert out.endswith(" 421"), out
    assert not reqs(up, n0, "/front")
    ev = wait_audit(c, sid, lambda e: e["action"] == "inject" and e["verdict"] == "deny")
    assert ev and "SNI" in ev[0]["detail"]["reason"]


def test_upstream_certificate_must_verify(env, mk):
    d, up = env
    c = d.client
    sid = mk(allow=["allowed.test", "bad.test"])
    n0 = len(up.requests())
    rc, _, _ = run(c, sid, "curl -sS -m 10 https://bad.test/unverified")
    assert rc != 0
    assert not reqs(up, n0, "/unverified")
    ev = wait_audit(c, sid, lambda e: "not verified" in e["detail"].get("reason", ""))
    assert ev


PIPE = r'''
import socket, ssl, sys
ctx = ssl.create_default_context()
s = ctx.wrap_socket(socket.create_connection(("allowed.test", 443), timeout=10),
                    server_hostname="allowed.test")
body = b"hello"
reqs = (b"GET /p1 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
        b"POST /p2 HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        b"POST /p3 HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /p4 HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
s.sendall(reqs)
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
sys.stdout.write(str(data.count(b"HTTP/1.1 200")))
'''


def test_keep_alive_pipelining_and_chunked_bodies(env, mk):
    d, up = env
    c = d.client
    sid = mk()
    c.put_file(sid, "/tmp/pipe.py", PIPE.encode())
    n0 = len(up.requests())
    rc, out, err = run(c, sid, "python3 /tmp/pipe.py")
    assert rc == 0 and out == "4", (out, err)
    got = {r["path"]: r for r in reqs(up, n0)}
    assert set(got) == {"/p1", "/p2", "/p3", "/p4"}
    assert all(auth_of(r) == f"Bearer {VALUE}" for r in got.values())
    assert got["/p2"]["body"] == "abcde" and got["/p3"]["body"] == "hello"


def test_placeholder_replaced_only_for_its_host(env, mk):
    d, up = env
    c = d.client
    sid = mk()
    rc, ph, _ = run(c, sid, "printf %s \"$TOK\"")
    assert re.fullmatch(r"cove_ph_[0-9a-f]{32}", ph), ph
    n0 = len(up.requests())
    rc, out, err = run(c, sid, "curl -sS -m 10 -H \"X-Api-Key: $TOK\" https://allowed.test/ph1 "
                               "&& curl -sS -m 10 -k -H \"X-Api-Key: $TOK\" https://other.test/ph2")
    assert rc == 0, err
    got = {r["path"]: r for r in reqs(up, n0)}
    assert got["/ph1"]["headers"]["X-Api-Key"] == PVALUE
    assert got["/ph2"]["headers"]["X-Api-Key"] == ph
    # bodies are never rewritten: a placeholder there, or a compressed body, is refused
    rc, out, _ = run(c, sid, "curl -sS -m 10 -w ' %{http_code}' -d \"k=$TOK\" "
                             "https://allowed.test/ph3; echo; "
                             "curl -sS -m 10 -w ' %{http_code}' -H 'Content-Encoding: gzip' "
                             "--data-binary abc https://allowed.test/ph4")
    assert " 415" in out, out
    assert not reqs(up, n0, "/ph4")
    assert all(PVALUE not in r["body"] for r in reqs(up, n0))
    ev = wait_audit(c, sid, lambda e: e["action"] == "inject" and e["verdict"] == "deny" and
                    "placeholder in a request body" in e["detail"].get("reason", ""))
    assert ev


def sandbox_pids(ph):
    """Host pids of every process of the sandbox whose env holds placeholder ph."""
    first = None
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if ph.encode() in f.read():
                    first = p
                    break
        except OSError:
            pass
    assert first, "no sandbox process found"
    ns = os.readlink(f"/proc/{first}/ns/pid")
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.readlink(f"/proc/{p}/ns/pid") == ns:
                    out.append(int(p))
            except OSError:
                pass
    return out


def memory_holds(pid, needle):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        return False
    with mem:
        for line in maps:
            rng, perms = line.split()[:2]
            if "r" not in perms:
                continue
            a, b = (int(x, 16) for x in rng.split("-"))
            try:
                mem.seek(a)
                if needle in mem.read(b - a):
                    return True
            except (OSError, ValueError, OverflowError):
                pass
    return False


def files_holding(root, needles):
    """Files under a sandbox's root (seen from the host) that contain any needle."""
    hits = []
    for top, dirs, files in os.walk(root):
        if top == root:
            dirs[:] = [x for x in dirs if x not in ("proc", "sys", "dev")]
        for f in files:
            p = os.path.join(top, f)
            try:
                if not os.path.isfile(p) or os.path.islink(p) or os.path.getsize(p) > (64 << 20):
                    continue
                with open(p, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            if any(n in data for n in needles):
                hits.append(p)
    return hits


def test_value_never_enters_the_sandbox(env, mk):
    d, up = env
    c = d.client
    sid = mk()
    needles = (VALUE.encode(), PVALUE.encode())
    rc, ph, _ = run(c, sid, "printf %s \"$TOK\"")
    # processes that have used both credentials, one still running; nothing here sends a
    # value into the sandbox (the checks run from the host)
    run(c, sid, "curl -sS -m 10 -H \"X-Api-Key: $TOK\" https://allowed.test/m1 >/tmp/m1 && "
                "curl -sS -m 10 https://allowed.test/m2 >/tmp/m2 && (sleep 300 &) ; true")
    rc, out, _ = run(c, sid, "env")
    assert VALUE not in out and PVALUE not in out
    assert "TOK=cove_ph_" in out and "GH=cove_ph_" in out
    pids = sandbox_pids(ph)
    assert len(pids) >= 2
    for pid in pids:
        for n in needles:
            assert not memory_holds(pid, n), pid
    assert files_holding(f"/proc/{pids[0]}/root", needles) == []
    # snapshots: the store is encrypted; the restored layer holds no value either
    c.post(f"/v1/sandboxes/{sid}/pause")
    for top, _, files in os.walk(os.path.join(d.data, "store")):
        for f in files:
            with open(os.path.join(top, f), "rb") as fh:
                data = fh.read()
            assert not any(n in data for n in needles)
    c.post(f"/v1/sandboxes/{sid}/resume")
    rc, ph2, _ = run(c, sid, "sleep 300 & printf %s \"$TOK\"")
    assert ph2 == ph
    pids = sandbox_pids(ph)
    assert files_holding(f"/proc/{pids[0]}/root", needles) == []


def test_resume_keeps_the_policy_and_injection(env, mk):
    d, up = env
    c = d.client
    sid = mk()
    c.post(f"/v1/sandboxes/{sid}/pause")
    c.post(f"/v1/sandboxes/{sid}/resume")
    n0 = len(up.requests())
    rc, out, err = run(c, sid, "curl -sS -m 10 https://allowed.test/after-resume")
    assert rc == 0, err
    assert auth_of(reqs(up, n0, "/after-resume")[0]) == f"Bearer {VALUE}"
    r = c.get(f"/v1/sandboxes/{sid}/egress")
    assert r["address"] and r["egress"]["secrets"] == ["GH", "TOK"]
    # a fork: same policy, placeholders of its own, no leases
    lease = c.post(f"/v1/sandboxes/{sid}/leases", {"secret": "GH", "ttl_s": 600})
    f = c.post(f"/v1/sandboxes/{sid}/fork", {})["sandboxes"][0]["id"]
    try:
        assert c.get(f"/v1/sandboxes/{f}/leases")["leases"] == []
        fr = c.get(f"/v1/sandboxes/{f}/egress")
        assert fr["egress"]["secrets"] == ["GH", "TOK"] and fr["address"]
        assert fr["placeholders"]["TOK"] != r["placeholders"]["TOK"]
        rc, ph, _ = run(c, f, "printf %s \"$TOK\"")
        assert ph == fr["placeholders"]["TOK"]
        rc, _, err = run(c, f, "curl -sS -m 10 https://allowed.test/fork")
        assert rc == 0, err
        assert auth_of(reqs(up, n0, "/fork")[0]) == f"Bearer {VALUE}"
    finally:
        c.remove(f)
    c.delete(f"/v1/leases/{lease['id']}")


def test_live_policy_removing_a_secret_stops_injection(env, mk):
    d, up = env
    c = d.client
    sid = mk()
    n0 = len(up.requests())
    run(c, sid, "curl -sS -m 10 https://allowed.test/live1")
    r = c.put(f"/v1/sandboxes/{sid}/egress",
              {"egress": {"allow": ["allowed.test"], "secrets": ["TOK"]}})
    assert r["egress"]["secrets"] == ["TOK"]
    run(c, sid, "curl -sS -m 10 https://allowed.test/live2")
    got = {r["path"]: r for r in reqs(up, n0)}
    assert auth_of(got["/live1"]) == f"Bearer {VALUE}"
    assert auth_of(got["/live2"]) is None


def test_changing_or_deleting_a_secret_applies_to_running_sandboxes(env, mk):
    d, up = env
    c = d.client
    spec = {"hosts": ["allowed.test"], "inject": {"header": "X-Rot", "format": "{value}"}}
    c.put("/v1/secrets/ROT", {"value": "rot-one", **spec})
    sid = mk(secrets=("ROT",))
    n0 = len(up.requests())
    run(c, sid, "curl -sS -m 10 https://allowed.test/rot1")
    c.put("/v1/secrets/ROT", {"value": "rot-two", **spec})
    run(c, sid, "curl -sS -m 10 https://allowed.test/rot2")
    c.delete("/v1/secrets/ROT")
    # nothing left to inject: spliced again, the sandbox sees the test server's own cert
    run(c, sid, "curl -sS -m 10 -k https://allowed.test/rot3")
    got = {r["path"]: r["headers"].get("X-Rot") for r in reqs(up, n0)}
    assert got == {"/rot1": "rot-one", "/rot2": "rot-two", "/rot3": None}


def test_lease_injects_until_it_expires(env, mk):
    d, up = env
    c = d.client
    sid = mk(secrets=())
    n0 = len(up.requests())
    run(c, sid, "curl -sS -m 10 -k https://allowed.test/nolease")
    lease = c.post(f"/v1/sandboxes/{sid}/leases", {"secret": "GH", "ttl_s": 3})
    assert lease["state"] == "active" and lease["secret"] == "GH"
    t0 = time.time()
    run(c, sid, "curl -sS -m 10 https://allowed.test/leased")
    got = {r["path"]: r for r in reqs(up, n0)}
    assert auth_of(got["/nolease"]) is None
    if time.time() - t0 < 2.5:
        assert auth_of(got["/leased"]) == f"Bearer {VALUE}"
    ls = c.get(f"/v1/sandboxes/{sid}/leases")["leases"]
    assert [x["id"] for x in ls] == [lease["id"]]
    deadline = time.time() + 10
    while c.get(f"/v1/sandboxes/{sid}/leases")["leases"][0]["state"] != "expired":
        assert time.time() < deadline
        time.sleep(0.2)
    run(c, sid, "curl -sS -m 10 -k https://allowed.test/expired")
    assert auth_of(reqs(up, n0, "/expired")[0]) is None
    for bad in ({"secret": "GH"}, {"secret": "GH", "ttl_s": 0}, {"secret": "NOPE", "ttl_s": 5},
                {"secret": "GH", "ttl_s": 5, "x": 1}):
        c.expect_error("POST", f"/v1/sandboxes/{sid}/leases", 400, "bad_request", bad)
    c.expect_error("POST", "/v1/sandboxes/sbx_nope/leases", 404, "not_found",
                   {"secret": "GH", "ttl_s": 5})


def test_pending_request_from_the_sandbox_approve_and_deny(env, mk):
    d, up = env
    c = d.client
    sid = mk(secrets=())
    rc, out, err = run(c, sid, "cove-guest request-credential GH --reason 'need the API' "
                               "--ttl 600")
    assert rc == 0, (out, err)
    pend = [x for x in c.get("/v1/leases")["leases"]
            if x["sandbox"] == sid and x["state"] == "pending"]
    assert len(pend) == 1 and pend[0]["reason"] == "need the API" and pend[0]["secret"] == "GH"
    n0 = len(up.requests())
    run(c, sid, "curl -sS -m 10 -k https://allowed.test/pending")
    a = c.post(f"/v1/leases/{pend[0]['id']}/approve", {})
    assert a["state"] == "active"
    run(c, sid, "curl -sS -m 10 https://allowed.test/approved")
    got = {r["path"]: r for r in reqs(up, n0)}
    assert auth_of(got["/pending"]) is None
    assert auth_of(got["/approved"]) == f"Bearer {VALUE}"
    c.expect_error("POST", f"/v1/leases/{pend[0]['id']}/deny", 409, "conflict", {})
    run(c, sid, "cove-guest request-credential TOK --reason no")
    p2 = [x for x in c.get(f"/v1/sandboxes/{sid}/leases")["leases"] if x["state"] == "pending"]
    assert c.post(f"/v1/leases/{p2[0]['id']}/deny", {})["state"] == "denied"
    # hostile input: bounded, validated
    rc, _, _ = run(c, sid, "cove-guest request-credential 'bad name' --reason x")
    assert rc != 0
    rc, _, _ = run(c, sid, "cove-guest request-credential GH --reason \"$(head -c 5000 "
                           "/dev/zero | tr '\\0' a)\"")
    assert rc != 0
    ev = [e for e in audit(c, sid, kind="lease")]
    assert {"request", "approve", "deny"} <= {e["action"] for e in ev}


def test_control_signals_are_audited(env, mk):
    d, _ = env
    c = d.client
    sid = mk()
    c.exec(sid, ["true"])
    c.put_file(sid, "/tmp/x", b"x")
    snap = c.post(f"/v1/sandboxes/{sid}/snapshots", {})
    c.post(f"/v1/sandboxes/{sid}/pause")
    c.post(f"/v1/sandboxes/{sid}/resume")
    c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": snap["id"]})
    want = {"create", "exec", "file.write", "snapshot", "pause", "resume", "rewind"}
    deadline = time.time() + 10
    while True:
        got = {e["action"] for e in audit(c, sid, kind="control")}
        if want <= got or time.time() > deadline:
            break
        time.sleep(0.1)
    assert want <= got, got
    ok = c.get("/v1/audit/verify")
    assert ok["ok"] is True


def cove_cli(d, build_dir, *args):
    return subprocess.run(d.in_netns([os.path.join(build_dir, "cove"), "--url",
                                      f"http://127.0.0.1:{d.port}", "--api-key", d.client.key,
                                      *args]),
                          capture_output=True, text=True, timeout=60)


def test_cli_audit_table_json_leases_and_verify_with_a_tampered_event(env, mk, build_dir):
    import json
    import sqlite3
    d, _ = env
    c = d.client
    sid = mk()
    run(c, sid, "curl -sS -m 10 https://allowed.test/cli")
    wait_audit(c, sid, lambda e: e["action"] == "inject")
    r = cove_cli(d, build_dir, "audit", "--sandbox", sid)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:6] == ["SEQ", "TIME", "SANDBOX", "KIND", "ACTION", "VERDICT"]
    assert any(" inject " in x and "secret=GH" in x for x in lines)
    assert VALUE not in r.stdout
    r = cove_cli(d, build_dir, "audit", "--sandbox", sid, "--kind", "control", "--json")
    evs = [json.loads(x) for x in r.stdout.splitlines()]
    assert evs and all(e["kind"] == "control" and e["sandbox"] == sid for e in evs)
    # follow: prints what comes later
    p = subprocess.Popen(d.in_netns([os.path.join(build_dir, "cove"), "--url",
                                     f"http://127.0.0.1:{d.port}", "--api-key", c.key, "audit",
                                     "--sandbox", sid, "--kind", "control", "--follow", "--json",
                                     "--after", str(evs[-1]["seq"])]),
                         stdout=subprocess.PIPE, text=True)
    try:
        c.exec(sid, ["true"])
        line = p.stdout.readline()
        assert json.loads(line)["action"] == "exec"
    finally:
        p.kill()
        p.wait()
    # leases through the CLI
    r = cove_cli(d, build_dir, "leases", "grant", sid, "GH", "--ttl", "60")
    assert r.returncode == 0 and r.stdout.split()[1] == "active", r.stderr
    lid = r.stdout.split()[0]
    r = cove_cli(d, build_dir, "leases", "--sandbox", sid)
    assert lid in r.stdout and "GH" in r.stdout
    run(c, sid, "cove-guest request-credential TOK --reason cli")
    pend = [x for x in c.get(f"/v1/sandboxes/{sid}/leases")["leases"] if x["state"] == "pending"]
    r = cove_cli(d, build_dir, "leases", "approve", pend[0]["id"], "--ttl", "30")
    assert r.returncode == 0 and "active" in r.stdout, r.stderr
    assert cove_cli(d, build_dir, "leases", "revoke", lid).returncode == 0
    assert cove_cli(d, build_dir, "leases", "deny", pend[0]["id"]).returncode == 1
    # verify: intact, then one stored event changed behind coved's back
    r = cove_cli(d, build_dir, "audit", "verify")
    assert r.returncode == 0 and "intact" in r.stdout, r.stdout + r.stderr
    target = evs[0]["seq"]
    db = sqlite3.connect(os.path.join(d.data, "catalog.db"), timeout=30)
    with db:
        db.execute("DROP TRIGGER audit_events_no_update")
        db.execute("UPDATE audit_events SET detail_json = '{\"cmd\":\"forged\"}' WHERE seq = ?",
                   (target,))
        db.execute("CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events"
                   "  BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END")
    db.close()
    r = cove_cli(d, build_dir, "audit", "verify")
    assert r.returncode == 1 and f"BROKEN at event {target}" in r.stdout, r.stdout + r.stderr
