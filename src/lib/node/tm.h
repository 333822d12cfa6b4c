/* The node's side of the time machine: snapshots of this node's instances taken (layer
 * clone, CRIU dump or vm image) and captured into the chunk store (store/snapshot.h, which
 * only the node opens), and instances started again from them. What to snapshot, when,
 * what to keep and the catalog rows are the control plane's (control/snapshot.h). One
 * capture (or GC) at a time per node: bounded background I/O. Thread-safe. */
#ifndef COVE_NODE_TM_H
#define COVE_NODE_TM_H

#include <limits.h>
#include <stdint.h>

#include "node/node.h"
#include "util/err.h"
#include "util/log.h"

struct cove_node_tm;

struct cove_node_tm_config {
        const struct cove_log *log;
        /* the local store <data_dir>/store, data keys <data_dir>/keys, the chunk cache
         * <data_dir>/chunk-cache, vm images of plain sandboxes in flight */
        const char *data_dir;
        const char *store_url;   /* NULL: local directory; "s3://BUCKET[/PREFIX]" */
        const char *s3_endpoint; /* required with s3:// */
        int s3_timeout_s;        /* 0: 30 s */
        int cache_mb;            /* chunk cache budget (0: 1024 MiB) */
        /* Keep each sandbox's newest captured layer image on this node (reflink layer
         * filesystems only), so a resume or fork here clones it instead of rebuilding the
         * layer from the store (tm.c "kept layer images"). */
        int keep_images;
        /* The at-rest key (COVE_FSCRYPT_KEY_LEN bytes) of sandbox_id's writable layer, asked
         * for only when an encrypted layer image is opened; wiped after use. -1 with the
         * error (e.g. KEY_REVOKED). */
        int (*layer_key)(void *arg, const char *tenant, const char *sandbox_id, uint8_t *key,
                         struct cove_err *err);
        void *arg;
};

/* Open the chunk store and the checkpoint directory, and remove the temporary images a
 * crash left. -1 with the error (the store's, wrapped). */
int cove_node_tm_open(struct cove_node *node, const struct cove_node_tm_config *cfg,
                      struct cove_node_tm **out, struct cove_err *err);
void cove_node_tm_close(struct cove_node_tm *tm); /* NULL ok; no capture may be running */
/* 1 when this node can take snapshots (a store and a runtime with layer images). */
int cove_node_tm_ready(const struct cove_node_tm *tm);
/* 1 when the node's runtime has layer images. */
int cove_node_tm_layers(const struct cove_node_tm *tm);

/* What to snapshot: the running instance of sandbox_id, into snapshot snap_id of tenant.
 * kind: NULL (full where the node can, unless rolling), "files" or "full" (CONFLICT where
 * that cannot be taken). hold: the sandbox is about to be stopped or replaced (pause,
 * rewind): after a full dump it stays frozen, so nothing runs past the state it will resume
 * from; the caller stops it, or thaws it (cove_node_freeze) when it changes its mind. On
 * failure it always runs on. */
struct cove_node_tm_capture {
        const char *sandbox_id, *tenant, *snap_id;
        const char *parent_id; /* NULL: none */
        const char *kind;
        int rolling, hold;
        int encrypted; /* the layer is encrypted (its key from cfg.layer_key) */
};

struct cove_node_tm_taken {
        char kind[16];    /* "files" or "full" */
        int checkpoint;   /* an ns checkpoint (cove_node_tm_mem_id) was stored with it */
        int64_t pause_us; /* how long the sandbox was held */
        uint64_t size_bytes, new_bytes;
        char fallback[COVE_ERR_MSG_MAX]; /* "" or why a full snapshot fell back to files */
};

/* Take the snapshot and write it to the store (chunks, then the manifest). On success it is
 * durable but not listed: the caller writes its catalog row, or deletes it again
 * (cove_node_tm_delete) when it cannot. On failure nothing is left in the store. */
int cove_node_tm_capture(struct cove_node_tm *tm, const struct cove_node_tm_capture *c,
                         struct cove_node_tm_taken *out, struct cove_err *err);

/* A snapshot restored on this node for an instance to start from; owned by the caller
 * until cove_node_tm_start() takes it or cove_node_tm_image_drop() releases it. */
struct cove_node_tm_image {
        char img[PATH_MAX];          /* the layer image, left mounted (h) */
        char mem[PATH_MAX];          /* an ns full snapshot's checkpoint dir, else "" */
        int full_fd;                 /* a vm full snapshot's image (temp file), else -1 */
        struct cove_layer_handle *h; /* img's mount */
};

