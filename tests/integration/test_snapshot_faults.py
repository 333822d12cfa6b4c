"""Faults, crashes and time for the time machine, driven through a real coved with its
test-only hooks (`--test-hooks FILE` + COVE_TEST_HOOKS=1, util/testhooks.h): ENOSPC/EIO
injected into the chunk store's writes during a snapshot, retention thinning of real rolling
snapshots under a shifted clock, and a kill -9 loop over snapshot, GC and rewind."""
import calendar
import glob
import hashlib
import os
import random
import subprocess
import threading
import time

import chunkstore
import pytest
from cove import poll, sh, snapshots
from hostutil import loops_under

pytestmark = pytest.mark.root

HOOKS_ENV = {"COVE_TEST_HOOKS": "1"}
H, D = 3600, 24 * 3600


def ms(rfc3339):
    """unix ms of an API time ("2026-11-30T07:08:32.123Z")."""
    return int(calendar.timegm(time.strptime(rfc3339[:19], "%Y-%m-%dT%H:%M:%S")) * 1000 +
               int(rfc3339[20:23]))


def set_hooks(path, text):
    """Replace the hooks file atomically (coved re-reads it when it changes)."""
    tmp = f"{path}.new"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def hooked_coved(coved_factory, tmp_path, text="", data_dir=None):
    hooks = str(tmp_path / "hooks")
    set_hooks(hooks, text)
    d = coved_factory(data_dir=data_dir, extra_args=["--test-hooks", hooks], env=HOOKS_ENV)
    return d, hooks


def snap(c, sid, label=None):
    r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"label": label} if label else {})
    if r.status == 503 and "cannot snapshot" in r.body.decode(errors="replace"):
        pytest.skip("the runtime cannot snapshot here: " + r.error.get("message", ""))
    assert r.status == 201, r.body[:400]
    return r.json()


def store_private_files(data):
    """Temp and being-deleted objects of the chunk store (names starting with '.'), in
    packs' directories too."""
    return chunkstore.private_files(os.path.join(data, "store"))


def temp_images(data, committed=()):
    """Layer images a capture or restore left behind; the kept image of a committed snapshot
    (docs/storage.md "Kept layer images") is not one."""
    return [p for p in glob.glob(os.path.join(data, "ns", "lfs", "snap", "tm-*"))
            if not (os.path.basename(p).startswith("tm-snap-keep-")
                    and any(f"-{s}-" in os.path.basename(p) for s in committed))]


def test_test_hooks_need_explicit_enable(build_dir, tmp_path):
    hooks = str(tmp_path / "hooks")
    set_hooks(hooks, "fault write ENOSPC\n")
    argv = [os.path.join(build_dir, "coved"), "--data-dir", str(tmp_path / "data"),
            "--listen", "none", "--test-hooks", hooks]
    env = {k: v for k, v in os.environ.items() if k != "COVE_TEST_HOOKS"}
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "COVE_TEST_HOOKS=1" in r.stderr, r
    set_hooks(hooks, "fault write ENOSPCX\n")
    r = subprocess.run(argv, env=dict(env, **HOOKS_ENV), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "line 1" in r.stderr, r
    assert not os.path.exists(tmp_path / "data" / "catalog.db")


FAULTS = [("write", "ENOSPC", "No space left on device"),
          ("fsync", "EIO", "Input/output error"),
          ("rename", "ENOSPC", "No space left on device"),
          ("fsync", "ENOSPC", "No space left on device"),
          ("rename", "EIO", "Input/output error"),
          ("write", "EIO", "Input/output error")]


def test_snapshot_enospc_eio_keeps_previous(coved_factory, tmp_path):
    d, hooks = hooked_coved(coved_factory, tmp_path)
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    good = os.urandom(700000)
    c.put_file(sid, "/home/data.bin", good)
    sh(c, sid, "echo good > /home/state")
    s1 = snap(c, sid, "good")
    for i, (op, action, text) in enumerate(FAULTS):
        # new content, so the snapshot has chunks to write (a pack)
        c.put_file(sid, "/home/data.bin", os.urandom(700000 + i))
        sh(c, sid, f"echo bad{i} > /home/state")
        set_hooks(hooks, f"fault {op} {action}\n")
        r = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {})
        set_hooks(hooks, "")
        assert r.status == 503 and r.error["code"] == "unavailable", (op, action, r.body[:300])
        msg = r.error["message"]
        assert text in msg and sid in msg and "previous snapshots intact" in msg, msg
        assert [s["id"] for s in snapshots(c, sid)] == [s1["id"]], (op, action)
        assert c.sandbox(sid)["last_snapshot_id"] == s1["id"]
        assert c.sandbox(sid)["state"] == "running"
        assert store_private_files(d.data) == [], (op, action)
        assert temp_images(d.data, [s1["id"]]) == []
    # rewind to the snapshot taken before the faults: byte for byte
    r = c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": s1["id"]})
    assert r["sandbox"]["state"] == "running"
    assert c.get_file(sid, "/home/data.bin").body == good
    assert sh(c, sid, "cat /home/state") == "good\n"
    # and the undo snapshot (taken with the faults off) holds the last state
    undo = r["undo_snapshot_id"]
    c.post(f"/v1/sandboxes/{sid}/rewind", {"snapshot_id": undo})
    assert sh(c, sid, "cat /home/state") == f"bad{len(FAULTS) - 1}\n"
    c.remove(sid, purge=True)


