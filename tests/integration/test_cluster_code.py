"""The code interpreter in a cluster: one control replica (with an E2B envd listener) and
two nodes (the set-up of test_cluster_roles.py), a sandbox of the real code-interpreter
template placed on the second node. cove's own POST /v1/sandboxes/{id}/code and the E2B
code interpreter SDK's port 49999 routes (/execute, /contexts) reach its server through the
control; the envd and traffic tokens are the control's to check, and a wrong one is
refused there."""
import hashlib
import hmac
import json

import pytest

from cove import Client, free_port, poll

roles = pytest.importorskip("test_cluster_roles",
                            reason="needs the cluster roles and their test set-up "
                                   "(tests/integration/test_cluster_roles.py)")
cluster, pg, rgw, pytestmark = roles.cluster, roles.pg, roles.rgw, roles.pytestmark
pytestmark = [*pytestmark, pytest.mark.slow]  # minutes: not in the sanitizer pass
Member, live_nodes = roles.Member, roles.live_nodes

TEMPLATES = ["--templates", "busybox,base,code-interpreter"]


def ndjson(body):
    return [json.loads(x) for x in body.split(b"\n") if x.strip()]


def test_code_interpreter_through_control_on_the_second_node(cluster):
    c = cluster
    c.start_node("na", extra=TEMPLATES)
    c.start_node("nb", extra=TEMPLATES)
    poll(lambda: live_nodes(c) == "na,nb", timeout=60, what="both nodes hold a lease")
    envd = free_port()
    m = Member(c.build_dir, log_dir=c.log_dir,
               extra_args=["--role", "control", "--cluster-key-file", c.key,
                           "--e2b-sandbox-listen", f"127.0.0.1:{envd}", *c.store_args()],
               env=c.env(), templates_dir=None)
    c.members.append(m)
    cc = c.control.client
    assert cc.post("/v1/nodes/na/cordon")["state"] == "cordoned"
    sb = cc.create(template="code-interpreter", snapshot_interval_s=0)
    sid = sb["id"]
    assert sb["node"] == "nb", sb
    assert cc.post("/v1/nodes/na/uncordon")["state"] == "ready"

    # cove's own route, through the control
    lines = list(cc.stream(f"/v1/sandboxes/{sid}/code", {"code": "x = 40\nprint('hi')\nx + 2"},
                           timeout=300))
    assert lines[-1] == {"type": "end_of_execution"}, lines[-3:]
    assert "".join(x["text"] for x in lines if x["type"] == "stdout") == "hi\n", lines
    res = [x for x in lines if x["type"] == "result" and x.get("is_main_result")]
    assert res and res[0]["text"] == "42", lines

    # the E2B SDK's port 49999, through the control's envd listener
    with open(c.key, "rb") as f:
        secret = hmac.new(f.read(), b"cove-e2b-secret", hashlib.sha256).digest()
    token = hmac.new(secret, sid.encode(), hashlib.sha256).hexdigest()
    traffic = "cpt_" + hmac.new(secret, f"traffic:{sid}".encode(),
                                hashlib.sha256).hexdigest()[:48]
    e = Client(envd)
    h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999"}
    r = e.request("POST", "/execute", {"code": "x * 3"}, headers=dict(h, **{"X-Access-Token": token}),
                  auth=False, timeout=300)
    assert r.status == 200, (r.status, r.body[:300])
    ev = ndjson(r.body)
    assert any(x.get("type") == "result" and x.get("text") == "120" for x in ev), ev
    r = e.request("POST", "/contexts", {"language": "python"},
                  headers=dict(h, **{"E2B-Traffic-Access-Token": traffic}), auth=False,
                  timeout=300)
    assert r.status == 200, (r.status, r.body[:300])
    cid = r.json()["id"]
    r = e.request("GET", "/contexts", headers=dict(h, **{"E2B-Traffic-Access-Token": traffic}),
                  auth=False)
    got = r.json()
    got = got["contexts"] if isinstance(got, dict) else got
    assert r.status == 200 and cid in [x["id"] for x in got], r.body[:500]
    r = e.request("POST", "/execute", {"code": "x", "context_id": cid},
                  headers=dict(h, **{"X-Access-Token": token}), auth=False, timeout=300)
    assert r.status == 200
    assert any(x.get("type") == "error" and x.get("name") == "NameError"
               for x in ndjson(r.body)), r.body[:500]  # a context of its own
    r = e.request("DELETE", f"/contexts/{cid}",
                  headers=dict(h, **{"E2B-Traffic-Access-Token": traffic}), auth=False)
    assert r.status == 204, (r.status, r.body[:300])
    # wrong or missing tokens are refused by the control
    for bad in ({"X-Access-Token": "0" * 64}, {"E2B-Traffic-Access-Token": "cpt_" + "0" * 48},
                {}):
        r = e.request("POST", "/execute", {"code": "1"}, headers=dict(h, **bad), auth=False)
        assert r.status == 401, (bad, r.status, r.body[:300])
    r = e.request("GET", "/contexts", headers=dict(h, **{"E2b-Sandbox-Port": "49983",
                                                         "X-Access-Token": token}), auth=False)
    assert r.status == 404, (r.status, r.body[:300])
    cc.remove(sid)
