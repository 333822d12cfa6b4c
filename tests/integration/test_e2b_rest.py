"""The E2B surface beyond what the SDK suite reaches easily: passwordless sudo as `user` in
base through cove's own API, and a gzip decompression bomb on the E2B upload route."""
import gzip
import http.client
import json
import os

import pytest

from cove import free_port


def test_base_passwordless_sudo_as_user(client):
    """The base template's promise: `user` runs sudo without a password, gets the
    sandbox's root (uid 0 inside), and sudo says nothing on stderr (the hostname resolves)."""
    sb = client.create(template="base")
    try:
        sid = sb["id"]
        r = client.exec(sid, ["sudo", "-n", "id", "-u"], user="user")
        assert r["exit_code"] == 0, r
        assert r["stdout"] == "0\n"
        assert r["stderr"] == "", r["stderr"]
        r = client.exec(sid, ["sh", "-c", "sudo -n sh -c 'echo ok > /root/by-sudo' && "
                                          "sudo -n cat /root/by-sudo && id -u"], user="user")
        assert r["stdout"] == "ok\n1000\n", r
        r = client.exec(sid, ["hostname"], user="user")
        assert r["stdout"].strip() == sid
    finally:
        client.remove(sb["id"])


def _bomb(inflated, member=16 << 20):
    """gzip members of zeros inflating to `inflated` bytes (one member compressed once)."""
    one = gzip.compress(b"\0" * member, 9)
    return one * (inflated // member), (inflated // member) * member


def _post(port, path, headers, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def test_gzip_upload_bomb_is_limit_exceeded(coved_factory):
    """A gzip upload that inflates beyond the sandbox's disk is refused (413, the message
    says limit_exceeded) and leaves no file; one that fits is written whole."""
    api, sbx_port = free_port(), free_port()
    d = coved_factory(extra_args=["--e2b-api-listen", f"127.0.0.1:{api}",
                                  "--e2b-sandbox-listen", f"127.0.0.1:{sbx_port}"])
    c = d.client
    sb = c.create(template="busybox", disk_mb=32)
    sid = sb["id"]
    key = "e2b_" + c.key.encode().hex()
    conn = http.client.HTTPConnection("127.0.0.1", api, timeout=30)
    conn.request("GET", f"/sandboxes/{sid}", headers={"X-API-KEY": key})
    info = json.loads(conn.getresponse().read())
    conn.close()
    h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
         "X-Access-Token": info["envdAccessToken"], "Content-Type": "application/octet-stream",
         "Content-Encoding": "gzip"}
    body, size = _bomb(48 << 20)  # 48 MiB of zeros: more than the 32 MiB disk
    assert len(body) < 1 << 20
    st, j = _post(sbx_port, "/files?path=/tmp/bomb&username=root", h, body)
    assert st == 413, (st, j)
    assert j["code"] == 413 and "limit_exceeded" in j["message"], j
    r = c.exec(sid, ["sh", "-c", "ls -a /tmp"])
    assert "bomb" not in r["stdout"], r
    # a gzip body that fits: written as its inflated bytes
    data = os.urandom(1000) + b"x" * 100000
    st, j = _post(sbx_port, "/files?path=/tmp/fits&username=root", h, gzip.compress(data))
    assert st == 200, (st, j)
    assert c.get_file(sid, "/tmp/fits").body == data
