"""Egress gateway, from inside real sandboxes (docs/egress.md): a policy lets a sandbox reach
exactly the names it allows, over HTTP (Host) and TLS (SNI), by name through the node
resolver; everything else fails and is audited; a policy can change live; the audit chain
verifies. Upstream servers live in their own network namespace (tests/lib/egressenv.py)."""
import os
import time

import pytest

from egressenv import UP1, UP2, audit, running, sandboxes, wait_audit

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def env(build_dir, templates_dir, log_dir):
    with running(build_dir, templates_dir, log_dir, "egress") as e:
        yield e


@pytest.fixture
def mk(env):
    with sandboxes(env[0].client, template="base") as make:

        def mk_(allow=(), deny=(), template="base", egress=True):
            fields = {"egress": {"allow": list(allow), "deny": list(deny)}} if egress else {}
            return make(template=template, **fields)

        yield mk_


def run(c, sid, script, timeout=60):
    r = c.exec(sid, ["/bin/sh", "-c", script], timeout=timeout)
    return r["exit_code"], r["stdout"], r["stderr"]


def test_sandbox_without_egress_has_no_network(env, mk):
    d, _ = env
    sid = mk(template="busybox", egress=False)
    _, out, _ = run(d.client, sid, "ip -o link | cut -d: -f2; nslookup allowed.test 2>&1")
    assert out.split()[0] == "lo" and "eth0" not in out
    assert UP1 not in out
    r = d.client.get(f"/v1/sandboxes/{sid}/egress")
    assert r == {"egress": {"allow": [], "deny": []}, "address": None}


def test_allowed_name_over_http_and_tls(env, mk):
    d, _ = env
    sid = mk(allow=["allowed.test"])
    rc, out, err = run(d.client, sid, "curl -sS -m 10 http://allowed.test/ && "
                                      "curl -sS -m 10 -k https://allowed.test/")
    assert rc == 0, err
    assert out == f"hello allowed.test {UP1}\nhello allowed.test {UP1}\n"
    ev = wait_audit(d.client, sid, lambda e: e["kind"] == "egress" and e["verdict"] == "allow")
    kinds = {(e["detail"].get("proto"), e["detail"].get("host") or e["detail"].get("sni"))
             for e in ev}
    assert ("http", "allowed.test") in kinds and ("tls", "allowed.test") in kinds
    assert all(e["detail"]["rule"] == "allowed.test" for e in ev)
    assert all(e["detail"]["dst"] == UP1 for e in ev)


def test_busybox_by_name_with_nc(env, mk):
    d, _ = env
    sid = mk(template="busybox", allow=["allowed.test:80"])
    rc, out, _ = run(d.client, sid,
                     "nslookup allowed.test >/dev/null && printf 'GET / HTTP/1.0\\r\\n"
                     f"Host: allowed.test\\r\\n\\r\\n' | nc -w 5 {UP1} 80")
    assert f"hello allowed.test {UP1}" in out


def test_disallowed_name_fails_and_is_logged(env, mk):
    d, _ = env
    sid = mk(allow=["allowed.test"], deny=["www.allowed.test"])
    rc, out, _ = run(d.client, sid, "curl -sS -m 5 http://other.test/; echo rc=$?")
    assert "hello" not in out and "rc=0" not in out
    # the name does not resolve: a DNS refusal is audited
    ev = wait_audit(d.client, sid, lambda e: e["kind"] == "dns" and
                    e["detail"]["name"] == "other.test")
    assert ev and ev[0]["verdict"] == "deny"
    # forcing the address does not help: the proxy refuses the Host
    rc, out, _ = run(d.client, sid,
                     f"curl -sS -m 5 --resolve other.test:80:{UP2} http://other.test/; echo rc=$?")
    assert "hello" not in out and "rc=0" not in out
    ev = wait_audit(d.client, sid, lambda e: e["kind"] == "egress" and
                    e["detail"].get("host") == "other.test")
    assert ev and ev[0]["verdict"] == "deny" and ev[0]["detail"]["dst"] == UP2
    # deny before allow
    rc, out, _ = run(d.client, sid, "curl -sS -m 5 http://www.allowed.test/; echo rc=$?")
    assert "hello" not in out
    ev = wait_audit(d.client, sid, lambda e: e["kind"] == "dns" and
                    e["detail"]["name"] == "www.allowed.test")
    assert ev and ev[0]["detail"]["rule"] == "www.allowed.test"


