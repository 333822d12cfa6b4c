/* Lifecycle through jobs, on a control replica (control/cluster.h, docs/cluster.md
 * "Lifecycle"): a call writes the sandbox's desired state, its placement and a job in one
 * catalog transaction, then waits for the job's outcome. The wait works from any replica:
 * the outcome is read from the catalog (job_get), woken by the node's finish (PostgreSQL
 * NOTIFY cove_job_done through one waiter thread per process) and polled every second as
 * a fallback, so a lost notification only costs that second. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/catsrv.h"
#include "cluster/cluster_internal.h"
#include "control/cluster.h"
#include "control/egress.h"
#include "control/placement.h"
#include "control/snapshot.h"
#include "control/tenant.h"
#include "util/cleanup.h"
#include "util/util.h"

#define POLL_MS 1000
/* How long a caller waits for its node's outcome, per job kind (docs/cluster.md "Jobs"):
 * a start boots an instance; a stop only ends one; pause, snapshot, resume and the rest
 * move a sandbox's files (and memory) to or from the store. A node whose lease lapsed is
 * not waited for (node_gone): 503 at once, but for a start. */
#define START_TIMEOUT_MS 120000
#define STOP_TIMEOUT_MS 60000
#define OP_TIMEOUT_MS 180000

static const char *const codes[] = {
    [COVE_E_INTERNAL] = "internal",       [COVE_E_BAD_REQUEST] = "bad_request",
    [COVE_E_NOT_FOUND] = "not_found",     [COVE_E_CONFLICT] = "conflict",
    [COVE_E_LIMIT] = "limit_exceeded",    [COVE_E_UNAUTHORIZED] = "unauthorized",
    [COVE_E_UNAVAILABLE] = "unavailable", [COVE_E_KEY_REVOKED] = "key_revoked",
};

json_t *coved_job_error_json(const struct cove_err *err)
{
        unsigned k = (unsigned)err->kind;
        if (k >= COVE_ARRAY_SIZE(codes))
                k = COVE_E_INTERNAL;
        /* a node's disk that filled up is the node's trouble, not the request's */
        if (k == COVE_E_INTERNAL && (err->errnum == ENOSPC || err->errnum == EDQUOT ||
                                     err->errnum == EIO || err->errnum == EROFS))
                k = COVE_E_UNAVAILABLE;
        return json_pack("{s:{s:s, s:s}}", "error", "code", codes[k], "message",
                         err->msg[0] ? err->msg : "error");
}

int coved_job_error_from(json_t *result, struct cove_err *err)
{
        json_t *e = json_object_get(result, "error");
        if (!e)
                return 0;
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        enum cove_err_kind kind = COVE_E_INTERNAL;
        for (size_t i = 0; code && i < COVE_ARRAY_SIZE(codes); i++)
                if (codes[i] && !strcmp(codes[i], code))
                        kind = (enum cove_err_kind)i;
        return cove_err_setk(err, kind, 0, "%.480s", msg ? msg : "the node failed the job");
}

int coved_cluster_mine(const struct coved *d, const struct cove_sandbox_row *row)
{
        return d->role != COVED_ROLE_NODE || !strcmp(row->node, d->node_name);
}

/* ---- the waiter (role control) ---- */

static void *waiter_main(void *arg)
{
        struct coved *d = arg;
        struct coved_cluster *cl = d->cl;
        int failing = 0;
        for (;;) {
                pthread_mutex_lock(&cl->mu);
                int quit = cl->quit;
                pthread_mutex_unlock(&cl->mu);
                if (quit)
                        break;
                struct cove_err err;
                int r = d->cat_ops->wait_wakeup(d->cat, NULL, POLL_MS, &err);
                if (r < 0 && !failing)
                        cove_warn(&d->log, "cluster.wait", "%s (polling jobs meanwhile)", err.msg);
                failing = r < 0;
                if (r == 0) /* nodes' long polls through this replica (api/routes_cluster.c) */
                        cove_catsrv_woken(coved_catsrv(d));
                pthread_mutex_lock(&cl->mu);
                cl->seq++; /* woken or not: waiters re-read their job (the poll fallback) */
                pthread_cond_broadcast(&cl->cv);
                if (r < 0 && !cl->quit) {
                        struct timespec ts;
                        clock_gettime(CLOCK_REALTIME, &ts);
                        ts.tv_nsec += 500 * 1000000L;
                        if (ts.tv_nsec >= 1000000000L) {
                                ts.tv_sec++;
                                ts.tv_nsec -= 1000000000L;
                        }
                        pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
                }
                pthread_mutex_unlock(&cl->mu);
        }
        return NULL;
}

