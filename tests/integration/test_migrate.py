"""coved migrate (docs/cluster.md "From one machine to many"): a real single-node data dir
(SQLite catalog, local store) with two tenants, sandboxes with files, files and full
snapshots and audit events is copied into a PostgreSQL catalog and an S3 store (a real
radosgw); a migration killed with SIGKILL midway is completed by a re-run, a third run
changes nothing, the data dir is left byte for byte as it was, and a coved on the cluster's
catalog and store lists the same sandboxes and snapshots, resumes one with its files, and
verifies the audit chain."""
import hashlib
import os
import subprocess
import time

import pytest

import pgserver
from cove import poll
from s3rgw import S3Rgw

PG_WHY = pgserver.available()
S3_WHY = S3Rgw.available()
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(PG_WHY), reason=PG_WHY or "")]


@pytest.fixture(scope="module")
def pg():
    with pgserver.PgServer() as server:
        yield server


@pytest.fixture(scope="module")
def rgw():
    if S3_WHY:
        pytest.skip(S3_WHY)
    with S3Rgw() as r:
        yield r


def kek_file(tmp_path):
    p = tmp_path / "cluster.kek"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    return str(p)


def tree_digest(root):
    """path -> what identifies its content: (mode, size, inode, mtime_ns) of every file under
    root, and the SHA-256 of those up to 16 MiB."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            p = os.path.join(d, name)
            st = os.lstat(p)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = ("link", os.readlink(p))
                continue
            if not os.path.isfile(p):
                continue
            if p.endswith(".img"):
                # layer filesystem images: the kernel may still flush an ext4 that a
                # lingering loop device holds after coved stopped (not the migration's doing)
                continue
            h = ""
            if st.st_size <= 16 << 20:
                with open(p, "rb") as f:
                    h = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, h)
    return out


def snap(c, sid, **body):
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", body, timeout=300)
    if r.status == 503 and "cannot snapshot" in r.body.decode(errors="replace"):
        pytest.skip("the runtime cannot snapshot here: " + r.error.get("message", ""))
    assert r.status == 201, r.body[:400]
    return r.json()


def migrate_argv(build_dir, data, url, bucket, rgw, kek):
    return [os.path.join(build_dir, "coved"), "migrate", "--data-dir", data, "--db", url,
            "--store", f"s3://{bucket}/cluster", "--s3-endpoint", rgw.endpoint,
            "--default-kek-file", kek]


def test_single_node_joins_a_cluster(coved_factory, build_dir, pg, rgw, tmp_path):
    """Everything of the single node is in the cluster afterwards and works there; the
    killed run leaves nothing listed that cannot be restored, the re-run completes it."""
    d = coved_factory(extra_args=["--pool", "0"])
    admin = d.client
    tenants = {}
    for name in ("acme", "globex"):
        t = admin.post("/v1/tenants", {"name": name}, expect=201)
        k = admin.post(f"/v1/tenants/{t['id']}/api-keys", {}, expect=201)
        tenants[name] = (t["id"], k["key"])
    ca = admin.with_key(tenants["acme"][1])
    cg = admin.with_key(tenants["globex"][1])
    # acme: a sandbox with files, a files snapshot, then paused (full where CRIU allows)
    a = ca.create(template="busybox", snapshot_interval_s=0)["id"]
    ca.exec(a, "mkdir -p /root/w && head -c 3000000 /dev/urandom > /root/w/blob && "
               "sha256sum /root/w/blob > /root/w/sum && echo one > /root/w/note && sync")
    blob_sum = ca.exec(a, "cat /root/w/sum")["stdout"]
    s_files = snap(ca, a, label="files", kind="files")
    ca.exec(a, "echo two > /root/w/note && sync")
    p = ca.post(f"/v1/sandboxes/{a}/pause", {})
    assert p["sandbox"]["state"] == "paused"
    # globex: one running sandbox with a snapshot, one never snapshotted
    g = cg.create(template="busybox", snapshot_interval_s=0)["id"]
    cg.exec(g, "echo globex > /root/g && sync")
    snap(cg, g, label="g1")
    g2 = cg.create(template="busybox", snapshot_interval_s=0)["id"]
    before = {}
    for name, c in (("acme", ca), ("globex", cg)):
        before[name] = {
            "sandboxes": sorted(s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]),
            "snapshots": sorted(x["id"] for sid in
                                [s["id"] for s in c.get("/v1/sandboxes")["sandboxes"]]
                                for x in c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]),
        }
    assert s_files["id"] in before["acme"]["snapshots"]
    assert admin.get("/v1/audit/verify")["ok"] is True
    d.terminate()  # a clean stop: running sandboxes are settled (paused/stopped) by coved
    digest = tree_digest(d.data)

    url = pg.create_db("migrated")
    bucket = "migrate-" + os.urandom(3).hex()
    kek = kek_file(tmp_path)
    argv = migrate_argv(build_dir, d.data, url, bucket, rgw, kek)
    env = {**os.environ, **rgw.env}

    # a coved still running on the data dir refuses the migration
    d.start()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "in use by a running coved" in r.stderr, r.stderr
    d.terminate()
    digest = tree_digest(d.data)

    # kill -9 midway: after the first tenant's objects are uploaded, before any row
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    first = ""
    deadline = time.time() + 300
    while time.time() < deadline:
        first = proc.stdout.readline()
        if not first or first.startswith("store: tenant"):
            break
    proc.kill()
    proc.wait()
    assert first.startswith("store: tenant"), first + proc.stderr.read()
    assert proc.returncode == -9
    assert pg.psql("SELECT count(*) FROM snapshots", db="migrated").strip() == "0"

    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "migrate: done" in r.stdout
    print(r.stdout, f"(the completing run took {time.monotonic() - t0:.1f} s, load "
                    f"{os.getloadavg()[0]:.1f})")
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    copied = [ln for ln in again.stdout.splitlines() if " copied " in ln]  # nothing new
    assert copied and all(ln.split("copied")[0].split()[-1] == "0" for ln in copied), again.stdout
    assert tree_digest(d.data) == digest, "the migration changed the data dir"

    # the cluster side: a coved on the migrated catalog and store
    c2 = coved_factory(extra_args=["--pool", "0", "--db", url, "--store",
                                   f"s3://{bucket}/cluster", "--s3-endpoint", rgw.endpoint,
                                   "--default-kek-file", kek], env=rgw.env)
    for name, (tid, key) in tenants.items():
        c = c2.client.with_key(key)  # API keys came along (hashed)
        sbx = c.get("/v1/sandboxes")["sandboxes"]
        assert sorted(s["id"] for s in sbx) == before[name]["sandboxes"]
        snaps = sorted(x["id"] for s in sbx
                       for x in c.get(f"/v1/sandboxes/{s['id']}/snapshots")["snapshots"])
        assert snaps == before[name]["snapshots"]
    ca2 = c2.client.with_key(tenants["acme"][1])
    assert ca2.sandbox(a)["state"] == "paused"
    res = ca2.post(f"/v1/sandboxes/{a}/resume", {})
    assert res["state"] == "running", res
    assert ca2.exec(a, "cat /root/w/note")["stdout"] == "two\n"
    assert ca2.exec(a, "sha256sum /root/w/blob")["stdout"] == blob_sum
    # the files snapshot restores too (a fork from it)
    fid = ca2.post(f"/v1/sandboxes/{a}/fork", {"snapshot_id": s_files["id"]})["sandboxes"][0]["id"]
    assert ca2.exec(fid, "cat /root/w/note")["stdout"] == "one\n"
    cg2 = c2.client.with_key(tenants["globex"][1])
    assert cg2.sandbox(g2)["state"] == "stopped"  # no snapshot: nothing to resume from
    v = c2.client.get("/v1/audit/verify")
    assert v["ok"] is True and v["first_broken_seq"] is None, v
    n_old = int(again.stdout.split("audit events")[1].split()[2])
    assert v["checked"] >= n_old > 0
    for sid in (a, fid):
        ca2.remove(sid, purge=True)
