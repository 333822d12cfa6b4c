/* Chunk store backends: a flat namespace of immutable named objects ("<tenant>/chunks/ab/…",
 * "<tenant>/manifests/<id>") behind struct cove_chunkstore_ops, so a local directory (now)
 * and an S3-compatible bucket are interchangeable. Backends see only opaque bytes:
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
        const char *name; /* "fs", "s3", "cache" */
        /* Store an immutable object. If name already exists it is left as it is (never
         * rewritten) and put returns 1; else 0 once the object is durable. With a batch,
         * the object may become visible and durable only at batch_commit() (fs: appended
         * to a pack of the writing thread, visible once that pack is sealed; S3:
         * immediate). */
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

/* Local-directory backend rooted at root (created 0700 if missing). Unbatched objects are files
 * at root/<name>; every write goes through io (NULL: real syscalls). Caller closes with
 * cs->ops->close(cs). Does not call recover(). Batched puts are packed: many objects in one
 * file under root/.packs/<first name component>/, one fdatasync per pack (see
 * chunkstore_fs.c); loose object files (the format before packs) are read as ever. */
struct cove_chunkstore *cove_chunkstore_fs_open(const char *root, const struct cove_sysio *io,
                                                struct cove_err *err);
/* Same; loose = 1 writes batched puts as one file per object (the older format). */
struct cove_chunkstore *cove_chunkstore_fs_open2(const char *root, const struct cove_sysio *io,
                                                 int loose, struct cove_err *err);

/* S3-compatible backend (chunkstore_s3.c): objects at s3://BUCKET/PREFIX<name>, path-style
 * requests to endpoint, signed with SigV4 (the body's SHA-256 in x-amz-content-sha256, so
 * the server checks what it stores).
 *  - put: one PUT with If-None-Match: * (412: exists, 1). Never multipart: radosgw's
 *    multipart completion overwrites an existing key whatever the condition. After a
 *    retried PUT a 412 is resolved by the object's ETag (our bytes' MD5: ours, 0).
 *  - get: GET bounded by max (a larger Content-Length is refused before the body, a longer
 *    body while it comes, a body that does not match Content-Length after).
 *  - touch: copy onto itself with x-amz-metadata-directive: REPLACE (sets Last-Modified).
 *  - del: HEAD, then DELETE with x-amz-delete-if-unmodified-since: the server checks the
 *    object's mtime and removes it in one operation (radosgw: one RADOS op with an mtime
 *    guard), so a touch() racing GC either lands first (the delete is refused: kept) or
 *    finds the object gone (touch returns 0 and the writer puts the chunk again): the same
 *    guarantee as the fs backend's rename-aside. A store that ignores the header would turn
 *    this into an unconditional delete, so the first conditional del() of a handle probes
 *    it on a private object and refuses (UNAVAILABLE) if the server deleted anyway. Times
 *    are compared in whole seconds, rounded towards keeping. The grace period must exceed
 *    the clock skew between GC's host and the server (it is an hour by default).
 *  - list: ListObjectsV2 pages of 1000, continuation tokens percent-encoded; every key must
 *    carry the asked prefix and come in ascending order (a server looping on a page is an
 *    error); names that are not valid chunk-store names are skipped.
 *  - batches: puts are made at once (a PUT is durable once answered); commit reports the
 *    first failed put. recover(): nothing to do.
 * Every request has a deadline (timeout_ms); connection errors, timeouts, 5xx and 429 are
 * retried with exponential backoff and full jitter within retry_budget_ms, other statuses
 * are not. Errors name the object, never the credentials. */
struct cove_s3_opts {
        const char *url;        /* s3://BUCKET[/PREFIX] */
        const char *endpoint;   /* http(s)://HOST[:PORT] */
        const char *region;     /* NULL: $AWS_REGION, else us-east-1 */
        const char *access_key; /* NULL: $AWS_ACCESS_KEY_ID */
        const char *secret_key; /* NULL: $AWS_SECRET_ACCESS_KEY (copied; wiped at close) */
        int timeout_ms;         /* deadline of one request; 0: 30 s */
        int connect_timeout_ms; /* 0: 5 s */
        int retry_budget_ms;    /* total time of one operation with its retries; 0: 2 x timeout */
        int max_attempts;       /* 0: 8 */
        int no_bucket_check;    /* 1: skip the HEAD (and create) of the bucket at open */
        int list_page_keys;     /* max-keys of a listing page; 0: 1000 */
        /* tests only: called by del() between its HEAD and its DELETE */
        void (*before_delete)(const char *name, void *arg);
        void *hook_arg;
};
/* Opens the store and checks that the bucket answers (creating it if missing). */
struct cove_chunkstore *cove_chunkstore_s3_open(const struct cove_s3_opts *o, struct cove_err *err);
/* Split s3://BUCKET[/PREFIX] into bucket and prefix ("" or "a/b/"); BAD_REQUEST if wrong. */
int cove_s3_url_parse(const char *url, char *bucket, size_t bcap, char *prefix, size_t pcap,
                      struct cove_err *err);

/* A bounded local cache of immutable objects in front of a remote backend
 * (chunkstore_cache.c): get() of a name containing match (e.g. "/chunks/") is answered from
 * dir when present and intact, else from inner and kept; put() keeps a copy; a del() that
 * deleted drops it; has/touch/list always ask inner (the store decides what exists).
 * Each file holds a SHA-256 of its bytes and is checked on every read (a damaged file is
 * removed and fetched again); files are written to a temp name and renamed. Least
 * recently used files go first when the total passes budget bytes. The cache takes over
 * inner (closes it). */
struct cove_chunkstore *cove_chunkstore_cache_open(struct cove_chunkstore *inner, const char *dir,
                                                   uint64_t budget, const char *match,
                                                   struct cove_err *err);

/* The one place a backend is chosen. url NULL/"": the fs backend at fs_root; "s3://…": S3
 * at s3_endpoint, behind a cache at cache_dir when set. */
struct cove_chunkstore_cfg {
        const char *url;
        const char *fs_root;
        const struct cove_sysio *io; /* fs only */
        int fs_loose;                /* fs only: one file per object, no packs */
        const char *s3_endpoint;
        int s3_timeout_ms;     /* 0: default */
        const char *cache_dir; /* NULL: no cache */
        uint64_t cache_bytes;  /* 0: 1 GiB */
        const char *cache_match;
};
struct cove_chunkstore *cove_chunkstore_open(const struct cove_chunkstore_cfg *cfg,
                                             struct cove_err *err);

/* 1 if name follows the naming rule above. */
int cove_cs_name_valid(const char *name);

#endif
