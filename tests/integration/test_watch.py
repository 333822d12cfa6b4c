"""fs/watch: NDJSON events with seq for changes made by processes in the sandbox."""
import json
import queue
import socket
import threading
import time

import pytest

pytestmark = pytest.mark.root


class Watcher:
    """Reads a watch stream in a thread; events land in a queue."""

    def __init__(self, client, sid, path, recursive=True):
        self.q = queue.Queue()
        self.conn = client.conn(timeout=60)
        self.conn.request("GET", f"/v1/sandboxes/{sid}/fs/watch?path={path}"
                          f"&recursive={'true' if recursive else 'false'}",
                          headers={"Authorization": f"Bearer {client.key}"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        self.events = []
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        try:
            for line in self.resp:
                if line.strip():
                    self.q.put(json.loads(line))
        except Exception as e:  # noqa: BLE001 - reported through the queue
            if not self.closed:
                self.q.put(e)

    closed = False

    def close(self):
        self.closed = True
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.t.join(10)
        self.conn.close()

    def wait_for(self, pred, timeout=30):
        deadline = time.time() + timeout
        while True:
            for e in self.events:
                if pred(e):
                    return e
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(f"no matching event in {self.events}")
            try:
                e = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if isinstance(e, Exception):
                raise e
            self.events.append(e)


def test_watch_reports_create_write_remove_rename(client, sandbox):
    sid = sandbox["id"]
    client.request("POST", f"/v1/sandboxes/{sid}/fs/mkdir", {"path": "/tmp/w"})
    w = Watcher(client, sid, "/tmp/w")
    # a watch is set up once its stream answered; make a probe change and wait for it
    deadline = time.time() + 30
    while True:
        client.exec(sid, "touch /tmp/w/probe")
        try:
            w.wait_for(lambda e: e.get("path") == "/tmp/w/probe", timeout=1)
            break
        except AssertionError:
            assert time.time() < deadline, "watch delivers no events"
    client.exec(sid, "echo a > /tmp/w/new.txt")
    client.exec(sid, "echo more >> /tmp/w/new.txt")
    client.exec(sid, "mkdir -p /tmp/w/sub && echo x > /tmp/w/sub/inner")
    client.exec(sid, "mv /tmp/w/new.txt /tmp/w/renamed.txt")
    client.exec(sid, "rm /tmp/w/renamed.txt")
    w.wait_for(lambda e: e["type"] == "create" and e["path"] == "/tmp/w/new.txt")
    w.wait_for(lambda e: e["type"] == "write" and e["path"] == "/tmp/w/new.txt")
    w.wait_for(lambda e: e["type"] == "create" and e["path"] == "/tmp/w/sub/inner")
    w.wait_for(lambda e: e["type"] == "rename" and e["path"] == "/tmp/w/new.txt")
    w.wait_for(lambda e: e["type"] == "create" and e["path"] == "/tmp/w/renamed.txt")
    w.wait_for(lambda e: e["type"] == "remove" and e["path"] == "/tmp/w/renamed.txt")
    seqs = [e["seq"] for e in w.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    assert seqs[0] >= 1
    for e in w.events:
        assert e["type"] in ("create", "write", "remove", "rename"), e
    w.close()


def test_watch_of_missing_path_is_404(client, sandbox):
    r = client.request("GET", f"/v1/sandboxes/{sandbox['id']}/fs/watch?path=/no/such/dir")
    assert r.status == 404 and r.error.get("code") == "not_found", r


def test_watch_files_api_changes(client, sandbox):
    sid = sandbox["id"]
    w = Watcher(client, sid, "/tmp")
    deadline = time.time() + 30
    i = 0
    while True:
        i += 1
        client.put_file(sid, f"/tmp/via-api-{i}", b"x")
        try:
            w.wait_for(lambda e: e.get("path") == f"/tmp/via-api-{i}"
                       and e["type"] == "create", timeout=1)
            break
        except AssertionError:
            assert time.time() < deadline, "no event for a file written through the API"
    w.close()


def test_non_recursive_watch_ignores_subdirectories(client, sandbox):
    sid = sandbox["id"]
    client.exec(sid, "mkdir -p /tmp/nr/sub")
    w = Watcher(client, sid, "/tmp/nr", recursive=False)
    deadline = time.time() + 30
    while True:
        client.exec(sid, "touch /tmp/nr/probe")
        try:
            w.wait_for(lambda e: e.get("path") == "/tmp/nr/probe", timeout=1)
            break
        except AssertionError:
            assert time.time() < deadline, "watch delivers no events"
    client.exec(sid, "echo x > /tmp/nr/sub/deep; echo y > /tmp/nr/top")
    w.wait_for(lambda e: e.get("path") == "/tmp/nr/top" and e["type"] == "create")
    # events arrive in order: once "top" (written after "deep") is seen, no "deep" came
    assert not [e for e in w.events if e["path"].startswith("/tmp/nr/sub/")], w.events
    w.close()


def test_dropped_watch_streams_do_not_use_up_watches(client, sandbox):
    """The guest allows 64 watches per sandbox; clients that disconnect give theirs back."""
    sid = sandbox["id"]
    for i in range(100):
        deadline = time.time() + 30
        while True:
            conn = client.conn(timeout=30)
            conn.request("GET", f"/v1/sandboxes/{sid}/fs/watch?path=/tmp",
                         headers={"Authorization": f"Bearer {client.key}"})
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                break
            assert status == 429, status
            assert time.time() < deadline, f"watch {i}: still limit_exceeded after 30 s"
            time.sleep(0.1)
