"""Sandboxes and what an agent does with them: exec (wait, or stream with callbacks, resuming
a dropped stream without losing or repeating a byte), files, terminals, and the time
machine (snapshots, diffs, fork, rewind, pause, resume)."""
import base64
import http.client
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

from .client import Client, Json, q
from .errors import ConnectionFailed, CoveError

Command = Union[str, Sequence[str]]
OnBytes = Callable[[bytes], None]


@dataclass
class ExecResult:
    """A finished process. stdout/stderr are bytes (pty output is in stdout)."""

    pid: int
    exit_code: Optional[int]
    signal: Optional[int] = None
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    truncated: bool = False
    events: List[Json] = field(default_factory=list, repr=False)  # stream mode only

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode(errors="replace")


def _cmd_body(cmd: Command) -> Json:
    return {"shell": cmd} if isinstance(cmd, str) else {"cmd": list(cmd)}


class Files:
    """The sandbox's files: paths are absolute inside the sandbox."""

    def __init__(self, sb: "Sandbox"):
        self._sb = sb

    def _p(self, what: str, path: str) -> str:
        return f"/v1/sandboxes/{self._sb.id}/{what}?path={q(path)}"

    def read(self, path: str) -> bytes:
        status, _, data = self._sb.client.raw("GET", self._p("files", path))
        if status >= 400:
            self._sb.client._raise(status, data)
        return data

    def read_text(self, path: str) -> str:
        return self.read(path).decode(errors="replace")

    def write(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> Json:
        """Replace path atomically (the old file stays until the whole body arrived)."""
        url = self._p("files", path) + (f"&mode={mode:04o}" if mode is not None else "")
        return self._sb.client.call("PUT", url, data.encode() if isinstance(data, str) else data,
                                    headers={"Content-Type": "application/octet-stream"})

    def list(self, path: str = "/", depth: int = 1) -> List[Json]:
        return self._sb.client.get(self._p("fs", path) + f"&depth={depth}")["entries"]

    def mkdir(self, path: str) -> Json:
        return self._sb.client.post(f"/v1/sandboxes/{self._sb.id}/fs/mkdir", {"path": path})

    def move(self, src: str, dst: str) -> Json:
        return self._sb.client.post(f"/v1/sandboxes/{self._sb.id}/fs/move",
                                    {"from": src, "to": dst})

    def remove(self, path: str, recursive: bool = False) -> None:
        self._sb.client.post(f"/v1/sandboxes/{self._sb.id}/fs/remove",
                             {"path": path, "recursive": recursive})

    def watch(self, path: str, recursive: bool = True) -> Iterator[Json]:
        """Events {seq, type: create|write|remove|rename, path} as they happen; the watch
        ends when the iterator is closed (break out of the loop, or .close() it)."""
        url = self._p("fs/watch", path) + ("&recursive=true" if recursive else "")
        try:
            yield from self._sb.client._lines("GET", url, None)
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise ConnectionFailed(f"watch of {path}: the stream broke: {e}")


class PtySession:
    """A program on a terminal. Output goes to on_data (from a reader thread) and is kept
    in .output; write() types, resize() changes the window, wait() returns the exit."""

    def __init__(self, sb: "Sandbox", events: Iterator[Json], on_data: Optional[OnBytes]):
        self._sb = sb
        self._events = events
        self._on_data = on_data
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._done = threading.Event()
        self.pid: Optional[int] = None
        self.result: Optional[ExecResult] = None
        self.error: Optional[BaseException] = None
        self._thr = threading.Thread(target=self._run, daemon=True)
        self._thr.start()
        self._started.wait(self._sb.client.timeout)
        if self.pid is None:
            self._done.wait(1)
            raise self.error or CoveError("pty: the process did not start")

    def _run(self) -> None:
        try:
            for ev in self._events:
                t = ev.get("type")
                if t == "start":
                    self.pid = ev["pid"]
                    self._started.set()
                elif t in ("pty", "stdout", "stderr"):
                    b = base64.b64decode(ev["data_b64"])
                    with self._lock:
                        self._buf += b
                    if self._on_data:
                        self._on_data(b)
                elif t == "exit":
                    self.result = ExecResult(self.pid or 0, ev.get("exit_code"),
                                             ev.get("signal"), bytes(self._buf),
                                             timed_out=bool(ev.get("timed_out")))
                elif t == "error":
                    self.error = CoveError(ev.get("message", "pty failed"), 0, ev.get("code"))
        except BaseException as e:  # reported by wait()
            self.error = e
        finally:
            self._started.set()
            self._done.set()

    @property
    def output(self) -> bytes:
        with self._lock:
            return bytes(self._buf)

    def _proc(self, what: str) -> str:
        return f"/v1/sandboxes/{self._sb.id}/processes/{self.pid}/{what}"

    def write(self, data: Union[bytes, str]) -> None:
        self._sb.client.call("POST", self._proc("stdin"),
                             data.encode() if isinstance(data, str) else data,
                             headers={"Content-Type": "application/octet-stream"})

    def resize(self, cols: int, rows: int) -> None:
        self._sb.client.post(self._proc("resize"), {"cols": cols, "rows": rows})

    def kill(self, signal: Union[str, int] = "KILL") -> None:
        self._sb.client.post(self._proc("signal"), {"signal": signal})

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"pty process {self.pid} still running")
        if self.result is None:
            raise self.error or CoveError("pty: the stream ended without an exit")
        return self.result


