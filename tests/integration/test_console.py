"""The operator console in a real browser: headless Chromium (Debian's `chromium`, driven by
the playwright-core pinned in tests/browser/package-lock.json) against a real coved: log in
with the admin key, see a sandbox, run a command in the console's terminal, set the timeline
to an earlier snapshot and see its diff, fork from it, approve a pending credential lease,
see a denied egress attempt in the audit view; every console answer carries a CSP that
refuses other origins. coved runs contained (tests/lib/egressenv.py), and so does the
browser, in coved's network namespace. Screenshots are kept under
build/test-artifacts/console/. Skips, saying why, without node, npm, chromium or the npm
registry, or without xterm.js in the build."""
import json
import os
import shutil
import subprocess

import pytest

from egressenv import running
from test_ports_browser import SRC, browser_dir  # noqa: F401 (the fixture)

pytestmark = pytest.mark.root
CSP = "default-src 'self'"


def test_console_end_to_end(browser_dir, build_dir, templates_dir, log_dir):  # noqa: F811
    d_, node, chromium = browser_dir
    shutil.copy(os.path.join(SRC, "console.mjs"), os.path.join(d_, "console.mjs"))
    if not os.path.exists(os.path.join(build_dir, "ui", "xterm.mjs")):
        pytest.skip("xterm.js is not in build/ui (npm was missing or failed at build time)")
    shots = os.path.join(build_dir, "test-artifacts", "console")
    shutil.rmtree(shots, ignore_errors=True)
    os.makedirs(shots)
    with running(build_dir, templates_dir, log_dir, "console") as (d, up):
        c = d.client
        c.put("/v1/secrets/GH", {"value": "ghp_console_" + os.urandom(8).hex(),
                                 "hosts": ["allowed.test"],
                                 "inject": {"header": "Authorization", "format": "Bearer {value}"}})
        sid = c.create(template="base", egress={"allow": ["allowed.test"]})["id"]
        # another tenant's sandbox: the admin's console lists it too
        ten = c.post("/v1/tenants", {"name": "console other"}, expect=201)["id"]
        tc = c.with_key(c.post(f"/v1/tenants/{ten}/api-keys", {}, expect=201)["key"])
        other = tc.create(template="busybox")["id"]
        forks = []
        try:
            c.exec(sid, ["/bin/sh", "-c", "echo kept > /root/kept.txt"])
            early = c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "early", "kind": "files"})
            c.exec(sid, ["/bin/sh", "-c", "echo 'added in the console test' > /root/added.txt"])
            c.post(f"/v1/sandboxes/{sid}/snapshots", {"label": "later", "kind": "files"})
            r = c.exec(sid, ["cove-guest", "request-credential", "GH", "--reason", "console",
                             "--ttl", "600"])
            assert r["exit_code"] == 0, r
            # refused by the gateway: other.test is not allowed (contained: nothing leaves)
            c.exec(sid, ["/bin/sh", "-c", "curl -sS -m 5 http://other.test/ ; "
                                          "curl -sS -m 5 http://10.1.2.3/"], timeout=60)
            base = f"http://127.0.0.1:{d.port}"
            env = dict(os.environ, CHROMIUM=chromium, COVE_KEY=c.key)
            env["OTHER_SANDBOX"] = other
            p = subprocess.run(d.in_netns([node, "console.mjs", base, sid, early["id"], shots]),
                               cwd=d_, env=env, capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, p.stderr[-3000:]
            out = json.loads(p.stdout.strip().splitlines()[-1])
            print("console first load:", out.get("firstLoad"))
            assert "failure" not in out, out
            # the only request to another origin is the CSP probe, refused by the browser
            assert out["errors"] == [] and set(out["offOrigin"]) <= {"http://127.0.0.2:9/x.js"}
            assert out["csp"] and all(v and v.startswith(CSP) for v in out["csp"].values()), \
                out["csp"]
            assert out["cspBlocked"] and "127.0.0.2" in out["cspBlocked"]
            assert out["keyInSession"] == "kept"
            assert ten in out["otherRow"] and "console other" not in out["otherRow"]
            assert out["usageRow"].endswith(("KiB", "MiB")), out["usageRow"]
            assert "console-42" in out["terminal"].splitlines() or \
                any(line.strip() == "console-42" for line in out["terminal"].splitlines())
            assert out["selected"] == early["id"]
            assert "/root/added.txt" in out["diff"] and "/root/kept.txt" not in out["diff"]
            assert "+added in the console test" in out["fileDiff"]
            forks.append(out["fork"])
            assert c.get(f"/v1/sandboxes/{out['fork']}")["state"] == "running"
            got = c.exec(out["fork"], ["/bin/sh", "-c", "ls /root"])["stdout"].split()
            assert "kept.txt" in got and "added.txt" not in got  # forked from the early one
            lease = [x for x in c.get(f"/v1/sandboxes/{sid}/leases")["leases"]
                     if x["secret"] == "GH"]
            assert lease and lease[0]["state"] == "active"
            assert any(sid in row for row in out["denied"]), out["denied"]
            assert out["verify"].startswith("chain intact")
            for n in ("1-sandboxes", "2-terminal", "3-diff", "4-fork", "5-audit"):
                assert os.path.getsize(os.path.join(shots, f"{n}.png")) > 0
        finally:
            for f in forks:
                c.remove(f, purge=True)
            c.remove(sid, purge=True)
            tc.remove(other, purge=True)
            c.delete(f"/v1/tenants/{ten}")


def test_console_files_are_public_with_csp_and_nothing_else_is_served(client, build_dir):
    """The console's files need no key and carry the CSP and nosniff; a name outside the
    console's directory (traversal, a dotfile, a symlink, an unknown type) is 404, and the
    API itself still refuses a request without a key."""
    ui = os.path.join(build_dir, "ui")
    for path, ctype in (("/ui", "text/html"), ("/ui/", "text/html"),
                        ("/ui/index.html", "text/html"), ("/ui/app.js", "text/javascript"),
                        ("/ui/style.css", "text/css")):
        r = client.request("GET", path, auth=False)
        assert r.status == 200, path
        assert r.headers["content-type"].startswith(ctype), path
        assert r.headers["content-security-policy"].startswith(CSP), path
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.request("GET", "/ui/app.js", auth=False).body == \
        open(os.path.join(ui, "app.js"), "rb").read()
    link = os.path.join(ui, "leak.js")
    os.symlink("/etc/passwd", link)
    try:
        for path in ("/ui/leak.js", "/ui/..%2f..%2fbuild.ninja", "/ui/%2e%2e", "/ui/.hidden.js",
                     "/ui/../build.ninja", "/ui/package.json", "/ui/nope.js",
                     "/ui/" + "a" * 80 + ".js"):
            r = client.request("GET", path, auth=False)
            assert r.status == 404, path
            assert b"root:" not in r.body and b"ninja" not in r.body
    finally:
        os.unlink(link)
    assert client.request("GET", "/v1/sandboxes", auth=False).status == 401


def test_usage_of_a_running_sandbox(client, sandbox):
    """GET …/usage gives the memory charged to a running sandbox and its CPU time, which grows
    while it computes; a paused sandbox has none (409), another id is 404."""
    sid = sandbox["id"]
    u0 = client.get(f"/v1/sandboxes/{sid}/usage")
    assert u0["memory_bytes"] > 0 and u0["cpu_usec"] >= 0
    client.exec(sid, ["/bin/sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
    u1 = client.get(f"/v1/sandboxes/{sid}/usage")
    assert u1["cpu_usec"] > u0["cpu_usec"]
    client.expect_error("GET", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/usage", 404, "not_found")
    client.post(f"/v1/sandboxes/{sid}/pause")
    client.expect_error("GET", f"/v1/sandboxes/{sid}/usage", 409, "conflict")


def test_admin_lists_another_tenants_sandboxes(client):
    """?tenant= on the sandbox list: an admin key reads any tenant's list, a tenant key naming
    another tenant gets 404 and its own list never shows another tenant's sandbox."""
    ten = client.post("/v1/tenants", {}, expect=201)["id"]
    tc = client.with_key(client.post(f"/v1/tenants/{ten}/api-keys", {}, expect=201)["key"])
    sid = tc.create(template="busybox")["id"]
    try:
        assert [s["id"] for s in client.get(f"/v1/sandboxes?tenant={ten}")["sandboxes"]] == [sid]
        assert sid not in [s["id"] for s in client.get("/v1/sandboxes")["sandboxes"]]
        tc.expect_error("GET", "/v1/sandboxes?tenant=default", 404, "not_found")
        assert [s["id"] for s in tc.get(f"/v1/sandboxes?tenant={ten}")["sandboxes"]] == [sid]
    finally:
        tc.remove(sid, purge=True)
        client.delete(f"/v1/tenants/{ten}")
