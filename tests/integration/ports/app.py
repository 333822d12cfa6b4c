"""A small web app run inside a sandbox by test_ports.py and bench/ports_bench.py.

python3 app.py HTTP_PORT [WS_PORT [ASYNC_PORT]]: HTTP on HTTP_PORT (/, /headers, /sse, /echo,
/big; a thread per connection), a WebSocket echo server on WS_PORT, and on ASYNC_PORT an
asyncio keep-alive server answering every request "ok" (one thread: many connections need
no more processes than the sandbox's pids limit allows). All on 0.0.0.0, standard library
only."""
import asyncio
import base64
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are separate writes

    def log_message(self, *a):
        pass

    def send(self, code, body, ctype="text/plain"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/":
            self.send(200, b"<html><head><title>cove preview</title></head>"
                      b"<body><h1 id=msg>hello from the sandbox</h1>"
                      b"<script>fetch('headers').then(r=>r.json()).then(j=>{"
                      b"document.getElementById('msg').dataset.path=j.path;"
                      b"document.title='loaded '+j.path;})</script></body></html>",
                      "text/html")
        elif path == "/headers":
            self.send(200, json.dumps({"path": self.path, "headers": dict(self.headers.items()),
                                       "client": self.client_address[0]}).encode(),
                      "application/json")
        elif path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            n = int(dict(p.split("=") for p in query.split("&") if "=" in p).get("n", "3"))
            for i in range(n):
                self.wfile.write(f"id: {i}\ndata: tick {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.2)
            self.close_connection = True
        elif path == "/big":
            n = int(dict(p.split("=") for p in query.split("&") if "=" in p).get("n", "0"))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            block = b"x" * 65536
            while n > 0:
                k = min(n, len(block))
                self.wfile.write(block[:k])
                n -= k
        else:
            self.send(404, b"no such page\n")

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_POST(self):
        body = self.read_body()
        self.send(200, hashlib.sha256(body).hexdigest().encode() + b" %d" % len(body))


def ws_client(c):
    f = c.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = f.readline()
        if not line:
            return
        head += line
    key = ""
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("sec-websocket-key:"):
            key = line.split(":", 1)[1].strip()
    acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                                        .encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + "\r\n\r\n").encode())
    while True:
        h = f.read(2)
        if len(h) < 2:
            return
        op, ln = h[0] & 0x0F, h[1] & 0x7F
        if ln == 126:
            ln = struct.unpack(">H", f.read(2))[0]
        elif ln == 127:
            ln = struct.unpack(">Q", f.read(8))[0]
        mask = f.read(4) if h[1] & 0x80 else b"\0\0\0\0"
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(ln)))
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        hdr = bytes([0x80 | op])
        hdr += bytes([len(data)]) if len(data) < 126 else (
            b"\x7e" + struct.pack(">H", len(data)) if len(data) < 65536 else
            b"\x7f" + struct.pack(">Q", len(data)))
        c.sendall(hdr + data)


def ws_server(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1024)
    while True:
        c, _ = s.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=ws_client, args=(c,), daemon=True).start()


async def ok_client(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            if not head:
                return
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        w.close()


def async_server(port):
    async def main():
        srv = await asyncio.start_server(ok_client, "0.0.0.0", port, backlog=4096)
        await srv.serve_forever()
    asyncio.run(main())


if __name__ == "__main__":
    if len(sys.argv) > 3:
        threading.Thread(target=async_server, args=(int(sys.argv[3]),), daemon=True).start()
    if len(sys.argv) > 2:
        threading.Thread(target=ws_server, args=(int(sys.argv[2]),), daemon=True).start()
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 1024
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
