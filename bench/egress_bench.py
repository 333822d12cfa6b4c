"""Egress gateway figures (docs/egress.md): run as root from the checkout,
    BUILD=build python3 bench/egress_bench.py [--host-netns] [--goals] [--json]
Upstream servers in a netns of their own (tests/lib/egressenv.py); 'proxy' = a client in a
sandbox of template base, 'direct' = the same client on the node side (one veth hop to the
upstreams, no proxy). Prints a table (proxy, direct, added ms or ratio), the goal rows
(PASS/FAIL next to the same-run direct anchor and the load) and the JSON. --goals runs only
the two goal figures (latency and download rounds).

By default everything runs in a fresh network namespace (coved, its nftables table, the
upstream link): every nftables table in a namespace is evaluated for every packet, so tables
left behind in the host's namespace (crashed coveds, CRIU network locks) tax both paths and
the proxy twice; --host-netns measures in the host's namespace anyway (the table count is
printed either way)."""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from benchlib import loadavg  # noqa: E402

CLIENT = r'''
import json, os, resource, socket, ssl, struct, sys, time
mode = sys.argv[1]; names = json.loads(sys.argv[2])  # name -> address ("" = resolve here)
TIMEOUT = 20
def addr(name):
    # resolved once per phase, outside the timed loop: the proxy rows measure the proxy, not
    # the resolver (its lookup time is a row of its own); in the sandbox this refreshes the
    # DNS pin a name-rule connection needs
    return names[name] or socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
def pct(lat, errors=0):
    lat.sort(); n = len(lat)
    if not n: return {"errors": errors}
    return {"p50_ms": round(lat[n // 2], 3), "p99_ms": round(lat[min(n - 1, int(n * .99))], 3),
            "errors": errors}
def https(name, n, keepalive, verify):
    # raw HTTP/1.1 over TLS, so the host (no resolver for *.test) and the sandbox run alike
    a = addr(name)
    ctx = ssl.create_default_context()
    if not verify:
        ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    def conn():
        return ctx.wrap_socket(socket.create_connection((a, 443), timeout=TIMEOUT), server_hostname=name)
    def get(s):
        s.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name.encode())
        buf = b""
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
    lat, errs = [], 0
    s = None
    for i in range(n):
        t = time.perf_counter()
        try:
            if s is None:
                s = conn()
            get(s)
            if not keepalive:
                s.close(); s = None
            lat.append((time.perf_counter() - t) * 1000)
        except OSError:
            errs += 1
            if s is not None: s.close()
            s = None
    if s is not None: s.close()
    return pct(lat, errs)
def rt(n, raw=False):
    # TCP connect + one HTTP GET to the echo port + its echo + close
    a = addr("allowed.test"); lat, errs = [], 0
    for i in range(n):
        t = time.perf_counter()
        try:
            s = socket.create_connection((a, 7000), timeout=TIMEOUT)
            try:
                s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test:7000\r\n\r\n")
                if not s.recv(100): raise OSError("closed")
            finally:
                s.close()
            lat.append((time.perf_counter() - t) * 1000)
        except OSError:
            errs += 1
    return {"samples": lat, "errors": errs} if raw else pct(lat, errs)
def big(nbytes):
    s = socket.create_connection((addr("allowed.test"), 80), timeout=TIMEOUT)
    s.sendall(b"GET /big/%d HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n" % nbytes)
    t = time.perf_counter(); got = 0; buf = bytearray(1 << 20)
    while True:
        k = s.recv_into(buf)
        if not k: break
        got += k
    dt = time.perf_counter() - t
    s.close()
    return {"MB_s": round(got / dt / 1e6, 1), "bytes": got}
def conc(n):
    a = addr("allowed.test"); socks, errs = [], 0
    for i in range(n):
        try:
            s = socket.create_connection((a, 7000), timeout=TIMEOUT)
            s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test:7000\r\n\r\n"); socks.append(s)
        except OSError: errs += 1
    ok = 0
    for s in socks:
        try:
            if s.recv(100): ok += 1
            else: errs += 1
        except OSError: errs += 1
    for s in socks: s.close()
    return {"ok": ok, "errors": errs}
def dns_rate(secs):
    q = struct.pack(">HHHHHH", 1, 0x100, 1, 0, 0, 0) + b"\x07allowed\x04test\x00" + struct.pack(">HH", 1, 1)
    ns = open("/etc/resolv.conf").read().split("nameserver")[1].split()[0]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.connect((ns, 53)); u.settimeout(2)
    n = 0; end = time.time() + secs; win = 32
    for _ in range(win): u.send(q)
    try:
        while time.time() < end:
            u.recv(512); n += 1; u.send(q)
    except OSError:
        pass
    return {"answers_s": round(n / secs)}
def lookup(n):
    lat = []
    for i in range(n):
        t = time.perf_counter(); socket.getaddrinfo("allowed.test", 80, socket.AF_INET)
        lat.append((time.perf_counter() - t) * 1000)
    return pct(lat)
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
# HTTPS request latency: keep-alive (one TLS connection) and a new connection per request.
# In the sandbox allowed.test has a bound secret (intercepted: TLS terminated, credential
# injected, re-encrypted, node CA trusted) and other.test has none (spliced).
sb = mode == "sandbox"
PHASES = {"latency": lambda: rt(1000), "latency_round": lambda: rt(100, True),
          "download": lambda: big(1 << 30),
          "concurrent_1000": lambda: conc(1000),
          "https_keepalive": lambda: https("allowed.test", 500, True, sb),
          "https_keepalive_spliced": lambda: https("other.test", 500, True, False),
          "https_new_conn": lambda: https("allowed.test", 200, False, sb),
          "https_new_conn_spliced": lambda: https("other.test", 200, False, False),
          "dns": lambda: dns_rate(3), "dns_lookup": lambda: lookup(300)}
print(json.dumps({k: PHASES[k]() for k in sys.argv[3].split(",")}))
'''


