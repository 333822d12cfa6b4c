"""The time machine through the API (docs/api.md "Snapshots"): snapshot, rewind and undo,
fork, pause/resume, rolling snapshots, dedup, no plaintext in the store, a tampered chunk,
kill -9 during a snapshot, on_timeout pause.

Every test needs a runtime that can snapshot (runtime_ops.layer_snapshot). Until the ns
runtime has it, coved answers 503 "cannot snapshot" and these tests skip, saying so."""
import glob
import hashlib
import os
import subprocess
import threading
import time

import chunkstore
import pytest
from cove import poll, sh, snapshots
from hostutil import loops_under

pytestmark = pytest.mark.root


def snap(c, sid, label=None, expect=201, kind=None):
    body = {"label": label} if label else {}
    if kind:
        body["kind"] = kind
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", body)
    if r.status == 503 and "cannot snapshot" in r.body.decode(errors="replace"):
        pytest.skip("the runtime cannot snapshot yet (runtime_ops.layer_snapshot missing): "
                    + r.error.get("message", ""))
    assert r.status == expect, r.body[:400]
    return r.json()


def new_sandbox(c, **kw):
    kw.setdefault("snapshot_interval_s", 0)  # no rolling snapshots unless a test wants them
    return c.create(template="busybox", **kw)["id"]


def test_snapshot_object_and_timeline(client, sandbox):
    sid = sandbox["id"]
    # full (files + memory + processes) where the node's CRIU self-check passed, else files
    kind = client.snapshot_kind()
    s1 = snap(client, sid, "first")
    assert s1["id"].startswith("snap_") and s1["sandbox_id"] == sid
    assert s1["kind"] == kind
    assert s1["label"] == "first" and s1["rolling"] is False
    assert s1["size_bytes"] >= 0 and s1["new_bytes"] >= 0 and s1["pause_ms"] >= 0
    s2 = snap(client, sid)
    assert s2["parent_id"] == s1["id"]  # the DAG: each snapshot points at the previous one
    assert [s["id"] for s in snapshots(client, sid)][:2] == [s2["id"], s1["id"]]  # newest first
    assert client.get(f"/v1/snapshots/{s1['id']}") == s1
    assert client.sandbox(sid)["last_snapshot_id"] == s2["id"]
    client.expect_error("GET", "/v1/snapshots/snap_aaaaaaaaaaaaaaaaaaaa", 404, "not_found")
    client.expect_error("POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/snapshots", 404,
                        "not_found", body={})
    client.expect_error("POST", f"/v1/sandboxes/{sid}/snapshots", 400, "bad_request",
                        body={"label": "x" * 200})
    # kind: "files" wherever the sandbox has a layer image, even where full is the default
    s3 = snap(client, sid, kind="files")
    assert s3["kind"] == "files" and s3["parent_id"] == s2["id"]
    for bad in ("memory", "", 3, ["files"]):
        e = client.expect_error("POST", f"/v1/sandboxes/{sid}/snapshots", 400, "bad_request",
                                body={"kind": bad})
        assert "kind" in e["message"]
    client.ok("DELETE", f"/v1/snapshots/{s1['id']}")
    client.expect_error("GET", f"/v1/snapshots/{s1['id']}", 404, "not_found")


def test_round_trip_rewind_and_undo(client):
    c = client
    sid = new_sandbox(c)
    try:
        blob = os.urandom(300000)
        c.put_file(sid, "/home/blob.bin", blob)
        sh(c, sid, "mkdir -p /home/d/e && echo one > /home/d/e/f && ln -s e/f /home/d/l")
        s1 = snap(c, sid, "good")
        sh(c, sid, "rm -rf /home/d && echo changed > /home/new && "
                   "dd if=/dev/zero of=/home/blob.bin bs=1k count=3 conv=notrunc 2>/dev/null")
        assert c.get_file(sid, "/home/blob.bin").body != blob
        r = c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": s1["id"]})
        undo = r["undo_snapshot_id"]
        assert undo and undo != s1["id"]
        assert r["sandbox"]["id"] == sid and r["sandbox"]["state"] == "running"
        assert c.get_file(sid, "/home/blob.bin").body == blob  # byte for byte
        assert sh(c, sid, "cat /home/d/e/f; readlink /home/d/l") == "one\ne/f\n"
        assert sh(c, sid, "test -e /home/new && echo yes || echo no") == "no\n"
        # undo the rewind: back to the changed state
        r2 = c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": undo})
        assert r2["sandbox"]["state"] == "running"
        assert sh(c, sid, "cat /home/new; test -e /home/d && echo yes || echo no") == \
            "changed\nno\n"
        assert c.get_file(sid, "/home/blob.bin").body[:3072] == b"\0" * 3072
        c.expect_error("POST", f"/v1/sandboxes/{sid}/rewind", 400, "bad_request", body={})
        c.expect_error("POST", f"/v1/sandboxes/{sid}/rewind", 404, "not_found",
                       body={"snapshot_id": "snap_aaaaaaaaaaaaaaaaaaaa"})
    finally:
        c.remove(sid, purge=True)


