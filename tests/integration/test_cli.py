"""The cove CLI against a real coved: what a user types and what they check.

Runs against the session `coved` fixture (busybox template). To point these tests at another
server instead, set COVE_CLI_TEST_URL and COVE_CLI_TEST_KEY (the unix-socket test is then
skipped, since it needs the server's data dir).
"""
import base64
import json
import os
import pty
import re
import select
import socket
import subprocess
import termios
import threading
import time

import pytest
from cove import poll

ID_RE = re.compile(r"^sbx_[A-Za-z0-9_-]+$")


class Cli:
    def __init__(self, binary, url, key, data=None):
        self.bin, self.url, self.key, self.data = binary, url, key, data

    def env(self, **extra):
        e = dict(os.environ)
        for k in ("COVE_URL", "COVE_API_KEY", "COVE_DATA_DIR"):
            e.pop(k, None)
        e["COVE_URL"], e["COVE_API_KEY"] = self.url, self.key
        for k, v in extra.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        return e

    def run(self, *args, input=None, timeout=120, env=None):
        """argv after `cove`; returns CompletedProcess with bytes stdout/stderr."""
        return subprocess.run([self.bin, *args], input=input, capture_output=True,
                              timeout=timeout, env=env or self.env())

    def ok(self, *args, **kw):
        r = self.run(*args, **kw)
        assert r.returncode == 0, (f"cove {' '.join(args)} exited {r.returncode}; "
                                   f"stderr: {r.stderr.decode(errors='replace')}")
        return r.stdout

    def create(self):
        out = self.ok("create", "--template", "busybox").decode()
        sid = out.strip()
        assert out == sid + "\n" and ID_RE.match(sid), f"create printed {out!r}"
        return sid


@pytest.fixture(scope="module")
def cli(request, build_dir):
    binary = os.path.join(build_dir, "cove")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} not built")
    url = os.environ.get("COVE_CLI_TEST_URL")
    if url:
        return Cli(binary, url, os.environ.get("COVE_CLI_TEST_KEY", ""))
    coved = request.getfixturevalue("coved")
    return Cli(binary, f"http://127.0.0.1:{coved.port}", coved.client.key, coved.data)


@pytest.fixture
def sid(cli):
    s = cli.create()
    yield s
    cli.run("rm", s)  # may already be gone: the test removed it


