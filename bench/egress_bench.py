"""Egress gateway figures (docs/egress.md): run as root from the checkout,
BUILD=build python3 bench/egress_bench.py. Upstream servers in their own netns
(tests/lib/egressenv.py); 'direct' = the same client on the host, no proxy."""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from egressenv import UP1, UP2, Upstream, start_coved  # noqa: E402

CLIENT = r'''
import socket, ssl, struct, sys, time, json, os, random
host = sys.argv[1]; mode = sys.argv[2]; other = sys.argv[3]
def https(addr, name, n, keepalive, verify):
    # raw HTTP/1.1 over TLS, so the host (no resolver for *.test) and the sandbox run alike
    ctx = ssl.create_default_context()
    if not verify:
        ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    def conn():
        return ctx.wrap_socket(socket.create_connection((addr, 443), timeout=20), server_hostname=name)
    def get(s):
        s.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name.encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        head, body = buf.split(b"\r\n\r\n", 1)
        cl = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
        while len(body) < cl:
            body += s.recv(65536)
    lat = []
    s = conn() if keepalive else None
    for i in range(n):
        t = time.perf_counter()
        if not keepalive:
            s = conn()
        get(s)
        if not keepalive:
            s.close()
        lat.append((time.perf_counter() - t) * 1000)
    if keepalive:
        s.close()
    lat.sort(); return {"p50_ms": round(lat[n // 2], 3), "p99_ms": round(lat[int(n * .99)], 3)}
def rt(n):
    lat = []
    for i in range(n):
        t = time.perf_counter()
        s = socket.create_connection((host, 7000))
        s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test:7000\r\n\r\n"); s.recv(100); s.close()
        lat.append((time.perf_counter() - t) * 1000)
    lat.sort(); return {"p50_ms": lat[n // 2], "p99_ms": lat[int(n * .99)]}
def big(nbytes):
    s = socket.create_connection((host, 80))
    s.sendall(b"GET /big/%d HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n" % nbytes)
    t = time.perf_counter(); got = 0
    while True:
        b = s.recv(1 << 20)
        if not b: break
        got += len(b)
    dt = time.perf_counter() - t
    return {"MB_s": got / dt / 1e6, "bytes": got}
def conc(n):
    socks, errs = [], 0
    for i in range(n):
        try:
            s = socket.create_connection((host, 7000), timeout=10)
            s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test:7000\r\n\r\n"); socks.append(s)
        except OSError: errs += 1
    ok = 0
    for s in socks:
        try:
            s.settimeout(10)
            if s.recv(100): ok += 1
            else: errs += 1
        except OSError: errs += 1
    for s in socks: s.close()
    return {"ok": ok, "errors": errs}
def dns(secs):
    q = struct.pack(">HHHHHH", 1, 0x100, 1, 0, 0, 0) + b"\x07allowed\x04test\x00" + struct.pack(">HH", 1, 1)
    ns = open("/etc/resolv.conf").read().split("nameserver")[1].split()[0]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.connect((ns, 53)); u.settimeout(2)
    n = 0; end = time.time() + secs; win = 32
    for _ in range(win): u.send(q)
    while time.time() < end:
        u.recv(512); n += 1; u.send(q)
    return {"answers_s": n / secs}
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
out = {"latency": rt(500), "download": big(1 << 30), "concurrent_1000": conc(1000)}
# HTTPS request latency: keep-alive (one TLS connection) and a new connection per request.
# In the sandbox allowed.test has a bound secret (intercepted: TLS terminated, credential
# injected, re-encrypted, node CA trusted) and other.test has none (spliced).
aname = "allowed.test"
out["https_keepalive"] = https(host, aname, 300, True, mode == "sandbox")
out["https_new_conn"] = https(host, aname, 100, False, mode == "sandbox")
out["https_keepalive_spliced"] = https(other, "other.test", 300, True, False)
out["https_new_conn_spliced"] = https(other, "other.test", 100, False, False)
if mode == "sandbox": out["dns"] = dns(3)
print(json.dumps(out))
'''


def main():
    build = os.path.join(ROOT, os.environ.get("BUILD", "build"))
    up = Upstream()
    d = start_coved(build, os.environ.get("COVE_TEMPLATES_DIR", os.path.join(build, "test-templates")), None,
                    ca_file=up.ca_file())
    try:
        c = d.client
        c.put("/v1/secrets/BENCH", {"value": "bench-token", "hosts": ["allowed.test"],
                                    "inject": {"header": "Authorization", "format": "Bearer {value}"}})
        sb = c.create(template="base", timeout_s=3600, egress={"allow": ["allowed.test", "other.test"],
                                               "secrets": ["BENCH"]})["id"]
        c.put_file(sb, "/tmp/client.py", CLIENT.encode())
        # in the background, polled: one long HTTP exec request would be cut by idle timeouts
        c.exec(sb, ["/bin/sh", "-c", "(python3 /tmp/client.py allowed.test sandbox other.test "
                    ">/tmp/out.json 2>/tmp/err.txt; echo $? >/tmp/done) </dev/null >/dev/null "
                    "2>&1 &"])
        deadline = time.time() + 1800
        while c.exec(sb, ["/bin/sh", "-c", "test -e /tmp/done"])["exit_code"] != 0:
            if time.time() > deadline:
                raise RuntimeError("sandbox client did not finish")
            time.sleep(2)
        r = c.exec(sb, ["/bin/sh", "-c", "cat /tmp/out.json; cat /tmp/err.txt >&2"])
        via = json.loads(r["stdout"]) if r["stdout"].strip() else {"error": r["stderr"]}
        with open("/tmp/cove-egress-client.py", "w") as f:
            f.write(CLIENT)
        direct = json.loads(subprocess.run(["python3", "/tmp/cove-egress-client.py", UP1, "host", UP2],
                                           capture_output=True, text=True).stdout)
        print(json.dumps({"proxy": via, "direct": direct}, indent=1))
        c.remove(sb)
    finally:
        d.stop()
        up.close()


if __name__ == "__main__":
    main()
