/* The time machine in the control plane (control/snapshot.h): capture and restore through
 * the node's layer images and the chunk store, the operations built on them, and the
 * background thread for rolling snapshots, retention thinning and GC. */
#include "control/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "control/egress.h"
#include "control/retention.h"
#include "control/template.h"
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "control/tenant.h"
#include "crypto/keys.h"
#include "store/snapshot.h"
#include "util/cleanup.h"
#include "util/testhooks.h"
#include "util/util.h"

#define FORK_MAX 20
#define LABEL_MAX 127
#define THIN_EVERY_MS 30000
#define IMG_SNAP "tm-snap-"
#define IMG_RESTORE "tm-restore-"
#define MEM_SUFFIX "-mem" /* store id of a full snapshot's checkpoint: <snapshot id>-mem */

struct cove_tm {
        struct cove_store *store;
        char layer_dir[PATH_MAX]; /* "" when the runtime has no layer images */
        /* CRIU checkpoints in flight (plaintext memory): on tmpfs, never on a disk where the
         * blocks would outlive the delete (encrypted layers, revocation) */
        char mem_dir[PATH_MAX];
        pthread_mutex_t mu; /* busy, quit, kicked */
        pthread_cond_t cv;
        char (*busy)[64]; /* sandboxes with an operation in progress */
        size_t nbusy, capbusy;
        pthread_mutex_t io_mu; /* one capture (or GC) at a time: bounded background I/O */
        pthread_t thr;
        int thr_started, quit, kicked;
        int rolling_off; /* the runtime cannot snapshot: rolling snapshots stopped */
        int gc_wanted;   /* snapshots were deleted since the last GC */
        int64_t last_thin_ms;
};

/* ---- per-sandbox serialisation ---- */

static int busy_find(struct cove_tm *tm, const char *id)
{
        for (size_t i = 0; i < tm->nbusy; i++)
                if (!strcmp(tm->busy[i], id))
                        return (int)i;
        return -1;
}

/* Mark id busy; with wait, wait for a current holder, else return 1 when it is held. */
static int sbx_lock(struct cove_tm *tm, const char *id, int wait)
{
        pthread_mutex_lock(&tm->mu);
        while (busy_find(tm, id) >= 0) {
                if (!wait) {
                        pthread_mutex_unlock(&tm->mu);
                        return 1;
                }
                pthread_cond_wait(&tm->cv, &tm->mu);
        }
        if (tm->nbusy == tm->capbusy) {
                size_t nc = tm->capbusy ? tm->capbusy * 2 : 16;
                void *nb = realloc(tm->busy, nc * sizeof(*tm->busy));
                if (!nb)
                        abort(); /* cannot serialise: continuing would race */
                tm->busy = nb;
                tm->capbusy = nc;
        }
        snprintf(tm->busy[tm->nbusy++], 64, "%s", id);
        pthread_mutex_unlock(&tm->mu);
        return 0;
}

static void sbx_unlock(struct cove_tm *tm, const char *id)
{
        pthread_mutex_lock(&tm->mu);
        int i = busy_find(tm, id);
        if (i >= 0)
                memcpy(tm->busy[i], tm->busy[--tm->nbusy], 64);
        pthread_cond_broadcast(&tm->cv);
        pthread_mutex_unlock(&tm->mu);
}

/* ---- JSON ---- */

json_t *cove_snapshot_json(const struct cove_snapshot_row *s)
{
        char created[40];
        cove_rfc3339(s->created_at, created, sizeof(created));
        return json_pack("{s:s, s:s, s:o, s:s, s:s, s:o, s:I, s:I, s:f, s:b}", "id", s->id,
                         "sandbox_id", s->sandbox_id, "parent_id",
                         s->parent_id[0] ? json_string(s->parent_id) : json_null(), "kind", s->kind,
                         "created_at", created, "label",
                         s->label[0] ? json_string(s->label) : json_null(), "size_bytes",
                         (json_int_t)s->size_bytes, "new_bytes", (json_int_t)s->new_bytes,
                         "pause_ms", (double)s->pause_us / 1000.0, "rolling", s->rolling);
}

/* The time machine's clock: snapshot times, rolling schedule and retention. Wall clock,
 * shifted in tests only (util/testhooks.h) so retention can be tested over days. */
static int64_t tm_now(void)
{
        return cove_now_ms() + cove_testhooks_clock_offset_ms();
}

/* ---- rows ---- */

static int reload(struct coved *d, const char *id, struct cove_sandbox_row *row,
                  struct cove_err *err)
{
        char copy[64]; /* id may point into row, which the load clears */
        snprintf(copy, sizeof(copy), "%s", id);
        cove_sandbox_row_clear(row);
        return cove_sandbox_load(d, NULL, copy, row, err);
}

static int row_write(struct coved *d, struct cove_sandbox_row *row, struct cove_err *err)
{
        int r = d->cat_ops->sandbox_update(d->cat, row, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %s not found", row->id);
        return r;
}

static void row_set_error(struct cove_sandbox_row *row, const char *msg)
{
        free(row->error);
        row->error = msg ? strdup(msg) : NULL;
}

/* A store failure (full, I/O error, missing or tampered chunk) is not the request's fault
 * and not a missing API object: the snapshot named in the message cannot be used now. */
static int store_err(struct cove_err *err)
{
        if (err->kind != COVE_E_KEY_REVOKED)
                err->kind = COVE_E_UNAVAILABLE;
        return -1;
}

struct cove_store *cove_tm_store(struct coved *d)
{
        return d->tm ? d->tm->store : NULL;
}

static int need_store(struct coved *d, struct cove_err *err)
{
        if (!d->tm || !d->tm->store || !d->tm->layer_dir[0])
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "runtime %s cannot snapshot sandboxes on this node",
                                     cove_node_runtime_name(d->node));
        return 0;
}

/* The start of pause, resume and rewind: the tenant's row, a usable store, and the
 * sandbox's operation lock (released by the caller with sbx_unlock). */
static int op_begin(struct coved *d, const char *tenant, const char *id,
                    struct cove_sandbox_row *row, struct cove_err *err)
{
        if (cove_sandbox_load(d, tenant, id, row, err) < 0)
                return -1;
        if (need_store(d, err) < 0 || coved_key_gate(d, row->tenant, err) < 0) {
                cove_sandbox_row_clear(row);
                return -1;
        }
        sbx_lock(d->tm, id, 1);
        return 0;
}

/* ---- full snapshots (vm: live memory, devices and disk as one image) ----
 * The runtime writes the image into an unnamed temp file (O_TMPFILE: nothing to clean up
 * after a crash); the store keeps it as one stream (2 MiB fixed chunks, zero chunks free).
 * The image holds guest RAM in clear: for a sandbox with encrypted storage it goes to the
 * checkpoint tmpfs, like an ns checkpoint, so no plaintext of it touches the data dir's
 * disk (at the cost of RAM for the image, disk overlay included); for a plain one (whose
 * disk overlay is plaintext there anyway) into the data dir. */

static int tmpfile_fd(struct coved *d, int encrypted, struct cove_err *err)
{
        const char *dir = encrypted ? d->tm->mem_dir : d->data_dir;
        int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        return fd < 0 ? cove_err_set(err, errno, "temp file in %s", dir) : fd;
}

static int capture_full(struct coved *d, struct cove_snapshot_row *s, int encrypted,
                        struct cove_snapshot_stats *st, struct cove_err *err)
{
        int fd = tmpfile_fd(d, encrypted, err);
        if (fd < 0)
                return -1;
        uint64_t pause_ns = 0;
        int r = cove_node_full_snapshot(d->node, s->sandbox_id, fd, &pause_ns, err);
        s->pause_us = (int64_t)(pause_ns / 1000);
        if (r == 0 && lseek(fd, 0, SEEK_SET) < 0)
                r = cove_err_set(err, errno, "full snapshot");
        if (r == 0) {
                pthread_mutex_lock(&d->tm->io_mu);
                r = cove_snapshot_capture_stream(d->tm->store, s->tenant, s->id,
                                                 s->parent_id[0] ? s->parent_id : NULL, fd, st,
                                                 err);
                pthread_mutex_unlock(&d->tm->io_mu);
                if (r < 0)
                        store_err(err);
        }
        close(fd);
        return r;
}

/* The image of full snapshot snap in a temp file (*fd), verified chunk by chunk. */
static int restore_full(struct coved *d, const char *tenant, const char *snap, int encrypted,
                        int *fd, struct cove_err *err)
{
        *fd = tmpfile_fd(d, encrypted, err);
        if (*fd < 0)
                return -1;
        struct cove_snapshot_stats st;
        if (cove_snapshot_restore_stream(d->tm->store, tenant, snap, *fd, &st, err) < 0) {
                close(*fd);
                *fd = -1;
                store_err(err);
                return cove_err_wrap(err, "restore of snapshot %s failed", snap);
        }
        return 0;
}

/* ---- capture ---- */

static void mem_id(const char *snap_id, char *out, size_t cap)
{
        snprintf(out, cap, "%s" MEM_SUFFIX, snap_id);
}

