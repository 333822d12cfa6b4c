/* Snapshots on the deduplicating, encrypted chunk store (docs/storage.md).
 *
 * Capture: content is cut into chunks (FastCDC for files, 2 MiB fixed for memory images,
 * all-zero chunks become holes), each named HMAC-SHA256(tenant chunk-name key, plaintext),
 * compressed with zstd and sealed with AES-256-GCM under the tenant's chunk key; a chunk
 * already in the store is not written again. The manifest (entries + chunk lists) is
 * written last, encrypted: a snapshot exists once its manifest is durable, and every chunk
 * it names was durable before it. Restore verifies every chunk (tag, size, HMAC).
 *
 * A struct cove_store is thread-safe: captures, restores and GC may run concurrently.
 * Tenant names and snapshot ids: 1..63 of [A-Za-z0-9_-]. Errors: -1 + struct cove_err,
 * messages prefixed "snapshot <id>: ". */
#ifndef COVE_STORE_SNAPSHOT_H
#define COVE_STORE_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "store/chunkstore.h"
#include "util/err.h"
#include "util/sysio.h"

struct cove_store;

struct cove_store_opts {
        const char *root;            /* fs backend directory (objects <root>/<tenant>/…) */
        const char *keys_dir;        /* tenant data keys (<keys_dir>/<tenant>.dek) */
        const struct cove_sysio *io; /* NULL: real syscalls; tests inject faults here */
        int threads;                 /* hash+compress+encrypt+write workers; 0: twice the
                                        online CPUs (max 8); 1: everything on the caller's
                                        thread */
        int64_t gc_grace_ms;         /* GC never deletes objects younger than this; 0: 1 h */
        int zstd_level;              /* 0: 1 */
        const struct cove_chunkstore_cfg *backend; /* NULL: the fs backend at root; else
                                        the backend it names (store/chunkstore.h) */
        int fs_loose;   /* fs backend: write chunks as one file each (the format before
                           packs; tests that damage single chunk files use it) */
        int no_recover; /* 1: skip recover at open (a second handle on a store
                           another process is writing: recover would remove its
                           temp objects). The fs backend assumes one opener. */
};

/* Open the store (the backend o->backend names, by default fs at root) and run
 * cove_store_recover(). Caller closes. */
int cove_store_open(const struct cove_store_opts *o, struct cove_store **out, struct cove_err *err);
/* Same over an already opened backend, which the store takes over (closed with it). */
int cove_store_open_backend(struct cove_chunkstore *cs, const struct cove_store_opts *o,
                            struct cove_store **out, struct cove_err *err);
void cove_store_close(struct cove_store *st); /* NULL ok; no capture may be running */
/* Remove temp objects of interrupted writers and finish interrupted GC deletes. Called by
 * open; safe to call again when no capture of this store is running. */
int cove_store_recover(struct cove_store *st, struct cove_err *err);
struct cove_chunkstore *cove_store_backend(struct cove_store *st);

struct cove_snapshot_stats {
        uint64_t entries;      /* manifest entries */
        uint64_t size_bytes;   /* logical data bytes (files, or the stream) */
        uint64_t new_bytes;    /* plaintext bytes of chunks this snapshot added */
        uint64_t stored_bytes; /* bytes of objects it added (new chunks + manifest) */
        uint64_t chunks, new_chunks, holes;
        uint64_t reused_bytes; /* bytes of unchanged files taken from the parent's manifest */
        /* Time per stage, summed over threads (ns): restore fills read/hash/.. too. */
        uint64_t ns_read, ns_chunk, ns_hash, ns_compress, ns_encrypt, ns_write, ns_total;
};

/* Capture the tree under dirfd (not following symlinks, not descending into other
 * mounts: a mount point is recorded as an empty directory). Types: file, dir, symlink,
 * char, block, fifo, socket; mode, uid, gid, mtime (ns), xattrs (every namespace the
 * caller can read: user.*, trusted.* as root, security.*), rdev, holes; hard links are
 * preserved (restored as links). parent_id may be NULL. On success the manifest
 * <tenant>/manifests/<snap_id> is durable and out (may be NULL) is filled. On failure no
 * manifest exists; chunks already written stay until GC. CONFLICT if snap_id exists. */
int cove_snapshot_capture_tree(struct cove_store *st, const char *tenant, const char *snap_id,
                               const char *parent_id, int dirfd, struct cove_snapshot_stats *out,
                               struct cove_err *err);
