"""Exposed ports and preview URLs (docs/ports.md): a real web app (HTTP, SSE, WebSocket,
tests/integration/ports/app.py) inside base sandboxes, reached through coved's port listener
with curl, http.client and a raw WebSocket client; every refusal (no token, a wrong or
another sandbox's token, an unexposed or deleted port, a paused sandbox), slow and idle
clients, the audit log, a restart, and the sandbox's egress left as it was."""
import base64
import hashlib
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import time

import pytest

from cove import Coved, free_port, poll

pytestmark = pytest.mark.root

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "ports", "app.py")
DOMAIN = "ports.test"
HTTP, WS = 8000, 8001


@pytest.fixture(scope="module")
def env(request, build_dir, templates_dir, log_dir):
    pport = free_port()
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--templates", "busybox,base", "--pool", "0",
                          "--ports-listen", f"127.0.0.1:{pport}", "--ports-domain", DOMAIN])
    d.pport = pport
    yield d
    failed = request.session.testsfailed > 0
    d.stop(keep_log_as="ports" if failed else None)


def start_app(c, sid):
    with open(APP, "rb") as f:
        c.put_file(sid, "/tmp/app.py", f.read())
    r = c.exec(sid, ["/bin/sh", "-c",
                     f"nohup python3 /tmp/app.py {HTTP} {WS} >/tmp/app.log 2>&1 &"])
    assert r["exit_code"] == 0, r
    poll(lambda: c.exec(sid, ["python3", "-c",
                              f"import socket; socket.create_connection(('127.0.0.1', {HTTP}));"
                              f"socket.create_connection(('127.0.0.1', {WS}))"])
         ["exit_code"] == 0, timeout=60, what="the app listens in the sandbox")


@pytest.fixture(scope="module")
def app(env):
    c = env.client
    sid = c.create(template="base")["id"]
    start_app(c, sid)
    yield sid
    env.client.remove(sid, purge=True)


@pytest.fixture(scope="module")
def other(env):
    c = env.client
    sid = c.create(template="busybox")["id"]
    yield sid
    env.client.remove(sid, purge=True)


def expose(c, sid, port=HTTP, **kw):
    return c.ok("POST", f"/v1/sandboxes/{sid}/ports", dict(port=port, **kw), expect=(201,))


