"""Files API: raw read/write (binary, large, modes), listing, mkdir/move/remove, errors, and
an interrupted upload that must not damage the old file (docs/api.md "Files")."""
import hashlib
import os
import socket
import time

import pytest

pytestmark = pytest.mark.root


def fs(client, sid, op, body):
    return client.request("POST", f"/v1/sandboxes/{sid}/fs/{op}", body)


def listing(client, sid, path, depth=1):
    return client.get(f"/v1/sandboxes/{sid}/fs?path={path}&depth={depth}")["entries"]


def test_binary_round_trip_all_bytes(client, sandbox):
    sid = sandbox["id"]
    data = bytes(range(256)) * 64
    e = client.put_file(sid, "/tmp/all.bin", data)
    assert e["size"] == len(data) and e["type"] == "file" and e["path"] == "/tmp/all.bin"
    r = client.get_file(sid, "/tmp/all.bin")
    assert r.status == 200 and r.body == data
    # the sandbox sees the same bytes
    assert client.exec(sid, "md5sum /tmp/all.bin")["stdout"].split()[0] == \
        hashlib.md5(data).hexdigest()


def test_empty_file(client, sandbox):
    sid = sandbox["id"]
    client.put_file(sid, "/tmp/empty", b"")
    r = client.get_file(sid, "/tmp/empty")
    assert r.status == 200 and r.body == b""


def test_overwrite_replaces(client, sandbox):
    sid = sandbox["id"]
    client.put_file(sid, "/tmp/f", b"a much longer first version\n")
    client.put_file(sid, "/tmp/f", b"short\n")
    assert client.get_file(sid, "/tmp/f").body == b"short\n"


def test_written_in_sandbox_read_through_api(client, sandbox):
    sid = sandbox["id"]
    client.exec(sid, "printf 'from inside' > /tmp/in")
    assert client.get_file(sid, "/tmp/in").body == b"from inside"


@pytest.mark.slow
def test_100mb_round_trip(client, sandbox):
    sid = sandbox["id"]
    block = os.urandom(1 << 20)
    data = b"".join(bytes([i]) + block[1:] for i in range(100))
    want = hashlib.sha256(data).hexdigest()
    e = client.put_file(sid, "/tmp/big", data, timeout=600)
    assert e["size"] == len(data)
    del data
    assert client.exec(sid, "sha256sum /tmp/big")["stdout"].split()[0] == want
    r = client.get_file(sid, "/tmp/big", timeout=600)
    assert r.status == 200 and len(r.body) == 100 << 20
    assert hashlib.sha256(r.body).hexdigest() == want


