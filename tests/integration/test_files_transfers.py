"""File transfers over the guest channel: a download a client abandons or reads slowly never
holds the sandbox's other calls, and reads of pseudo-files, devices and files that change
while read always get a well-formed answer (docs/api.md "Files", docs/guest-protocol.md
WINDOW/CANCEL). Each case through the cove API and the E2B envd file route."""
import hashlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.parse

import pytest

from cove import free_port, poll

pytestmark = pytest.mark.root

BOUND_S = 30  # a call to a sandbox answers within this, however busy its transfers are


def cpu_ticks(pid):
    """utime + stime of pid, in clock ticks (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def q(path):
    return urllib.parse.quote(path, safe="")


def raw_get_abandon(port, target, headers, nbytes=200):
    """GET target, read the headers and nbytes of the body, then hang up. Returns the status
    line and the headers."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        req = f"GET {target} HTTP/1.1\r\nHost: x\r\n" + \
            "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        s.sendall(req.encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"connection closed before the headers: {buf!r}"
            buf += chunk
        head, body = buf.split(b"\r\n\r\n", 1)
        while len(body) < nbytes:
            chunk = s.recv(65536)
            assert chunk, "connection closed before the first bytes"
            body += chunk
        return head.decode()
    finally:
        s.close()


def exec_promptly(client, sid, cmd="echo alive"):
    """An exec answers within BOUND_S (the HTTP timeout bounds the wait)."""
    t = time.time()
    r = client.request("POST", f"/v1/sandboxes/{sid}/exec",
                       {"shell": cmd, "wait": True, "timeout_s": 20}, timeout=BOUND_S)
    assert r.status == 200, r
    return r.json()["stdout"], time.time() - t


def cpu_settles(pid, window_s=2.0, max_ticks=15, timeout=60):
    """Waits until pid used at most max_ticks of CPU over window_s (coved stopped draining);
    AssertionError with the last figure when it never does within timeout."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        a = cpu_ticks(pid)
        time.sleep(window_s)  # a measurement window, not a wait for a condition
        last = cpu_ticks(pid) - a
        if last <= max_ticks:
            return last
    raise AssertionError(f"coved kept using CPU: {last} ticks in {window_s} s")


# -- E2B envd routes -------------------------------------------------------------------

class E2B:
    """A coved with both E2B listeners and one sandbox made through the E2B API."""

    def __init__(self, coved):
        self.d = coved
        self.api, self.sbx = coved.e2b_api, coved.e2b_sbx
        key = "e2b_" + coved.client.key.encode().hex()

        def listening():
            try:
                socket.create_connection(("127.0.0.1", self.api), timeout=5).close()
                return True
            except OSError:
                return False
        poll(listening, timeout=30, what="the E2B API listener")
        c = http.client.HTTPConnection("127.0.0.1", self.api, timeout=120)
        c.request("POST", "/sandboxes", body=json.dumps({"templateID": "busybox"}),
                  headers={"X-API-KEY": key, "Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        c.close()
        assert r.status in (200, 201), body
        j = json.loads(body)
        self.id, self.token = j["sandboxID"], j["envdAccessToken"]

    def headers(self):
        return {"E2b-Sandbox-Id": self.id, "X-Access-Token": self.token}

    def get(self, path, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.sbx, timeout=timeout)
        try:
            c.request("GET", f"/files?path={q(path)}", headers=self.headers())
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()


@pytest.fixture
def e2b(coved_factory):
    api, sbx = free_port(), free_port()
    d = coved_factory(extra_args=["--e2b-api-listen", f"127.0.0.1:{api}",
                                  "--e2b-sandbox-listen", f"127.0.0.1:{sbx}"])
    d.e2b_api, d.e2b_sbx = api, sbx
    e = E2B(d)
    yield e
    d.client.remove(e.id)


@pytest.fixture
def own(coved_factory):
    """A coved of the test's own (its CPU time is the test's to measure) and a sandbox."""
    d = coved_factory()
    sid = d.client.create(template="busybox")["id"]
    yield d, sid
    d.client.remove(sid)


# -- abandoned and slow downloads ------------------------------------------------------

def test_abandoned_download_of_huge_file_frees_the_sandbox(own):
    """100 GB sparse file, 200 bytes read, client gone: the next exec answers at once and
    coved stops spending CPU on the transfer."""
    d, sid = own
    c = d.client
    c.exec(sid, "truncate -s 100G /tmp/f")
    head = raw_get_abandon(c.port, f"/v1/sandboxes/{sid}/files?path=/tmp/f",
                           {"Authorization": f"Bearer {c.key}"})
    assert head.startswith("HTTP/1.1 200"), head
    out, took = exec_promptly(c, sid)
    assert out == "alive\n"
    ticks = cpu_settles(d.proc.pid)
    print(f"exec after an abandoned 100 GB download: {took * 1000:.0f} ms; coved then used "
          f"{ticks} CPU ticks in 2 s")
    # and the files API of that sandbox works again
    c.put_file(sid, "/tmp/small", b"small")
    assert c.get_file(sid, "/tmp/small").body == b"small"


def test_stalled_download_does_not_hold_execs_and_resumes_intact(client, sandbox):
    """A client that stops reading a 32 MiB download: execs and other file calls on that
    sandbox go on; the download then finishes with the right bytes."""
    sid = sandbox["id"]
    client.exec(sid, "head -c 33554432 /dev/urandom > /tmp/r")
    want = client.exec(sid, "sha256sum /tmp/r")["stdout"].split()[0]
    conn = http.client.HTTPConnection(client.host, client.port, timeout=120)
    conn.request("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/r",
                 headers={"Authorization": f"Bearer {client.key}"})
    r = conn.getresponse()
    assert r.status == 200
    first = r.read(4096)  # then read nothing while the sandbox is used
    for i in range(5):
        out, _ = exec_promptly(client, sid, f"echo {i}")
        assert out == f"{i}\n"
    client.put_file(sid, "/tmp/other", b"x" * 100000)
    assert client.get_file(sid, "/tmp/other").body == b"x" * 100000
    h = hashlib.sha256(first)
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        h.update(b)
    conn.close()
    assert h.hexdigest() == want


def test_slow_reader_while_execs_keep_working(client, sandbox):
    """A reader taking 64 KiB every 50 ms of a 16 MiB file, and execs at the same time."""
    sid = sandbox["id"]
    client.exec(sid, "head -c 16777216 /dev/urandom > /tmp/s")
    want = client.exec(sid, "sha256sum /tmp/s")["stdout"].split()[0]
    got = {}

    def reader():
        conn = http.client.HTTPConnection(client.host, client.port, timeout=120)
        conn.request("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/s",
                     headers={"Authorization": f"Bearer {client.key}"})
        r = conn.getresponse()
        h = hashlib.sha256()
        while True:
            b = r.read(65536)
            if not b:
                break
            h.update(b)
            time.sleep(0.05)  # the slow reader itself
        got["sha"] = h.hexdigest()
        conn.close()

    t = threading.Thread(target=reader)
    t.start()
    n = 0
    while t.is_alive() and n < 20:
        out, _ = exec_promptly(client, sid, f"echo {n}")
        assert out == f"{n}\n"
        n += 1
    t.join(300)
    assert not t.is_alive() and got.get("sha") == want
    assert n >= 3, "the download ended before the execs could run next to it"


def test_e2b_abandoned_download_frees_the_sandbox(e2b):
    c = e2b.d.client
    c.exec(e2b.id, "truncate -s 100G /tmp/f")
    head = raw_get_abandon(e2b.sbx, "/files?path=/tmp/f", e2b.headers())
    assert head.startswith("HTTP/1.1 200"), head
    out, took = exec_promptly(c, e2b.id)
    assert out == "alive\n"
    cpu_settles(e2b.d.proc.pid)


def test_e2b_abandoned_upload_keeps_old_file(e2b):
    c = e2b.d.client
    c.put_file(e2b.id, "/tmp/keep", b"old\n")
    s = socket.create_connection(("127.0.0.1", e2b.sbx), timeout=30)
    try:
        hdr = "".join(f"{k}: {v}\r\n" for k, v in e2b.headers().items())
        s.sendall((f"POST /files?path=/tmp/keep HTTP/1.1\r\nHost: x\r\n{hdr}"
                   f"Content-Type: application/octet-stream\r\n"
                   f"Content-Length: {8 << 20}\r\n\r\n").encode())
        s.sendall(b"N" * (3 << 20))
    finally:
        s.close()

    def no_temp():
        names = c.exec(e2b.id, "ls -a /tmp")["stdout"].split()
        return [n for n in names if n not in (".", "..", "keep", "f")] == []
    poll(no_temp, timeout=30, what="the abandoned upload's temporary file removed")
    assert c.get_file(e2b.id, "/tmp/keep").body == b"old\n"
    out, _ = exec_promptly(c, e2b.id)
    assert out == "alive\n"


# -- pseudo-files, devices, changing files ---------------------------------------------

def full_read(port, target, headers):
    """GET with http.client: (status, headers, body); raises IncompleteRead on a broken
    body (fewer bytes than Content-Length, or a chunked body cut short)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", target, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