def test_pause_with_full_store_keeps_running(coved_factory, tmp_path):
    """Pause snapshots first: when that fails the sandbox keeps running, nothing is lost."""
    d, hooks = hooked_coved(coved_factory, tmp_path)
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    snap(c, sid)
    c.put_file(sid, "/home/x.bin", os.urandom(300000))
    set_hooks(hooks, "fault fsync ENOSPC\n")
    r = c.request("POST", f"/v1/sandboxes/{sid}/pause", {})
    set_hooks(hooks, "")
    assert r.status == 503 and "No space left on device" in r.error["message"], r.body[:300]
    assert c.sandbox(sid)["state"] == "running"
    assert sh(c, sid, "echo alive") == "alive\n"
    c.post(f"/v1/sandboxes/{sid}/pause")
    assert c.sandbox(sid)["state"] == "paused"
    c.remove(sid, purge=True)


def bucket_ok(listed, seen, every_ms, lo_ms, hi_ms, now_ms):
    """One listed snapshot per (every_ms) bucket among those aged [lo, hi), and every bucket
    that had a snapshot still has one."""
    ages = {s: now_ms - t for s, t in seen.items()}
    in_tier = {s for s in seen if lo_ms <= ages[s] < hi_ms}
    kept = [s for s in in_tier if s in listed]
    buckets_kept = [seen[s] // every_ms for s in kept]
    buckets_all = {seen[s] // every_ms for s in in_tier}
    return len(buckets_kept) == len(set(buckets_kept)) and set(buckets_kept) == buckets_all


@pytest.mark.slow
def test_retention_thinning_with_injected_clock(coved_factory, tmp_path):
    """Real rolling snapshots every 2 s while the time machine's clock jumps through 9 days:
    default retention keeps every snapshot for 1 h, one per 10 min for 24 h, one per hour
    for 7 days, nothing older; manual snapshots are never thinned."""
    d, hooks = hooked_coved(coved_factory, tmp_path)
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0)["id"]
    manual = snap(c, sid, "manual")
    c.remove(sid, purge=False)
    sid = c.create(template="busybox", snapshot_interval_s=2)["id"]
    t0 = time.time()
    # (phase, simulated seconds after t0 of each snapshot), chosen away from tier edges at
    # the final time F = 9 d
    plan = ([("A", k * 240) for k in range(4)] +                 # ~9 d old: dropped
            [("B", 5 * D + k * 480) for k in range(6)] +         # ~4 d: one per hour
            [("C", 9 * D - 6 * H + k * 480) for k in range(6)] +  # ~6 h: one per 10 min
            [("D", 9 * D - 30 * 60 + k * 600) for k in range(4)])  # < 1 h: all
    seen, phase_of = {}, {}
    for phase, sim in plan:
        offset = int(t0 + sim - time.time())
        set_hooks(hooks, f"clock_offset_s {offset}\n")
        want = (time.time() + offset - 1) * 1000

        def new_one():
            got = None
            for s in snapshots(c, sid):
                if s["rolling"] and s["id"] not in seen:
                    seen[s["id"]] = ms(s["created_at"])
                    phase_of[s["id"]] = phase if seen[s["id"]] >= want else "?"
                    if seen[s["id"]] >= want:
                        got = s
            return got
        poll(new_one, timeout=30, what=f"a rolling snapshot at simulated +{sim} s")
    final_offset = offset
    assert len([p for p in phase_of.values() if p != "?"]) >= len(plan)

    def thinned():
        listed = {s["id"] for s in snapshots(c, sid) if s["rolling"]}
        now_ms = (time.time() + final_offset) * 1000
        # snapshots taken while polling (same offset, phase D) count as D
        for s in snapshots(c, sid):
            if s["rolling"] and s["id"] not in seen:
                seen[s["id"]] = ms(s["created_at"])
        return (not [s for s in listed if phase_of.get(s) == "A"] and
                all(s in listed for s in seen if now_ms - seen[s] < H * 1000) and
                bucket_ok(listed, seen, 600 * 1000, H * 1000, D * 1000, now_ms) and
                bucket_ok(listed, seen, 3600 * 1000, D * 1000, 7 * D * 1000, now_ms) and
                listed)
    listed = poll(thinned, timeout=60, what="retention thinning at simulated +9 d")
    kept = sorted(phase_of.get(s, "D") for s in listed)
    # B: 6 snapshots 8 min apart span 1 or 2 hour buckets; C: 6 span 5 or 6 ten-minute ones
    assert kept.count("A") == 0 and 1 <= kept.count("B") <= 2 and 4 <= kept.count("C") <= 6, kept
    assert kept.count("D") >= 4, kept
    # the manual snapshot of the first (deleted) sandbox is untouched
    assert c.get(f"/v1/snapshots/{manual['id']}")["id"] == manual["id"]
    c.remove(sid, purge=True)


def fork_read(c, snap_id, sid, made=None):
    f = c.ok("POST", f"/v1/sandboxes/{sid}/fork", {"snapshot_id": snap_id},
             expect=(201,))["sandboxes"][0]["id"]
    if made is not None:
        made.append(f)
    try:
        state = sh(c, f, "cat /home/state").strip()
        digest = hashlib.sha256(c.get_file(f, "/home/data.bin").body).hexdigest()
    finally:
        c.remove(f, purge=True)
    return state, digest


@pytest.mark.slow
def test_kill9_loop_snapshot_gc_rewind(coved_factory, tmp_path):
    """~10 crashes of coved (SIGKILL after a random delay, or at an injected write, fsync,
    rename or unlink) during a snapshot, a GC or a rewind. After each restart: no partial
    file, no temporary image, every listed snapshot restores with exactly one of the states
    written (and the one it was taken of, when known), GC deleted nothing a kept snapshot
    needs, and the sandbox resumes."""
    rnd = random.Random(int(os.environ.get("COVE_TEST_SEED", time.time())))
    d, hooks = hooked_coved(coved_factory, tmp_path, "gc_grace_s 1\n")
    c = d.client
    sid = c.create(template="busybox", snapshot_interval_s=0, timeout_s=3600)["id"]
    states = {}   # state name -> sha256 of data.bin
    expect = {}   # snapshot id -> state name, when known
    maybe = {}    # deleted (or maybe not, after a crash) snapshot id -> state name
    checked = set()
    made = [sid]  # sandboxes whose layers must be gone at the end

    def write_state(name):
        data = os.urandom(rnd.randrange(800000, 2500000))
        c.put_file(sid, "/home/data.bin", data)
        sh(c, sid, f"echo {name} > /home/state")
        states[name] = hashlib.sha256(data).hexdigest()

    write_state("s0")
    expect[snap(c, sid, "s0")["id"]] = "s0"
    kills = 0
    for i in range(1, 11):
        name = f"s{i}"
        write_state(name)
        action = ["snapshot", "gc", "rewind"][i % 3]
        injected = rnd.random() < 0.5
        res = {}
        if action == "snapshot":
            fault = f"fault {rnd.choice(['write', 'fsync', 'rename'])} kill {rnd.randrange(1, 12)}"

            def act():
                res["r"] = c.request("POST", f"/v1/sandboxes/{sid}/snapshots", {}, timeout=120)
        elif action == "gc":
            # a snapshot with chunks of its own, then delete it: the GC sweeps them
            s = snap(c, sid)
            expect[s["id"]] = name
            write_state(name + "b")
            expect[snap(c, sid)["id"]] = name + "b"
            fault = f"fault {rnd.choice(['unlink', 'rename'])} kill {rnd.randrange(1, 6)}"

            # a crash inside the delete may leave it listed or not: either is fine
            maybe[s["id"]] = expect.pop(s["id"])

            def act():
                res["r"] = c.request("DELETE", f"/v1/snapshots/{s['id']}", timeout=120)
        else:
            back = rnd.choice([k for k in expect])
            fault = f"fault {rnd.choice(['write', 'fsync'])} kill {rnd.randrange(1, 8)}"

            def act():
                res["back"] = back
                res["r"] = c.request("POST", f"/v1/sandboxes/{sid}/rewind",
                                     {"snapshot_id": back}, timeout=120)
        if injected:
            set_hooks(hooks, f"gc_grace_s 1\n{fault}\n")

        def run():
            try:
                act()
            except Exception as e:  # noqa: BLE001 - the connection dies with coved
                res["e"] = e
        t = threading.Thread(target=run)
        t.start()
        if injected:
            # the fault kills coved; a GC runs within 5 s of the delete
            deadline = time.time() + 15
            while d.alive() and time.time() < deadline:
                time.sleep(0.05)
        else:
            time.sleep(rnd.uniform(0.0, 0.6))
        died_by_fault = not d.alive()
        d.kill9()
        print(f"kill {i}: {action}, {fault if injected else 'timed'}, "
              f"{'died at the fault' if died_by_fault else 'killed'}, answer "
              f"{res['r'].status if res.get('r') is not None else None}")
        kills += 1
        t.join(60)
        r = res.get("r")
        if r is not None and r.status == 201 and action == "snapshot":
            expect[r.json()["id"]] = name
        set_hooks(hooks, "gc_grace_s 1\n")
        c = d.start()
        # nothing partial is left
        assert store_private_files(d.data) == [], (i, action, fault)
        assert temp_images(d.data) == [], (i, action)
        listed = [s["id"] for s in snapshots(c, sid)]
        # every snapshot we know of that was not deleted is still listed
        for k in expect:
            assert k in listed, (i, action, fault, died_by_fault, k)
        # new ones, and one older one (GC must not have taken its chunks), restore whole
        todo = [k for k in listed if k not in checked]
        old = [k for k in listed if k in checked]
        if old:
            todo.append(rnd.choice(old))
        for k in todo:
            st, digest = fork_read(c, k, sid, made)
            assert st in states and states[st] == digest, (i, action, k, st)
            want = expect.get(k) or maybe.pop(k, None)
            assert want in (None, st), (i, action, k, st, want)
            expect[k] = st
            checked.add(k)
        sb = c.sandbox(sid)
        assert sb["state"] in ("paused", "running"), sb
        if sb["state"] == "paused":
            c.post(f"/v1/sandboxes/{sid}/resume")
        st = sh(c, sid, "cat /home/state").strip()
        assert states[st] == hashlib.sha256(c.get_file(sid, "/home/data.bin").body).hexdigest()
    # the end: every listed snapshot restores (full check)
    for k in [s["id"] for s in snapshots(c, sid)]:
        st, digest = fork_read(c, k, sid, made)
        assert states[st] == digest and expect.get(k, st) == st, k
    assert kills == 10
    c.remove(sid, purge=True)
    # and no layer of the sandbox (or of a fork) keeps its loop device
    poll(lambda: not loops_under(d.data, made), timeout=30, what="loop devices detached")


