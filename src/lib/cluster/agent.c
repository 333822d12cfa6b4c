/* The node's agent (role node, docs/cluster.md "Leases and fencing", "Jobs"): holds the
 * node's lease, runs the jobs placed on it, and fences the node when it cannot prove its
 * lease.
 *
 * Three threads, so that no one blocking call can delay the fence:
 * - lease: acquires the lease (waiting, with a log line, while a previous process's lease
 *   is still live), renews it every --lease-renew; a renew refused as stale means the
 *   lease is gone: fence, acquire anew (a new epoch), reconcile.
 * - fence: when the lease has not been confirmed for its TTL (minus a margin, measured on
 *   this node's monotonic clock from before the renew was sent), freezes every instance
 *   this node runs at once. A stopped process (SIGSTOP) fences on its first instant back.
 * - jobs: woken by the catalog (LISTEN) or its poll, claims its oldest job under the
 *   current epoch, runs it with the same in-process calls as role all, and reports the
 *   outcome with (node, epoch, generation). A report refused as stale makes the node undo
 *   what it did (stop the instance it started).
 *
 * After a fence and a new acquire, each instance is kept (thawed) only when its sandbox
 * is still placed on this node at the generation it ran; every other one is stopped
 * without writing anything: its sandbox belongs to another node now. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cluster/cluster_internal.h"
#include "control/cluster.h"
#include "control/snapshot.h"
#include "control/template.h"
#include "util/testhooks.h"
#include "util/util.h"

struct owned {
        char id[64];
        int64_t gen; /* the placement generation the instance runs for */
};

struct cove_agent {
        struct coved *d;
        pthread_mutex_t mu;
        pthread_cond_t cv; /* CLOCK_MONOTONIC: quit, lease state changes */
        int quit;
        int64_t epoch;       /* 0 while none is held */
        int64_t deadline_ns; /* mono: the lease is surely live until then */
        int fenced;          /* instances frozen, no job is claimed */
        int recheck;         /* a new epoch whose placements could not be read yet */
        struct owned *own;
        size_t nown, cap;
        char job_sbx[64]; /* the sandbox of the job being run, "" between jobs */
        int64_t job_gen;  /* and the generation the job was written for */
        int job_fork;     /* that job is a fork (it inserts sandboxes not placed yet) */
        pthread_t lease_thr, fence_thr, job_thr;
        int lease_started, fence_started, job_started;
        struct cove_node_row row; /* what it announces */
};

static void cv_wait_ms(struct cove_agent *a, int64_t ms)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + (ms > 0 ? ms : 0) * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&a->cv, &a->mu, &ts);
}

static int quitting(struct cove_agent *a)
{
        pthread_mutex_lock(&a->mu);
        int q = a->quit;
        pthread_mutex_unlock(&a->mu);
        return q;
}

/* ---- the instances this node runs ---- */

static void own_set(struct cove_agent *a, const char *id, int64_t gen)
{
        pthread_mutex_lock(&a->mu);
        for (size_t i = 0; i < a->nown; i++)
                if (!strcmp(a->own[i].id, id)) {
                        a->own[i].gen = gen;
                        pthread_mutex_unlock(&a->mu);
                        return;
                }
        if (a->nown == a->cap) {
                size_t nc = a->cap ? a->cap * 2 : 16;
                struct owned *n = realloc(a->own, nc * sizeof(*n));
                if (!n) {
                        pthread_mutex_unlock(&a->mu);
                        return; /* the fence then misses it: its guest still freezes itself */
                }
                a->own = n;
                a->cap = nc;
        }
        snprintf(a->own[a->nown].id, sizeof(a->own[0].id), "%s", id);
        a->own[a->nown++].gen = gen;
        pthread_mutex_unlock(&a->mu);
}

static void own_del(struct cove_agent *a, const char *id)
{
        pthread_mutex_lock(&a->mu);
        for (size_t i = 0; i < a->nown; i++)
                if (!strcmp(a->own[i].id, id)) {
                        a->own[i] = a->own[--a->nown];
                        break;
                }
        pthread_mutex_unlock(&a->mu);
}

