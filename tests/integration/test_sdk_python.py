"""The Python SDK (sdk/python, cove_sdk) against a real coved: pip install from the
repository, exec waiting and streaming (a stream cut under the SDK resumes with every byte
once), files and watches, a terminal, the time machine and diffs, typed errors, the audit
iterator, over TCP and the unix socket."""
import os
import socket
import subprocess
import sys
import tempfile
import threading

import pytest
from cove import poll

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "sdk", "python"))
import cove_sdk  # noqa: E402
from cove_sdk import Client, Sandbox  # noqa: E402

pytestmark = pytest.mark.root


@pytest.fixture
def sdk(coved):
    return Client(f"http://127.0.0.1:{coved.port}", coved.client.key)


@pytest.fixture
def sb(sdk):
    s = Sandbox.create("busybox", client=sdk, snapshot_interval_s=0)
    yield s
    try:
        s.delete(purge=True)
    except cove_sdk.NotFound:
        pass


class CuttingProxy:
    """A TCP proxy in front of coved that cuts its first connection once the answer has
    passed cut_after bytes (in the middle of an event line, most likely), both ways, as a
    dropped network would. Later connections pass untouched."""

    def __init__(self, port, cut_after):
        self.up, self.cut_after = port, cut_after
        self.cuts = self.accepted = 0
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            self.accepted += 1
            u = socket.create_connection(("127.0.0.1", self.up))
            cut = self.accepted == 1
            threading.Thread(target=self._pump, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, cut), daemon=True).start()

    def _pump(self, src, dst, cut):
        n = 0
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                if cut and n + len(b) > self.cut_after:
                    dst.sendall(b[:self.cut_after - n])
                    self.cuts += 1
                    break
                dst.sendall(b)
                n += len(b)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.ls.close()


def test_pip_install_from_the_repository_over_the_unix_socket(coved):
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                            "--no-index", "--no-deps", "--target", d,
                            os.path.join(ROOT, "sdk", "python")], capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        prog = ("import cove_sdk, sys\n"
                "sb = cove_sdk.Sandbox.create('busybox')\n"
                "print(sb.exec(['echo', 'via', 'socket']).text, end='')\n"
                "sb.delete()\n")
        env = dict(os.environ, PYTHONPATH=d, COVE_DATA_DIR=coved.data)
        env.pop("COVE_URL", None)
        env.pop("COVE_API_KEY", None)
        out = subprocess.run([sys.executable, "-c", prog], capture_output=True, env=env,
                             cwd=d, timeout=300)
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout == b"via socket\n"


def test_exec_wait_stream_stdin_and_typed_errors(sdk, sb):
    r = sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, b"out\n", b"err\n", False)
    assert sb.exec(["printf", "\\377\\000x"]).stdout == b"\xff\x00x"  # not UTF-8: from b64
    got = []
    r = sb.exec("for i in 1 2 3; do echo $i; done", on_stdout=got.append)
    assert b"".join(got) == b"1\n2\n3\n" and r.stdout == b"1\n2\n3\n" and r.exit_code == 0
    assert r.events[0]["type"] == "start" and r.events[-1]["type"] == "exit"
    assert sb.exec("tr a-z A-Z", stdin=b"shout\n").stdout == b"SHOUT\n"
    with pytest.raises(cove_sdk.BadRequest) as e:
        sb.exec(["/no/such/program"])
    assert e.value.status == 400 and e.value.code == "bad_request"
    with pytest.raises(cove_sdk.NotFound):
        Sandbox.get("sbx_aaaaaaaaaaaaaaaaaaaa", client=sdk)
    with pytest.raises(cove_sdk.Unauthorized):
        Sandbox.list(client=Client(sdk.url, "cove_key_wrong"))
    with pytest.raises(cove_sdk.ConnectionFailed):
        Client("unix:/nonexistent/coved.sock").get("/healthz")
    assert sb.id in [s.id for s in Sandbox.list(client=sdk)]