def test_address_rule_for_a_server_that_speaks_first(env, mk):
    d, _ = env
    sid = mk(template="busybox", allow=[f"{UP1}/32:2222"])
    _, out, _ = run(d.client, sid, f"nc -w 3 {UP1} 2222 </dev/null")
    assert "SSH-2.0-cove-test" in out
    _, out, _ = run(d.client, sid, f"nc -w 3 {UP2} 2222 </dev/null; true")
    assert "SSH" not in out


def test_bad_policies_are_refused(env, mk):
    d, _ = env
    c = d.client
    for bad in ({"allow": ["a..b"]}, {"allow": "x.com"}, {"allow": ["10.0.0.1/33"]},
                {"allow": ["x.com:70000"]}, {"permit": []}, ["x.com"]):
        c.expect_error("POST", "/v1/sandboxes", 400, "bad_request",
                       {"template": "busybox", "egress": bad})
    sid = mk(template="busybox", allow=["allowed.test"])
    c.expect_error("PUT", f"/v1/sandboxes/{sid}/egress", 400, "bad_request",
                   {"egress": {"allow": ["*.*"]}})
    c.expect_error("PUT", "/v1/sandboxes/sbx_nope/egress", 404, "not_found",
                   {"egress": {"allow": []}})
    r = c.get(f"/v1/sandboxes/{sid}/egress")
    assert r["egress"] == {"allow": ["allowed.test"], "deny": []}
    assert r["address"].startswith(f"10.{d.pool_octet}.")


HOLD = r'''
import socket, time, sys
s = socket.create_connection(("allowed.test", 7000), timeout=5)
s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test:7000\r\n\r\n")
s.recv(4096)
out = open("/tmp/hold.out", "w")
while True:
    try:
        s.sendall(b"ping\n")
        b = s.recv(100)
        if not b:
            raise OSError("eof")
        out.write("ok\n"); out.flush()
    except OSError as e:
        out.write("closed %s\n" % e); out.flush(); break
    time.sleep(0.1)
'''


def test_live_policy_change_closes_forbidden_connections(env, mk):
    d, _ = env
    c = d.client
    sid = mk(allow=["allowed.test", "other.test"])
    c.put_file(sid, "/tmp/hold.py", HOLD.encode())
    run(c, sid, "nohup python3 /tmp/hold.py >/tmp/hold.err 2>&1 &")

    def hold_out():
        r = c.get_file(sid, "/tmp/hold.out")
        return r.body.decode() if r.status == 200 else ""

    deadline = time.time() + 15
    while "ok" not in hold_out():
        assert time.time() < deadline, "held connection never worked"
        time.sleep(0.1)
    # a change that still allows it keeps it open
    c.put(f"/v1/sandboxes/{sid}/egress", {"egress": {"allow": ["allowed.test:7000"]}})
    time.sleep(0.5)
    assert "closed" not in hold_out()
    r = c.put(f"/v1/sandboxes/{sid}/egress", {"egress": {"allow": ["other.test"]}})
    assert r["egress"]["allow"] == ["other.test"]
    deadline = time.time() + 5
    while "closed" not in hold_out():
        assert time.time() < deadline, f"connection still open: {hold_out()[-200:]}"
        time.sleep(0.05)
    ev = wait_audit(c, sid, lambda e: e["action"] == "close")
    assert ev and ev[0]["verdict"] == "deny" and ev[0]["detail"]["port"] == 7000
    # and new connections follow the new policy
    _, out, _ = run(c, sid, "curl -sS -m 5 http://allowed.test/; curl -sS -m 5 http://other.test/")
    assert "hello allowed.test" not in out and f"hello other.test {UP2}" in out


