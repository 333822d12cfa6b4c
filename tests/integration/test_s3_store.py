"""Snapshots in S3-compatible storage, against a real Ceph radosgw started by this module
(tests/lib/s3rgw.py; one start for the whole module): the chunk-store contract on S3,
coved with --store s3://… taking, listing, restoring, forking, rewinding and collecting
snapshots, the S3 server going away during a snapshot and coming back, and the local chunk
cache serving a resume without downloading again."""
import hashlib
import os
import subprocess
import threading
import time
import uuid

import chunkstore
import pytest
from cove import poll, sh, snapshots
from s3rgw import S3Rgw

HOOKS_ENV = {"COVE_TEST_HOOKS": "1"}
SKIP = S3Rgw.available()


@pytest.fixture(scope="module")
def rgw():
    if SKIP:
        pytest.skip(SKIP)
    with S3Rgw() as r:
        yield r


def snap(c, sid, label=None, expect=201):
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"label": label} if label else {},
                  timeout=300)
    if r.status == 503 and "cannot snapshot" in r.body.decode(errors="replace"):
        pytest.skip("the runtime cannot snapshot here: " + r.error.get("message", ""))
    assert r.status == expect, r.body[:400]
    return r.json()


def s3_coved(coved_factory, rgw, tmp_path, bucket, prefix="node1", extra=(), hooks="gc_grace_s 1\n"):
    hp = str(tmp_path / f"hooks-{uuid.uuid4().hex[:6]}")
    with open(hp, "w") as f:
        f.write(hooks)
    args = ["--store", f"s3://{bucket}/{prefix}", "--s3-endpoint", rgw.endpoint,
            "--test-hooks", hp, *extra]
    return coved_factory(extra_args=args, env={**rgw.env, **HOOKS_ENV})


def chunk_keys(rgw, bucket, prefix="node1"):
    return {k for k in rgw.keys(bucket, f"{prefix}/default/chunks/")}


def manifest_key(prefix, snap_id):
    return f"{prefix}/default/manifests/{snap_id}"


def test_chunkstore_contract_on_radosgw(rgw, build_dir):
    """put/get/has/touch/del/list/batches on S3, GC's delete refused when a touch races it,
    and eight writers of one chunk: tests/unit/test_chunkstore.c, with a server this time."""
    exe = os.path.join(build_dir, "tests", "unit", "test_chunkstore")
    env = dict(os.environ, COVE_TEST_S3_ENDPOINT=rgw.endpoint, **rgw.env)
    r = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for t in ("s3_objects", "s3_gc_race", "s3_put_race"):
        assert f"[       OK ] {t}" in out, out[-3000:]  # ran, not skipped


@pytest.mark.root
def test_snapshots_live_in_s3(coved_factory, rgw, tmp_path):
    """With --store s3:// the chunks and manifests are S3 objects (nothing in the local
    store), and snapshot, pause/resume, fork, rewind and GC work as on the local store: a
    deleted snapshot's own chunks go after the grace period, shared ones stay. A snapshot
    is listed only once its manifest is in the bucket. The secret key never reaches the
    log."""
    bucket = f"cove-it-{uuid.uuid4().hex[:8]}"
    d = s3_coved(coved_factory, rgw, tmp_path, bucket)
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    forks = []
    try:
        base = os.urandom(200000)
        c.put_file(sid, "/home/base.bin", base)
        sh(c, sid, "echo one > /home/state")
        s1 = snap(c, sid, "one")
        assert rgw.exists(bucket, manifest_key("node1", s1["id"]))
        keys1 = chunk_keys(rgw, bucket)
        assert len(keys1) >= 3
        local = os.path.join(d.data, "store")
        assert not any(files for _, _, files in os.walk(local)), "objects in the local store"

        # listed only once landed: poll the listing while a snapshot runs
        seen_early = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                for s in snapshots(c, sid):
                    if not rgw.exists(bucket, manifest_key("node1", s["id"])):
                        seen_early.append(s["id"])
                time.sleep(0.02)
        t = threading.Thread(target=watch)
        t.start()
        try:
            unique = os.urandom(600000)
            c.put_file(sid, "/home/unique.bin", unique)
            sh(c, sid, "echo two > /home/state")
            s2 = snap(c, sid, "two")
        finally:
            stop.set()
            t.join()
        assert not seen_early, f"listed before its manifest landed: {seen_early}"
        keys2 = chunk_keys(rgw, bucket)
        own2 = keys2 - keys1
        assert len(own2) >= 5, "the unique file's chunks"

        # pause / resume, fork and rewind through the S3 store
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["sandbox"]["state"] == "paused"
        assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
        assert sh(c, sid, "cat /home/state") == "two\n"
        assert hashlib.sha256(c.get_file(sid, "/home/unique.bin").body).digest() == \
            hashlib.sha256(unique).digest()
        f = c.ok("POST", f"/v1/sandboxes/{sid}/fork", {"snapshot_id": s1["id"], "count": 1},
                 expect=(201,))
        forks = [x["id"] for x in f["sandboxes"]]
        assert sh(c, forks[0], "cat /home/state") == "one\n"
        sh(c, sid, "rm /home/unique.bin && echo three > /home/state")
        s3 = snap(c, sid, "three")

        # GC: s2's own chunks (the unique file, its memory) go once it is deleted; s1's stay
        c.ok("DELETE", f"/v1/snapshots/{s2['id']}")
        assert not rgw.exists(bucket, manifest_key("node1", s2["id"]))

        def swept():
            now = chunk_keys(rgw, bucket)
            return len(own2 - now) >= 5 and now
        after = poll(swept, timeout=120, what="GC of the deleted snapshot's chunks", every=0.5)
        assert keys1 <= after, "GC removed chunks of a kept snapshot"
        r = c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": s1["id"]})
        assert sh(c, sid, "cat /home/state") == "one\n"
        assert c.get_file(sid, "/home/base.bin").body == base
        r = c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": s3["id"]})
        assert sh(c, sid, "cat /home/state") == "three\n"
    finally:
        for x in forks:
            c.remove(x, purge=True)
        c.remove(sid, purge=True)
    with open(d.log_path, errors="replace") as lf:
        assert rgw.env["AWS_SECRET_ACCESS_KEY"] not in lf.read()