/* A copy of the list (caller frees). */
static struct owned *own_copy(struct cove_agent *a, size_t *n)
{
        pthread_mutex_lock(&a->mu);
        *n = a->nown;
        struct owned *c = malloc((a->nown ? a->nown : 1) * sizeof(*c));
        if (c && a->nown)
                memcpy(c, a->own, a->nown * sizeof(*c));
        if (!c)
                *n = 0;
        pthread_mutex_unlock(&a->mu);
        return c;
}

/* ---- what the node announces ---- */

static int add_template(void *arg, const struct cove_template_info *info)
{
        if (info->built)
                json_array_append_new(arg, json_string(info->name));
        return 0;
}

static void criu_version(char *out, size_t cap)
{
        snprintf(out, cap, "none");
        FILE *p =
            popen("PATH=/usr/local/sbin:/usr/sbin:/sbin:$PATH criu --version 2>/dev/null", "re");
        if (!p)
                return;
        char line[128];
        while (fgets(line, sizeof(line), p))
                if (!strncmp(line, "Version: ", 9)) {
                        line[strcspn(line, "\n")] = 0;
                        snprintf(out, cap, "%.60s", line + 9);
                }
        pclose(p);
}

static void cpu_model(char *out, size_t cap)
{
        snprintf(out, cap, "unknown");
        FILE *f = fopen("/proc/cpuinfo", "re");
        if (!f)
                return;
        char line[256];
        while (fgets(line, sizeof(line), f))
                if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                        char *v = strchr(line, ':') + 1;
                        while (*v == ' ' || *v == '\t')
                                v++;
                        v[strcspn(v, "\n")] = 0;
                        snprintf(out, cap, "%.120s", v);
                        break;
                }
        fclose(f);
}

/* The node row of the lease: name, address, capacity (the machine minus a reserve for
 * coved and the host) and features. */
static void describe(struct cove_agent *a)
{
        struct coved *d = a->d;
        struct cove_node_row *n = &a->row;
        memset(n, 0, sizeof(*n));
        snprintf(n->name, sizeof(n->name), "%s", d->node_name);
        snprintf(n->address, sizeof(n->address), "%s", d->advertise);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        int64_t mem = pages > 0 && psz > 0 ? (int64_t)pages * psz / (1 << 20) : 0;
        struct statvfs sv;
        int64_t disk = statvfs(d->data_dir, &sv) == 0
                           ? (int64_t)((uint64_t)sv.f_bavail * sv.f_frsize / (1 << 20))
                           : 0;
        n->cpus = cpus > 0 ? cpus : 1;
        n->memory_mb = mem > 1024 ? mem - 512 : mem / 2;
        n->disk_mb = disk > 2048 ? disk - 1024 : disk / 2;
        json_t *rt = json_array();
        static const char *const names[] = {"ns", "vm"};
        for (size_t i = 0; i < 2; i++) {
                struct cove_err e;
                if (cove_node_runtime_check(d->node, names[i], &e) == 0)
                        json_array_append_new(rt, json_string(names[i]));
        }
        char why[256] = "";
        int full = cove_node_full_wait(d->node, 60000, why, sizeof(why));
        char criu[64], cpu[128];
        criu_version(criu, sizeof(criu));
        cpu_model(cpu, sizeof(cpu));
        struct utsname u;
        if (uname(&u) < 0)
                snprintf(u.release, sizeof(u.release), "unknown");
        json_t *tpl = json_array();
        struct cove_err e;
        cove_template_list(d->templates_dir, add_template, tpl, &e);
        json_t *f = json_pack("{s:o, s:s, s:s, s:s, s:s, s:o}", "runtimes", rt, "full",
                              full == 1 ? "ok" : (why[0] ? why : "unavailable"), "criu", criu,
                              "kernel", u.release, "cpu", cpu, "templates", tpl);
        if (f && d->ports_advertise[0]) /* where control replicas relay preview requests */
                json_object_set_new(f, "ports", json_string(d->ports_advertise));
        char *txt = f ? json_dumps(f, JSON_COMPACT) : NULL;
        if (txt && strlen(txt) < sizeof(n->features))
                snprintf(n->features, sizeof(n->features), "%s", txt);
        else
                snprintf(n->features, sizeof(n->features), "{\"runtimes\":[\"%s\"]}",
                         cove_node_runtime_name(d->node));
        free(txt);
        json_decref(f);
}

