"""Attacks on the egress gateway from inside a sandbox that has a policy (so it does have a
link): the host, coved's API, another sandbox, the metadata address and private ranges stay
unreachable by address and by names whose answers point there; UDP other than DNS and ICMP
are dropped; domain fronting by address and other tricks are refused and audited."""
import subprocess
import time

import pytest

from egressenv import UP1, UP2, running, sandboxes, wait_audit

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def env(build_dir, templates_dir, log_dir):
    with running(build_dir, templates_dir, log_dir, "egress-attacks") as e:
        yield e


@pytest.fixture
def mk(env):
    with sandboxes(env[0].client) as make:
        yield lambda allow=(), template="busybox": make(template=template,
                                                         egress={"allow": list(allow)})


def run(c, sid, script, timeout=120):
    r = c.exec(sid, ["/bin/sh", "-c", script], timeout=timeout)
    return r["stdout"] + r["stderr"]


def host_ipv4():
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    return [l.split()[3].split("/")[0] for l in out.splitlines()
            if not l.split()[3].startswith("127.") and not l.split()[1].startswith("cvt")]


def test_internal_addresses_unreachable_by_address(env, mk):
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
               ("172.17.0.1", 80), ("100.100.100.200", 80)]
    targets += [(a, d.port) for a in host_ipv4()]
    script = "".join(
        f"printf 'GET /healthz HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' | "
        f"timeout 6 nc -w 3 {a} {p} 2>/dev/null | grep -q . && echo REACHED:{a}:{p}\n"
        for a, p in targets)
    out = run(c, sid, script)
    assert "REACHED" not in out, out
    ev = wait_audit(c, sid, lambda e: e["kind"] == "egress" and
                    e["detail"]["dst"] == "169.254.169.254")
    assert ev and ev[0]["verdict"] == "deny"
    ev = wait_audit(c, sid, lambda e: e["kind"] == "egress" and
                    e["detail"]["dst"] == "10.1.2.3")
    assert ev and ev[0]["verdict"] == "deny"


def test_names_pointing_inside_are_refused(env, mk):
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


def test_udp_icmp_and_other_resolvers(env, mk):
    d, up = env
    c = d.client
    sid = mk(allow=["allowed.test"])
    out = run(c, sid, f"echo leak | nc -u -w 1 {UP1} 9999; echo leak | nc -u -w 1 {UP1} 53;"
                      f"ping -c 1 -W 2 {UP1} && echo PING-OK;"
                      f"nslookup allowed.test 8.8.8.8; nslookup allowed.test {UP2}")
    assert "PING-OK" not in out
    time.sleep(0.5)
    assert up.udp_log() == ""
    # any resolver address reaches the node resolver (and only it)
    assert out.count(f"Address: {UP1}") >= 2 or out.count(UP1) >= 2, out


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
    assert "hello" not in out.replace(f"hello other.test {UP2}", "")
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