def nft_tables():
    r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    return len(r.stdout.splitlines())




COLS = (("proxy", "proxy (sandbox)"), ("routed_cg", "routed netns, sandbox's cgroups"),
        ("routed", "direct, routed netns"), ("direct", "direct (node side)"))


def table(res):
    """The figures as a markdown table: each column, and what the proxy adds (ms or ratio)
    over the node-side client, over the routed netns client (the sandbox's hops, no proxy)
    and over that client in the sandbox's CPU cgroups (its hops and its CPU share, no
    proxy)."""
    cols = [(k, label) for k, label in COLS if k in res]
    refs = [k for k in ("direct", "routed", "routed_cg") if k in res]
    rows = ["| | " + " | ".join(label for _, label in cols) + " | added vs node side"
            + ("".join({"routed": " / vs routed", "routed_cg": " / vs routed in the sandbox's "
                        "cgroups"}.get(k, "") for k in refs)) + " |",
            "|---|" + "---|" * (len(cols) + 1)]

    def get(o, *path):
        for k in path:
            if not isinstance(o, dict) or k not in o:
                return None
            o = o[k]
        return o

    def added(key, q, ratio=False):
        a = get(res["proxy"], key, q)
        out = []
        for ref in refs:
            b = get(res.get(ref), key, q)
            if a is None or b is None:
                continue
            out.append(f"{100 * a / b:.0f}%" if ratio else f"{a - b:+.2f} ms")
        return " / ".join(out)

    def row(label, key, q, fmt=str, ratio=False):
        cells = []
        errs = 0
        for k, _ in cols:
            v = get(res[k], key, q)
            cells.append(fmt(v) if v is not None else "-")
            errs += get(res[k], key, "errors") or 0
        note = f" ({errs} errors)" if errs and q != "ok" else ""
        rows.append(f"| {label} | " + " | ".join(cells) +
                    f" | {added(key, q, ratio) if q != 'ok' else ''}{note} |")

    row("connect + GET + echo + close (1,000), p50 ms", "latency", "p50_ms")
    row("… p99 ms", "latency", "p99_ms")
    row("1 GiB download, MB/s (median of 3)", "download", "MB_s", ratio=True)
    rows.append("| 1,000 concurrent connections, ok / errors | " + " | ".join(
        f"{get(res[k], 'concurrent_1000', 'ok')} / {get(res[k], 'concurrent_1000', 'errors')}"
        if get(res[k], "concurrent_1000", "ok") is not None else "-" for k, _ in cols) + " | |")
    for key, label in (("https_keepalive", "HTTPS keep-alive request, intercepted"),
                       ("https_keepalive_spliced", "HTTPS keep-alive request, spliced"),
                       ("https_new_conn", "HTTPS new connection + request, intercepted"),
                       ("https_new_conn_spliced", "HTTPS new connection + request, spliced")):
        row(label + ", p50 ms", key, "p50_ms")
        row("… p99 ms", key, "p99_ms")
    blank = " |" * len(cols)
    rows.append(f"| DNS answers/s (UDP, 32 in flight) | {get(res['proxy'], 'dns', 'answers_s')}"
                f"{blank} |")
    rows.append(f"| DNS lookup (getaddrinfo), p50 / p99 ms | "
                f"{get(res['proxy'], 'dns_lookup', 'p50_ms')} / "
                f"{get(res['proxy'], 'dns_lookup', 'p99_ms')}{blank} |")
    return "\n".join(rows)


