/* The node's side of the time machine (node/tm.h): captures of this node's instances into
 * the chunk store through the runtime's layer images, full dumps and vm images, and the
 * restores and starts from them. */
#include "node/tm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/fs.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "crypto/keys.h"
#include "store/snapshot.h"
#include "util/cleanup.h"
#include "util/testhooks.h"
#include "util/util.h"

#define IMG_SNAP "tm-snap-"
#define IMG_RESTORE "tm-restore-"
#define MEM_SUFFIX "-mem" /* store id of a full snapshot's checkpoint: <snapshot id>-mem */
/* kept layer images: tm-snap-keep-<sandbox>-<snapshot>-<p|e>.img (p plain, e encrypted);
 * a tm-snap- name, so the start-up sweep removes them like any temporary image */
#define IMG_KEEP IMG_SNAP "keep-"
#define KEEP_MAX 32        /* kept images per node (the oldest go first) */
#define KEEP_PER_SANDBOX 2 /* its newest: e.g. a rolling one and its pause's */

struct cove_node_tm {
        struct cove_node *node;
        struct cove_node_tm_config cfg;
        const struct cove_log *log;
        char data_dir[PATH_MAX];
        struct cove_store *store;
        char layer_dir[PATH_MAX]; /* "" when the runtime has no layer images */
        /* CRIU checkpoints in flight (plaintext memory): on tmpfs, never on a disk where the
         * blocks would outlive the delete (encrypted layers, revocation) */
        char mem_dir[PATH_MAX];
        pthread_mutex_t io_mu;   /* one capture (or GC) at a time: bounded background I/O */
        int reflink;             /* layer_dir clones files (FICLONE): kept images are cheap */
        pthread_mutex_t keep_mu; /* kept images: names in layer_dir */
};

/* A store failure (full, I/O error, missing or tampered chunk) is not the request's fault
 * and not a missing API object: the snapshot named in the message cannot be used now. */
static int store_err(struct cove_err *err)
{
        if (err->kind != COVE_E_KEY_REVOKED)
                err->kind = COVE_E_UNAVAILABLE;
        return -1;
}

static int layer_key(struct cove_node_tm *tm, const char *tenant, const char *sandbox_id,
                     uint8_t *key, struct cove_err *err)
{
        if (!tm->cfg.layer_key)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "sandbox %s: no layer keys on this node", sandbox_id);
        return tm->cfg.layer_key(tm->cfg.arg, tenant, sandbox_id, key, err);
}

int cove_node_tm_ready(const struct cove_node_tm *tm)
{
        return tm && tm->store && tm->layer_dir[0];
}

int cove_node_tm_layers(const struct cove_node_tm *tm)
{
        return tm && tm->layer_dir[0];
}

/* ---- full snapshots (vm: live memory, devices and disk as one image) ----
 * The runtime writes the image into an unnamed temp file (O_TMPFILE: nothing to clean up
 * after a crash); the store keeps it as one stream (2 MiB fixed chunks, zero chunks free).
 * The image holds guest RAM in clear: for a sandbox with encrypted storage it goes to the
 * checkpoint tmpfs, like an ns checkpoint, so no plaintext of it touches the data dir's
 * disk (at the cost of RAM for the image, disk overlay included); for a plain one (whose
 * disk overlay is plaintext there anyway) into the data dir. */

static int tmpfile_fd(struct cove_node_tm *tm, int encrypted, struct cove_err *err)
{
        const char *dir = encrypted ? tm->mem_dir : tm->data_dir;
        int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        return fd < 0 ? cove_err_set(err, errno, "temp file in %s", dir) : fd;
}

static int capture_full(struct cove_node_tm *tm, const struct cove_node_tm_capture *c,
                        struct cove_node_tm_taken *s, struct cove_snapshot_stats *st,
                        struct cove_err *err)
{
        int fd = tmpfile_fd(tm, c->encrypted, err);
        if (fd < 0)
                return -1;
        uint64_t pause_ns = 0;
        int r = cove_node_full_snapshot(tm->node, c->sandbox_id, fd, &pause_ns, err);
        s->pause_us = (int64_t)(pause_ns / 1000);
        if (r == 0 && lseek(fd, 0, SEEK_SET) < 0)
                r = cove_err_set(err, errno, "full snapshot");
        if (r == 0) {
                pthread_mutex_lock(&tm->io_mu);
                r = cove_snapshot_capture_stream(tm->store, c->tenant, c->snap_id, c->parent_id, fd,
                                                 st, err);
                pthread_mutex_unlock(&tm->io_mu);
                if (r < 0)
                        store_err(err);
        }
        close(fd);
        return r;
}