PSEUDO = ["/sys/kernel/uevent_seqnum", "/sys/devices/system/cpu/online", "/proc/version"]


@pytest.mark.parametrize("path", PSEUDO)
def test_pseudo_file_read_whole_with_its_true_length(client, sandbox, path):
    sid = sandbox["id"]
    inside = client.exec(sid, f"cat {path}")["stdout"].encode()
    st, h, body = full_read(client.port, f"/v1/sandboxes/{sid}/files?path={q(path)}",
                            {"Authorization": f"Bearer {client.key}"})
    assert st == 200 and body, (st, body)
    assert int(h["content-length"]) == len(body)
    if "uevent_seqnum" not in path:  # a counter may move between the two reads
        assert body == inside


@pytest.mark.parametrize("path,what", [("/dev/tty", "character device"),
                                       ("/dev/null", "character device"),
                                       ("/tmp/fifo", "FIFO")])
def test_device_or_fifo_read_is_a_clear_400(client, sandbox, path, what):
    sid = sandbox["id"]
    client.exec(sid, "mkfifo /tmp/fifo")
    t = time.time()
    r = client.request("GET", f"/v1/sandboxes/{sid}/files?path={q(path)}", timeout=BOUND_S)
    assert r.status == 400 and r.error["code"] == "bad_request", r
    assert what in r.error["message"] and "regular file" in r.error["message"], r.error
    assert time.time() - t < BOUND_S
    out, _ = exec_promptly(client, sid)  # nothing left blocked on the FIFO
    assert out == "alive\n"