def req(env, method, path, host=None, headers=None, body=None, conn=None):
    """One request to the port listener: (status, headers dict (lowercase), body)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", env.pport, timeout=30)
    h = dict(headers or {})
    if host:
        h["Host"] = host
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    if own:
        conn.close()
    return out


def split(url):
    """(path, host header) of a url the API answered"""
    rest = url.split("://", 1)[1]
    host, _, path = rest.partition("/")
    return "/" + path, host


def audit(c, sid, pred, timeout=30):
    def find():
        ev = c.get(f"/v1/audit?sandbox={sid}&kind=port")["events"]
        got = [e for e in ev if pred(e)]
        return got or None
    return poll(find, timeout=timeout, what="audit events")


def test_nothing_is_reachable_before_a_port_is_exposed(env, app):
    st, _, body = req(env, "GET", f"/p/{app}/{HTTP}/")
    assert st == 404, body
    assert json.loads(body)["error"]["code"] == "not_found"
    st, _, _ = req(env, "GET", "/", host=f"{HTTP}-{app}.{DOMAIN}")
    assert st == 404
    audit(env.client, app, lambda e: e["action"] == "refuse" and
          "not exposed" in e["detail"].get("reason", ""))
    # the listener does not answer for the API or for made-up routes
    st, _, body = req(env, "GET", "/v1/sandboxes")
    assert st == 404 and b"no route" in body


def test_private_port_needs_its_token(env, app):
    c = env.client
    r = expose(c, app)
    assert r["port"] == HTTP and r["public"] is False and r["token"].startswith("cpt_")
    tok = r["token"]
    path, host = split(r["url"])
    assert host.startswith(f"{HTTP}-{app}.{DOMAIN}")
    # the URL as answered works as it is (the token once in it)
    st, h, body = req(env, "GET", path, host=host)
    assert st == 200 and b"hello from the sandbox" in body
    cookie = h["set-cookie"]
    assert cookie.startswith(f"cove_port_token={tok};") and "HttpOnly" in cookie
    assert "Path=/" in cookie
    # no token, a wrong one, a truncated one
    for hd in ({}, {"X-Cove-Port-Token": "cpt_" + "0" * 48},
               {"X-Cove-Port-Token": tok[:-1]}, {"Cookie": "cove_port_token=nope"}):
        st, _, body = req(env, "GET", "/", host=host, headers=hd)
        assert st in (401, 403), (hd, st, body)
    # header, cookie
    st, _, _ = req(env, "GET", "/", host=host, headers={"X-Cove-Port-Token": tok})
    assert st == 200
    st, _, _ = req(env, "GET", "/", host=host, headers={"Cookie": f"a=1; cove_port_token={tok}"})
    assert st == 200
    # path route, same token
    st, _, body = req(env, "GET", f"/p/{app}/{HTTP}/headers?x=1&cove_token={tok}&y=2")
    assert st == 200
    seen = json.loads(body)
    assert seen["path"] == "/headers?x=1&y=2"
    hh = {k.lower(): v for k, v in seen["headers"].items()}
    assert hh["x-forwarded-for"] == "127.0.0.1" and hh["x-forwarded-proto"] == "http"
    assert hh["x-forwarded-prefix"] == f"/p/{app}/{HTTP}"
    assert tok not in body.decode()
    # nothing of the token reaches the app: not the header, not the cookie
    st, _, body = req(env, "GET", "/headers", host=host,
                      headers={"X-Cove-Port-Token": tok, "Cookie": f"a=1; cove_port_token={tok}",
                               "X-Forwarded-For": "6.6.6.6"})
    seen = json.loads(body)
    hh = {k.lower(): v for k, v in seen["headers"].items()}
    assert tok not in body.decode() and hh["cookie"] == "a=1"
    assert hh["x-forwarded-for"] == "127.0.0.1" and hh["x-forwarded-host"] == host
    ev = audit(c, app, lambda e: e["action"] == "refuse" and e["verdict"] == "deny")
    assert any("wrong token" in e["detail"]["reason"] for e in ev)
    assert all(tok not in json.dumps(e) for e in c.get(f"/v1/audit?sandbox={app}")["events"])
    audit(c, app, lambda e: e["action"] == "open" and e["detail"]["port"] == HTTP)
    audit(c, app, lambda e: e["action"] == "close" and e["detail"]["port"] == HTTP)
    lst = c.get(f"/v1/sandboxes/{app}/ports")["ports"]
    assert [p["port"] for p in lst] == [HTTP] and "token" not in lst[0]


def test_another_sandboxs_token_is_refused(env, app, other):
    c = env.client
    mine = expose(c, app)["token"]
    theirs = expose(c, other, port=HTTP)["token"]
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": theirs})
    assert st == 403
    st, _, _ = req(env, "GET", "/", host=f"{HTTP}-{app}.{DOMAIN}",
                   headers={"Cookie": f"cove_port_token={theirs}"})
    assert st == 403
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": mine})
    assert st == 200
    # re-exposing replaces the token: the old one stops working
    new = expose(c, app)["token"]
    assert new != mine
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": mine})
    assert st == 403
    c.delete(f"/v1/sandboxes/{other}/ports/{HTTP}")


def test_public_port_and_keep_alive_requests(env, app):
    c = env.client
    r = expose(c, app, public=True)
    assert r["token"] is None and "cove_token" not in r["url"]
    conn = http.client.HTTPConnection("127.0.0.1", env.pport, timeout=30)
    host = f"{HTTP}-{app}.{DOMAIN}"
    for i in range(5):
        st, _, body = req(env, "GET", "/", host=host, conn=conn)
        assert st == 200
    payload = os.urandom(300000)
    st, _, body = req(env, "POST", "/echo", host=host, body=payload, conn=conn)
    assert body.decode() == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"

    def chunks():
        for k in range(0, len(payload), 70000):
            yield payload[k:k + 70000]
    conn.putrequest("POST", "/echo", skip_host=True)
    conn.putheader("Host", host)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for ch in chunks():
        conn.send(b"%x\r\n" % len(ch) + ch + b"\r\n")
    conn.send(b"0\r\n\r\n")
    rr = conn.getresponse()
    assert rr.read().decode() == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"
    st, _, body = req(env, "GET", "/big?n=5000000", host=host, conn=conn)
    assert st == 200 and len(body) == 5000000
    conn.close()
    # the same connection may move to another route (path routes share one host)
    expose(c, app, port=WS, public=True)
    conn = http.client.HTTPConnection("127.0.0.1", env.pport, timeout=30)
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", conn=conn)
    assert st == 200
    st, _, body = req(env, "GET", f"/p/{app}/{HTTP}/nothing", conn=conn)
    assert st == 404 and body == b"no such page\n"
    conn.close()
    c.delete(f"/v1/sandboxes/{app}/ports/{WS}")


def test_sse_streams_without_buffering(env, app):
    """An endless event stream: events arrive one by one (a proxy that waited for the body's
    end would deliver nothing)."""
    c = env.client
    expose(c, app, public=True)
    s = socket.create_connection(("127.0.0.1", env.pport), timeout=30)
    s.sendall(f"GET /sse?n=100000 HTTP/1.1\r\nHost: {HTTP}-{app}.{DOMAIN}\r\n"
              f"Accept: text/event-stream\r\n\r\n".encode())
    got = b""
    while got.count(b"data: tick") < 3:
        b = s.recv(4096)
        assert b, got
        got += b
    assert b"200 OK" in got and b"text/event-stream" in got and b"data: tick 2" in got
    s.close()


def ws_connect(env, path, host=None, headers=()):
    s = socket.create_connection(("127.0.0.1", env.pport), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    h = (f"GET {path} HTTP/1.1\r\nHost: {host or '127.0.0.1'}\r\nUpgrade: websocket\r\n"
         f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n")
    for k, v in headers:
        h += f"{k}: {v}\r\n"
    s.sendall((h + "\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        assert b, head
        head += b
    return s, head.decode()


def ws_send(s, data, op=1):
    mask = os.urandom(4)
    n = len(data)
    hdr = bytes([0x80 | op])
    hdr += bytes([0x80 | n]) if n < 126 else (bytes([0xFE]) + struct.pack(">H", n) if n < 65536
                                             else bytes([0xFF]) + struct.pack(">Q", n))
    s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))


def recvn(s, n):
    out = b""
    while len(out) < n:
        b = s.recv(n - len(out))
        assert b
        out += b
    return out


def ws_recv(s):
    h = recvn(s, 2)
    n = h[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", recvn(s, 2))[0]
    elif n == 127:
        n = struct.unpack(">Q", recvn(s, 8))[0]
    return h[0] & 0x0F, recvn(s, n)


def test_websocket_echo(env, app):
    c = env.client
    tok = expose(c, app, port=WS)["token"]
    s, head = ws_connect(env, f"/p/{app}/{WS}/?cove_token={tok}")
    assert head.startswith("HTTP/1.1 101"), head
    assert "cove_port_token=" in head  # the cookie rides on the 101
    for msg in (b"hello", b"x" * 1000, os.urandom(70000)):
        ws_send(s, msg, op=2)
        op, data = ws_recv(s)
        assert op == 2 and data == msg
    ws_send(s, b"", op=8)
    assert ws_recv(s)[0] == 8
    s.close()
    s, head = ws_connect(env, f"/p/{app}/{WS}/")
    assert head.startswith("HTTP/1.1 401")
    s.close()


def test_deleted_port_is_refused_and_its_connections_end(env, app):
    c = env.client
    tok = expose(c, app)["token"]
    conn = http.client.HTTPConnection("127.0.0.1", env.pport, timeout=30)
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": tok}, conn=conn)
    assert st == 200
    c.delete(f"/v1/sandboxes/{app}/ports/{HTTP}")
    # the kept-alive connection is closed by the node
    conn.sock.settimeout(30)
    assert conn.sock.recv(1) == b""
    conn.close()
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": tok})
    assert st == 404
    c.expect_error("DELETE", f"/v1/sandboxes/{app}/ports/{HTTP}", 404, "not_found")
    audit(c, app, lambda e: e["action"] == "close" and
          e["detail"].get("reason") == "the port was unexposed")


def test_bad_exposures_are_refused(env, app):
    c = env.client
    for body in ({}, {"port": 0}, {"port": 65536}, {"port": "80"}, {"port": 80, "public": 1},
                 {"port": 80, "colour": "red"}):
        c.expect_error("POST", f"/v1/sandboxes/{app}/ports", 400, "bad_request", body=body)
    c.expect_error("POST", "/v1/sandboxes/sbx_nope/ports", 404, "not_found", body={"port": 80})
    c.expect_error("DELETE", f"/v1/sandboxes/{app}/ports/x", 400, "bad_request")


def test_nothing_listening_is_a_clear_502(env, app):
    c = env.client
    expose(c, app, port=9999, public=True)
    st, _, body = req(env, "GET", f"/p/{app}/9999/")
    assert st == 502 and b"nothing listens on port 9999" in body
    c.delete(f"/v1/sandboxes/{app}/ports/9999")


def test_malformed_heads_are_refused(env, app):
    expose(env.client, app, public=True)
    for raw in (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                f"GET /p/{app}/{HTTP}/ HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
                f"Transfer-Encoding: chunked\r\n\r\n".encode(),
                f"GET /p/{app}/{HTTP}/ HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n".encode(),
                f"GET http://x/p/{app}/{HTTP}/ HTTP/1.1\r\nHost: a\r\n\r\n".encode(),
                b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"a" * 40000 + b"\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", env.pport), timeout=30)
        s.sendall(raw)
        got = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
        s.close()
        assert got.split(b" ")[1] in (b"400", b"431", b"404"), (raw[:80], got[:200])


def test_slowloris_and_idle_connections_do_not_starve_others(env, app):
    c = env.client
    tok = expose(c, app)["token"]
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    idle = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", env.pport), timeout=30))
        slow = socket.create_connection(("127.0.0.1", env.pport), timeout=60)
        slow.sendall(b"GET / HTTP/1.1\r\n")
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:  # a byte at a time, never finishing the head
            slow.sendall(b"X")
            st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": tok})
            assert st == 200
        # the slow head is cut (408) once its time is up, however steadily it trickles
        got = b""
        slow.settimeout(60)
        while True:
            try:
                slow.sendall(b"X")
            except OSError:
                pass
            b = slow.recv(4096)
            if not b:
                break
            got += b
        assert got.startswith(b"HTTP/1.1 408"), got[:100]
    finally:
        for s in idle:
            s.close()


def test_paused_sandbox_answers_503_or_resumes(env):
    c = env.client
    sid = c.create(template="base")["id"]
    try:
        start_app(c, sid)
        tok = expose(c, sid)["token"]
        r = c.request("POST", f"/v1/sandboxes/{sid}/pause")
        if r.status != 200:
            pytest.skip(f"pause unavailable here: {r.status} {r.body[:200]!r}")
        st, h, body = req(env, "GET", f"/p/{sid}/{HTTP}/", headers={"X-Cove-Port-Token": tok})
        assert st == 503 and h.get("retry-after") == "5"
        err = json.loads(body)["error"]
        assert err["code"] == "sandbox_paused" and f"sandbox {sid} is paused" in err["message"]
        expose(c, sid, auto_resume=True, public=True)
        st, _, body = req(env, "GET", f"/p/{sid}/{HTTP}/")
        assert c.sandbox(sid)["state"] == "running"
        if c.snapshot_kind() == "full":
            assert st == 200 and b"hello from the sandbox" in body
        else:  # a files snapshot resumes without processes: nothing listens
            assert st == 502
    finally:
        c.remove(sid, purge=True)


def test_exposed_ports_survive_a_restart(env, app):
    c = env.client
    tok = expose(c, app)["token"]
    snap = c.request("POST", f"/v1/sandboxes/{app}/snapshots", {})
    env.terminate()
    env.start()
    c = env.client
    ports = c.get(f"/v1/sandboxes/{app}/ports")["ports"]
    assert HTTP in [p["port"] for p in ports]
    if snap.status not in (200, 201):  # no snapshot: stopped for good, still exposed
        st, _, body = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": tok})
        assert st == 502 and b"stopped" in body, body
        return
    c.wait_state(app, ("paused",))
    c.post(f"/v1/sandboxes/{app}/resume")
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": tok})
    if st == 502:  # a files snapshot: the app did not survive, the exposure did
        start_app(c, app)
        st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": tok})
    assert st == 200
    st, _, _ = req(env, "GET", f"/p/{app}/{HTTP}/", headers={"X-Cove-Port-Token": "cpt_x"})
    assert st == 403


def nft_table(env):
    """coved's nftables rules and sets, without counter values"""
    out = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
    return re.sub(r"packets \d+ bytes \d+", "", out)