def test_stream_cut_under_the_sdk_resumes_with_every_byte_once(coved, sb):
    lines = 300
    want = b"".join(b"line-%d-%s\n" % (i, b"x" * 40) for i in range(lines))
    proxy = CuttingProxy(coved.port, cut_after=4000)
    try:
        c = Client(f"http://127.0.0.1:{proxy.port}", coved.client.key)
        s = Sandbox.get(sb.id, client=c)
        proxy.accepted = 0  # the GET above was the first connection: count again
        got = []
        r = s.exec(f"i=0; while [ $i -lt {lines} ]; do echo line-$i-{'x' * 40}; "
                   "i=$((i+1)); done", on_stdout=got.append)
        assert proxy.cuts == 1 and proxy.accepted >= 2  # cut, then resumed on a new one
        assert b"".join(got) == want
        assert r.stdout == want and r.exit_code == 0
        seqs = [e["seq"] for e in r.events]
        assert seqs == list(range(1, len(seqs) + 1))  # each event once, in order
    finally:
        proxy.close()


def test_files_and_watch(sb):
    sb.files.mkdir("/work/sub")
    sb.files.write("/work/sub/a.txt", "hello\n", mode=0o600)
    assert sb.files.read("/work/sub/a.txt") == b"hello\n"
    ents = {e["name"]: e for e in sb.files.list("/work/sub")}
    assert ents["a.txt"]["size"] == 6 and ents["a.txt"]["type"] == "file"
    sb.files.move("/work/sub/a.txt", "/work/b.txt")
    assert sb.files.read_text("/work/b.txt") == "hello\n"
    sb.files.remove("/work/sub", recursive=True)
    with pytest.raises(cove_sdk.NotFound):
        sb.files.read("/work/sub/a.txt")
    seen = []
    w = sb.files.watch("/work")

    def consume():
        for ev in w:
            seen.append(ev)
            if ev.get("path", "").endswith("new.txt"):
                return
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    # the watch is set up when its stream answers; write until an event shows it
    poll(lambda: sb.files.write("/work/new.txt", b"x") and seen, timeout=60,
         what="a watch event for /work/new.txt")
    t.join(30)
    w.close()
    assert any(e["path"].endswith("new.txt") for e in seen)


def test_pty(sb):
    chunks = []
    p = sb.pty.open("/bin/sh", cols=100, rows=30, on_data=chunks.append)
    p.write("echo hi-$((40+2))\n")
    poll(lambda: b"hi-42" in p.output, timeout=60, what="pty output")
    p.resize(120, 40)
    p.write("stty size\n")
    poll(lambda: b"40 120" in p.output, timeout=60, what="the new window size")
    p.write("exit 5\n")
    assert p.wait(60).exit_code == 5
    assert b"".join(chunks) == p.output


def test_time_machine_and_diff(sdk, sb):
    sb.files.write("/root/notes", "v1\n")
    try:
        s1 = sb.snapshot(label="one", kind="files")
    except cove_sdk.Unavailable as e:
        pytest.skip(f"this node cannot snapshot: {e}")
    sb.files.write("/root/notes", "v2\n")
    sb.files.write("/root/added", "new\n")
    d = sb.diff(s1["id"])  # against a snapshot taken now
    assert [e["path"] for e in d["changed"]] == ["/root/notes"]
    assert [e["path"] for e in d["added"]] == ["/root/added"]
    f = cove_sdk.diff_file(s1["id"], d["to"], "/root/notes", client=sdk)
    assert "-v1\n+v2\n" in f["diff"]
    assert [s["id"] for s in sb.snapshots()][:2] == [d["to"], s1["id"]]
    kids = sb.fork(s1["id"], count=1)
    try:
        assert kids[0].files.read("/root/notes") == b"v1\n"
    finally:
        for k in kids:
            k.delete(purge=True)
    undo = sb.rewind(s1["id"])
    assert sb.files.read("/root/notes") == b"v1\n"
    sb.rewind(undo)
    assert sb.files.read("/root/notes") == b"v2\n"
    snap = sb.pause()
    assert sb.info["state"] == "paused" and snap["id"]
    with pytest.raises(cove_sdk.Conflict):
        sb.exec("true")
    sb.resume()
    assert sb.state == "running" and sb.files.read("/root/added") == b"new\n"


def test_audit_iterator(sdk, sb):
    sb.exec("true")
    evs = list(cove_sdk.audit(sdk, sandbox=sb.id))
    actions = [e["action"] for e in evs]
    assert "create" in actions and "exec" in actions
    assert [e["seq"] for e in evs] == sorted(e["seq"] for e in evs)
    # paging: a page of one still yields them all, in order
    assert [e["seq"] for e in cove_sdk.audit(sdk, sandbox=sb.id, page=1)] == \
        [e["seq"] for e in evs]