def test_mode_query(client, sandbox):
    sid = sandbox["id"]
    e = client.put_file(sid, "/tmp/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert e["mode"] == 0o755
    ents = {x["name"]: x for x in listing(client, sid, "/tmp")}
    assert ents["run.sh"]["mode"] == 493
    assert client.exec(sid, ["/tmp/run.sh"])["stdout"] == "ran\n"
    e = client.put_file(sid, "/tmp/plain", b"x")
    assert e["mode"] == 0o644


def test_bad_mode(client, sandbox):
    r = client.request("PUT", f"/v1/sandboxes/{sandbox['id']}/files?path=/tmp/x&mode=9z", b"x")
    assert r.status == 400 and r.error.get("code") == "bad_request"


def test_missing_file_404(client, sandbox):
    r = client.get_file(sandbox["id"], "/tmp/does-not-exist")
    assert r.status == 404 and r.error.get("code") == "not_found"


def test_get_directory_is_error(client, sandbox):
    r = client.get_file(sandbox["id"], "/tmp")
    assert r.status == 409 and r.error.get("code") == "conflict", r


def test_put_to_missing_dir_is_clear_error(client, sandbox):
    r = client.request("PUT", f"/v1/sandboxes/{sandbox['id']}/files?path=/nope/dir/f", b"data")
    assert r.status == 404, r
    assert r.error.get("code") == "not_found" and r.error.get("message")


def test_mkdir_nested_list_depth(client, sandbox):
    sid = sandbox["id"]
    r = fs(client, sid, "mkdir", {"path": "/work/a/b/c"})
    assert r.status == 200, r
    assert r.json()["type"] == "dir"
    assert fs(client, sid, "mkdir", {"path": "/work/a/b/c"}).status == 200  # idempotent
    client.put_file(sid, "/work/a/top.txt", b"12345")
    client.put_file(sid, "/work/a/b/deep.txt", b"1")
    one = listing(client, sid, "/work/a", 1)
    assert sorted(e["name"] for e in one) == ["b", "top.txt"]
    for e in one:
        assert {"name", "path", "type", "size", "mode", "mtime"} <= set(e), e
        assert e["mtime"].endswith("Z")
    by = {e["path"]: e for e in one}
    assert by["/work/a/top.txt"]["type"] == "file" and by["/work/a/top.txt"]["size"] == 5
    assert by["/work/a/b"]["type"] == "dir"
    two = {e["path"] for e in listing(client, sid, "/work/a", 2)}
    assert two == {"/work/a/b", "/work/a/top.txt", "/work/a/b/c", "/work/a/b/deep.txt"}


def test_move_and_remove(client, sandbox):
    sid = sandbox["id"]
    client.put_file(sid, "/tmp/m1", b"move me")
    r = fs(client, sid, "move", {"from": "/tmp/m1", "to": "/tmp/m2"})
    assert r.status == 200, r
    assert client.get_file(sid, "/tmp/m1").status == 404
    assert client.get_file(sid, "/tmp/m2").body == b"move me"
    fs(client, sid, "mkdir", {"path": "/tmp/tree/x/y"})
    client.put_file(sid, "/tmp/tree/x/y/f", b"1")
    r = fs(client, sid, "remove", {"path": "/tmp/tree"})
    assert r.status == 409 and r.error.get("code") == "conflict", r
    r = fs(client, sid, "remove", {"path": "/tmp/tree", "recursive": True})
    assert r.status == 200, r
    assert client.exec(sid, "test -e /tmp/tree; echo $?")["stdout"] == "1\n"
    assert fs(client, sid, "remove", {"path": "/tmp/tree"}).status == 404
    assert fs(client, sid, "move", {"from": "/tmp/none", "to": "/tmp/x"}).status == 404


def test_relative_and_dotdot_paths_stay_inside(client, sandbox):
    sid = sandbox["id"]
    client.put_file(sid, "/tmp/../../../tmp/inside", b"ok")
    assert client.exec(sid, "cat /tmp/inside")["stdout"] == "ok"


def _raw_put(client, sid, path, declared, sent):
    """PUT with a Content-Length of `declared` bytes, sends only `sent`, then closes."""
    s = socket.create_connection((client.host, client.port), timeout=30)
    try:
        s.sendall((f"PUT /v1/sandboxes/{sid}/files?path={path} HTTP/1.1\r\n"
                   f"Host: x\r\nAuthorization: Bearer {client.key}\r\n"
                   f"Content-Type: application/octet-stream\r\n"
                   f"Content-Length: {declared}\r\n\r\n").encode())
        s.sendall(sent)
    finally:
        s.close()


def test_dropped_upload_keeps_old_content(client, sandbox):
    sid = sandbox["id"]
    client.put_file(sid, "/tmp/keep", b"old content\n")
    _raw_put(client, sid, "/tmp/keep", 8 << 20, b"N" * (3 << 20))
    # wait until coved has noticed the drop: no temporary file left next to the target
    deadline = time.time() + 30
    while True:
        left = client.exec(sid, "ls -a /tmp")["stdout"].split()
        extra = [n for n in left if n not in (".", "..", "keep")]
        if not extra:
            break
        assert time.time() < deadline, f"temporary upload files left: {extra}"
        time.sleep(0.1)
    assert client.get_file(sid, "/tmp/keep").body == b"old content\n"
    # and the sandbox's files API still works afterwards
    client.put_file(sid, "/tmp/keep", b"new\n")
    assert client.get_file(sid, "/tmp/keep").body == b"new\n"


def test_dropped_upload_of_new_file_creates_nothing(client, sandbox):
    sid = sandbox["id"]
    _raw_put(client, sid, "/tmp/newfile", 1 << 20, b"partial")
    deadline = time.time() + 30
    while client.exec(sid, "ls -a /tmp | grep -v '^\\.\\.\\?$' | wc -l")["stdout"].strip() != "0":
        assert time.time() < deadline, client.exec(sid, "ls -la /tmp")["stdout"]
        time.sleep(0.1)
    assert client.get_file(sid, "/tmp/newfile").status == 404


def test_file_errors_are_specific(client, sandbox):
    sid = sandbox["id"]
    B = f"/v1/sandboxes/{sid}"
    before = client.exec(sid, "ls -a /")["stdout"]
    r = client.request("PUT", f"{B}/files?path=/tmp", b"x")
    assert r.status == 409 and r.error["code"] == "conflict", r
    assert client.exec(sid, "ls -a /")["stdout"] == before  # no temporary file left
    r = client.request("GET", f"{B}/fs?path=/etc/passwd")
    assert r.status == 409 and r.error["code"] == "conflict", r
    client.put_file(sid, "/tmp/afile", b"1")
    r = fs(client, sid, "mkdir", {"path": "/tmp/afile/sub"})
    assert r.status == 409 and r.error["code"] == "conflict", r
    r = fs(client, sid, "move", {"from": "/tmp/afile", "to": "/nope/x"})
    assert r.status == 404 and r.error["code"] == "not_found", r
    r = fs(client, sid, "remove", {"path": "/", "recursive": True})
    assert r.status == 400 and r.error["code"] == "bad_request", r
    assert client.exec(sid, "ls /bin/sh")["exit_code"] == 0


def test_disk_full_upload_is_limit_exceeded_and_leaves_nothing(client):
    sb = client.create(template="busybox", disk_mb=32)
    sid = sb["id"]
    try:
        client.put_file(sid, "/tmp/keep", b"kept")
        r = client.request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/huge", b"\0" * (64 << 20),
                           timeout=300)
        assert r.status == 429 and r.error["code"] == "limit_exceeded", (r.status, r.body[:200])
        assert client.exec(sid, "ls -a /tmp")["stdout"].split() == [".", "..", "keep"]
        assert client.get_file(sid, "/tmp/keep").body == b"kept"
        # the space is back: a normal write works again
        client.put_file(sid, "/tmp/small", b"x" * 100000)
    finally:
        client.remove(sid)


