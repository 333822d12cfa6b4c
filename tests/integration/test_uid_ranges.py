"""Host uid ranges are exclusive across every coved of one host: each range is held with a
lock on the host-wide lock file (node/node.h COVE_UID_LOCK_FILE) for as long as its coved
runs, so two coveds never map two sandboxes onto the same host uids, and a coved that dies
leaves its ranges free at once (a restart takes a range again only if it is free)."""
import fcntl
import os
import signal
import struct
import time

import pytest

from cove import guest_pid, poll

pytestmark = pytest.mark.root

LOCK_FILE = "/run/cove/uid-slots.lock"
UID_FIRST = 0x10000000
UID_RANGE = 65536
PER_COVED = 20


def uid_map(gpid):
    """(inside, outside, count) rows of the sandbox init's uid_map."""
    with open(f"/proc/{gpid}/uid_map") as f:
        return [tuple(int(x) for x in ln.split()) for ln in f if ln.strip()]


def held_elsewhere(base):
    """The pid holding the lock of base's slot (another process), or 0 when free."""
    slot = (base - UID_FIRST) // UID_RANGE
    fd = os.open(LOCK_FILE, os.O_RDWR)
    try:
        # struct flock: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
        fl = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, slot, 1, 0)
        F_OFD_GETLK = 36
        r = fcntl.fcntl(fd, F_OFD_GETLK, fl + b"\0" * 4)
        typ = struct.unpack("hhqqi", r[:struct.calcsize("hhqqi")])[0]
        return typ != fcntl.F_UNLCK
    finally:
        os.close(fd)


def outside_ranges(c, sids):
    out = {}
    for sid in sids:
        rows = uid_map(guest_pid(c, sid))
        assert rows, f"{sid}: empty uid_map"
        out[sid] = [(o, o + n) for _, o, n in rows]
    return out


def test_two_coveds_on_one_host_never_share_a_uid_range(coved_factory):
    a = coved_factory(extra_args=("--pool", "0"))
    b = coved_factory(extra_args=("--pool", "0"))
    sa = [a.client.create(template="busybox")["id"] for _ in range(PER_COVED)]
    sb = [b.client.create(template="busybox")["id"] for _ in range(PER_COVED)]
    ranges = {**outside_ranges(a.client, sa), **outside_ranges(b.client, sb)}
    spans = sorted((lo, hi, sid) for sid, rs in ranges.items() for lo, hi in rs)
    for (lo1, hi1, s1), (lo2, hi2, s2) in zip(spans, spans[1:]):
        assert hi1 <= lo2, f"{s1} [{lo1},{hi1}) and {s2} [{lo2},{hi2}) share host uids"
    # each range's slot is locked host-wide while its coved runs
    for sid, rs in ranges.items():
        assert held_elsewhere(rs[0][0]), f"{sid}: its uid range is not held host-wide"
    # released once removed (the teardown after DELETE's answer frees the slot); a coved that
    # dies leaves its ranges to others at once
    for s in sb[:5]:
        b.client.remove(s)
    poll(lambda: not any(held_elsewhere(ranges[s][0][0]) for s in sb[:5]), timeout=60,
         what="the removed sandboxes' uid ranges released")
    a.kill9()
    assert not any(held_elsewhere(ranges[s][0][0]) for s in sa), "a dead coved's ranges"
    assert all(held_elsewhere(ranges[s][0][0]) for s in sb[5:])
    for s in sb[5:]:
        b.client.remove(s)


def test_a_host_has_more_than_4096_uid_ranges(coved_factory):
    """With the first 4,096 ranges held by someone else on this host (every one of them that
    is free is locked here, as another coved would hold it), a create still gets a range of
    its own, above them, instead of failing with "no free uid range": a host is not bound to
    4,096 live sandboxes. The locks are held only for the one create."""
    c = coved_factory(extra_args=("--pool", "0"))
    F_OFD_SETLK = 37
    fd = os.open(LOCK_FILE, os.O_RDWR)
    sid = None
    try:
        held = 0
        for slot in range(4096):
            fl = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, slot, 1, 0) + b"\0" * 4
            try:
                fcntl.fcntl(fd, F_OFD_SETLK, fl)
                held += 1
            except OSError:
                pass  # held by a coved of another test run: taken all the same
        assert held > 0, "could not hold any of the first 4,096 uid ranges"
        sid = c.client.create(template="busybox")["id"]
    finally:
        os.close(fd)  # drops every lock of this open file description
    rows = uid_map(guest_pid(c.client, sid))
    assert rows and all(o >= UID_FIRST + 4096 * UID_RANGE for _, o, _ in rows), rows
    assert held_elsewhere(rows[0][1]), "the range above 4,096 is held host-wide"
    c.client.remove(sid)
    poll(lambda: not held_elsewhere(rows[0][1]), timeout=60,
         what="the range released once the sandbox is removed")