# the goals (issue 18, goal 9): what the proxy may add over the direct client of the same run
GOAL_ADDED_MS = 0.15
GOAL_RATIO = 0.95


def goal_rows(res):
    """PASS/FAIL of the two goal figures next to their direct anchor (same run) and the load."""
    def g(col, key, q):
        return (res.get(col) or {}).get(key, {}).get(q)

    out = ["| goal | proxy | direct anchor (same run) | figure | goal | result |",
           "|---|---|---|---|---|---|"]
    a, b = g("proxy", "latency", "p50_ms"), g("direct", "latency", "p50_ms")
    if a is not None and b is not None:
        out.append(f"| connect + GET p50 added | {a:.3f} ms | {b:.3f} ms | {a - b:+.3f} ms | "
                   f"≤ +{GOAL_ADDED_MS} ms | {'PASS' if a - b <= GOAL_ADDED_MS else 'FAIL'} |")
    else:
        out.append("| connect + GET p50 added | - | - | - | | FAIL (no figure) |")
    a, b = g("proxy", "download", "MB_s"), g("direct", "download", "MB_s")
    if a and b:
        out.append(f"| download throughput | {a:.0f} MB/s | {b:.0f} MB/s | {100 * a / b:.0f}% | "
                   f"≥ {100 * GOAL_RATIO:.0f}% | {'PASS' if a / b >= GOAL_RATIO else 'FAIL'} |")
    else:
        out.append("| download throughput | - | - | - | | FAIL (no figure) |")
    c, d = g("routed_cg", "latency", "p50_ms"), g("routed_cg", "download", "MB_s")
    if c is not None and a and d:
        pa = g("proxy", "latency", "p50_ms")
        out.append(f"| (where the gap is) vs the routed client in the sandbox's cgroups | "
                   f"{pa:.3f} ms, {a:.0f} MB/s | {c:.3f} ms, {d:.0f} MB/s | {pa - c:+.3f} ms, "
                   f"{100 * a / d:.0f}% | (info) | — |")
    out.append(f"| load average (1, 5, 15 min) | before {res.get('load_before')} | "
               f"after {res.get('load_after')} | | | |")
    return "\n".join(out)


