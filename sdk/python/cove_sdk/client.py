"""The HTTP side of the SDK: one `Client` per coved endpoint and API key, over TCP or the
unix socket (standard library only: http.client), JSON calls that raise the typed errors
of errors.py, and NDJSON streams that resume after a dropped connection with ?after=SEQ."""
import http.client
import json
import os
import socket
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from .errors import ConnectionFailed, CoveError, from_answer

Json = Dict[str, Any]
Body = Union[None, bytes, str, Json, List[Any]]

DEFAULT_DATA_DIR = "/var/lib/cove"
STREAM_LINE_MAX = 4 << 20  # a longer NDJSON line is not something coved sends


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def q(value: str) -> str:
    """Percent-encode a query value or path segment."""
    return urllib.parse.quote(str(value), safe="/")


class Client:
    """Talks to one coved. url: "http://HOST:PORT" or "unix:/path/coved.sock" (default:
    $COVE_URL, else the unix socket $COVE_DATA_DIR/coved.sock). api_key: default
    $COVE_API_KEY; on the unix socket no key means the node's admin. timeout: seconds per
    blocking read (streams wait at most this long between two events' bytes)."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None,
                 timeout: float = 120.0, reconnect_tries: int = 30):
        url = url or os.environ.get("COVE_URL")
        if not url:
            data = os.environ.get("COVE_DATA_DIR", DEFAULT_DATA_DIR)
            url = "unix:" + os.path.join(data, "coved.sock")
        self.url = url
        self.api_key = api_key if api_key is not None else os.environ.get("COVE_API_KEY")
        self.timeout = timeout
        self.reconnect_tries = reconnect_tries
        if url.startswith("unix:"):
            self._unix: Optional[str] = url[5:]
            self._host, self._port = "localhost", 0
        else:
            u = urllib.parse.urlsplit(url)
            if u.scheme != "http" or not u.hostname:
                raise ValueError(f"url must be http://HOST:PORT or unix:/path, not {url!r}")
            self._unix = None
            self._host, self._port = u.hostname, u.port or 80

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- transport ---------------------------------------------------------------------
    def _conn(self, timeout: Optional[float] = None) -> http.client.HTTPConnection:
        t = self.timeout if timeout is None else timeout
        if self._unix is not None:
            return _UnixConnection(self._unix, t)
        return http.client.HTTPConnection(self._host, self._port, timeout=t)

    def _headers(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        h = {"Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(extra or {})
        return h

    @staticmethod
    def _encode(body: Body, h: Dict[str, str]) -> Optional[bytes]:
        if body is None:
            return None
        if isinstance(body, (dict, list)):
            h.setdefault("Content-Type", "application/json")
            return json.dumps(body).encode()
        if isinstance(body, str):
            return body.encode()
        return bytes(body)

    @staticmethod
    def _raise(status: int, data: bytes) -> None:
        try:
            e = json.loads(data)["error"]
            code, msg = e.get("code"), e.get("message") or ""
        except (ValueError, KeyError, TypeError, AttributeError):
            code, msg = None, data[:300].decode(errors="replace") or f"HTTP {status}"
        raise from_answer(status, code, msg)

    def raw(self, method: str, path: str, body: Body = None,
            headers: Optional[Dict[str, str]] = None,
            timeout: Optional[float] = None) -> Tuple[int, Dict[str, str], bytes]:
        """One request; (status, lower-cased headers, body bytes) whatever the status."""
        h = self._headers(headers)
        data = self._encode(body, h)
        c = self._conn(timeout)
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"{method} {path}: cannot reach coved at {self.url}: {e}")
        finally:
            c.close()

    def call(self, method: str, path: str, body: Body = None,
             headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> Any:
        """The decoded JSON answer (None when empty); a CoveError subclass for an error."""
        status, _, data = self.raw(method, path, body, headers, timeout)
        if status >= 400:
            self._raise(status, data)
        return json.loads(data) if data else None

    def get(self, path: str, **kw: Any) -> Any:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Body = None, **kw: Any) -> Any:
        return self.call("POST", path, {} if body is None else body, **kw)

    # -- streams -----------------------------------------------------------------------
    def _lines(self, method: str, path: str, body: Body) -> Iterator[Json]:
        """Events of one NDJSON answer; the connection closes when the generator does. A
        line cut by a dropped connection is not yielded (the caller resumes before it)."""
        h = self._headers()
        data = self._encode(body, h)
        c = self._conn()
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            if r.status >= 400:
                self._raise(r.status, r.read())
            buf = b""
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    return
                buf += chunk
                while True:
                    i = buf.find(b"\n")
                    if i < 0:
                        break
                    line, buf = buf[:i], buf[i + 1:]
                    if line.strip():
                        yield json.loads(line)
                if len(buf) > STREAM_LINE_MAX:
                    raise ConnectionFailed(f"{path}: an event line longer than "
                                           f"{STREAM_LINE_MAX} bytes")
        finally:
            c.close()

    def events(self, method: str, path: str, body: Body, resume: Callable[[Json, int], Optional[str]],
               final: Tuple[str, ...] = ("exit", "error")) -> Iterator[Json]:
        """Events of a stream, each once and in order, across dropped connections: after a
        break the stream is reopened with GET resume(first_event, last_seq) (None: it cannot
        be resumed), skipping what was already delivered. Ends after an event whose type is
        in final, or when the server ends the stream."""
        last, first, tries = 0, None, 0
        while True:
            try:
                ended = False
                for ev in self._lines(method, path, body):
                    seq = ev.get("seq") or 0
                    if seq and seq <= last:
                        continue  # replayed: delivered before the break
                    last = seq or last
                    tries = 0
                    if first is None:
                        first = ev
                    yield ev
                    if ev.get("type") in final:
                        ended = True
                        break
                if ended or not final:
                    return
                raise ConnectionFailed(f"{path}: the stream ended before its last event")
            except (OSError, http.client.HTTPException, ValueError, ConnectionFailed) as e:
                nxt = resume(first, last) if first is not None else None
                tries += 1
                if nxt is None or tries > self.reconnect_tries:
                    raise ConnectionFailed(f"{path}: stream broken after seq {last}: {e}")
                time.sleep(min(1.0, 0.02 * (2 ** tries)))
                method, path, body = "GET", nxt, None
