#!/usr/bin/env python3
"""Exposed ports (docs/ports.md): a preview URL against the same server reached straight,
in the same run. Run as root from the checkout:
    BUILD=build python3 bench/ports_bench.py [--json] [--rounds 3]
A coved with --ports-listen, a base sandbox (ns) running tests/integration/ports/app.py.
'preview' = the client on the node through coved's port listener (Host route, private port,
token header); 'direct' = the same client in the sandbox's network namespace (nsenter), to
the server's own address (127.0.0.1:port there): what a user would have without cove's
listener, minus nothing but the listener. Figures: new connection + GET + close and
keep-alive GET p50/p99 (ms), 1 GiB download (MB/s, median of --rounds), WebSocket echo
round trip p50/p99 (ms), 1,000 concurrent connections (ok/errors, s). Prints the load
average before and after."""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from cove import Coved, free_port, poll  # noqa: E402
from benchlib import loadavg  # noqa: E402

APP = os.path.join(ROOT, "tests", "integration", "ports", "app.py")
HTTP, WS, ASYNC = 8000, 8001, 8002

CLIENT = r'''
import base64, json, os, resource, selectors, socket, struct, sys, time
host, port, wsport, aport, hosthdr, tok, what = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
extra = ("X-Cove-Port-Token: %s\r\n" % tok) if tok else ""
def hh(h):
    return ("Host: %s\r\n" % h) + extra
def pct(lat):
    lat.sort(); n = len(lat)
    return {"p50_ms": round(lat[n // 2] * 1000, 3), "p99_ms": round(lat[min(n - 1, int(n * .99))] * 1000, 3)}
def read_resp(s, buf=b""):
    while b"\r\n\r\n" not in buf:
        b = s.recv(65536)
        if not b: raise OSError("closed")
        buf += b
    head, body = buf.split(b"\r\n\r\n", 1)
    cl = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
    while len(body) < cl:
        b = s.recv(65536)
        if not b: raise OSError("closed")
        body += b
    return body[cl:]
def conn(p):
    s = socket.create_connection((host, p), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
out = {}
def host_for(p):
    return hosthdr.replace("{port}", str(p))
if what in ("lat", "all"):
    req = ("GET /headers HTTP/1.1\r\n" + hh(host_for(@HTTP@)) + "\r\n").encode()
    lat = []
    for i in range(500):
        t = time.perf_counter(); s = conn(port); s.sendall(req); read_resp(s); s.close(); lat.append(time.perf_counter() - t)
    out["new_conn_get"] = pct(lat)
    s = conn(port); lat = []
    for i in range(2000):
        t = time.perf_counter(); s.sendall(req); read_resp(s); lat.append(time.perf_counter() - t)
    s.close()
    out["keepalive_get"] = pct(lat)
if what in ("ws", "all"):
    s = conn(wsport)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET / HTTP/1.1\r\n" + hh(host_for(@WS@)) + "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % key).encode())
    buf = b""
    while b"\r\n\r\n" not in buf: buf += s.recv(4096)
    lat = []
    for i in range(2000):
        msg = b"ping %06d" % i; mask = os.urandom(4)
        t = time.perf_counter()
        s.sendall(bytes([0x81, 0x80 | len(msg)]) + mask + bytes(b ^ mask[j % 4] for j, b in enumerate(msg)))
        got = b""
        while len(got) < 2 + len(msg): got += s.recv(4096)
        lat.append(time.perf_counter() - t)
    s.close()
    out["ws_echo"] = pct(lat)
if what.startswith("dl"):
    n = 1 << 30
    s = conn(port)
    s.sendall(("GET /big?n=%d HTTP/1.1\r\n" % n + hh(host_for(@HTTP@)) + "\r\n").encode())
    buf = bytearray(1 << 20); mv = memoryview(buf); got = 0; head = b""
    t = time.perf_counter()
    while b"\r\n\r\n" not in head: head += s.recv(4096)
    got = len(head.split(b"\r\n\r\n", 1)[1])
    while got < n:
        k = s.recv_into(mv)
        if not k: break
        got += k
    dt = time.perf_counter() - t
    s.close()
    out["download_mb_s"] = round(got / dt / 1e6, 1)
if what in ("conc", "all"):
    N = 1000
    req = ("GET / HTTP/1.1\r\n" + hh(host_for(@ASYNC@)) + "\r\n").encode()
    sel = selectors.DefaultSelector(); socks = []; errors = 0
    t = time.perf_counter()
    for i in range(N):
        try:
            s = socket.socket(); s.setblocking(False)
            s.connect_ex((host, aport)); socks.append(s)
            sel.register(s, selectors.EVENT_WRITE, [b"", False])
        except OSError:
            errors += 1
    ok = 0; deadline = time.time() + 60
    while sel.get_map() and time.time() < deadline:
        for key, ev in sel.select(1):
            s, st = key.fileobj, key.data
            try:
                if ev & selectors.EVENT_WRITE and not st[1]:
                    s.send(req); st[1] = True; sel.modify(s, selectors.EVENT_READ, st); continue
                b = s.recv(4096)
                if not b: raise OSError("closed")
                st[0] += b
                if st[0].endswith(b"ok"):
                    ok += 1; sel.unregister(s)
            except OSError:
                errors += 1; sel.unregister(s)
    errors += len(sel.get_map())
    out["concurrent_1000"] = {"ok": ok, "errors": errors, "s": round(time.perf_counter() - t, 2)}
    for s in socks: s.close()
print(json.dumps(out))
'''.replace("@HTTP@", str(HTTP)).replace("@WS@", str(WS)).replace("@ASYNC@", str(ASYNC))