int coved_cluster_open(struct coved *d, struct cove_err *err)
{
        if (d->role == COVED_ROLE_ALL)
                return 0;
        struct coved_cluster *cl = calloc(1, sizeof(*cl));
        if (!cl)
                return cove_err_set(err, ENOMEM, "cluster");
        pthread_mutex_init(&cl->mu, NULL);
        pthread_cond_init(&cl->cv, NULL);
        pthread_mutex_lock(&d->mu); /* coved_cluster_writable reads it under d->mu */
        d->cl = cl;
        pthread_mutex_unlock(&d->mu);
        if (d->role == COVED_ROLE_NODE)
                return cove_agent_open(d, cl, err);
        /* the first call starts listening, so no finish after this is missed */
        struct cove_err e2;
        if (d->cat_ops->wait_wakeup(d->cat, NULL, 0, &e2) < 0)
                cove_warn(&d->log, "cluster.wait", "%s (polling jobs meanwhile)", e2.msg);
        int e = pthread_create(&cl->waiter, NULL, waiter_main, d);
        if (e)
                return cove_err_set(err, e, "job waiter thread");
        cl->waiter_started = 1;
        return 0;
}

void coved_cluster_close(struct coved *d)
{
        struct coved_cluster *cl = d->cl;
        if (!cl)
                return;
        pthread_mutex_lock(&cl->mu);
        cl->quit = 1;
        pthread_cond_broadcast(&cl->cv);
        pthread_mutex_unlock(&cl->mu);
        if (cl->waiter_started)
                pthread_join(cl->waiter, NULL);
        if (cl->agent)
                cove_agent_close(d, cl);
        pthread_cond_destroy(&cl->cv);
        pthread_mutex_destroy(&cl->mu);
        free(cl);
        d->cl = NULL;
}

/* 1 with err (UNAVAILABLE, naming the node) when node cannot run a job now: its lease
 * lapsed (killed, stopped, cut off) or it is marked lost; 0 when it holds a live lease or
 * the catalog cannot tell (the wait goes on until its timeout). */
static int node_gone(struct coved *d, const char *node, const char *kind, const char *sandbox_id,
                     struct cove_err *err)
{
        struct cove_node_row row;
        struct cove_err e2;
        int r = coved_node_get(d, node, &row, &e2);
        if (r < 0)
                return 0;
        if (r == 1) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                              "%s of sandbox %s: its node %s is not known to the catalog", kind,
                              sandbox_id, node);
                return 1;
        }
        int64_t now = cove_now_ms();
        if (strcmp(row.state, "lost") && row.lease_expires_at > now)
                return 0;
        cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                      "%s of sandbox %s: its node %s is unavailable (%s%lld s ago); the job runs "
                      "if the node comes back with the sandbox still placed on it",
                      kind, sandbox_id, node,
                      strcmp(row.state, "lost") ? "its lease lapsed "
                                                : "marked lost, its lease lapsed ",
                      (long long)((now - row.lease_expires_at) / 1000));
        return 1;
}

/* Wait for job_id's outcome: 0 with *result (done), -1 with the node's error (failed) or
 * UNAVAILABLE after timeout_ms, or (but for a start) as soon as node, the one the job is
 * for, lost its lease. */