struct cove_node_tm_restore {
        const char *tenant, *snap_id, *snap_kind; /* the snapshot ("files" or "full") */
        const char *sandbox_id, *sandbox_tenant;  /* the sandbox it is restored for */
        int encrypted;                            /* the new layer is encrypted */
        unsigned disk_mb;
};

/* Fill a new image from the snapshot, verified chunk by chunk. No sync: a crash before the
 * catalog says `running` discards the image (reconcile purges the layer), so nothing here
 * must be durable. On failure nothing is left; the error names the snapshot. */
int cove_node_tm_restore(struct cove_node_tm *tm, const struct cove_node_tm_restore *q,
                         struct cove_node_tm_image *im, struct cove_err *err);
void cove_node_tm_image_drop(struct cove_node_tm *tm, struct cove_node_tm_image *im);

struct cove_node_tm_start {
        const char *sandbox_id, *tenant, *runtime;
        const char *rootfs; /* the template's root filesystem on this node */
        unsigned cpus, memory_mb, disk_mb;
        int encrypted;
        /* vm: the disk key (runtime.h cove_instance_spec.disk_key) */
        int (*disk_key)(void *ctx, const char *disk_id, uint8_t key[32], struct cove_err *err);
        void *disk_key_ctx;
};

/* Start the sandbox on im (always taken over, also on failure) with a new uid range
 * (*uid_base). On failure nothing is left; INTERNAL errors become UNAVAILABLE. */
int cove_node_tm_start(struct cove_node_tm *tm, const struct cove_node_tm_start *q,
                       struct cove_node_tm_image *im, uint32_t *uid_base, struct cove_err *err);

/* The files of a sandbox handed to fn as a directory fd (a template made from them,
 * control/tbuild.c): with snap_id, the files snapshot restored into a temporary image; else
 * a clone of the running instance sandbox_id's layer (encrypted: its key from
 * cfg.layer_key). Under the capture lock; the image is gone when this returns. fn's result,
 * or -1 with the error. */
struct cove_node_tm_files {
        const char *tenant, *sandbox_id;
        const char *snap_id; /* NULL: the running instance */
        int encrypted;       /* sandbox_id's layer is encrypted (without snap_id) */
        unsigned disk_mb;    /* size of the restored image (with snap_id) */
};
int cove_node_tm_files(struct cove_node_tm *tm, const struct cove_node_tm_files *q,
                       int (*fn)(void *arg, int tree_fd, struct cove_err *err), void *arg,
                       struct cove_err *err);

/* The chunk store, for reading manifests and entries (control/snapdiff.c); NULL when the
 * node has none. Owned by tm. */
struct cove_store *cove_node_tm_store(struct cove_node_tm *tm);

/* The store id of a full snapshot's checkpoint (<snap_id>-mem), and back: the snapshot a
 * store id belongs to (itself when it is no checkpoint). */
void cove_node_tm_mem_id(const char *snap_id, char *out, size_t cap);
void cove_node_tm_base_id(const char *store_id, char *out, size_t cap);

/* Delete a manifest from the store (its chunks go at the next GC). NOT_FOUND if absent. */
int cove_node_tm_delete(struct cove_node_tm *tm, const char *tenant, const char *store_id,
                        struct cove_err *err);
/* Remove every kept layer image of sandbox_id on this node (its stop for a revoked key:
 * they hold its files in clear). tm may be NULL. */
void cove_node_tm_forget(struct cove_node_tm *tm, const char *sandbox_id);
/* The store ids of the tenant's manifests; caller frees with cove_node_tm_list_free(). */
int cove_node_tm_list(struct cove_node_tm *tm, const char *tenant, char ***ids, size_t *n,
                      struct cove_err *err);
void cove_node_tm_list_free(char **ids, size_t n);
/* Those older than the store's grace period (store/snapshot.h cove_snapshot_list_settled). */
int cove_node_tm_list_settled(struct cove_node_tm *tm, const char *tenant, char ***ids, size_t *n,
                              struct cove_err *err);

/* A snapshot the catalog keeps, for GC's mark. */
struct cove_node_tm_kept {
        const char *id;
        int full; /* kind "full": its checkpoint, if it has one, is kept too */
};
struct cove_node_tm_gc_stats {
        uint64_t marked, swept, swept_bytes;
};
/* Sweep the tenant's chunks that no kept snapshot references (the store's grace period
 * protects those of a capture whose row is not written yet). Waits for a capture. */
int cove_node_tm_gc(struct cove_node_tm *tm, const char *tenant,
                    const struct cove_node_tm_kept *kept, size_t n,
                    struct cove_node_tm_gc_stats *out, struct cove_err *err);

#endif