class RoutedNetns:
    """A client namespace with the sandbox's path minus the proxy: a veth pair to this
    (bench-owned) namespace, which routes it to the upstreams. Only made in the bench's own
    namespace: it turns on forwarding there."""

    def __init__(self, up_ns, up_host_ip, slot):
        self.ns, self.h, self.n = f"cove-bench-cl{slot}", f"cvb{slot}h", f"cvb{slot}n"
        base = 4 * slot
        self.host_ip, self.ip = f"198.51.100.{base + 1}", f"198.51.100.{base + 2}"
        self.up_ns = up_ns
        self.close()
        for cmd in (["ip", "netns", "add", self.ns],
                    ["ip", "link", "add", self.h, "type", "veth", "peer", "name", self.n,
                     "netns", self.ns],
                    ["ip", "addr", "add", self.host_ip + "/30", "dev", self.h],
                    ["ip", "link", "set", self.h, "up"],
                    ["ip", "-n", self.ns, "addr", "add", self.ip + "/30", "dev", self.n],
                    ["ip", "-n", self.ns, "link", "set", self.n, "up"],
                    ["ip", "-n", self.ns, "link", "set", "lo", "up"],
                    ["ip", "-n", self.ns, "route", "add", "default", "via", self.host_ip],
                    ["ip", "-n", up_ns, "route", "add", self.ip, "via", up_host_ip],
                    ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]):
            subprocess.run(cmd, check=True, capture_output=True)

    def close(self):
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.h], capture_output=True)


