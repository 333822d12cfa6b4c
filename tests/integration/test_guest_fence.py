"""Guest self-freeze (docs/cluster.md, "Leases and fencing"): with a fence TTL, a sandbox
whose node stops sending heartbeats (here: coved itself stopped with SIGSTOP) freezes every
one of its processes on its own, stays frozen when coved comes back, and runs again only
after an explicit thaw (coved's test hook: SIGUSR2). Processes inside cannot slip out of
the freeze nor fake the node's heartbeat."""
import glob
import os
import signal
import time

import pytest

from cove import guest_pid, proc_status as _status

pytestmark = pytest.mark.root

TTL_MS = 1500
FENCE_ARGS = ("--guest-fence-ttl", str(TTL_MS), "--guest-fence-heartbeat", "200")
FREEZE_BOUND_S = 60  # frozen within TTL + this (the code: TTL + 250 ms; a loaded host)


def descendants(pid):
    """Host pids of every process below pid (its sandbox's processes, nested pid namespaces
    included)."""
    kids = {}
    for p in glob.glob("/proc/[0-9]*/status"):
        try:
            q = int(p.split("/")[2])
            kids.setdefault(int(_status(q, "PPid")), []).append(q)
        except (OSError, StopIteration, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def all_stopped(gpid):
    """Every process of the sandbox but its guest is stopped (State T) and there is one."""
    ps = descendants(gpid)
    states = []
    for p in ps:
        try:
            states.append(_status(p, "State")[0])
        except (OSError, StopIteration):
            pass
    return bool(states) and all(s == "T" for s in states), states


def read_counter(gpid, name):
    try:
        with open(f"/proc/{gpid}/root/tmp/{name}", "rb") as f:
            return f.read()
    except OSError:
        return None


def await_(cond, what, timeout):
    deadline = time.time() + timeout
    while True:
        r = cond()
        if r:
            return r
        assert time.time() < deadline, f"timed out: {what}"
        time.sleep(0.05)


def advancing(gpid, names, timeout=60):
    """Each counter file changes within timeout."""
    for n in names:
        first = read_counter(gpid, n)
        await_(lambda: read_counter(gpid, n) not in (None, first), f"{n} advances", timeout)


def unchanged_for(gpid, names, seconds):
    """The files do not change over `seconds` (the absence of progress cannot be awaited)."""
    before = {n: read_counter(gpid, n) for n in names}
    time.sleep(seconds)
    after = {n: read_counter(gpid, n) for n in names}
    return before == after, before, after


COUNTER = ("i=0; while true; do i=$((i+1)); echo $i > /tmp/{n}; sleep 0.05; done "
           ">/dev/null 2>&1 &")


def stop_node(d):
    os.kill(d.proc.pid, signal.SIGSTOP)


def cont_node(d):
    os.kill(d.proc.pid, signal.SIGCONT)


def test_sandbox_freezes_without_its_node_and_stays_frozen_until_thaw(coved_factory):
    d = coved_factory(extra_args=FENCE_ARGS)
    c = d.client
    sid = c.create(template="busybox")["id"]
    c.exec(sid, COUNTER.format(n="counter"))
    gpid = guest_pid(c, sid)
    advancing(gpid, ["counter"])
    # heartbeats flow: well past the TTL, it still runs
    time.sleep(3 * TTL_MS / 1000)
    advancing(gpid, ["counter"], timeout=5)
    t0 = time.time()
    stop_node(d)
    try:
        await_(lambda: all_stopped(gpid)[0], "every sandbox process stopped", FREEZE_BOUND_S)
        took = time.time() - t0
        ok, a, b = unchanged_for(gpid, ["counter"], 1.0)
        assert ok, (a, b)
        assert _status(gpid, "State")[0] != "T", "the guest itself must keep running"
    finally:
        cont_node(d)
    # the node is back and sends heartbeats again: that alone does not thaw
    time.sleep(3 * TTL_MS / 1000)
    ok, a, b = unchanged_for(gpid, ["counter"], 1.0)
    assert ok and all_stopped(gpid)[0], (a, b, all_stopped(gpid))
    r = c.request("POST", f"/v1/sandboxes/{sid}/exec", {"shell": "echo no", "wait": True},
                  timeout=60)
    assert r.status >= 400 and "frozen" in r.body.decode(), (r.status, r.body)
    os.kill(d.proc.pid, signal.SIGUSR2)  # test hook: cove_node_thaw_fenced(every sandbox)
    advancing(gpid, ["counter"])
    assert c.exec(sid, "echo alive", timeout=60)["stdout"] == "alive\n"
    assert c.sandbox(sid)["state"] == "running"
    print(f"\nfence: every process stopped {took:.2f} s after coved's SIGSTOP "
          f"(TTL {TTL_MS} ms; load {os.getloadavg()[0]:.1f})")
    c.remove(sid)


ATTACKS = {
    # forks a new writer every 20 ms
    "forks": "while true; do (echo x >> /tmp/forks) & sleep 0.02; done >/dev/null 2>&1 &",
    # job control stop ignored (SIGSTOP cannot be)
    "tstp": "(trap '' TSTP; i=0; while true; do i=$((i+1)); echo $i > /tmp/tstp; sleep 0.05; "
            "done) >/dev/null 2>&1 &",
    # leaves the workload's cgroup for any group it can write
    "cgroup": "(for f in /dev/.cove-cgroup/cgroup.procs /dev/.cove-cgroup/*/cgroup.procs; do "
              "echo 0 > $f; done; i=0; while true; do i=$((i+1)); echo $i > /tmp/cgroup; "
              "sleep 0.05; done) >/dev/null 2>&1 &",
    # a pid namespace of its own, if the sandbox allows one
    "pidns": "(unshare -p -f sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/pidns; "
             "sleep 0.05; done' || echo refused > /tmp/pidns.refused) >/dev/null 2>&1 &",
    # writes heartbeat frames on its output (which reaches the node inside OUT frames) and
    # to the in-sandbox request socket
    "fake": "(i=0; while true; do i=$((i+1)); echo $i > /tmp/fake; "
            "printf '\\0\\0\\0\\10\\15\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\1'; "
            "printf '\\0\\0\\0\\0\\16\\0\\0\\0\\0\\0\\0\\0' | nc -U @cove-guest-ask 2>/dev/null; "
            "sleep 0.02; done)",
    # floods its output: with the node stopped, the guest's writes to it block
    "flood": "(i=0; while true; do i=$((i+1)); echo $i > /tmp/flood; head -c 262144 /dev/zero; "
             "sleep 0.01; done)",
}
STREAMED = {"fake", "flood"}  # run as a process of its own, its output streamed to the node


def test_processes_cannot_escape_the_freeze_or_fake_a_heartbeat(coved_factory):
    d = coved_factory(extra_args=FENCE_ARGS)
    c = d.client
    sid = c.create(template="busybox")["id"]
    for n, a in ATTACKS.items():
        if n in STREAMED:  # started, then the client goes: the process runs on
            list(c.stream(f"/v1/sandboxes/{sid}/exec", {"shell": a}, max_events=1))
        else:
            c.exec(sid, a)
    gpid = guest_pid(c, sid)
    names = [n for n in ATTACKS if n != "pidns"]
    pidns = read_counter(gpid, "pidns.refused") is None
    if pidns:
        names.append("pidns")
    advancing(gpid, names)
    stop_node(d)
    try:
        await_(lambda: all_stopped(gpid)[0], "every sandbox process stopped", FREEZE_BOUND_S)
        ok, a, b = unchanged_for(gpid, names, 1.5)
        assert ok, (a, b)
    finally:
        cont_node(d)
    time.sleep(2 * TTL_MS / 1000)
    ok, a, b = unchanged_for(gpid, names, 1.0)
    assert ok, (a, b)
    os.kill(d.proc.pid, signal.SIGUSR2)
    advancing(gpid, names)
    print(f"\nattacks frozen: {names} (a new pid namespace: "
          f"{'made' if pidns else 'refused by the sandbox'})")
    c.remove(sid)


def test_sandbox_without_fence_keeps_running_while_coved_is_stopped(coved_factory):
    """The default (role all): no fence, nothing freezes (the tests above stop only because
    of it), and a coved stopped longer than its hang bound (5 s) still finds the sandbox
    running when it continues."""
    d = coved_factory()
    c = d.client
    sid = c.create(template="busybox")["id"]
    c.exec(sid, COUNTER.format(n="counter"))
    gpid = guest_pid(c, sid)
    stop_node(d)
    try:
        time.sleep(7)  # longer than the node's hang bound
        advancing(gpid, ["counter"], timeout=10)
        assert not all_stopped(gpid)[0]
    finally:
        cont_node(d)
    time.sleep(2)  # the node's heartbeat rounds after its stop (the hang check runs there)
    assert c.exec(sid, "echo alive", timeout=60)["stdout"] == "alive\n"
    assert c.sandbox(sid)["state"] == "running", c.sandbox(sid)
    c.remove(sid)


def _vm_missing():
    qemu = os.environ.get("COVE_QEMU", "/usr/bin/qemu-system-x86_64")
    kdir = os.environ.get("COVE_VM_KERNEL_DIR", "/var/cache/cove/vm")
    if not os.access(qemu, os.X_OK):
        return f"{qemu} not installed (scripts/install-deps installs qemu-system-x86)"
    for f in ("vmlinux", "modules/order"):
        if not os.access(os.path.join(kdir, f), os.R_OK):
            return f"no guest kernel: {kdir}/{f} missing (run scripts/install-deps)"
    return None


def test_vm_guest_freezes_inside_its_vm(coved_factory):
    """The same inside a VM (its QEMU keeps running while coved is stopped): the guest's
    clock (its uptime) shows the workload did not run from TTL after coved's stop until the thaw."""
    why = _vm_missing()
    if why:
        pytest.skip(why)
    d = coved_factory(extra_args=FENCE_ARGS + ("--pool", "0", "--vm-pool", "0"))
    c = d.client
    sid = c.create(template="busybox", runtime="vm")["id"]
    c.exec(sid, "while true; do cut -d' ' -f1 /proc/uptime >> /tmp/log; sleep 0.05; done "
           ">/dev/null 2>&1 &")
    await_(lambda: c.exec(sid, "wc -l < /tmp/log")["stdout"].strip() not in ("", "0", "1"),
           "the vm counter runs", 60)
    hold_s = TTL_MS / 1000 + 8
    t0 = time.time()
    stop_node(d)
    try:
        time.sleep(hold_s)  # coved stays stopped this long (what is measured is the gap)
    finally:
        cont_node(d)
    held = time.time() - t0
    r = c.request("POST", f"/v1/sandboxes/{sid}/exec", {"shell": "true", "wait": True},
                  timeout=60)
    assert r.status >= 400 and "frozen" in r.body.decode(), (r.status, r.body)
    os.kill(d.proc.pid, signal.SIGUSR2)
    await_(lambda: c.request("POST", f"/v1/sandboxes/{sid}/exec",
                             {"shell": "true", "wait": True}, timeout=60).status == 200,
           "exec works after the thaw", 60)
    stamps = [float(x) for x in c.exec(sid, "cat /tmp/log")["stdout"].split()]
    gap = max(b - a for a, b in zip(stamps, stamps[1:]))
    # frozen from about TTL after the stop until the thaw; without the fence: ~50 ms
    assert gap >= held - TTL_MS / 1000 - 5, (gap, held)
    print(f"\nvm fence: the workload stood still {gap:.1f} s of the {held:.1f} s coved was "
          f"stopped or waiting for the thaw (TTL {TTL_MS} ms)")
    c.remove(sid)


def test_fence_survives_a_full_pause_and_resume(coved_factory):
    """A guest restored from a checkpoint (its fence thread and state included) runs its
    processes again after the resume and still freezes them when its node stops."""
    d = coved_factory(extra_args=FENCE_ARGS)
    c = d.client
    if c.snapshot_kind() != "full":
        pytest.skip(f"this coved has no full snapshots (/healthz: {c.snapshot_kind()})")
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    list(c.stream(f"/v1/sandboxes/{sid}/exec",
                  {"shell": "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; "
                            "sleep 0.05; done"}, max_events=1))
    r = c.post(f"/v1/sandboxes/{sid}/pause")
    assert r["snapshot"]["kind"] == "full", r
    assert c.post(f"/v1/sandboxes/{sid}/resume")["state"] == "running"
    gpid = guest_pid(c, sid)
    advancing(gpid, ["counter"])
    time.sleep(2 * TTL_MS / 1000)  # heartbeats reach the restored guest: still running
    advancing(gpid, ["counter"], timeout=10)
    stop_node(d)
    try:
        await_(lambda: all_stopped(gpid)[0], "every sandbox process stopped", FREEZE_BOUND_S)
    finally:
        cont_node(d)
    os.kill(d.proc.pid, signal.SIGUSR2)
    advancing(gpid, ["counter"])
    c.remove(sid)
