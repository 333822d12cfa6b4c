"""Sandbox traffic in a cluster: two control replicas and a node (plain coved processes on
loopback over a real PostgreSQL and radosgw, test_cluster_roles.Cluster). Exec streams
through a control; a reconnect with ?after=SEQ through the other replica gets every byte
once; a 200 MB upload and download go through a control whose memory stays flat; a client
that leaves a watch ends the control's connection to the node; another tenant's sandbox is
404 through the control; the node API refuses API keys, unsigned, forged, replayed and
expired requests; an answer without a valid Cove-Node-Answer is never relayed (503)."""
import hashlib
import hmac
import http.client
import http.server
import os
import secrets
import threading
import time

import pytest

from cove import Client, free_port, poll
from test_cluster_roles import Cluster, Member, live_nodes, pg, rgw  # noqa: F401 (fixtures)

import pgserver
from s3rgw import S3Rgw

PG_WHY = pgserver.available()
S3_WHY = S3Rgw.available()
pytestmark = [pytest.mark.root,
              pytest.mark.skipif(bool(PG_WHY or S3_WHY), reason=PG_WHY or S3_WHY or "")]


@pytest.fixture
def two(request, build_dir, templates_dir, pg, rgw, tmp_path):  # noqa: F811
    """(cluster, second control's client, the node): two replicas, one node, one sandbox."""
    c = Cluster(build_dir, templates_dir, pg, rgw, str(tmp_path))
    c.start_control()
    m2 = Member(build_dir, log_dir=c.log_dir,
                extra_args=["--role", "control", "--cluster-key-file", c.key,
                            *c.store_args()], env=c.env(), templates_dir=None)
    c.members.append(m2)
    node = c.start_node("na")
    poll(lambda: live_nodes(c) == "na", timeout=60, what="node na holds a lease")
    try:
        yield c, Client(m2.port, c.control.client.key), node
    finally:
        c.failed = getattr(request.node, "cove_failed", False)
        c.stop()


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def node_conns(node_port):
    """TCP connections to or from node_port on this host that are still open on either
    side: ESTABLISHED, or CLOSE_WAIT (the peer closed, this side not yet) on the node's
    side. The node's listening socket is not counted."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    lport = int(parts[1].rsplit(":", 1)[1], 16)
                    rport = int(parts[2].rsplit(":", 1)[1], 16)
                    st = parts[3]
                    if (rport == node_port and st == "01") or \
                            (lport == node_port and st in ("01", "08")):
                        n += 1
        except OSError:
            pass
    return n


def test_exec_streams_and_reconnects_through_either_replica(two):
    """A streaming exec answers through a control as the process runs; its events, read
    partly through one replica and resumed with ?after=SEQ through the other, hold every
    output byte exactly once."""
    c, c2, _ = two
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    assert cc.exec(sid, "echo hi")["stdout"] == "hi\n"
    events = list(cc.exec(sid, "for i in $(seq 1 40); do echo l$i; done", wait=False))
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
    assert Client.output(events) == b"".join(b"l%d\n" % i for i in range(1, 41))
    # a slow writer: read the first events through replica 1, the rest through replica 2
    first = list(cc.stream(f"/v1/sandboxes/{sid}/exec",
                           {"shell": "for i in $(seq 1 30); do echo m$i; sleep 0.1; done"},
                           max_events=6))
    pid = next(e["pid"] for e in first if e["type"] == "start")
    last = max(e["seq"] for e in first)
    rest = list(c2.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after={last}",
                          timeout=120))
    assert rest[-1]["type"] == "exit"
    assert all(e["seq"] > last for e in rest)
    got = Client.output(first) + Client.output(rest)
    assert got == b"".join(b"m%d\n" % i for i in range(1, 31)), got
    cc.remove(sid)


def test_large_upload_and_download_through_control_memory_flat(two):
    """200 MB up and down through a control, checked by hash inside the sandbox and on the
    way back; the control's resident memory grows by far less than the transfer."""
    c, _, _ = two
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0, disk_mb=2048)["id"]
    data = os.urandom(1 << 20) * 200
    want = hashlib.sha256(data).hexdigest()
    pid = c.control.proc.pid
    base = rss_kb(pid)
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kb(pid))
            time.sleep(0.02)
    t = threading.Thread(target=sample)
    t.start()
    try:
        cc.put_file(sid, "/home/big", data, timeout=600)
        assert cc.exec(sid, "sha256sum /home/big")["stdout"].split()[0] == want
        r = cc.get_file(sid, "/home/big", timeout=600)
    finally:
        stop.set()
        t.join()
    assert r.status == 200 and len(r.body) == len(data)
    assert hashlib.sha256(r.body).hexdigest() == want
    grew_mb = (peak[0] - base) / 1024
    print(f"control RSS {base / 1024:.1f} MB, peak {peak[0] / 1024:.1f} MB "
          f"(+{grew_mb:.1f} MB) over 2 x 200 MB")
    assert grew_mb < 48, f"the control's RSS grew by {grew_mb:.1f} MB"
    cc.remove(sid)