@pytest.mark.root
def test_s3_down_during_snapshot(coved_factory, rgw, tmp_path):
    """radosgw stopped during a snapshot, then for a whole snapshot and a pause: each fails
    within the request deadline and is not listed, the sandbox keeps running, and once
    radosgw is back the earlier snapshots restore and the next snapshot works."""
    bucket = f"cove-down-{uuid.uuid4().hex[:8]}"
    d = s3_coved(coved_factory, rgw, tmp_path, bucket, extra=["--s3-timeout", "2"])
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    paused = False
    try:
        sh(c, sid, "echo first > /home/state")
        s1 = snap(c, sid, "first")
        listed = {s["id"] for s in snapshots(c, sid)}
        # stopped during: a snapshot with a lot to upload, radosgw goes once uploads began
        c.put_file(sid, "/home/big.bin", os.urandom(24 << 20))
        before = len(chunk_keys(rgw, bucket))
        res = {}
        t = threading.Thread(target=lambda: res.update(
            r=c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {}, timeout=300)))
        t.start()
        poll(lambda: len(chunk_keys(rgw, bucket)) > before or not t.is_alive(), timeout=120,
             what="the snapshot's first uploads", every=0.05)
        rgw.pause()
        paused = True
        t.join(300)
        r = res["r"]
        now = {s["id"] for s in snapshots(c, sid)}
        if r.status == 201:  # it finished before radosgw went: then it must be whole
            print("the snapshot completed before radosgw stopped")
            listed.add(r.json()["id"])
        else:
            assert r.status >= 500, r.body[:300]
            assert "s3" in r.body.decode(errors="replace").lower(), r.body[:300]
        assert now == listed, "a failed snapshot is listed"
        # down for the whole operation
        t0 = time.monotonic()
        r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {}, timeout=300)
        print(f"snapshot with radosgw down failed in {time.monotonic() - t0:.1f} s: "
              f"{r.status} {r.body[:200]!r}")
        assert r.status >= 500
        r = c.request("POST", f"/v1/sandboxes/{sid}/pause", timeout=300)
        assert r.status >= 500
        assert c.sandbox(sid)["state"] == "running"
        assert {s["id"] for s in snapshots(c, sid)} == listed
        rgw.resume()
        paused = False
        c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": s1["id"]})
        assert sh(c, sid, "cat /home/state") == "first\n"
        sh(c, sid, "echo after > /home/state")
        s_after = snap(c, sid, "after")
        assert rgw.exists(bucket, manifest_key("node1", s_after["id"]))
    finally:
        if paused:
            rgw.resume()
        c.remove(sid, purge=True)


@pytest.mark.root
def test_resume_uses_the_local_chunk_cache(coved_factory, rgw, tmp_path):
    """A paused sandbox resumed on the node that took its snapshot reads its chunks from the
    node's cache (<data dir>/chunk-cache): with every chunk object removed from the bucket
    after the pause, the resume still restores the exact bytes (manifests are never cached,
    so they still come from S3)."""
    bucket = f"cove-cache-{uuid.uuid4().hex[:8]}"
    d = s3_coved(coved_factory, rgw, tmp_path, bucket)
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        data = os.urandom(400000)
        c.put_file(sid, "/home/data.bin", data)
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r["sandbox"]["state"] == "paused"
        cache = os.path.join(d.data, "chunk-cache", "default", "chunks")
        cached = {os.path.relpath(os.path.join(dp, f), cache)
                  for dp, _, fs in os.walk(cache) for f in fs}
        remote = chunk_keys(rgw, bucket)
        assert cached == {k[len("node1/default/chunks/"):] for k in remote}
        for k in remote:
            st, _ = rgw.curl("DELETE", f"/{bucket}/{k}")
            assert st == 204
        assert not chunk_keys(rgw, bucket)
        assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
        assert c.get_file(sid, "/home/data.bin").body == data
    finally:
        c.remove(sid, purge=True)


@pytest.mark.root
def test_gc_still_sweeps_the_local_store(coved_factory, tmp_path):
    """GC finds its tenants through the catalog now (an S3 store has no directory to
    list); on the local store it must still sweep a deleted snapshot's own chunks and keep
    the shared ones."""
    hp = str(tmp_path / "hooks")
    with open(hp, "w") as f:
        f.write("gc_grace_s 1\n")
    d = coved_factory(extra_args=["--test-hooks", hp], env=HOOKS_ENV)
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    store = os.path.join(d.data, "store")

    def files():
        return set(chunkstore.objects(store))
    try:
        snap(c, sid, "one")
        keys1 = files()
        c.put_file(sid, "/home/unique.bin", os.urandom(600000))
        s2 = snap(c, sid, "two")
        own2 = files() - keys1
        assert len(own2) >= 5
        sh(c, sid, "rm /home/unique.bin")
        snap(c, sid, "three")
        c.ok("DELETE", f"/v1/snapshots/{s2['id']}")
        after = poll(lambda: len(own2 - files()) >= 5 and files(), timeout=120,
                     what="GC of the deleted snapshot's chunks", every=0.5)
        assert keys1 <= after
    finally:
        c.remove(sid, purge=True)
