"""Warm pools that grow with bursts of creates (coved --pool-max) and shrink back when idle
(--pool-idle), and the refill's behaviour around creates."""
import os
import shutil
import subprocess
import tempfile
import threading

import pytest

from lib.cove import Coved, poll


def _metrics(c):
    body = c.request("GET", "/metrics", auth=False).body.decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#") and " " in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def _burst(c, k):
    """k creates at once; returns their ids (every create must succeed)."""
    barrier = threading.Barrier(k)
    ids, errs = [], []

    def run():
        barrier.wait()
        try:
            ids.append(c.create(template="busybox")["id"])
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(str(e))

    ts = [threading.Thread(target=run) for _ in range(k)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errs, errs
    return ids


@pytest.mark.parametrize("args,msg", [
    (["--pool-max", "x"], b"--pool-max takes 1 to 256"),
    (["--pool-max", "0"], b"--pool-max takes 1 to 256"),
    (["--pool-max", "257"], b"--pool-max takes 1 to 256"),
    (["--pool-max", "4x"], b"--pool-max takes 1 to 256"),
    (["--pool", "4", "--pool-max", "3"], b"--pool-max 3 is below --pool (4)"),
    (["--pool-max", "2"], b"--pool-max 2 is below --pool (4)"),  # --pool's default
    (["--pool-idle", "0"], b"--pool-idle takes 1 to 86400"),
    (["--pool-idle", "-5"], b"--pool-idle takes 1 to 86400"),
    (["--pool-idle", ""], b"--pool-idle takes 1 to 86400"),
])
def test_bad_pool_flags_are_refused_with_a_clear_message(build_dir, args, msg):
    """A bad --pool-max or --pool-idle stops coved at start (exit 2) with a message naming
    the flag and its range, before it touches the data dir."""
    data = tempfile.mkdtemp(prefix="cove-poolflag-")
    try:
        r = subprocess.run([os.path.join(build_dir, "coved"), "--data-dir", data,
                            "--listen", "none"] + args, capture_output=True, timeout=60)
        assert r.returncode == 2, r
        assert msg in r.stderr, r.stderr
        assert os.listdir(data) == []
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_pool_grows_with_a_burst_within_its_bound_and_shrinks_back_when_idle(
        build_dir, templates_dir, log_dir):
    """--pool 1 --pool-max 4: a burst of 6 creates grows the pool's target past 1 but never
    past 4, the refill fills it beyond 1; once no create came for --pool-idle the target is
    1 again and the extra warm sandboxes are stopped (only the one pooled instance runs)."""
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--pool", "1", "--pool-max", "4", "--pool-idle", "8"])
    try:
        c = d.client
        poll(lambda: _metrics(c)["cove_pool_ready"] == 1, timeout=120, what="pool filled")
        assert _metrics(c)["cove_pool_target"] == 1
        ids = _burst(c, 6)
        m = _metrics(c)
        assert 1 < m["cove_pool_target"] <= 4, m
        assert m["cove_pool_taken_total"] + m["cove_pool_missed_total"] == 6, m
        seen = []

        def grown():
            m = _metrics(c)
            seen.append(m["cove_pool_target"])
            return m["cove_pool_ready"] >= 2
        poll(grown, timeout=120, what="pool refilled past its base")
        assert max(seen) <= 4, seen
        for i in ids:
            c.remove(i)

        def shrunk():
            m = _metrics(c)
            seen.append(m["cove_pool_target"])
            return (m["cove_pool_target"], m["cove_pool_ready"], m["cove_instances"]) == (1, 1, 1)
        poll(shrunk, timeout=180, what="pool back to its base")
        assert max(seen) <= 4, seen
        # the warm one left is still a working sandbox for the next create
        sb = c.create(template="busybox")
        assert _metrics(c)["cove_pool_taken_total"] >= 2
        assert c.exec(sb["id"], "echo ok")["stdout"] == "ok\n"
        c.remove(sb["id"])
    finally:
        d.stop()


def test_pool_without_pool_max_keeps_its_size_after_a_burst(build_dir, templates_dir, log_dir):
    """Without --pool-max a pool keeps its --pool size: a burst larger than it starts the
    rest cold and does not grow it."""
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--pool", "1"])
    try:
        c = d.client
        poll(lambda: _metrics(c)["cove_pool_ready"] == 1, timeout=120, what="pool filled")
        ids = _burst(c, 4)
        m = _metrics(c)
        assert m["cove_pool_target"] == 1 and m["cove_pool_missed_total"] >= 1, m
        poll(lambda: _metrics(c)["cove_pool_ready"] == 1, timeout=120, what="pool refilled")
        assert _metrics(c)["cove_instances"] == 5
        for i in ids:
            c.remove(i)
    finally:
        d.stop()


def test_emptied_pool_refills_while_creates_keep_coming(build_dir, templates_dir, log_dir):
    """A pool emptied by creates that never pause (two clients, each create right after the
    last, so a cold start is always queued) is refilled and taken from again meanwhile: cold
    creates pass a queued refill only for a bounded time, and a growing pool's refill waits
    for a gap in creates only while it holds its base. Every create succeeds."""
    d = Coved(build_dir, templates_dir=templates_dir, log_dir=log_dir,
              extra_args=["--pool", "1", "--pool-max", "3"])
    try:
        c = d.client
        poll(lambda: _metrics(c)["cove_pool_ready"] == 1, timeout=120, what="pool filled")
        stop = threading.Event()
        errs, made = [], []

        def creator():
            while not stop.is_set():
                try:
                    made.append(c.create(template="busybox")["id"])
                except Exception as e:  # noqa: BLE001 - reported below
                    errs.append(str(e))
                    return
        ts = [threading.Thread(target=creator) for _ in range(2)]
        [t.start() for t in ts]
        try:
            poll(lambda: _metrics(c)["cove_pool_taken_total"] >= 3 or errs or len(made) > 150,
                 timeout=180, what="pool taken from again during the creates")
        finally:
            stop.set()
            [t.join() for t in ts]
        assert not errs, errs
        assert _metrics(c)["cove_pool_taken_total"] >= 3, len(made)
        for i in made:
            c.remove(i)
    finally:
        d.stop()