/* The image of full snapshot snap in a temp file (*fd), verified chunk by chunk. */
static int restore_full(struct cove_node_tm *tm, const char *tenant, const char *snap,
                        int encrypted, int *fd, struct cove_err *err)
{
        *fd = tmpfile_fd(tm, encrypted, err);
        if (*fd < 0)
                return -1;
        struct cove_snapshot_stats st;
        if (cove_snapshot_restore_stream(tm->store, tenant, snap, *fd, &st, err) < 0) {
                close(*fd);
                *fd = -1;
                store_err(err);
                return cove_err_wrap(err, "restore of snapshot %s failed", snap);
        }
        return 0;
}

/* ---- kept layer images ----
 * A capture's layer clone, once it is in the store, is kept (renamed, nothing copied) as
 * one of the newest images of its sandbox on this node, so a resume or rewind of that
 * sandbox to that snapshot here (or a fork of a plain layer) clones it (FICLONE on the
 * reflink layer filesystem: no data copied) instead of rebuilding the layer from the
 * store's chunks. It is the very image the snapshot was captured from; the store stays
 * the truth (another node, an older snapshot, an encrypted fork, a restart: all restore
 * from the store). Not durable: a restart removes them (tm-snap-); at most KEEP_MAX per
 * node and KEEP_PER_SANDBOX per sandbox; deleting the snapshot removes its image. Only
 * where the layer filesystem has reflinks and cfg.keep_images is set. */

static void keep_path(struct cove_node_tm *tm, const char *sandbox_id, const char *snap_id,
                      int encrypted, char *out, size_t cap)
{
        snprintf(out, cap, "%s/" IMG_KEEP "%s-%s-%c.img", tm->layer_dir, sandbox_id, snap_id,
                 encrypted ? 'e' : 'p');
}

/* Remove the kept images whose name (after IMG_KEEP) has infix; then the oldest beyond
 * `max` of those whose name starts with prefix (all of them when prefix is NULL; max 0:
 * every one whose name starts with prefix). With keep_mu. */
static void keep_sweep(struct cove_node_tm *tm, const char *prefix, const char *infix, size_t max)
{
        cleanup_dir DIR *dh = opendir(tm->layer_dir);
        struct dirent *de;
        size_t pl = strlen(IMG_KEEP), n = 0;
        char oldest[NAME_MAX + 1] = "";
        struct timespec ot = {0};
        while (dh && (de = readdir(dh))) {
                if (strncmp(de->d_name, IMG_KEEP, pl))
                        continue;
                const char *rest = de->d_name + pl;
                char p[PATH_MAX + 256];
                snprintf(p, sizeof(p), "%s/%s", tm->layer_dir, de->d_name);
                if (infix && strstr(rest, infix)) {
                        unlink(p);
                        continue;
                }
                if (prefix && strncmp(rest, prefix, strlen(prefix)))
                        continue;
                if (max == 0) { /* every one of them */
                        unlink(p);
                        continue;
                }
                struct stat st;
                if (stat(p, &st) < 0)
                        continue;
                n++;
                if (!oldest[0] || st.st_mtim.tv_sec < ot.tv_sec ||
                    (st.st_mtim.tv_sec == ot.tv_sec && st.st_mtim.tv_nsec < ot.tv_nsec)) {
                        snprintf(oldest, sizeof(oldest), "%s", de->d_name);
                        ot = st.st_mtim;
                }
        }
        if (n > max && oldest[0]) { /* one capture adds one: one goes */
                char p[PATH_MAX + 256];
                snprintf(p, sizeof(p), "%s/%s", tm->layer_dir, oldest);
                unlink(p);
        }
}

void cove_node_tm_forget(struct cove_node_tm *tm, const char *sandbox_id)
{
        if (!tm || !tm->layer_dir[0])
                return;
        char prefix[96];
        snprintf(prefix, sizeof(prefix), "%s-", sandbox_id);
        pthread_mutex_lock(&tm->keep_mu);
        keep_sweep(tm, prefix, NULL, 0);
        pthread_mutex_unlock(&tm->keep_mu);
}

/* Keep img (a capture's clone of c's layer, in the store now) instead of removing it. */
static void keep_image(struct cove_node_tm *tm, const struct cove_node_tm_capture *c,
                       const char *img)
{
        if (!tm->reflink) {
                unlink(img);
                return;
        }
        char kp[PATH_MAX], prefix[96];
        keep_path(tm, c->sandbox_id, c->snap_id, c->encrypted, kp, sizeof(kp));
        snprintf(prefix, sizeof(prefix), "%s-", c->sandbox_id);
        pthread_mutex_lock(&tm->keep_mu);
        if (rename(img, kp) < 0)
                unlink(img);
        keep_sweep(tm, prefix, NULL, KEEP_PER_SANDBOX); /* the sandbox's oldest one */
        keep_sweep(tm, NULL, NULL, KEEP_MAX);
        pthread_mutex_unlock(&tm->keep_mu);
}