static int wait_job(struct coved *d, int64_t job_id, const char *sandbox_id, const char *kind,
                    const char *node, int timeout_ms, json_t **result, struct cove_err *err)
{
        struct coved_cluster *cl = d->cl;
        int64_t until = cove_mono_ns() + (int64_t)timeout_ms * 1000000;
        for (;;) {
                pthread_mutex_lock(&cl->mu);
                uint64_t seq = cl->seq;
                pthread_mutex_unlock(&cl->mu);
                struct cove_job_row j;
                int r = d->cat_ops->job_get(d->cat, job_id, &j, err);
                if (r < 0)
                        return cove_err_wrap(err, "%s of sandbox %s", kind, sandbox_id);
                if (r == 1)
                        return cove_err_setk(err, COVE_E_INTERNAL, 0, "job %lld is gone",
                                             (long long)job_id);
                int fin = !strcmp(j.state, "done") || !strcmp(j.state, "failed");
                if (fin) {
                        json_error_t je;
                        json_t *res =
                            j.result_json ? json_loads(j.result_json, JSON_DECODE_ANY, &je) : NULL;
                        int ok = !strcmp(j.state, "done");
                        cove_job_row_clear(&j);
                        if (json_is_string(res) && !strcmp(json_string_value(res), "superseded")) {
                                json_decref(res);
                                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                                     "%s of sandbox %s: superseded by a newer "
                                                     "placement of it",
                                                     kind, sandbox_id);
                        }
                        if (!json_is_object(res)) {
                                json_decref(res);
                                if (ok) {
                                        *result = json_object();
                                        return 0;
                                }
                                return cove_err_setk(err, COVE_E_INTERNAL, 0,
                                                     "%s of sandbox %s failed on its node", kind,
                                                     sandbox_id);
                        }
                        if (coved_job_error_from(res, err) < 0 || !ok) {
                                json_decref(res);
                                if (ok || !err->msg[0])
                                        cove_err_setk(err, COVE_E_INTERNAL, 0,
                                                      "%s of sandbox %s failed on its node", kind,
                                                      sandbox_id);
                                return -1;
                        }
                        *result = res;
                        return 0;
                }
                char who[64];
                snprintf(who, sizeof(who), "%s", j.claimed_by[0] ? j.claimed_by : "");
                cove_job_row_clear(&j);
                /* a start waits its whole timeout: a node killed after it started the
                 * instance takes the job back when it restarts and converges */
                if (node && node[0] && strcmp(kind, "start") &&
                    node_gone(d, node, kind, sandbox_id, err))
                        return -1;
                int64_t left = (until - cove_mono_ns()) / 1000000;
                if (left <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "%s of sandbox %s: its node %s did not report "
                                             "within %d s (job %lld %s; it runs when the node "
                                             "comes back)",
                                             kind, sandbox_id, who[0] ? who : "(unclaimed)",
                                             timeout_ms / 1000, (long long)job_id,
                                             who[0] ? "claimed" : "queued");
                if (left > POLL_MS)
                        left = POLL_MS;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += left / 1000;
                ts.tv_nsec += (left % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_mutex_lock(&cl->mu);
                while (cl->seq == seq && !cl->quit)
                        if (pthread_cond_timedwait(&cl->cv, &cl->mu, &ts) != 0)
                                break;
                int quit = cl->quit;
                pthread_mutex_unlock(&cl->mu);
                pthread_mutex_lock(&d->mu);
                quit |= d->quitting;
                pthread_mutex_unlock(&d->mu);
                if (quit)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "%s of sandbox %s: this replica is stopping", kind,
                                             sandbox_id);
        }
}

