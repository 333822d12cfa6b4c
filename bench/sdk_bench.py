#!/usr/bin/env python3
"""Python SDK overhead: exec round trip of `true` through cove_sdk (wait mode, and streaming
with a callback) against the raw API from the same process (http.client, one POST …/exec
with wait: true per call, as the SDK makes), on a real coved (busybox, ns runtime). Prints
median and p90 in ms and the load average.

    bench/sdk_bench.py --build build [--rounds 200]
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "sdk", "python"))
from cove import Coved  # noqa: E402
from cove_sdk import Client, Sandbox  # noqa: E402


def p90(xs):
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * 0.9))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--templates", default=None)
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (coved's ns runtime needs it)")
    templates = a.templates or os.environ.get("COVE_TEMPLATES_DIR") or os.path.join(
        a.build, "test-templates")
    data = tempfile.mkdtemp(prefix="cove-bench-sdk-")
    d = Coved(os.path.abspath(a.build), data_dir=data, templates_dir=templates)
    try:
        c = Client(f"http://127.0.0.1:{d.port}", d.client.key)
        sb = Sandbox.create("busybox", client=c, snapshot_interval_s=0)
        body = json.dumps({"cmd": ["true"], "wait": True}).encode()
        hdrs = {"Authorization": f"Bearer {d.client.key}", "Content-Type": "application/json"}

        def raw():
            h = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
            h.request("POST", f"/v1/sandboxes/{sb.id}/exec", body=body, headers=hdrs)
            r = h.getresponse()
            out = json.loads(r.read())
            h.close()
            assert out["exit_code"] == 0

        def sdk_wait():
            assert sb.exec(["true"]).exit_code == 0

        def sdk_stream():
            assert sb.exec(["true"], on_stdout=lambda b: None).exit_code == 0

        cases = (("raw API (http.client, wait: true)", raw),
                 ("cove_sdk Sandbox.exec (wait)", sdk_wait),
                 ("cove_sdk Sandbox.exec (streamed, callback)", sdk_stream))
        for _, fn in cases:
            for _ in range(10):
                fn()
        xs = [[] for _ in cases]
        for _ in range(a.rounds):  # interleaved, so a load spike hits every case alike
            for i, (_, fn) in enumerate(cases):
                t0 = time.monotonic()
                fn()
                xs[i].append((time.monotonic() - t0) * 1000)
        rows = [(name, statistics.median(x), p90(x)) for (name, _), x in zip(cases, xs)]
        sb.delete()
        load = os.getloadavg()
        print(f"| exec `true`, {a.rounds} rounds each | median ms | p90 ms |")
        print("|---|---|---|")
        for name, med, p in rows:
            print(f"| {name} | {med:.2f} | {p:.2f} |")
        print(f"SDK overhead (wait, median): {rows[1][1] - rows[0][1]:+.2f} ms over the raw API")
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")
    finally:
        d.stop()
        subprocess.run(["rm", "-rf", data])


if __name__ == "__main__":
    main()