def test_file_shrinking_while_read_ends_cleanly(client, sandbox):
    """A 32 MiB file cut to 2 MiB mid-download: the body ends well-formed (no length was
    promised), with the file's bytes up to where it was read."""
    sid = sandbox["id"]
    client.exec(sid, "head -c 33554432 /dev/urandom > /tmp/shrink")
    conn = http.client.HTTPConnection(client.host, client.port, timeout=120)
    conn.request("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/shrink",
                 headers={"Authorization": f"Bearer {client.key}"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Length") is None
    first = r.read(1 << 20)
    client.exec(sid, "truncate -s 2M /tmp/shrink")
    rest = r.read()  # IncompleteRead here would be the broken answer
    conn.close()
    body = first + rest
    assert (2 << 20) <= len(body) < (32 << 20)
    want = client.get_file(sid, "/tmp/shrink").body
    assert body[:len(want)] == want


def test_small_file_growing_while_read_has_consistent_length(client, sandbox):
    sid = sandbox["id"]
    pid = client.exec(sid, "(while :; do echo line >> /tmp/grow; done) >/dev/null 2>&1 & "
                      "echo $!")["stdout"].strip()
    try:
        for _ in range(20):
            st, h, body = full_read(client.port, f"/v1/sandboxes/{sid}/files?path=/tmp/grow",
                                    {"Authorization": f"Bearer {client.key}"})
            assert st == 200
            if "content-length" in h:
                assert int(h["content-length"]) == len(body)
            n = len(body) // 5 * 5
            assert body[:n] == b"line\n" * (n // 5)
    finally:
        client.exec(sid, f"kill -9 {pid}")


@pytest.mark.parametrize("path", PSEUDO)
def test_e2b_pseudo_file_read_whole(e2b, path):
    st, h, body = e2b.get(path)
    assert st == 200 and body
    assert int(h["content-length"]) == len(body)


def test_e2b_device_read_is_a_clear_400(e2b):
    st, h, body = e2b.get("/dev/tty")
    assert st == 400, body
    assert b"character device" in body