int coved_cluster_step(struct coved *d, const char *sandbox_id, const char *place_on,
                       const char *desired, const char *kind, json_t *args,
                       int64_t expect_generation, int timeout_ms, json_t **result,
                       struct cove_err *err)
{
        if (d->role != COVED_ROLE_CONTROL || !d->cl)
                return cove_err_setk(err, COVE_E_INTERNAL, 0,
                                     "lifecycle jobs are written by a control replica");
        char *txt = args ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        if (args && !txt)
                return cove_err_set(err, ENOMEM, "job arguments");
        int64_t gen = 0, job = 0;
        /* the node the job is for: the one it is placed on now, or the new one */
        char node[64] = "";
        if (place_on) {
                snprintf(node, sizeof(node), "%s", place_on);
        } else if (kind) {
                struct cove_placement_row pl;
                struct cove_err e2;
                if (d->cat_ops->placement_get(d->cat, sandbox_id, &pl, &e2) == 0)
                        snprintf(node, sizeof(node), "%s", pl.node);
        }
        int r = d->cat_ops->placement_write(d->cat, sandbox_id, place_on, desired, kind, txt,
                                            expect_generation, &gen, &job, err);
        free(txt);
        if (r < 0)
                return cove_err_wrap(err, "%s of sandbox %s", kind, sandbox_id);
        if (!kind || !job) {
                *result = json_object();
                return 0;
        }
        cove_debug(&d->log, "cluster.job", "job %lld: %s of %s (generation %lld%s%s)",
                   (long long)job, kind, sandbox_id, (long long)gen, place_on ? " on " : "",
                   place_on ? place_on : "");
        return wait_job(d, job, sandbox_id, kind, node, timeout_ms, result, err);
}

/* ---- the lifecycle calls (role control) ---- */

static int load(struct coved *d, const char *tenant, const char *id, struct cove_sandbox_row *row,
                struct cove_err *err)
{
        return cove_sandbox_load(d, tenant, id, row, err);
}

static int place(struct coved *d, const struct cove_sandbox_row *s, const char *prefer,
                 char node[64], struct cove_err *err)
{
        struct coved_place_want w = {
            .runtime = s->runtime,
            .template_name = s->template_name,
            .cpus = s->cpus,
            .memory_mb = s->memory_mb,
            .disk_mb = s->disk_mb,
            .prefer = prefer,
        };
        char why[256] = "";
        int r = coved_place(d, &w, node, why, sizeof(why), err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "no node can take sandbox %s: %s",
                                     s->id, why);
        return r;
}

int coved_cluster_create(struct coved *d, const char *tenant, struct cove_sandbox_row *s,
                         json_t *egress, json_t **out, struct cove_err *err)
{
        char node[64];
        if (cove_id_new("sbx_", s->id, sizeof(s->id), err) < 0 ||
            place(d, s, NULL, node, err) < 0) {
                coved_quota_unlock(d);
                return -1;
        }
        snprintf(s->node, sizeof(s->node), "%s", node);
        snprintf(s->state, sizeof(s->state), "starting");
        s->uid_base = 0; /* the node's: a uid range is a host's */
        s->created_at = cove_now_ms();
        s->expires_at = s->created_at + (int64_t)s->timeout_s * 1000;
        int ins = d->cat_ops->sandbox_insert(d->cat, s, err);
        coved_quota_unlock(d); /* the row counts from here on */
        if (ins < 0)
                return -1;
        int64_t t0 = cove_mono_ns();
        json_t *args = egress ? json_pack("{s:O}", "egress", egress) : NULL;
        json_t *res = NULL;
        int r = coved_cluster_step(d, s->id, node, "running", "start", args, 0, START_TIMEOUT_MS,
                                   &res, err);
        json_decref(args);
        json_t *sb = r == 0 ? json_object_get(res, "sandbox") : NULL;
        if (r == 0 && !json_is_object(sb))
                r = cove_err_setk(err, COVE_E_INTERNAL, 0, "node %s answered no sandbox", node);
        if (r < 0) {
                struct cove_err e2;
                json_t *ig = NULL;
                if (err->kind == COVE_E_UNAVAILABLE) {
                        /* the node may still start it: have it stopped when it comes back */
                        if (d->cat_ops->placement_write(d->cat, s->id, NULL, "stopped", "stop",
                                                        "{\"purge\":true}", -1, NULL, NULL,
                                                        &e2) < 0)
                                cove_warn(&d->log, "sandbox.create", "%s", e2.msg);
                } else {
                        /* the node undid its part; the row and the placement go */
                        coved_cluster_step(d, s->id, NULL, "stopped", NULL, NULL, -1, 0, &ig, &e2);
                        d->cat_ops->sandbox_delete(d->cat, s->id, &e2);
                }
                json_decref(ig);
                json_decref(res);
                pthread_mutex_lock(&d->mu);
                d->m.create_failures++;
                pthread_mutex_unlock(&d->mu);
                cove_warn(&d->log, "sandbox.create", "sandbox %s on node %s: %s", s->id, node,
                          err->msg);
                return -1;
        }
        int64_t dt = cove_mono_ns() - t0;
        pthread_mutex_lock(&d->mu);
        d->m.creates++;
        d->m.create_ns_sum += (uint64_t)dt;
        pthread_mutex_unlock(&d->mu);
        cove_info(&d->log, "sandbox.create",
                  "sandbox %s template %s tenant %s on node %s in %.2f ms", s->id, s->template_name,
                  tenant, node, (double)dt / 1e6);
        coved_audit_control(d, tenant, s->id, "create",
                            json_pack("{s:s, s:b, s:s}", "template", s->template_name, "egress",
                                      egress != NULL, "node", node));
        *out = json_incref(sb);
        json_decref(res);
        return 0;
}

