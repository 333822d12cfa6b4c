"""Egress test environment (tests/integration/test_egress.py, tests/security/
test_egress_attacks.py): upstream servers in a network namespace of their own (upstreams on
the host's 127.0.0.1 are unreachable from sandboxes by design), and a coved whose resolver
names them with --dns-static.

    UP1 (203.0.113.16k+2)  allowed.test   HTTP :80, TLS :443 (self-signed, SAN
                           allowed.test/other.test), hold :7000 (echo), banner :2222 (speaks first)
    UP2 (203.0.113.16k+3)  other.test     the same servers
    UDP :9999 on both records every datagram (udp.log)
Names pointing at special ranges: lo.test → 127.0.0.1, meta.test → 169.254.169.254,
priv.test → 10.1.2.3.

running() puts coved in a namespace of a testnet.Contained instead and the upstreams in
its world namespace, next to the test hosts of the off-machine addresses (no link to the
host's namespace at all); Upstream() alone (bench/egress_bench.py) keeps its own namespace.

Several runs share a host (helpers, CI jobs): each process claims a slot k (1..15, an flock
held until it exits) and uses its own namespace cove-test-up<k>, link cvt<k>h/cvt<k>n and
/28 of 203.0.113.0/24, so one run's set-up never tears down another's upstream.
"""
import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time

from cove import Coved



