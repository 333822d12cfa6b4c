"""Tenant keys at rest (docs/security.md "Keys"): a revoked key refuses create, resume,
fork and snapshot reads with key_revoked and leaves no partial state; afterwards no
plaintext written inside sandboxes or snapshots is left anywhere in the data dir; a
tampered record fails closed; rotation (local key files, the command provider) keeps old
snapshots restorable; the command provider with a test KMS (tests/security/kms.sh) that
revokes, hangs or answers garbage gives clear errors within a bounded wait."""
import json
import os
import secrets
import subprocess
import time

import pytest

from cove import grep_data

pytestmark = pytest.mark.root

KMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kms.sh")


def new_tenant(admin):
    t = admin.post("/v1/tenants", {}, expect=201)
    k = admin.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)
    return t["id"], admin.with_key(k["key"])


def inventory(data_dir):
    out = set()
    for root, dirs, files in os.walk(data_dir):
        for f in files:
            p = os.path.join(root, f)
            if f.startswith("catalog.db") or "/keys/" in p:
                continue
            out.add(os.path.relpath(p, data_dir))
    return out


def write_marker(c, sid, marker):
    # the marker is built inside the sandbox, so it is not in exec's argv or the catalog
    h = len(marker) // 2
    c.exec(sid, f"printf '%s%s\\n' '{marker[:h]}' '{marker[h:]}' > /root/marker.txt && "
                f"cp /root/marker.txt /tmp/m2 && sync")
    assert c.exec(sid, "cat /root/marker.txt")["stdout"] == marker + "\n"


def test_revoke_refuses_and_leaves_no_plaintext(coved_factory):
    d = coved_factory(extra_args=["--key-cache-ttl", "60"])
    admin = d.client
    tid, c = new_tenant(admin)
    m1, m2 = "COVE-MARK-" + secrets.token_hex(12), "COVE-MARK-" + secrets.token_hex(12)
    a = c.create(template="busybox")
    write_marker(c, a["id"], m1)
    snap = c.post(f"/v1/sandboxes/{a['id']}/snapshots", {}, expect=(200, 201))
    snap_id = (snap.get("snapshot") or snap)["id"]
    b = c.create(template="busybox")
    write_marker(c, b["id"], m2)
    c.post(f"/v1/sandboxes/{b['id']}/pause", {})
    # the search works: the running sandbox's layer holds the marker in clear
    assert grep_data(d.data, m1), "marker of a running sandbox not found: the grep is blind"
    assert a["storage_encrypted"] is False

    st = c.post("/v1/keys/revoke", {"tenant": tid})
    assert st["state"] == "revoked" and st["policy"] == "stop" and st["sandboxes_stopped"] == 2
    sa = c.sandbox(a["id"])
    assert sa["state"] == "stopped" and "revoked" in sa["error"]
    assert c.sandbox(b["id"])["state"] == "paused"
    before_ids = {s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]}
    before_files = inventory(d.data)
    refused = [
        ("POST", "/v1/sandboxes", {"template": "busybox"}),
        ("POST", f"/v1/sandboxes/{b['id']}/resume", {}),
        ("POST", f"/v1/sandboxes/{b['id']}/fork", {}),
        ("POST", f"/v1/sandboxes/{a['id']}/fork", {"snapshot_id": snap_id}),
        ("POST", f"/v1/sandboxes/{a['id']}/rewind", {"snapshot_id": snap_id}),
        ("POST", f"/v1/sandboxes/{a['id']}/snapshots", {}),
        ("GET", f"/v1/snapshots/{snap_id}", None),
    ]
    for m, p, body in refused:
        e = c.expect_error(m, p, 403, "key_revoked", body=body)
        assert tid in e["message"] or "revoked" in e["message"]
    # no partial state: no new rows, no new files (layers, restore images, chunks)
    assert {s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]} == before_ids
    assert c.sandbox(b["id"])["state"] == "paused"
    assert inventory(d.data) == before_files
    # nothing written inside the sandboxes is left in clear anywhere in the data dir
    assert grep_data(d.data, m1) == []
    assert grep_data(d.data, m2) == []
    # the status says so; revoking again is harmless; other tenants are not affected
    assert c.get("/v1/keys")["state"] == "revoked"
    assert c.post("/v1/keys/revoke", {"tenant": tid})["state"] == "revoked"
    other = admin.create(template="busybox")
    assert other["state"] == "running"
    admin.remove(other["id"])
    # every key operation is in the tenant's audit log
    ev = c.get("/v1/audit?kind=key")["events"]
    acts = [(e["action"], e["verdict"]) for e in ev]
    assert ("revoke", "allow") in acts and ("unwrap", "deny") in acts
    assert all(m1 not in json.dumps(e) for e in ev)