int coved_cluster_delete(struct coved *d, const char *tenant, const char *id, int purge,
                         struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (load(d, tenant, id, &row, err) < 0)
                return -1;
        cove_sandbox_row_clear(&row);
        json_t *args = json_pack("{s:b}", "purge", purge != 0), *res = NULL;
        int r = coved_cluster_step(d, id, NULL, "stopped", "stop", args, -1, STOP_TIMEOUT_MS, &res,
                                   err);
        json_decref(args);
        json_decref(res);
        if (r < 0)
                return -1;
        pthread_mutex_lock(&d->mu);
        d->m.deletes++;
        pthread_mutex_unlock(&d->mu);
        return 0;
}

int coved_cluster_pause(struct coved *d, const char *tenant, const char *id, const char *kind,
                        json_t **out, struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (load(d, tenant, id, &row, err) < 0)
                return -1;
        int running = !strcmp(row.state, "running");
        if (!running)
                cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is %s, not running", id,
                              row.state);
        cove_sandbox_row_clear(&row);
        if (!running)
                return -1;
        /* the user's pause: desired "paused" (a drain's pause keeps "running": nodes.c) */
        json_t *args = json_pack("{s:s, s:o}", "reason", "user", "kind",
                                 kind ? json_string(kind) : json_null());
        int r =
            coved_cluster_step(d, id, NULL, "paused", "pause", args, -1, OP_TIMEOUT_MS, out, err);
        json_decref(args);
        return r;
}