/* ---- lease ---- */

static int64_t margin_ms(const struct coved *d)
{
        int64_t m = d->lease_ttl_ms / 10;
        return m > 1000 ? 1000 : m;
}

/* Acquire the lease, waiting while a previous holder's is live. 0, or -1 when quitting. */
static int acquire(struct cove_agent *a)
{
        struct coved *d = a->d;
        int said = 0;
        while (!quitting(a)) {
                struct cove_err err;
                int64_t t0 = cove_mono_ns(), epoch = 0, exp = 0;
                int r = d->cat_ops->node_lease_acquire(d->cat, &a->row, d->lease_ttl_ms, &epoch,
                                                       &exp, &err);
                if (r == 0) {
                        pthread_mutex_lock(&a->mu);
                        a->epoch = epoch;
                        a->deadline_ns = t0 + (d->lease_ttl_ms - margin_ms(d)) * 1000000;
                        pthread_cond_broadcast(&a->cv);
                        pthread_mutex_unlock(&a->mu);
                        cove_info(&d->log, "cluster.lease",
                                  "node %s holds its lease: epoch %lld, ttl %d ms, renewed "
                                  "every %d ms",
                                  d->node_name, (long long)epoch, d->lease_ttl_ms,
                                  d->lease_renew_ms);
                        return 0;
                }
                if (!said) {
                        if (err.kind == COVE_E_CONFLICT)
                                cove_info(&d->log, "cluster.lease",
                                          "node %s: the lease is still held (a previous process "
                                          "of this node, or another process using its name): "
                                          "waiting for it to expire (at most %d ms)",
                                          d->node_name, d->lease_ttl_ms);
                        else
                                cove_warn(&d->log, "cluster.lease",
                                          "node %s: cannot acquire the lease: %s (retrying)",
                                          d->node_name, err.msg);
                        said = 1;
                }
                pthread_mutex_lock(&a->mu);
                cv_wait_ms(a, d->lease_renew_ms < 500 ? d->lease_renew_ms : 500);
                pthread_mutex_unlock(&a->mu);
        }
        return -1;
}

/* Freeze every instance at once: the lease is not confirmed. */
static void fence(struct cove_agent *a, const char *why)
{
        struct coved *d = a->d;
        pthread_mutex_lock(&a->mu);
        if (a->fenced) {
                pthread_mutex_unlock(&a->mu);
                return;
        }
        a->fenced = 1;
        pthread_mutex_unlock(&a->mu);
        /* each guest freezes itself too when this process cannot (it is stopped) */
        cove_node_heartbeat_pause(d->node, 1);
        size_t n;
        struct owned *o = own_copy(a, &n);
        size_t frozen = 0;
        for (size_t i = 0; o && i < n; i++) {
                struct cove_err e;
                if (cove_node_freeze(d->node, o[i].id, 1, &e) == 0)
                        frozen++;
        }
        free(o);
        cove_warn(&d->log, "cluster.fence",
                  "node %s fenced itself (%s): %zu of %zu sandboxes frozen, no job is claimed "
                  "until the lease is confirmed",
                  d->node_name, why, frozen, n);
}

/* Lift the self-freeze of each guest in o[0..n) that fenced itself (the ping answers
 * "fenced"; a guest that did not is left alone). Called only once the lease is confirmed and
 * each of them is still placed here. */
static void thaw_guests(struct cove_agent *a, const struct owned *o, size_t n)
{
        struct coved *d = a->d;
        for (size_t i = 0; o && i < n; i++) {
                struct cove_err e;
                if (cove_node_thaw_fenced(d->node, o[i].id, &e) < 0 && e.kind != COVE_E_CONFLICT)
                        cove_warn(&d->log, "cluster.fence", "thaw of %s: %s", o[i].id, e.msg);
        }
}

/* After the lease is confirmed again: keep (thaw) what is still placed here at the
 * generation it runs for, stop the rest. same_epoch: the lease never lapsed (a late
 * renew went through): everything is still ours. */
