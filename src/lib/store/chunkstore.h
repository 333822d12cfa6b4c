/* Chunk store backends: a flat namespace of immutable named objects ("<tenant>/chunks/ab/…",
 * "<tenant>/manifests/<id>") behind struct cove_chunkstore_ops, so a local directory (now)
 * and an S3-compatible bucket (next) are interchangeable. Backends see only opaque bytes:
 * naming, encryption and verification live in store/snapshot.c.
 *
 * Names: 1..255 bytes of [A-Za-z0-9_.-/], '/'-separated, no empty, "." or ".." component,
 * no component starting with '.' (those are the backend's private temp names).
 * All ops are thread-safe. Errors are -1 + struct cove_err (NOT_FOUND for a missing object). */
#ifndef COVE_STORE_CHUNKSTORE_H
#define COVE_STORE_CHUNKSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"
#include "util/sysio.h"

struct cove_chunkstore; /* backend handle; first member is its ops */
struct cove_cs_batch;   /* a group of deferred puts made durable together */

/* Called per object by list(); mtime_ms is the last put/touch. Return <0 to stop. */
typedef int (*cove_cs_list_cb)(const char *name, uint64_t size, int64_t mtime_ms, void *arg);

struct cove_chunkstore_ops {
        const char *name; /* "fs", later "s3" */
        /* Store an immutable object. If name already exists it is left as it is (never
         * rewritten) and put returns 1; else 0 once the object is durable. With a batch,
         * the object may become visible and durable only at batch_commit() (fs: written
         * to a temp name now, fsynced and renamed in groups; S3: immediate). */
        int (*put)(struct cove_chunkstore *cs, struct cove_cs_batch *b, const char *name,
                   const void *data, size_t len, struct cove_err *err);
        /* Read a whole object of at most max bytes; caller frees *out. Missing: NOT_FOUND. */
        int (*get)(struct cove_chunkstore *cs, const char *name, size_t max, void **out,
                   size_t *len, struct cove_err *err);
        /* 1 if it exists, 0 if not. */
        int (*has)(struct cove_chunkstore *cs, const char *name, struct cove_err *err);
        /* Like has(), but an existing object's mtime is set to now: a writer that dedups
         * against an existing object calls this so the GC grace period protects it
         * (S3: copy-in-place with metadata REPLACE). */
        int (*touch)(struct cove_chunkstore *cs, const char *name, struct cove_err *err);
        /* Delete name unless it was put or touched at or after not_after_ms (pass INT64_MAX
         * to delete unconditionally). 1 deleted, 0 kept (too new) or already gone. The
         * check and the delete are atomic with respect to touch() (fs: the object is first
         * renamed aside, re-checked, then unlinked or put back). */
        int (*del)(struct cove_chunkstore *cs, const char *name, int64_t not_after_ms,
                   struct cove_err *err);
        /* Every object whose name starts with prefix (which ends in '/'), any order. */
        int (*list)(struct cove_chunkstore *cs, const char *prefix, cove_cs_list_cb cb, void *arg,
                    struct cove_err *err);
        struct cove_cs_batch *(*batch_new)(struct cove_chunkstore *cs, struct cove_err *err);
        /* Make every put of the batch durable and visible; the batch stays usable. */
        int (*batch_commit)(struct cove_chunkstore *cs, struct cove_cs_batch *b,
                            struct cove_err *err);
        /* Drop uncommitted puts (their temp files are removed) and free; NULL ok. */
        void (*batch_free)(struct cove_chunkstore *cs, struct cove_cs_batch *b);
        /* Remove what an interrupted writer left (temp names), finish interrupted deletes. */
        int (*recover)(struct cove_chunkstore *cs, struct cove_err *err);
        void (*close)(struct cove_chunkstore *cs);
};

struct cove_chunkstore {
        const struct cove_chunkstore_ops *ops;
};

/* Local-directory backend rooted at root (created 0700 if missing). Objects are files at
 * root/<name>; every write goes through io (NULL: real syscalls). Caller closes with
 * cs->ops->close(cs). Does not call recover(). */
struct cove_chunkstore *cove_chunkstore_fs_open(const char *root, const struct cove_sysio *io,
                                                struct cove_err *err);

/* 1 if name follows the naming rule above. */
int cove_cs_name_valid(const char *name);

#endif