/* How long an operation waits for coved's start-up CRIU self-check (1-3 s) before it takes
 * a files snapshot, or refuses to restore a full one. */
#define FULL_WAIT_MS 60000

/* Whether snapshots of running sandboxes are full ones on this node (runtime + self-check);
 * why (may be NULL) says why not. */
static int full_ok(struct coved *d, char *why, size_t cap)
{
        char buf[320];
        return cove_node_full_wait(d->node, FULL_WAIT_MS, why ? why : buf,
                                   why ? cap : sizeof(buf)) == 1;
}

static void unhold(struct coved *d, const char *id)
{
        struct cove_err e2;
        cove_node_freeze(d->node, id, 0, &e2);
}

/* Snapshot the running sandbox row->id (locked by the caller). kind: NULL (full where the
 * node can, unless rolling), "files" or "full" (CONFLICT where that cannot be taken). On
 * success the snapshot row is in the catalog and the sandbox's last_snapshot_id names it
 * (row is reloaded).
 * hold: the sandbox is about to be stopped or replaced (pause, rewind): after a full dump it
 * stays frozen, so nothing runs past the state it will resume from; the caller stops it, or
 * thaws it (unhold) when it changes its mind. On failure it always runs on. */

static int capture_locked(struct coved *d, struct cove_sandbox_row *row, const char *label,
                          const char *kind, int rolling, int hold, struct cove_snapshot_row *out,
                          struct cove_err *err)
{
        struct cove_tm *tm = d->tm;
        if (need_store(d, err) < 0)
                return -1;
        if (strcmp(row->state, "running") && strcmp(row->state, "pausing"))
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is %s, not running",
                                     row->id, row->state);
        struct cove_snapshot_row s;
        memset(&s, 0, sizeof(s));
        if (cove_id_new("snap_", s.id, sizeof(s.id), err) < 0)
                return -1;
        snprintf(s.tenant, sizeof(s.tenant), "%s", row->tenant);
        snprintf(s.sandbox_id, sizeof(s.sandbox_id), "%s", row->id);
        snprintf(s.parent_id, sizeof(s.parent_id), "%s", row->last_snapshot_id);
        snprintf(s.kind, sizeof(s.kind), "files");
        snprintf(s.label, sizeof(s.label), "%s", label ? label : "");
        s.rolling = rolling;

        char img[PATH_MAX], mem[PATH_MAX];
        snprintf(img, sizeof(img), "%s/" IMG_SNAP "%s.img", tm->layer_dir, s.id);
        snprintf(mem, sizeof(mem), "%s/" IMG_SNAP "%s.criu", tm->mem_dir, s.id);
        uint64_t pause_ns = 0;
        int64_t t0 = cove_mono_ns();
        s.created_at = tm_now();
        struct cove_snapshot_stats st, mst;
        memset(&st, 0, sizeof(st));
        memset(&mst, 0, sizeof(mst));
        char mid[80];
        mem_id(s.id, mid, sizeof(mid));
        int full = 0;                               /* an ns checkpoint (CRIU) was taken */
        if (cove_node_has_full(d->node, row->id)) { /* vm: live memory too */
                if (kind && !strcmp(kind, "files"))
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "sandbox %s: a vm sandbox's snapshots are full "
                                             "(memory and disk are one image); kind \"files\" "
                                             "is for ns sandboxes",
                                             row->id);
                snprintf(s.kind, sizeof(s.kind), "full");
                if (capture_full(d, &s, row->storage_encrypted, &st, err) < 0)
                        return cove_err_wrap(err,
                                             "snapshot of sandbox %s (previous snapshots "
                                             "intact)",
                                             row->id);
                goto captured;
        }
        /* ns: full (files + memory + processes) with CRIU when the node can; rolling snapshots
         * stay files: a checkpoint stops the sandbox for the whole dump (hundreds of ms for
         * 100 MB), too long to do every minute without the agent noticing */
        char why[320];
        if (kind && !strcmp(kind, "full") && !full_ok(d, why, sizeof(why)))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "sandbox %s: this node cannot take full snapshots (%s); "
                                     "kind \"files\" takes its files",
                                     row->id, why);
        full = kind ? !strcmp(kind, "full") : !rolling && full_ok(d, NULL, 0);
        if (full) {
                struct cove_err fe;
                if (cove_node_full_dump(d->node, row->id, img, mem, hold, &pause_ns, &fe) < 0) {
                        unlink(img);
                        if (kind) /* asked for: no files snapshot instead */
                                return cove_err_setk(err, COVE_E_CONFLICT, fe.errnum,
                                                     "full snapshot of sandbox %s failed (no "
                                                     "snapshot taken; kind \"files\" takes its "
                                                     "files): %s",
                                                     row->id, fe.msg);
                        /* e.g. a TCP connection or an egress link CRIU cannot take along:
                         * the files are still worth a snapshot */
                        cove_warn(&d->log, "snapshot.full",
                                  "sandbox %s: full snapshot failed, taking files only: %s",
                                  row->id, fe.msg);
                        full = 0;
                } else {
                        snprintf(s.kind, sizeof(s.kind), "full");
                }
        }
        if (!full && cove_node_layer_snapshot(d->node, row->id, img, &pause_ns, err) < 0) {
                unlink(img);
                return cove_err_wrap(err, "snapshot of sandbox %s", row->id);
        }
        s.pause_us = (int64_t)(pause_ns / 1000);

        /* the sandbox runs on; the rest is background work, one capture at a time */
        pthread_mutex_lock(&tm->io_mu);
        int tree_fd = -1;
        struct cove_layer_handle *h = NULL;
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        int r = row->storage_encrypted ? coved_layer_key(d, row->tenant, row->id, key, err) : 0;
        if (r == 0)
                r = cove_node_layer_open(d->node, img, 0, 0, row->storage_encrypted ? key : NULL,
                                         &tree_fd, &h, err);
        OPENSSL_cleanse(key, sizeof(key));
        if (r == 0) {
                r = cove_snapshot_capture_tree(tm->store, s.tenant, s.id,
                                               s.parent_id[0] ? s.parent_id : NULL, tree_fd, &st,
                                               err);
                if (tree_fd >= 0)
                        close(tree_fd);
                cove_node_layer_close(d->node, h);
        }
        if (r == 0 && full) {
                /* the checkpoint directory, as a tree: content-defined chunks dedup memory
                 * pages far better than fixed 2 MiB ones (an idle sandbox's next checkpoint
                 * differs in a few pages); encrypted like everything else */
                int mfd = open(mem, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                r = mfd < 0 ? cove_err_set(err, errno, "open %s", mem)
                            : cove_snapshot_capture_tree(tm->store, s.tenant, mid, NULL, mfd, &mst,
                                                         err);
                if (mfd >= 0)
                        close(mfd);
                if (r < 0) {
                        struct cove_err e2;
                        cove_snapshot_delete(tm->store, s.tenant, s.id, &e2);
                }
        }
        pthread_mutex_unlock(&tm->io_mu);
        unlink(img);
        if (full) {
                struct cove_err e2;
                cove_rm_rf(mem, &e2);
        }
        if (r < 0) {
                if (hold && full)
                        unhold(d, row->id);
                store_err(err);
                return cove_err_wrap(err, "snapshot of sandbox %s (previous snapshots intact)",
                                     row->id);
        }
captured:
        s.size_bytes = st.size_bytes + mst.size_bytes;
        s.new_bytes = st.new_bytes + mst.new_bytes;
        if (d->cat_ops->snapshot_insert(d->cat, &s, err) < 0) {
                struct cove_err e2;
                cove_snapshot_delete(tm->store, s.tenant, s.id, &e2);
                if (full)
                        cove_snapshot_delete(tm->store, s.tenant, mid, &e2);
                if (hold && full)
                        unhold(d, row->id);
                return cove_err_wrap(err, "snapshot of sandbox %s", row->id);
        }
        if (reload(d, row->id, row, err) == 0) {
                snprintf(row->last_snapshot_id, sizeof(row->last_snapshot_id), "%s", s.id);
                row_write(d, row, err);
        }
        cove_info(&d->log, "snapshot.take",
                  "sandbox %s snapshot %s (%s%s): %llu bytes (%llu new), paused %.2f ms, %.1f ms "
                  "total",
                  s.sandbox_id, s.id, s.kind, rolling ? ", rolling" : "",
                  (unsigned long long)s.size_bytes, (unsigned long long)s.new_bytes,
                  (double)s.pause_us / 1000.0, (double)(cove_mono_ns() - t0) / 1e6);
        if (!rolling)
                coved_audit_control(d, s.tenant, s.sandbox_id, "snapshot",
                                    json_pack("{s:s, s:s}", "snapshot", s.id, "kind", s.kind));
        if (out)
                *out = s;
        return 0;
}