def test_tampered_record_fails_closed(coved_factory):
    d = coved_factory()
    tid, c = new_tenant(d.client)
    s = c.create(template="busybox")
    c.remove(s["id"])
    path = os.path.join(d.data, "keys", f"{tid}.key")
    orig = open(path).read()
    rec = json.loads(orig)
    w = rec["wrapped"]
    rec["wrapped"] = w[:10] + ("A" if w[10] != "A" else "B") + w[11:]
    with open(path, "w") as f:
        json.dump(rec, f)
    e = c.expect_error("POST", "/v1/sandboxes", 403, "key_revoked", body={"template": "busybox"})
    assert "wrong key or tampered" in e["message"] and rec["wrapped"] not in e["message"]
    # a record swapped in from another tenant does not open either
    tid2, c2 = new_tenant(d.client)
    c2.remove(c2.create(template="busybox")["id"])
    other = json.loads(open(os.path.join(d.data, "keys", f"{tid2}.key")).read())
    other["tenant"] = tid
    with open(path, "w") as f:
        json.dump(other, f)
    c.expect_error("POST", "/v1/sandboxes", 403, "key_revoked", body={"template": "busybox"})
    # the untouched record opens again: the refusals were about the record
    with open(path, "w") as f:
        f.write(orig)
    c.remove(c.create(template="busybox")["id"])


def kms_dir(tmp_path):
    k = tmp_path / "kms"
    k.mkdir()
    (k / "kek").write_text(secrets.token_hex(32))
    os.chmod(k / "kek", 0o600)
    return str(k)


def kms_spec(kdir, timeout_ms=2000):
    return {"provider": "command", "wrap_cmd": f"{KMS} wrap {kdir}",
            "unwrap_cmd": f"{KMS} unwrap {kdir}", "key_id": "test-kms/key-1",
            "timeout_ms": timeout_ms}


def test_rotation_keeps_snapshots_restorable(coved_factory, tmp_path):
    d = coved_factory()
    admin = d.client
    tid, c = new_tenant(admin)
    mark = "COVE-ROT-" + secrets.token_hex(8)
    s = c.create(template="busybox")
    write_marker(c, s["id"], mark)
    snap = c.post(f"/v1/sandboxes/{s['id']}/snapshots", {}, expect=(200, 201))
    snap_id = (snap.get("snapshot") or snap)["id"]
    c.post(f"/v1/sandboxes/{s['id']}/pause", {})
    v1 = c.get("/v1/keys")
    assert v1["provider"] == "local" and v1["key_id"].startswith("node:") and v1["version"] == 1
    # BYOK: a local key file
    kf = tmp_path / "tenant.kek"
    kf.write_bytes(os.urandom(32))
    os.chmod(kf, 0o600)
    st = admin.post("/v1/keys", {"tenant": tid, "provider": "local", "key_file": str(kf)})
    assert st["version"] == 2 and st["key_id"].startswith("local:")
    assert c.post(f"/v1/sandboxes/{s['id']}/resume", {})["state"] == "running"
    assert c.exec(s["id"], "cat /root/marker.txt")["stdout"] == mark + "\n"
    c.post(f"/v1/sandboxes/{s['id']}/pause", {})
    # to the command provider (a KMS), then the key file is not needed any more
    kdir = kms_dir(tmp_path)
    st = admin.post("/v1/keys", dict(kms_spec(kdir), tenant=tid))
    assert st["provider"] == "command" and st["key_id"] == "test-kms/key-1"
    assert st["version"] == 3
    os.unlink(kf)
    rec = open(os.path.join(d.data, "keys", f"{tid}.key")).read()
    assert "wrapped" in rec
    # a rotation in place (the KMS wraps again), then restore the oldest snapshot
    st = admin.post("/v1/keys/rotate", {"tenant": tid})
    assert st["version"] == 4
    forks = c.post(f"/v1/sandboxes/{s['id']}/fork", {"snapshot_id": snap_id})["sandboxes"]
    assert c.exec(forks[0]["id"], "cat /root/marker.txt")["stdout"] == mark + "\n"
    assert c.post(f"/v1/sandboxes/{s['id']}/resume", {})["state"] == "running"
    assert c.exec(s["id"], "cat /root/marker.txt")["stdout"] == mark + "\n"
    # a tenant key may not add or rotate keys (commands run on the node)
    c.expect_error("POST", "/v1/keys", 403, "unauthorized", body=kms_spec(kdir))
    ev = c.get("/v1/audit?kind=key")["events"]
    acts = [e["action"] for e in ev if e["verdict"] == "allow"]
    assert acts.count("add") == 2 and acts.count("rotate") == 1
    for x in forks + [s]:
        c.remove(x["id"], purge=True)