def test_inbound_does_not_widen_egress(env):
    """A sandbox with an exposed port and an empty egress policy: connections come in, but
    from inside it still reaches nothing, not even the node's port listener or API; the
    nftables rules are the same as before it was exposed."""
    c = env.client
    sid = c.create(template="base", egress={"allow": []})["id"]
    try:
        start_app(c, sid)
        before = nft_table(env)
        tok = expose(c, sid)["token"]
        st, _, _ = req(env, "GET", f"/p/{sid}/{HTTP}/", headers={"X-Cove-Port-Token": tok})
        assert st == 200
        assert nft_table(env) == before
        link = c.get(f"/v1/sandboxes/{sid}/egress")["address"]
        gw = link.rsplit(".", 1)[0] + "." + str(int(link.rsplit(".", 1)[1]) - 1)
        probe = ("import socket,sys\n"
                 "ok=[]\n"
                 f"for h,p in (('{gw}',{env.pport}),('{gw}',{env.port}),('127.0.0.1',{env.pport})):\n"
                 "  s=socket.socket(); s.settimeout(5)\n"
                 "  try:\n"
                 "    s.connect((h,p)); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); d=s.recv(100)\n"
                 "    if d: ok.append((h,p,d[:40]))\n"
                 "  except OSError as e: pass\n"
                 "print(ok)\n")
        r = c.exec(sid, ["python3", "-c", probe], timeout=60)
        assert r["stdout"].strip() == "[]", r
    finally:
        c.remove(sid, purge=True)