class Pty:
    def __init__(self, sb: "Sandbox"):
        self._sb = sb

    def open(self, cmd: Command = "/bin/sh", cols: int = 80, rows: int = 24,
             on_data: Optional[OnBytes] = None, **fields: Any) -> PtySession:
        body = dict(_cmd_body(cmd), pty={"cols": cols, "rows": rows}, stdin=True, **fields)
        return PtySession(self._sb, self._sb._exec_events(body), on_data)


class Sandbox:
    """One sandbox. Make one with Sandbox.create(...) or Sandbox.get(id)."""

    def __init__(self, info: Json, client: Client):
        self.client = client
        self.info = info
        self.id: str = info["id"]
        self.files = Files(self)
        self.pty = Pty(self)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.info.get('state')!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete()

    # -- lifecycle ---------------------------------------------------------------------
    @classmethod
    def create(cls, template: str = "base", client: Optional[Client] = None,
               **fields: Any) -> "Sandbox":
        """POST /v1/sandboxes: fields as in docs/api.md (runtime, cpus, memory_mb, disk_mb,
        timeout_s, env, metadata, egress, snapshot_interval_s, …)."""
        c = client or Client()
        return cls(c.post("/v1/sandboxes", dict(fields, template=template)), c)

    @classmethod
    def get(cls, sandbox_id: str, client: Optional[Client] = None) -> "Sandbox":
        c = client or Client()
        return cls(c.get(f"/v1/sandboxes/{q(sandbox_id)}"), c)

    @classmethod
    def list(cls, client: Optional[Client] = None, state: Optional[str] = None) -> List["Sandbox"]:
        c = client or Client()
        url = "/v1/sandboxes" + (f"?state={q(state)}" if state else "")
        return [cls(s, c) for s in c.get(url)["sandboxes"]]

    def refresh(self) -> Json:
        self.info = self.client.get(f"/v1/sandboxes/{self.id}")
        return self.info

    @property
    def state(self) -> str:
        return self.refresh()["state"]

    def delete(self, purge: bool = False) -> None:
        self.client.call("DELETE", f"/v1/sandboxes/{self.id}" + ("?purge=true" if purge else ""))

    def set_timeout(self, timeout_s: int) -> Json:
        self.info = self.client.post(f"/v1/sandboxes/{self.id}/timeout", {"timeout_s": timeout_s})
        return self.info

    def egress(self, policy: Optional[Json] = None) -> Json:
        """The egress policy and address; with policy ({allow, deny, secrets}) sets it."""
        if policy is None:
            return self.client.get(f"/v1/sandboxes/{self.id}/egress")
        return self.client.call("PUT", f"/v1/sandboxes/{self.id}/egress", {"egress": policy})

    # -- processes ---------------------------------------------------------------------
    def _exec_events(self, body: Json) -> Iterator[Json]:
        def resume(first: Json, last: int) -> Optional[str]:
            pid = first.get("pid") if first.get("type") == "start" else None
            if pid is None:
                return None
            return f"/v1/sandboxes/{self.id}/processes/{pid}/events?after={last}"
        return self.client.events("POST", f"/v1/sandboxes/{self.id}/exec", body, resume)

    def exec(self, cmd: Command, *, stdin: Union[None, bytes, str] = None,
             on_stdout: Optional[OnBytes] = None, on_stderr: Optional[OnBytes] = None,
             on_event: Optional[Callable[[Json], None]] = None, stream: bool = False,
             env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
             user: Optional[str] = None, timeout_s: Optional[int] = None,
             tag: Optional[str] = None) -> ExecResult:
        """Run cmd (a shell string, or an argv list run without a shell) and wait for it.
        With callbacks (or stream=True) the output streams as it comes: a dropped connection
        is resumed with ?after=SEQ, so every byte reaches the callbacks exactly once. stdin:
        bytes written to the process, then closed."""
        body = _cmd_body(cmd)
        for k, v in (("env", env), ("cwd", cwd), ("user", user), ("timeout_s", timeout_s),
                     ("tag", tag)):
            if v is not None:
                body[k] = v
        if not (stream or on_stdout or on_stderr or on_event or stdin is not None):
            body["wait"] = True
            r = self.client.post(f"/v1/sandboxes/{self.id}/exec", body)
            out = {}
            for k in ("stdout", "stderr"):
                if r.get(k) is not None:
                    out[k] = r[k].encode()
                else:
                    out[k] = base64.b64decode(r.get(k + "_b64") or "")
            return ExecResult(r["pid"], r.get("exit_code"), r.get("signal"), out["stdout"],
                              out["stderr"], bool(r.get("timed_out")), bool(r.get("truncated")))
        if stdin is not None:
            body["stdin"] = True
        res = ExecResult(0, None)
        outs = {"stdout": bytearray(), "stderr": bytearray(), "pty": bytearray()}
        for ev in self._exec_events(body):
            res.events.append(ev)
            if on_event:
                on_event(ev)
            t = ev.get("type")
            if t == "start":
                res.pid = ev["pid"]
                if stdin is not None:
                    data = stdin.encode() if isinstance(stdin, str) else stdin
                    self.client.call("POST", f"/v1/sandboxes/{self.id}/processes/{res.pid}"
                                     "/stdin?eof=true", data,
                                     headers={"Content-Type": "application/octet-stream"})
            elif t in outs:
                b = base64.b64decode(ev["data_b64"])
                outs[t] += b
                cb = on_stderr if t == "stderr" else on_stdout
                if cb:
                    cb(b)
            elif t == "exit":
                res.exit_code, res.signal = ev.get("exit_code"), ev.get("signal")
                res.timed_out = bool(ev.get("timed_out"))
            elif t == "error":
                raise CoveError(ev.get("message", "exec failed"), 400, ev.get("code"))
        res.stdout = bytes(outs["stdout"] + outs["pty"])
        res.stderr = bytes(outs["stderr"])
        return res

    def processes(self) -> List[Json]:
        return self.client.get(f"/v1/sandboxes/{self.id}/processes")["processes"]

    # -- the time machine --------------------------------------------------------------
    def snapshot(self, label: Optional[str] = None, kind: Optional[str] = None) -> Json:
        body: Json = {}
        if label is not None:
            body["label"] = label
        if kind is not None:
            body["kind"] = kind
        return self.client.post(f"/v1/sandboxes/{self.id}/snapshots", body)

    def snapshots(self) -> List[Json]:
        """The timeline, newest first."""
        return self.client.get(f"/v1/sandboxes/{self.id}/snapshots")["snapshots"]

    def fork(self, snapshot_id: Optional[str] = None, count: int = 1) -> List["Sandbox"]:
        body: Json = {"count": count}
        if snapshot_id:
            body["snapshot_id"] = snapshot_id
        r = self.client.post(f"/v1/sandboxes/{self.id}/fork", body)
        return [Sandbox(s, self.client) for s in r["sandboxes"]]

    def rewind(self, snapshot_id: str) -> str:
        """Put the sandbox back to snapshot_id; returns the snapshot that undoes it."""
        r = self.client.post(f"/v1/sandboxes/{self.id}/rewind", {"snapshot_id": snapshot_id})
        self.info = r["sandbox"]
        return r["undo_snapshot_id"]

    def pause(self) -> Json:
        """Snapshot, then stop the instance; returns the snapshot."""
        r = self.client.post(f"/v1/sandboxes/{self.id}/pause")
        self.info = r["sandbox"]
        return r["snapshot"]

    def resume(self, snapshot_id: Optional[str] = None) -> Json:
        body = {"snapshot_id": snapshot_id} if snapshot_id else {}
        self.info = self.client.post(f"/v1/sandboxes/{self.id}/resume", body)
        return self.info

    def diff(self, from_snapshot: str, to_snapshot: Optional[str] = None,
             path: Optional[str] = None) -> Json:
        """What changed from from_snapshot to to_snapshot ({added, changed, removed}); with
        to_snapshot None, to a snapshot of the sandbox taken now (kind files)."""
        if to_snapshot is None:
            to_snapshot = self.snapshot(label="diff", kind="files")["id"]
        return diff(from_snapshot, to_snapshot, path, client=self.client)