static void unfence(struct cove_agent *a, int same_epoch)
{
        struct coved *d = a->d;
        size_t n;
        struct owned *o = own_copy(a, &n);
        size_t kept = 0, stopped = 0;
        for (size_t i = 0; o && i < n; i++) {
                struct cove_err e;
                int keep = same_epoch;
                if (!keep) {
                        struct cove_placement_row pl;
                        int r = d->cat_ops->placement_get(d->cat, o[i].id, &pl, &e);
                        if (r < 0) { /* cannot tell: stay fenced, look again next renew */
                                cove_warn(&d->log, "cluster.fence", "%s", e.msg);
                                free(o);
                                pthread_mutex_lock(&a->mu);
                                a->recheck = 1;
                                pthread_mutex_unlock(&a->mu);
                                return;
                        }
                        keep =
                            r == 0 && !strcmp(pl.node, d->node_name) && pl.generation == o[i].gen;
                }
                if (keep) {
                        cove_node_freeze(d->node, o[i].id, 0, &e);
                        o[kept++] = o[i]; /* the guests to thaw below */
                } else {
                        /* not ours any more: stop it, write nothing (its row is another
                         * node's now) */
                        if (cove_node_stop(d->node, o[i].id, 0, &e) < 0)
                                cove_warn(&d->log, "cluster.fence", "%s", e.msg);
                        own_del(a, o[i].id);
                        stopped++;
                }
        }
        /* heartbeats again, then the guests that fenced themselves (the kept ones only: a
         * moved one stays frozen until its stop above ends it) */
        cove_node_heartbeat_pause(d->node, 0);
        thaw_guests(a, o, kept);
        free(o);
        pthread_mutex_lock(&a->mu);
        a->fenced = 0;
        a->recheck = 0;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        cove_info(&d->log, "cluster.fence",
                  "node %s: lease confirmed again%s: %zu sandboxes kept, %zu stopped (placed "
                  "elsewhere or at a newer generation)",
                  d->node_name, same_epoch ? "" : " (new epoch)", kept, stopped);
}

static void *lease_main(void *arg)
{
        struct cove_agent *a = arg;
        struct coved *d = a->d;
        int failing = 0;
        while (!quitting(a)) {
                pthread_mutex_lock(&a->mu);
                if (!a->quit)
                        cv_wait_ms(a, d->lease_renew_ms);
                int64_t epoch = a->epoch;
                pthread_mutex_unlock(&a->mu);
                if (quitting(a))
                        break;
                struct cove_err err;
                int64_t t0 = cove_mono_ns(), exp = 0;
                int r = d->cat_ops->node_lease_renew(d->cat, d->node_name, epoch, d->lease_ttl_ms,
                                                     &exp, &err);
                if (r == 0) {
                        pthread_mutex_lock(&a->mu);
                        a->deadline_ns = t0 + (d->lease_ttl_ms - margin_ms(d)) * 1000000;
                        int was = a->fenced, recheck = a->recheck;
                        pthread_mutex_unlock(&a->mu);
                        if (failing)
                                cove_info(&d->log, "cluster.lease", "node %s: lease renewed again",
                                          d->node_name);
                        /* after a new epoch, only what is still placed here is kept */
                        if (was) {
                                unfence(a, !recheck);
                        } else if (failing) {
                                /* the lease never lapsed: every guest is still ours; one
                                 * that missed its heartbeats meanwhile fenced itself */
                                cove_node_heartbeat_pause(d->node, 0);
                                size_t n;
                                struct owned *o = own_copy(a, &n);
                                thaw_guests(a, o, n);
                                free(o);
                        }
                        failing = 0;
                        continue;
                }
                /* no heartbeat while the lease is not confirmed */
                cove_node_heartbeat_pause(d->node, 1);
                if (err.kind != COVE_E_CONFLICT) {
                        if (!failing)
                                cove_warn(&d->log, "cluster.lease",
                                          "node %s: cannot renew the lease: %s (retrying; "
                                          "fencing if it lapses)",
                                          d->node_name, err.msg);
                        failing = 1;
                        continue;
                }
                /* the lease is gone (expired, or another epoch took it) */
                fence(a, "its lease expired or was taken");
                pthread_mutex_lock(&a->mu);
                a->epoch = 0;
                pthread_mutex_unlock(&a->mu);
                if (acquire(a) < 0)
                        break;
                failing = 0;
                unfence(a, 0);
                /* still fenced when the placements could not be read: try at the next tick */
        }
        return NULL;
}