def test_command_provider_kms_revoke_hang_garbage(coved_factory, tmp_path):
    d = coved_factory(extra_args=["--key-cache-ttl", "1"])
    admin = d.client
    tid, c = new_tenant(admin)
    kdir = kms_dir(tmp_path)
    # a command that cannot unwrap is refused at add time; the record stays as it was
    bad = dict(kms_spec(kdir), unwrap_cmd="echo nope")
    e = admin.expect_error("POST", "/v1/keys", 503, "unavailable", body=dict(bad, tenant=tid))
    assert "invalid output" in e["message"]
    assert c.get("/v1/keys")["provider"] == "local"
    admin.post("/v1/keys", dict(kms_spec(kdir, timeout_ms=500), tenant=tid))
    s = c.create(template="busybox")
    # revoked in the KMS: running sandboxes stop and creates fail within the cache TTL
    open(os.path.join(kdir, "revoked"), "w").close()
    t0 = time.monotonic()
    c.wait_state(s["id"], "stopped", timeout=10)
    took = time.monotonic() - t0
    assert took < 4, f"KMS revocation took {took:.1f} s to stop the sandbox (TTL 1 s)"
    # the tenant (BYOK) had its own warm pool since its create: dropped with the sandbox
    assert s["storage_encrypted"] is True
    await_metric(admin, "cove_pool_ready", lambda v: v <= 4, timeout=10)
    e = c.expect_error("POST", "/v1/sandboxes", 403, "key_revoked", body={"template": "busybox"})
    assert "exit 3" in e["message"]
    os.unlink(os.path.join(kdir, "revoked"))
    c.remove(c.create(template="busybox")["id"])  # the KMS allows again: so does cove
    # a KMS that hangs: a bounded wait, a clear error
    open(os.path.join(kdir, "hang"), "w").close()
    deadline = time.monotonic() + 5
    while True:
        t1 = time.monotonic()
        r = c.request("POST", "/v1/sandboxes", {"template": "busybox"})
        if r.status != 201 or time.monotonic() > deadline:
            break
        c.remove(r.json()["id"])
        time.sleep(0.2)
    assert r.status == 503 and r.error["code"] == "unavailable", r.body
    assert "timed out after 500 ms" in r.error["message"]
    assert time.monotonic() - t1 < 3
    os.unlink(os.path.join(kdir, "hang"))
    # garbage
    open(os.path.join(kdir, "garbage"), "w").close()
    e = c.expect_error("POST", "/v1/sandboxes", 503, "unavailable", body={"template": "busybox"})
    assert "invalid output" in e["message"]
    os.unlink(os.path.join(kdir, "garbage"))
    c.remove(c.create(template="busybox")["id"])
    # no hung KMS process is left behind
    r = subprocess.run(["pgrep", "-f", "sleep 3600"], capture_output=True, text=True)
    assert not [p for p in r.stdout.split() if os.path.exists(f"/proc/{p}") and
                kdir in open(f"/proc/{p}/cmdline").read()]