def _claim_slot():
    for k in range(15):
        slot = 1 + (os.getpid() + k) % 15
        fd = os.open(os.path.join(tempfile.gettempdir(), f"cove-egress-up-{slot}.lock"),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, fd  # the fd stays open: the slot is ours until this process ends
        except OSError:
            os.close(fd)
    raise RuntimeError("egressenv: all 15 upstream slots are taken by other processes")


SLOT, _SLOT_LOCK = _claim_slot()
NS = f"cove-test-up{SLOT}"
HOST_LINK, NS_LINK = f"cvt{SLOT}h", f"cvt{SLOT}n"
_BASE = 16 * SLOT
HOST_IP = f"203.0.113.{_BASE + 1}"
UP1, UP2 = f"203.0.113.{_BASE + 2}", f"203.0.113.{_BASE + 3}"
STATICS = [f"allowed.test={UP1}", f"other.test={UP2}", "lo.test=127.0.0.1",
           "meta.test=169.254.169.254", "priv.test=10.1.2.3", f"www.allowed.test={UP1}",
           f"bad.test={UP1}"]  # bad.test: the upstream's certificate does not name it

SERVER = r'''
import json, os, socket, ssl, sys, threading, http.server, socketserver
d = sys.argv[1]
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # one send per response (head and body buffered, flushed after each request) and no
    # Nagle: unbuffered writes of head then body met the client's delayed ACK (~40 ms per
    # keep-alive request), which hid the proxy's own cost in every HTTPS figure
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    def record(self, body=b""):
        with lock, open(os.path.join(d, "requests.log"), "a") as f:
            f.write(json.dumps({"server": self.server.server_address[0],
                                "tls": isinstance(self.connection, ssl.SSLSocket),
                                "method": self.command, "path": self.path,
                                "headers": dict(self.headers.items()),
                                "body": body.decode("latin-1")}) + "\n")
    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0], 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""): pass
                    break
                body += self.rfile.read(n); self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.record(body)
        out = ("posted %d\n" % len(body)).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
        self.wfile.write(out)
    def do_GET(self):
        self.record()
        if self.path.startswith("/redirect?to="):
            self.send_response(302); self.send_header("Location", self.path[len("/redirect?to="):])
            self.send_header("Content-Length", "0"); self.end_headers()
            return
        if self.path.startswith("/big"):
            n = int(self.path.split("/")[-1])
            self.send_response(200); self.send_header("Content-Length", str(n)); self.end_headers()
            chunk = b"x" * 65536
            while n > 0:
                k = min(n, len(chunk)); self.wfile.write(chunk[:k]); n -= k
            return
        body = ("hello %s %s\n" % (self.headers.get("Host"), self.server.server_address[0])).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
class TS(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 4096
def serve(addr, port, tls=False):
    s = TS((addr, port), H)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(d, "cert.pem"), os.path.join(d, "key.pem"))
        # the handshake in the connection's own thread, not in accept(): one stalled or
        # reset handshake must not stop the whole TLS server
        s.socket = ctx.wrap_socket(s.socket, server_side=True, do_handshake_on_connect=False)
    s.serve_forever()
def hold(addr):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, 7000)); l.listen(64)
    def one(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                b = c.recv(4096)
                if not b: break
                c.sendall(b)
        except OSError: pass
        c.close()
    while True:
        c, _ = l.accept(); threading.Thread(target=one, args=(c,), daemon=True).start()
def banner(addr):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, 2222)); l.listen(64)
    while True:
        c, _ = l.accept(); c.sendall(b"SSH-2.0-cove-test\r\n"); c.close()
def udp(addr):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, 9999))
    while True:
        b, a = u.recvfrom(2048)
        with open(os.path.join(d, "udp.log"), "a") as f: f.write("%s %r\n" % (a, b))
for a in sys.argv[2:]:
    for f, args in ((serve, (a, 80)), (serve, (a, 443, True)), (hold, (a,)), (banner, (a,)), (udp, (a,))):
        threading.Thread(target=f, args=args, daemon=True).start()
open(os.path.join(d, "ready"), "w").close()
threading.Event().wait()
'''


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


class Upstream:
    def __init__(self, world=None):
        """world: a testnet.Contained whose world namespace holds UP1 and UP2 (made with
        extra=(UP1, UP2)); the servers then run there. Without it, in a namespace of their
        own linked to the host's (NS, HOST_LINK)."""
        self.dir = tempfile.mkdtemp(prefix="cove-egress-up-")
        self.world = world
        if world is None:
            self.down()
            sh("ip", "netns", "add", NS)
            sh("ip", "link", "add", HOST_LINK, "type", "veth", "peer", "name", NS_LINK,
               "netns", NS)
            sh("ip", "addr", "add", HOST_IP + "/28", "dev", HOST_LINK)
            sh("ip", "link", "set", HOST_LINK, "up")
            for a in (UP1, UP2):
                sh("ip", "-n", NS, "addr", "add", a + "/28", "dev", NS_LINK)
            sh("ip", "-n", NS, "link", "set", NS_LINK, "up")
            sh("ip", "-n", NS, "link", "set", "lo", "up")
        sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
           "-subj", "/CN=allowed.test", "-addext",
           "subjectAltName=DNS:allowed.test,DNS:other.test,DNS:www.allowed.test",
           "-keyout", os.path.join(self.dir, "key.pem"), "-out", os.path.join(self.dir, "cert.pem"))
        with open(os.path.join(self.dir, "server.py"), "w") as f:
            f.write(SERVER)
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        ns = world.world if world else NS
        self.proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", "--", "python3",
                                      os.path.join(self.dir, "server.py"), self.dir, UP1, UP2],
                                     stdout=self.log, stderr=self.log)
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(self.dir, "ready")):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("upstream servers did not start")
            time.sleep(0.05)
        time.sleep(0.2)

    def requests(self):
        """Every request the upstream servers received (server, tls, method, path, headers,
        body), oldest first."""
        import json
        try:
            with open(os.path.join(self.dir, "requests.log")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    def ca_file(self):
        return os.path.join(self.dir, "cert.pem")

    def udp_log(self):
        try:
            with open(os.path.join(self.dir, "udp.log")) as f:
                return f.read()
        except OSError:
            return ""

    @staticmethod
    def down():
        sh("ip", "netns", "del", NS, check=False)
        sh("ip", "link", "del", HOST_LINK, check=False)

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        if self.world is None:
            self.down()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_coved(build_dir, templates_dir, log_dir, ca_file=None, world=None):
    """world: a testnet.Contained to run coved in (its node namespace, its test resolver)"""
    args = ["--pool", "0", "--templates", "busybox,base"]
    if world:
        args += world.coved_args()
    if ca_file:
        args += ["--egress-ca-file", ca_file]
    for s in STATICS:
        args += ["--dns-static", s]
    return Coved(build_dir, templates_dir=templates_dir, extra_args=args, log_dir=log_dir,
                 netns=world.node if world else None)


@contextlib.contextmanager
def running(build_dir, templates_dir, log_dir, log_name, tls_ca=False):
    """An Upstream and a coved whose resolver knows it (and that trusts its CA with
    tls_ca), as (coved, upstream); stopped on exit, the coved log kept as log_name.
    coved runs in the node namespace of a testnet.Contained, the upstreams in its world
    namespace next to the test hosts of the off-machine addresses and the test resolver
    (upstream.world), so nothing a sandbox or coved's resolver sends can leave the machine."""
    import pytest
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, nftables)")
    from testnet import Contained
    with Contained(extra=(UP1, UP2)) as net:
        up = Upstream(world=net)
        try:
            d = start_coved(build_dir, templates_dir, log_dir,
                            ca_file=up.ca_file() if tls_ca else None, world=net)
            try:
                yield d, up
            finally:
                d.stop(keep_log_as=log_name)
        finally:
            up.close()


@contextlib.contextmanager
def sandboxes(client, **defaults):
    """make(**fields) creates a sandbox (fields over defaults) and returns its id; every one
    made is removed on exit."""
    made = []

    def make(**fields):
        sb = client.create(**{**defaults, **fields})
        made.append(sb["id"])
        return sb["id"]

    try:
        yield make
    finally:
        for sid in made:
            client.remove(sid)


def audit(client, sid, kind=None, after=0):
    q = f"/v1/audit?sandbox={sid}&after={after}" + (f"&kind={kind}" if kind else "")
    return client.get(q)["events"]


def wait_audit(client, sid, pred, timeout=10):
    deadline = time.time() + timeout
    while True:
        ev = [e for e in audit(client, sid) if pred(e)]
        if ev or time.time() > deadline:
            return ev
        time.sleep(0.1)