static void *fence_main(void *arg)
{
        struct cove_agent *a = arg;
        pthread_mutex_lock(&a->mu);
        while (!a->quit) {
                int64_t left = (a->deadline_ns - cove_mono_ns()) / 1000000;
                if (a->fenced || left > 0) {
                        cv_wait_ms(a, a->fenced ? 1000 : left + 1);
                        continue;
                }
                pthread_mutex_unlock(&a->mu);
                fence(a, "its lease was not confirmed in time");
                pthread_mutex_lock(&a->mu);
        }
        pthread_mutex_unlock(&a->mu);
        return NULL;
}

/* ---- jobs ---- */

static int load_any(struct coved *d, const char *id, struct cove_sandbox_row *row,
                    struct cove_err *err)
{
        return cove_sandbox_load(d, NULL, id, row, err);
}

/* Run job j; *res: its result (an error object on failure). 1 when the job started an
 * instance (undone when the report is refused). */
static int run(struct cove_agent *a, const struct cove_job_row *j, json_t *args, json_t **res,
               int *ok)
{
        struct coved *d = a->d;
        struct cove_err err;
        memset(&err, 0, sizeof(err));
        const char *id = j->sandbox_id, *k = j->kind;
        json_t *out = NULL;
        int r = 0, started = 0;
        struct cove_sandbox_row row;
        if (!strcmp(k, "start")) {
                r = cove_sandbox_start_placed(d, id, json_object_get(args, "egress"), &out, &err);
                if (r == 0) {
                        own_set(a, id, j->generation);
                        started = 1;
                        out = json_pack("{s:o}", "sandbox", out);
                        coved_ports_adopt(d, id); /* its exposed ports, if any */
                }
        } else if (!strcmp(k, "stop")) {
                r = load_any(d, id, &row, &err);
                if (r < 0 && err.kind == COVE_E_NOT_FOUND) { /* a retry: already gone */
                        r = 0;
                } else if (r == 0) {
                        char tenant[64];
                        snprintf(tenant, sizeof(tenant), "%s", row.tenant);
                        cove_sandbox_row_clear(&row);
                        r = cove_sandbox_delete(d, tenant, id,
                                                json_is_true(json_object_get(args, "purge")), &err);
                        if (r < 0 && err.kind == COVE_E_NOT_FOUND)
                                r = 0;
                }
                if (r == 0) {
                        own_del(a, id);
                        out = json_object();
                }
        } else if (!strcmp(k, "pause")) {
                r = load_any(d, id, &row, &err);
                int done = r == 0 && !strcmp(row.state, "paused"); /* a retry */
                if (done)
                        out = json_pack("{s:o}", "sandbox", cove_sandbox_json(&row));
                if (r == 0)
                        cove_sandbox_row_clear(&row);
                /* the snapshot kind asked for ("full", "files"; null: the node's default) */
                const char *pk = json_string_value(json_object_get(args, "kind"));
                if (r == 0 && !done)
                        r = cove_sandbox_pause_kind(d, NULL, id, pk, &out, &err);
                if (r == 0)
                        own_del(a, id);
        } else if (!strcmp(k, "resume") || !strcmp(k, "recover")) {
                r = load_any(d, id, &row, &err);
                int done = r == 0 && !strcmp(row.state, "running") &&
                           !strcmp(row.node, d->node_name) && cove_node_pid(d->node, id) > 0;
                if (done)
                        out = json_pack("{s:o}", "sandbox", cove_sandbox_json(&row));
                if (r == 0)
                        cove_sandbox_row_clear(&row);
                if (r == 0 && !done) {
                        r = cove_sandbox_resume(d, NULL, id, args, &out, &err);
                        if (r == 0)
                                out = json_pack("{s:o}", "sandbox", out);
                }
                if (r == 0) {
                        own_set(a, id, j->generation);
                        started = !done;
                        coved_ports_adopt(d, id); /* its exposed ports come with it */
                }
        } else if (!strcmp(k, "snapshot")) {
                struct cove_snapshot_row snap;
                const char *label = json_string_value(json_object_get(args, "label"));
                const char *kind = json_string_value(json_object_get(args, "kind"));
                r = cove_snapshot_take(d, NULL, id, label, kind, 0, &snap, &err);
                if (r == 0)
                        out = json_pack("{s:o}", "snapshot", cove_snapshot_json(&snap));
        } else if (!strcmp(k, "rewind")) {
                r = cove_sandbox_rewind(d, NULL, id, args, &out, &err);
        } else if (!strcmp(k, "fork")) {
                r = cove_sandbox_fork(d, NULL, id, args, &out, &err);
                size_t i;
                json_t *v;
                json_array_foreach(json_object_get(out, "sandboxes"), i, v)
                {
                        const char *fid = json_string_value(json_object_get(v, "id"));
                        if (fid)
                                own_set(a, fid, 1); /* the control places each at generation 1 */
                }
        } else {
                r = cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "unknown job kind \"%.16s\"", k);
        }
        *ok = r == 0;
        if (r < 0) {
                json_decref(out);
                out = coved_job_error_json(&err);
                cove_warn(&d->log, "cluster.job", "job %lld (%s of %s) failed: %s",
                          (long long)j->id, k, id, err.msg);
        }
        *res = out ? out : json_object();
        return started;
}

