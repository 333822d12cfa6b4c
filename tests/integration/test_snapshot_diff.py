"""Snapshot diffs (docs/api.md "Snapshot diffs"): what changed between two snapshots,
computed from their manifests: added, changed, removed, renamed, mode, symlink, a 1 GB
sparse file, files of the template changed or deleted; one file's unified diff, binary
files, the size bound; another tenant's snapshots are not found."""
import json

import pytest
from cove import sh
from test_openapi import check, response_schema

pytestmark = pytest.mark.root

BEFORE = ("mkdir /data && cd /data && echo keep > keep && printf 'one\\ntwo\\nthree\\n' > change"
          " && echo bye > remove && echo unique-content-123 > old-name && echo m > mode"
          " && chmod 0644 mode && ln -s keep link && printf 'a\\0b' > bin"
          " && head -c 2000000 /dev/zero | tr '\\0' 'x' > big")
AFTER = ("cd /data && printf 'one\\nTWO\\nthree\\n' > change && rm remove && mv old-name new-name"
         " && chmod 0755 mode && ln -sfn change link && truncate -s 1G sparse && echo new > new"
         " && printf 'a\\0c' > bin && echo y >> big"
         " && echo 'x:x:99:' >> /etc/group && rm /etc/passwd")


def snap(c, sid):
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "files"})
    if r.status == 503:
        pytest.skip("this node cannot snapshot: " + r.error.get("message", ""))
    assert r.status == 201, r.body[:300]
    return r.json()["id"]


@pytest.fixture
def two(client):
    sid = client.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        sh(client, sid, BEFORE)
        a = snap(client, sid)
        sh(client, sid, AFTER)
        b = snap(client, sid)
        yield sid, a, b
    finally:
        client.remove(sid, purge=True)


def paths(lst):
    return sorted(e["path"] for e in lst)


def test_known_changes_reported_exactly(client, two):
    sid, a, b = two
    d = client.get(f"/v1/snapshots/{a}/diff/{b}")
    assert (d["from"], d["to"], d["truncated"]) == (a, b, False)
    check(d, response_schema("/v1/snapshots/{sid}/diff/{to}", "get", 200))
    assert paths(d["added"]) == ["/data/new", "/data/new-name", "/data/sparse"]
    assert paths(d["changed"]) == ["/data/big", "/data/bin", "/data/change", "/data/link",
                                   "/data/mode", "/etc/group"]
    assert paths(d["removed"]) == ["/data/old-name", "/data/remove", "/etc/passwd"]
    by = {e["path"]: e for e in d["added"] + d["changed"] + d["removed"]}
    assert by["/data/sparse"]["size_after"] == 1 << 30 and by["/data/sparse"]["size_before"] is None
    assert by["/data/new-name"]["renamed_from"] == "/data/old-name"
    assert by["/data/old-name"]["renamed_to"] == "/data/new-name"
    assert by["/data/new-name"]["hash"] == by["/data/old-name"]["hash"]
    m = by["/data/mode"]
    assert (m["mode_before"], m["mode"]) == ("0644", "0755") and m["hash"] == m["hash_before"]
    c = by["/data/change"]
    assert (c["size_before"], c["size_after"]) == (14, 14) and c["hash"] != c["hash_before"]
    assert by["/data/link"]["type"] == "symlink" and by["/data/link"]["target"] == "change"
    assert by["/etc/group"]["size_after"] == by["/etc/group"]["size_before"] + 8
    assert by["/etc/passwd"]["size_after"] is None
    # the reverse direction swaps added and removed
    r = client.get(f"/v1/snapshots/{b}/diff/{a}")
    assert paths(r["added"]) == paths(d["removed"]) and paths(r["removed"]) == paths(d["added"])
    # a snapshot against itself: nothing
    s = client.get(f"/v1/snapshots/{a}/diff/{a}")
    assert s["added"] == s["changed"] == s["removed"] == []
    # ?path= narrows to a subtree; ?limit= truncates
    n = client.get(f"/v1/snapshots/{a}/diff/{b}?path=/etc/")
    assert paths(n["changed"]) == ["/etc/group"] and paths(n["removed"]) == ["/etc/passwd"]
    assert n["added"] == []
    t = client.get(f"/v1/snapshots/{a}/diff/{b}?limit=2")
    assert t["truncated"] is True and len(t["added"] + t["changed"] + t["removed"]) == 2
    client.expect_error("GET", f"/v1/snapshots/{a}/diff/{b}?path=/data/../etc", 400,
                        "bad_request")
    client.expect_error("GET", f"/v1/snapshots/{a}/diff/{b}?limit=0", 400, "bad_request")


def test_file_diff(client, two):
    sid, a, b = two
    base = f"/v1/snapshots/{a}/diff/{b}/file?path="
    f = client.get(base + "/data/change")
    check(f, response_schema("/v1/snapshots/{sid}/diff/{to}/file", "get", 200))
    assert f["status"] == "changed" and f["binary"] is False
    assert f["diff"] == ("--- a/data/change\n+++ b/data/change\n@@ -1,3 +1,3 @@\n"
                         " one\n-two\n+TWO\n three\n")
    g = client.get(base + "/etc/group")  # the template's version against the sandbox's
    assert g["diff"].endswith("+x:x:99:\n") and "@@ -1,3 +1,4 @@" in g["diff"]
    n = client.get(base + "/data/new")
    assert n["status"] == "added" and n["diff"] == "--- /dev/null\n+++ b/data/new\n@@ -0,0 +1 @@\n+new\n"
    r = client.get(base + "/data/remove")
    assert r["status"] == "removed" and "-bye\n" in r["diff"]
    k = client.get(base + "/data/keep")
    assert k["status"] == "unchanged" and k["diff"] == ""
    bn = client.get(base + "/data/bin")
    assert bn["binary"] is True and bn["diff"] == "Binary files a/data/bin and b/data/bin differ\n"
    lk = client.get(base + "/data/link")  # a symlink diffs its target
    assert "-keep\n\\ No newline at end of file\n+change\n" in lk["diff"]
    # the bound: past it a clear limit_exceeded, nothing read
    for p in ("/data/big", "/data/sparse"):
        e = client.expect_error("GET", base + p, 413, "limit_exceeded")
        assert p in e["message"] and "1048576" in e["message"]
    client.expect_error("GET", base + "/data", 400, "bad_request")
    client.expect_error("GET", f"/v1/snapshots/{a}/diff/{b}/file", 400, "bad_request")


