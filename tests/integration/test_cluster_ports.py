"""Exposed ports in a cluster (docs/ports.md "In a cluster"): a control replica with a port
listener and two nodes with theirs (the set-up of test_cluster_roles.py). The app of
test_ports.py runs in a sandbox on the second node; its preview URLs, as the control's API
answers them, name the control's address and work there: HTTP with keep-alive and a body,
a WebSocket echo and an SSE stream, a private port refused without its token or with a
wrong one. A node's own listener answers only what a control replica relays (signed with
the node's token). After a drain moves the sandbox to the other node, the same URL and
token reach it there, and after it moves back the node it left only knows the
exposures it has now."""
import http.client
import json
import socket

import pytest

from cove import free_port, poll

roles = pytest.importorskip("test_cluster_roles",
                            reason="needs the cluster roles and their test set-up "
                                   "(tests/integration/test_cluster_roles.py)")
pg, rgw, pytestmark = roles.pg, roles.rgw, roles.pytestmark
pytestmark = [*pytestmark, pytest.mark.slow]  # minutes: not in the sanitizer pass
Member, live_nodes = roles.Member, roles.live_nodes
from test_ports import HTTP, WS, start_app, ws_connect, ws_recv, ws_send  # noqa: E402

DOMAIN = "ports.test"


class At:
    """what test_ports' helpers need of a listener: its port"""

    def __init__(self, port):
        self.pport = port


def get(port, path, host=None, headers=None, conn=None, method="GET", body=None):
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
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
    rest = url.split("://", 1)[1]
    host, _, path = rest.partition("/")
    return "/" + path, host


@pytest.fixture
def pcluster(request, build_dir, templates_dir, pg, rgw, tmp_path):  # noqa: F811
    """The cluster set-up with its one control replica serving a port listener (one
    replica: it alone drives the drain)."""
    c = roles.Cluster(build_dir, templates_dir, pg, rgw, str(tmp_path))
    c.pport = free_port()
    c.control = Member(build_dir, log_dir=c.log_dir,
                       extra_args=["--role", "control", "--cluster-key-file", c.key,
                                   "--ports-listen", f"127.0.0.1:{c.pport}", "--ports-domain",
                                   DOMAIN, *c.store_args()],
                       env=c.env(), templates_dir=None)
    c.members.append(c.control)
    yield c
    c.failed = getattr(request.node, "cove_failed", False)
    c.stop()


def test_preview_urls_through_the_control_and_after_a_drain(pcluster):
    c = pcluster
    node_ports = {}
    for name in ("na", "nb"):
        node_ports[name] = free_port()
        c.start_node(name, extra=["--templates", "busybox,base", "--ports-listen",
                                  f"127.0.0.1:{node_ports[name]}", "--ports-domain", DOMAIN])
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    pport = c.pport
    cc = c.control.client
    assert cc.post("/v1/nodes/na/cordon")["state"] == "cordoned"
    sid = cc.create(template="base", snapshot_interval_s=0)["id"]
    assert cc.get(f"/v1/sandboxes/{sid}")["node"] == "nb"
    assert cc.post("/v1/nodes/na/uncordon")["state"] == "ready"
    start_app(cc, sid)

    # a private port: the URL the control answers is the control's, and works as it is
    r = cc.ok("POST", f"/v1/sandboxes/{sid}/ports", {"port": HTTP}, expect=(201,))
    tok = r["token"]
    path, host = split(r["url"])
    assert host == f"{HTTP}-{sid}.{DOMAIN}:{pport}", r["url"]
    st, h, body = get(pport, path, host=host)
    assert st == 200 and b"hello from the sandbox" in body, (st, body[:300])
    assert h["set-cookie"].startswith(f"cove_port_token={tok};")
    lst = cc.get(f"/v1/sandboxes/{sid}/ports")["ports"]
    assert [p["url"] for p in lst] == [f"http://{host}/"], lst
    for hd, want in (({}, 401), ({"X-Cove-Port-Token": "cpt_" + "0" * 48}, 403)):
        st, _, body = get(pport, "/", host=host, headers=hd)
        assert st == want, (hd, st, body[:300])
    # keep-alive requests and a body on one connection; the path route too
    conn = http.client.HTTPConnection("127.0.0.1", pport, timeout=60)
    for _ in range(3):
        st, _, _ = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok}, conn=conn)
        assert st == 200
    st, _, body = get(pport, "/echo", host=host, headers={"X-Cove-Port-Token": tok}, conn=conn,
                      method="POST", body=b"x" * 300000)
    assert st == 200 and body.decode().endswith(" 300000"), body[:300]
    conn.close()
    st, _, body = get(pport, f"/p/{sid}/{HTTP}/headers", headers={"X-Cove-Port-Token": tok,
                                                                 "X-Cove-Relay": "forged"})
    assert st == 200, body[:300]
    seen = {k.lower(): v for k, v in json.loads(body)["headers"].items()}
    assert seen["x-forwarded-for"] == "127.0.0.1", seen
    assert not any(k.startswith("x-cove") for k in seen), seen  # nothing of the relay

    # the node's own listener: only what a control relays
    for hd in ({"X-Cove-Port-Token": tok},
               {"X-Cove-Port-Token": tok, "X-Cove-Client": "127.0.0.1",
                "X-Cove-Relay": "Cove-Node name=nb,ts=1,nonce=00,sig=" + "0" * 64}):
        st, _, body = get(node_ports["nb"], "/", host=host, headers=hd)
        assert st == 403 and b"control replicas only" in body, (st, body[:300])

    # a WebSocket echo and an SSE stream through the control
    wtok = cc.ok("POST", f"/v1/sandboxes/{sid}/ports", {"port": WS}, expect=(201,))["token"]
    s, head = ws_connect(At(pport), f"/p/{sid}/{WS}/?cove_token={wtok}")
    assert head.startswith("HTTP/1.1 101"), head
    for msg in (b"hello", b"y" * 70000):
        ws_send(s, msg, op=2)
        assert ws_recv(s) == (2, msg)
    s.close()
    s, head = ws_connect(At(pport), f"/p/{sid}/{WS}/")
    assert head.startswith("HTTP/1.1 401"), head
    s.close()
    s = socket.create_connection(("127.0.0.1", pport), timeout=60)
    s.sendall(f"GET /sse?n=100000 HTTP/1.1\r\nHost: {host}\r\nX-Cove-Port-Token: {tok}\r\n"
              f"Accept: text/event-stream\r\n\r\n".encode())
    got = b""
    while got.count(b"data: tick") < 3:
        b = s.recv(4096)
        assert b, got
        got += b
    assert b"200 OK" in got and b"text/event-stream" in got
    s.close()
    # a sandbox that does not exist
    st, _, body = get(pport, "/", host=f"{HTTP}-sbx_nothere.{DOMAIN}")
    assert st == 404, (st, body[:300])

    # a drain moves it to na: the same URL and token reach it there
    r = cc.request("POST", "/v1/nodes/nb/drain")
    assert r.status == 202, r.body[:300]

    def moved():
        sb = cc.get(f"/v1/sandboxes/{sid}")
        return sb["node"] == "na" and sb["state"] == "running"
    poll(moved, timeout=300, what="the sandbox running on na")
    st, _, body = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok})
    if st == 502:  # a files-only move: the app's process did not come along
        start_app(cc, sid)
        st, _, body = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok})
    assert st == 200 and b"hello from the sandbox" in body, (st, body[:300])
    st, _, _ = get(pport, "/", host=host, headers={"X-Cove-Port-Token": "cpt_" + "1" * 48})
    assert st == 403
    # unexposing through the control ends it on the node it is on now
    cc.delete(f"/v1/sandboxes/{sid}/ports/{HTTP}")
    st, _, _ = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok})
    assert st == 404

    # exposed again (a new token) on na, then moved back to nb, which still remembers the
    # old token from before: there only the new one works
    tok2 = cc.ok("POST", f"/v1/sandboxes/{sid}/ports", {"port": HTTP}, expect=(201,))["token"]
    assert cc.post("/v1/nodes/nb/uncordon")["state"] == "ready"
    r = cc.request("POST", "/v1/nodes/na/drain")
    assert r.status == 202, r.body[:300]

    def back():
        sb = cc.get(f"/v1/sandboxes/{sid}")
        return sb["node"] == "nb" and sb["state"] == "running"
    poll(back, timeout=300, what="the sandbox running on nb again")
    st, _, body = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok2})
    if st == 502:
        start_app(cc, sid)
        st, _, body = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok2})
    assert st == 200 and b"hello from the sandbox" in body, (st, body[:300])
    st, _, body = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok})
    assert st == 403, (st, body[:300])  # the removed token stays removed
    cc.remove(sid)