def test_fork_divergence(client):
    c = client
    sid = new_sandbox(c)
    forks = []
    try:
        sh(c, sid, "echo base > /home/f")
        s = snap(c, sid)
        r = c.ok("POST", f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s["id"], "count": 2},
                 expect=(201,))
        forks = [x["id"] for x in r["sandboxes"]]
        assert len(set(forks)) == 2 and sid not in forks
        for f in forks:
            assert c.sandbox(f)["state"] == "running"
            assert c.sandbox(f)["last_snapshot_id"] == s["id"]
        sh(c, forks[0], "echo A > /home/f")
        sh(c, forks[1], "echo B > /home/f")
        sh(c, sid, "echo S > /home/f")
        assert sh(c, forks[0], "cat /home/f") == "A\n"
        assert sh(c, forks[1], "cat /home/f") == "B\n"
        assert sh(c, sid, "cat /home/f") == "S\n"
        # new identity: the hostname is the fork's own id
        assert sh(c, forks[0], "hostname").strip() == forks[0]
        # a fork's first snapshot has the forked snapshot as parent
        assert snap(c, forks[0])["parent_id"] == s["id"]
        c.expect_error("POST", f"/v1/sandboxes/{sid}/fork", 400, "bad_request",
                       body={"count": 0})
    finally:
        for f in forks:
            c.remove(f, purge=True)
        c.remove(sid, purge=True)


def test_pause_resume_keeps_files(client):
    c = client
    sid = new_sandbox(c)
    try:
        sh(c, sid, "echo kept > /home/k; mkdir /home/dir; chmod 700 /home/dir")
        snap(c, sid)  # skips when the runtime cannot snapshot
        kind = c.snapshot_kind()
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["sandbox"]["state"] == "paused"
        assert r["snapshot"]["kind"] == kind and r["snapshot"]["label"] == "pause"
        assert r["sandbox"]["last_snapshot_id"] == r["snapshot"]["id"]
        c.expect_error("POST", f"/v1/sandboxes/{sid}/exec", 409, "conflict",
                       body={"shell": "true", "wait": True})
        c.expect_error("POST", f"/v1/sandboxes/{sid}/pause", 409, "conflict")
        t0 = time.monotonic()
        sb = c.post(f"/v1/sandboxes/{sid}/resume")
        resume_ms = (time.monotonic() - t0) * 1000
        assert sb["id"] == sid and sb["state"] == "running"
        assert sh(c, sid, "cat /home/k; stat -c %a /home/dir") == "kept\n700\n"
        c.expect_error("POST", f"/v1/sandboxes/{sid}/resume", 409, "conflict")
        print(f"resume latency {resume_ms:.1f} ms")
    finally:
        c.remove(sid, purge=True)


def test_rolling_snapshots(client):
    c = client
    sid = new_sandbox(c, snapshot_interval_s=2)
    try:
        snap(c, sid)  # skip early when unavailable
        sh(c, sid, "echo x > /home/x")
        rolling = poll(lambda: [s for s in snapshots(c, sid) if s["rolling"]][:2]
                       if len([s for s in snapshots(c, sid) if s["rolling"]]) >= 2 else None,
                       timeout=30, what="two rolling snapshots")
        # rolling snapshots are files even where full ones work (a dump stops the world)
        assert all(s["kind"] == "files" and s["label"] is None for s in rolling)
        assert c.sandbox(sid)["snapshot_interval_s"] == 2
    finally:
        c.remove(sid, purge=True)


REC = 32  # bytes per record of LOG_WRITER
# Appends records "NNNNNNNN CCCCCCCCCC ...........\n" (a number, a checksum of it) to /home/log,
# each with one write and fsync'd before the next.
LOG_WRITER = ("i=0; while :; do printf '%08d %010d ...........\\n' $i "
              "$((i*2654435761%4294967291)) | dd of=/home/log oflag=append conv=notrunc,fsync "
              "bs=32 iflag=fullblock count=1 2>/dev/null || exit; i=$((i+1)); done")