def test_cli_port_add_ls_rm(env, build_dir, other):
    e = dict(os.environ, COVE_URL=f"http://127.0.0.1:{env.port}", COVE_API_KEY=env.client.key)
    e.pop("COVE_DATA_DIR", None)
    cove = os.path.join(build_dir, "cove")

    def run(*a):
        return subprocess.run([cove, *a], env=e, capture_output=True, text=True, timeout=60)
    r = run("port", "add", other, "3000")
    assert r.returncode == 0, r.stderr
    url, tok = r.stdout.splitlines()
    assert url.startswith(f"http://3000-{other}.{DOMAIN}:") and "cove_token=" in url
    assert tok.startswith("token cpt_") and tok.split()[1] in url
    r = run("port", "add", other, "3001", "--public", "--auto-resume")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1
    r = run("port", "ls", other)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["PORT", "ACCESS", "AUTO_RESUME", "URL"]
    assert [ln.split()[:3] for ln in lines[1:]] == [["3000", "token", "no"],
                                                    ["3001", "public", "yes"]]
    assert run("port", "rm", other, "3000").returncode == 0
    r = run("port", "rm", other, "3000")
    assert r.returncode != 0 and "not exposed" in r.stderr
    r = run("--json", "port", "ls", other)
    assert [p["port"] for p in json.loads(r.stdout)["ports"]] == [3001]
    assert run("port", "add", other, "70000").returncode != 0
    run("port", "rm", other, "3001")


