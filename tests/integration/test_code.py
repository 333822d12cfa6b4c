"""The code interpreter (docs/code-interpreter.md): POST /v1/sandboxes/{id}/code and its
contexts against a real coved and the code-interpreter template (a real Jupyter kernel,
Node.js, bash), plus the real @e2b/code-interpreter npm SDK through the E2B listeners.
Every result kind, each failure mode, runaway cells, and a hostile server inside the
sandbox (the interpreter runs there, so its answers are untrusted)."""
import base64
import json
import os
import re
import subprocess
import threading
import time

import pytest

from cove import Coved, free_port, poll
from npmdir import npm_dir

pytestmark = pytest.mark.slow  # minutes: not in the sanitizer pass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CI_SRC = os.path.join(ROOT, "tests", "e2b-ci")


@pytest.fixture(scope="module")
def ci(build_dir, templates_dir, log_dir):
    if os.geteuid() != 0:
        pytest.skip("coved's namespace runtime needs root")
    api, sbx = free_port(), free_port()
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--templates", "busybox,base,code-interpreter", "--pool", "0",
                          "--e2b-api-listen", f"127.0.0.1:{api}",
                          "--e2b-sandbox-listen", f"127.0.0.1:{sbx}"])
    d.e2b_api, d.e2b_sbx = api, sbx
    yield d
    d.stop()


@pytest.fixture(scope="module")
def sid(ci):
    s = ci.client.create("code-interpreter")["id"]
    yield s
    ci.client.remove(s)


def run(c, sid, code, expect=200, **fields):
    """The lines of one run (the stream read to its end)."""
    body = dict(code=code, **fields)
    if expect != 200:
        r = c.request("POST", f"/v1/sandboxes/{sid}/code", body)
        assert r.status == expect, (r.status, r.body[:300])
        return r.json()
    lines = list(c.stream(f"/v1/sandboxes/{sid}/code", body, timeout=600))
    assert lines and lines[-1] == {"type": "end_of_execution"}, lines[-3:]
    return lines


def text(lines, kind="stdout"):
    return "".join(x["text"] for x in lines if x["type"] == kind)


def main_result(lines):
    rs = [x for x in lines if x["type"] == "result" and x["is_main_result"]]
    return rs[0] if rs else None


def errors(lines):
    return [x for x in lines if x["type"] == "error"]


def test_python_state_stdout_and_main_result(ci, sid):
    c = ci.client
    a = run(c, sid, "x = 20\nprint('hello', x)")
    assert text(a) == "hello 20\n" and not errors(a)
    b = run(c, sid, "x * 2 + 2")
    assert main_result(b)["text"] == "42"
    counts = [x["execution_count"] for x in a + b if x["type"] == "number_of_executions"]
    assert len(counts) == 2 and counts[1] == counts[0] + 1, counts