def log_records(data):
    """Number of records in data when it is a valid log: every record complete, in order, its
    checksum right, nothing torn after the last one."""
    assert len(data) % REC == 0, f"a torn record at the end ({len(data)} bytes)"
    for i in range(len(data) // REC):
        want = b"%08d %010d ...........\n" % (i, i * 2654435761 % 4294967291)
        got = data[i * REC:(i + 1) * REC]
        assert got == want, f"record {i}: {got!r}, want {want!r}"
    return len(data) // REC


def test_rolling_snapshots_under_writes_restore_whole_records(client):
    # A files snapshot clones the layer's image without freezing it (what a power cut would
    # leave, the journal replayed): while the sandbox appends fsync'd records and churns
    # files, rolling snapshots every second; forks of several of them each see a valid log
    # (every record whole and in order, none torn), growing from snapshot to snapshot.
    c = client
    sid = new_sandbox(c, snapshot_interval_s=1)
    forks = []
    try:
        snap(c, sid, kind="files")  # skip early when unavailable
        sh(c, sid, f"{{ {LOG_WRITER}; }} </dev/null >/dev/null 2>&1 &")
        sh(c, sid, "mkdir -p /home/t; { i=0; while :; do echo $i > /home/t/a$i; "
                   "rm -f /home/t/a$((i-50)); i=$((i+1)); done; } </dev/null >/dev/null 2>&1 &")
        poll(lambda: int(sh(c, sid, "stat -c %s /home/log 2>/dev/null || echo 0")) >= 10 * REC,
             what="the writer's first records")
        older = {s["id"] for s in snapshots(c, sid)}

        def new_rolling():
            xs = [s for s in snapshots(c, sid) if s["rolling"] and s["id"] not in older]
            return xs if len(xs) >= 4 else None
        rolling = poll(new_rolling, timeout=60, what="four rolling snapshots under writes")
        counts = []
        for s in sorted(rolling[:4], key=lambda s: s["created_at"]):
            assert s["kind"] == "files"
            f = c.ok("POST", f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s["id"], "count": 1},
                     expect=(201,))["sandboxes"][0]["id"]
            forks.append(f)
            counts.append(log_records(c.get_file(f, "/home/log").body))
            c.remove(f, purge=True)
        print(f"records in the forks of 4 rolling snapshots: {counts}; pause_ms "
              f"{[s['pause_ms'] for s in rolling[:4]]}")
        assert counts == sorted(counts) and counts[0] >= 10, counts
        # the writer ran on through the snapshots
        assert log_records(c.get_file(sid, "/home/log").body) >= counts[-1]
    finally:
        for f in forks:
            c.remove(f, purge=True)
        c.remove(sid, purge=True)


def test_dedup_idle_sandbox(client):
    c = client
    sid = new_sandbox(c)
    try:
        c.put_file(sid, "/home/big.bin", os.urandom(4 << 20))
        s1 = snap(c, sid)
        s2 = snap(c, sid)
        assert s1["size_bytes"] >= 4 << 20
        assert s2["size_bytes"] >= 4 << 20
        assert s2["new_bytes"] < 0.05 * s1["size_bytes"], (s1, s2)
    finally:
        c.remove(sid, purge=True)


def test_store_holds_no_plaintext(client, coved):
    c = client
    sid = new_sandbox(c)
    try:
        marker = b"COVE-PLAINTEXT-MARKER-" + os.urandom(8).hex().encode()
        c.put_file(sid, "/home/secret.txt", marker * 2000)
        snap(c, sid)
        # os.walk, not glob: packs live in a dot directory glob's ** would skip
        files = [os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(coved.data, "store"))
                 for f in fs]
        assert any("/.packs/" in p for p in files), "no pack in the store"
        assert files, "the store is empty"
        for p in files:
            with open(p, "rb") as f:
                assert marker not in f.read(), f"{p} holds the marker in plaintext"
    finally:
        c.remove(sid, purge=True)


def chunk_objects(data_dir):
    """(file, offset, length) of every chunk object, loose or in a pack."""
    return set(chunkstore.objects(os.path.join(data_dir, "store")).values())