def test_revoke_finish_policy_and_crash(coved_factory):
    """policy finish: running sandboxes go on (exec works) but take no snapshot and cannot
    pause; the revocation survives kill -9 of coved; tenant and API-key operations are in
    the tenant's audit chain."""
    d = coved_factory()
    admin = d.client
    tid, c = new_tenant(admin)
    s = c.create(template="busybox")
    st = c.post("/v1/keys/revoke", {"tenant": tid, "policy": "finish"})
    assert st["policy"] == "finish" and st["sandboxes_stopped"] == 0
    assert c.sandbox(s["id"])["state"] == "running"
    assert c.exec(s["id"], "echo still")["stdout"] == "still\n"
    c.expect_error("POST", f"/v1/sandboxes/{s['id']}/snapshots", 403, "key_revoked", body={})
    c.expect_error("POST", f"/v1/sandboxes/{s['id']}/pause", 403, "key_revoked", body={})
    assert c.sandbox(s["id"])["state"] == "running"
    d.kill9()
    d.start()
    c = d.client.with_key(c.key)
    c.expect_error("POST", "/v1/sandboxes", 403, "key_revoked", body={"template": "busybox"})
    assert c.get("/v1/keys")["state"] == "revoked"
    ev = c.get("/v1/audit")["events"]
    kinds = {(e["kind"], e["action"]) for e in ev}
    assert {("tenant", "create"), ("api_key", "create"), ("key", "revoke")} <= kinds
    assert all(e["detail"].get("actor") for e in ev if e["kind"] in ("tenant", "api_key"))
    assert d.client.get("/v1/audit/verify")["ok"] is True


def test_encrypted_working_storage(coved_factory):
    """storage_encrypted: true: the writable layer is fscrypt-encrypted under a key from the
    tenant's DEK, so a marker written (and synced) inside a running sandbox is in no file of
    the data dir; snapshot, pause/resume, fork and rewind work on it and keep it encrypted."""
    d = coved_factory()
    tid, c = new_tenant(d.client)
    c.expect_error("POST", "/v1/sandboxes", 400, "bad_request",
                   body={"template": "busybox", "storage_encrypted": "yes"})
    s = c.create(template="busybox", storage_encrypted=True)
    assert s["storage_encrypted"] is True
    mark = "COVE-ENC-" + secrets.token_hex(12)
    write_marker(c, s["id"], mark)
    plain = c.create(template="busybox")
    assert plain["storage_encrypted"] is False
    pmark = "COVE-PLAIN-" + secrets.token_hex(12)
    write_marker(c, plain["id"], pmark)
    # the same search finds the unencrypted sandbox's marker: it is not blind
    assert grep_data(d.data, pmark)
    assert grep_data(d.data, mark) == [], "plaintext of an encrypted layer found at rest"
    # a files snapshot (the clone of the encrypted layer's image, its journal replayed
    # without the key); pause below takes the node's default kind
    snap = c.post(f"/v1/sandboxes/{s['id']}/snapshots", {"kind": "files"}, expect=(200, 201))
    assert snap["kind"] == "files"
    snap_id = snap["id"]
    c.exec(s["id"], "echo later > /root/later.txt && sync")
    c.post(f"/v1/sandboxes/{s['id']}/pause", {})
    r = c.post(f"/v1/sandboxes/{s['id']}/resume", {})
    assert r["state"] == "running" and r["storage_encrypted"] is True
    assert c.exec(s["id"], "cat /root/marker.txt /root/later.txt")["stdout"] == mark + "\nlater\n"
    forks = c.post(f"/v1/sandboxes/{s['id']}/fork", {"snapshot_id": snap_id})["sandboxes"]
    f = forks[0]
    assert f["storage_encrypted"] is True
    assert c.exec(f["id"], "cat /root/marker.txt")["stdout"] == mark + "\n"
    c.exec(f["id"], "cp /root/marker.txt /root/again.txt && sync")
    rw = c.post(f"/v1/sandboxes/{s['id']}/rewind", {"snapshot_id": snap_id})
    assert rw["sandbox"]["storage_encrypted"] is True
    assert c.exec(s["id"], "cat /root/marker.txt; ls /root")["stdout"].startswith(mark + "\n")
    assert "later.txt" not in c.exec(s["id"], "ls /root")["stdout"]
    assert grep_data(d.data, mark) == []
    # revoke: the encrypted sandboxes stop like the others
    st = c.post("/v1/keys/revoke", {"tenant": tid})
    assert st["sandboxes_stopped"] >= 3
    assert grep_data(d.data, mark) == [] and grep_data(d.data, pmark) == []