int coved_space_check(struct coved *d, const char *what, struct cove_err *err)
{
        struct statvfs vf;
        if (statvfs(d->data_dir, &vf) < 0)
                return 0; /* nothing to judge by: the write itself will say */
        uint64_t total = (uint64_t)vf.f_blocks * vf.f_frsize >> 20;
        uint64_t avail = (uint64_t)vf.f_bavail * vf.f_frsize >> 20;
        uint64_t reserve = total / 50;
        if (reserve > 1024)
                reserve = 1024;
        if (reserve < COVE_DISK_RESERVE_MB_MIN)
                reserve = COVE_DISK_RESERVE_MB_MIN;
        if (avail >= reserve)
                return 0;
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                             "%s: no space left on the node's data disk (%llu MB free of %llu "
                             "MB; the last %llu MB are kept for running sandboxes): free "
                             "space there or delete snapshots, then retry",
                             what, (unsigned long long)avail, (unsigned long long)total,
                             (unsigned long long)reserve);
}

int cove_snapshot_take(struct coved *d, const char *tenant, const char *sandbox_id,
                       const char *label, const char *kind, int rolling,
                       struct cove_snapshot_row *out, struct cove_err *err)
{
        if (label && strlen(label) > LABEL_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "label must be at most %d bytes",
                                     LABEL_MAX);
        if (kind && strcmp(kind, "files") && strcmp(kind, "full"))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "kind must be \"files\" or \"full\"");
        char what[128];
        snprintf(what, sizeof(what), "snapshot of sandbox %.64s", sandbox_id);
        if (coved_space_check(d, what, err) < 0)
                return -1;
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, sandbox_id, &row, err) < 0)
                return -1;
        int gate = coved_key_gate(d, row.tenant, err);
        cove_sandbox_row_clear(&row);
        if (gate < 0 || need_store(d, err) < 0)
                return -1;
        sbx_lock(d->tm, sandbox_id, 1);
        int r = reload(d, sandbox_id, &row, err);
        if (r == 0)
                r = capture_locked(d, &row, label, kind, rolling, 0, out, err);
        sbx_unlock(d->tm, sandbox_id);
        cove_sandbox_row_clear(&row);
        return r;
}

/* ---- restore ---- */

/* Fill a fresh layer image from snapshot snap (of tenant) into img, left mounted: *h is its
 * handle, for start_from_image() to run the sandbox on that mount, or to release with
 * cove_node_layer_close() before removing img. No sync: a crash before the catalog says
 * `running` discards the image (reconcile purges the layer), so nothing here must be
 * durable. On failure nothing is left; the error names the snapshot. */
static int restore_files(struct coved *d, const char *tenant, const char *snap,
                         const struct cove_sandbox_row *target, char *img, size_t cap,
                         struct cove_layer_handle **h, struct cove_err *err)
{
        struct cove_tm *tm = d->tm;
        char rnd[32];
        if (need_store(d, err) < 0 || cove_id_new("", rnd, sizeof(rnd), err) < 0)
                return -1;
        snprintf(img, cap, "%s/" IMG_RESTORE "%s-%s.img", tm->layer_dir, snap, rnd);
        int tree_fd = -1;
        *h = NULL;
        struct cove_snapshot_stats st;
        /* an encrypted target's layer is encrypted from the first byte restored */
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        int enc = target->storage_encrypted;
        int r = enc ? coved_layer_key(d, target->tenant, target->id, key, err) : 0;
        if (r == 0)
                r = cove_node_layer_open(d->node, img, 1, (unsigned)target->disk_mb,
                                         enc ? key : NULL, &tree_fd, h, err);
        OPENSSL_cleanse(key, sizeof(key));
        if (r == 0) {
                r = cove_snapshot_restore_tree(tm->store, tenant, snap, tree_fd, &st, err);
                if (tree_fd >= 0)
                        close(tree_fd);
                if (r < 0) {
                        cove_node_layer_close(d->node, *h);
                        *h = NULL;
                }
        }
        if (r < 0) {
                unlink(img);
                store_err(err);
                return cove_err_wrap(err, "restore of snapshot %s failed", snap);
        }
        return 0;
}

/* A full snapshot's checkpoint into a temporary directory mem (the runtime takes it over at
 * start); mem is "" for a files snapshot. On failure nothing is left. */
static int restore_mem(struct coved *d, const struct cove_snapshot_row *snap, char *mem, size_t cap,
                       struct cove_err *err)
{
        mem[0] = 0;
        if (strcmp(snap->kind, "full"))
                return 0;
        char rnd[32], mid[80];
        if (cove_id_new("", rnd, sizeof(rnd), err) < 0)
                return -1;
        char why[320];
        if (cove_node_full_wait(d->node, FULL_WAIT_MS, why, sizeof(why)) != 1)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "snapshot %s is a full snapshot and this node cannot "
                                     "restore processes (%s)",
                                     snap->id, why);
        snprintf(mem, cap, "%s/" IMG_RESTORE "%s-%s.criu", d->tm->mem_dir, snap->id, rnd);
        mem_id(snap->id, mid, sizeof(mid));
        int fd = mkdir(mem, 0700) < 0 ? -1 : open(mem, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct cove_snapshot_stats st;
        int r = fd < 0 ? cove_err_set(err, errno, "create %s", mem)
                       : cove_snapshot_restore_tree(d->tm->store, snap->tenant, mid, fd, &st, err);
        if (fd >= 0)
                close(fd);
        if (r < 0) {
                struct cove_err e2;
                cove_rm_rf(mem, &e2);
                mem[0] = 0;
                store_err(err);
                return cove_err_wrap(err, "restore of snapshot %s failed", snap->id);
        }
        return 0;
}

/* Release what restore_files() left (the mount, then the file). */
static void drop_image(struct coved *d, const char *img, struct cove_layer_handle *h)
{
        cove_node_layer_close(d->node, h);
        unlink(img);
}

/* Both parts of snapshot snap: the layer into img (mounted, *h), and for a full one the
 * checkpoint into mem (else ""). On failure nothing is left; the error names the snapshot. */
static int restore_image(struct coved *d, const struct cove_snapshot_row *snap,
                         const struct cove_sandbox_row *target, char *img, size_t cap,
                         struct cove_layer_handle **h, char *mem, size_t mcap, struct cove_err *err)
{
        if (restore_files(d, snap->tenant, snap->id, target, img, cap, h, err) < 0)
                return -1;
        if (restore_mem(d, snap, mem, mcap, err) < 0) {
                drop_image(d, img, *h);
                *h = NULL;
                return -1;
        }
        return 0;
}

/* A vm full snapshot is one memory image (capture_full); an ns one is a files tree plus its
 * checkpoint (<id>-mem). */
static int is_vm_full(struct coved *d, const struct cove_snapshot_row *snap)
{
        struct cove_snapshot_info info;
        struct cove_err e2;
        return !strcmp(snap->kind, "full") &&
               cove_snapshot_info(d->tm->store, snap->tenant, snap->id, &info, &e2) == 0 &&
               !strcmp(info.kind, "memory");
}

/* A tenant holding its own key gets its ns sandboxes' layers encrypted from the next
 * restore on, also those made plain before it brought the key (the restored layer is a new
 * image, filled from the chunk store). byok: coved_tenant_byok(). */
static void byok_upgrade(struct cove_sandbox_row *row, int byok)
{
        if (byok == 1 && !strcmp(row->runtime, "ns"))
                row->storage_encrypted = 1;
}

/* Start row's sandbox on img, still mounted as h (and, for an ns full snapshot, the
 * checkpoint mem; all taken over by the runtime) with a new uid range; or, with img NULL, on
 * the vm full snapshot image in full_fd (closed here). */
static int start_from_image(struct coved *d, struct cove_sandbox_row *row, const char *img,
                            struct cove_layer_handle *h, const char *mem, int full_fd,
                            struct cove_err *err)
{
        char rootfs[PATH_MAX];
        int r = cove_template_lookup_for(d->templates_dir, row->tenant, row->template_name, rootfs,
                                         sizeof(rootfs), err);
        if (r == 1)
                r = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                  "template %s is not built on this node", row->template_name);
        uint32_t base = 0;
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        /* a vm's disk key: asked for by the driver, by the disk's lineage (runtime.h) */
        int is_vm = !strcmp(row->runtime, "vm");
        int layer_enc = row->storage_encrypted && !is_vm;
        struct coved_disk_key_ctx kc = {.d = d, .tenant = row->tenant};
        if (r == 0 && layer_enc)
                r = coved_layer_key(d, row->tenant, row->id, key, err);
        if (r < 0 || cove_node_uid_reserve(d->node, &base, err) < 0) {
                struct cove_err e2;
                OPENSSL_cleanse(key, sizeof(key));
                if (img)
                        drop_image(d, img, h);
                if (mem && *mem)
                        cove_rm_rf(mem, &e2);
                if (full_fd >= 0)
                        close(full_fd);
                return -1;
        }
        struct cove_instance_spec spec = {
            .sandbox_id = row->id,
            .runtime = row->runtime,
            .rootfs = rootfs,
            .cpus = (unsigned)row->cpus,
            .memory_mb = (unsigned)row->memory_mb,
            .disk_mb = (unsigned)row->disk_mb,
            .uid_base = base,
            .uid_count = COVE_UID_RANGE,
            .layer_image = img,
            .layer_handle = img ? h : NULL,
            .mem_image = mem && *mem ? mem : NULL,
            .layer_key = layer_enc ? key : NULL,
            .disk_encrypted = row->storage_encrypted && is_vm,
            .disk_key = coved_disk_key_cb,
            .disk_key_ctx = &kc,
            .full = !img,
            .full_fd = full_fd,
        };
        r = cove_node_start(d->node, &spec, err);
        OPENSSL_cleanse(key, sizeof(key));
        if (full_fd >= 0)
                close(full_fd);
        if (r < 0) {
                struct cove_err e2;
                cove_node_stop(d->node, row->id, 1, &e2);
                cove_node_uid_release(d->node, base);
                if (img)
                        unlink(img);
                if (err->kind == COVE_E_INTERNAL)
                        err->kind = COVE_E_UNAVAILABLE;
                return -1;
        }
        row->uid_base = base;
        return 0;
}