int coved_cluster_resume(struct coved *d, const char *tenant, const char *id, json_t *body,
                         json_t **out, struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (load(d, tenant, id, &row, err) < 0)
                return -1;
        int r = 0;
        char node[64];
        /* the placement's generation before the state is judged: placing it is a compare-
         * and-set on it, so of two replicas resuming it at once one places it, the other
         * gets 409 conflict (it does not wait for the winner: the sandbox is placed once) */
        struct cove_placement_row pl;
        int64_t gen = 0;
        int pr = d->cat_ops->placement_get(d->cat, id, &pl, err);
        if (pr < 0) {
                cove_sandbox_row_clear(&row);
                return -1;
        }
        if (pr == 0)
                gen = pl.generation;
        cove_sandbox_row_clear(&row);
        if (load(d, tenant, id, &row, err) < 0) /* as of that generation or newer */
                return -1;
        struct cove_err e2;
        if (strcmp(row.state, "paused") && strcmp(row.state, "stopped") &&
            strcmp(row.state, "error"))
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "sandbox %s is %s: only a paused or stopped sandbox resumes", id,
                                  row.state);
        /* placed to run and not reported done by its node yet (observed nothing since the
         * placement, or "resuming" while its node runs the job): another call's resume is
         * under way although the row still says paused. Unless that node is gone: then a
         * new placement may take it over. */
        else if (pr == 0 && !strcmp(pl.desired_state, "running") &&
                 (!pl.observed_state[0] || !strcmp(pl.observed_state, "resuming")) &&
                 !node_gone(d, pl.node, "resume", id, &e2))
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "sandbox %s is being resumed by another call (on node %s): "
                                  "not resumed twice",
                                  id, pl.node);
        /* the node that ran it last holds its chunks in its cache */
        if (r == 0)
                r = place(d, &row, row.node[0] ? row.node : NULL, node, err);
        cove_sandbox_row_clear(&row);
        if (r < 0)
                return -1;
        json_t *res = NULL;
        if (coved_cluster_step(d, id, node, "running", "resume", body, gen, OP_TIMEOUT_MS, &res,
                               err) < 0) {
                if (err->kind == COVE_E_CONFLICT && strstr(err->msg, "generation"))
                        cove_err_setk(err, COVE_E_CONFLICT, 0,
                                      "sandbox %s is being resumed by another call (placed "
                                      "meanwhile): not resumed twice",
                                      id);
                return -1;
        }
        json_t *sb = json_object_get(res, "sandbox");
        if (!json_is_object(sb)) {
                json_decref(res);
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "node %s answered no sandbox", node);
        }
        *out = json_incref(sb);
        json_decref(res);
        return 0;
}

/* A step on the node the sandbox is on, keeping its desired state. */
static int in_place(struct coved *d, const char *tenant, const char *id, const char *kind,
                    json_t *body, json_t **res, struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (load(d, tenant, id, &row, err) < 0)
                return -1;
        cove_sandbox_row_clear(&row);
        struct cove_placement_row pl;
        int r = d->cat_ops->placement_get(d->cat, id, &pl, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is on no node", id);
        if (r < 0)
                return -1;
        return coved_cluster_step(d, id, NULL, pl.desired_state, kind, body, -1, OP_TIMEOUT_MS, res,
                                  err);
}

int coved_cluster_rewind(struct coved *d, const char *tenant, const char *id, json_t *body,
                         json_t **out, struct cove_err *err)
{
        return in_place(d, tenant, id, "rewind", body, out, err);
}

int coved_cluster_fork(struct coved *d, const char *tenant, const char *id, json_t *body,
                       json_t **out, struct cove_err *err)
{
        json_t *res = NULL;
        if (in_place(d, tenant, id, "fork", body, &res, err) < 0)
                return -1;
        /* the forks run on the node of their source: place them there */
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(res, "sandboxes"), i, v)
        {
                const char *fid = json_string_value(json_object_get(v, "id"));
                const char *node = json_string_value(json_object_get(v, "node"));
                struct cove_err e2;
                if (fid && node &&
                    d->cat_ops->placement_write(d->cat, fid, node, "running", NULL, NULL, 0, NULL,
                                                NULL, &e2) < 0)
                        cove_warn(&d->log, "sandbox.fork", "placement of %s: %s", fid, e2.msg);
        }
        *out = res;
        return 0;
}

int coved_cluster_snapshot(struct coved *d, const char *tenant, const char *id, const char *label,
                           const char *kind, struct cove_snapshot_row *out, struct cove_err *err)
{
        json_t *args = json_object();
        if (label)
                json_object_set_new(args, "label", json_string(label));
        if (kind)
                json_object_set_new(args, "kind", json_string(kind));
        json_t *res = NULL;
        int r = in_place(d, tenant, id, "snapshot", args, &res, err);
        json_decref(args);
        if (r < 0)
                return -1;
        const char *sid =
            json_string_value(json_object_get(json_object_get(res, "snapshot"), "id"));
        struct cove_snapshot_row tmp;
        if (!sid)
                r = cove_err_setk(err, COVE_E_INTERNAL, 0, "the node answered no snapshot");
        else
                r = cove_snapshot_load(d, NULL, sid, out ? out : &tmp, err);
        json_decref(res);
        return r;
}
