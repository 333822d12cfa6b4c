#!/usr/bin/env python3
"""A node's catalog calls through a control replica vs the same calls on PostgreSQL directly,
same run: starts a throwaway PostgreSQL and radosgw and a `coved --role control`, then runs
the remote_op_cost part of tests/unit/test_catalog_remote (lease renew, job claim with
nothing to claim, sandbox_get; 200 each, one at a time) and prints its lines with the load
average. Figures only; root (coved).  Usage: remote_catalog_bench.py [--build DIR]"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import pgserver  # noqa: E402
from cove import Coved  # noqa: E402
from s3rgw import S3Rgw  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    why = pgserver.available() or S3Rgw.available()
    if why or os.geteuid() != 0:
        print(f"remote_catalog_bench: SKIP: {why or 'needs root'}")
        return 0
    tmp = tempfile.mkdtemp(prefix="cove-rcb-")
    key = os.path.join(tmp, "cluster.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(os.urandom(32))
    with pgserver.PgServer() as pg, S3Rgw() as rgw:
        url = pg.create_db("rcb")
        d = Coved(build, templates_dir=None, env=rgw.env,
                  extra_args=["--role", "control", "--cluster-key-file", key, "--db", url,
                              "--store", "s3://cove-rcb/c", "--s3-endpoint", rgw.endpoint])
        try:
            env = dict(os.environ, COVE_TEST_REMOTE_URL=f"http://127.0.0.1:{d.port}",
                       COVE_TEST_REMOTE_KEY_FILE=key, COVE_TEST_REMOTE_DB=url)
            r = subprocess.run([os.path.join(build, "tests", "unit", "test_catalog_remote")],
                               env=env, capture_output=True, text=True, timeout=900)
        finally:
            d.stop()
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "remote catalog cost" in ln]
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    for ln in lines:
        print(ln.replace("remote catalog cost: ", ""))
    print("PASS" if r.returncode == 0 and len(lines) == 3 else "FAIL (the test binary failed)")
    os.unlink(key)
    os.rmdir(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