def run_on_pty(argv, env, timeout=30):
    """Run argv with stdin/stdout/stderr on a fresh pty; returns (rc, output)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                         start_new_session=True)
    os.close(slave)
    out = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                d = os.read(master, 65536)
            except OSError:  # EIO: every slave fd is closed
                break
            if not d:
                break
            out += d
        elif p.poll() is not None:
            break
    rc = p.wait(timeout=10)
    os.close(master)
    return rc, out.decode(errors="replace")


# --- create / inspect / ls ---------------------------------------------------------------

def test_create_prints_only_the_id(cli, sid):
    sb = json.loads(cli.ok("inspect", sid))
    assert sb["id"] == sid
    assert sb["state"] == "running"
    assert sb["template"] == "busybox"


def test_create_json_prints_the_sandbox(cli):
    sb = json.loads(cli.ok("create", "--template", "busybox", "--json", "--metadata", "k=v"))
    try:
        assert ID_RE.match(sb["id"]) and sb["metadata"] == {"k": "v"}
    finally:
        cli.run("rm", sb["id"])


def test_inspect_is_json_on_a_pipe_and_pretty_on_a_terminal(cli, sid):
    one_line = cli.ok("inspect", sid).decode()
    assert one_line.count("\n") == 1 and json.loads(one_line)["id"] == sid
    rc, out = run_on_pty([cli.bin, "inspect", sid], cli.env())
    assert rc == 0
    assert out.count("\n") > 3 and json.loads(out)["id"] == sid


def test_ls_json_and_metadata_filter(cli):
    a = json.loads(cli.ok("create", "--template", "busybox", "--json", "-m", "team=blue"))["id"]
    b = json.loads(cli.ok("create", "--template", "busybox", "--json", "-m", "team=red"))["id"]
    try:
        ids = [s["id"] for s in json.loads(cli.ok("ls", "--json"))["sandboxes"]]
        assert a in ids and b in ids
        blue = [s["id"] for s in
                json.loads(cli.ok("ls", "--json", "--metadata", "team=blue"))["sandboxes"]]
        assert a in blue and b not in blue
        running = json.loads(cli.ok("ls", "--json", "--state", "running"))["sandboxes"]
        assert all(s["state"] == "running" for s in running) and a in [s["id"] for s in running]
    finally:
        cli.run("rm", a, b)


def test_ls_table_on_a_terminal(cli, sid):
    rc, out = run_on_pty([cli.bin, "ls"], cli.env())
    assert rc == 0, out
    lines = out.replace("\r", "").splitlines()
    assert lines[0].split() == ["ID", "STATE", "TEMPLATE", "RUNTIME", "CREATED", "EXPIRES"]
    row = next(line for line in lines if line.startswith(sid))
    cols = row.split()
    assert cols[1:4] == ["running", "busybox", "ns"]
    # relative times: created "now" or "3s ago", expires "in 4m"
    assert re.search(r"  (now|\d+[smhd] ago)  +in \d+[smhd]$", row), row
    # columns are aligned: STATE starts at the same offset in the header and the row
    assert lines[0].index("STATE") == row.index("running")


# --- exec ------------------------------------------------------------------------------

def test_exec_prints_output_and_propagates_exit_code(cli, sid):
    r = cli.run("exec", sid, "--", "sh", "-c", "echo $((6*7))")
    assert (r.returncode, r.stdout) == (0, b"42\n")
    r = cli.run("exec", sid, "--", "sh", "-c", "exit 3")
    assert r.returncode == 3
    r = cli.run("exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (r.returncode, r.stdout, r.stderr) == (7, b"out\n", b"err\n")


def test_exec_killed_by_signal_is_128_plus_n(cli, sid):
    r = cli.run("exec", sid, "--", "sh", "-c", "kill -9 $$")
    assert r.returncode == 128 + 9


def test_exec_env_and_workdir(cli, sid):
    out = cli.ok("exec", "-e", "GREETING=hello", "-w", "/tmp", sid, "--", "sh", "-c",
                 'echo "$GREETING $(pwd)"')
    assert out == b"hello /tmp\n"


def test_exec_missing_binary_fails_clearly(cli, sid):
    r = cli.run("exec", sid, "--", "/no/such/binary")
    assert r.returncode != 0
    assert r.stderr.strip(), "a failed exec must say why"


def test_exec_stdin_pipe(cli, sid):
    r = cli.run("exec", "-i", sid, "--", "cat", input=b"hi\n")
    assert (r.returncode, r.stdout) == (0, b"hi\n")
    data = os.urandom(200_000)
    r = cli.run("exec", "-i", sid, "--", "wc", "-c", input=data)
    assert r.returncode == 0 and r.stdout.split()[0] == str(len(data)).encode()


def test_exec_it_is_a_real_terminal(cli, sid):
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    p = subprocess.Popen([cli.bin, "exec", "-it", sid, "--", "sh"], stdin=slave, stdout=slave,
                         stderr=slave, env=cli.env(TERM="xterm"), start_new_session=True)
    out = b""

    def read_until(pred, timeout=30):
        nonlocal out
        deadline = time.time() + timeout
        while time.time() < deadline and not pred(out):
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
        return pred(out)

    try:
        # the remote shell is on a tty: its prompt shows, and `tty` names a pty
        os.write(master, b"tty; echo $((6*7))\n")
        assert read_until(lambda o: b"\n42" in o.replace(b"\r", b"")), out
        assert b"/dev/pts/" in out, out
        os.write(master, b"exit 5\n")
        assert p.wait(timeout=30) == 5
        # the local terminal was put back as it was (cooked mode, echo on)
        assert termios.tcgetattr(slave) == before
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
        os.close(slave)


class CuttingProxy:
    """TCP proxy to coved that cuts the first exec stream after `cut` bytes of its answer,
    so the CLI must reconnect with ?after=SEQ."""

    def __init__(self, upstream_port, cut):
        self.up, self.cut, self.cuts = upstream_port, cut, 0
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self.conn, args=(c,), daemon=True).start()

    def conn(self, c):
        u = socket.create_connection(("127.0.0.1", self.up))
        first = c.recv(65536)
        limit = None
        if b"/exec " in first.split(b"\r\n", 1)[0] and self.cuts == 0:
            self.cuts, limit = 1, self.cut
        u.sendall(first)
        threading.Thread(target=self.pump, args=(c, u, None), daemon=True).start()
        self.pump(u, c, limit)

    @staticmethod
    def pump(src, dst, limit):
        n = 0
        try:
            while True:
                d = src.recv(4096 if limit is None else min(4096, max(1, limit - n)))
                if not d:
                    break
                dst.sendall(d)
                n += len(d)
                if limit is not None and n >= limit:
                    break
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.srv.close()


def test_exec_reconnects_after_a_dropped_stream_without_duplicates(cli, sid):
    port = int(cli.url.rsplit(":", 1)[1].split("/")[0])
    proxy = CuttingProxy(port, cut=1200)
    try:
        script = 'i=0; while [ $i -lt 60 ]; do echo line$i; i=$((i+1)); sleep 0.02; done; exit 4'
        r = cli.run("--url", f"http://127.0.0.1:{proxy.port}", "exec", sid, "--", "sh", "-c",
                    script)
        assert proxy.cuts == 1, "the proxy never cut the stream: test is not testing anything"
        assert r.stdout.decode().splitlines() == [f"line{i}" for i in range(60)], r.stderr
        assert r.returncode == 4
    finally:
        proxy.close()


# --- cp --------------------------------------------------------------------------------

def test_snapshot_kind(cli, sid):
    # cove snapshot --kind files: a files snapshot whatever the node's default
    out = cli.run("snapshot", sid, "--kind", "files", "--json")
    if out.returncode != 0 and b"cannot snapshot" in out.stderr:
        pytest.skip("the runtime cannot snapshot: " + out.stderr.decode(errors="replace"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "files"
    r = cli.run("snapshot", sid, "--kind", "memory")
    assert r.returncode == 2 and b"--kind takes files or full" in r.stderr, r.stderr
    r = cli.run("pause", sid, "--kind", "files")
    assert r.returncode == 2 and b"--kind is for cove snapshot" in r.stderr, r.stderr


def test_cp_binary_both_ways(cli, sid, tmp_path):
    data = bytes(range(256)) * 64 + os.urandom(1 << 20)
    src = tmp_path / "blob.bin"
    src.write_bytes(data)
    os.chmod(src, 0o750)
    cli.ok("cp", str(src), f"{sid}:/tmp/blob.bin")
    # the mode travelled, and the bytes are intact inside the sandbox
    assert cli.ok("exec", sid, "--", "stat", "-c", "%a %s", "/tmp/blob.bin") == \
        f"750 {len(data)}\n".encode()
    back = tmp_path / "back.bin"
    cli.ok("cp", f"{sid}:/tmp/blob.bin", str(back))
    assert back.read_bytes() == data
    # into a directory: keeps the name; no temp file left behind
    d = tmp_path / "dir"
    d.mkdir()
    cli.ok("cp", f"{sid}:/tmp/blob.bin", str(d))
    assert (d / "blob.bin").read_bytes() == data
    assert os.listdir(d) == ["blob.bin"]


def test_cp_stdin_and_stdout(cli, sid):
    data = os.urandom(300_000)
    cli.ok("cp", "-", f"{sid}:/tmp/from-stdin", input=data)
    assert cli.ok("cp", f"{sid}:/tmp/from-stdin", "-") == data


def test_cp_missing_file_fails_and_leaves_nothing(cli, sid, tmp_path):
    r = cli.run("cp", f"{sid}:/no/such/file", str(tmp_path / "x"))
    assert r.returncode == 1
    assert b"not_found" in r.stderr
    assert os.listdir(tmp_path) == []


# --- timeout / rm ----------------------------------------------------------------------

def parse_time(s):
    s = re.sub(r"\.\d+", "", s).replace("Z", "+00:00")
    from datetime import datetime
    return datetime.fromisoformat(s).timestamp()


def test_timeout_extends_the_sandbox(cli, sid):
    t0 = time.time()
    cli.ok("timeout", sid, "3600")
    exp = parse_time(json.loads(cli.ok("inspect", sid))["expires_at"])
    assert t0 + 3600 - 30 <= exp <= time.time() + 3600 + 30
    sb = json.loads(cli.ok("timeout", sid, "1200", "--json"))
    assert abs(parse_time(sb["expires_at"]) - (time.time() + 1200)) < 30


def test_rm_then_inspect_is_not_found(cli):
    s = cli.create()
    r = cli.run("rm", s)
    assert (r.returncode, r.stdout) == (0, b"")
    r = cli.run("inspect", s)
    assert r.returncode == 1
    assert b"not_found" in r.stderr
    r = cli.run("rm", s)
    assert r.returncode == 1 and b"not_found" in r.stderr


# --- errors, auth, transport ----------------------------------------------------------

@pytest.mark.parametrize("args", [
    [], ["bogus"], ["exec"], ["exec", "sbx_x"], ["create", "--cpus", "lots"],
    ["cp", "a", "b"], ["timeout", "sbx_x"], ["timeout", "sbx_x", "-5"], ["inspect"],
    ["ls", "--nope"],
])
def test_usage_errors_exit_2(cli, args):
    r = cli.run(*args)
    assert r.returncode == 2, (args, r.stderr)
    assert r.stderr and not r.stdout


def test_help_and_version(cli):
    assert b"Usage: cove exec" in cli.ok("exec", "--help")
    assert re.match(rb"^cove \S+\n$", cli.ok("version"))


def test_wrong_key_is_unauthorized(cli):
    r = cli.run("--api-key", "cove_wrong", "ls")
    assert r.returncode == 1 and b"unauthorized" in r.stderr


def test_unreachable_server_fails_with_1(cli):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = cli.run("--url", f"http://127.0.0.1:{port}", "ls")
    assert r.returncode == 1 and b"cannot reach coved" in r.stderr


def test_local_socket_and_admin_key_by_default(cli):
    if not cli.data:
        pytest.skip("external server (COVE_CLI_TEST_URL): its data dir is not ours")
    env = cli.env(COVE_URL=None, COVE_API_KEY=None, COVE_DATA_DIR=cli.data)
    r = cli.run("ls", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert "sandboxes" in json.loads(r.stdout)


# --- day-one gaps: ls on a pipe, secrets, egress, logs -----------------------------------

def test_ls_prints_its_table_on_a_pipe_too(cli, sid):
    out = cli.ok("ls").decode()  # stdout is a pipe here
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATE", "TEMPLATE", "RUNTIME", "CREATED", "EXPIRES"]
    assert any(line.startswith(sid) and line.split()[1] == "running" for line in lines)
    assert json.loads(cli.ok("ls", "--json"))["sandboxes"]  # scripts ask for JSON


def test_secret_value_from_stdin_or_a_file_never_argv(cli, tmp_path):
    value = "s3cr3t-" + os.urandom(8).hex()
    name = "CLI_T_" + os.urandom(3).hex().upper()
    try:
        r = cli.run("secret", "set", name, "--host", "api.example.com", input=value.encode() + b"\n")
        assert r.returncode == 0, r.stderr
        assert r.stdout == name.encode() + b"\n" and value.encode() not in r.stdout + r.stderr
        ls = cli.ok("secret", "ls").decode()
        row = next(line for line in ls.splitlines() if line.startswith(name))
        assert "api.example.com" in row and "Authorization: Bearer {value}" in row
        assert value not in ls
        js = json.loads(cli.ok("--json", "secret", "ls"))
        assert name in [x["name"] for x in js["secrets"]] and value not in json.dumps(js)
        # from a file, in placeholder mode
        f = tmp_path / "v"
        f.write_text(value + "-2")
        cli.ok("secret", "set", name, "--host", "*.example.com", "--placeholder",
               "--from-file", str(f))
        one = [x for x in json.loads(cli.ok("--json", "secret", "ls"))["secrets"]
               if x["name"] == name][0]
        assert one["inject"] == {"placeholder": True} and one["hosts"] == ["*.example.com"]
        # a value on the command line is refused before anything is sent
        r = cli.run("secret", "set", name, value, "--host", "x.example.com")
        assert r.returncode == 2 and b"never from the command line" in r.stderr
        r = cli.run("secret", "set", name, "--host", "x.example.com", input=b"")
        assert r.returncode == 1 and b"1 to 8192 bytes" in r.stderr
    finally:
        cli.run("secret", "rm", name)
    assert name not in cli.ok("secret", "ls").decode()
    r = cli.run("secret", "rm", name)
    assert r.returncode == 1 and b"not_found" in r.stderr


def test_egress_show_and_set(cli, sid):
    out = cli.ok("egress", "show", sid).decode()
    assert "allow:    -" in out and "address:  - (no link)" in out
    r = cli.run("egress", "set", sid, "--allow", "example.com:443", "--deny", "bad.example.com")
    if r.returncode == 1 and b"unavailable" in r.stderr:
        pytest.skip("this coved runs no egress gateway: " + r.stderr.decode())
    assert r.returncode == 0, r.stderr
    assert "allow:    example.com:443" in r.stdout.decode()
    j = json.loads(cli.ok("--json", "egress", "show", sid))
    assert j["egress"]["allow"] == ["example.com:443"] and j["egress"]["deny"] == ["bad.example.com"]
    r = cli.run("egress", "set", sid, "--allow", "not a pattern!")
    assert r.returncode == 1 and b"bad_request" in r.stderr
    r = cli.run("egress", "set", sid, "--file", "-", input=b'{"allow": []}')
    assert r.returncode == 0, r.stderr
    assert json.loads(cli.ok("--json", "egress", "show", sid))["egress"]["allow"] == []


def test_logs_reattaches_to_a_process(cli, coved, sid):
    ev = list(coved.client.stream(f"/v1/sandboxes/{sid}/exec",
                                  {"shell": "echo one; echo err >&2; sleep 1; echo two"},
                                  max_events=1))  # the start event, then the client goes away
    pid = ev[0]["pid"]
    r = cli.run("logs", sid, str(pid))
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"one\ntwo\n" and r.stderr == b"err\n"
    events = [json.loads(line) for line in cli.ok("--json", "logs", sid, str(pid)).splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "exit"
    two = next(e["seq"] for e in events if e.get("type") == "stdout" and
               base64.b64decode(e["data_b64"]) == b"two\n")
    r = cli.run("logs", "--after", str(two - 1), sid, str(pid))
    assert r.stdout == b"two\n" and r.stderr == b""
    r = cli.run("logs", sid, "99999")
    assert r.returncode == 1 and b"not_found" in r.stderr
    # --no-follow: what is kept of a process still running, then back to the prompt
    ev = list(coved.client.stream(f"/v1/sandboxes/{sid}/exec",
                                  {"shell": "echo started; exec sleep 600"}, max_events=1))
    pid = ev[0]["pid"]
    poll(lambda: cli.ok("logs", "--no-follow", sid, str(pid)) == b"started\n", timeout=60,
         what="logs --no-follow printing what the running process wrote")
    cli.run("exec", sid, "--", "kill", str(pid))
