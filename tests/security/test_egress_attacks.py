"""Attacks on the egress gateway from inside a sandbox that has a policy (so it does have a
link): the host, coved's API, another sandbox, the metadata address and private ranges stay
unreachable by address and by names whose answers point there; UDP other than DNS and ICMP
are dropped; domain fronting by address and other tricks are refused and audited.

coved runs in a network namespace whose only route leads to test hosts (tests/lib/
testnet.py): every off-machine address tried here (metadata, private gateways, public
resolvers) belongs to a test host that counts what it receives, and each test asserts it
received nothing; test_broken_gate_is_seen_by_the_test_hosts shows that it would."""
import subprocess
import time

import pytest

from egressenv import UP1, UP2, running, sandboxes, start_coved, wait_audit
from testnet import Contained

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def contained(build_dir, templates_dir, log_dir):
    with running(build_dir, templates_dir, log_dir, "egress-attacks") as e:
        e[1].world.control()  # the test hosts are reachable from coved's namespace and record
        yield e


@pytest.fixture
def env(contained):
    return contained


@pytest.fixture
def net(contained):
    """the test hosts; what they had received when the test started"""
    n = contained[1].world
    return n, n.received()


@pytest.fixture
def mk(env):
    with sandboxes(env[0].client) as make:
        yield lambda allow=(), template="busybox": make(template=template,
                                                         egress={"allow": list(allow)})


def run(c, sid, script, timeout=120):
    r = c.exec(sid, ["/bin/sh", "-c", script], timeout=timeout)
    return r["stdout"] + r["stderr"]


def node_ipv4(netns):
    """the addresses of coved's own namespace (its "host"), loopback aside"""
    out = subprocess.run(["ip", "-n", netns, "-o", "-4", "addr"], capture_output=True,
                         text=True).stdout
    return [l.split()[3].split("/")[0] for l in out.splitlines()
            if not l.split()[3].startswith("127.")]


def attack_by_address(c, sid, targets):
    script = "".join(
        f"printf 'GET /healthz HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' | "
        f"timeout 6 nc -w 3 {a} {p} 2>/dev/null | grep -q . && echo REACHED:{a}:{p}\n"
        for a, p in targets)
    return run(c, sid, script)


def test_internal_addresses_unreachable_by_address(env, mk, net):
    d, _ = env
    c = d.client
    # everything in the policy, so only the gateway's own rules can refuse
    sid = mk(allow=["allowed.test", "0.0.0.0/0:1", "allowed.test:80"])
    other = mk(allow=["allowed.test"])
    other_ip = c.get(f"/v1/sandboxes/{other}/egress")["address"]
    run(c, other, "nohup nc -lk -p 8080 -e echo OTHER-SANDBOX >/dev/null 2>&1 &")
    my_gw = c.get(f"/v1/sandboxes/{sid}/egress")["address"].rsplit(".", 1)[0] + ".1"
    targets = [("127.0.0.1", d.port), (my_gw, d.port), (my_gw, 22), (other_ip, 8080),
               ("169.254.169.254", 80), ("10.1.2.3", 80), ("192.168.0.1", 80),
               ("172.17.0.1", 80), ("100.100.100.200", 80), ("10.0.0.1", 80),
               ("10.0.2.2", 80), ("8.8.8.8", 443), ("1.1.1.1", 80)]
    targets += [(a, d.port) for a in node_ipv4(d.netns)]
    out = attack_by_address(c, sid, targets)
    assert "REACHED" not in out, out
    net[0].assert_nothing_received(since=net[1])
    ev = wait_audit(c, sid, lambda e: e["kind"] == "egress" and
                    e["detail"]["dst"] == "169.254.169.254")
    assert ev and ev[0]["verdict"] == "deny"
    ev = wait_audit(c, sid, lambda e: e["kind"] == "egress" and
                    e["detail"]["dst"] == "10.1.2.3")
    assert ev and ev[0]["verdict"] == "deny"


def test_names_pointing_inside_are_refused(env, mk, net):
    d, _ = env
    c = d.client
    sid = mk(allow=["lo.test", "meta.test", "priv.test"])
    out = run(c, sid, "for n in lo.test meta.test priv.test; do nslookup $n; done")
    for a in ("127.0.0.1", "169.254.169.254", "10.1.2.3"):
        assert f"Address: {a}" not in out, out
    for n in ("lo.test", "meta.test", "priv.test"):
        ev = wait_audit(c, sid, lambda e, n=n: e["kind"] == "dns" and e["detail"]["name"] == n)
        assert ev and "rebinding" in ev[0]["detail"]["reason"]
    # an allow address rule naming the range lets the answer through (operator's choice)
    c.put(f"/v1/sandboxes/{sid}/egress", {"egress": {"allow": ["priv.test", "10.1.2.0/24"]}})
    assert "10.1.2.3" in run(c, sid, "nslookup priv.test")
    net[0].assert_nothing_received(since=net[1])


def test_udp_icmp_and_other_resolvers(env, mk, net):
    d, up = env
    c = d.client
    sid = mk(allow=["allowed.test"])
    out = run(c, sid, f"echo leak | nc -u -w 1 {UP1} 9999; echo leak | nc -u -w 1 {UP1} 53;"
                      f"echo leak | nc -u -w 1 8.8.8.8 9999; ping -c 1 -W 2 8.8.8.8;"
                      f"ping -c 1 -W 2 {UP1} && echo PING-OK;"
                      f"nslookup allowed.test 8.8.8.8; nslookup allowed.test 1.1.1.1;"
                      f"nslookup allowed.test {UP2}")
    assert "PING-OK" not in out
    time.sleep(0.5)
    assert up.udp_log() == ""
    # any resolver address reaches the node resolver (and only it)
    assert out.count(f"Address: {UP1}") >= 3 or out.count(UP1) >= 3, out
    net[0].assert_nothing_received(since=net[1])