static void run_job(struct cove_agent *a, struct cove_job_row *j)
{
        struct coved *d = a->d;
        int64_t epoch = j->claimed_epoch, t0 = cove_mono_ns();
        json_error_t je;
        json_t *args = j->args_json ? json_loads(j->args_json, JSON_DECODE_ANY, &je) : NULL;
        json_t *res = NULL;
        int ok = 0, started = 0;
        struct cove_err err;
        /* before acting: is the sandbox still placed here, at this generation, under a live
         * lease? (the same fenced check the report makes) */
        char state[16] = "stopped";
        struct cove_sandbox_row row;
        if (load_any(d, j->sandbox_id, &row, &err) == 0) {
                snprintf(state, sizeof(state), "%s", row.state);
                cove_sandbox_row_clear(&row);
        }
        /* what it observes now: a resume under way (a control's resume of the same
         * sandbox meanwhile answers 409 instead of placing it again) */
        if ((!strcmp(j->kind, "resume") || !strcmp(j->kind, "recover")) && strcmp(state, "running"))
                snprintf(state, sizeof(state), "resuming");
        if (d->cat_ops->placement_observe(d->cat, j->sandbox_id, d->node_name, epoch, j->generation,
                                          state, NULL, &err) < 0 &&
            err.kind == COVE_E_CONFLICT) {
                cove_warn(&d->log, "cluster.job", "job %lld (%s of %s) is stale, not run: %s",
                          (long long)j->id, j->kind, j->sandbox_id, err.msg);
                json_decref(args);
                return;
        }
        pthread_mutex_lock(&a->mu); /* its row writes are fenced at the job's generation */
        snprintf(a->job_sbx, sizeof(a->job_sbx), "%s", j->sandbox_id);
        a->job_gen = j->generation;
        a->job_fork = !strcmp(j->kind, "fork");
        pthread_mutex_unlock(&a->mu);
        started = run(a, j, args, &res, &ok);
        pthread_mutex_lock(&a->mu);
        a->job_sbx[0] = '\0';
        pthread_mutex_unlock(&a->mu);
        json_decref(args);
        int64_t hold = cove_testhooks_job_hold_ms();
        if (hold > 0) { /* until the time is up or the hook is taken away */
                cove_info(&d->log, "cluster.job", "test hook: holding job %lld for %lld ms",
                          (long long)j->id, (long long)hold);
                int64_t until = cove_mono_ns() + hold * 1000000;
                while (cove_mono_ns() < until && cove_testhooks_job_hold_ms() > 0 && !quitting(a))
                        usleep(100000);
        }
        char *txt = json_dumps(res, JSON_COMPACT | JSON_ENCODE_ANY);
        int r = d->cat_ops->job_finish(d->cat, j->id, d->node_name, epoch, j->generation, ok, txt,
                                       &err);
        free(txt);
        json_decref(res);
        if (r < 0) {
                if (err.kind == COVE_E_CONFLICT && started) {
                        struct cove_err e2;
                        if (cove_node_stop(d->node, j->sandbox_id, 0, &e2) < 0)
                                cove_warn(&d->log, "cluster.job", "%s", e2.msg);
                        own_del(a, j->sandbox_id);
                }
                cove_warn(
                    &d->log, "cluster.job", "job %lld (%s of %s): the report was refused (%s)%s",
                    (long long)j->id, j->kind, j->sandbox_id, err.msg,
                    err.kind == COVE_E_CONFLICT && started ? ": stopped the instance it started"
                                                           : "");
                return;
        }
        if (load_any(d, j->sandbox_id, &row, &err) == 0) {
                d->cat_ops->placement_observe(d->cat, j->sandbox_id, d->node_name, epoch,
                                              j->generation, row.state, NULL, &err);
                cove_sandbox_row_clear(&row);
        } else {
                d->cat_ops->placement_observe(d->cat, j->sandbox_id, d->node_name, epoch,
                                              j->generation, "stopped", NULL, &err);
        }
        cove_info(&d->log, "cluster.job", "job %lld: %s of %s %s in %.1f ms", (long long)j->id,
                  j->kind, j->sandbox_id, ok ? "done" : "failed",
                  (double)(cove_mono_ns() - t0) / 1e6);
}