def test_vm_sandbox_port_through_qemus_network(env):
    """A vm sandbox: the connection is made inside QEMU's network namespace, to the guest's
    address behind the tap (HTTP, SSE and a WebSocket through the same listener)."""
    c = env.client
    r = c.request("POST", "/v1/sandboxes", {"template": "base", "runtime": "vm"}, timeout=300)
    if r.status != 201:
        pytest.skip(f"no vm runtime here: {r.status} {r.body[:200]!r}")
    sid = r.json()["id"]
    try:
        assert c.sandbox(sid)["runtime"] == "vm"
        start_app(c, sid)
        tok = expose(c, sid)["token"]
        st, _, body = req(env, "GET", "/headers", host=f"{HTTP}-{sid}.{DOMAIN}",
                          headers={"X-Cove-Port-Token": tok})
        assert st == 200, body
        assert json.loads(body)["client"] == "169.254.100.1"  # QEMU's tap end
        expose(c, sid, port=WS, public=True)
        s, head = ws_connect(env, f"/p/{sid}/{WS}/")
        assert head.startswith("HTTP/1.1 101"), head
        ws_send(s, b"from the vm test")
        assert ws_recv(s) == (1, b"from the vm test")
        s.close()
    finally:
        c.remove(sid, purge=True)


def test_e2b_get_host_and_traffic_access_token(build_dir, templates_dir, log_dir):
    """E2B's create answers the ports domain and a traffic access token; getHost's
    {port}-{id}.{domain} and the E2b-Sandbox-Id/-Port headers route to the sandbox; the
    token is needed unless network.allowPublicTraffic was true; unknown routes on the E2B
    listeners answer in E2B's error shape."""
    pport, api, sbx = free_port(), free_port(), free_port()
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--templates", "busybox,base", "--pool", "0",
                          "--ports-listen", f"127.0.0.1:{pport}", "--ports-domain", DOMAIN,
                          "--e2b-api-listen", f"127.0.0.1:{api}",
                          "--e2b-sandbox-listen", f"127.0.0.1:{sbx}"])
    d.pport = pport
    key = "e2b_" + d.client.key.encode().hex()
    ids = []
    try:
        def e2b(method, path, body=None, port=api):
            cn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            cn.request(method, path, body=json.dumps(body) if body is not None else None,
                       headers={"X-API-KEY": key, "Content-Type": "application/json"})
            r = cn.getresponse()
            out = r.status, r.read()
            cn.close()
            return out
        st, body = e2b("POST", "/sandboxes", {"templateID": "base"})
        assert st == 201, body
        sb = json.loads(body)
        sid, tt = sb["sandboxID"], sb["trafficAccessToken"]
        ids.append(sid)
        assert sb["domain"] == DOMAIN and tt.startswith("cpt_")
        start_app(d.client, sid)
        host = f"{HTTP}-{sid}.{DOMAIN}"  # what getHost(8000) answers
        st, _, body = req(d, "GET", "/", host=host)
        assert st == 401
        st, _, body = req(d, "GET", "/", host=host,
                          headers={"e2b-traffic-access-token": tt})
        assert st == 200 and b"hello from the sandbox" in body
        st, _, body = req(d, "GET", "/headers", headers={
            "E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(WS + 1), "X-Cove-Port-Token": tt})
        assert st == 502
        assert json.loads(body)["code"] == 502 and json.loads(body)["sandboxId"] == sid
        st, _, body = req(d, "GET", "/headers", headers={
            "E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(HTTP), "X-Cove-Port-Token": "cpt_no"})
        assert st == 403 and json.loads(body)["code"] == 403
        # the answer of a get carries the same token again
        st, body = e2b("GET", f"/sandboxes/{sid}")
        assert json.loads(body)["trafficAccessToken"] == tt
        # allowPublicTraffic: no token
        st, body = e2b("POST", "/sandboxes", {"templateID": "base",
                                              "network": {"allowPublicTraffic": True}})
        assert st == 201, body
        pub = json.loads(body)["sandboxID"]
        ids.append(pub)
        start_app(d.client, pub)
        st, _, _ = req(d, "GET", "/", host=f"{HTTP}-{pub}.{DOMAIN}")
        assert st == 200
        st, body = e2b("POST", "/sandboxes", {"templateID": "base",
                                              "network": {"allowOut": ["x"]}})
        assert st == 400
        # unknown routes: E2B's shape {code, message}
        for port in (api, sbx):
            st, body = e2b("GET", "/no/such/route", port=port)
            j = json.loads(body)
            assert st == 404 and j["code"] == 404 and "no such route" in j["message"]
    finally:
        for s in ids:
            d.client.remove(s, purge=True)
        d.stop()
