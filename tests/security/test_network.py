"""Host network services from inside a sandbox: nothing on the host is reachable (the
sandbox's network namespace has only lo). Addresses off this machine (metadata, private
gateways, public resolvers) are tried against a coved whose namespace routes them to test
hosts only (tests/lib/testnet.py), which must receive nothing."""
import os
import shutil
import socket
import subprocess
import tempfile

import pytest

from hostutil import Listener, host_ipv4
from secutil import sh
from testnet import contained_coved


@pytest.fixture(scope="module")
def contained(build_dir, templates_dir, log_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    with contained_coved(build_dir, templates_dir, log_dir, "network-contained",
                         ["--pool", "0"]) as e:
        yield e


@pytest.mark.root
def test_only_loopback_interface(client, sandbox):
    r = sh(client, sandbox["id"], "ls /sys/class/net 2>/dev/null || ip -o link")
    names = set(r["stdout"].split()) if "lo" in r["stdout"] else set()
    r2 = sh(client, sandbox["id"], "ip -o link | cut -d: -f2")
    links = {l.strip() for l in r2["stdout"].splitlines() if l.strip()}
    assert links == {"lo"}, f"interfaces inside the sandbox: {links} ({names})"


@pytest.mark.root
def test_host_tcp_services_unreachable(client, sandbox, coved):
    lo = Listener("127.0.0.1")
    anyl = Listener("0.0.0.0")
    try:
        # (addresses off this machine: test_off_machine_addresses_unreachable)
        targets = [f"127.0.0.1 {lo.port}", f"127.0.0.1 {anyl.port}",
                   f"127.0.0.1 {coved.port}"]
        targets += [f"{a} {anyl.port}" for a in host_ipv4()]
        targets += [f"{a} {coved.port}" for a in host_ipv4()]
        script = "".join(
            f"echo x | timeout 5 nc -w 2 {t} 2>/dev/null | grep -q . && echo REACHED:{t}\n"
            for t in targets)
        script += (f"timeout 5 wget -q -T 2 -O - http://127.0.0.1:{coved.port}/healthz "
                   f"2>/dev/null && echo REACHED:wget-api\n")
        r = sh(client, sandbox["id"], script, timeout=300)
        reached = [l for l in r["stdout"].splitlines() if l.startswith("REACHED")]
        assert not reached, f"host services reachable from the sandbox: {reached}"
        assert not lo.hits and not anyl.hits, \
            f"host listeners got connections from the sandbox: {lo.hits + anyl.hits}"
    finally:
        lo.close()
        anyl.close()


@pytest.mark.root
def test_off_machine_addresses_unreachable(contained):
    """metadata, private gateways and public resolvers by TCP, UDP, ICMP and DNS: refused in
    the sandbox, and the test hosts holding those addresses received nothing"""
    d, net = contained
    c = d.client
    sid = c.create(template="busybox")["id"]
    try:
        node = subprocess.run(["ip", "-n", net.node, "-o", "-4", "addr"], capture_output=True,
                              text=True).stdout
        node_ips = [ln.split()[3].split("/")[0] for ln in node.splitlines()
                    if not ln.split()[3].startswith("127.")]
        assert node_ips, node
        tcp = [f"{a} {p}" for a in ("169.254.169.254", "10.0.0.1", "10.0.2.2", "172.17.0.1",
                                    "192.168.0.1", "100.100.100.200") for p in (80, 22)]
        tcp += ["8.8.8.8 53", "1.1.1.1 443"] + [f"{a} {d.port}" for a in node_ips]
        script = "".join(
            f"echo x | timeout 5 nc -w 2 {t} 2>/dev/null | grep -q . && echo REACHED:{t}\n"
            for t in tcp)
        script += ("timeout 5 wget -q -T 2 -O - http://169.254.169.254/latest/meta-data/ "
                   "2>/dev/null && echo REACHED:metadata\n"
                   "for a in 8.8.8.8 1.1.1.1 169.254.169.254; do echo x | nc -u -w 1 $a 53;"
                   " echo x | nc -u -w 1 $a 9999; nslookup example.com $a;"
                   " ping -c 1 -W 1 $a; done 2>/dev/null; echo done\n")
        r = sh(c, sid, script, timeout=300)
        assert r["stdout"].endswith("done\n"), r
        reached = [ln for ln in r["stdout"].splitlines() if ln.startswith("REACHED")]
        assert not reached, f"off-machine addresses reachable from the sandbox: {reached}"
        net.assert_nothing_received()
        # control: the same script with the node's network instead of the sandbox's (what a
        # broken namespace gate would give) reaches every test host, and they record it
        out = _run_in_netns(net.node, script)
        # (not wget: the host's busybox wget may crash; the counters cover its target)
        for t in tcp[:-len(node_ips)]:
            assert f"REACHED:{t}\n" in out, (t, out)
        counters, hits = net.received()
        assert {h["addr"] for h in hits if h["proto"] == "udp"} >= \
            {"8.8.8.8", "1.1.1.1", "169.254.169.254"}, hits
        with pytest.raises(AssertionError):
            net.assert_nothing_received()
        net.reset()
    finally:
        c.remove(sid)


def _run_in_netns(netns, script):
    """script run by the host's busybox (the sandbox's tools) in the named namespace"""
    busybox = shutil.which("busybox")
    if not busybox:
        pytest.skip("no busybox on the host for the control run")
    bindir = tempfile.mkdtemp(prefix="cove-bb-")
    try:
        for applet in ("sh", "nc", "wget", "nslookup", "ping", "timeout", "grep", "echo"):
            os.symlink(busybox, os.path.join(bindir, applet))
        return subprocess.run([shutil.which("nsenter"), f"--net=/run/netns/{netns}", "--",
                               os.path.join(bindir, "sh"), "-c", script],
                              env={"PATH": bindir}, capture_output=True, text=True,
                              timeout=300).stdout
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


@pytest.mark.root
def test_coved_unix_socket_unreachable(client, sandbox, coved, helper, upload):
    socks = [os.path.join(coved.data, n) for n in os.listdir(coved.data)
             if n.endswith(".sock") or n == "api.sock"]
    # the data dir path does not exist inside; no unix socket of the host can be found
    script = "".join(f"[ -e {p} ] && echo VISIBLE:{p}\n" for p in socks + [coved.data])
    script += "find / -xdev -type s 2>/dev/null | head -50\n"
    r = sh(client, sandbox["id"], script)
    assert "VISIBLE:" not in r["stdout"], r["stdout"]
    for p in socks:
        assert p not in r["stdout"]
    # abstract unix sockets are per network namespace: a host one is not reachable
    name = f"cove-sec-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + name)
    s.listen(1)
    s.setblocking(False)
    try:
        upload(sandbox["id"], helper("sysprobe"), "/tmp/sysprobe")
        r = sh(client, sandbox["id"], f"/tmp/sysprobe --connect-abstract {name}")
        assert r["stdout"].strip() != "connect=OK", "host abstract unix socket reachable"
        try:
            c, _ = s.accept()
            c.close()
            pytest.fail("host abstract socket accepted a connection from the sandbox")
        except BlockingIOError:
            pass
    finally:
        s.close()