def test_tampered_chunk_resume_fails_and_stays_paused(coved_factory):
    # a resume from the store: no hot pause or kept layer image to resume from instead
    d = coved_factory(extra_args=["--pause-hot-s", "0"])
    c = d.client
    sid = new_sandbox(c)
    c.put_file(sid, "/home/data.bin", os.urandom(1 << 20))
    snap(c, sid)
    before = chunk_objects(d.data)
    p = c.post(f"/v1/sandboxes/{sid}/pause")
    sid_snap = p["snapshot"]["id"]
    # flip a byte in every chunk object: whichever the restore reads first fails
    for path, off, ln in chunk_objects(d.data):
        assert ln > 30
        with open(path, "r+b") as f:
            f.seek(off + 30)
            b = f.read(1)
            f.seek(off + 30)
            f.write(bytes([b[0] ^ 0xff]))
    assert before
    r = c.request("POST", f"/v1/sandboxes/{sid}/resume", {})
    assert r.status == 503 and r.error["code"] == "unavailable", r.body[:300]
    assert sid_snap in r.error["message"], r.error
    sb = c.sandbox(sid)
    assert sb["state"] == "paused" and sb["last_snapshot_id"] == sid_snap


def test_resume_start_failure_leaves_nothing(coved_factory, templates_dir, tmp_path):
    """A resume hands the restored layer to the start still mounted (one mount, not two); a
    start that fails after the restore (here: the sandbox's template is gone) releases it: no
    mount, loop device or image is left, the sandbox stays paused, and it resumes later."""
    tdir = tmp_path / "templates"
    tdir.mkdir()
    subprocess.run(["cp", "-a", os.path.join(templates_dir, "busybox"), str(tdir)], check=True)
    # a resume from the store (no hot pause to thaw, no kept layer image)
    d = coved_factory(extra_args=["--templates-dir", str(tdir), "--pause-hot-s", "0"])
    c = d.client
    sid = new_sandbox(c)
    c.put_file(sid, "/home/keep.txt", b"kept\n")
    snap_id = c.post(f"/v1/sandboxes/{sid}/pause")["snapshot"]["id"]
    os.rename(tdir / "busybox", tdir / "busybox.off")
    r = c.request("POST", f"/v1/sandboxes/{sid}/resume", {})
    assert r.status == 503 and r.error["code"] == "unavailable", r.body[:300]
    assert "template busybox" in r.error["message"], r.error
    sb = c.sandbox(sid)
    assert sb["state"] == "paused" and sb["last_snapshot_id"] == snap_id, sb
    lfs = os.path.join(d.data, "ns", "lfs")
    snapdir = os.path.join(lfs, "snap")
    assert not glob.glob(os.path.join(snapdir, "tm-restore-*")), os.listdir(snapdir)
    assert not os.path.exists(os.path.join(lfs, "layers", sid + ".img"))
    assert not os.path.ismount(os.path.join(d.data, "ns", "layers", sid))
    # the restore's detached mount is gone, so its autoclear loop device lets go
    poll(lambda: not loops_under(snapdir), timeout=10,
         what="the restore's loop device to go")
    os.rename(tdir / "busybox.off", tdir / "busybox")
    sb = c.post(f"/v1/sandboxes/{sid}/resume")
    assert sb["state"] == "running", sb
    assert sh(c, sid, "cat /home/keep.txt") == "kept\n"
    assert loops_under(os.path.join(lfs, "layers", sid + ".img"))


def test_kill9_during_snapshot_lists_only_complete(coved_factory):
    d = coved_factory()
    c = d.client
    sid = new_sandbox(c)
    c.put_file(sid, "/home/a.txt", b"first state\n")
    s1 = snap(c, sid, "complete")
    # enough new data that the second capture takes a while
    sh(c, sid, "dd if=/dev/urandom of=/home/big bs=1M count=150 2>/dev/null; "
               "echo second > /home/a.txt")
    res = {}

    def take():
        try:
            res["r"] = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {}, timeout=120)
        except Exception as e:  # the connection dies with coved
            res["e"] = e

    t = threading.Thread(target=take)
    t.start()
    time.sleep(0.3)
    d.kill9()
    t.join(30)
    c = d.start()
    listed = snapshots(c, sid)
    assert s1["id"] in [s["id"] for s in listed]
    sb = c.sandbox(sid)
    assert sb["state"] == "paused", sb  # running with a snapshot → paused after the crash
    # every listed snapshot restores: fork each and read the file back
    for s in listed:
        f = c.ok("POST", f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s["id"]},
                 expect=(201,))["sandboxes"][0]["id"]
        assert sh(c, f, "cat /home/a.txt") in ("first state\n", "second\n")
        c.remove(f, purge=True)
    # the store holds no temp objects of the interrupted writer
    assert not [p for p in chunkstore.private_files(os.path.join(d.data, "store"))
                if os.path.basename(p).startswith(".tmp")]
    sb = c.post(f"/v1/sandboxes/{sid}/resume")
    assert sb["state"] == "running"