/* The kept image of q's snapshot that q's sandbox may start from, into kp: its own, or,
 * for a plain layer (no per-sandbox key), a plain one of another sandbox of the tenant (a
 * fork). With keep_mu. 0 found, -1 none. */
static int keep_find(struct cove_node_tm *tm, const struct cove_node_tm_restore *q, char *kp,
                     size_t cap)
{
        struct stat st;
        keep_path(tm, q->sandbox_id, q->snap_id, q->encrypted, kp, cap);
        if (stat(kp, &st) == 0 || q->encrypted)
                return stat(kp, &st) == 0 ? 0 : -1;
        char suffix[96];
        snprintf(suffix, sizeof(suffix), "-%s-p.img", q->snap_id);
        size_t sl = strlen(suffix), pl = strlen(IMG_KEEP);
        cleanup_dir DIR *dh = opendir(tm->layer_dir);
        struct dirent *de;
        while (dh && (de = readdir(dh))) {
                size_t nl = strlen(de->d_name);
                if (nl > pl + sl && !strncmp(de->d_name, IMG_KEEP, pl) &&
                    !strcmp(de->d_name + nl - sl, suffix)) {
                        snprintf(kp, cap, "%s/%s", tm->layer_dir, de->d_name);
                        return 0;
                }
        }
        return -1;
}

/* A clone of the kept image of q's snapshot for q's sandbox at img: 0, or -1 when there is
 * none (nothing left: the caller restores from the store). The caller checked that the
 * snapshot is of q's tenant. */
