"""Reading the local chunk store's objects from the outside, as the fs backend stores them
(src/lib/store/chunkstore_fs.c): loose files <store>/<tenant>/chunks/ab/<rest>, and packs
<store>/.packs/<tenant>/<16 hex>.pack (objects, then an index of
[u16 name length][name][u64 offset][u32 length] entries, then a 24-byte trailer:
u64 index offset, u32 entries, u32 crc32 of the index, b"CVPACK01"), with deleted objects
listed in the <id>.dead sidecar ("-name" / "+name" lines, the last one wins)."""
import glob
import os
import struct
import zlib

PACK_MAGIC = b"CVPACK01"


def pack_index(path):
    """[(name, offset, length)] of one pack file; ValueError if it does not check out."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24 or data[-8:] != PACK_MAGIC:
        raise ValueError(f"{path}: no pack trailer")
    ioff, n, crc = struct.unpack_from("<QII", data, len(data) - 24)
    ix = data[ioff:len(data) - 24]
    if zlib.crc32(ix) != crc:
        raise ValueError(f"{path}: index checksum")
    out, at = [], 0
    for _ in range(n):
        (nl,) = struct.unpack_from("<H", ix, at)
        name = ix[at + 2:at + 2 + nl].decode()
        off, ln = struct.unpack_from("<QI", ix, at + 2 + nl)
        out.append((name, off, ln))
        at += 2 + nl + 12
    return out


def dead_names(pack_path):
    dead = set()
    side = pack_path[:-len(".pack")] + ".dead"
    if os.path.exists(side):
        with open(side, "rb") as f:
            for line in f.read().split(b"\n")[:-1]:
                name = line[1:].decode()
                if line[:1] == b"-":
                    dead.add(name)
                else:
                    dead.discard(name)
    return dead


def packs(store, tenant="default"):
    return sorted(p for p in glob.glob(os.path.join(store, ".packs", tenant, "*.pack"))
                  if not os.path.basename(p).startswith("."))


def objects(store, tenant="default", kind="chunks"):
    """{name: (file, offset, length)} of the tenant's live objects of kind, loose or
    packed. The store may be in use: a file that GC removes or a pack it compacts away
    between the listing and the read makes the whole read start again (a read that skipped
    it could miss objects moved into a pack it had not listed)."""
    for _ in range(100):
        try:
            return _objects(store, tenant, kind)
        except FileNotFoundError:
            continue
    return _objects(store, tenant, kind)


def _objects(store, tenant, kind):
    out = {}
    root = os.path.join(store, tenant, kind)
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.startswith("."):
                p = os.path.join(dp, f)
                out[os.path.relpath(p, store)] = (p, 0, os.path.getsize(p))
    for p in packs(store, tenant):
        dead = dead_names(p)
        for name, off, ln in pack_index(p):
            if name.startswith(f"{tenant}/{kind}/") and name not in dead:
                out.setdefault(name, (p, off, ln))
    return out


def private_files(store):
    """Temp and being-deleted files of the store (names starting with '.'), packs too."""
    out = []
    for dp, _, fs in os.walk(store):
        out += [os.path.join(dp, f) for f in fs if f.startswith(".")]
    return out