def test_rich_results(ci, sid):
    c = ci.client
    fig = run(c, sid, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 4])\nplt.show()")
    pngs = [x for x in fig if x["type"] == "result" and "png" in x]
    assert pngs, fig
    assert base64.b64decode(pngs[0]["png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert pngs[0]["is_main_result"] is False  # a display, not the cell's value
    df = main_result(run(c, sid, "import pandas as pd\npd.DataFrame({'a': [1, 2]})"))
    assert "<table" in df["html"] and "a" in df["text"]
    h = run(c, sid, "from IPython.display import HTML, JSON, SVG, display\n"
                    "display(HTML('<b>bold</b>'))\ndisplay(JSON({'k': [1, 2]}))\n"
                    "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))")
    kinds = {k for x in h if x["type"] == "result" for k in x}
    assert {"html", "json", "svg"} <= kinds, h
    assert json.loads([x for x in h if "json" in x][0]["json"]) == {"k": [1, 2]}


def test_errors_keep_the_context(ci, sid):
    c = ci.client
    run(c, sid, "kept = 'still here'")
    e = errors(run(c, sid, "1/0"))
    assert len(e) == 1 and e[0]["name"] == "ZeroDivisionError", e
    assert e[0]["value"] == "division by zero" and "ZeroDivisionError" in e[0]["traceback"]
    assert main_result(run(c, sid, "kept"))["text"] == "'still here'"
    s = errors(run(c, sid, "def broken(:\n  pass"))
    assert s and s[0]["name"] == "SyntaxError", s


def test_contexts(ci, sid):
    c = ci.client
    a = c.post(f"/v1/sandboxes/{sid}/code/contexts", {"cwd": "/tmp"}, expect=(201,))
    b = c.post(f"/v1/sandboxes/{sid}/code/contexts", {"language": "python"}, expect=(201,))
    assert a["language"] == "python" and a["cwd"] == "/tmp" and a["id"] != b["id"]
    run(c, sid, "import os\nmine = 1", context_id=a["id"])
    assert main_result(run(c, sid, "os.getcwd()", context_id=a["id"]))["text"] == "'/tmp'"
    assert errors(run(c, sid, "mine", context_id=b["id"]))[0]["name"] == "NameError"
    ids = [x["id"] for x in c.get(f"/v1/sandboxes/{sid}/code/contexts")["contexts"]]
    assert a["id"] in ids and b["id"] in ids
    c.post(f"/v1/sandboxes/{sid}/code/contexts/{a['id']}/restart", expect=(204,))
    assert errors(run(c, sid, "mine", context_id=a["id"]))[0]["name"] == "NameError"
    c.delete(f"/v1/sandboxes/{sid}/code/contexts/{b['id']}")
    err = run(c, sid, "1", expect=404, context_id=b["id"])
    assert err["error"]["code"] == "not_found", err
    c.expect_error("DELETE", f"/v1/sandboxes/{sid}/code/contexts/{b['id']}", 404, "not_found")
    c.expect_error("DELETE", f"/v1/sandboxes/{sid}/code/contexts/..%2F..", 404, "not_found")
    c.expect_error("POST", f"/v1/sandboxes/{sid}/code/contexts", 400, "bad_request",
                   {"cwd": "relative"})


def test_javascript_and_bash(ci, sid):
    c = ci.client
    run(c, sid, "let n = 20; function twice(v) { return 2 * v }", language="javascript")
    js = run(c, sid, "console.log('n', n); twice(n) + 2", language="javascript")
    assert text(js) == "n 20\n" and main_result(js)["text"] == "42"
    je = errors(run(c, sid, "nope.x", language="javascript"))
    assert je and je[0]["name"] == "ReferenceError", je
    run(c, sid, "cd /tmp\nexport KEEP=kept", language="bash")
    sh = run(c, sid, "echo $PWD $KEEP; echo oops >&2", language="bash")
    assert text(sh) == "/tmp kept\n" and "oops" in text(sh, "stderr")
    fail = errors(run(c, sid, "false", language="bash"))
    assert fail and fail[0]["value"] == "exit status 1", fail


def test_env_is_for_one_run(ci, sid):
    c = ci.client
    r = run(c, sid, "import os\nos.environ.get('ONE_RUN')", env={"ONE_RUN": "yes"})
    assert main_result(r)["text"] == "'yes'"
    # (a cell whose value is None shows no result, as in Jupyter: ask for its repr)
    assert main_result(run(c, sid, "repr(os.environ.get('ONE_RUN'))"))["text"] == "'None'"


def test_bad_bodies(ci, sid):
    c = ci.client
    base = f"/v1/sandboxes/{sid}/code"
    for body in ({}, {"code": 5}, {"code": "1", "language": "cobol"},
                 {"code": "1", "language": "python", "context_id": "ab"},
                 {"code": "1", "timeout_s": 0}, {"code": "1", "timeout_s": "5"},
                 {"code": "1", "env": {"A": 1}}, {"code": "1", "context_id": 7}):
        r = c.request("POST", base, body)
        assert r.status == 400 and r.json()["error"]["code"] == "bad_request", (body, r.body)
    c.expect_error("POST", base, 413, "limit_exceeded", {"code": "x" * (1 << 20)})
    c.expect_error("POST", "/v1/sandboxes/sbx_nope/code", 404, "not_found", {"code": "1"})


def test_timeout_interrupts_the_cell_not_the_context(ci, sid):
    c = ci.client
    run(c, sid, "survivor = 7")
    t0 = time.monotonic()
    r = run(c, sid, "while True:\n    pass", timeout_s=2)
    assert time.monotonic() - t0 < 120
    assert [e["name"] for e in errors(r)][-1] == "TimeoutError", r
    assert main_result(run(c, sid, "survivor"))["text"] == "7"


def test_interrupt_a_running_cell(ci, sid):
    c = ci.client
    ctx = c.post(f"/v1/sandboxes/{sid}/code/contexts", {}, expect=(201,))
    run(c, sid, "before = 'kept'", context_id=ctx["id"])
    lines = []

    def long_run():
        body = {"code": "import time\nprint('started', flush=True)\ntime.sleep(600)",
                "context_id": ctx["id"]}
        for x in c.stream(f"/v1/sandboxes/{sid}/code", body, timeout=600):
            lines.append(x)

    t = threading.Thread(target=long_run)
    t.start()
    poll(lambda: "started" in text(lines), timeout=120, what="the long cell running")
    c.delete(f"/v1/sandboxes/{sid}/code/contexts/{ctx['id']}/execution")
    t.join(60)
    assert not t.is_alive(), "the interrupted run did not end"
    assert "KeyboardInterrupt" in [e["name"] for e in errors(lines)], lines
    assert main_result(run(c, sid, "before", context_id=ctx["id"]))["text"] == "'kept'"


def test_a_caller_that_leaves_interrupts_its_cell(ci, sid):
    """A client that hangs up while its cell prints nothing: the cell is interrupted, so the
    context is free for the next call (which would otherwise wait behind it), and that next
    call, sent at once, runs and answers its result (the interrupted cell's error must not
    make the kernel abort it: Jupyter's stop_on_error). Several rounds, of both a sleeping
    and a busy cell: whether the next call reaches the kernel within the abort window
    depends on timing."""
    c = ci.client
    ctx = c.post(f"/v1/sandboxes/{sid}/code/contexts", {}, expect=(201,))
    # a busy thread of the kernel's own (load there) slows its steps between the
    # interrupted cell's end and the end of that abort window
    run(c, sid, "mark = 'free'\nimport threading\ndef spin():\n    while True:\n        pass\n"
        "threading.Thread(target=spin, daemon=True).start()", context_id=ctx["id"])
    for i, tail in enumerate(["import time\ntime.sleep(600)", "while True:\n    pass"] * 3):
        body = {"code": f"print('busy', flush=True)\n{tail}", "context_id": ctx["id"]}
        first = list(c.stream(f"/v1/sandboxes/{sid}/code", body, max_events=1, timeout=120))
        assert first[0].get("text") == "busy\n", (i, first)
        t0 = time.monotonic()
        r = run(c, sid, "mark", context_id=ctx["id"], timeout_s=120)
        assert (main_result(r) or {}).get("text") == "'free'", (i, r)
        assert time.monotonic() - t0 < 120


def test_a_cell_waiting_behind_an_interrupted_one_runs(ci, sid):
    """A cell sent while another of its context runs waits for it and then runs, also when
    the first one is interrupted (its error must not make the kernel drop the waiting cell)."""
    c = ci.client
    ctx = c.post(f"/v1/sandboxes/{sid}/code/contexts", {}, expect=(201,))
    run(c, sid, "n = 0", context_id=ctx["id"])
    for i in range(5):
        first, second = [], []
        body = {"code": "n += 1\nprint('running', flush=True)\nwhile True:\n    pass",
                "context_id": ctx["id"]}
        t = threading.Thread(target=lambda: first.extend(
            c.stream(f"/v1/sandboxes/{sid}/code", body, timeout=300)))
        t.start()
        poll(lambda: "running" in text(first), timeout=120, what="the first cell running")
        t2 = threading.Thread(target=lambda: second.extend(run(c, sid, "n",
                                                               context_id=ctx["id"])))
        t2.start()
        c.delete(f"/v1/sandboxes/{sid}/code/contexts/{ctx['id']}/execution")
        t.join(120)
        t2.join(120)
        assert "KeyboardInterrupt" in [e["name"] for e in errors(first)], (i, first)
        assert second and main_result(second)["text"] == str(i + 1), (i, second)


def test_a_sandbox_runs_the_interpreter_server_of_its_coved(ci):
    """The interpreter server coved starts in a sandbox is the one this coved carries, not
    the copy its template holds (a template built by an older coved keeps an older server):
    a sandbox whose copy was replaced by one that cannot serve still runs its cells, and
    its copy is coved's own afterwards."""
    c = ci.client
    s = c.create("code-interpreter")["id"]
    try:
        path = "/usr/lib/cove/interp/server.py"
        r = c.exec(s, f"echo 'raise SystemExit(\"an older server\")' > {path}")
        assert r["exit_code"] == 0, r
        assert main_result(run(c, s, "6 * 7"))["text"] == "42"
        with open(os.path.join(ROOT, "src", "interp", "server.py"), "rb") as f:
            got = c.get_file(s, path)
            assert got.status == 200 and got.body == f.read(), got.status
    finally:
        c.remove(s)


def test_huge_output_is_cut_and_the_api_stays_responsive(ci, sid):
    c = ci.client
    done = {}

    def flood():
        # flushed line by line (unflushed, ipykernel buffers the text in the kernel's memory
        # until the sandbox's memory limit ends the kernel: also bounded, but not the cut)
        done["lines"] = run(c, sid, "import sys\nfor i in range(1_000_000):\n"
                                    "    print('y' * 1000, flush=True)", timeout_s=60)

    t = threading.Thread(target=flood)
    t.start()
    t0 = time.monotonic()
    c.get(f"/v1/sandboxes/{sid}")  # the API answers while the cell floods
    assert time.monotonic() - t0 < 30
    t.join(300)
    assert not t.is_alive()
    out = text(done["lines"])
    assert len(out) <= 4 << 20, len(out)
    assert "output cut" in text(done["lines"], "stderr")


def test_fork_bomb_stays_inside_the_sandbox(ci):
    """A fork bomb in a bash cell: the run ends at its timeout, the sandbox's process limit
    holds (the node and the API answer throughout), and the sandbox can still be deleted."""
    c = ci.client
    s = c.create("code-interpreter")["id"]
    try:
        t0 = time.monotonic()
        r = run(c, s, "bomb() { bomb | bomb & }; bomb", language="bash", timeout_s=10)
        assert time.monotonic() - t0 < 300
        assert r[-1] == {"type": "end_of_execution"}
        assert c.get("/healthz")["ok"] is True
        other = c.create("busybox")["id"]
        assert c.exec(other, ["echo", "fine"])["stdout"] == "fine\n"
        c.remove(other)
    finally:
        c.remove(s)


def test_template_without_interpreter_is_a_clear_error(ci):
    c = ci.client
    s = c.create("busybox")["id"]
    try:
        r = c.request("POST", f"/v1/sandboxes/{s}/code", {"code": "1"})
        assert r.status == 400, (r.status, r.body)
        assert "code-interpreter template" in r.json()["error"]["message"]
    finally:
        c.remove(s)


HOSTILE = r'''
import socket, sys
mode = sys.argv[1]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 49999)); s.listen(16)
print("listening", flush=True)
while True:
    k, _ = s.accept()
    k.recv(65536)
    head = b"HTTP/1.0 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n"
    if mode == "garbage":
        k.sendall(head + b'{"type": "stdout", "text": "ok"}\n{"type": "evil", "x": 1}\n')
    elif mode == "notjson":
        k.sendall(head + b"\x00\xff not json at all\n")
    elif mode == "hugeline":
        k.sendall(head)
        try:
            while True:
                k.sendall(b"a" * 1048576)
        except OSError:
            pass
    elif mode == "nohead":
        try:
            while True:
                k.sendall(b"x" * 65536)
        except OSError:
            pass
    elif mode == "noend":
        k.sendall(head + b'{"type": "stdout", "text": "partial"}\n')
    k.close()
'''


@pytest.mark.parametrize("mode,name", [("garbage", "InterpreterError"),
                                       ("notjson", "InterpreterError"),
                                       ("hugeline", "OutputLimit"),
                                       ("noend", "InterpreterError")])
def test_hostile_server_inside_the_sandbox(ci, mode, name):
    """A sandbox process that takes the interpreter's port and answers junk: coved checks
    every line, bounds them, and ends the run with an error line (never a crash or a hang)."""
    c = ci.client
    s = c.create("base")["id"]
    try:
        c.put_file(s, "/tmp/hostile.py", HOSTILE.encode())
        start_background(c, s, ["python3", "/tmp/hostile.py", mode])
        lines = poll(lambda: _try_run(c, s), timeout=60, what="the hostile server listening")
        assert lines[-1] == {"type": "end_of_execution"}, lines[-2:]
        assert errors(lines)[-1]["name"] == name, lines
        assert all(x["type"] in ("stdout", "stderr", "result", "error", "number_of_executions",
                                 "end_of_execution") for x in lines)
        assert c.get("/healthz")["ok"] is True
    finally:
        c.remove(s)


def start_background(c, s, argv):
    """Start argv in sandbox s and leave it running (read its start event, then hang up)."""
    first = next(c.exec(s, argv, wait=False))
    assert first["type"] == "start", first


def _try_run(c, s):
    r = c.request("POST", f"/v1/sandboxes/{s}/code", {"code": "1"})
    if r.status != 200:
        return None
    return [json.loads(x) for x in r.body.splitlines() if x.strip()]


def test_hostile_server_without_a_head(ci):
    c = ci.client
    s = c.create("base")["id"]
    try:
        c.put_file(s, "/tmp/hostile.py", HOSTILE.encode())
        start_background(c, s, ["python3", "/tmp/hostile.py", "nohead"])

        def answered():
            r = c.request("POST", f"/v1/sandboxes/{s}/code", {"code": "1"})
            return r if r.status != 400 else None
        r = poll(answered, timeout=60, what="the hostile server listening")
        assert r.status == 503 and r.json()["error"]["code"] == "unavailable", r.body[:300]
    finally:
        c.remove(s)


@pytest.fixture(scope="module")
def ci_sdk(build_dir):
    return npm_dir(build_dir, CI_SRC, ("package.json", "package-lock.json",
                                       "code_interpreter.test.mjs"),
                   "e2b-ci-sdk", os.path.join("@e2b", "code-interpreter"),
                   "code interpreter SDK test")


def test_e2b_code_interpreter_sdk(ci, ci_sdk):
    env = dict(os.environ, E2B_API_URL=f"http://127.0.0.1:{ci.e2b_api}",
               E2B_SANDBOX_URL=f"http://127.0.0.1:{ci.e2b_sbx}",
               E2B_API_KEY="e2b_" + ci.client.key.encode().hex())
    env.pop("E2B_DEBUG", None)
    r = subprocess.run(["node", "--test", "--test-concurrency=1", "--test-reporter=tap",
                        "code_interpreter.test.mjs"], cwd=ci_sdk, env=env, capture_output=True,
                       text=True, timeout=900)
    out = r.stdout + r.stderr
    summary = [x for x in out.splitlines() if x.startswith(("# pass", "# fail", "# skip"))]
    assert r.returncode == 0, f"code interpreter SDK tests failed ({summary}):\n{out[-12000:]}"
    with open(os.path.join(CI_SRC, "code_interpreter.test.mjs")) as f:
        want = len(re.findall(r"^test\(", f.read(), re.M))
    passed = [int(x.split()[2]) for x in summary if x.startswith("# pass ")]
    assert want and passed == [want], (want, summary, out[-3000:])