static void *job_main(void *arg)
{
        struct cove_agent *a = arg;
        struct coved *d = a->d;
        struct cove_err err;
        d->cat_ops->wait_wakeup(d->cat, d->node_name, 0, &err); /* listen from now on */
        int failing = 0;
        while (!quitting(a)) {
                pthread_mutex_lock(&a->mu);
                int64_t epoch = a->epoch;
                int fenced = a->fenced;
                if (!epoch || fenced) {
                        cv_wait_ms(a, 200);
                        pthread_mutex_unlock(&a->mu);
                        continue;
                }
                pthread_mutex_unlock(&a->mu);
                struct cove_job_row j;
                int r = d->cat_ops->job_claim(d->cat, d->node_name, epoch, &j, &err);
                if (r == 0) {
                        failing = 0;
                        run_job(a, &j);
                        cove_job_row_clear(&j);
                        continue;
                }
                if (r < 0) {
                        if (!failing)
                                cove_warn(&d->log, "cluster.job", "claim: %s", err.msg);
                        failing = 1;
                        pthread_mutex_lock(&a->mu);
                        cv_wait_ms(a, 500);
                        pthread_mutex_unlock(&a->mu);
                        continue;
                }
                failing = 0;
                if (d->cat_ops->wait_wakeup(d->cat, d->node_name, 1000, &err) < 0) {
                        pthread_mutex_lock(&a->mu);
                        cv_wait_ms(a, 500);
                        pthread_mutex_unlock(&a->mu);
                }
        }
        return NULL;
}

/* ---- the node's own writes about its sandboxes ---- */

int coved_cluster_writable(struct coved *d)
{
        if (d->role == COVED_ROLE_ALL)
                return 1;
        if (d->role != COVED_ROLE_NODE)
                return 0;
        pthread_mutex_lock(&d->mu);
        int ok = 0;
        struct cove_agent *a = !d->quitting && d->cl ? d->cl->agent : NULL;
        if (a) {
                pthread_mutex_lock(&a->mu);
                ok = a->epoch > 0 && !a->fenced && cove_mono_ns() < a->deadline_ns;
                pthread_mutex_unlock(&a->mu);
        }
        pthread_mutex_unlock(&d->mu);
        return ok;
}

int coved_cluster_observe(struct coved *d, const char *sandbox_id, const char *state,
                          const char *desired, struct cove_err *err)
{
        if (d->role == COVED_ROLE_ALL)
                return 0;
        if (d->role != COVED_ROLE_NODE || !d->cl || !d->cl->agent)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s: no lease", sandbox_id);
        struct cove_agent *a = d->cl->agent;
        pthread_mutex_lock(&a->mu);
        int64_t epoch = a->fenced ? 0 : a->epoch;
        pthread_mutex_unlock(&a->mu);
        if (!epoch)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "sandbox %s: node %s holds no confirmed lease", sandbox_id,
                                     d->node_name);
        struct cove_placement_row pl;
        int r = d->cat_ops->placement_get(d->cat, sandbox_id, &pl, err);
        if (r < 0)
                return -1;
        if (r == 1 || strcmp(pl.node, d->node_name))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "sandbox %s is placed on %s, not on node %s", sandbox_id,
                                     r == 1 ? "no node" : pl.node, d->node_name);
        /* refused unless (this node, its live epoch, the generation just read) */
        return d->cat_ops->placement_observe(d->cat, sandbox_id, d->node_name, epoch, pl.generation,
                                             state, desired, err);
}