static void wake_timer(struct coved *d)
{
        pthread_mutex_lock(&d->mu);
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
}

static void set_running(struct coved *d, struct cove_sandbox_row *row, const char *snap)
{
        snprintf(row->state, sizeof(row->state), "running");
        row->expires_at = cove_now_ms() + (int64_t)row->timeout_s * 1000;
        snprintf(row->last_snapshot_id, sizeof(row->last_snapshot_id), "%s", snap);
        row_set_error(row, NULL);
        (void)d;
}

/* ---- operations ---- */

int cove_sandbox_pause(struct coved *d, const char *tenant, const char *id, json_t **out,
                       struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (op_begin(d, tenant, id, &row, err) < 0)
                return -1;
        int r = reload(d, id, &row, err);
        if (r == 0 && strcmp(row.state, "running") != 0)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is %s, not running", id,
                                  row.state);
        if (r < 0)
                goto out;
        int64_t t0 = cove_mono_ns();
        snprintf(row.state, sizeof(row.state), "pausing");
        if ((r = row_write(d, &row, err)) < 0)
                goto out;
        struct cove_snapshot_row snap;
        struct cove_err e2;
        if ((r = capture_locked(d, &row, "pause", NULL, 0, 1, &snap, err)) < 0) {
                cove_err_wrap(err, "pause");
                if (reload(d, id, &row, &e2) == 0 && !strcmp(row.state, "pausing")) {
                        snprintf(row.state, sizeof(row.state), "running");
                        row_write(d, &row, &e2);
                }
                goto out;
        }
        /* the snapshot holds everything: free the instance, its layer and uid range */
        if (cove_node_stop(d->node, id, 1, &e2) < 0)
                cove_warn(&d->log, "sandbox.pause", "%s", e2.msg);
        if ((r = reload(d, id, &row, err)) < 0)
                goto out;
        snprintf(row.state, sizeof(row.state), "paused");
        row.uid_base = 0;
        row.expires_at = 0;
        row_set_error(&row, NULL);
        if ((r = row_write(d, &row, err)) < 0)
                goto out;
        coved_audit_control(d, row.tenant, id, "pause", json_pack("{s:s}", "snapshot", snap.id));
        cove_info(&d->log, "sandbox.pause", "sandbox %s paused at snapshot %s in %.1f ms", id,
                  snap.id, (double)(cove_mono_ns() - t0) / 1e6);
        *out = json_pack("{s:o, s:o}", "sandbox", cove_sandbox_json(&row), "snapshot",
                         cove_snapshot_json(&snap));
out:
        sbx_unlock(d->tm, id);
        cove_sandbox_row_clear(&row);
        return r;
}

/* The snapshot a body names ("snapshot_id"), or dflt; must be the tenant's. */
static int pick_snapshot(struct coved *d, const char *tenant, json_t *body, const char *dflt,
                         int required, struct cove_snapshot_row *snap, struct cove_err *err)
{
        json_t *v = body ? json_object_get(body, "snapshot_id") : NULL;
        const char *sid = dflt;
        if (v && !json_is_null(v)) {
                if (!json_is_string(v) || json_string_length(v) == 0 ||
                    json_string_length(v) >= sizeof(snap->id))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "snapshot_id must be a snapshot id (snap_…)");
                sid = json_string_value(v);
        } else if (required) {
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "snapshot_id is required");
        }
        if (!sid || !*sid)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "the sandbox has no snapshot to restore from");
        return cove_snapshot_load(d, tenant, sid, snap, err);
}

int cove_sandbox_resume(struct coved *d, const char *tenant, const char *id, json_t *body,
                        json_t **out, struct cove_err *err)
{
        char what[128];
        snprintf(what, sizeof(what), "resume of sandbox %s", id);
        if (coved_space_check(d, what, err) < 0)
                return -1;
        struct cove_sandbox_row row;
        if (op_begin(d, tenant, id, &row, err) < 0)
                return -1;
        char prev[16] = "";
        struct cove_snapshot_row snap;
        int r = reload(d, id, &row, err);
        if (r == 0 && strcmp(row.state, "paused") && strcmp(row.state, "stopped") &&
            strcmp(row.state, "error"))
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "sandbox %s is %s: only a paused or stopped sandbox resumes", id,
                                  row.state);
        if (r == 0)
                r = pick_snapshot(d, row.tenant, body, row.last_snapshot_id, 0, &snap, err);
        int byok = r == 0 ? coved_tenant_byok(d, row.tenant, err) : -1;
        if (byok < 0) {
                r = -1;
                goto out;
        }
        int64_t t0 = cove_mono_ns();
        snprintf(prev, sizeof(prev), "%s", row.state);
        snprintf(row.state, sizeof(row.state), "resuming");
        /* a paused sandbox already counts as live (and its disk as storage) */
        int was_live = !strcmp(prev, "paused");
        coved_quota_lock(d);
        r = coved_quota_admit(d, row.tenant, was_live ? 0 : 1, row.cpus, row.memory_mb,
                              was_live ? 0 : row.disk_mb, err);
        if (r == 0)
                r = row_write(d, &row, err);
        coved_quota_unlock(d);
        if (r < 0)
                goto out;
        /* a stopped sandbox may have left state behind (a crash): start from a clean slate */
        struct cove_err e2;
        cove_node_stop(d->node, id, 1, &e2);
        char img[PATH_MAX], mem[PATH_MAX] = "";
        int full_fd = -1;
        struct cove_layer_handle *lh = NULL;
        int64_t t1 = cove_mono_ns();
        byok_upgrade(&row, byok);
        if (is_vm_full(d, &snap))
                r = restore_full(d, row.tenant, snap.id, row.storage_encrypted, &full_fd, err);
        else
                r = restore_image(d, &snap, &row, img, sizeof(img), &lh, mem, sizeof(mem), err);
        int64_t t2 = cove_mono_ns();
        if (r == 0)
                r = start_from_image(d, &row, full_fd >= 0 ? NULL : img, lh, mem, full_fd, err);
        int64_t t3 = cove_mono_ns();
        if (r < 0) {
                cove_err_wrap(err, "resume of sandbox %s", id);
                if (reload(d, id, &row, &e2) == 0) {
                        snprintf(row.state, sizeof(row.state), "%s", prev);
                        row_set_error(&row, err->msg);
                        row_write(d, &row, &e2);
                }
                goto out;
        }
        uint32_t base = row.uid_base;
        if ((r = reload(d, id, &row, err)) < 0) {
                cove_node_stop(d->node, id, 1, &e2); /* deleted meanwhile */
                goto out;
        }
        row.uid_base = base;
        byok_upgrade(&row, byok);
        set_running(d, &row, snap.id);
        if ((r = row_write(d, &row, err)) < 0) {
                cove_node_stop(d->node, id, 1, &e2);
                goto out;
        }
        wake_timer(d);
        cove_tm_kick(d);
        coved_egress_refresh(d, row.tenant, id); /* a new instance: a new link */
        coved_audit_control(d, row.tenant, id, "resume", json_pack("{s:s}", "snapshot", snap.id));
        cove_info(&d->log, "sandbox.resume",
                  "sandbox %s resumed from snapshot %s in %.1f ms (restore %.1f ms, start %.1f ms)",
                  id, snap.id, (double)(cove_mono_ns() - t0) / 1e6, (double)(t2 - t1) / 1e6,
                  (double)(t3 - t2) / 1e6);
        *out = cove_sandbox_json(&row);
out:
        sbx_unlock(d->tm, id);
        cove_sandbox_row_clear(&row);
        return r;
}