def test_watch_ends_on_both_sides_when_the_client_leaves(two):
    """A client that drops an fs watch through a control closes the control's connection to
    the node: nothing stays open on either side."""
    c, _, node = two
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    before = node_conns(node.port)
    conn = http.client.HTTPConnection("127.0.0.1", c.control.port, timeout=60)
    conn.request("GET", f"/v1/sandboxes/{sid}/fs/watch?path=/home",
                 headers={"Authorization": f"Bearer {cc.key}"})
    r = conn.getresponse()
    assert r.status == 200
    poll(lambda: node_conns(node.port) > before, timeout=30, what="the forwarded watch")
    assert cc.exec(sid, "touch /home/x")["exit_code"] == 0
    assert b"/home/x" in r.read1(65536)  # the event came through the control
    conn.close()
    poll(lambda: node_conns(node.port) <= before, timeout=60,
         what="the connection closed on the control's and on the node's side")
    cc.remove(sid)


def test_tenants_stay_apart_through_control(two):
    """Another tenant's sandbox id through a control is 404, as if it did not exist."""
    c, _, _ = two
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    t = cc.post("/v1/tenants", {"name": "other"})
    k = cc.post(f"/v1/tenants/{t['id']}/api-keys", {})
    other = cc.with_key(k["key"])
    for method, path, body in [("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}),
                               ("GET", f"/v1/sandboxes/{sid}/files?path=/etc/hostname", None),
                               ("GET", f"/v1/sandboxes/{sid}/processes", None)]:
        r = other.request(method, path, body)
        assert r.status == 404, (path, r.status, r.body[:200])
    cc.remove(sid)


def signed(token, name, method, path, tenant, ts=None, nonce=None):
    ts = int(time.time() * 1000) if ts is None else ts
    nonce = nonce or secrets.token_hex(8)
    msg = b"\0".join(x.encode() for x in
                     ("cove-node-req", method, path, str(ts), nonce, tenant, ""))
    sig = hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()
    return {"Authorization": f"Cove-Node name={name},ts={ts},nonce={nonce},sig={sig}",
            "X-Cove-Tenant": tenant}


def test_node_api_refuses_all_but_fresh_signed_requests(two):
    """A node's API answers an API key, nothing, a forged, a replayed and an expired
    Cove-Node request with 401 (and no Cove-Node-Answer); a fresh signed one is answered,
    with its Cove-Node-Answer."""
    c, _, node = two
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    tenant = "default"  # the admin key's tenant, which owns the sandbox
    with open(c.token("na")) as f:
        token = f.read().strip()
    nc = Client(node.port)
    path = f"/v1/sandboxes/{sid}/processes"
    assert nc.request("GET", path, key=cc.key).status == 401
    assert nc.request("GET", path, auth=False).status == 401
    h = signed(token, "na", "GET", path, tenant)
    r = nc.request("GET", path, headers=h, auth=False)
    assert r.status == 200, r.body[:300]
    assert len(r.headers.get("cove-node-answer", "")) == 64
    r = nc.request("GET", path, headers=h, auth=False)  # replayed
    assert r.status == 401 and "replayed" in r.error["message"]
    assert "cove-node-answer" not in r.headers
    old = signed(token, "na", "GET", path, tenant, ts=int(time.time() * 1000) - 120000)
    assert nc.request("GET", path, headers=old, auth=False).status == 401
    forged = signed("0" * 64, "na", "GET", path, tenant)
    assert nc.request("GET", path, headers=forged, auth=False).status == 401
    other_tenant = dict(signed(token, "na", "GET", path, tenant), **{"X-Cove-Tenant": "x"})
    assert nc.request("GET", path, headers=other_tenant, auth=False).status == 401
    cc.remove(sid)


class _Impostor(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        body = b'{"pid":1,"exit_code":0,"stdout":"forged","stderr":""}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cove-Node-Answer", "0" * 64)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_answer_without_valid_node_signature_is_503(two):
    """Whatever answers at a node's address without the node's Cove-Node-Answer is never
    relayed: the control answers 503 unavailable and says why."""
    c, _, node = two
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    addr = c.sql("SELECT address FROM nodes WHERE name = 'na'")
    try:
        c.sql(f"UPDATE nodes SET address = 'http://127.0.0.1:{srv.server_port}'"
              f" WHERE name = 'na'")
        r = cc.request("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"], "wait": True})
        assert r.status == 503, r.body[:300]
        assert r.error["code"] == "unavailable" and "not authentic" in r.error["message"]
        assert b"forged" not in r.body
    finally:
        c.sql(f"UPDATE nodes SET address = '{addr}' WHERE name = 'na'")
        srv.shutdown()
    assert cc.exec(sid, "echo back")["stdout"] == "back\n"
    cc.remove(sid)