def test_resume_from_an_encrypted_kept_image_stays_encrypted(coved_factory):
    """A resume to a files snapshot on the node that took it clones the snapshot's kept layer
    image and mounts it with the sandbox's key before the start: the files come back, the
    layer is still encrypted (the marker is in no file of the data dir), and revocation
    still refuses the next resume."""
    d = coved_factory()
    tid, c = new_tenant(d.client)
    s = c.create(template="busybox", storage_encrypted=True)
    mark = "COVE-KEPT-" + secrets.token_hex(12)
    write_marker(c, s["id"], mark)
    sf = c.post(f"/v1/sandboxes/{s['id']}/snapshots", {"kind": "files"}, expect=(200, 201))
    c.exec(s["id"], "rm /root/marker.txt && echo later > /root/later.txt && sync")
    c.post(f"/v1/sandboxes/{s['id']}/pause", {})
    r = c.post(f"/v1/sandboxes/{s['id']}/resume", {"snapshot_id": sf["id"]})
    assert r["state"] == "running" and r["storage_encrypted"] is True
    assert [e for e in d.log_lines() if e.get("event") == "snapshot.restore"
            and sf["id"] in e["msg"] and e["msg"].endswith("kept image, mounted")], \
        "the resume did not run on the kept image mounted with its key"
    assert c.exec(s["id"], "cat /root/marker.txt; ls /root")["stdout"] == mark + "\n" + \
        "marker.txt\n"
    c.exec(s["id"], "cp /root/marker.txt /root/again.txt && sync")
    assert grep_data(d.data, mark) == [], "plaintext of an encrypted layer found at rest"
    c.post(f"/v1/sandboxes/{s['id']}/pause", {})
    st = c.post("/v1/keys/revoke", {"tenant": tid})
    assert st["state"] == "revoked"
    c.expect_error("POST", f"/v1/sandboxes/{s['id']}/resume", 403, "key_revoked",
                   body={"snapshot_id": sf["id"]})
    assert grep_data(d.data, mark) == []


def test_encrypt_layers_default(coved_factory):
    d = coved_factory(extra_args=["--encrypt-layers"])
    s = d.client.create(template="busybox")
    assert s["storage_encrypted"] is True
    mark = "COVE-DEF-" + secrets.token_hex(12)
    write_marker(d.client, s["id"], mark)
    assert grep_data(d.data, mark) == []
    p = d.client.create(template="busybox", storage_encrypted=False)
    assert p["storage_encrypted"] is False


def metric(c, name):
    body = c.request("GET", "/metrics", auth=False).body.decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    raise AssertionError(f"metric {name} missing")