int cove_sandbox_rewind(struct coved *d, const char *tenant, const char *id, json_t *body,
                        json_t **out, struct cove_err *err)
{
        char what[128];
        snprintf(what, sizeof(what), "rewind of sandbox %s", id);
        if (coved_space_check(d, what, err) < 0)
                return -1;
        struct cove_sandbox_row row;
        if (op_begin(d, tenant, id, &row, err) < 0)
                return -1;
        struct cove_snapshot_row snap, undo;
        memset(&undo, 0, sizeof(undo));
        int running = 0;
        int r = reload(d, id, &row, err);
        if (r == 0)
                r = pick_snapshot(d, row.tenant, body, NULL, 1, &snap, err);
        int byok = r == 0 ? coved_tenant_byok(d, row.tenant, err) : -1;
        if (byok < 0) {
                r = -1;
                goto out;
        }
        running = !strcmp(row.state, "running");
        if (!running && strcmp(row.state, "paused") && strcmp(row.state, "stopped")) {
                r = cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is %s", id, row.state);
                goto out;
        }
        /* the state being replaced first, so the rewind can be undone */
        if (running) {
                char label[LABEL_MAX + 1];
                snprintf(label, sizeof(label), "before rewind to %s", snap.id);
                if ((r = capture_locked(d, &row, label, NULL, 0, 1, &undo, err)) < 0) {
                        cove_err_wrap(err, "rewind of sandbox %s: no undo point, nothing changed",
                                      id);
                        goto out;
                }
        } else {
                snprintf(undo.id, sizeof(undo.id), "%s", row.last_snapshot_id);
        }
        char img[PATH_MAX], mem[PATH_MAX] = "";
        int full_fd = -1;
        struct cove_layer_handle *lh = NULL;
        byok_upgrade(&row, byok);
        if (is_vm_full(d, &snap))
                r = restore_full(d, row.tenant, snap.id, row.storage_encrypted, &full_fd, err);
        else
                r = restore_image(d, &snap, &row, img, sizeof(img), &lh, mem, sizeof(mem), err);
        if (r < 0) {
                if (running)
                        unhold(d, id);
                cove_err_wrap(err, "rewind of sandbox %s: the sandbox was left as it was", id);
                goto out;
        }
        struct cove_err e2;
        cove_node_stop(d->node, id, 1, &e2); /* switch only now that the new layer is complete */
        if ((r = reload(d, id, &row, err)) < 0) {
                if (full_fd >= 0)
                        close(full_fd);
                else
                        drop_image(d, img, lh);
                if (mem[0])
                        cove_rm_rf(mem, &e2);
                goto out;
        }
        byok_upgrade(&row, byok); /* the image restored above is keyed so */
        if ((r = start_from_image(d, &row, full_fd >= 0 ? NULL : img, lh, mem, full_fd, err)) < 0) {
                cove_err_wrap(err, "rewind of sandbox %s: start from snapshot %s (undo with %s)",
                              id, snap.id, undo.id[0] ? undo.id : "-");
                snprintf(row.state, sizeof(row.state), "error");
                row.uid_base = 0;
                row_set_error(&row, err->msg);
                if (undo.id[0])
                        snprintf(row.last_snapshot_id, sizeof(row.last_snapshot_id), "%s", undo.id);
                row_write(d, &row, &e2);
                goto out;
        }
        set_running(d, &row, snap.id);
        if ((r = row_write(d, &row, err)) < 0)
                goto out;
        wake_timer(d);
        cove_tm_kick(d);
        coved_egress_refresh(d, row.tenant, id);
        coved_audit_control(d, row.tenant, id, "rewind",
                            json_pack("{s:s, s:o}", "snapshot", snap.id, "undo_snapshot",
                                      undo.id[0] ? json_string(undo.id) : json_null()));
        cove_info(&d->log, "sandbox.rewind", "sandbox %s rewound to %s (undo: %s)", id, snap.id,
                  undo.id[0] ? undo.id : "none");
        *out = json_pack("{s:o, s:o}", "sandbox", cove_sandbox_json(&row), "undo_snapshot_id",
                         undo.id[0] ? json_string(undo.id) : json_null());
out:
        sbx_unlock(d->tm, id);
        cove_sandbox_row_clear(&row);
        return r;
}

int cove_sandbox_fork(struct coved *d, const char *tenant, const char *id, json_t *body,
                      json_t **out, struct cove_err *err)
{
        char what[128];
        snprintf(what, sizeof(what), "fork of sandbox %s", id);
        if (coved_space_check(d, what, err) < 0)
                return -1;
        int count = 1;
        json_t *cv = json_object_get(body, "count");
        if (cv && !json_is_null(cv)) {
                if (!json_is_integer(cv) || json_integer_value(cv) < 1 ||
                    json_integer_value(cv) > FORK_MAX)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "count must be an integer from 1 to %d", FORK_MAX);
                count = (int)json_integer_value(cv);
        }
        struct cove_sandbox_row src;
        if (cove_sandbox_load(d, tenant, id, &src, err) < 0)
                return -1;
        int byok = -1;
        if (need_store(d, err) < 0 || coved_key_gate(d, src.tenant, err) < 0 ||
            (byok = coved_tenant_byok(d, src.tenant, err)) < 0) {
                cove_sandbox_row_clear(&src);
                return -1;
        }
        /* admission for all forks at once (they start one by one below) */
        coved_quota_lock(d);
        int q = coved_quota_admit(d, src.tenant, count, count * src.cpus, count * src.memory_mb,
                                  count * src.disk_mb, err);
        coved_quota_unlock(d);
        if (q < 0) {
                cove_sandbox_row_clear(&src);
                return -1;
        }
        struct cove_snapshot_row snap;
        json_t *sv = json_object_get(body, "snapshot_id");
        int r;
        if ((!sv || json_is_null(sv)) && !strcmp(src.state, "running")) {
                /* fork "now": a snapshot of the current state */
                sbx_lock(d->tm, id, 1);
                r = reload(d, id, &src, err);
                if (r == 0)
                        r = capture_locked(d, &src, "fork", NULL, 0, 0, &snap, err);
                sbx_unlock(d->tm, id);
        } else {
                r = pick_snapshot(d, src.tenant, body, src.last_snapshot_id, 0, &snap, err);
        }
        if (r < 0) {
                cove_sandbox_row_clear(&src);
                return -1;
        }
        int64_t t0 = cove_mono_ns();
        json_t *list = json_array();
        char(*made)[64] = calloc((size_t)count, 64);
        int nmade = 0;
        for (int i = 0; made && i < count; i++) {
                struct cove_sandbox_row s;
                memset(&s, 0, sizeof(s));
                snprintf(s.tenant, sizeof(s.tenant), "%s", src.tenant);
                snprintf(s.template_name, sizeof(s.template_name), "%s", src.template_name);
                snprintf(s.runtime, sizeof(s.runtime), "%s", src.runtime);
                snprintf(s.on_timeout, sizeof(s.on_timeout), "%s", src.on_timeout);
                snprintf(s.node, sizeof(s.node), "%s", src.node);
                s.cpus = src.cpus;
                s.memory_mb = src.memory_mb;
                s.disk_mb = src.disk_mb;
                s.timeout_s = src.timeout_s;
                s.snapshot_interval_s = src.snapshot_interval_s;
                s.storage_encrypted = src.storage_encrypted;
                byok_upgrade(&s, byok);
                s.metadata_json = strdup(src.metadata_json ? src.metadata_json : "{}");
                s.env_json = strdup(src.env_json ? src.env_json : "{}");
                s.retention_json = src.retention_json ? strdup(src.retention_json) : NULL;
                /* a fork's first snapshot has the forked snapshot as parent */
                snprintf(s.last_snapshot_id, sizeof(s.last_snapshot_id), "%s", snap.id);
                s.created_at = tm_now();
                snprintf(s.state, sizeof(s.state), "starting");
                char img[PATH_MAX], mem[PATH_MAX] = "";
                int full_fd = -1;
                struct cove_layer_handle *lh = NULL;
                r = cove_id_new("sbx_", s.id, sizeof(s.id), err);
                if (r == 0)
                        r = d->cat_ops->sandbox_insert(d->cat, &s, err);
                if (r == 0) {
                        snprintf(made[nmade++], 64, "%s", s.id);
                        if (is_vm_full(d, &snap))
                                r = restore_full(d, snap.tenant, snap.id, s.storage_encrypted,
                                                 &full_fd, err);
                        else
                                r = restore_image(d, &snap, &s, img, sizeof(img), &lh, mem,
                                                  sizeof(mem), err);
                }
                if (r == 0)
                        r = start_from_image(d, &s, full_fd >= 0 ? NULL : img, lh, mem, full_fd,
                                             err);
                if (r == 0) {
                        set_running(d, &s, snap.id);
                        r = row_write(d, &s, err);
                }
                if (r == 0) {
                        coved_egress_copy(d, s.tenant, id, s.id);
                        coved_audit_control(
                            d, s.tenant, s.id, "fork",
                            json_pack("{s:s, s:s}", "from", id, "snapshot", snap.id));
                        json_array_append_new(list, cove_sandbox_json(&s));
                }
                cove_sandbox_row_clear(&s);
                if (r < 0)
                        break;
        }
        if (!made)
                r = cove_err_set(err, ENOMEM, "fork");
        if (r < 0) {
                /* all or nothing */
                cove_err_wrap(err, "fork of sandbox %s from snapshot %s", id, snap.id);
                for (int i = 0; i < nmade; i++) {
                        struct cove_err e2;
                        cove_node_stop(d->node, made[i], 1, &e2);
                        d->cat_ops->sandbox_delete(d->cat, made[i], &e2);
                }
                json_decref(list);
        } else {
                wake_timer(d);
                cove_tm_kick(d);
                cove_info(&d->log, "sandbox.fork", "sandbox %s forked %d times from %s in %.1f ms",
                          id, count, snap.id, (double)(cove_mono_ns() - t0) / 1e6);
                *out = json_pack("{s:o}", "sandboxes", list);
        }
        free(made);
        cove_sandbox_row_clear(&src);
        return r;
}

