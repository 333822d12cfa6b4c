"""The catalog on PostgreSQL: the catalog contract tests (tests/unit/test_catalog.c) against a
real server these tests start, PostgreSQL restarted under them included; coved --db
postgres://… through its lifecycle (create, exec, snapshot, pause/resume, audit verify, a
restart that keeps everything in the database); and two coved processes writing audit events
into one database keep one verifiable chain."""
import os
import subprocess
import threading

import pytest

import pgserver
from cove import poll, sh

PG_WHY = pgserver.available()
pytestmark = pytest.mark.skipif(bool(PG_WHY), reason=PG_WHY or "")


@pytest.fixture(scope="module")
def pg():
    with pgserver.PgServer() as server:
        yield server


def pg_ctl(pg, *args):
    argv = [os.path.join(pgserver.PG_BIN, "pg_ctl"), "-D", pg.data, *args]
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--"] + argv
    return " ".join(argv)


def freeze(pg, sig):
    """A shell command sending sig to this server's postmaster and its children (by pid)."""
    pidfile = os.path.join(pg.data, "postmaster.pid")
    return f'p=$(head -1 {pidfile}) && kill -{sig} $p $(ps -o pid= --ppid $p)'


def test_catalog_contract_on_postgres(build_dir, pg):
    """Every catalog contract test (migrations, conflicts, ordering, cluster leases, SKIP
    LOCKED claims, NOTIFY wake-ups, two audit writers) passes on PostgreSQL as on SQLite,
    and a PostgreSQL stopped mid-run (or frozen by SIGSTOP) fails calls with UNAVAILABLE in
    bounded time, then they recover."""
    env = dict(os.environ, COVE_TEST_PG_URL=pg.url,
               COVE_TEST_PG_STOP=pg_ctl(pg, "-m", "fast", "-w", "-t", "60", "-s", "stop"),
               COVE_TEST_PG_START=pg_ctl(pg, "-l", pg.log, "-w", "-t", "60", "-s", "start"),
               COVE_TEST_PG_FREEZE=freeze(pg, "STOP"), COVE_TEST_PG_THAW=freeze(pg, "CONT"))
    # one stream, in the order written (cmocka's summaries go to stderr, the rest to stdout)
    r = subprocess.run([os.path.join(build_dir, "tests", "unit", "test_catalog")], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    out = r.stdout
    assert r.returncode == 0, out[-4000:]
    runs = out.split("test(s) run.")
    assert len(runs) == 3, out[-4000:]  # SQLite, then PostgreSQL
    pg_part = runs[1] + runs[2]
    assert "postgres catalog cost" in pg_part
    # every test passed, the restart and freeze tests too (none skipped)
    assert "[  PASSED  ]" in runs[2] and "SKIPPED" not in runs[2] and "FAILED" not in runs[2], \
        pg_part[-3000:]
    with open(os.path.join(pg.data, "postmaster.pid")) as f:  # the server is back up
        pg.pid = int(f.readline())
    assert pg.psql("SELECT 1").strip() == "1"


def test_coved_on_postgres(coved_factory, pg):
    """coved --db postgres://… keeps its catalog in PostgreSQL (no catalog.db in the data
    dir): sandboxes are created, run commands, snapshot, pause and resume; the audit chain
    verifies; the password never reaches the log; a restarted coved finds everything."""
    url = pg.create_db("coved_life")
    d = coved_factory(extra_args=["--db", url, "--pool", "0"])
    c = d.client
    assert not os.path.exists(os.path.join(d.data, "catalog.db"))
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    try:
        assert sh(c, sid, "echo hi > /home/f; cat /home/f") == "hi\n"
        r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"label": "one"})
        if r.status == 503 and "cannot snapshot" in r.body.decode(errors="replace"):
            pytest.skip("the runtime cannot snapshot here: " + r.error.get("message", ""))
        assert r.status == 201, r.body[:400]
        snap = r.json()
        listed = c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]
        assert snap["id"] in [s["id"] for s in listed]
        p = c.post(f"/v1/sandboxes/{sid}/pause")
        assert p["sandbox"]["state"] == "paused"
        assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
        assert sh(c, sid, "cat /home/f") == "hi\n"
        t = c.post("/v1/tenants", {"name": "on-pg"})
        v = c.get("/v1/audit/verify")
        assert v["ok"] is True and v["checked"] >= 1 and v["first_broken_seq"] is None
        # the rows are in PostgreSQL
        assert pg.psql(f"SELECT state FROM sandboxes WHERE id = '{sid}'",
                       db="coved_life").strip() == "running"
        assert int(pg.psql("SELECT count(*) FROM snapshots", db="coved_life")) >= 1
        d.terminate()  # the data dir stays; everything else is in PostgreSQL
        d.start()
        c = d.client
        assert c.sandbox(sid)["id"] == sid
        tid = (t.get("tenant") or t)["id"]
        assert tid in [x["id"] for x in c.get("/v1/tenants")["tenants"]]
        assert snap["id"] in [s["id"] for s in c.get(f"/v1/sandboxes/{sid}/snapshots")["snapshots"]]
        assert c.get("/v1/audit/verify")["ok"] is True
    finally:
        try:
            c.remove(sid, purge=True)
        except Exception as e:  # teardown must not hide the test's own result
            print(f"cleanup of {sid}: {e}")
    with open(d.log_path, errors="replace") as f:
        log = f.read()
    assert pg.password not in log
    assert "postgres://postgres:***@" in log