def test_on_timeout_pause(client):
    c = client
    sid = new_sandbox(c, timeout_s=3, on_timeout="pause")
    try:
        sh(c, sid, "echo still-here > /home/t")
        snap(c, sid)
        sb = c.wait_state(sid, {"paused", "stopped"}, timeout=30)
        assert sb["state"] == "paused", sb
        c.post(f"/v1/sandboxes/{sid}/resume")
        assert sh(c, sid, "cat /home/t") == "still-here\n"
    finally:
        c.remove(sid, purge=True)


def test_delete_keeps_snapshots_unless_purge(client):
    c = client
    sid = new_sandbox(c)
    s = snap(c, sid)
    c.remove(sid)
    assert [x["id"] for x in snapshots(c, sid)] == [s["id"]]
    assert c.get(f"/v1/snapshots/{s['id']}")["sandbox_id"] == sid
    sid2 = new_sandbox(c)
    s2 = snap(c, sid2)
    c.remove(sid2, purge=True)
    c.expect_error("GET", f"/v1/snapshots/{s2['id']}", 404, "not_found")
    c.ok("DELETE", f"/v1/snapshots/{s['id']}")


def test_create_validates_snapshot_fields(client):
    c = client
    for body in ({"snapshot_interval_s": -1}, {"retention": [{"within_s": 0}]},
                 {"retention": "all"}, {"on_timeout": "sleep"}):
        c.expect_error("POST", "/v1/sandboxes", 400, "bad_request",
                       body=dict(template="busybox", **body))
    sb = c.create(template="busybox", snapshot_interval_s=0,
                  retention=[{"within_s": 600, "every_s": 0}])
    try:
        assert sb["snapshot_interval_s"] == 0
        assert sb["retention"] == [{"within_s": 600, "every_s": 0}]
    finally:
        c.remove(sb["id"])


def other_tenant_key(data_dir, tenant="ten_other"):
    """A key of a second tenant, written straight into the catalog (no tenants API yet)."""
    import sqlite3
    salt, secret = os.urandom(32), os.urandom(32)
    kid = "key_" + "".join("abcdefghijklmnopqrstuvwxyz234567"[b & 31] for b in os.urandom(20))
    db = sqlite3.connect(os.path.join(data_dir, "catalog.db"), timeout=10)
    with db:
        db.execute("INSERT OR IGNORE INTO tenants(id, name, created_at) VALUES (?, ?, 0)",
                   (tenant, tenant))
        db.execute("INSERT INTO api_keys(id, tenant, salt_hex, hash_hex, admin, revoked,"
                   " created_at) VALUES (?, ?, ?, ?, 0, 0, 0)",
                   (kid, tenant, salt.hex(), hashlib.sha256(salt + secret).hexdigest()))
    db.close()
    return f"cove_{kid}_{secret.hex()}"


def test_tenant_scoping(coved_factory):
    d = coved_factory()
    c = d.client
    sid = new_sandbox(c)
    s = snap(c, sid)
    o = c.with_key(other_tenant_key(d.data))
    for method, path, body in [
            ("GET", f"/v1/snapshots/{s['id']}", None),
            ("DELETE", f"/v1/snapshots/{s['id']}", None),
            ("GET", f"/v1/sandboxes/{sid}/snapshots", None),
            ("POST", f"/v1/sandboxes/{sid}/snapshots", {}),
            ("POST", f"/v1/sandboxes/{sid}/pause", {}),
            ("POST", f"/v1/sandboxes/{sid}/fork", {}),
            ("POST", f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": s["id"]})]:
        o.expect_error(method, path, 404, "not_found", body=body)
    # the other tenant cannot rewind or fork its own sandbox to this tenant's snapshot
    mine = o.create(template="busybox", snapshot_interval_s=0)["id"]
    o.expect_error("POST", f"/v1/sandboxes/{mine}/rewind", 404, "not_found",
                   body={"snapshot_id": s["id"]})
    o.expect_error("POST", f"/v1/sandboxes/{mine}/fork", 404, "not_found",
                   body={"snapshot_id": s["id"]})
    assert c.get(f"/v1/snapshots/{s['id']}")["id"] == s["id"]