/* ---- listing and deleting ---- */

int cove_snapshot_load(struct coved *d, const char *tenant, const char *snap_id,
                       struct cove_snapshot_row *out, struct cove_err *err)
{
        int r = d->cat_ops->snapshot_get(d->cat, tenant, snap_id, out, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "snapshot %.64s not found", snap_id);
        return r;
}

static int add_json(const struct cove_snapshot_row *s, void *arg)
{
        json_array_append_new(arg, cove_snapshot_json(s));
        return 0;
}

int cove_snapshot_list_json(struct coved *d, const char *tenant, const char *sandbox_id,
                            json_t **out, struct cove_err *err)
{
        json_t *arr = json_array();
        if (d->cat_ops->snapshot_list(d->cat, tenant, sandbox_id, add_json, arr, err) < 0) {
                json_decref(arr);
                return -1;
        }
        if (json_array_size(arr) == 0) {
                struct cove_sandbox_row row;
                if (cove_sandbox_load(d, tenant, sandbox_id, &row, err) < 0) {
                        json_decref(arr);
                        return -1;
                }
                cove_sandbox_row_clear(&row);
        }
        *out = json_pack("{s:o}", "snapshots", arr);
        return 0;
}

int cove_snapshot_remove(struct coved *d, const char *tenant, const char *snap_id,
                         struct cove_err *err)
{
        struct cove_snapshot_row s;
        if (cove_snapshot_load(d, tenant, snap_id, &s, err) < 0)
                return -1;
        struct cove_sandbox_row row;
        struct cove_err e2;
        if (cove_sandbox_load(d, s.tenant, s.sandbox_id, &row, &e2) == 0) {
                int needed = !strcmp(row.state, "paused") && !strcmp(row.last_snapshot_id, s.id);
                cove_sandbox_row_clear(&row);
                if (needed)
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "snapshot %s is what paused sandbox %s resumes "
                                             "from: resume or delete the sandbox first",
                                             s.id, s.sandbox_id);
        }
        int r = d->cat_ops->snapshot_delete(d->cat, s.id, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "snapshot %.64s not found", snap_id);
        if (r < 0)
                return -1;
        /* the row is gone, so it is no longer listed; a manifest left by a failure here is
         * an orphan that the next start removes */
        if (d->tm && d->tm->store && cove_snapshot_delete(d->tm->store, s.tenant, s.id, &e2) < 0 &&
            e2.kind != COVE_E_NOT_FOUND)
                cove_warn(&d->log, "snapshot.delete", "%s", e2.msg);
        char mid[80];
        mem_id(s.id, mid, sizeof(mid));
        if (!strcmp(s.kind, "full") && d->tm && d->tm->store &&
            cove_snapshot_delete(d->tm->store, s.tenant, mid, &e2) < 0 &&
            e2.kind != COVE_E_NOT_FOUND)
                cove_warn(&d->log, "snapshot.delete", "%s", e2.msg);
        if (d->tm) {
                pthread_mutex_lock(&d->tm->mu);
                d->tm->gc_wanted = 1;
                pthread_mutex_unlock(&d->tm->mu);
        }
        cove_info(&d->log, "snapshot.delete", "snapshot %s of sandbox %s deleted", s.id,
                  s.sandbox_id);
        return 0;
}

struct idlist {
        char (*ids)[64];
        size_t n, cap;
};

static int idlist_add(struct idlist *l, const char *id)
{
        if (l->n == l->cap) {
                size_t nc = l->cap ? l->cap * 2 : 16;
                void *nb = realloc(l->ids, nc * sizeof(*l->ids));
                if (!nb)
                        return -1;
                l->ids = nb;
                l->cap = nc;
        }
        snprintf(l->ids[l->n++], 64, "%s", id);
        return 0;
}

static int collect_snap_id(const struct cove_snapshot_row *s, void *arg)
{
        return idlist_add(arg, s->id);
}

int cove_snapshot_purge_sandbox(struct coved *d, const char *tenant, const char *sandbox_id,
                                struct cove_err *err)
{
        if (d->tm)
                sbx_lock(d->tm, sandbox_id, 1); /* a capture in flight finishes first */
        struct idlist l = {0};
        int r = d->cat_ops->snapshot_list(d->cat, tenant, sandbox_id, collect_snap_id, &l, err);
        for (size_t i = 0; r == 0 && i < l.n; i++) {
                struct cove_err e2;
                if (cove_snapshot_remove(d, tenant, l.ids[i], &e2) < 0 &&
                    e2.kind != COVE_E_NOT_FOUND) {
                        *err = e2;
                        r = -1;
                }
        }
        free(l.ids);
        if (d->tm)
                sbx_unlock(d->tm, sandbox_id);
        return r;
}

/* ---- background: rolling snapshots, retention, GC ---- */

struct due {
        char id[64];
        char tenant[64];
        int interval_s;
        int64_t since; /* created_at of the sandbox */
};

struct due_list {
        struct due *v;
        size_t n, cap;
};

static int collect_rolling(const struct cove_sandbox_row *row, void *arg)
{
        struct due_list *l = arg;
        if (row->snapshot_interval_s <= 0)
                return 0;
        if (l->n == l->cap) {
                size_t nc = l->cap ? l->cap * 2 : 16;
                void *nb = realloc(l->v, nc * sizeof(*l->v));
                if (!nb)
                        return -1;
                l->v = nb;
                l->cap = nc;
        }
        struct due *x = &l->v[l->n++];
        snprintf(x->id, sizeof(x->id), "%s", row->id);
        snprintf(x->tenant, sizeof(x->tenant), "%s", row->tenant);
        x->interval_s = row->snapshot_interval_s;
        x->since = row->created_at;
        return 0;
}

static int newest_cb(const struct cove_snapshot_row *s, void *arg)
{
        *(int64_t *)arg = s->created_at;
        return -1; /* newest first: one is enough */
}

/* Take the rolling snapshots that are due; returns ms until the next one is. */
static int64_t roll(struct coved *d)
{
        struct cove_tm *tm = d->tm;
        struct due_list l = {0};
        struct cove_err err;
        int64_t next = 5000;
        if (d->cat_ops->sandbox_list(d->cat, NULL, "running", collect_rolling, &l, &err) < 0)
                cove_warn(&d->log, "snapshot.rolling", "%s", err.msg);
        for (size_t i = 0; i < l.n; i++) {
                pthread_mutex_lock(&tm->mu);
                int quit = tm->quit || tm->rolling_off;
                pthread_mutex_unlock(&tm->mu);
                if (quit)
                        break;
                int64_t last = l.v[i].since;
                d->cat_ops->snapshot_list(d->cat, l.v[i].tenant, l.v[i].id, newest_cb, &last, &err);
                int64_t wait = last + (int64_t)l.v[i].interval_s * 1000 - tm_now();
                if (wait <= 0) {
                        if (sbx_lock(tm, l.v[i].id, 0) != 0) {
                                next = next > 200 ? 200 : next; /* busy: try again soon */
                                continue;
                        }
                        struct cove_sandbox_row row;
                        memset(&row, 0, sizeof(row));
                        int r = reload(d, l.v[i].id, &row, &err);
                        if (r == 0 && !strcmp(row.state, "running"))
                                r = capture_locked(d, &row, NULL, NULL, 1, 0, NULL, &err);
                        sbx_unlock(tm, l.v[i].id);
                        cove_sandbox_row_clear(&row);
                        if (r < 0 && err.kind == COVE_E_UNAVAILABLE &&
                            strstr(err.msg, "cannot snapshot")) {
                                cove_warn(&d->log, "snapshot.rolling", "rolling snapshots off: %s",
                                          err.msg);
                                pthread_mutex_lock(&tm->mu);
                                tm->rolling_off = 1;
                                pthread_mutex_unlock(&tm->mu);
                        } else if (r < 0 && err.kind != COVE_E_CONFLICT &&
                                   err.kind != COVE_E_NOT_FOUND) {
                                cove_warn(&d->log, "snapshot.rolling", "%s", err.msg);
                        }
                        wait = (int64_t)l.v[i].interval_s * 1000;
                }
                if (wait < next)
                        next = wait;
        }
        free(l.v);
        return next;
}

struct snaps {
        struct cove_snapshot_row *v;
        size_t n, cap;
};

static int collect_snap(const struct cove_snapshot_row *s, void *arg)
{
        struct snaps *l = arg;
        if (l->n == l->cap) {
                size_t nc = l->cap ? l->cap * 2 : 64;
                void *nb = realloc(l->v, nc * sizeof(*l->v));
                if (!nb)
                        return -1;
                l->v = nb;
                l->cap = nc;
        }
        l->v[l->n++] = *s;
        return 0;
}

static int by_sandbox(const void *a, const void *b)
{
        const struct cove_snapshot_row *x = a, *y = b;
        int c = strcmp(x->sandbox_id, y->sandbox_id);
        return c ? c : (x->created_at > y->created_at) - (x->created_at < y->created_at);
}