def test_chunked_upload_and_odd_names(client, sandbox):
    sid = sandbox["id"]
    data = os.urandom(3 << 20)
    conn = client.conn(timeout=120)
    try:
        conn.request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/chunked",
                     body=(data[i:i + 100000] for i in range(0, len(data), 100000)),
                     headers={"Authorization": f"Bearer {client.key}",
                              "Transfer-Encoding": "chunked"}, encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
    finally:
        conn.close()
    assert client.get_file(sid, "/tmp/chunked").body == data
    name = "/tmp/a b+c%d&x=1#é"
    assert client.put_file(sid, name, b"odd")["path"] == name
    assert client.get_file(sid, name).body == b"odd"
    assert "a b+c%d&x=1#é" in [e["name"] for e in listing(client, sid, "/tmp")]


def test_dropped_chunked_upload_keeps_old_content(client, sandbox):
    sid = sandbox["id"]
    client.put_file(sid, "/tmp/keepc", b"old\n")
    s = socket.create_connection((client.host, client.port), timeout=30)
    try:
        s.sendall((f"PUT /v1/sandboxes/{sid}/files?path=/tmp/keepc HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {client.key}\r\nTransfer-Encoding: chunked\r\n\r\n"
                   ).encode())
        for _ in range(20):  # whole chunks, then the connection ends without the last chunk
            s.sendall(b"10000\r\n" + b"N" * 0x10000 + b"\r\n")
    finally:
        s.close()
    deadline = time.time() + 30
    while [n for n in client.exec(sid, "ls -a /tmp")["stdout"].split()
           if n not in (".", "..", "keepc")]:
        assert time.time() < deadline, "temporary upload file left"
        time.sleep(0.1)
    assert client.get_file(sid, "/tmp/keepc").body == b"old\n"
