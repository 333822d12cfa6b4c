#!/usr/bin/env python3
"""Sandbox traffic through a control replica vs straight to the node, with real sandboxes:
a control and a node (coved --role control / --role node on loopback over a throwaway
PostgreSQL and radosgw, as tests/integration/test_cluster_roles.py starts them). Times an
exec round trip (`true`, wait) and a 1 GiB download of a file in the sandbox, each through
the control and, as the anchor, straight to the node's API (signed with the node's token,
as a control replica signs) in the same run, interleaved. Figures only, never a verdict.
Usage (root): forward_bench.py --build BUILD [--templates DIR] [--n 50] [--mb 1024]"""
import argparse
import hashlib
import hmac
import http.client
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests", "lib"), os.path.join(HERE, "..", "tests",
                                                                        "integration")]

import pgserver  # noqa: E402
from cove import poll  # noqa: E402
from s3rgw import S3Rgw  # noqa: E402
from test_cluster_roles import Cluster, live_nodes  # noqa: E402


def signed(token, method, path, tenant="default"):
    ts, nonce = int(time.time() * 1000), secrets.token_hex(8)
    msg = b"\0".join(x.encode() for x in
                     ("cove-node-req", method, path, str(ts), nonce, tenant, ""))
    sig = hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()
    return {"Authorization": f"Cove-Node name=na,ts={ts},nonce={nonce},sig={sig}",
            "X-Cove-Tenant": tenant}


def call(port, method, path, headers, body=None, sink=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    n = 0
    while True:
        b = r.read(1 << 20) if sink else r.read()
        if not b:
            break
        n += len(b)
        if not sink:
            break
    c.close()
    if r.status != 200:
        raise SystemExit(f"{method} {path} -> {r.status}")
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--templates", default=os.environ.get("COVE_TEMPLATES_DIR"))
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--mb", type=int, default=1024)
    a = ap.parse_args()
    why = pgserver.available() or S3Rgw.available()
    if why:
        print(f"forward_bench: skipped: {why}")
        return
    tmp = tempfile.mkdtemp(prefix="cove-fwd-bench-")
    with pgserver.PgServer() as pg, S3Rgw() as rgw:
        c = Cluster(os.path.abspath(a.build), a.templates, pg, rgw, tmp)
        try:
            c.start_control()
            node = c.start_node("na")
            poll(lambda: live_nodes(c) == "na", timeout=60, what="the node's lease")
            cc = c.control.client
            with open(c.token("na")) as f:
                token = f.read().strip()
            sid = cc.create(template="busybox", snapshot_interval_s=0,
                            disk_mb=a.mb + 512)["id"]
            bearer = {"Authorization": f"Bearer {cc.key}",
                      "Content-Type": "application/json"}
            path = f"/v1/sandboxes/{sid}/exec"
            body = b'{"cmd":["true"],"wait":true}'
            via, direct = [], []
            for _ in range(a.n):
                t0 = time.monotonic()
                call(node.port, "POST", path,
                     dict(signed(token, "POST", path), **{"Content-Type": "application/json"}),
                     body)
                t1 = time.monotonic()
                call(c.control.port, "POST", path, bearer, body)
                t2 = time.monotonic()
                direct.append((t1 - t0) * 1000)
                via.append((t2 - t1) * 1000)
            cc.exec(sid, f"dd if=/dev/zero of=/home/big bs=1M count={a.mb} 2>/dev/null",
                    timeout=600)
            fpath = f"/v1/sandboxes/{sid}/files?path=%2Fhome%2Fbig"
            t0 = time.monotonic()
            n0 = call(node.port, "GET", fpath, signed(token, "GET", fpath), sink=True)
            t1 = time.monotonic()
            n1 = call(c.control.port, "GET", fpath, {"Authorization": f"Bearer {cc.key}"},
                      sink=True)
            t2 = time.monotonic()
            la = os.getloadavg()
            q = statistics.quantiles
            print(f"forward_bench (real sandbox, busybox): load {la[0]:.2f} {la[1]:.2f} "
                  f"{la[2]:.2f}, {os.cpu_count()} cpus")
            print(f"exec `true` round trip, {a.n} each: straight to the node (anchor) p50 "
                  f"{statistics.median(direct):.2f} ms p90 {q(direct, n=10)[8]:.2f} ms; "
                  f"through the control p50 {statistics.median(via):.2f} ms p90 "
                  f"{q(via, n=10)[8]:.2f} ms")
            mb = a.mb * 1048576 / 1e6
            print(f"{a.mb} MiB download: straight to the node (anchor) {mb / (t1 - t0):.0f} "
                  f"MB/s{'' if n0 == a.mb << 20 else ' SHORT'}; through the control "
                  f"{mb / (t2 - t1):.0f} MB/s{'' if n1 == a.mb << 20 else ' SHORT'}")
            cc.remove(sid)
        finally:
            c.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
