"""Host network services from inside a sandbox: nothing on the host is reachable (the
sandbox's network namespace has only lo)."""
import os
import socket

import pytest

from hostutil import Listener, host_ipv4
from secutil import sh


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
        targets = [f"127.0.0.1 {lo.port}", f"127.0.0.1 {anyl.port}",
                   f"127.0.0.1 {coved.port}", "169.254.169.254 80", "10.0.0.1 80",
                   "10.0.2.2 80", "172.17.0.1 80", "192.168.0.1 80"]
        targets += [f"{a} {anyl.port}" for a in host_ipv4()]
        targets += [f"{a} {coved.port}" for a in host_ipv4()]
        script = "".join(
            f"echo x | timeout 5 nc -w 2 {t} 2>/dev/null | grep -q . && echo REACHED:{t}\n"
            for t in targets)
        script += (f"timeout 5 wget -q -T 2 -O - http://127.0.0.1:{coved.port}/healthz "
                   f"2>/dev/null && echo REACHED:wget-api\n"
                   f"timeout 5 wget -q -T 2 -O - http://169.254.169.254/latest/meta-data/ "
                   f"2>/dev/null && echo REACHED:metadata\n")
        r = sh(client, sandbox["id"], script, timeout=300)
        reached = [l for l in r["stdout"].splitlines() if l.startswith("REACHED")]
        assert not reached, f"host services reachable from the sandbox: {reached}"
        assert not lo.hits and not anyl.hits, \
            f"host listeners got connections from the sandbox: {lo.hits + anyl.hits}"
    finally:
        lo.close()
        anyl.close()


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