def test_policy_given_later_attaches_a_link(env, mk):
    d, _ = env
    c = d.client
    sid = mk(template="busybox", egress=False)
    r = c.put(f"/v1/sandboxes/{sid}/egress", {"egress": {"allow": ["allowed.test"]}})
    assert r["address"]
    _, out, _ = run(c, sid, "nslookup allowed.test")
    assert UP1 in out


def test_audit_filters_and_chain(env, mk):
    d, _ = env
    c = d.client
    sid = mk(template="busybox", allow=["allowed.test"])
    run(c, sid, "nslookup nope.test; true")
    ev = wait_audit(c, sid, lambda e: e["kind"] == "dns")
    assert ev and all(e["sandbox"] == sid and e["tenant"] == "default" for e in ev)
    seqs = [e["seq"] for e in audit(c, sid)]
    assert seqs == sorted(seqs)
    assert audit(c, sid, after=seqs[-1]) == []
    assert all(e["kind"] == "dns" for e in audit(c, sid, kind="dns"))
    v = c.get("/v1/audit/verify")
    assert v["ok"] is True and v["checked"] >= len(seqs) and v["first_broken_seq"] is None
    c.expect_error("GET", "/v1/audit?limit=0", 400, "bad_request")


def _vm_missing():
    import os
    if not os.access(os.environ.get("COVE_QEMU", "/usr/bin/qemu-system-x86_64"), os.X_OK):
        return "QEMU not installed (scripts/install-deps)"
    kdir = os.environ.get("COVE_VM_KERNEL_DIR", "/var/cache/cove/vm")
    if not os.access(os.path.join(kdir, "vmlinux"), os.R_OK):
        return f"no guest kernel in {kdir} (scripts/install-deps)"
    return None


def test_vm_sandbox_egress_by_name_and_denied(env):
    """A vm sandbox goes through the same gateway: QEMU's netns gets the sandbox's link,
    the guest's packets are masqueraded to the sandbox address, the host rules apply."""
    why = _vm_missing()
    if why:
        pytest.skip(why)
    d, _ = env
    c = d.client
    sid = c.create(template="busybox", runtime="vm",
                   egress={"allow": ["allowed.test:80"], "deny": []})["id"]
    try:
        rc, out, err = run(c, sid, "cat /etc/resolv.conf; nslookup allowed.test")
        assert rc == 0 and UP1 in out, (out, err)
        rc, out, _ = run(c, sid, "printf 'GET / HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' "
                                 f"| nc -w 5 {UP1} 80")
        assert f"hello allowed.test {UP1}" in out, out
        # a name the policy does not allow: not resolved, not reachable
        _, out, _ = run(c, sid, "nslookup other.test 2>&1")
        assert UP2 not in out, out
        _, out, _ = run(c, sid, "printf 'GET / HTTP/1.0\\r\\nHost: other.test\\r\\n\\r\\n' "
                                f"| nc -w 3 {UP2} 80")
        assert "hello" not in out, out
    finally:
        c.remove(sid)


def test_gateway_thread_runs_at_a_raised_priority(env):
    """The proxy's thread (cove-egress) runs at nice -10, so its wake-ups on a busy node do not
    queue behind sandboxes' and other work at the default priority; it stays a normal-class
    thread (not real-time), so it still shares the CPU."""
    d, _ = env
    pid = d.proc.pid
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:  # coved's short-lived threads (connections, teardowns) may end meanwhile
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != "cove-egress":
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        found.append((int(fields[16]), int(fields[38])))  # nice, policy (stat fields 19, 41)
    assert found == [(-10, 0)], found  # one gateway thread, nice -10, SCHED_OTHER
    with open(f"/proc/{pid}/stat") as f:  # the main thread: not raised with it
        assert int(f.read().rsplit(")", 1)[1].split()[16]) == 0