def test_fronting_by_address_is_refused(env, mk):
    d, up = env
    c = d.client
    sid = mk(template="base", allow=["allowed.test", "other.test"])
    before = len(up.requests())
    # other.test's pin makes UP2:80/443 reachable under some name, so the proxy connects
    # upstream before the name is read (early connect): the refusal must still send nothing
    out = run(c, sid, "curl -sS -m 5 http://other.test/ >/dev/null;"  # pins other.test → UP2
                      f"curl -sS -m 5 -k --resolve allowed.test:443:{UP2} https://allowed.test/;"
                      f"curl -sS -m 5 --resolve allowed.test:80:{UP2} http://allowed.test/;"
                      "echo done")
    assert "hello" not in out.replace(f"hello other.test {UP2}", ""), out
    got = up.requests()[before:]
    assert [r["headers"].get("Host") for r in got] == ["other.test"], got
    ev = wait_audit(c, sid, lambda e: e["kind"] == "egress" and e["verdict"] == "deny" and
                    e["detail"]["dst"] == UP2)
    assert {e["detail"]["proto"] for e in ev} >= {"tls", "http"}
    assert all("DNS query" in e["detail"]["reason"] for e in ev)


def test_malformed_announcements_are_refused(env, mk):
    d, _ = env
    c = d.client
    sid = mk(allow=["allowed.test", "other.test"])
    out = run(c, sid,
              "nslookup allowed.test >/dev/null;"
              f"printf 'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\nHost: other.test\\r\\n\\r\\n'"
              f" | nc -w 3 {UP1} 80;"
              f"printf 'GET http://other.test/ HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n'"
              f" | nc -w 3 {UP1} 80;"
              f"printf 'GET / HTTP/1.1\\r\\nHost: allowed.test:81\\r\\n\\r\\n' | nc -w 3 {UP1} 80;"
              f"printf 'SSH-2.0-x\\r\\n' | nc -w 3 {UP1} 80;"
              f"printf '\\x16\\x03\\x01\\x00\\x05\\x01\\x00\\x00\\x01\\xff' | nc -w 3 {UP1} 443;"
              "echo done")
    assert "hello" not in out and "HTTP/1" not in out
    ev = wait_audit(c, sid, lambda e: e["kind"] == "egress")
    assert len([e for e in ev if e["verdict"] == "deny"]) >= 5
    assert not [e for e in ev if e["verdict"] == "allow"]


def test_spoofed_source_address_is_dropped(env, mk):
    d, up = env
    c = d.client
    sid = mk(allow=["allowed.test"])
    victim = mk(allow=["0.0.0.0/0"])
    vip = c.get(f"/v1/sandboxes/{victim}/egress")["address"]
    # sandbox root may change its own address; the gateway only admits the one it gave
    out = run(c, sid, f"ip addr flush dev eth0; ip addr add {vip}/30 dev eth0;"
                      f"ip route add default via {vip.rsplit('.', 1)[0]}.1 2>/dev/null;"
                      f"echo x | nc -w 3 {UP1} 2222 && echo SPOOF-OK; "
                      f"echo spoof | nc -u -w 1 {UP1} 9999; true")
    assert "SSH" not in out and "SPOOF-OK" not in out
    assert up.udp_log() == ""


def test_broken_gate_is_seen_by_the_test_hosts(build_dir, templates_dir, log_dir):
    """The test hosts would see a gate that let packets by: with coved's nftables rules of
    its own namespace flushed and forwarding on there, the same attack by address reaches
    them (counted, recorded, answered), and nothing else than the test hosts is reachable."""
    with Contained() as n:
        d = start_coved(build_dir, templates_dir, log_dir, world=n)
        try:
            c = d.client
            sid = c.create(template="busybox", egress={"allow": ["allowed.test"]})["id"]
            mine = c.get(f"/v1/sandboxes/{sid}/egress")["address"]
            # the gate works: refused, nothing received
            out = attack_by_address(c, sid, [("169.254.169.254", 80), ("10.0.0.1", 80)])
            assert "REACHED" not in out, out
            n.assert_nothing_received()
            # break it, in coved's own (test) namespace only
            tables = subprocess.run(["ip", "netns", "exec", n.node, "nft", "list", "tables"],
                                    capture_output=True, text=True, check=True).stdout.split()
            table = tables[tables.index("inet") + 1]
            for chain in ("sbx_pre", "sbx_fwd"):
                subprocess.run(["ip", "netns", "exec", n.node, "nft", "flush", "chain", "inet",
                                table, chain], check=True)
            subprocess.run(["ip", "netns", "exec", n.node, "sysctl", "-q", "-w",
                            "net.ipv4.ip_forward=1"], check=True)
            out = attack_by_address(c, sid, [("169.254.169.254", 80), ("10.0.0.1", 80)])
            assert "REACHED:169.254.169.254:80" in out and "REACHED:10.0.0.1:80" in out, out
            counters, hits = n.received()
            assert counters.get("169.254.169.254") and counters.get("10.0.0.1"), counters
            assert {(h["addr"], h["peer"]) for h in hits} == \
                {("169.254.169.254", mine), ("10.0.0.1", mine)}, hits
            with pytest.raises(AssertionError):
                n.assert_nothing_received()
        finally:
            d.stop(keep_log_as="egress-broken-gate")
