/* The time machine in the control plane (control/snapshot.h): the operations built on the
 * node's captures and restores (node/tm.h), their catalog rows and locks, and the
 * background thread for rolling snapshots, retention thinning and GC. */
#include "control/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "control/egress.h"
#include "control/cluster.h"
#include "control/retention.h"
#include "control/template.h"
#include "control/tenant.h"
#include "crypto/keys.h"
#include "node/tm.h"
#include "util/cleanup.h"
#include "util/testhooks.h"
#include "util/util.h"

#define FORK_MAX 20
#define LABEL_MAX 127
#define THIN_EVERY_MS 30000

/* A hot pause: the sandbox is paused (its full snapshot committed, the catalog says
 * `paused`) but its instance is kept frozen at that snapshot, so a resume from it is a
 * thaw instead of a restore. The instance holds the uid range and the layer; the catalog row
 * says uid_base 0 like any paused sandbox, so a crash leaves an ordinary paused sandbox (the
 * restart's reconcile removes the frozen leftovers and the next resume restores from the
 * store). */
struct hot_pause {
        char id[64];       /* the sandbox */
        char snap[64];     /* its pause's snapshot: the instance is frozen at it */
        uint32_t uid_base; /* the instance's uid range */
        int64_t since_ms;  /* mono ms of the pause */
        uint64_t mem;      /* bytes its cgroup held at the pause */
};