def test_other_tenants_snapshots_are_not_found(client, two):
    sid, a, b = two
    t = client.post("/v1/tenants", {"name": "diff-other"}, expect=201)
    k = client.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)
    cb = client.with_key(k["key"])
    sb = cb.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        own = snap(cb, sb)
        for url in (f"/v1/snapshots/{a}/diff/{b}", f"/v1/snapshots/{own}/diff/{a}",
                    f"/v1/snapshots/{a}/diff/{own}", f"/v1/snapshots/{a}/diff/{b}/file?path=/data/change",
                    f"/v1/snapshots/{own}/diff/{b}/file?path=/data/change"):
            e = cb.expect_error("GET", url, 404, "not_found")
            assert "unique-content" not in str(e)
        # its own snapshots it can diff; even an admin cannot diff across two tenants
        assert cb.get(f"/v1/snapshots/{own}/diff/{own}")["changed"] == []
        client.expect_error("GET", f"/v1/snapshots/{a}/diff/{own}", 404, "not_found")
    finally:
        cb.remove(sb, purge=True)


def test_cove_diff_prints_stat_and_patch(client, coved, build_dir, two):
    import os
    import subprocess
    sid, a, b = two
    env = dict(os.environ, COVE_URL=f"http://127.0.0.1:{coved.port}", COVE_API_KEY=client.key)

    def cove(*args):
        r = subprocess.run([os.path.join(build_dir, "cove"), *args], capture_output=True,
                           timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.decode()

    stat = cove("diff", a, b)
    lines = stat.splitlines()
    assert lines[-1] == " 3 added, 6 changed, 3 removed"
    tags = {l.split()[1]: l.split()[0] for l in lines[:-1]}
    assert tags["/data/new"] == "A" and tags["/data/change"] == "M" and tags["/data/remove"] == "D"
    assert [l.split()[1] for l in lines[:-1]] == sorted(tags)  # path order, as git prints
    assert "(renamed from /data/old-name)" in stat and "mode 0644 -> 0755" in stat
    assert cove("diff", a, b, "/data/change") == \
        "--- a/data/change\n+++ b/data/change\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    narrowed = cove("diff", a, b, "/etc").splitlines()
    assert narrowed[-1] == " 0 added, 1 changed, 1 removed"
    p = cove("diff", "-p", a, b, "/data")
    assert "+TWO\n" in p and "Binary files a/data/bin and b/data/bin differ" in p
    assert "diff /data/big: not shown (limit_exceeded" in p
    assert "unique-content-123" in p  # the removed file's text, as a patch shows it
    assert json.loads(cove("--json", "diff", a, b))["to"] == b


def test_full_snapshots_add_their_processes(client):
    if client.snapshot_kind() != "full":
        pytest.skip("this node takes no full snapshots (no working CRIU): no process lists")
    sid = client.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        r = client.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "full"})
        assert r.status == 201, r.body[:300]
        a = r.json()["id"]
        sh(client, sid, "sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > /root/pid")
        pid = int(sh(client, sid, "cat /root/pid"))
        r = client.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"kind": "full"})
        assert r.status == 201, r.body[:300]
        b = r.json()["id"]
        d = client.get(f"/v1/snapshots/{a}/diff/{b}")
        before = {p["pid"] for p in d["processes"]["before"]}
        after = {p["pid"] for p in d["processes"]["after"]}
        assert pid in after and pid not in before and 1 in before and 1 in after
        assert "/root/pid" in [e["path"] for e in d["added"]]
        # against a files snapshot: that side has no process list
        f = snap(client, sid)
        assert client.get(f"/v1/snapshots/{f}/diff/{b}")["processes"]["before"] is None
    finally:
        client.remove(sid, purge=True)


def test_names_and_texts_that_are_not_utf8(client):
    import base64
    sid = client.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        sh(client, sid, "mkdir /d && printf 'caf\\351\\n' > /d/latin1")
        a = snap(client, sid)
        sh(client, sid, "printf 'th\\351\\n' > /d/latin1 && echo x > \"/d/bad$(printf '\\377')name\"")
        b = snap(client, sid)
        d = client.get(f"/v1/snapshots/{a}/diff/{b}?path=/d")
        (added,) = d["added"]
        assert added["path"] == "/d/bad?name"
        assert base64.b64decode(added["path_b64"]) == b"/d/bad\xffname"
        f = client.get(f"/v1/snapshots/{a}/diff/{b}/file?path=/d/latin1")
        assert f["status"] == "changed" and f["binary"] is False
        assert b"-caf\xe9\n+th\xe9\n" in base64.b64decode(f["diff_b64"])
    finally:
        client.remove(sid, purge=True)