def sandbox_cgroups(sandbox_id):
    """The cgroup.procs files of the CPU controllers (v1: cpu, cpuacct, cpuset; v2: the unified
    directory) a process of the sandbox is in, found from the host's /proc: a client moved there
    competes for the CPU as the sandbox's own processes do (its CPU set, its group's share)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            lines = open(f"/proc/{pid}/cgroup").read().splitlines()
        except OSError:
            continue
        if not any(sandbox_id in ln for ln in lines):
            continue
        out = []
        for ln in lines:
            _, ctrls, path = ln.split(":", 2)
            if sandbox_id not in path:
                continue
            if not ctrls:
                out.append(f"/sys/fs/cgroup{path}/cgroup.procs")
            for ctrl in ctrls.split(","):
                if ctrl in ("cpu", "cpuacct", "cpuset"):
                    out.append(f"/sys/fs/cgroup/{ctrl}{path}/cgroup.procs")
        return [f for f in out if os.path.exists(f)]
    return []


def main():
    host_netns = "--host-netns" in sys.argv[1:]
    goals_only = "--goals" in sys.argv[1:]
    if not host_netns and not os.environ.get("COVE_BENCH_OWN_NETNS"):
        env = dict(os.environ, COVE_BENCH_OWN_NETNS="1")
        sys.exit(subprocess.run(["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"',
                                 "sh", sys.executable] + sys.argv, env=env).returncode)
    from egressenv import HOST_IP, NS, SLOT, UP1, UP2, Upstream, start_coved

    build = os.path.join(ROOT, os.environ.get("BUILD", "build"))
    templates = os.environ.get("COVE_TEMPLATES_DIR", os.path.join(build, "test-templates"))
    load0 = loadavg()
    up = Upstream()
    routed = None
    d = start_coved(build, templates, None, ca_file=up.ca_file())
    try:
        if not host_netns:
            routed = RoutedNetns(NS, HOST_IP, SLOT)
        c = d.client
        c.put("/v1/secrets/BENCH", {"value": "bench-token", "hosts": ["allowed.test"],
                                    "inject": {"header": "Authorization", "format": "Bearer {value}"}})
        sb = c.create(template="base", timeout_s=3600, egress={"allow": ["allowed.test", "other.test"],
                                                              "secrets": ["BENCH"]})["id"]
        c.put_file(sb, "/tmp/client.py", CLIENT.encode())
        path = os.path.join(d.data, "egress-client.py")
        with open(path, "w") as f:
            f.write(CLIENT)
        names = json.dumps({"allowed.test": "", "other.test": ""})
        direct_names = json.dumps({"allowed.test": UP1, "other.test": UP2})

        def in_sandbox(phases):
            # in the background, polled: one long HTTP exec request would be cut by idle
            # timeouts
            c.exec(sb, ["/bin/sh", "-c", f"rm -f /tmp/done; (python3 /tmp/client.py sandbox "
                        f"'{names}' {phases} >/tmp/out.json 2>/tmp/err.txt; echo $? >/tmp/done)"
                        " </dev/null >/dev/null 2>&1 &"])
            deadline = time.time() + 900
            while c.exec(sb, ["/bin/sh", "-c", "test -e /tmp/done"])["exit_code"] != 0:
                if time.time() > deadline:
                    return {"error": "the sandbox client did not finish within 900 s"}
                time.sleep(0.5)
            r = c.exec(sb, ["/bin/sh", "-c", "cat /tmp/out.json; cat /tmp/err.txt >&2"])
            return json.loads(r["stdout"]) if r["stdout"].strip() else {"error": r["stderr"][-2000:]}

        # the routed client again, inside the sandbox's CPU cgroups: what of the proxy column's
        # gap is the sandbox's share of the CPU (its CPU set, its group) rather than the proxy
        cg = sandbox_cgroups(sb) if routed else []

        def on_node(phases, netns=None, cgroups=()):
            argv = [sys.executable, path, "host", direct_names, phases]
            if netns:
                argv = ["ip", "netns", "exec", netns] + argv
            if cgroups:
                argv = ["sh", "-c", 'for f in "$@"; do echo $$ > "$f" || exit 1; shift; '
                        'case "$1" in --) shift; break;; esac; done; exec "$@"', "sh"] + \
                    list(cgroups) + ["--"] + argv
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
                return json.loads(r.stdout) if r.stdout.strip() else {"error": r.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                return {"error": "the direct client did not finish within 900 s"}

        # each figure through the proxy, then at once directly: all columns see about the
        # same load on a shared machine
        res = {"proxy": {}, "direct": {}}
        if routed:
            res["routed"] = {}
        if cg:
            res["routed_cg"] = {}

        def keep(col, phases, got):
            for k in phases.split(","):
                res[col][k] = got.get(k, got)  # a failed run: its error under each phase

        cols = ["proxy", "direct"] + (["routed"] if routed else []) + (["routed_cg"] if cg else [])

        def run(col, phases):
            if col == "proxy":
                return in_sandbox(phases)
            return on_node(phases, routed.ns if col.startswith("routed") else None,
                           cg if col == "routed_cg" else ())

        # the two goal figures in short rounds, the columns taking turns: a burst of load
        # from elsewhere then hits all of them alike (10 x 100 connections, 3 x 1 GiB)
        lat = {col: {"samples": [], "errors": 0} for col in cols}
        for _ in range(10):
            for col in cols:
                got = run(col, "latency_round").get("latency_round") or {"errors": 100}
                lat[col]["samples"] += got.get("samples", [])
                lat[col]["errors"] += got["errors"]
        for col in cols:
            x = sorted(lat[col]["samples"])
            res[col]["latency"] = {"p50_ms": round(x[len(x) // 2], 3) if x else None,
                                   "p99_ms": round(x[min(len(x) - 1, int(len(x) * .99))], 3)
                                   if x else None, "errors": lat[col]["errors"]}
        dl = {col: [] for col in cols}
        for _ in range(3):
            for col in cols:
                dl[col].append(run(col, "download").get("download", {}).get("MB_s"))
        for col in cols:
            runs = sorted(v for v in dl[col] if v)
            res[col]["download"] = {"MB_s": runs[len(runs) // 2] if runs else None, "runs": dl[col]}
        for phase in () if goals_only else ("concurrent_1000", "https_keepalive",
                                            "https_keepalive_spliced", "https_new_conn",
                                            "https_new_conn_spliced"):
            keep("proxy", phase, in_sandbox(phase))
            keep("direct", phase, on_node(phase))
            if routed:
                keep("routed", phase, on_node(phase, routed.ns))
        if not goals_only:
            keep("proxy", "dns,dns_lookup", in_sandbox("dns,dns_lookup"))
        tables = nft_tables()
        c.remove(sb)
        res.update({"load_before": load0, "load_after": loadavg(),
                    "netns": "host" if host_netns else "own", "nft_tables": tables})
        if "--json" not in sys.argv[1:]:
            print(f"egress bench: load average {load0} before, {res['load_after']} after; "
                  f"{res['netns']} network namespace with {tables} nftables table(s)")
            print(table(res))
            print()
            print(goal_rows(res))
        print(json.dumps(res, indent=1))
    finally:
        if routed:
            routed.close()
        d.stop()
        up.close()


if __name__ == "__main__":
    main()