/* Capture fd (read from its current offset to EOF) as kind "memory" with 2 MiB fixed
 * chunks; all-zero chunks are holes and cost no storage. */
int cove_snapshot_capture_stream(struct cove_store *st, const char *tenant, const char *snap_id,
                                 const char *parent_id, int fd, struct cove_snapshot_stats *out,
                                 struct cove_err *err);

/* Restore a "files" snapshot into dirfd, which must be an empty directory. Every chunk is
 * verified before its bytes are written. Owners are restored when running as root (or
 * when they are the caller's own); trusted.* xattrs and device nodes need root. Nothing
 * is fsynced. On failure the target is left partially filled (the caller restores into a
 * fresh directory and renames it into place only on success); the error names the
 * snapshot, the path and the chunk. */
int cove_snapshot_restore_tree(struct cove_store *st, const char *tenant, const char *snap_id,
                               int dirfd, struct cove_snapshot_stats *out, struct cove_err *err);
/* Restore a "memory" snapshot into fd (written from offset 0, holes left sparse, then
 * truncated to the image size). */
int cove_snapshot_restore_stream(struct cove_store *st, const char *tenant, const char *snap_id,
                                 int fd, struct cove_snapshot_stats *out, struct cove_err *err);
/* Check every chunk of a snapshot (read, tag, size, HMAC) without writing anything. */
int cove_snapshot_verify(struct cove_store *st, const char *tenant, const char *snap_id,
                         struct cove_err *err);

struct cove_snapshot_info {
        char parent[64]; /* "" if none */
        char kind[16];   /* "files" or "memory" */
        int64_t created_at;
        uint64_t size_bytes, new_bytes, entries, chunks;
};
int cove_snapshot_info(struct cove_store *st, const char *tenant, const char *snap_id,
                       struct cove_snapshot_info *out, struct cove_err *err);

/* Delete the manifest (its chunks go at the next GC). NOT_FOUND if absent. */
int cove_snapshot_delete(struct cove_store *st, const char *tenant, const char *snap_id,
                         struct cove_err *err);
/* Ids of the tenant's snapshots (sorted); caller frees with cove_snapshot_list_free(). */
int cove_snapshot_list(struct cove_store *st, const char *tenant, char ***ids, size_t *n,
                       struct cove_err *err);
void cove_snapshot_list_free(char **ids, size_t n);
/* Only the manifests written before the grace period (GC's cutoff): a capture that wrote
 * one of these and has not recorded it yet has run longer than the grace period allows.
 * Another process's capture may be between its manifest and its catalog row: a manifest
 * without a row is an orphan only once it is settled. */
int cove_snapshot_list_settled(struct cove_store *st, const char *tenant, char ***ids, size_t *n,
                               struct cove_err *err);

struct cove_gc_stats {
        uint64_t kept;   /* manifests marked from */
        uint64_t marked; /* distinct chunks they reference */
        uint64_t swept, swept_bytes;
        uint64_t young;    /* unreferenced, younger than the grace period */
        uint64_t inflight; /* unreferenced, in use by a capture of this process */
};
/* Mark-and-sweep for one tenant: keep the chunks referenced by keep_ids (manifests that
 * do not exist are an error: NOT_FOUND, nothing deleted), delete every other chunk unless
 * a capture in this process uses it or it was written/touched within the grace period.
 * Manifests not in keep_ids are not deleted (that is cove_snapshot_delete's job). */
int cove_store_gc(struct cove_store *st, const char *tenant, const char *const *keep_ids, size_t n,
                  struct cove_gc_stats *out, struct cove_err *err);

/* Snapshot diffs read snapshots without restoring them. */
struct cove_manifest;
struct cove_mentry;
/* The validated manifest of a snapshot (m initialised here; clear it in any case). */
int cove_snapshot_manifest(struct cove_store *st, const char *tenant, const char *snap_id,
                           struct cove_manifest *m, struct cove_err *err);
/* The content of regular file entry e of manifest m (not a hard link: pass the entry it
 * names), every chunk verified, into *out (caller frees; *len = e->size). LIMIT when the
 * file is larger than max, nothing read. */
int cove_snapshot_read_entry(struct cove_store *st, const char *tenant,
                             const struct cove_manifest *m, const struct cove_mentry *e, size_t max,
                             uint8_t **out, size_t *len, struct cove_err *err);

#endif
