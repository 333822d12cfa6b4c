"""Host files and host processes from inside a sandbox: never visible, never signalled."""
import os
import re
import subprocess

import pytest

from secutil import sh, split_shell_literal


def _host_shadow():
    try:
        with open("/etc/shadow") as f:
            s = f.read()
    except OSError:
        return None
    return s if s.strip() else None


@pytest.mark.root
def test_host_marker_not_found_anywhere(client, sandbox, host_marker):
    path, content = host_marker
    sid = sandbox["id"]
    needle = split_shell_literal(content)
    # whole filesystem except the pseudo filesystems (whose /proc/*/cmdline holds our argv)
    r = sh(client, sid,
           f"M={needle}; for d in /* /dev/shm; do case $d in /proc|/sys|/dev) continue;; esac; "
           f"grep -rlF \"$M\" \"$d\" 2>/dev/null; done; echo done", timeout=600)
    assert r["stdout"].endswith("done\n"), r
    assert content not in r["stdout"] and r["stdout"] == "done\n", \
        f"host marker content found inside the sandbox: {r['stdout'][:500]}"
    # by path, directly and through the magic links of /proc
    tricks = [path, f"/proc/1/root{path}", f"/proc/self/root{path}",
              f"/proc/1/root/../../..{path}", f"/proc/self/cwd/../../../..{path}",
              f"/proc/1/cwd/../../..{path}", f"/proc/self/fd/../../../..{path}",
              f"/../../..{path}"]
    script = "".join(f"cat {t} 2>/dev/null; ls -d {t} 2>/dev/null && echo FOUND:{t}\n"
                     for t in tricks)
    script += f"for p in /proc/[0-9]*; do cat $p/root{path} $p/cwd{path} 2>/dev/null; done\n"
    r = sh(client, sid, script)
    assert content not in r["stdout"] and "FOUND:" not in r["stdout"], \
        f"host marker reachable inside: {r['stdout'][:500]}"


@pytest.mark.root
def test_no_host_fd_leaks_into_sandbox(client, sandbox, coved):
    # every open fd of every sandbox process names something of the sandbox (its files,
    # pipes, sockets, /dev nodes), never a host path such as coved's data dir; reading them
    # is not tried (a process's own pipes would block)
    r = sh(client, sandbox["id"],
           "for f in /proc/[0-9]*/fd/* /proc/[0-9]*/cwd /proc/[0-9]*/root /proc/[0-9]*/exe; "
           "do echo \"$f -> $(readlink $f)\"; done")
    assert " -> " in r["stdout"]
    for line in r["stdout"].splitlines():
        target = line.split(" -> ", 1)[1]
        assert coved.data not in target, f"host path leaked into the sandbox: {line}"
        if line.startswith("/proc/1/exe"):
            continue  # the guest binary is exec'd from the host through an fd (by design)
        ok = (target.startswith(("/", "pipe:", "socket:", "anon_inode:")) or target == "")
        assert ok, line
    roots = {l.split(" -> ", 1)[1] for l in r["stdout"].splitlines() if "/root -> " in l}
    assert roots == {"/"}, f"a sandbox process has another root: {roots}"


@pytest.mark.root
def test_host_shadow_not_readable(client, sandbox):
    shadow = _host_shadow()
    if shadow is None:
        pytest.skip("the host has no readable, non-empty /etc/shadow to compare with")
    r = sh(client, sandbox["id"],
           "for p in /etc/shadow /proc/1/root/etc/shadow /proc/self/root/etc/shadow "
           "/proc/1/root/../../etc/shadow; do cat $p 2>/dev/null; done")
    # the host's password hashes (any line with a real hash) never show up
    hashes = [l for l in shadow.splitlines() if re.match(r"^[^:]+:\$", l)]
    for h in hashes or shadow.splitlines()[:1]:
        assert h not in r["stdout"], "a line of the host's /etc/shadow is readable inside"


@pytest.mark.root
def test_only_sandbox_processes_visible(client, sandbox, coved):
    r = sh(client, sandbox["id"],
           "for p in /proc/[0-9]*; do echo \"${p#/proc/} $(tr '\\0' ' ' < $p/cmdline)\"; done; "
           "echo; ps")
    procs = [l for l in r["stdout"].split("\n\n")[0].splitlines() if l.strip()]
    # pid 1 is the guest; the rest is the shell of this exec and its children
    assert any(l.startswith("1 /dev/.cove-guest") for l in procs), procs
    assert len(procs) < 10, f"too many processes visible inside: {procs}"
    for l in procs:
        assert "coved" not in l and "pytest" not in l, f"host process visible inside: {l}"
    assert "coved" not in r["stdout"] and "pytest" not in r["stdout"]


@pytest.mark.root
def test_cannot_signal_host_processes(client, sandbox, coved):
    victim = subprocess.Popen(["sleep", "600"])
    try:
        pids = [coved.proc.pid, victim.pid, os.getpid()]
        r = sh(client, sandbox["id"],
               "".join(f"kill -9 {p} 2>/dev/null; echo rc{p}=$?\n" for p in pids) +
               "kill -9 -1 2>/dev/null; echo all=$?")
        for p in pids:
            # the number may exist inside (tiny pid namespace) only if it is a sandbox pid
            if p > 64:
                assert f"rc{p}=0" not in r["stdout"], f"kill of host pid {p} succeeded"
        assert coved.alive(), "coved died after kill attempts from a sandbox"
        assert victim.poll() is None, "a host process was killed from inside a sandbox"
        assert client.request("GET", "/healthz", auth=False).status == 200
        # kill -9 -1 inside kills the sandbox's own processes only; its PID 1 survives
        assert sh(client, sandbox["id"], "echo alive")["stdout"] == "alive\n"
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.root
def test_guest_binary_is_a_read_only_bind(client, sandbox, coved):
    # PID 1 runs /dev/.cove-guest, a read-only, nosuid bind of the host's binary (so that a
    # checkpoint finds it in the sandbox's own mount namespace): the sandbox's root can
    # neither write it, nor replace it, nor remount it writable; the host file stays as is
    host = os.path.join(os.path.dirname(coved.bin), "cove-guest")
    st0 = os.stat(host)
    r = sh(client, sandbox["id"],
           "(echo x >> /dev/.cove-guest) 2>&1; (echo x > /proc/1/exe) 2>&1; "
           "rm -f /dev/.cove-guest 2>&1; mount -o remount,rw /dev/.cove-guest 2>&1; "
           "grep ' /dev/.cove-guest ' /proc/self/mountinfo | cut -d' ' -f6; readlink /proc/1/exe")
    out = r["stdout"].splitlines()
    assert len(out) == 6, out
    assert all(("Read-only" in l or "denied" in l or "busy" in l) for l in out[:4]), out
    assert out[4].startswith("ro,nosuid,nodev"), out
    assert out[5] == "/dev/.cove-guest", out
    st1 = os.stat(host)
    assert (st1.st_size, st1.st_mtime_ns, st1.st_mode) == (st0.st_size, st0.st_mtime_ns, st0.st_mode)