def await_metric(c, name, pred, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        v = metric(c, name)
        if pred(v):
            return v
        assert time.monotonic() < deadline, f"{name} stayed at {v}"
        time.sleep(0.1)


def test_byok_tenant_default_encrypted(coved_factory, tmp_path):
    """A tenant holding its own key (BYOK) gets storage_encrypted: true without asking and
    cannot ask for false; its sandbox's marker is in no file of the data dir while a
    node-default tenant's default sandbox's marker is found by the same search. Encrypted
    creates come from the tenant's own warm pool (made on its first create), whose layers
    are encrypted too; snapshots restore (resume, fork, rewind) and stay encrypted; a sandbox
    made plain before the key was added is encrypted from its next resume; revoking the key
    drops the tenant's warm pool."""
    d = coved_factory()
    admin = d.client
    tid, c = new_tenant(admin)
    tid2, c2 = new_tenant(admin)
    old = c.create(template="busybox")  # before the tenant brings its key: plain
    assert old["storage_encrypted"] is False
    kf = tmp_path / "byok.kek"
    kf.write_bytes(os.urandom(32))
    os.chmod(kf, 0o600)
    admin.post("/v1/keys", {"tenant": tid, "provider": "local", "key_file": str(kf)})
    e = c.expect_error("POST", "/v1/sandboxes", 400, "bad_request",
                       body={"template": "busybox", "storage_encrypted": False})
    assert "own key" in e["message"]
    first = c.create(template="busybox")
    assert first["storage_encrypted"] is True
    # its warm pool fills (the node's plain pool holds 4): the next create takes from it
    await_metric(admin, "cove_pool_ready", lambda v: v >= 6)
    taken = metric(admin, "cove_pool_taken_total")
    s = c.create(template="busybox")
    assert s["storage_encrypted"] is True and c.sandbox(s["id"])["storage_encrypted"] is True
    assert metric(admin, "cove_pool_taken_total") == taken + 1, "not a warm create"
    mark = "COVE-BYOK-" + secrets.token_hex(12)
    write_marker(c, s["id"], mark)
    # a node-default tenant keeps today's default: plain, and the search finds its marker
    p = c2.create(template="busybox")
    assert p["storage_encrypted"] is False
    pmark = "COVE-NODEKEY-" + secrets.token_hex(12)
    write_marker(c2, p["id"], pmark)
    assert grep_data(d.data, pmark), "marker of a plain sandbox not found: the grep is blind"
    assert grep_data(d.data, mark) == [], "plaintext of a BYOK tenant's sandbox at rest"
    # snapshots restore, encrypted
    snap = c.post(f"/v1/sandboxes/{s['id']}/snapshots", {}, expect=(200, 201))
    snap_id = (snap.get("snapshot") or snap)["id"]
    c.exec(s["id"], "echo later > /root/later.txt && sync")
    c.post(f"/v1/sandboxes/{s['id']}/pause", {})
    r = c.post(f"/v1/sandboxes/{s['id']}/resume", {})
    assert r["state"] == "running" and r["storage_encrypted"] is True
    assert c.exec(s["id"], "cat /root/marker.txt /root/later.txt")["stdout"] == mark + "\nlater\n"
    f = c.post(f"/v1/sandboxes/{s['id']}/fork", {"snapshot_id": snap_id})["sandboxes"][0]
    assert f["storage_encrypted"] is True
    assert c.exec(f["id"], "cat /root/marker.txt")["stdout"] == mark + "\n"
    rw = c.post(f"/v1/sandboxes/{s['id']}/rewind", {"snapshot_id": snap_id})
    assert rw["sandbox"]["storage_encrypted"] is True
    assert "later.txt" not in c.exec(s["id"], "ls /root")["stdout"]
    # the sandbox made plain before the key: encrypted from its next resume on
    c.post(f"/v1/sandboxes/{old['id']}/pause", {})
    r = c.post(f"/v1/sandboxes/{old['id']}/resume", {})
    assert r["storage_encrypted"] is True and c.sandbox(old["id"])["storage_encrypted"] is True
    omark = "COVE-UPGRADED-" + secrets.token_hex(12)
    write_marker(c, old["id"], omark)
    assert grep_data(d.data, mark) == [] and grep_data(d.data, omark) == []
    # revoke: the tenant's sandboxes stop and its warm pool goes (only the plain one is left)
    await_metric(admin, "cove_pool_ready", lambda v: v >= 6)
    st = c.post("/v1/keys/revoke", {"tenant": tid})
    assert st["sandboxes_stopped"] >= 4
    assert metric(admin, "cove_pool_ready") <= 4
    assert grep_data(d.data, mark) == [] and grep_data(d.data, omark) == []
    c2.remove(p["id"])
