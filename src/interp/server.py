#!/usr/bin/python3
"""cove's code interpreter server, run inside a sandbox (the code-interpreter template).

Started by coved on first use (as an ordinary sandbox process, shown in its process list),
it listens on port 49999 inside the sandbox and speaks the line protocol the E2B code
interpreter SDK expects, which cove's own API (POST /v1/sandboxes/{id}/code) relays:

  POST /execute {code, language?, context_id?, env_vars?, timeout_ms?}
       -> NDJSON lines: {"type":"stdout"|"stderr","text"}, {"type":"result", <format>: …,
          "is_main_result"}, {"type":"error","name","value","traceback"},
          {"type":"number_of_executions","execution_count"}, {"type":"end_of_execution"}
  POST /contexts {language?, cwd?} -> {id, language, cwd}
  GET /contexts -> [{id, language, cwd}]
  DELETE /contexts/{id}, POST /contexts/{id}/restart, POST /contexts/{id}/interrupt
  GET /health

Contexts keep their state between calls: Python runs in a real Jupyter kernel (ipykernel,
so rich results — HTML, PNG figures, JSON — come from it), JavaScript in a persistent
Node.js process (jskernel.js next to this file), bash in a persistent shell. One call at a
time per context (others wait); a call's output is bounded (a marker says what was cut);
a call's timeout interrupts the cell, never the context. Everything here runs with the
sandbox's own rights: it is a convenience inside the sandbox, not a security boundary.
"""
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = int(os.environ.get("COVE_INTERP_PORT", "49999"))
OUTPUT_MAX = int(os.environ.get("COVE_INTERP_OUTPUT_MAX", str(4 << 20)))  # bytes per call
BODY_MAX = 16 << 20
DEFAULT_CWD = os.environ.get("COVE_INTERP_CWD") or os.path.expanduser("~")
LANGS = ("python", "javascript", "bash")
ALIASES = {"py": "python", "python3": "python", "js": "javascript", "node": "javascript",
           "sh": "bash", "shell": "bash", "ts": "javascript", "typescript": "javascript"}

# mime type -> the field a result line carries it in (E2B's Result fields)
MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown",
        "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
        "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
        "application/javascript": "javascript"}


class Out:
    """The line stream of one call, with the output bound."""

    def __init__(self, emit):
        self.emit = emit
        self.text_bytes = 0
        self.cut = False

    def text(self, kind, s):
        if not s or self.cut:
            return
        b = len(s.encode("utf-8", "replace"))
        if self.text_bytes + b > OUTPUT_MAX:
            room = max(0, OUTPUT_MAX - self.text_bytes)
            if room:
                self.emit({"type": kind, "text": s.encode("utf-8", "replace")[:room].decode(
                    "utf-8", "ignore")})
            self.emit({"type": "stderr", "text": "\n[cove: output cut after %d bytes; the cell "
                       "goes on running]\n" % OUTPUT_MAX})
            self.cut = True
            self.text_bytes = OUTPUT_MAX
            return
        self.text_bytes += b
        self.emit({"type": kind, "text": s})

    def result(self, data, main):
        line = {"type": "result", "is_main_result": bool(main)}
        for mime, v in data.items():
            key = MIME.get(mime, mime)
            if key == "json" and not isinstance(v, str):
                v = json.dumps(v)
            line[key] = v
        self.emit(line)

    def error(self, name, value, tb):
        self.emit({"type": "error", "name": name, "value": value, "traceback": tb})