int coved_cluster_sandbox_update(struct coved *d, const struct cove_sandbox_row *s,
                                 struct cove_err *err)
{
        if (d->role != COVED_ROLE_NODE)
                return d->cat_ops->sandbox_update(d->cat, s, err);
        struct cove_agent *a = d->cl ? d->cl->agent : NULL;
        if (!a)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s: no lease", s->id);
        int64_t epoch, gen = 0;
        int forking;
        pthread_mutex_lock(&a->mu);
        epoch = a->fenced ? 0 : a->epoch;
        forking = a->job_sbx[0] && a->job_fork;
        if (a->job_sbx[0] && !strcmp(a->job_sbx, s->id))
                gen = a->job_gen;
        for (size_t i = 0; !gen && i < a->nown; i++)
                if (!strcmp(a->own[i].id, s->id))
                        gen = a->own[i].gen;
        pthread_mutex_unlock(&a->mu);
        if (!epoch)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "sandbox %s: node %s holds no confirmed lease", s->id,
                                     d->node_name);
        if (!gen) { /* not one it runs or works on: the generation it is placed here at now */
                struct cove_placement_row pl;
                int r = d->cat_ops->placement_get(d->cat, s->id, &pl, err);
                if (r < 0)
                        return -1;
                /* a fork's new sandboxes are placed by the control once the fork job is
                 * reported (that report is fenced): until then their rows have no
                 * placement to fence against */
                if (r == 1 && forking)
                        return d->cat_ops->sandbox_update(d->cat, s, err);
                if (r == 1 || strcmp(pl.node, d->node_name))
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "sandbox %s is placed on %s, not on node %s", s->id,
                                             r == 1 ? "no node" : pl.node, d->node_name);
                gen = pl.generation;
        }
        return d->cat_ops->sandbox_update_fenced(d->cat, s, d->node_name, epoch, gen, err);
}

/* ---- open, close ---- */

int cove_agent_open(struct coved *d, struct coved_cluster *cl, struct cove_err *err)
{
        struct cove_agent *a = calloc(1, sizeof(*a));
        if (!a)
                return cove_err_set(err, ENOMEM, "node agent");
        a->d = d;
        pthread_mutex_init(&a->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&a->cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_mutex_lock(&d->mu); /* coved_cluster_writable reads it under d->mu */
        cl->agent = a;
        pthread_mutex_unlock(&d->mu);
        describe(a);
        cove_info(&d->log, "cluster.node", "node %s at %s announces %s", d->node_name, d->advertise,
                  a->row.features);
        if (acquire(a) < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "node %s: stopped before its "
                                     "lease was acquired",
                                     d->node_name);
        /* the lease is confirmed: heartbeats to the guests, then settle what the catalog
         * still calls live here (its writes are fenced by the lease: coved_cluster_observe) */
        cove_node_heartbeat_pause(d->node, 0);
        coved_reconcile(d);
        int e = pthread_create(&a->fence_thr, NULL, fence_main, a);
        if (!e) {
                a->fence_started = 1;
                e = pthread_create(&a->lease_thr, NULL, lease_main, a);
        }
        if (!e) {
                a->lease_started = 1;
                e = pthread_create(&a->job_thr, NULL, job_main, a);
        }
        if (e)
                return cove_err_set(err, e, "node agent threads");
        a->job_started = 1;
        return 0;
}

void cove_agent_close(struct coved *d, struct coved_cluster *cl)
{
        (void)d;
        struct cove_agent *a = cl->agent;
        if (!a)
                return;
        pthread_mutex_lock(&a->mu);
        a->quit = 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        if (a->job_started)
                pthread_join(a->job_thr, NULL);
        if (a->lease_started)
                pthread_join(a->lease_thr, NULL);
        if (a->fence_started)
                pthread_join(a->fence_thr, NULL);
        free(a->own);
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        free(a);
        cl->agent = NULL;
}