def test_auto_resume_through_the_control(pcluster):
    """A paused sandbox's port with auto_resume: the control replica checks the port's token
    itself and resumes the sandbox (a lifecycle job, as the user's resume), then relays the
    request; without the token, with a wrong one or on a port without auto_resume nothing
    resumes."""
    c = pcluster
    nport = free_port()
    c.start_node("na", extra=["--templates", "busybox,base", "--ports-listen",
                              f"127.0.0.1:{nport}", "--ports-domain", DOMAIN])
    poll(lambda: live_nodes(c) == "na", timeout=60, what="the node holds a lease")
    pport, cc = c.pport, c.control.client
    sid = cc.create(template="base", snapshot_interval_s=0)["id"]
    start_app(cc, sid)
    r = cc.ok("POST", f"/v1/sandboxes/{sid}/ports", {"port": HTTP, "auto_resume": True},
              expect=(201,))
    tok = r["token"]
    _, host = split(r["url"])
    cc.ok("POST", f"/v1/sandboxes/{sid}/ports", {"port": WS, "public": True}, expect=(201,))
    st, _, body = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok})
    assert st == 200, (st, body[:300])
    cc.post(f"/v1/sandboxes/{sid}/pause")
    cc.wait_state(sid, ("paused",), timeout=120)
    desired = f"SELECT desired_state FROM placements WHERE sandbox_id = '{sid}'"
    assert c.sql(desired) == "paused"

    st, h, body = get(pport, f"/p/{sid}/{WS}/")
    assert st == 503 and h.get("retry-after") == "5", (st, body[:300])
    err = json.loads(body)["error"]
    assert err["code"] == "sandbox_paused" and "auto_resume" in err["message"], err
    for hd, want in (({}, 401), ({"X-Cove-Port-Token": "cpt_" + "0" * 48}, 403)):
        st, _, body = get(pport, "/", host=host, headers=hd)
        assert st == want, (hd, st, body[:300])
    assert cc.get(f"/v1/sandboxes/{sid}")["state"] == "paused"
    assert c.sql(desired) == "paused"

    st, _, body = get(pport, "/", host=host, headers={"X-Cove-Port-Token": tok})
    sb = cc.get(f"/v1/sandboxes/{sid}")
    assert sb["state"] == "running" and sb["node"] == "na", sb
    assert c.sql(desired) == "running"  # the control's resume, not one behind its back
    snaps = cc.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]
    if snaps and snaps[0].get("kind") == "full":
        assert st == 200 and b"hello from the sandbox" in body, (st, body[:300])
    else:  # a files snapshot resumes without processes: nothing listens
        assert st == 502, (st, body[:300])
    cc.remove(sid)