def sandbox_pid(sid):
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                if f"cove/{sid}" in f.read():
                    return int(p)
        except OSError:
            continue
    raise SystemExit(f"no process of {sid} found")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    build = os.path.join(ROOT, os.environ.get("BUILD", "build"))
    templates = os.environ.get("COVE_TEMPLATES_DIR")
    pport = free_port()
    d = Coved(build, templates_dir=templates,
              extra_args=["--templates", "busybox,base", "--pool", "0", "--runtime", "ns",
                          "--ports-listen", f"127.0.0.1:{pport}", "--ports-domain", "ports.test",
                          "--ports-max-conns", "4096"])
    load0 = loadavg()
    try:
        c = d.client
        sid = c.create(template="base")["id"]
        with open(APP, "rb") as f:
            c.put_file(sid, "/tmp/app.py", f.read())
        c.exec(sid, ["/bin/sh", "-c", f"nohup python3 /tmp/app.py {HTTP} {WS} {ASYNC} "
                                      ">/tmp/app.log 2>&1 &"])
        poll(lambda: c.exec(sid, ["python3", "-c", "import socket; [socket.create_connection("
                                  f"('127.0.0.1', p)) for p in ({HTTP}, {WS}, {ASYNC})]"])
             ["exit_code"] == 0, timeout=60, what="app listening")
        tok = c.post(f"/v1/sandboxes/{sid}/ports", {"port": HTTP})["token"]
        for p in (WS, ASYNC):
            c.post(f"/v1/sandboxes/{sid}/ports", {"port": p, "public": True})
        pid = sandbox_pid(sid)
        hosthdr = "{port}-" + sid + ".ports.test"

        def run(mode, what):
            if mode == "preview":
                argv = ["python3", "-c", CLIENT, "127.0.0.1", str(pport), str(pport), str(pport),
                        hosthdr, tok, what]
            else:
                argv = ["nsenter", f"--net=/proc/{pid}/ns/net", "python3", "-c", CLIENT,
                        "127.0.0.1", str(HTTP), str(WS), str(ASYNC), "127.0.0.1", "", what]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise SystemExit(f"{mode} {what}: {r.stderr[-2000:]}")
            return json.loads(r.stdout)

        res = {"preview": {}, "direct": {}}
        for what in ("lat", "ws", "conc"):
            for mode in ("direct", "preview"):
                res[mode].update(run(mode, what))
        dl = {"preview": [], "direct": []}
        for _ in range(a.rounds):  # alternate, so both see the same load
            for mode in ("direct", "preview"):
                dl[mode].append(run(mode, "dl")["download_mb_s"])
        for mode in dl:
            res[mode]["download_mb_s"] = sorted(dl[mode])[len(dl[mode]) // 2]
            res[mode]["download_rounds"] = dl[mode]
        res["load_before"], res["load_after"] = load0, loadavg()
    finally:
        d.stop()
    p, q = res["preview"], res["direct"]
    rows = [
        ("new connection + GET + close, p50 / p99 ms", p["new_conn_get"], q["new_conn_get"]),
        ("keep-alive GET, p50 / p99 ms", p["keepalive_get"], q["keepalive_get"]),
        ("WebSocket echo round trip, p50 / p99 ms", p["ws_echo"], q["ws_echo"]),
    ]
    print(f"load average before {res['load_before']}, after {res['load_after']}")
    print(f"{'':46} {'preview URL':>16} {'direct':>16} {'added p50':>10}")
    for name, a_, b_ in rows:
        print(f"{name:46} {a_['p50_ms']:>7} / {a_['p99_ms']:<7} {b_['p50_ms']:>7} / "
              f"{b_['p99_ms']:<7} {a_['p50_ms'] - b_['p50_ms']:>+9.3f}")
    print(f"{'1 GiB download, MB/s (median)':46} {p['download_mb_s']:>16} "
          f"{q['download_mb_s']:>16} {p['download_mb_s'] / q['download_mb_s']:>9.0%}")
    cp, cq = p["concurrent_1000"], q["concurrent_1000"]
    print(f"{'1,000 concurrent connections ok/errors (s)':46} "
          f"{cp['ok']}/{cp['errors']} ({cp['s']}) {cq['ok']:>8}/{cq['errors']} ({cq['s']})")
    if a.json:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