def test_two_coved_one_audit_chain(coved_factory, pg):
    """Two coved processes on one PostgreSQL catalog, writing audit events at the same time,
    leave one chain without gaps that verifies from either of them."""
    url = pg.create_db("coved_audit")
    a = coved_factory(extra_args=["--db", url, "--pool", "0"])
    b = coved_factory(extra_args=["--db", url, "--pool", "0"])
    N = 15
    errors = []

    def burst(client, tag):
        try:
            for i in range(N):
                client.post("/v1/tenants", {"name": f"{tag}-{i}"})
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=burst, args=(d.client, tag))
          for d, tag in ((a, "a"), (b, "b"), (a, "a2"), (b, "b2"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not errors, errors
    names = {t["name"] for t in a.client.get("/v1/tenants")["tenants"]}
    assert all(f"{tag}-{i}" in names for tag in ("a", "b", "a2", "b2") for i in range(N))

    def created():
        return int(pg.psql("SELECT count(*) FROM audit_events WHERE kind = 'tenant'"
                           " AND action = 'create'", db="coved_audit"))

    poll(lambda: created() >= 4 * N, timeout=120, what="every tenant.create audited")
    for d in (a, b):
        v = d.client.get("/v1/audit/verify")
        assert v["ok"] is True and v["first_broken_seq"] is None, v
        assert v["checked"] >= 4 * N
    seqs = [int(x) for x in pg.psql("SELECT seq FROM audit_events ORDER BY seq",
                                    db="coved_audit").split()]
    assert seqs == list(range(1, len(seqs) + 1))


def test_coved_answers_503_while_postgres_is_down(coved_factory, pg):
    """PostgreSQL restarted under a running coved: requests get 503 unavailable (never a
    hang or a crash) while it is down, and succeed again once it is back."""
    url = pg.create_db("coved_restart")
    d = coved_factory(extra_args=["--db", url, "--pool", "0"])
    c = d.client
    assert c.get("/v1/sandboxes")["sandboxes"] == []
    pg.stop_server()
    try:
        for _ in range(3):
            r = c.request("GET", "/v1/sandboxes", timeout=60)
            assert r.status == 503, r.body[:300]
            assert r.error["code"] == "unavailable"
            assert pg.password not in r.body.decode(errors="replace")
    finally:
        pg.start_server()
    assert c.get("/v1/sandboxes")["sandboxes"] == []
    assert d.alive()
