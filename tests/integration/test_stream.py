"""exec as an NDJSON event stream: seq order, stdin, PTY, signals, the process list, and
reconnects with ?after=SEQ that lose and duplicate nothing (docs/api.md "Processes")."""
import base64
import hashlib

import pytest
from cove import poll

pytestmark = pytest.mark.root


def start(client, sid, what, **kw):
    """Starts a streamed exec; returns (pid, generator positioned after the start event)."""
    ev = client.exec(sid, what, wait=False, **kw)
    first = next(ev)
    assert first["type"] == "start" and first["seq"] == 1, first
    return first["pid"], ev


def until_exit(events):
    out = []
    for e in events:
        out.append(e)
        if e["type"] in ("exit", "error"):
            break
    return out


def post(client, path, body=None, **kw):
    return client.request("POST", path, body, **kw)


def test_event_order(client, sandbox):
    evs = list(client.exec(sandbox["id"], "echo a; echo b >&2; exit 4", wait=False))
    assert evs[0]["type"] == "start" and isinstance(evs[0]["pid"], int)
    assert evs[-1]["type"] == "exit"
    assert evs[-1]["exit_code"] == 4 and evs[-1]["signal"] is None
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    assert all(e["type"] in ("stdout", "stderr") for e in evs[1:-1])
    assert client.output(evs) == b"a\n"
    assert client.output(evs, "stderr") == b"b\n"


def test_stdin_streaming_and_eof(client, sandbox):
    sid = sandbox["id"]
    pid, ev = start(client, sid, ["cat"], stdin=True)
    base = f"/v1/sandboxes/{sid}/processes/{pid}/stdin"
    chunks = [b"hello\n", bytes(range(256)), b"x" * 300000]
    for c in chunks:
        r = post(client, base, c, headers={"Content-Type": "application/octet-stream"})
        assert r.status == 200, r
    assert post(client, base + "?eof=true", b"").status == 200
    evs = until_exit(ev)
    assert evs[-1]["type"] == "exit" and evs[-1]["exit_code"] == 0
    assert client.output(evs) == b"".join(chunks)


def test_stdin_eof_with_data(client, sandbox):
    sid = sandbox["id"]
    pid, ev = start(client, sid, "wc -c", stdin=True)
    r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin?eof=true", b"12345")
    assert r.status == 200
    evs = until_exit(ev)
    assert client.output(evs).strip() == b"5"


def test_pty_tty_and_resize(client, sandbox):
    sid = sandbox["id"]
    pid, ev = start(client, sid, "tty; stty size; read x; stty size; echo got:$x",
                    stdin=True, pty={"cols": 80, "rows": 24})
    got = b""
    for e in ev:
        assert e["type"] in ("pty", "exit"), e
        if e["type"] == "pty":
            got += base64.b64decode(e["data_b64"])
        if b"24 80" in got:
            break
    assert b"/dev/pts/" in got, got
    r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/resize", {"cols": 132, "rows": 50})
    assert r.status == 200, r
    r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin", b"go\n")
    assert r.status == 200
    evs = until_exit(ev)
    out = got + client.output(evs, "pty")
    assert b"50 132" in out, out
    assert b"got:go" in out
    assert evs[-1]["type"] == "exit" and evs[-1]["exit_code"] == 0