class PythonKernel:
    """A Jupyter kernel (ipykernel) through jupyter_client."""

    def __init__(self, cwd, env):
        from jupyter_client.manager import KernelManager
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=cwd, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.count = 0

    def _drain(self, msg_id, out, deadline, on_timeout):
        timed_out = False
        while True:
            left = deadline - time.monotonic() if deadline else 3600
            if left <= 0 and not timed_out:
                timed_out = True
                on_timeout()
                deadline = time.monotonic() + 30  # the interrupt's own answer
                left = 30
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 1.0))
            except queue.Empty:
                if not self.km.is_alive():
                    out.error("KernelDied", "the kernel died", "")
                    return timed_out
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                out.text("stdout" if c.get("name") == "stdout" else "stderr", c.get("text", ""))
            elif t == "execute_result":
                out.result(c.get("data", {}), True)
            elif t == "display_data":
                out.result(c.get("data", {}), False)
            elif t == "error":
                if not timed_out:
                    out.error(c.get("ename", "Error"), c.get("evalue", ""),
                              "\n".join(c.get("traceback", [])))
            elif t == "execute_input":
                self.count = c.get("execution_count", self.count)
            elif t == "status" and c.get("execution_state") == "idle":
                return timed_out

    def run(self, code, env_vars, out, timeout_s, interrupt):
        restore = None
        if env_vars:
            keys = json.dumps(list(env_vars))
            setup = ("import os as __cove_os\n__cove_saved = {k: __cove_os.environ.get(k) for k "
                     "in %s}\n__cove_os.environ.update(%s)\n" % (keys, json.dumps(env_vars)))
            restore = ("for __k, __v in __cove_saved.items():\n"
                       "    __cove_os.environ.pop(__k, None) if __v is None else "
                       "__cove_os.environ.__setitem__(__k, __v)\n")
            mid = self.kc.execute(setup, silent=True, store_history=False, stop_on_error=False)
            self._drain(mid, Out(lambda x: None), 0, lambda: None)
        # stop_on_error=False: after a cell's error (an interrupt is one) ipykernel otherwise
        # aborts, unrun, the requests that reach it within a short window, and the next cell
        # (sent as soon as the interrupted one lets go of the context) can fall into it.
        # Cells of a context never queue in the kernel here (the context's lock), so
        # there is nothing that abort should drop.
        mid = self.kc.execute(code, store_history=True, stop_on_error=False)
        deadline = time.monotonic() + timeout_s if timeout_s else 0
        timed_out = self._drain(mid, out, deadline, interrupt)
        if restore:
            r = self.kc.execute(restore, silent=True, store_history=False, stop_on_error=False)
            self._drain(r, Out(lambda x: None), 0, lambda: None)
        return timed_out

    def alive(self):
        return self.km.is_alive()

    def interrupt(self):
        self.km.interrupt_kernel()

    def close(self):
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass


class PipeKernel:
    """A persistent child process fed one cell at a time; its output is read until the
    cell's end marker (a random nonce per cell, so code cannot fake it)."""

    def __init__(self, argv, cwd, env):
        self.p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        self.q = queue.Queue()
        self.count = 0
        for name, f in (("stdout", self.p.stdout), ("stderr", self.p.stderr)):
            threading.Thread(target=self._reader, args=(name, f), daemon=True).start()

    def _reader(self, name, f):
        while True:
            b = f.read1(65536) if hasattr(f, "read1") else f.read(65536)
            if not b:
                self.q.put((name, None))
                return
            self.q.put((name, b))

    def alive(self):
        return self.p.poll() is None

    def interrupt(self):
        try:
            os.killpg(self.p.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def close(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()


class BashKernel(PipeKernel):
    def __init__(self, cwd, env):
        super().__init__(["bash", "--noprofile", "--norc"], cwd, env)

    def run(self, code, env_vars, out, timeout_s, interrupt):
        self.count += 1
        nonce = uuid.uuid4().hex
        path = "/tmp/.cove-cell-%s.sh" % nonce
        with open(path, "w") as f:
            f.write(code + "\n")
        exports = "".join("export %s=%s\n" % (k, shq(v)) for k, v in (env_vars or {}).items())
        # a subshell keeps the env of this call from leaking; cwd and variables persist
        # only without env_vars (as a plain shell would)
        body = ("( %s source %s </dev/null )" % (exports.replace("\n", "; "), path)
                if env_vars else "source %s </dev/null" % path)
        script = ("%s\n__cove_rc=$?; rm -f %s; printf '\\n\\036%s %%d\\n' $__cove_rc; "
                  "printf '\\036%s\\n' >&2\n" % (body, path, nonce, nonce))
        self.p.stdin.write(script.encode())
        self.p.stdin.flush()
        rc = self._collect(nonce, out, timeout_s, interrupt)
        if rc not in (None, 0):
            out.error("ExitCode", "exit status %d" % rc, "")
        return rc is None

    def _collect(self, nonce, out, timeout_s, interrupt):
        mark = ("\x1e%s" % nonce).encode()
        bufs = {"stdout": b"", "stderr": b""}
        done = {"stdout": None, "stderr": False}
        deadline = time.monotonic() + timeout_s if timeout_s else 0
        timed_out = False
        while done["stdout"] is None or not done["stderr"]:
            left = deadline - time.monotonic() if deadline else 3600
            if deadline and left <= 0 and not timed_out:
                timed_out = True
                interrupt()
            try:
                name, b = self.q.get(timeout=max(0.05, min(left, 1.0)))
            except queue.Empty:
                continue
            if b is None:
                out.error("KernelDied", "the shell exited", "")
                return None
            buf = bufs[name] + b
            i = buf.find(mark)
            if i >= 0:
                text, rest = buf[:i], buf[i + len(mark):]
                if name == "stdout":
                    if text.endswith(b"\n"):
                        text = text[:-1]
                    nl = rest.find(b"\n")
                    try:
                        done["stdout"] = int(rest[:nl].strip() or b"0")
                    except ValueError:
                        done["stdout"] = 1
                else:
                    done["stderr"] = True
                out.text(name, text.decode("utf-8", "replace"))
                bufs[name] = b""
                continue
            # keep a tail that could be the start of the marker
            keep = len(mark)
            emit, bufs[name] = buf[:-keep] if len(buf) > keep else b"", buf[-keep:]
            out.text(name, emit.decode("utf-8", "replace"))
        return None if timed_out else done["stdout"]


class JsKernel(PipeKernel):
    def __init__(self, cwd, env):
        super().__init__(["node", os.path.join(HERE, "jskernel.js")], cwd, env)
        self.lines = b""

    def run(self, code, env_vars, out, timeout_s, interrupt):
        self.count += 1
        nonce = uuid.uuid4().hex
        self.p.stdin.write((json.dumps({"code": code, "env": env_vars or {}, "nonce": nonce,
                                        "timeout_ms": int(timeout_s * 1000)})
                            + "\n").encode())
        self.p.stdin.flush()
        # the vm's own timeout ends a synchronous runaway and keeps the context; only a cell
        # still busy 2 s later (an async hang) gets the process interrupted, losing it
        deadline = time.monotonic() + timeout_s if timeout_s else 0
        timed_out = False
        while True:
            left = deadline - time.monotonic() if deadline else 3600
            if deadline and left <= 0:
                if timed_out:
                    interrupt()
                    deadline = 0
                else:
                    timed_out = True
                    deadline = time.monotonic() + 2
                    left = 2
            try:
                name, b = self.q.get(timeout=max(0.05, min(left, 1.0)))
            except queue.Empty:
                continue
            if b is None:
                if name == "stdout":
                    out.error("KernelDied", "node exited", "")
                    return timed_out
                continue
            if name == "stderr":
                out.text("stderr", b.decode("utf-8", "replace"))
                continue
            self.lines += b
            while b"\n" in self.lines:
                line, self.lines = self.lines.split(b"\n", 1)
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                if m.get("nonce") != nonce:
                    continue
                k = m.get("type")
                if k in ("stdout", "stderr"):
                    out.text(k, m.get("text", ""))
                elif k == "result":
                    out.result(m.get("data", {}), True)
                elif k == "error" and not (timed_out and "timed out" in m.get("value", "")):
                    out.error(m.get("name", "Error"), m.get("value", ""), m.get("traceback", ""))
                elif k == "end":
                    return timed_out


def shq(s):
    return "'" + str(s).replace("'", "'\\''") + "'"


KERNELS = {"python": PythonKernel, "javascript": JsKernel, "bash": BashKernel}


class Context:
    def __init__(self, language, cwd):
        self.id = uuid.uuid4().hex
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()  # one call at a time
        self.kernel = None
        self.start_lock = threading.Lock()
        self.run_mu = threading.Lock()
        self.running = None  # the token of the call whose cell is in the kernel now

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def get_kernel(self):
        with self.start_lock:
            if self.kernel is not None and not self.kernel.alive():
                self.kernel.close()  # died (or was ended by an interrupt): a fresh one
                self.kernel = None
            if self.kernel is None:
                env = dict(os.environ)
                env.pop("COVE_INTERP_PORT", None)
                env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
                os.makedirs(self.cwd, exist_ok=True)
                self.kernel = KERNELS[self.language](self.cwd, env)
            return self.kernel

    def restart(self):
        with self.start_lock:
            if self.kernel:
                self.kernel.close()
            self.kernel = None

    def interrupt(self):
        k = self.kernel
        if k:
            k.interrupt()

    def interrupt_call(self, token):
        """Interrupt the cell of one call, only while it is the one in the kernel: a caller
        that leaves just as its cell ends must not interrupt the next call's cell (the
        signal is sent under run_mu, before the cell's end lets the next one in)."""
        with self.run_mu:
            if self.running is token and self.kernel:
                self.kernel.interrupt()


class State:
    def __init__(self):
        self.mu = threading.Lock()
        self.contexts = {}
        self.defaults = {}

    def new(self, language, cwd):
        c = Context(language, cwd)
        with self.mu:
            self.contexts[c.id] = c
        return c

    def default(self, language):
        with self.mu:
            c = self.defaults.get(language)
            if c is None:
                c = Context(language, DEFAULT_CWD)
                self.defaults[language] = c
                self.contexts[c.id] = c
            return c

    def get(self, cid):
        with self.mu:
            return self.contexts.get(cid)

    def drop(self, cid):
        with self.mu:
            c = self.contexts.pop(cid, None)
            for k, v in list(self.defaults.items()):
                if v is c:
                    del self.defaults[k]
        return c


STATE = State()


def norm_lang(v):
    if v is None:
        return "python"
    if not isinstance(v, str):
        return None
    v = v.strip().lower()
    v = ALIASES.get(v, v)
    return v if v in LANGS else None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "cove-interp"

    def log_message(self, fmt, *args):
        pass

    def _json(self, status, obj):
        b = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def _err(self, status, msg):
        self._json(status, {"error": msg, "message": msg})

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > BODY_MAX:
            raise ValueError("body too large")
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        v = json.loads(raw)
        if not isinstance(v, dict):
            raise ValueError("the body must be a JSON object")
        return v

    def _path(self):
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def do_GET(self):
        p = self._path()
        if p == "/health":
            return self._json(200, {"status": "ok"})
        if p == "/contexts":
            with STATE.mu:
                cs = [c.info() for c in STATE.contexts.values()]
            return self._json(200, cs)
        return self._err(404, "no route GET %s" % p)

    def do_DELETE(self):
        parts = self._path().strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":
            c = STATE.drop(parts[1])
            if not c:
                return self._err(404, "context %s not found" % parts[1])
            c.interrupt()
            c.restart()
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        return self._err(404, "no route DELETE %s" % self._path())

    def do_POST(self):
        p = self._path()
        try:
            body = self._body()
        except ValueError as e:
            return self._err(400, str(e))
        parts = p.strip("/").split("/")
        if p == "/execute":
            return self._execute(body)
        if p == "/contexts":
            lang = norm_lang(body.get("language"))
            if not lang:
                return self._err(400, "language must be one of %s" % ", ".join(LANGS))
            cwd = body.get("cwd") or DEFAULT_CWD
            if not isinstance(cwd, str) or not cwd.startswith("/"):
                return self._err(400, "cwd must be an absolute path")
            return self._json(200, STATE.new(lang, cwd).info())
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] in ("restart", "interrupt"):
            c = STATE.get(parts[1])
            if not c:
                return self._err(404, "context %s not found" % parts[1])
            if parts[2] == "interrupt":
                c.interrupt()
            else:
                c.interrupt()
                c.restart()
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        return self._err(404, "no route POST %s" % p)

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self._err(400, "code (a string) is required")
        cid, lang = body.get("context_id"), body.get("language")
        if cid and lang:
            return self._err(400, "give context_id or language, not both")
        if cid:
            c = STATE.get(cid)
            if not c:
                return self._err(404, "context %s not found" % cid)
        else:
            lang = norm_lang(lang)
            if not lang:
                return self._err(400, "language must be one of %s" % ", ".join(LANGS))
            c = STATE.default(lang)
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            return self._err(400, "env_vars must be an object of strings")
        timeout_s = body.get("timeout_s") or 0
        if not isinstance(timeout_s, (int, float)) or timeout_s < 0:
            return self._err(400, "timeout_s must be a non-negative number")
        chunked = self.request_version != "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
        self.end_headers()
        gone = threading.Event()
        token = object()

        def emit(obj):
            if gone.is_set():
                return
            b = (json.dumps(obj) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b) if chunked else b)
                self.wfile.flush()
            except OSError:
                gone.set()
                c.interrupt_call(token)  # the caller went away: stop its cell, keep the context

        out = Out(emit)
        finished = threading.Event()

        def watch():
            # a caller that went away while the cell prints nothing is noticed here
            import select
            sock = self.connection
            while not finished.wait(0.5):
                try:
                    r, _, _ = select.select([sock], [], [], 0)
                    if r and sock.recv(1, socket.MSG_PEEK) == b"":
                        gone.set()
                        c.interrupt_call(token)
                        return
                except OSError:
                    gone.set()
                    c.interrupt_call(token)
                    return

        threading.Thread(target=watch, daemon=True).start()
        with c.lock:
            try:
                k = c.get_kernel()
            except Exception as e:  # the kernel did not start: say why, keep serving
                out.error("KernelStartError", str(e), "")
                k = None
            if k:
                with c.run_mu:
                    c.running = token
                try:
                    timed_out = k.run(code, env_vars, out, timeout_s,
                                      lambda: c.interrupt_call(token))
                finally:
                    with c.run_mu:
                        c.running = None
                if timed_out:
                    out.error("TimeoutError", "the cell ran longer than %g s and was "
                              "interrupted (the context keeps its state)" % timeout_s, "")
                emit({"type": "number_of_executions", "execution_count": k.count})
            finished.set()
        emit({"type": "end_of_execution"})
        if chunked:
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass


def main():
    srv = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    srv.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("cove-interp listening on %d" % PORT, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