/* Apply every sandbox's retention to its rolling snapshots (the one a sandbox would resume
 * from is always kept), then GC each tenant whose snapshots changed. */
/* Tenants whose objects the snapshot store may hold: the catalog's tenants and, for the
 * local directory, every tenant directory in it (a deleted tenant's leftovers). An S3
 * store has no directory to read: there the catalog is the list. */
struct tenant_names {
        char (*v)[64];
        size_t n, cap;
};

static void tn_add(struct tenant_names *t, const char *name)
{
        if (!cove_tenant_name_valid(name) || strlen(name) >= sizeof(*t->v))
                return;
        for (size_t i = 0; i < t->n; i++)
                if (!strcmp(t->v[i], name))
                        return;
        if (t->n == t->cap) {
                size_t nc = t->cap ? 2 * t->cap : 16;
                char(*nv)[64] = realloc(t->v, nc * sizeof(*nv));
                if (!nv)
                        return;
                t->v = nv;
                t->cap = nc;
        }
        snprintf(t->v[t->n++], sizeof(*t->v), "%s", name);
}

struct tn_ctx {
        struct tenant_names *t;
        const char *keys_dir;
};

/* a tenant without a key record never stored an object (and GC must not create one) */
static int tn_cb(const struct cove_tenant_row *row, void *arg)
{
        struct tn_ctx *c = arg;
        struct cove_key_status ks;
        struct cove_err err;
        if (cove_key_status_get(c->keys_dir, row->id, &ks, &err) == 0 && ks.exists)
                tn_add(c->t, row->id);
        return 0;
}

static void store_tenants(struct coved *d, struct tenant_names *t)
{
        memset(t, 0, sizeof(*t));
        struct cove_err err;
        char keys[PATH_MAX];
        snprintf(keys, sizeof(keys), "%s/keys", d->data_dir);
        struct tn_ctx c = {t, keys};
        d->cat_ops->tenant_list(d->cat, tn_cb, &c, &err);
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/store", d->data_dir);
        cleanup_dir DIR *dh = opendir(dir);
        struct dirent *de;
        while (dh && (de = readdir(dh)))
                tn_add(t, de->d_name);
}

static void thin(struct coved *d, int64_t now)
{
        struct cove_tm *tm = d->tm;
        struct snaps l = {0};
        struct cove_err err;
        if (d->cat_ops->snapshot_list(d->cat, NULL, NULL, collect_snap, &l, &err) < 0) {
                cove_warn(&d->log, "snapshot.retention", "%s", err.msg);
                free(l.v);
                return;
        }
        if (l.n)
                qsort(l.v, l.n, sizeof(*l.v), by_sandbox);
        int64_t *times = calloc(l.n ? l.n : 1, sizeof(*times));
        int *keep = calloc(l.n ? l.n : 1, sizeof(*keep));
        size_t *idx = calloc(l.n ? l.n : 1, sizeof(*idx));
        size_t deleted = 0;
        for (size_t i = 0; times && keep && idx && i < l.n;) {
                size_t j = i;
                while (j < l.n && !strcmp(l.v[j].sandbox_id, l.v[i].sandbox_id))
                        j++;
                struct cove_sandbox_row row;
                struct cove_retention pol;
                cove_retention_default(&pol);
                char last[64] = "";
                if (cove_sandbox_load(d, NULL, l.v[i].sandbox_id, &row, &err) == 0) {
                        if (cove_retention_parse(row.retention_json, &pol, &err) < 0)
                                cove_retention_default(&pol);
                        snprintf(last, sizeof(last), "%s", row.last_snapshot_id);
                        cove_sandbox_row_clear(&row);
                }
                size_t m = 0;
                for (size_t k = i; k < j; k++)
                        if (l.v[k].rolling && strcmp(l.v[k].id, last)) {
                                idx[m] = k;
                                times[m++] = l.v[k].created_at;
                        }
                cove_retention_thin(&pol, now, times, m, keep);
                for (size_t k = 0; k < m; k++) {
                        if (keep[k])
                                continue;
                        const struct cove_snapshot_row *s = &l.v[idx[k]];
                        if (cove_snapshot_remove(d, s->tenant, s->id, &err) < 0)
                                cove_warn(&d->log, "snapshot.retention", "%s", err.msg);
                        else
                                deleted++;
                }
                i = j;
        }
        free(times);
        free(keep);
        free(idx);
        free(l.v);
        if (deleted)
                cove_info(&d->log, "snapshot.retention", "%zu rolling snapshots thinned", deleted);

        pthread_mutex_lock(&tm->mu);
        int gc = tm->gc_wanted;
        tm->gc_wanted = 0;
        pthread_mutex_unlock(&tm->mu);
        if (!gc)
                return;
        /* GC per tenant from the snapshots the catalog keeps; captures wait (io_mu), and the
         * store's grace period protects chunks of a capture whose row is not written yet */
        struct snaps all = {0};
        if (d->cat_ops->snapshot_list(d->cat, NULL, NULL, collect_snap, &all, &err) < 0) {
                free(all.v);
                return;
        }
        struct tenant_names tns;
        store_tenants(d, &tns);
        for (size_t ti = 0; ti < tns.n; ti++) {
                const char *tname = tns.v[ti];
                const char **keep_ids = calloc(all.n ? 2 * all.n : 1, sizeof(*keep_ids));
                char(*mids)[80] = calloc(all.n ? all.n : 1, sizeof(*mids));
                size_t n = 0;
                for (size_t i = 0; keep_ids && mids && i < all.n; i++)
                        if (!strcmp(all.v[i].tenant, tname)) {
                                keep_ids[n++] = all.v[i].id;
                                struct cove_snapshot_info mi;
                                struct cove_err e2;
                                /* an ns full snapshot's checkpoint (a vm one has none) */
                                if (!strcmp(all.v[i].kind, "full")) {
                                        mem_id(all.v[i].id, mids[i], sizeof(mids[i]));
                                        if (cove_snapshot_info(tm->store, tname, mids[i], &mi,
                                                               &e2) == 0)
                                                keep_ids[n++] = mids[i];
                                }
                        }
                if (!mids) {
                        free(keep_ids);
                        keep_ids = NULL;
                }
                struct cove_gc_stats gs;
                memset(&gs, 0, sizeof(gs));
                pthread_mutex_lock(&tm->io_mu);
                int r = keep_ids ? cove_store_gc(tm->store, tname, keep_ids, n, &gs, &err) : -1;
                pthread_mutex_unlock(&tm->io_mu);
                free(keep_ids);
                free(mids);
                if (r < 0)
                        cove_warn(&d->log, "snapshot.gc", "tenant %s: %s", tname, err.msg);
                else if (gs.swept)
                        cove_info(&d->log, "snapshot.gc",
                                  "tenant %s: %llu chunks (%llu bytes) swept, %llu kept", tname,
                                  (unsigned long long)gs.swept, (unsigned long long)gs.swept_bytes,
                                  (unsigned long long)gs.marked);
        }
        free(tns.v);
        free(all.v);
}

static void *tm_main(void *arg)
{
        struct coved *d = arg;
        struct cove_tm *tm = d->tm;
        pthread_mutex_lock(&tm->mu);
        while (!tm->quit) {
                int off = tm->rolling_off;
                pthread_mutex_unlock(&tm->mu);
                int64_t wait = off ? 5000 : roll(d);
                int64_t now = tm_now();
                pthread_mutex_lock(&tm->mu);
                int gc = tm->gc_wanted;
                pthread_mutex_unlock(&tm->mu);
                if (now - tm->last_thin_ms >= THIN_EVERY_MS || gc) {
                        tm->last_thin_ms = now;
                        thin(d, now);
                }
                if (wait > 5000)
                        wait = 5000;
                if (wait < 50)
                        wait = 50;
                pthread_mutex_lock(&tm->mu);
                if (tm->quit)
                        break;
                if (!tm->kicked) {
                        struct timespec ts;
                        clock_gettime(CLOCK_REALTIME, &ts);
                        ts.tv_sec += wait / 1000;
                        ts.tv_nsec += (wait % 1000) * 1000000L;
                        if (ts.tv_nsec >= 1000000000L) {
                                ts.tv_sec++;
                                ts.tv_nsec -= 1000000000L;
                        }
                        pthread_cond_timedwait(&tm->cv, &tm->mu, &ts);
                }
                tm->kicked = 0;
        }
        pthread_mutex_unlock(&tm->mu);
        return NULL;
}

void cove_tm_kick(struct coved *d)
{
        if (!d->tm)
                return;
        pthread_mutex_lock(&d->tm->mu);
        d->tm->kicked = 1;
        pthread_cond_broadcast(&d->tm->cv);
        pthread_mutex_unlock(&d->tm->mu);
}

/* ---- start-up and shutdown ---- */

/* What a crash may have left: temporary layer images (captures and restores in flight), and
 * manifests whose catalog row was never written (the snapshot was never reported). */
