"""Dockerfile RUN steps get the build's egress policy: a RUN reaches a host the policy
allows, and not one it does not. The hosts are contained test hosts (tests/lib/egressenv.py:
coved in a network namespace whose only way out leads to a namespace of test servers)."""
import json
import os
import time
import uuid

import pytest

from cove import poll
from egressenv import UP1, running

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def env(build_dir, templates_dir, log_dir):
    with running(build_dir, templates_dir, log_dir, "templates-egress") as e:
        yield e


def build(client, name, timeout=600, **body):
    client.post("/v1/templates", {"name": name, **body}, expect=(202,))
    return poll(lambda: (t := client.get(f"/v1/templates/{name}"))["state"] != "building" and t,
                timeout=timeout, what=f"template {name} built")


def new_step_caches(templates_dir, since):
    """The RUN step caches (cache..KEY templates) made since the test began: the shared
    templates dir must not keep them."""
    td = os.path.join(templates_dir, "tenants", "default")
    out = []
    for n in os.listdir(td) if os.path.isdir(td) else ():
        try:
            with open(os.path.join(td, n, "meta.json")) as f:
                m = json.load(f)
        except OSError:
            continue
        if n.startswith("cache..") and m.get("source") == {"dockerfile": "RUN"} and \
                os.stat(os.path.join(td, n)).st_mtime >= since - 1:
            out.append(n)
    return out


def test_dockerfile_run_reaches_only_what_the_build_egress_allows(env, templates_dir):
    d, up = env
    since = time.time()
    c = d.client
    tag = uuid.uuid4().hex[:8]
    ok, bad = f"dfeg-ok-{tag}", f"dfeg-bad-{tag}"
    allow = {"allow": ["allowed.test"]}
    try:
        df = f"FROM busybox\nRUN wget -q -O /got.txt http://allowed.test/{tag}\n"
        t = build(c, ok, **{"from": {"dockerfile": df}, "egress": allow})
        assert t["state"] == "ready", t
        sb = c.create(template=ok)
        try:
            r = c.exec(sb["id"], "cat /got.txt")
            assert r["stdout"] == f"hello allowed.test {UP1}\n", r
        finally:
            c.remove(sb["id"])
        assert [q for q in up.requests() if q["path"] == f"/{tag}"], up.requests()
        # the same policy, a host it does not name: the RUN fails, the host saw nothing
        df = f"FROM busybox\nRUN wget -q -T 10 -O /got.txt http://other.test/{tag}-no\n"
        t = build(c, bad, **{"from": {"dockerfile": df}, "egress": allow})
        assert t["state"] == "failed", t
        assert "line 2: RUN exited with" in t["error"]["message"], t
        assert not [q for q in up.requests() if q["path"] == f"/{tag}-no"], up.requests()
    finally:
        for n in (ok, bad):
            c.request("DELETE", f"/v1/templates/{n}")
        for n in new_step_caches(templates_dir, since):
            c.request("DELETE", f"/v1/templates/{n}")