def test_e2b_envd_surface_through_control(two):
    """The E2B in-sandbox surface of a control replica: an upload and a download of /files
    and a filesystem RPC reach the sandbox on its node; the access token is the replica's to
    check (its secret derives from the cluster key), and a wrong one never reaches the node."""
    c, _, _ = two
    cc = c.control.client
    sid = cc.create(template="busybox", snapshot_interval_s=0)["id"]
    envd = free_port()
    m3 = Member(c.build_dir, log_dir=c.log_dir,
                extra_args=["--role", "control", "--cluster-key-file", c.key,
                            "--e2b-sandbox-listen", f"127.0.0.1:{envd}", *c.store_args()],
                env=c.env(), templates_dir=None)
    c.members.append(m3)
    with open(c.key, "rb") as f:
        secret = hmac.new(f.read(), b"cove-e2b-secret", hashlib.sha256).digest()
    token = hmac.new(secret, sid.encode(), hashlib.sha256).hexdigest()
    e = Client(envd)
    h = {"E2b-Sandbox-Id": sid, "X-Access-Token": token}
    r = e.request("POST", "/files?path=/tmp/e2b.txt&username=root", b"via the control\n",
                  headers=dict(h, **{"Content-Type": "application/octet-stream"}), auth=False)
    assert r.status == 200, r.body[:300]
    assert cc.exec(sid, "cat /tmp/e2b.txt")["stdout"] == "via the control\n"
    r = e.request("GET", "/files?path=/tmp/e2b.txt&username=root", headers=h, auth=False)
    assert r.status == 200 and r.body == b"via the control\n", (r.status, r.body[:300])
    r = e.request("POST", "/filesystem.Filesystem/ListDir", {"path": "/tmp"},
                  headers=dict(h, **{"Authorization": "Basic cm9vdDo="}), auth=False)
    assert r.status == 200, r.body[:300]
    assert any(x.get("name") == "e2b.txt" for x in r.json().get("entries", [])), r.body[:500]
    bad = dict(h, **{"X-Access-Token": "0" * 64})
    r = e.request("GET", "/files?path=/tmp/e2b.txt&username=root", headers=bad, auth=False)
    assert r.status == 401
    cc.remove(sid)