static void cleanup_crash(struct coved *d)
{
        struct cove_tm *tm = d->tm;
        const char *tmp_dirs[] = {tm->layer_dir, tm->mem_dir};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(tmp_dirs); i++) {
                if (!tmp_dirs[i][0])
                        continue;
                cleanup_dir DIR *dh = opendir(tmp_dirs[i]);
                struct dirent *de;
                while (dh && (de = readdir(dh))) {
                        if (strncmp(de->d_name, IMG_SNAP, strlen(IMG_SNAP)) &&
                            strncmp(de->d_name, IMG_RESTORE, strlen(IMG_RESTORE)))
                                continue;
                        char p[PATH_MAX + 256];
                        struct cove_err e2;
                        snprintf(p, sizeof(p), "%s/%s", tmp_dirs[i], de->d_name);
                        if (cove_rm_rf(p, &e2) == 0) /* a checkpoint's work dir too */
                                cove_info(&d->log, "snapshot.recover", "removed temporary image %s",
                                          de->d_name);
                }
        }
        struct tenant_names tns;
        store_tenants(d, &tns);
        for (size_t ti = 0; ti < tns.n; ti++) {
                const char *tname = tns.v[ti];
                char **ids = NULL;
                size_t n = 0;
                struct cove_err err;
                if (cove_snapshot_list(tm->store, tname, &ids, &n, &err) < 0) {
                        cove_warn(&d->log, "snapshot.recover", "tenant %s: %s", tname, err.msg);
                        continue;
                }
                for (size_t i = 0; i < n; i++) {
                        struct cove_snapshot_row s;
                        /* a checkpoint (<id>-mem) lives as long as its snapshot's row */
                        char base[80];
                        snprintf(base, sizeof(base), "%s", ids[i]);
                        size_t bl = strlen(base), sl = strlen(MEM_SUFFIX);
                        if (bl > sl && !strcmp(base + bl - sl, MEM_SUFFIX))
                                base[bl - sl] = 0;
                        if (d->cat_ops->snapshot_get(d->cat, NULL, base, &s, &err) != 1)
                                continue;
                        if (cove_snapshot_delete(tm->store, tname, ids[i], &err) == 0)
                                cove_info(&d->log, "snapshot.recover",
                                          "removed incomplete snapshot %s (never reported)",
                                          ids[i]);
                        tm->gc_wanted = 1;
                }
                cove_snapshot_list_free(ids, n);
        }
        free(tns.v);
}

int cove_tm_open(struct coved *d, struct cove_err *err)
{
        struct cove_tm *tm = calloc(1, sizeof(*tm));
        if (!tm)
                return cove_err_set(err, ENOMEM, "time machine");
        pthread_mutex_init(&tm->mu, NULL);
        pthread_cond_init(&tm->cv, NULL);
        pthread_mutex_init(&tm->io_mu, NULL);
        d->tm = tm;
        const char *ld = cove_node_layer_dir(d->node);
        snprintf(tm->layer_dir, sizeof(tm->layer_dir), "%s", ld ? ld : "");
        { /* one tmpfs directory per data dir, root only */
                unsigned char md[32];
                unsigned mdl;
                char hex[65];
                EVP_Digest(d->data_dir, strlen(d->data_dir), md, &mdl, EVP_sha256(), NULL);
                cove_hex(md, 32, hex);
                snprintf(tm->mem_dir, sizeof(tm->mem_dir), "/dev/shm/cove-tm-%.16s", hex);
                if (cove_mkdir_p(tm->mem_dir, 0700, err) < 0)
                        return cove_err_wrap(err, "checkpoint dir %s", tm->mem_dir);
        }
        char root[PATH_MAX], keys[PATH_MAX];
        snprintf(root, sizeof(root), "%s/store", d->data_dir);
        snprintf(keys, sizeof(keys), "%s/keys", d->data_dir);
        if (cove_mkdir_p(keys, 0700, err) < 0)
                return cove_err_wrap(err, "snapshot keys %s", keys);
        char cache[PATH_MAX];
        snprintf(cache, sizeof(cache), "%s/chunk-cache", d->data_dir);
        struct cove_chunkstore_cfg backend = {
            .url = d->store.url,
            .s3_endpoint = d->store.s3_endpoint,
            .s3_timeout_ms = d->store.s3_timeout_s * 1000,
            .cache_dir = cache,
            .cache_bytes = (uint64_t)(d->store.cache_mb > 0 ? d->store.cache_mb : 1024) << 20};
        struct cove_store_opts so = {.root = root,
                                     .keys_dir = keys,
                                     .io = cove_testhooks_io(),
                                     .gc_grace_ms = cove_testhooks_gc_grace_ms(),
                                     .backend = &backend};
        if (cove_store_open(&so, &tm->store, err) < 0)
                return cove_err_wrap(err, "snapshot store %s", d->store.url ? d->store.url : root);
        cleanup_crash(d);
        tm->last_thin_ms = 0;
        tm->rolling_off = !tm->layer_dir[0];
        int e = pthread_create(&tm->thr, NULL, tm_main, d);
        if (e)
                return cove_err_set(err, e, "snapshot thread");
        tm->thr_started = 1;
        if (!tm->layer_dir[0])
                cove_info(&d->log, "snapshot.start",
                          "runtime %s has no layer images: snapshots unavailable",
                          cove_node_runtime_name(d->node));
        return 0;
}

void cove_tm_close(struct coved *d)
{
        struct cove_tm *tm = d->tm;
        if (!tm)
                return;
        if (tm->thr_started) {
                pthread_mutex_lock(&tm->mu);
                tm->quit = 1;
                pthread_cond_broadcast(&tm->cv);
                pthread_mutex_unlock(&tm->mu);
                pthread_join(tm->thr, NULL);
        }
        cove_store_close(tm->store);
        if (tm->mem_dir[0])
                rmdir(tm->mem_dir); /* empty unless an operation is still in flight */
        free(tm->busy);
        pthread_mutex_destroy(&tm->io_mu);
        pthread_cond_destroy(&tm->cv);
        pthread_mutex_destroy(&tm->mu);
        free(tm);
        d->tm = NULL;
}

int coved_sandbox_files(struct coved *d, const char *tenant, const char *sandbox, const char *snap,
                        char template_out[64], coved_tree_fn fn, void *arg, struct cove_err *err)
{
        struct cove_sandbox_row row;
        struct cove_snapshot_row srow;
        if (need_store(d, err) < 0)
                return -1;
        if (snap) {
                int r = d->cat_ops->snapshot_get(d->cat, tenant, snap, &srow, err);
                if (r != 0)
                        return r < 0 ? -1
                                     : cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                                     "snapshot %.64s not found", snap);
                sandbox = srow.sandbox_id;
        }
        if (cove_sandbox_load(d, tenant, sandbox, &row, err) < 0)
                return cove_err_wrap(err, "the sandbox %s of the files", sandbox);
        snprintf(template_out, 64, "%s", row.template_name);
        int rc = -1;
        if (strcmp(row.runtime, "ns")) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "sandbox %s runs on the %s runtime: templates are made from the "
                              "files of ns sandboxes",
                              row.id, row.runtime);
                goto out;
        }
        if (!snap && strcmp(row.state, "running")) {
                cove_err_setk(err, COVE_E_CONFLICT, 0,
                              "sandbox %s is %s: save a running sandbox, or one of its "
                              "snapshots",
                              row.id, row.state);
                goto out;
        }
        struct cove_tm *tm = d->tm;
        char rnd[32], img[PATH_MAX];
        if (cove_id_new("", rnd, sizeof(rnd), err) < 0)
                goto out;
        /* IMG_RESTORE: swept at start if coved dies meanwhile */
        snprintf(img, sizeof(img), "%s/" IMG_RESTORE "tpl-%s.img", tm->layer_dir, rnd);
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        int enc = !snap && row.storage_encrypted;
        int tree_fd = -1;
        struct cove_layer_handle *h = NULL;
        uint64_t pause_ns = 0;
        pthread_mutex_lock(&tm->io_mu);
        int r = 0;
        if (snap) {
                r = cove_node_layer_open(d->node, img, 1, (unsigned)row.disk_mb, NULL, &tree_fd, &h,
                                         err);
                if (r == 0) {
                        struct cove_snapshot_stats st;
                        r = cove_snapshot_restore_tree(tm->store, tenant, snap, tree_fd, &st, err);
                        if (r < 0)
                                store_err(err);
                }
        } else {
                r = cove_node_layer_snapshot(d->node, row.id, img, &pause_ns, err);
                if (r == 0 && enc)
                        r = coved_layer_key(d, row.tenant, row.id, key, err);
                if (r == 0)
                        r = cove_node_layer_open(d->node, img, 0, 0, enc ? key : NULL, &tree_fd, &h,
                                                 err);
                OPENSSL_cleanse(key, sizeof(key));
        }
        if (r == 0)
                r = fn(arg, tree_fd, err);
        if (tree_fd >= 0)
                close(tree_fd);
        if (h)
                cove_node_layer_close(d->node, h);
        pthread_mutex_unlock(&tm->io_mu);
        unlink(img);
        rc = r;
out:
        cove_sandbox_row_clear(&row);
        return rc;
}