static int keep_clone(struct cove_node_tm *tm, const struct cove_node_tm_restore *q,
                      const char *img)
{
        char kp[PATH_MAX];
        pthread_mutex_lock(&tm->keep_mu);
        if (!tm->reflink || keep_find(tm, q, kp, sizeof(kp)) < 0) {
                pthread_mutex_unlock(&tm->keep_mu);
                return -1;
        }
        int in = tm->reflink ? open(kp, O_RDONLY | O_CLOEXEC) : -1;
        int out = in < 0 ? -1 : open(img, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        int r = out < 0 || ioctl(out, FICLONE, in) < 0 ? -1 : 0;
        pthread_mutex_unlock(&tm->keep_mu);
        if (in >= 0)
                close(in);
        if (out >= 0)
                close(out);
        if (r < 0 && out >= 0)
                unlink(img);
        return r;
}

/* 1 when files in dir can be cloned (FICLONE). */
static int reflink_works(const char *dir)
{
        char a[PATH_MAX], b[PATH_MAX];
        snprintf(a, sizeof(a), "%s/" IMG_SNAP "probe-a", dir);
        snprintf(b, sizeof(b), "%s/" IMG_SNAP "probe-b", dir);
        int fa = open(a, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        int fb = fa < 0 ? -1 : open(b, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        int ok = fb >= 0 && write(fa, "probe", 5) == 5 && ioctl(fb, FICLONE, fa) == 0;
        if (fa >= 0)
                close(fa);
        if (fb >= 0)
                close(fb);
        unlink(a);
        unlink(b);
        return ok;
}

/* ---- capture ---- */

void cove_node_tm_mem_id(const char *snap_id, char *out, size_t cap)
{
        snprintf(out, cap, "%s" MEM_SUFFIX, snap_id);
}

void cove_node_tm_base_id(const char *store_id, char *base, size_t cap)
{
        snprintf(base, cap, "%s", store_id);
        size_t bl = strlen(base), sl = strlen(MEM_SUFFIX);
        if (bl > sl && !strcmp(base + bl - sl, MEM_SUFFIX))
                base[bl - sl] = 0;
}

/* How long an operation waits for coved's start-up CRIU self-check (1-3 s) before it takes
 * a files snapshot, or refuses to restore a full one. */
#define FULL_WAIT_MS 60000

/* Whether snapshots of running sandboxes are full ones on this node (runtime + self-check);
 * why (may be NULL) says why not. */
static int full_ok(struct cove_node_tm *tm, char *why, size_t cap)
{
        char buf[320];
        return cove_node_full_wait(tm->node, FULL_WAIT_MS, why ? why : buf,
                                   why ? cap : sizeof(buf)) == 1;
}

static void unhold(struct cove_node_tm *tm, const char *id)
{
        struct cove_err e2;
        cove_node_freeze(tm->node, id, 0, &e2);
}

int cove_node_tm_capture(struct cove_node_tm *tm, const struct cove_node_tm_capture *c,
                         struct cove_node_tm_taken *s, struct cove_err *err)
{
        const char *kind = c->kind;
        int hold = c->hold;
        memset(s, 0, sizeof(*s));
        snprintf(s->kind, sizeof(s->kind), "files");
        char img[PATH_MAX], mem[PATH_MAX];
        snprintf(img, sizeof(img), "%s/" IMG_SNAP "%s.img", tm->layer_dir, c->snap_id);
        snprintf(mem, sizeof(mem), "%s/" IMG_SNAP "%s.criu", tm->mem_dir, c->snap_id);
        uint64_t pause_ns = 0;
        struct cove_snapshot_stats st, mst;
        memset(&st, 0, sizeof(st));
        memset(&mst, 0, sizeof(mst));
        char mid[80];
        cove_node_tm_mem_id(c->snap_id, mid, sizeof(mid));
        int full = 0;                                      /* an ns checkpoint (CRIU) was taken */
        if (cove_node_has_full(tm->node, c->sandbox_id)) { /* vm: live memory too */
                if (kind && !strcmp(kind, "files"))
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "sandbox %s: a vm sandbox's snapshots are full "
                                             "(memory and disk are one image); kind \"files\" "
                                             "is for ns sandboxes",
                                             c->sandbox_id);
                snprintf(s->kind, sizeof(s->kind), "full");
                if (capture_full(tm, c, s, &st, err) < 0)
                        return cove_err_wrap(err,
                                             "snapshot of sandbox %s (previous snapshots "
                                             "intact)",
                                             c->sandbox_id);
                goto captured;
        }
        /* ns: full (files + memory + processes) with CRIU when the node can; rolling snapshots
         * stay files: a checkpoint stops the sandbox for the whole dump (hundreds of ms for
         * 100 MB), too long to do every minute without the agent noticing */
        char why[320];
        if (kind && !strcmp(kind, "full") && !full_ok(tm, why, sizeof(why)))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "sandbox %s: this node cannot take full snapshots (%s); "
                                     "kind \"files\" takes its files",
                                     c->sandbox_id, why);
        full = kind ? !strcmp(kind, "full") : !c->rolling && full_ok(tm, NULL, 0);
        if (full) {
                struct cove_err fe;
                if (cove_node_full_dump(tm->node, c->sandbox_id, img, mem, hold, &pause_ns, &fe) <
                    0) {
                        unlink(img);
                        if (kind) /* asked for: no files snapshot instead */
                                return cove_err_setk(err, COVE_E_CONFLICT, fe.errnum,
                                                     "full snapshot of sandbox %s failed (no "
                                                     "snapshot taken; kind \"files\" takes its "
                                                     "files): %s",
                                                     c->sandbox_id, fe.msg);
                        /* e.g. a TCP connection or an egress link CRIU cannot take along:
                         * the files are still worth a snapshot (the caller logs why) */
                        snprintf(s->fallback, sizeof(s->fallback), "%s", fe.msg);
                        full = 0;
                } else {
                        snprintf(s->kind, sizeof(s->kind), "full");
                }
        }
        if (!full && cove_node_layer_snapshot(tm->node, c->sandbox_id, img, &pause_ns, err) < 0) {
                unlink(img);
                return cove_err_wrap(err, "snapshot of sandbox %s", c->sandbox_id);
        }
        s->pause_us = (int64_t)(pause_ns / 1000);

        /* the sandbox runs on; the rest is background work, one capture at a time */
        pthread_mutex_lock(&tm->io_mu);
        int tree_fd = -1;
        struct cove_layer_handle *h = NULL;
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        int r = c->encrypted ? layer_key(tm, c->tenant, c->sandbox_id, key, err) : 0;
        if (r == 0)
                r = cove_node_layer_open(tm->node, img, 0, 0, c->encrypted ? key : NULL, &tree_fd,
                                         &h, err);
        OPENSSL_cleanse(key, sizeof(key));
        if (r == 0) {
                r = cove_snapshot_capture_tree(tm->store, c->tenant, c->snap_id, c->parent_id,
                                               tree_fd, &st, err);
                if (tree_fd >= 0)
                        close(tree_fd);
                cove_node_layer_close(tm->node, h);
        }
        if (r == 0 && full) {
                /* the checkpoint directory, as a tree: content-defined chunks dedup memory
                 * pages far better than fixed 2 MiB ones (an idle sandbox's next checkpoint
                 * differs in a few pages); encrypted like everything else */
                int mfd = open(mem, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                r = mfd < 0 ? cove_err_set(err, errno, "open %s", mem)
                            : cove_snapshot_capture_tree(tm->store, c->tenant, mid, NULL, mfd, &mst,
                                                         err);
                if (mfd >= 0)
                        close(mfd);
                if (r < 0) {
                        struct cove_err e2;
                        cove_snapshot_delete(tm->store, c->tenant, c->snap_id, &e2);
                }
        }
        pthread_mutex_unlock(&tm->io_mu);
        if (r == 0)
                keep_image(tm, c, img);
        else
                unlink(img);
        if (full) {
                struct cove_err e2;
                cove_rm_rf(mem, &e2);
        }
        if (r < 0) {
                if (hold && full)
                        unhold(tm, c->sandbox_id);
                store_err(err);
                return cove_err_wrap(err, "snapshot of sandbox %s (previous snapshots intact)",
                                     c->sandbox_id);
        }
        s->checkpoint = full;
captured:
        s->size_bytes = st.size_bytes + mst.size_bytes;
        s->new_bytes = st.new_bytes + mst.new_bytes;
        return 0;
}

/* ---- restore ---- */

/* Fill a fresh layer image from snapshot snap (of tenant) into img, left mounted: *h is its
 * handle, for cove_node_tm_start() to run the sandbox on that mount, or to release with
 * cove_node_layer_close() before removing img. No sync: a crash before the catalog says
 * `running` discards the image (reconcile purges the layer), so nothing here must be
 * durable. On failure nothing is left; the error names the snapshot. */
static int restore_files(struct cove_node_tm *tm, const char *tenant, const char *snap,
                         const struct cove_node_tm_restore *target, char *img, size_t cap,
                         struct cove_layer_handle **h, struct cove_err *err)
{
        char rnd[32];
        if (cove_id_new("", rnd, sizeof(rnd), err) < 0)
                return -1;
        snprintf(img, cap, "%s/" IMG_RESTORE "%s-%s.img", tm->layer_dir, snap, rnd);
        int tree_fd = -1;
        *h = NULL;
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        int enc = target->encrypted;
        if (!strcmp(tenant, target->sandbox_tenant) && keep_clone(tm, target, img) == 0) {
                /* mounted here, as a store restore's layer is: the start runs on this mount
                 * (no second search for a loop device bound to the image, no wait for one to
                 * let go). Without the mount (no key now, a mount error) start() mounts the
                 * clone itself and reports why it cannot. */
                struct cove_err me;
                int kr =
                    enc ? layer_key(tm, target->sandbox_tenant, target->sandbox_id, key, &me) : 0;
                if (kr == 0 && cove_node_layer_open(tm->node, img, COVE_LAYER_OPEN_CLONE, 0,
                                                    enc ? key : NULL, &tree_fd, h, &me) == 0)
                        close(tree_fd);
                else
                        *h = NULL;
                OPENSSL_cleanse(key, sizeof(key));
                cove_info(tm->log, "snapshot.restore",
                          "sandbox %s: the layer of snapshot %s cloned from its kept image%s",
                          target->sandbox_id, snap, *h ? ", mounted" : "");
                return 0;
        }
        struct cove_snapshot_stats st;
        /* an encrypted target's layer is encrypted from the first byte restored */
        int r = enc ? layer_key(tm, target->sandbox_tenant, target->sandbox_id, key, err) : 0;
        if (r == 0)
                r = cove_node_layer_open(tm->node, img, 1, target->disk_mb, enc ? key : NULL,
                                         &tree_fd, h, err);
        OPENSSL_cleanse(key, sizeof(key));
        if (r == 0) {
                r = cove_snapshot_restore_tree(tm->store, tenant, snap, tree_fd, &st, err);
                if (tree_fd >= 0)
                        close(tree_fd);
                if (r < 0) {
                        cove_node_layer_close(tm->node, *h);
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
static int restore_mem(struct cove_node_tm *tm, const struct cove_node_tm_restore *snap, char *mem,
                       size_t cap, struct cove_err *err)
{
        mem[0] = 0;
        if (strcmp(snap->snap_kind, "full"))
                return 0;
        char rnd[32], mid[80];
        if (cove_id_new("", rnd, sizeof(rnd), err) < 0)
                return -1;
        char why[320];
        if (cove_node_full_wait(tm->node, FULL_WAIT_MS, why, sizeof(why)) != 1)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "snapshot %s is a full snapshot and this node cannot "
                                     "restore processes (%s)",
                                     snap->snap_id, why);
        snprintf(mem, cap, "%s/" IMG_RESTORE "%s-%s.criu", tm->mem_dir, snap->snap_id, rnd);
        cove_node_tm_mem_id(snap->snap_id, mid, sizeof(mid));
        int fd = mkdir(mem, 0700) < 0 ? -1 : open(mem, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct cove_snapshot_stats st;
        int r = fd < 0 ? cove_err_set(err, errno, "create %s", mem)
                       : cove_snapshot_restore_tree(tm->store, snap->tenant, mid, fd, &st, err);
        if (fd >= 0)
                close(fd);
        if (r < 0) {
                struct cove_err e2;
                cove_rm_rf(mem, &e2);
                mem[0] = 0;
                store_err(err);
                return cove_err_wrap(err, "restore of snapshot %s failed", snap->snap_id);
        }
        return 0;
}

/* Release what restore_files() left (the mount, then the file). */
static void drop_image(struct cove_node_tm *tm, const char *img, struct cove_layer_handle *h)
{
        cove_node_layer_close(tm->node, h);
        unlink(img);
}

/* Both parts of snapshot snap: the layer into img (mounted, *h), and for a full one the
 * checkpoint into mem (else ""). On failure nothing is left; the error names the snapshot. */
static int restore_image(struct cove_node_tm *tm, const struct cove_node_tm_restore *snap,
                         char *img, size_t cap, struct cove_layer_handle **h, char *mem,
                         size_t mcap, struct cove_err *err)
{
        if (restore_files(tm, snap->tenant, snap->snap_id, snap, img, cap, h, err) < 0)
                return -1;
        if (restore_mem(tm, snap, mem, mcap, err) < 0) {
                drop_image(tm, img, *h);
                *h = NULL;
                return -1;
        }
        return 0;
}

/* A vm full snapshot is one memory image (capture_full); an ns one is a files tree plus its
 * checkpoint (<id>-mem). */
static int is_vm_full(struct cove_node_tm *tm, const struct cove_node_tm_restore *snap)
{
        struct cove_snapshot_info info;
        struct cove_err e2;
        return !strcmp(snap->snap_kind, "full") &&
               cove_snapshot_info(tm->store, snap->tenant, snap->snap_id, &info, &e2) == 0 &&
               !strcmp(info.kind, "memory");
}

int cove_node_tm_restore(struct cove_node_tm *tm, const struct cove_node_tm_restore *q,
                         struct cove_node_tm_image *im, struct cove_err *err)
{
        im->img[0] = 0;
        im->mem[0] = 0;
        im->full_fd = -1;
        im->h = NULL;
        if (!cove_node_tm_ready(tm))
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "this node cannot restore snapshots");
        if (is_vm_full(tm, q))
                return restore_full(tm, q->tenant, q->snap_id, q->encrypted, &im->full_fd, err);
        return restore_image(tm, q, im->img, sizeof(im->img), &im->h, im->mem, sizeof(im->mem),
                             err);
}

void cove_node_tm_image_drop(struct cove_node_tm *tm, struct cove_node_tm_image *im)
{
        struct cove_err e2;
        if (im->full_fd >= 0)
                close(im->full_fd);
        else if (im->img[0])
                drop_image(tm, im->img, im->h);
        if (im->mem[0])
                cove_rm_rf(im->mem, &e2);
        im->img[0] = 0;
        im->mem[0] = 0;
        im->full_fd = -1;
        im->h = NULL;
}

/* Start q's sandbox on img, still mounted as h (and, for an ns full snapshot, the
 * checkpoint mem; all taken over by the runtime) with a new uid range; or, with img NULL, on
 * the vm full snapshot image in full_fd (closed here). */
static int start_from_image(struct cove_node_tm *tm, const struct cove_node_tm_start *q,
                            const char *img, struct cove_layer_handle *h, const char *mem,
                            int full_fd, uint32_t *uid_base, struct cove_err *err)
{
        uint32_t base = 0;
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        /* a vm's disk key: asked for by the driver, by the disk's lineage (runtime.h) */
        int is_vm = !strcmp(q->runtime, "vm");
        int layer_enc = q->encrypted && !is_vm;
        int r = 0;
        if (layer_enc)
                r = layer_key(tm, q->tenant, q->sandbox_id, key, err);
        if (r < 0 || cove_node_uid_reserve(tm->node, &base, err) < 0) {
                struct cove_err e2;
                OPENSSL_cleanse(key, sizeof(key));
                if (img)
                        drop_image(tm, img, h);
                if (mem && *mem)
                        cove_rm_rf(mem, &e2);
                if (full_fd >= 0)
                        close(full_fd);
                return -1;
        }
        struct cove_instance_spec spec = {
            .sandbox_id = q->sandbox_id,
            .runtime = q->runtime,
            .rootfs = q->rootfs,
            .cpus = q->cpus,
            .memory_mb = q->memory_mb,
            .disk_mb = q->disk_mb,
            .uid_base = base,
            .uid_count = COVE_UID_RANGE,
            .layer_image = img,
            .layer_handle = img ? h : NULL,
            .mem_image = mem && *mem ? mem : NULL,
            .layer_key = layer_enc ? key : NULL,
            .disk_encrypted = q->encrypted && is_vm,
            .disk_key = q->disk_key,
            .disk_key_ctx = q->disk_key_ctx,
            .full = !img,
            .full_fd = full_fd,
        };
        r = cove_node_start(tm->node, &spec, err);
        OPENSSL_cleanse(key, sizeof(key));
        if (full_fd >= 0)
                close(full_fd);
        if (r < 0) {
                struct cove_err e2;
                cove_node_stop(tm->node, q->sandbox_id, 1, &e2);
                cove_node_uid_release(tm->node, base);
                if (img)
                        unlink(img);
                if (err->kind == COVE_E_INTERNAL)
                        err->kind = COVE_E_UNAVAILABLE;
                return -1;
        }
        *uid_base = base;
        return 0;
}

int cove_node_tm_start(struct cove_node_tm *tm, const struct cove_node_tm_start *q,
                       struct cove_node_tm_image *im, uint32_t *uid_base, struct cove_err *err)
{
        int full_fd = im->full_fd;
        int r = start_from_image(tm, q, full_fd >= 0 ? NULL : im->img, im->h, im->mem, full_fd,
                                 uid_base, err);
        im->img[0] = 0;
        im->mem[0] = 0;
        im->full_fd = -1;
        im->h = NULL;
        return r;
}

/* ---- the store's other uses ---- */

int cove_node_tm_delete(struct cove_node_tm *tm, const char *tenant, const char *store_id,
                        struct cove_err *err)
{
        if (!tm || !tm->store)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "no snapshot store");
        if (tm->layer_dir[0]) {
                char infix[96];
                snprintf(infix, sizeof(infix), "-%s-", store_id);
                pthread_mutex_lock(&tm->keep_mu);
                keep_sweep(tm, NULL, infix, KEEP_MAX);
                pthread_mutex_unlock(&tm->keep_mu);
        }
        return cove_snapshot_delete(tm->store, tenant, store_id, err);
}

int cove_node_tm_list(struct cove_node_tm *tm, const char *tenant, char ***ids, size_t *n,
                      struct cove_err *err)
{
        return cove_snapshot_list(tm->store, tenant, ids, n, err);
}

int cove_node_tm_list_settled(struct cove_node_tm *tm, const char *tenant, char ***ids, size_t *n,
                              struct cove_err *err)
{
        return cove_snapshot_list_settled(tm->store, tenant, ids, n, err);
}

void cove_node_tm_list_free(char **ids, size_t n)
{
        cove_snapshot_list_free(ids, n);
}

int cove_node_tm_gc(struct cove_node_tm *tm, const char *tenant,
                    const struct cove_node_tm_kept *kept, size_t nkept,
                    struct cove_node_tm_gc_stats *out, struct cove_err *err)
{
        const char **keep_ids = calloc(nkept ? 2 * nkept : 1, sizeof(*keep_ids));
        char(*mids)[80] = calloc(nkept ? nkept : 1, sizeof(*mids));
        size_t n = 0;
        for (size_t i = 0; keep_ids && mids && i < nkept; i++) {
                keep_ids[n++] = kept[i].id;
                struct cove_snapshot_info mi;
                struct cove_err e2;
                /* an ns full snapshot's checkpoint (a vm one has none) */
                if (kept[i].full) {
                        cove_node_tm_mem_id(kept[i].id, mids[i], sizeof(mids[i]));
                        if (cove_snapshot_info(tm->store, tenant, mids[i], &mi, &e2) == 0)
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
        int r = keep_ids ? cove_store_gc(tm->store, tenant, keep_ids, n, &gs, err)
                         : cove_err_set(err, ENOMEM, "gc");
        pthread_mutex_unlock(&tm->io_mu);
        free(keep_ids);
        free(mids);
        out->marked = gs.marked;
        out->swept = gs.swept;
        out->swept_bytes = gs.swept_bytes;
        return r;
}

int cove_node_tm_files(struct cove_node_tm *tm, const struct cove_node_tm_files *q,
                       int (*fn)(void *arg, int tree_fd, struct cove_err *err), void *arg,
                       struct cove_err *err)
{
        char rnd[32], img[PATH_MAX];
        if (cove_id_new("", rnd, sizeof(rnd), err) < 0)
                return -1;
        /* IMG_RESTORE: swept at start if coved dies meanwhile */
        snprintf(img, sizeof(img), "%s/" IMG_RESTORE "tpl-%s.img", tm->layer_dir, rnd);
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        int enc = !q->snap_id && q->encrypted;
        int tree_fd = -1;
        struct cove_layer_handle *h = NULL;
        uint64_t pause_ns = 0;
        pthread_mutex_lock(&tm->io_mu);
        int r = 0;
        if (q->snap_id) {
                r = cove_node_layer_open(tm->node, img, 1, q->disk_mb, NULL, &tree_fd, &h, err);
                if (r == 0) {
                        struct cove_snapshot_stats st;
                        r = cove_snapshot_restore_tree(tm->store, q->tenant, q->snap_id, tree_fd,
                                                       &st, err);
                        if (r < 0)
                                store_err(err);
                }
        } else {
                r = cove_node_layer_snapshot(tm->node, q->sandbox_id, img, &pause_ns, err);
                if (r == 0 && enc)
                        r = layer_key(tm, q->tenant, q->sandbox_id, key, err);
                if (r == 0)
                        r = cove_node_layer_open(tm->node, img, 0, 0, enc ? key : NULL, &tree_fd,
                                                 &h, err);
                OPENSSL_cleanse(key, sizeof(key));
        }
        if (r == 0)
                r = fn(arg, tree_fd, err);
        if (tree_fd >= 0)
                close(tree_fd);
        if (h)
                cove_node_layer_close(tm->node, h);
        pthread_mutex_unlock(&tm->io_mu);
        unlink(img);
        return r;
}

struct cove_store *cove_node_tm_store(struct cove_node_tm *tm)
{
        return tm ? tm->store : NULL;
}

/* ---- start-up and shutdown ---- */

/* What a crash may have left: temporary layer images and checkpoints (captures and restores
 * in flight). */
static void cleanup_tmp(struct cove_node_tm *tm)
{
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
                                cove_info(tm->log, "snapshot.recover", "removed temporary image %s",
                                          de->d_name);
                }
        }
}

int cove_node_tm_open(struct cove_node *node, const struct cove_node_tm_config *cfg,
                      struct cove_node_tm **out, struct cove_err *err)
{
        *out = NULL;
        struct cove_node_tm *tm = calloc(1, sizeof(*tm));
        if (!tm)
                return cove_err_set(err, ENOMEM, "time machine");
        pthread_mutex_init(&tm->io_mu, NULL);
        pthread_mutex_init(&tm->keep_mu, NULL);
        tm->node = node;
        tm->cfg = *cfg;
        tm->log = cfg->log;
        snprintf(tm->data_dir, sizeof(tm->data_dir), "%s", cfg->data_dir);
        const char *ld = cove_node_layer_dir(node);
        snprintf(tm->layer_dir, sizeof(tm->layer_dir), "%s", ld ? ld : "");
        { /* one tmpfs directory per data dir, root only */
                unsigned char md[32];
                unsigned mdl;
                char hex[65];
                EVP_Digest(tm->data_dir, strlen(tm->data_dir), md, &mdl, EVP_sha256(), NULL);
                cove_hex(md, 32, hex);
                snprintf(tm->mem_dir, sizeof(tm->mem_dir), "/dev/shm/cove-tm-%.16s", hex);
                if (cove_mkdir_p(tm->mem_dir, 0700, err) < 0) {
                        cove_err_wrap(err, "checkpoint dir %s", tm->mem_dir);
                        goto fail;
                }
        }
        char root[PATH_MAX], keys[PATH_MAX];
        snprintf(root, sizeof(root), "%s/store", tm->data_dir);
        snprintf(keys, sizeof(keys), "%s/keys", tm->data_dir);
        if (cove_mkdir_p(keys, 0700, err) < 0) {
                cove_err_wrap(err, "snapshot keys %s", keys);
                goto fail;
        }
        char cache[PATH_MAX];
        snprintf(cache, sizeof(cache), "%s/chunk-cache", tm->data_dir);
        struct cove_chunkstore_cfg backend = {
            .url = cfg->store_url,
            .s3_endpoint = cfg->s3_endpoint,
            .s3_timeout_ms = cfg->s3_timeout_s * 1000,
            .cache_dir = cache,
            .cache_bytes = (uint64_t)(cfg->cache_mb > 0 ? cfg->cache_mb : 1024) << 20};
        struct cove_store_opts so = {.root = root,
                                     .keys_dir = keys,
                                     .io = cove_testhooks_io(),
                                     .gc_grace_ms = cove_testhooks_gc_grace_ms(),
                                     .backend = &backend};
        if (cove_store_open(&so, &tm->store, err) < 0) {
                cove_err_wrap(err, "snapshot store %s", cfg->store_url ? cfg->store_url : root);
                goto fail;
        }
        cleanup_tmp(tm);
        tm->reflink = cfg->keep_images && tm->layer_dir[0] && reflink_works(tm->layer_dir);
        *out = tm;
        return 0;
fail:
        cove_node_tm_close(tm);
        return -1;
}

void cove_node_tm_close(struct cove_node_tm *tm)
{
        if (!tm)
                return;
        cove_store_close(tm->store);
        if (tm->mem_dir[0])
                rmdir(tm->mem_dir); /* empty unless an operation is still in flight */
        pthread_mutex_destroy(&tm->io_mu);
        pthread_mutex_destroy(&tm->keep_mu);
        free(tm);
}