struct cove_tm {
        struct cove_node_tm *node; /* captures, restores and the chunk store (node/tm.h) */
        pthread_mutex_t mu;        /* busy, quit, kicked */
        pthread_cond_t cv;
        char (*busy)[64]; /* sandboxes with an operation in progress */
        size_t nbusy, capbusy;
        pthread_t thr;
        int thr_started, quit, kicked;
        int rolling_off; /* the runtime cannot snapshot: rolling snapshots stopped */
        int gc_wanted;   /* snapshots were deleted since the last GC */
        int64_t last_thin_ms;
        struct hot_pause *hot; /* hot-paused sandboxes (mu), oldest first */
        size_t nhot, caphot;
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
        int r = coved_cluster_sandbox_update(d, row, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %s not found", row->id);
        return r;
}

static void row_set_error(struct cove_sandbox_row *row, const char *msg)
{
        free(row->error);
        row->error = msg ? strdup(msg) : NULL;
}

struct cove_store *cove_tm_store(struct coved *d)
{
        return d->tm ? cove_node_tm_store(d->tm->node) : NULL;
}

static int need_store(struct coved *d, struct cove_err *err)
{
        if (!d->tm || !cove_node_tm_ready(d->tm->node))
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

/* ---- capture ---- */

static void mem_id(const char *snap_id, char *out, size_t cap)
{
        cove_node_tm_mem_id(snap_id, out, cap);
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

        int64_t t0 = cove_mono_ns();
        s.created_at = tm_now();
        char mid[80];
        mem_id(s.id, mid, sizeof(mid));
        struct cove_node_tm_capture c = {.sandbox_id = row->id,
                                         .tenant = s.tenant,
                                         .snap_id = s.id,
                                         .parent_id = s.parent_id[0] ? s.parent_id : NULL,
                                         .kind = kind,
                                         .rolling = rolling,
                                         .hold = hold,
                                         .encrypted = row->storage_encrypted};
        struct cove_node_tm_taken t;
        int r = cove_node_tm_capture(tm->node, &c, &t, err);
        if (t.fallback[0])
                cove_warn(&d->log, "snapshot.full",
                          "sandbox %s: full snapshot failed, taking files only: %s", row->id,
                          t.fallback);
        if (r < 0)
                return -1;
        int full = t.checkpoint; /* an ns checkpoint (CRIU) was taken */
        snprintf(s.kind, sizeof(s.kind), "%s", t.kind);
        s.pause_us = t.pause_us;
        s.size_bytes = t.size_bytes;
        s.new_bytes = t.new_bytes;
        if (d->cat_ops->snapshot_insert(d->cat, &s, err) < 0) {
                struct cove_err e2;
                cove_node_tm_delete(tm->node, s.tenant, s.id, &e2);
                if (full)
                        cove_node_tm_delete(tm->node, s.tenant, mid, &e2);
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
        if (d->role == COVED_ROLE_CONTROL) /* its node takes it (a job) */
                return rolling
                           ? cove_err_setk(err, COVE_E_INTERNAL, 0,
                                           "rolling snapshots are their node's")
                           : coved_cluster_snapshot(d, tenant, sandbox_id, label, kind, out, err);
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

/* Snapshot snap restored on the node for target into im: its layer (mounted) and, for a
 * full one, the checkpoint, or a vm's full image. On failure nothing is left; the error
 * names the snapshot. */
static int restore_image(struct coved *d, const struct cove_snapshot_row *snap,
                         const struct cove_sandbox_row *target, struct cove_node_tm_image *im,
                         struct cove_err *err)
{
        struct cove_node_tm_restore q = {.tenant = snap->tenant,
                                         .snap_id = snap->id,
                                         .snap_kind = snap->kind,
                                         .sandbox_id = target->id,
                                         .sandbox_tenant = target->tenant,
                                         .encrypted = target->storage_encrypted,
                                         .disk_mb = (unsigned)target->disk_mb};
        if (need_store(d, err) < 0)
                return -1;
        return cove_node_tm_restore(d->tm->node, &q, im, err);
}

/* A tenant holding its own key gets its ns sandboxes' layers encrypted from the next
 * restore on, also those made plain before it brought the key (the restored layer is a new
 * image, filled from the chunk store). byok: coved_tenant_byok(). */
static void byok_upgrade(struct cove_sandbox_row *row, int byok)
{
        if (byok == 1 && !strcmp(row->runtime, "ns"))
                row->storage_encrypted = 1;
}

/* Start row's sandbox on the restored im (taken over, also on failure) with a new uid
 * range. */
static int start_from_image(struct coved *d, struct cove_sandbox_row *row,
                            struct cove_node_tm_image *im, struct cove_err *err)
{
        char rootfs[PATH_MAX];
        int r = cove_template_lookup_for(d->templates_dir, row->tenant, row->template_name, rootfs,
                                         sizeof(rootfs), err);
        if (r == 1)
                r = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                  "template %s is not built on this node", row->template_name);
        if (r < 0) {
                cove_node_tm_image_drop(d->tm->node, im);
                return -1;
        }
        struct coved_disk_key_ctx kc = {.d = d, .tenant = row->tenant};
        struct cove_node_tm_start q = {
            .sandbox_id = row->id,
            .tenant = row->tenant,
            .runtime = row->runtime,
            .rootfs = rootfs,
            .cpus = (unsigned)row->cpus,
            .memory_mb = (unsigned)row->memory_mb,
            .disk_mb = (unsigned)row->disk_mb,
            .encrypted = row->storage_encrypted,
            .disk_key = coved_disk_key_cb,
            .disk_key_ctx = &kc,
        };
        uint32_t base = 0;
        if (cove_node_tm_start(d->tm->node, &q, im, &base, err) < 0)
                return -1;
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
        snprintf(row->node, sizeof(row->node), "%s", d->node_name); /* it runs here now */
}

/* ---- hot pauses ---- */

static int hot_find(struct cove_tm *tm, const char *id) /* with mu */
{
        for (size_t i = 0; i < tm->nhot; i++)
                if (!strcmp(tm->hot[i].id, id))
                        return (int)i;
        return -1;
}

/* Take id's entry out of the table: 1 with *out (may be NULL), 0 when it has none. */
static int hot_take(struct cove_tm *tm, const char *id, struct hot_pause *out)
{
        pthread_mutex_lock(&tm->mu);
        int i = hot_find(tm, id);
        if (i >= 0) {
                if (out)
                        *out = tm->hot[i];
                memmove(&tm->hot[i], &tm->hot[i + 1],
                        (tm->nhot - (size_t)i - 1) * sizeof(*tm->hot));
                tm->nhot--;
        }
        pthread_mutex_unlock(&tm->mu);
        return i >= 0;
}

/* End id's hot pause (id locked by the caller): the entry goes and, with stop, its frozen
 * instance is stopped and its layer and state removed (the store holds the snapshot; the
 * next resume restores from it). stop 0: only when the catalog says it runs here again. */
static void hot_end(struct coved *d, const char *id, int stop, const char *why)
{
        struct hot_pause h;
        if (!hot_take(d->tm, id, &h))
                return;
        struct cove_err e2;
        if (stop && cove_node_stop(d->node, id, 1, &e2) < 0)
                cove_warn(&d->log, "sandbox.pause", "%s", e2.msg);
        cove_info(&d->log, "sandbox.pause", "sandbox %s: hot pause ended after %.1f s (%s)%s", id,
                  (double)(cove_mono_ns() / 1000000 - h.since_ms) / 1000.0, why,
                  stop ? ": its instance is stopped, a resume restores from the store" : "");
}

/* 1 when the node is short of memory: MemAvailable under a tenth of MemTotal. */
static int mem_low(void)
{
        cleanup_fclose FILE *f = fopen("/proc/meminfo", "re");
        char line[128];
        unsigned long long total = 0, avail = 0, v;
        while (f && fgets(line, sizeof(line), f)) {
                if (sscanf(line, "MemTotal: %llu kB", &v) == 1)
                        total = v;
                else if (sscanf(line, "MemAvailable: %llu kB", &v) == 1)
                        avail = v;
        }
        return total && avail < total / 10;
}

static uint64_t hot_total(struct cove_tm *tm) /* with mu */
{
        uint64_t sum = 0;
        for (size_t i = 0; i < tm->nhot; i++)
                sum += tm->hot[i].mem;
        return sum;
}

/* Stop the oldest hot pauses (but not keep's) until they hold at most room bytes; one that
 * has an operation running is left for the next sweep. */
static void hot_evict(struct coved *d, uint64_t room, const char *keep)
{
        struct cove_tm *tm = d->tm;
        for (size_t k = 0;; k++) {
                char id[64] = "";
                pthread_mutex_lock(&tm->mu);
                if (hot_total(tm) > room && k < tm->nhot) {
                        size_t skipped = 0;
                        for (size_t i = 0; i < tm->nhot && !id[0]; i++)
                                if (strcmp(tm->hot[i].id, keep) && skipped++ == k)
                                        snprintf(id, sizeof(id), "%s", tm->hot[i].id);
                }
                pthread_mutex_unlock(&tm->mu);
                if (!id[0])
                        return;
                if (sbx_lock(tm, id, 0) == 0) {
                        hot_end(d, id, 1, "memory bound of hot pauses");
                        sbx_unlock(tm, id);
                        k--; /* the list moved up */
                }
        }
}

/* After the pause's snapshot of row (locked; a full one left the instance frozen): keep it
 * hot when hot pauses are on, the snapshot is an ns checkpoint (so a thaw resumes exactly
 * the snapshot's state) and the memory bound has room (the oldest hot pauses make room).
 * Its egress link and connections go now, as at a stop: nothing of it reaches the network
 * while it is paused. 1 kept, 0 not (the caller stops it). */
static int hot_keep(struct coved *d, const struct cove_sandbox_row *row,
                    const struct cove_snapshot_row *snap, uint32_t uid_base)
{
        struct cove_tm *tm = d->tm;
        /* role node: the control may place the resume on any node, and this one learns of
         * it only at its next sweep, so for a while there would be two instances of one
         * sandbox (one frozen, holding memory the placement counts as free, and on a
         * host shared by several nodes the same cgroup): a cluster's pause stops it */
        if (d->pause_hot_s <= 0 || d->role != COVED_ROLE_ALL || strcmp(snap->kind, "full") ||
            strcmp(row->runtime, "ns") || !uid_base)
                return 0;
        uint64_t mem = 0, cpu = 0, bound = (uint64_t)d->pause_hot_mb << 20;
        struct cove_err e2;
        if (cove_node_usage(d->node, row->id, &mem, &cpu, &e2) < 0 || mem > bound || mem_low())
                return 0;
        /* a key revoked while the pause ran: nothing of the tenant stays in clear here */
        if (coved_key_gate(d, row->tenant, &e2) < 0)
                return 0;
        /* its connections out end now, as a stop ends them; a kernel that cannot: no hot
         * pause (a thaw would bring them back open) */
        unsigned aborted = 0;
        if (cove_node_tcp_abort(d->node, row->id, &aborted, &e2) < 0) {
                cove_warn(&d->log, "sandbox.pause", "sandbox %s: no hot pause: %s", row->id,
                          e2.msg);
                return 0;
        }
        hot_evict(d, bound - mem, row->id);
        pthread_mutex_lock(&tm->mu);
        int kept = hot_total(tm) + mem <= bound;
        if (kept && tm->nhot == tm->caphot) {
                size_t nc = tm->caphot ? tm->caphot * 2 : 16;
                void *nh = realloc(tm->hot, nc * sizeof(*tm->hot));
                if (nh) {
                        tm->hot = nh;
                        tm->caphot = nc;
                } else {
                        kept = 0;
                }
        }
        if (kept) {
                struct hot_pause *h = &tm->hot[tm->nhot++];
                memset(h, 0, sizeof(*h));
                snprintf(h->id, sizeof(h->id), "%s", row->id);
                snprintf(h->snap, sizeof(h->snap), "%s", snap->id);
                h->uid_base = uid_base;
                h->since_ms = cove_mono_ns() / 1000000;
                h->mem = mem;
        }
        pthread_mutex_unlock(&tm->mu);
        if (kept) {
                cove_node_hold(d->node, row->id, 1);
                coved_egress_on_stop(d, row->id);
        }
        return kept;
}

/* The background thread's round: end the hot pauses that aged past --pause-hot-s, all of
 * them while the node is short of memory, and those whose sandbox changed meanwhile
 * (deleted, resumed or moved elsewhere by another node, its tenant's key revoked, its
 * instance gone). */
static void hot_sweep(struct coved *d)
{
        struct cove_tm *tm = d->tm;
        pthread_mutex_lock(&tm->mu);
        size_t n = tm->nhot;
        struct hot_pause *list = n ? malloc(n * sizeof(*list)) : NULL;
        if (list)
                memcpy(list, tm->hot, n * sizeof(*list));
        pthread_mutex_unlock(&tm->mu);
        if (!list)
                return;
        int64_t now = cove_mono_ns() / 1000000;
        int low = mem_low();
        for (size_t i = 0; i < n; i++) {
                const char *id = list[i].id;
                if (sbx_lock(tm, id, 0)) /* an operation on it: the next round */
                        continue;
                pthread_mutex_lock(&tm->mu);
                int j = hot_find(tm, id);
                int same = j >= 0 && !strcmp(tm->hot[j].snap, list[i].snap);
                pthread_mutex_unlock(&tm->mu);
                struct cove_sandbox_row row;
                struct cove_err e2;
                memset(&row, 0, sizeof(row));
                const char *why = NULL;
                int stop = 1;
                if (!same)
                        why = NULL;
                else if (now - list[i].since_ms >= (int64_t)d->pause_hot_s * 1000)
                        why = "it aged past --pause-hot-s";
                else if (low)
                        why = "the node is short of memory";
                else if (d->cat_ops->sandbox_get(d->cat, NULL, id, &row, &e2) != 0)
                        why = "the sandbox is gone";
                else if (!strcmp(row.state, "running") && coved_cluster_mine(d, &row))
                        why = "it runs again", stop = 0;
                else if (strcmp(row.state, "paused") || !coved_cluster_mine(d, &row) ||
                         strcmp(row.last_snapshot_id, list[i].snap))
                        why = "the sandbox was moved, resumed elsewhere or changed";
                else if (coved_key_gate(d, row.tenant, &e2) < 0)
                        why = "its tenant's key is unusable";
                else if (cove_node_hold(d->node, id, 1) < 0)
                        why = "its instance is gone";
                cove_sandbox_row_clear(&row);
                if (why)
                        hot_end(d, id, stop, why);
                sbx_unlock(tm, id);
        }
        free(list);
}

int cove_tm_hot_has(struct coved *d, const char *id)
{
        if (!d->tm)
                return 0;
        pthread_mutex_lock(&d->tm->mu);
        int i = hot_find(d->tm, id);
        pthread_mutex_unlock(&d->tm->mu);
        return i >= 0;
}

int cove_tm_hot_drop(struct coved *d, const char *id, const char *why)
{
        if (!d->tm || !cove_tm_hot_has(d, id))
                return 0;
        sbx_lock(d->tm, id, 1);
        int had = cove_tm_hot_has(d, id);
        hot_end(d, id, 1, why);
        sbx_unlock(d->tm, id);
        return had;
}

/* ---- operations ---- */

int cove_sandbox_pause(struct coved *d, const char *tenant, const char *id, json_t **out,
                       struct cove_err *err)
{
        return cove_sandbox_pause_kind(d, tenant, id, NULL, out, err);
}

int cove_sandbox_pause_kind(struct coved *d, const char *tenant, const char *id, const char *kind,
                            json_t **out, struct cove_err *err)
{
        if (d->role == COVED_ROLE_CONTROL) /* its node pauses it (a job) */
                return coved_cluster_pause(d, tenant, id, kind, out, err);
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
        if ((r = capture_locked(d, &row, "pause", kind, 0, 1, &snap, err)) < 0) {
                cove_err_wrap(err, "pause");
                if (reload(d, id, &row, &e2) == 0 && !strcmp(row.state, "pausing")) {
                        snprintf(row.state, sizeof(row.state), "running");
                        row_write(d, &row, &e2);
                }
                goto out;
        }
        /* the snapshot holds everything: free the instance, its layer and uid range; or,
         * for a full one, keep the instance frozen for a while (a hot pause) */
        uint32_t uid_base = row.uid_base;
        int hot = hot_keep(d, &row, &snap, uid_base);
        if (!hot && cove_node_stop(d->node, id, 1, &e2) < 0)
                cove_warn(&d->log, "sandbox.pause", "%s", e2.msg);
        if ((r = reload(d, id, &row, err)) < 0) {
                if (hot)
                        hot_end(d, id, 1, "the sandbox is gone");
                goto out;
        }
        snprintf(row.state, sizeof(row.state), "paused");
        row.uid_base = 0;
        row.expires_at = 0;
        row_set_error(&row, NULL);
        if ((r = row_write(d, &row, err)) < 0) {
                if (hot)
                        hot_end(d, id, 1, "the catalog refused the paused state");
                goto out;
        }
        coved_audit_control(d, row.tenant, id, "pause", json_pack("{s:s}", "snapshot", snap.id));
        cove_info(&d->log, "sandbox.pause", "sandbox %s paused at snapshot %s in %.1f ms%s", id,
                  snap.id, (double)(cove_mono_ns() - t0) / 1e6,
                  hot ? " (hot: kept frozen in memory)" : "");
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
        if (d->role == COVED_ROLE_CONTROL) /* placed on a node with room, resumed there */
                return coved_cluster_resume(d, tenant, id, body, out, err);
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
        struct cove_err e2;
        struct hot_pause hp;
        int64_t t1 = cove_mono_ns(), t2 = t1, t3 = t1;
        /* a hot pause at this very snapshot: its frozen instance is the snapshot's state, so
         * thawing it is the resume (not when the layer is to be encrypted anew, byok_upgrade) */
        int thawed = hot_take(d->tm, id, &hp) && !strcmp(hp.snap, snap.id) &&
                     !strcmp(prev, "paused") && coved_cluster_mine(d, &row) &&
                     !(byok == 1 && !row.storage_encrypted) &&
                     cove_node_freeze(d->node, id, 0, &e2) == 0;
        if (thawed) {
                cove_node_hold(d->node, id, 0);
                row.uid_base = hp.uid_base;
                t3 = cove_mono_ns();
        } else {
                /* a stopped sandbox may have left state behind (a crash), a hot pause its
                 * frozen instance: start from a clean slate */
                cove_node_stop(d->node, id, 1, &e2);
                struct cove_node_tm_image im;
                t1 = cove_mono_ns();
                byok_upgrade(&row, byok);
                r = restore_image(d, &snap, &row, &im, err);
                t2 = cove_mono_ns();
                if (r == 0)
                        r = start_from_image(d, &row, &im, err);
                t3 = cove_mono_ns();
        }
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
                  "sandbox %s resumed from snapshot %s in %.1f ms (restore %.1f ms, start %.1f "
                  "ms)%s",
                  id, snap.id, (double)(cove_mono_ns() - t0) / 1e6, (double)(t2 - t1) / 1e6,
                  (double)(t3 - t2) / 1e6, thawed ? ", a thaw of its hot pause" : "");
        *out = cove_sandbox_json(&row);
out:
        sbx_unlock(d->tm, id);
        cove_sandbox_row_clear(&row);
        return r;
}

int cove_sandbox_rewind(struct coved *d, const char *tenant, const char *id, json_t *body,
                        json_t **out, struct cove_err *err)
{
        if (d->role == COVED_ROLE_CONTROL)
                return coved_cluster_rewind(d, tenant, id, body, out, err);
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
        struct cove_node_tm_image im;
        byok_upgrade(&row, byok);
        r = restore_image(d, &snap, &row, &im, err);
        if (r < 0) {
                if (running)
                        unhold(d, id);
                cove_err_wrap(err, "rewind of sandbox %s: the sandbox was left as it was", id);
                goto out;
        }
        struct cove_err e2;
        hot_take(d->tm, id, NULL);           /* a hot pause's frozen instance goes too */
        cove_node_stop(d->node, id, 1, &e2); /* switch only now that the new layer is complete */
        if ((r = reload(d, id, &row, err)) < 0) {
                cove_node_tm_image_drop(d->tm->node, &im);
                goto out;
        }
        byok_upgrade(&row, byok); /* the image restored above is keyed so */
        if ((r = start_from_image(d, &row, &im, err)) < 0) {
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
        return cove_sandbox_fork_ext(d, tenant, id, body, NULL, out, err);
}

/* A fork's settings from over (see snapshot.h) where it has them, else the source's. */
static void fork_overrides(struct cove_sandbox_row *s, json_t *over)
{
        json_t *m = json_object_get(over, "metadata"), *e = json_object_get(over, "env");
        json_t *t = json_object_get(over, "timeout_s"), *ot = json_object_get(over, "on_timeout");
        char *txt;
        if (json_is_object(m) && (txt = json_dumps(m, JSON_COMPACT))) {
                free(s->metadata_json);
                s->metadata_json = txt;
        }
        if (json_is_object(e) && (txt = json_dumps(e, JSON_COMPACT))) {
                free(s->env_json);
                s->env_json = txt;
        }
        if (json_is_integer(t) && json_integer_value(t) > 0 && json_integer_value(t) <= INT32_MAX)
                s->timeout_s = (int)json_integer_value(t);
        if (json_is_string(ot) &&
            (!strcmp(json_string_value(ot), "kill") || !strcmp(json_string_value(ot), "pause")))
                snprintf(s->on_timeout, sizeof(s->on_timeout), "%s", json_string_value(ot));
}

/* One fork's restore and start, on a thread of its own. */
struct fork_job {
        struct coved *d;
        const struct cove_snapshot_row *snap;
        struct cove_sandbox_row row; /* the fork's row (inserted: state starting) */
        pthread_t thr;
        int started; /* thr runs */
        int r;
        struct cove_err err;
};

static void *fork_main(void *arg)
{
        struct fork_job *j = arg;
        struct cove_node_tm_image im;
        j->r = restore_image(j->d, j->snap, &j->row, &im, &j->err);
        if (j->r == 0)
                j->r = start_from_image(j->d, &j->row, &im, &j->err);
        return NULL;
}

/* Restore and start every job at once (a thread each; where a thread cannot be made, on
 * this one). 0 when all of them run; else -1 with the first error (the caller stops
 * them all). */
static int fork_run(struct fork_job *jobs, int n, struct cove_err *err)
{
        for (int i = 0; i < n; i++)
                jobs[i].started = pthread_create(&jobs[i].thr, NULL, fork_main, &jobs[i]) == 0;
        int r = 0;
        for (int i = 0; i < n; i++) {
                if (jobs[i].started)
                        pthread_join(jobs[i].thr, NULL);
                else
                        fork_main(&jobs[i]);
                if (jobs[i].r < 0 && r == 0) {
                        *err = jobs[i].err;
                        r = -1;
                }
        }
        return r;
}

int cove_sandbox_fork_ext(struct coved *d, const char *tenant, const char *id, json_t *body,
                          json_t *over, json_t **out, struct cove_err *err)
{
        if (d->role == COVED_ROLE_CONTROL) /* on the node of its source (a job) */
                return coved_cluster_fork(d, tenant, id, body, out, err);
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
        struct fork_job *jobs = calloc((size_t)count, sizeof(*jobs));
        int nmade = 0;
        /* the rows first, one by one (the catalog), then every restore and start at once
         * (the chunk store's reads, CRIU and the start overlap), then the rows say running */
        for (int i = 0; made && jobs && i < count; i++) {
                struct cove_sandbox_row *sr = &jobs[i].row;
                snprintf(sr->tenant, sizeof(sr->tenant), "%s", src.tenant);
                snprintf(sr->template_name, sizeof(sr->template_name), "%s", src.template_name);
                snprintf(sr->runtime, sizeof(sr->runtime), "%s", src.runtime);
                snprintf(sr->on_timeout, sizeof(sr->on_timeout), "%s", src.on_timeout);
                snprintf(sr->node, sizeof(sr->node), "%s", src.node);
                sr->cpus = src.cpus;
                sr->memory_mb = src.memory_mb;
                sr->disk_mb = src.disk_mb;
                sr->timeout_s = src.timeout_s;
                sr->snapshot_interval_s = src.snapshot_interval_s;
                sr->storage_encrypted = src.storage_encrypted;
                byok_upgrade(sr, byok);
                sr->metadata_json = strdup(src.metadata_json ? src.metadata_json : "{}");
                sr->env_json = strdup(src.env_json ? src.env_json : "{}");
                sr->retention_json = src.retention_json ? strdup(src.retention_json) : NULL;
                fork_overrides(sr, over);
                /* a fork's first snapshot has the forked snapshot as parent */
                snprintf(sr->last_snapshot_id, sizeof(sr->last_snapshot_id), "%s", snap.id);
                sr->created_at = tm_now();
                snprintf(sr->state, sizeof(sr->state), "starting");
                r = cove_id_new("sbx_", sr->id, sizeof(sr->id), err);
                if (r == 0)
                        r = d->cat_ops->sandbox_insert(d->cat, sr, err);
                if (r < 0)
                        break;
                snprintf(made[nmade++], 64, "%s", sr->id);
                jobs[i].d = d;
                jobs[i].snap = &snap;
        }
        if (made && jobs && r == 0)
                r = fork_run(jobs, count, err);
        for (int i = 0; made && jobs && r == 0 && i < count; i++) {
                struct cove_sandbox_row *sr = &jobs[i].row;
                set_running(d, sr, snap.id);
                r = row_write(d, sr, err);
                if (r == 0) {
                        coved_egress_copy(d, sr->tenant, id, sr->id);
                        coved_audit_control(
                            d, sr->tenant, sr->id, "fork",
                            json_pack("{s:s, s:s}", "from", id, "snapshot", snap.id));
                        json_array_append_new(list, cove_sandbox_json(sr));
                }
        }
        int oom = !made || !jobs;
        for (int i = 0; jobs && i < count; i++)
                cove_sandbox_row_clear(&jobs[i].row);
        free(jobs);
        if (oom)
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

int cove_sandbox_stop_keep(struct coved *d, const char *tenant, const char *id,
                           struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        sbx_lock(d->tm, id, 1);
        int r = reload(d, id, &row, err);
        if (r == 0 && !strcmp(row.state, "stopped"))
                goto out;
        if (r == 0 && strcmp(row.state, "running") != 0 && strcmp(row.state, "paused") != 0)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is %s", id, row.state);
        if (r < 0)
                goto out;
        struct cove_err e2;
        if (!strcmp(row.state, "running") && cove_node_stop(d->node, id, 1, &e2) < 0)
                cove_warn(&d->log, "sandbox.stop", "%s", e2.msg);
        hot_end(d, id, 1, "the sandbox was stopped");
        if ((r = reload(d, id, &row, err)) < 0)
                goto out;
        snprintf(row.state, sizeof(row.state), "stopped");
        row.uid_base = 0;
        row.expires_at = 0;
        if ((r = row_write(d, &row, err)) < 0)
                goto out;
        coved_audit_control(d, row.tenant, id, "stop", json_object());
        cove_info(&d->log, "sandbox.state", "sandbox %s stopped (its snapshots are kept)", id);
out:
        sbx_unlock(d->tm, id);
        cove_sandbox_row_clear(&row);
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
        if (d->tm && d->tm->node && cove_node_tm_delete(d->tm->node, s.tenant, s.id, &e2) < 0 &&
            e2.kind != COVE_E_NOT_FOUND)
                cove_warn(&d->log, "snapshot.delete", "%s", e2.msg);
        char mid[80];
        mem_id(s.id, mid, sizeof(mid));
        if (!strcmp(s.kind, "full") && d->tm && d->tm->node &&
            cove_node_tm_delete(d->tm->node, s.tenant, mid, &e2) < 0 && e2.kind != COVE_E_NOT_FOUND)
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
        const struct coved *d;
        struct due *v;
        size_t n, cap;
};

static int collect_rolling(const struct cove_sandbox_row *row, void *arg)
{
        struct due_list *l = arg;
        if (row->snapshot_interval_s <= 0 || !coved_cluster_mine(l->d, row))
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
        struct due_list l = {.d = d};
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

static int catalog_shared(const struct coved *d);
static void orphans_sweep(struct coved *d);

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
                int mine = d->role != COVED_ROLE_NODE; /* a node thins its own sandboxes' */
                if (cove_sandbox_load(d, NULL, l.v[i].sandbox_id, &row, &err) == 0) {
                        if (cove_retention_parse(row.retention_json, &pol, &err) < 0)
                                cove_retention_default(&pol);
                        snprintf(last, sizeof(last), "%s", row.last_snapshot_id);
                        mine = coved_cluster_mine(d, &row);
                        cove_sandbox_row_clear(&row);
                }
                if (!mine) {
                        i = j;
                        continue;
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
        /* GC per tenant from the snapshots the catalog keeps; captures wait (node/tm.h), and the
         * store's grace period protects chunks of a capture whose row is not written yet */
        struct snaps all = {0};
        if (d->cat_ops->snapshot_list(d->cat, NULL, NULL, collect_snap, &all, &err) < 0) {
                free(all.v);
                return;
        }
        if (catalog_shared(d))
                orphans_sweep(d); /* settled orphans of any process, before the mark */
        struct tenant_names tns;
        store_tenants(d, &tns);
        for (size_t ti = 0; ti < tns.n; ti++) {
                const char *tname = tns.v[ti];
                struct cove_node_tm_kept *kept = calloc(all.n ? all.n : 1, sizeof(*kept));
                size_t n = 0;
                for (size_t i = 0; kept && i < all.n; i++)
                        if (!strcmp(all.v[i].tenant, tname)) {
                                kept[n].id = all.v[i].id;
                                kept[n++].full = !strcmp(all.v[i].kind, "full");
                        }
                struct cove_node_tm_gc_stats gs;
                memset(&gs, 0, sizeof(gs));
                int r = kept ? cove_node_tm_gc(tm->node, tname, kept, n, &gs, &err) : -1;
                free(kept);
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
                hot_sweep(d);
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

/* Several processes share the catalog (PostgreSQL) and so the store's manifests: another
 * one may be between writing a manifest and committing its row. */
static int catalog_shared(const struct coved *d)
{
        return d->cat_ops != &cove_catalog_sqlite;
}

/* What a crash may have left: manifests whose catalog row was never written (the snapshot
 * was never reported). The node removed the temporary images at its open. With a shared
 * catalog only settled manifests (older than the store's grace period) are orphans: a
 * younger one may be another process's capture about to commit its row; those are looked
 * at again by every GC pass (orphans_sweep). */
static void orphans_sweep(struct coved *d)
{
        struct cove_tm *tm = d->tm;
        struct tenant_names tns;
        store_tenants(d, &tns);
        for (size_t ti = 0; ti < tns.n; ti++) {
                const char *tname = tns.v[ti];
                char **ids = NULL;
                size_t n = 0;
                struct cove_err err;
                if ((catalog_shared(d) ? cove_node_tm_list_settled(tm->node, tname, &ids, &n, &err)
                                       : cove_node_tm_list(tm->node, tname, &ids, &n, &err)) < 0) {
                        cove_warn(&d->log, "snapshot.recover", "tenant %s: %s", tname, err.msg);
                        continue;
                }
                for (size_t i = 0; i < n; i++) {
                        struct cove_snapshot_row s;
                        /* a checkpoint (<id>-mem) lives as long as its snapshot's row */
                        char base[80];
                        cove_node_tm_base_id(ids[i], base, sizeof(base));
                        if (d->cat_ops->snapshot_get(d->cat, NULL, base, &s, &err) != 1)
                                continue;
                        if (cove_node_tm_delete(tm->node, tname, ids[i], &err) == 0)
                                cove_info(&d->log, "snapshot.recover",
                                          "removed incomplete snapshot %s (never reported)",
                                          ids[i]);
                        tm->gc_wanted = 1;
                }
                cove_node_tm_list_free(ids, n);
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
        d->tm = tm;
        tm->node = d->ntm;
        if (!tm->node)
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "time machine: the node has none");
        orphans_sweep(d);
        tm->last_thin_ms = 0;
        tm->rolling_off = !cove_node_tm_layers(tm->node);
        int e = pthread_create(&tm->thr, NULL, tm_main, d);
        if (e)
                return cove_err_set(err, e, "snapshot thread");
        tm->thr_started = 1;
        if (!cove_node_tm_layers(tm->node))
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
        d->tm = NULL; /* first: the node's on_dead asks for hot pauses until it is freed */
        free(tm->busy);
        free(tm->hot); /* their instances end with the node */
        pthread_cond_destroy(&tm->cv);
        pthread_mutex_destroy(&tm->mu);
        free(tm);
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
        struct cove_node_tm_files q = {
            .tenant = snap ? tenant : row.tenant,
            .sandbox_id = row.id,
            .snap_id = snap,
            .encrypted = row.storage_encrypted,
            .disk_mb = (unsigned)row.disk_mb,
        };
        rc = cove_node_tm_files(d->tm->node, &q, fn, arg, err);
out:
        cove_sandbox_row_clear(&row);
        return rc;
}
