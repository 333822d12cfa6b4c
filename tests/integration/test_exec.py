"""exec with wait: output, exit status, signals, env/cwd/user, binary output, errors,
timeouts (docs/api.md "Processes")."""
import base64

import pytest

pytestmark = pytest.mark.root


def run(client, sid, what, **kw):
    return client.exec(sid, what, **kw)


def test_stdout_stderr_exit_code(client, sandbox):
    r = run(client, sandbox["id"], "echo out; echo err >&2; exit 3")
    assert r["stdout"] == "out\n"
    assert r["stderr"] == "err\n"
    assert r["exit_code"] == 3
    assert r["signal"] is None
    assert isinstance(r["pid"], int) and r["pid"] > 1


def test_argv_is_not_shell_parsed(client, sandbox):
    r = run(client, sandbox["id"], ["echo", "a  b", "$HOME", "*"])
    assert r["stdout"] == "a  b $HOME *\n"
    assert r["exit_code"] == 0


def test_signal_death(client, sandbox):
    r = run(client, sandbox["id"], "kill -9 $$")
    assert r["signal"] == "KILL"
    assert r["exit_code"] is None


def test_env_cwd_default_user_root(client, sandbox):
    r = run(client, sandbox["id"], "echo $FOO:$BAR; pwd; id -u; echo $HOME",
            env={"FOO": "1", "BAR": "x y"}, cwd="/tmp")
    assert r["stdout"] == "1:x y\n/tmp\n0\n/root\n"


def test_user(client, sandbox):
    r = run(client, sandbox["id"], "id -un; id -u; echo $HOME; echo $USER", user="user")
    assert r["exit_code"] == 0, r
    assert r["stdout"] == "user\n1000\n/home/user\nuser\n"
    # files it creates belong to it
    r = run(client, sandbox["id"], "touch /tmp/mine && stat -c %u /tmp/mine", user="1000")
    assert r["stdout"] == "1000\n", r


def test_binary_output_is_base64(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox['id']}/exec",
                       {"shell": "printf '\\377\\000\\001ok\\200'", "wait": True})
    assert r.status == 200
    j = r.json()
    assert j.get("stdout_b64") is not None, j
    assert base64.b64decode(j["stdout_b64"]) == b"\xff\x00\x01ok\x80"
    assert j["stderr"] == ""  # stderr was valid (empty) UTF-8


def test_utf8_output_is_text(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox['id']}/exec",
                       {"cmd": ["echo", "héllo ✓"], "wait": True}).json()
    assert r["stdout"] == "héllo ✓\n"
    assert "stdout_b64" not in r or r["stdout_b64"] is None


def test_large_output_wait(client, sandbox):
    r = run(client, sandbox["id"], "seq 1 200000")
    assert r["exit_code"] == 0
    assert r["stdout"] == "".join(f"{i}\n" for i in range(1, 200001))


def test_missing_binary_wait_is_clear_400(client, sandbox):
    e = client.expect_error("POST", f"/v1/sandboxes/{sandbox['id']}/exec", 400, "bad_request",
                            body={"cmd": ["/no/such/prog"], "wait": True})
    assert "/no/such/prog" in e["message"] or "No such file" in e["message"], e


def test_missing_binary_stream_gives_error_event(client, sandbox):
    evs = list(client.exec(sandbox["id"], ["nosuchprog-xyz"], wait=False, timeout=30))
    assert len(evs) >= 1
    assert evs[-1]["type"] == "error", evs
    assert evs[-1]["message"]
    assert evs[0]["seq"] == 1


def test_missing_cwd(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox['id']}/exec",
                       {"shell": "true", "cwd": "/nonexistent", "wait": True})
    assert r.status == 400 and r.error.get("code") == "bad_request", r


def test_unknown_user(client, sandbox):
    r = client.request("POST", f"/v1/sandboxes/{sandbox['id']}/exec",
                       {"shell": "true", "user": "nobody-here", "wait": True})
    assert 400 <= r.status < 500 and r.error.get("message"), r


def test_timeout_kills_and_reports(client, sandbox):
    r = run(client, sandbox["id"], "echo before; sleep 100; echo after", timeout_s=1)
    assert r.get("timed_out") is True, r
    assert r["signal"] == "KILL"
    assert r["exit_code"] is None
    assert r["stdout"] == "before\n"


def test_timeout_also_kills_children(client, sandbox):
    sid = sandbox["id"]
    r = run(client, sid, "sleep 313 & sleep 313; echo never", timeout_s=1)
    assert r.get("timed_out") is True
    ps = run(client, sid, "ps -o args | grep -c '^sleep 313' || true")
    assert ps["stdout"].strip() == "0", ps


def test_stdin_in_wait_mode_is_empty(client, sandbox):
    # without stdin:true the process reads /dev/null: cat must end at once
    r = run(client, sandbox["id"], "cat; echo done", timeout_s=20)
    assert r["stdout"] == "done\n" and not r.get("timed_out")


def test_exit_not_held_by_background_child(client, sandbox):
    r = run(client, sandbox["id"], "sleep 50 & echo fg", timeout=30)
    assert r["exit_code"] == 0
    assert r["stdout"] == "fg\n"


def test_wait_returns_large_output_whole(client, sandbox):
    """wait:true holds the process (back-pressure) instead of dropping: 12 MiB produced
    faster than coved reads comes back complete and not marked truncated."""
    r = client.exec(sandbox["id"], "dd if=/dev/zero bs=1048576 count=12 2>/dev/null | tr '\\0' 'q'",
                    timeout=300)
    assert r["exit_code"] == 0
    assert not r.get("truncated"), "output was dropped"
    assert len(r["stdout"]) == 12 << 20 and set(r["stdout"]) == {"q"}
