"""Test hosts for the addresses attack tests aim at, so that no test packet can leave this
machine and a refusal is proven by what the far end did not receive.

    with Contained() as net:                 # two network namespaces of this process
        d = Coved(build, netns=net.node, extra_args=net.coved_args())
        ... attack from a sandbox at 169.254.169.254, 10.0.0.1, 8.8.8.8 ...
        net.assert_nothing_received()

    node   (cove-t<pid>-<k>n)  coved runs here: lo, the link to world, its sandboxes' links;
           its only route out is the default route to world (no link to the host at all)
    world  (cove-t<pid>-<k>w)  the test hosts: every address of OFF_MACHINE, RESOLVER (the
           node resolver's upstream) and any extra ones (egress upstreams) on its lo
           - an nftables counter per address of OFF_MACHINE, one for any other address that
             is not a known test host, one for IPv6: counts every packet that arrives
           - a recorder: TCP listeners on TCP_PORTS of each address (accept, log, answer
             an HTTP 200 "TEST-HOST"), UDP 53 (DNS: logs the query, answers REFUSED) and UDP 9999 (logs)
           world does not forward (its ip_forward stays 0): a packet for an address it does
           not hold ends there, counted.

Names carry the pid (and a per-process counter), so parallel runs on one host never share
a namespace; close() deletes both namespaces (their links go with them).
"""
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time

from cove import Coved, socket_in

# what the attack tests try: cloud metadata, private gateways (docker, libvirt/QEMU user
# net, home routers), Alibaba's metadata, public resolvers
OFF_MACHINE = ("169.254.169.254", "10.0.0.1", "10.0.2.2", "10.1.2.3", "172.17.0.1",
               "192.168.0.1", "100.100.100.200", "8.8.8.8", "1.1.1.1")
RESOLVER = "192.0.2.53"  # the node resolver's upstream (coved --dns-upstream)
NODE_IP, WORLD_IP = "192.0.2.1", "192.0.2.2"  # the node ↔ world link (/30)
TCP_PORTS = (22, 53, 80, 443, 8080)
UDP_PORTS = (53, 9999)
TABLE = "cove_test_world"

RECORDER = r'''
import json, os, socket, sys, threading
d, tcp, udp, addrs = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4:]
lock = threading.Lock()
def log(**ev):
    with lock, open(os.path.join(d, "hits.log"), "a") as f:
        f.write(json.dumps(ev) + "\n")
def tcp_on(a, p):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((a, p)); l.listen(64)
    while True:
        c, peer = l.accept()
        log(proto="tcp", addr=a, port=p, peer=peer[0])
        try:  # what the client says first (bounded), then an answer HTTP clients take too
            c.settimeout(2)
            try: c.recv(4096)
            except socket.timeout: pass
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\nTEST-HOST\n")
            c.shutdown(socket.SHUT_WR)
            c.recv(4096)
        except OSError: pass
        c.close()
def udp_on(a, p):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((a, p))
    while True:
        b, peer = u.recvfrom(4096)
        log(proto="udp", addr=a, port=p, peer=peer[0], data=b.hex())
        if p == 53 and len(b) >= 12:  # DNS: the same message back as an answer, REFUSED
            r = bytearray(b); r[2] |= 0x80; r[3] = (r[3] & 0xF0) | 5
            u.sendto(bytes(r), peer)
for a in addrs:
    for p in tcp:
        threading.Thread(target=tcp_on, args=(a, int(p)), daemon=True).start()
    for p in udp:
        threading.Thread(target=udp_on, args=(a, int(p)), daemon=True).start()
open(os.path.join(d, "ready"), "w").close()
threading.Event().wait()
'''

_count = 0


def _sh(*argv, check=True, input=None):
    r = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


