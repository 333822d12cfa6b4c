"""The control plane's node decisions on PostgreSQL: node loss (lost only after the lease TTL
plus the grace, sandboxes re-placed with recover jobs and recovered_from, two replicas
racing recover each sandbox once), drains (pause then resume elsewhere one at a time, a
drain carrying on after a replica restart), cordon and the node list. The decisions are
tests/unit/test_nodes.c, run here against a real server these tests start (node rows with
leases the test lets lapse; a stand-in node thread claims and finishes the jobs)."""
import os
import subprocess

import pytest

import pgserver

PG_WHY = pgserver.available()
pytestmark = pytest.mark.skipif(bool(PG_WHY), reason=PG_WHY or "")


@pytest.fixture(scope="module")
def pg():
    with pgserver.PgServer() as server:
        yield server


def test_node_decisions_on_postgres(build_dir, pg):
    """Every node-loss, drain and cordon test passes on PostgreSQL as on SQLite."""
    env = dict(os.environ, COVE_TEST_PG_URL=pg.url)
    r = subprocess.run([os.path.join(build_dir, "tests", "unit", "test_nodes")], env=env,
                       capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    runs = out.split("test(s) run.")
    assert len(runs) == 3, out[-4000:]  # SQLite, then PostgreSQL
    assert "[  PASSED  ] 13 test(s)." in runs[2], out[-3000:]