def test_resize_without_pty_is_conflict(client, sandbox):
    sid = sandbox["id"]
    pid, ev = start(client, sid, "sleep 100")
    try:
        r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/resize", {"cols": 10, "rows": 10})
        assert r.status == 409 and r.error.get("code") == "conflict", r
    finally:
        post(client, f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": "KILL"})
        until_exit(ev)


def test_signal_term(client, sandbox):
    sid = sandbox["id"]
    pid, ev = start(client, sid, ["sleep", "100"])
    r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": "TERM"})
    assert r.status == 200, r
    evs = until_exit(ev)
    assert evs[-1]["type"] == "exit"
    assert evs[-1]["signal"] == "TERM" and evs[-1]["exit_code"] is None


def test_signal_unknown_pid_is_404(client, sandbox):
    client.expect_error("POST", f"/v1/sandboxes/{sandbox['id']}/processes/999999/signal", 404,
                        "not_found", body={"signal": "TERM"})


def test_process_list(client, sandbox):
    sid = sandbox["id"]
    done = client.exec(sid, ["echo", "finished"], tag="first")
    pid, ev = start(client, sid, ["sleep", "100"], tag="sleeper")
    try:
        procs = {p["pid"]: p for p in client.get(f"/v1/sandboxes/{sid}/processes")["processes"]}
        assert procs[pid]["running"] is True
        assert procs[pid]["tag"] == "sleeper"
        assert procs[pid]["cmd"] == ["sleep", "100"]
        assert procs[pid]["started_at"].endswith("Z")
        assert procs[done["pid"]]["running"] is False
        assert procs[done["pid"]]["tag"] == "first"
        assert procs[done["pid"]]["cmd"] == ["echo", "finished"]
    finally:
        post(client, f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": "KILL"})
        until_exit(ev)
    poll(lambda: not {p["pid"]: p for p in client.get(
        f"/v1/sandboxes/{sid}/processes")["processes"]}[pid]["running"], what="not running")


def test_events_unknown_pid_is_404(client, sandbox):
    client.expect_error("GET", f"/v1/sandboxes/{sandbox['id']}/processes/424242/events", 404,
                        "not_found")


# -- reconnect ------------------------------------------------------------------------
LINES = 20000
REF_TEXT = "".join(f"line {i:05d}\n" for i in range(1, LINES + 1)).encode()


def read_with_drops(client, sid, pid, first_events, drop_every, kind="stdout"):
    """Consumes the stream, dropping the connection every drop_every events and
    reconnecting with after=LAST_SEQ. Returns (output, exit event, reconnects, seqs)."""
    got, seqs, last, exit_ev, reconnects = [], [], 0, None, 0
    path = f"/v1/sandboxes/{sid}/processes/{pid}/events"
    for e in first_events:
        seqs.append(e["seq"])
        last = e["seq"]
        if e["type"] == kind:
            got.append(base64.b64decode(e["data_b64"]))
    while exit_ev is None:
        reconnects += 1
        assert reconnects < 10000, "stream never ends"
        for e in client.stream(f"{path}?after={last}", max_events=drop_every):
            assert e["type"] != "overflow", e
            assert e["seq"] == last + 1, (e["seq"], last)
            last = e["seq"]
            seqs.append(e["seq"])
            if e["type"] == kind:
                got.append(base64.b64decode(e["data_b64"]))
            elif e["type"] == "exit":
                exit_ev = e
                break
    return b"".join(got), exit_ev, reconnects, seqs


def take(gen, n):
    out = []
    for e in gen:
        out.append(e)
        if len(out) >= n:
            break
    return out


def test_reconnect_text_exact(client, sandbox):
    sid = sandbox["id"]
    # the process waits for a go signal so that output starts after we subscribed
    pid, ev = start(client, sid, f"read go; i=1; while [ $i -le {LINES} ]; do "
                    f"printf 'line %05d\\n' $i; i=$((i+1)); done", stdin=True)
    post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin?eof=true", b"go\n")
    first = take(ev, 3)
    ev.close()  # drop the first connection mid-stream
    out, ex, reconnects, seqs = read_with_drops(client, sid, pid, [{"seq": 1, "type": "start"}]
                                                + first, drop_every=7)
    assert ex["exit_code"] == 0
    assert reconnects >= 3
    assert seqs == list(range(1, len(seqs) + 1))
    assert out == REF_TEXT, (len(out), len(REF_TEXT))


def test_reconnect_binary_exact(client, sandbox):
    sid = sandbox["id"]
    # 1 MiB of pseudo-random bytes, reproducible: the sandbox writes the same file we read
    client.put_file(sid, "/tmp/blob", bytes((i * 7 + (i >> 8) * 13) & 0xFF
                                            for i in range(1 << 20)))
    ref = client.get_file(sid, "/tmp/blob").body
    pid, ev = start(client, sid, "dd if=/tmp/blob bs=4096 2>/dev/null")
    first = take(ev, 2)
    ev.close()
    out, ex, reconnects, _ = read_with_drops(client, sid, pid, [{"seq": 1, "type": "start"}]
                                             + first, drop_every=5)
    assert ex["exit_code"] == 0
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(ref).hexdigest()
    assert len(out) == 1 << 20


def test_reconnect_after_exit_replays_everything(client, sandbox):
    sid = sandbox["id"]
    r = client.exec(sid, "seq 1 1000; echo bye >&2")
    pid = r["pid"]
    evs = list(client.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after=0"))
    assert evs[0]["type"] == "start" and evs[-1]["type"] == "exit"
    assert client.output(evs) == "".join(f"{i}\n" for i in range(1, 1001)).encode()
    assert client.output(evs, "stderr") == b"bye\n"
    # after the last seq: nothing but the end of the stream, no hang
    last = evs[-1]["seq"]
    assert list(client.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after={last}",
                              timeout=20)) == []


def test_overflow_is_explicit(client, sandbox):
    sid = sandbox["id"]
    # 3 MiB of output > the 2 MiB replay buffer of a streamed process (an exec with
    # wait:true holds the process instead of dropping, so it is not used here)
    # the output starts only once the start event (with the pid) has been read: a reader
    # slower than the process would otherwise see the start event fall out of the window
    pid, ev = start(client, sid, "head -c1 >/dev/null; dd if=/dev/zero bs=65536 count=48 "
                    "2>/dev/null | tr '\\0' 'z'", stdin=True)
    assert post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin", b"go").status == 200
    assert until_exit(ev)[-1]["type"] == "exit"
    evs = list(client.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after=0"))
    assert evs[0]["type"] == "overflow", evs[0]
    assert evs[0]["message"]
    lost = evs[0]["seq"]
    assert lost >= 2
    # what follows the marker continues exactly after the lost seq, to the exit
    assert evs[1]["seq"] == lost + 1
    assert [e["seq"] for e in evs[1:]] == list(range(lost + 1, lost + len(evs)))
    assert evs[-1]["type"] == "exit"
    out = client.output(evs)
    assert 0 < len(out) <= 2 << 20
    assert set(out) == {ord("z")}
    # a reconnect from within the kept window has no marker
    mid = evs[len(evs) // 2]["seq"]
    evs2 = list(client.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after={mid}"))
    assert evs2[0]["seq"] == mid + 1 and evs2[0]["type"] != "overflow"


def test_stdin_refused_when_not_open(client, sandbox):
    """stdin for a process started without stdin:true, or after EOF, is not silently
    dropped: the caller gets 409 conflict."""
    sid = sandbox["id"]
    pid, ev = start(client, sid, ["sleep", "100"])
    try:
        r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin", b"lost?")
        assert r.status == 409 and r.error.get("code") == "conflict", r
    finally:
        post(client, f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": "KILL"})
        until_exit(ev)
    pid, ev = start(client, sid, "cat; sleep 100", stdin=True)
    evs = []
    try:
        base = f"/v1/sandboxes/{sid}/processes/{pid}/stdin"
        assert post(client, base + "?eof=true", b"last\n").status == 200
        r = post(client, base, b"after eof")
        assert r.status == 409 and r.error.get("code") == "conflict", r
        # cat echoes what it got before the KILL below (await it: no race on a slow host)
        evs = []
        for e in ev:
            evs.append(e)
            if client.output(evs) == b"last\n" or e["type"] in ("exit", "error"):
                break
    finally:
        post(client, f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": "KILL"})
        evs += until_exit(ev)
    assert client.output(evs) == b"last\n"


def test_stdin_to_finished_process(client, sandbox):
    sid = sandbox["id"]
    pid = client.exec(sid, "true")["pid"]
    r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin", b"x")
    assert r.status in (404, 409) and r.error.get("code") in ("not_found", "conflict"), r


def test_slow_live_reader_gets_overflow_marker_not_a_silent_gap(client, sandbox):
    """A reader that falls more than the replay window behind is told, in order."""
    sid = sandbox["id"]
    # 32 MB (43 MB as NDJSON) is more than the 2 MiB replay buffer plus any socket buffers
    pid, ev = start(client, sid, "read go; yes 0123456789 | head -c 32000000", stdin=True)
    post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin?eof=true", b"go\n")
    # read nothing until the process has finished: its output cannot all still be buffered
    poll(lambda: not [p for p in client.get(f"/v1/sandboxes/{sid}/processes")["processes"]
                      if p["pid"] == pid][0]["running"], what="process end")
    evs = until_exit(ev)
    # seq rises by one per event; only an overflow marker jumps (its seq is the last lost
    # one), and the event after it continues right after that
    prev = 1
    for e in evs:
        if e["type"] == "overflow":
            assert e["seq"] > prev and e["message"], e
        else:
            assert e["seq"] == prev + 1, (e["seq"], prev)
        prev = e["seq"]
    types = [e["type"] for e in evs]
    assert "overflow" in types
    out = client.output(evs)
    assert len(out) < 32000000
    assert evs[-1]["type"] == "exit" and evs[-1]["exit_code"] == 0


def test_wait_output_within_replay_window_is_complete(client, sandbox):
    ref = "".join(f"{i}\n" for i in range(1, 200001))  # 1.2 MiB < the 2 MiB window
    for _ in range(3):
        r = client.exec(sandbox["id"], "seq 1 200000")
        assert r["stdout"] == ref and not r.get("truncated")


def test_wait_output_beyond_limit_is_marked_truncated(client, sandbox):
    r = client.exec(sandbox["id"], "dd if=/dev/zero bs=1M count=20 2>/dev/null | tr '\\0' a",
                    timeout=300)
    assert r["exit_code"] == 0
    assert r.get("truncated") is True
    assert 0 < len(r["stdout"]) <= 16 << 20


def test_signal_by_number_and_sig_prefix(client, sandbox):
    sid = sandbox["id"]
    for sig, name in [(15, "TERM"), ("SIGINT", "INT"), ("HUP", "HUP")]:
        pid, ev = start(client, sid, ["sleep", "100"])
        r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": sig})
        assert r.status == 200, r
        assert until_exit(ev)[-1]["signal"] == name


def test_stream_timeout_reports_timed_out(client, sandbox):
    evs = list(client.exec(sandbox["id"], "echo x; sleep 100", wait=False, timeout_s=1))
    assert evs[-1]["type"] == "exit"
    assert evs[-1]["timed_out"] is True and evs[-1]["signal"] == "KILL"
    assert client.output(evs) == b"x\n"


def test_concurrent_readers_get_identical_streams(client, sandbox):
    import threading

    sid = sandbox["id"]
    pid, ev = start(client, sid, "read go; seq 1 30000", stdin=True)
    ev.close()
    outs = [None] * 4

    def reader(k):
        evs = list(client.stream(f"/v1/sandboxes/{sid}/processes/{pid}/events?after=0",
                                 timeout=120))
        outs[k] = ([e["seq"] for e in evs], client.output(evs), evs[-1]["type"])

    ts = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin?eof=true", b"go\n")
    for t in ts:
        t.join(120)
    ref = "".join(f"{i}\n" for i in range(1, 30001)).encode()
    for seqs, out, last in outs:
        assert last == "exit"
        assert seqs == list(range(1, len(seqs) + 1))
        assert out == ref


def test_disconnected_idle_streams_are_released(coved, client, sandbox):
    """Clients that drop an event stream of a silent process do not each keep a server
    thread forever (it was only noticed when a write failed, and nothing was written)."""
    import os

    def threads():
        return len(os.listdir(f"/proc/{coved.proc.pid}/task"))

    sid = sandbox["id"]
    pid, ev = start(client, sid, ["sleep", "1000"])
    ev.close()
    base = threads()
    for _ in range(40):
        c = client.conn(timeout=30)
        c.request("GET", f"/v1/sandboxes/{sid}/processes/{pid}/events?after=1",
                  headers={"Authorization": f"Bearer {client.key}"})
        assert c.getresponse().status == 200
        c.close()
    poll(lambda: threads() <= base + 5, timeout=30,
         what=f"threads back near {base} (now {threads()})")
    post(client, f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": "KILL"})


def test_follower_of_a_long_process_gets_its_exit_after_many_others_finished(client, sandbox):
    """A process that started before many others that finished is, when it ends, the
    oldest finished record: the history bound must not drop it under its follower's feet
    (the follower waited on that record's buffer and read it after it was freed)."""
    sid = sandbox["id"]
    pid, ev = start(client, sid, ["cat"], stdin=True)
    for _ in range(66):  # more finished processes than the node keeps
        assert client.exec(sid, "true")["exit_code"] == 0
    r = post(client, f"/v1/sandboxes/{sid}/processes/{pid}/stdin?eof=true", b"")
    assert r.status == 200, r
    evs = until_exit(ev)
    assert evs and evs[-1]["type"] == "exit" and evs[-1]["exit_code"] == 0, evs[-3:]
    assert [e["seq"] for e in evs] == list(range(2, len(evs) + 2))