class Contained:
    def __init__(self, extra=()):
        """extra: more world addresses (test upstreams) that the "other" counter leaves out
        and the recorder does not listen on (the test runs its own servers there)."""
        global _count
        _count += 1
        k = f"{os.getpid()}-{_count}"
        self.node, self.world = f"cove-t{k}n", f"cove-t{k}w"
        self.node_link, self.world_link = f"ct{os.getpid()}n{_count}", f"ct{os.getpid()}w{_count}"
        self.extra = tuple(extra)
        self.pool = f"10.{64 + (os.getpid() * 7 + _count * 13) % 180}.0.0/16"  # sandboxes'
        self.dir = tempfile.mkdtemp(prefix="cove-testnet-")
        self.proc = None
        self._down()
        try:
            self._up()
        except BaseException:
            self.close()
            raise

    # -- set-up ------------------------------------------------------------------------
    def _up(self):
        n, w = self.node, self.world
        _sh("ip", "netns", "add", n)
        _sh("ip", "netns", "add", w)
        for ns in (n, w):  # no IPv6 at all: nothing but what a test sends crosses the link
            for k in ("all", "default"):
                _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                    f"net.ipv6.conf.{k}.disable_ipv6=1")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "link", "add", self.node_link, "netns", n, "type", "veth",
            "peer", "name", self.world_link, "netns", w)
        _sh("ip", "-n", n, "addr", "add", NODE_IP + "/30", "dev", self.node_link)
        _sh("ip", "-n", w, "addr", "add", WORLD_IP + "/30", "dev", self.world_link)
        _sh("ip", "-n", n, "link", "set", self.node_link, "up")
        _sh("ip", "-n", w, "link", "set", self.world_link, "up")
        _sh("ip", "-n", n, "route", "add", "default", "via", WORLD_IP)
        # replies to whatever reached world: the node's link, and the sandboxes' own
        # addresses (a gate that forwarded); anything else is unreachable at once (a lookup
        # of the host's nameserver by a server here fails fast instead of waiting)
        _sh("ip", "-n", w, "route", "add", self.pool, "via", NODE_IP)
        _sh("ip", "-n", w, "route", "add", "unreachable", "default")
        for a in OFF_MACHINE + (RESOLVER,) + self.extra:
            _sh("ip", "-n", w, "addr", "add", a + "/32", "dev", "lo")
        known = ", ".join((WORLD_IP, RESOLVER) + self.extra)
        rules = "".join(f'    ip daddr {a} counter comment "{a}"\n' for a in OFF_MACHINE)
        self._table = (
            f"table inet {TABLE} {{}}\ndelete table inet {TABLE}\n"  # fresh counters
            f"table inet {TABLE} {{\n"
            "  chain pre {\n"
            "    type filter hook prerouting priority -300; policy accept;\n"
            f"{rules}"
            f'    meta nfproto ipv4 ip daddr != {{ {known}, {", ".join(OFF_MACHINE)} }} '
            'counter comment "other"\n'
            '    meta nfproto ipv6 counter comment "ipv6"\n'
            "  }\n"
            "}\n")
        _sh("ip", "netns", "exec", w, "nft", "-f", "-", input=self._table)
        with open(os.path.join(self.dir, "recorder.py"), "w") as f:
            f.write(RECORDER)
        self.log = open(os.path.join(self.dir, "recorder.log"), "w")
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{w}", "--", "python3",
             os.path.join(self.dir, "recorder.py"), self.dir,
             ",".join(map(str, TCP_PORTS)), ",".join(map(str, UDP_PORTS)),
             *OFF_MACHINE, RESOLVER], stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(self.dir, "ready")):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"test host recorder did not start: {self._log_text()}")
            time.sleep(0.05)

    def _log_text(self):
        try:
            with open(os.path.join(self.dir, "recorder.log")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def coved_args(self):
        """coved's resolver asks the test resolver, not the host's /etc/resolv.conf; its
        sandboxes' addresses come from the pool world routes back"""
        return ["--dns-upstream", RESOLVER, "--egress-pool", self.pool]

    # -- what world received -----------------------------------------------------------
    def counters(self):
        """{address or "other"/"ipv6": packets} of every nonzero counter"""
        out = json.loads(_sh("ip", "netns", "exec", self.world, "nft", "-j", "list", "table",
                             "inet", TABLE).stdout)
        got = {}
        for item in out.get("nftables", []):
            rule = item.get("rule")
            if not rule:
                continue
            for e in rule.get("expr", []):
                if "counter" in e and e["counter"]["packets"]:
                    got[rule.get("comment", "?")] = e["counter"]["packets"]
        return got

    def hits(self):
        """every connection and datagram the recorder got, oldest first"""
        try:
            with open(os.path.join(self.dir, "hits.log")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    def received(self):
        """(counters, recorder hits) of everything that reached an OFF_MACHINE address, or
        any address world does not know; queries to RESOLVER are the node's own, left out"""
        return self.counters(), [h for h in self.hits() if h["addr"] != RESOLVER]

    def assert_nothing_received(self, since=None):
        """since: a received() taken earlier; only what came after counts"""
        counters, hits = self.received()
        if since:
            c0, h0 = since
            counters = {k: v - c0.get(k, 0) for k, v in counters.items() if v > c0.get(k, 0)}
            hits = hits[len(h0):]
        assert not counters and not hits, \
            f"test hosts standing in for off-machine addresses received packets: " \
            f"{counters} {hits[:20]}"

    def reset(self):
        _sh("ip", "netns", "exec", self.world, "nft", "-f", "-", input=self._table)
        open(os.path.join(self.dir, "hits.log"), "w").close()

    def control(self):
        """Positive control: from the node's namespace (where coved's sandboxes' packets
        would come from if a gate let them by), one TCP connection to port 80 and one DNS
        datagram to port 53 of every OFF_MACHINE address; each must show up in the counters
        and the recorder. Raises when one does not; resets both afterwards."""
        import socket
        for a in OFF_MACHINE:
            s = socket_in(self.node)
            s.settimeout(10)
            try:
                s.connect((a, 80))
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                assert s.recv(256).endswith(b"TEST-HOST\n")
            finally:
                s.close()
            u = socket_in(self.node, socket.AF_INET, socket.SOCK_DGRAM)
            u.settimeout(10)
            try:
                u.sendto(b"\x12\x34\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00", (a, 53))
                assert u.recv(512)[:2] == b"\x12\x34"
            finally:
                u.close()
        counters = self.counters()
        seen = {(h["proto"], h["addr"]) for h in self.hits()}
        missing = [a for a in OFF_MACHINE if not counters.get(a) or ("tcp", a) not in seen
                   or ("udp", a) not in seen]
        assert not missing, f"the test hosts' recorder missed traffic to {missing}"
        self.reset()

    # -- tear-down ---------------------------------------------------------------------
    def _down(self):
        _sh("ip", "netns", "del", self.node, check=False)
        _sh("ip", "netns", "del", self.world, check=False)

    def close(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            self.proc = None
        self._down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def contained_coved(build_dir, templates_dir, log_dir, label, extra_args=()):
    """(coved, net): a Contained whose recorder passed its positive control, and a coved in
    its node namespace; both stopped on exit (coved's log kept as label)."""
    with Contained() as net:
        net.control()
        d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir, netns=net.node,
                  extra_args=list(extra_args) + net.coved_args())
        try:
            yield d, net
        finally:
            d.stop(keep_log_as=label)