def diff(a: str, b: str, path: Optional[str] = None, client: Optional[Client] = None) -> Json:
    """GET /v1/snapshots/{a}/diff/{b}: {from, to, added, changed, removed, truncated}."""
    c = client or Client()
    return c.get(f"/v1/snapshots/{q(a)}/diff/{q(b)}" + (f"?path={q(path)}" if path else ""))


def diff_file(a: str, b: str, path: str, client: Optional[Client] = None) -> Json:
    """One file's unified diff: {path, status, binary, diff}. LimitExceeded past 1 MiB."""
    c = client or Client()
    return c.get(f"/v1/snapshots/{q(a)}/diff/{q(b)}/file?path={q(path)}")


def audit(client: Optional[Client] = None, sandbox: Optional[str] = None,
          kind: Optional[str] = None, after: int = 0, follow: bool = False,
          poll_s: float = 1.0, page: int = 1000) -> Iterator[Json]:
    """Audit events oldest first, page by page; follow=True keeps polling for new ones."""
    import time
    c = client or Client()
    while True:
        url = f"/v1/audit?after={after}&limit={page}"
        if sandbox:
            url += f"&sandbox={q(sandbox)}"
        if kind:
            url += f"&kind={q(kind)}"
        r = c.get(url)
        for ev in r["events"]:
            yield ev
        nxt = r.get("next_after") or after
        if r["events"] and nxt > after:
            after = nxt
            continue
        if not follow:
            return
        time.sleep(poll_s)


