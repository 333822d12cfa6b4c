"""Snapshot GC with several coved processes on one PostgreSQL catalog and one S3 store
(docs/cluster.md "GC across nodes"): a manifest whose catalog row is not committed yet
(another process's capture in flight) survives a second process's start-up and GC passes
while it is younger than the grace period, and is collected once it is older."""
import os
import uuid

import pytest

import pgserver
from cove import poll
from s3rgw import S3Rgw

PG_WHY = pgserver.available()
S3_WHY = S3Rgw.available()
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(PG_WHY), reason=PG_WHY or "")]
HOOKS_ENV = {"COVE_TEST_HOOKS": "1"}


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


def snap(c, sid):
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {}, timeout=300)
    if r.status == 503 and "cannot snapshot" in r.body.decode(errors="replace"):
        pytest.skip("the runtime cannot snapshot here: " + r.error.get("message", ""))
    assert r.status == 201, r.body[:400]
    return r.json()["id"]


def test_in_flight_manifest_survives_another_process(coved_factory, pg, rgw, tmp_path):
    """A's snapshot with its row taken away (the state between A's manifest and A's row):
    B starting on the same catalog and store keeps the manifest (before, B's start-up
    removed every manifest without a row); once the manifest is older than B's grace
    period, B's next GC pass removes it."""
    url = pg.create_db("gc_shared")
    bucket = "gc-" + uuid.uuid4().hex[:8]
    kek = tmp_path / "k"
    fd = os.open(kek, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)

    def start(grace_s):
        hp = tmp_path / f"hooks-{uuid.uuid4().hex[:6]}"
        hp.write_text(f"gc_grace_s {grace_s}\n")
        return coved_factory(extra_args=[
            "--db", url, "--pool", "0", "--default-kek-file", str(kek), "--store",
            f"s3://{bucket}/p", "--s3-endpoint", rgw.endpoint, "--test-hooks", str(hp)],
            env={**rgw.env, **HOOKS_ENV})

    a = start(3600)
    c = a.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    c.exec(sid, "echo in-flight > /root/f && sync")
    keep = snap(c, sid)  # with its row
    orphan = snap(c, sid)
    # (role all on one shared catalog: another coved's start-up would take A's running
    # sandbox for one of its own lost ones; pause it first)
    assert c.post(f"/v1/sandboxes/{sid}/pause", {})["sandbox"]["state"] == "paused"
    man = f"p/default/manifests/{orphan}"
    assert rgw.exists(bucket, man)
    pg.psql(f"DELETE FROM snapshots WHERE id = '{orphan}'", db="gc_shared")

    b = start(3600)  # its start-up looks for manifests without a row
    assert b.client.get("/v1/sandboxes")["sandboxes"] is not None
    # a GC pass on B (a snapshot deleted there) keeps it too
    other = snap(b.client, b.client.create(template="busybox", snapshot_interval_s=0)["id"])
    b.client.delete(f"/v1/snapshots/{other}")
    poll(lambda: not rgw.exists(bucket, f"p/default/manifests/{other}"), timeout=60,
         what="B's deleted snapshot's manifest removed")
    assert rgw.exists(bucket, man), "another process's young manifest was removed"
    b.terminate()

    # settled (grace 1 s): the orphan goes at the next start-up sweep (or GC pass)
    start(1)
    poll(lambda: not rgw.exists(bucket, man), timeout=120, what="the settled orphan removed")
    assert rgw.exists(bucket, f"p/default/manifests/{keep}")  # rows keep theirs
