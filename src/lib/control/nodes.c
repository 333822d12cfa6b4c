/* Node list and admin, drains, node-loss recovery (control/nodes.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/nodeauth.h"
#include "control/audit.h"
#include "control/cluster.h"
#include "control/coved.h"
#include "control/nodes.h"
#include "control/placement.h"
#include "util/util.h"

struct coved_nodes {
        pthread_t th_sweep, th_drain;
        pthread_mutex_t mu;
        pthread_cond_t cv;
        int quit, kicked;
        json_t *retry; /* sandbox id → mono ms before which a failed move is not retried */
        /* node name → {"epoch", "since": mono ms it was first seen, "tried": {id: true}}:
         * a node's restart (resume_restarted) */
        json_t *epochs;
};

#define MOVE_RETRY_MS 10000

/* 1 if a move of id failed less than MOVE_RETRY_MS ago (this replica's memory only: a
 * restart retries at once) */
static int move_backoff(struct coved *d, const char *id)
{
        struct coved_nodes *n = d->nodes;
        if (!n)
                return 0;
        pthread_mutex_lock(&n->mu);
        json_int_t until = json_integer_value(json_object_get(n->retry, id));
        pthread_mutex_unlock(&n->mu);
        return until > cove_mono_ns() / 1000000;
}

static void move_failed(struct coved *d, const char *id)
{
        struct coved_nodes *n = d->nodes;
        if (!n)
                return;
        pthread_mutex_lock(&n->mu);
        json_object_set_new(n->retry, id, json_integer(cove_mono_ns() / 1000000 + MOVE_RETRY_MS));
        pthread_mutex_unlock(&n->mu);
}

/* ---- reading the catalog ---- */

static const struct cove_node_row *node_find(const struct coved_node_rows *x, const char *name)
{
        for (size_t i = 0; i < x->n; i++)
                if (!strcmp(x->v[i].name, name))
                        return &x->v[i];
        return NULL;
}

/* The sandboxes not stopped, oldest first: ids and nodes as their rows say. */
struct sbx_ids {
        json_t *ids;   /* array of ids */
        json_t *count; /* object node → count of sandboxes (NULL: not counted) */
};

static int collect_sbx(const struct cove_sandbox_row *row, void *arg)
{
        struct sbx_ids *x = arg;
        if (x->ids)
                json_array_append_new(x->ids, json_string(row->id));
        if (x->count && row->node[0])
                json_object_set_new(
                    x->count, row->node,
                    json_integer(json_integer_value(json_object_get(x->count, row->node)) + 1));
        return 0;
}

#define LIVE_STATES "starting,running,pausing,paused,resuming,error"

/* Ids of the sandboxes placed on node whose desired state is not stopped, oldest first
 * (new reference), NULL on error. stopped: those stopped (desired and row) as well. */
static json_t *placed_on(struct coved *d, const char *node, int stopped, struct cove_err *err)
{
        struct sbx_ids x = {json_array(), NULL};
        if (d->cat_ops->sandbox_list(d->cat, NULL, stopped ? LIVE_STATES ",stopped" : LIVE_STATES,
                                     collect_sbx, &x, err) < 0) {
                json_decref(x.ids);
                return NULL;
        }
        json_t *out = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(x.ids, i, v)
        {
                struct cove_placement_row p;
                int r = d->cat_ops->placement_get(d->cat, json_string_value(v), &p, err);
                if (r < 0) {
                        json_decref(x.ids);
                        json_decref(out);
                        return NULL;
                }
                if (r == 0 && !strcmp(p.node, node) &&
                    (stopped || strcmp(p.desired_state, "stopped") != 0))
                        json_array_append(out, v);
        }
        json_decref(x.ids);
        return out;
}

/* ---- the node list and admin ---- */

static json_t *res_json(int64_t cpus, int64_t mem, int64_t disk)
{
        return json_pack("{s:I, s:I, s:I}", "cpus", (json_int_t)cpus, "memory_mb", (json_int_t)mem,
                         "disk_mb", (json_int_t)disk);
}

static json_t *node_json(const struct cove_node_row *r, int64_t now, json_int_t sandboxes)
{
        char exp[40], seen[40];
        cove_rfc3339(r->lease_expires_at, exp, sizeof(exp));
        cove_rfc3339(r->last_seen, seen, sizeof(seen));
        json_error_t je;
        json_t *feat = json_loads(r->features, 0, &je);
        if (!json_is_object(feat)) {
                json_decref(feat);
                feat = json_object();
        }
        return json_pack("{s:s, s:s, s:s, s:{s:I, s:o, s:b}, s:o, s:o, s:o, s:I, s:o}", "name",
                         r->name, "state", r->state, "address", r->address, "lease", "epoch",
                         (json_int_t)r->epoch, "expires_at",
                         r->lease_expires_at ? json_string(exp) : json_null(), "live",
                         r->epoch > 0 && r->lease_expires_at > now, "last_seen",
                         r->last_seen ? json_string(seen) : json_null(), "capacity",
                         res_json(r->cpus, r->memory_mb, r->disk_mb), "allocated",
                         res_json(r->alloc_cpus, r->alloc_memory_mb, r->alloc_disk_mb), "sandboxes",
                         sandboxes, "features", feat);
}

int coved_nodes_list(struct coved *d, json_t **out, struct cove_err *err)
{
        if (d->role == COVED_ROLE_ALL) { /* one process: no cluster nodes */
                *out = json_pack("{s:[]}", "nodes");
                return 0;
        }
        struct coved_node_rows x;
        if (coved_nodes_read(d, &x, err) < 0)
                return -1;
        struct sbx_ids c = {NULL, json_object()};
        if (d->cat_ops->sandbox_list(d->cat, NULL, LIVE_STATES, collect_sbx, &c, err) < 0) {
                json_decref(c.count);
                free(x.v);
                return -1;
        }
        json_t *arr = json_array();
        int64_t now = cove_now_ms();
        for (size_t i = 0; i < x.n; i++)
                json_array_append_new(
                    arr, node_json(&x.v[i], now,
                                   json_integer_value(json_object_get(c.count, x.v[i].name))));
        json_decref(c.count);
        free(x.v);
        *out = json_pack("{s:o}", "nodes", arr);
        return 0;
}

static void nodes_kick(struct coved *d)
{
        struct coved_nodes *n = d->nodes;
        if (!n)
                return;
        pthread_mutex_lock(&n->mu);
        n->kicked = 1;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
}

int coved_node_admin(struct coved *d, const char *name, const char *action, const char *actor,
                     json_t **out, struct cove_err *err)
{
        const char *to = !strcmp(action, "cordon")     ? "cordoned"
                         : !strcmp(action, "uncordon") ? "ready"
                         : !strcmp(action, "drain")    ? "draining"
                                                       : NULL;
        if (!to)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "unknown node action \"%.32s\": cordon, uncordon or drain",
                                     action);
        if (d->role == COVED_ROLE_ALL)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                     "no node %.64s: this coved runs in role all (one process, no "
                                     "cluster nodes)",
                                     name);
        if (!cove_node_name_valid(name)) /* never echoed: it may be any bytes */
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                     "no such node (names are 1 to %d of a-z, 0-9 and -)",
                                     COVE_NODE_NAME_MAX);
        struct coved_node_rows x;
        if (coved_nodes_read(d, &x, err) < 0)
                return -1;
        const struct cove_node_row *r = node_find(&x, name);
        if (!r) {
                free(x.v);
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no node %.64s", name);
        }
        if (!strcmp(r->state, "lost")) {
                free(x.v);
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "node %s is lost: it becomes ready when it takes its lease "
                                     "again",
                                     name);
        }
        char from[16];
        snprintf(from, sizeof(from), "%s", r->state);
        free(x.v);
        int rc = d->cat_ops->node_set_state(d->cat, name, to, err);
        if (rc < 0)
                return -1;
        if (rc == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no node %.64s", name);
        char act[24];
        snprintf(act, sizeof(act), "node.%s", action);
        cove_audit_log(d->audit, "default", "", "control", act, "",
                       json_pack("{s:s, s:s, s:s, s:s}", "node", name, "from", from, "to", to, "by",
                                 actor ? actor : ""));
        cove_info(&d->log, "node.state", "node %s: %s → %s (%s)", name, from, to, action);
        if (!strcmp(to, "draining"))
                nodes_kick(d);
        json_t *list = NULL;
        if (coved_nodes_list(d, &list, err) < 0)
                return -1;
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(list, "nodes"), i, v)
        {
                if (!strcmp(json_string_value(json_object_get(v, "name")), name)) {
                        *out = json_incref(v);
                        json_decref(list);
                        return 0;
                }
        }
        json_decref(list);
        return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no node %.64s", name);
}

/* ---- moving a sandbox ---- */

/* placement_write with job arguments (args_json: JSON text or NULL). */
static int place_write(struct coved *d, const char *id, const char *node, const char *desired,
                       const char *kind, const char *args_json, int64_t expect, int64_t *job,
                       struct cove_err *err)
{
        return d->cat_ops->placement_write(d->cat, id, node, desired, kind, args_json, expect, NULL,
                                           job, err);
}

static struct coved_place_want want_of(const struct cove_sandbox_row *s, const char *avoid)
{
        struct coved_place_want w = {.runtime = s->runtime,
                                     .template_name = s->template_name,
                                     .cpus = s->cpus,
                                     .memory_mb = s->memory_mb,
                                     .disk_mb = s->disk_mb,
                                     .avoid = avoid};
        return w;
}

/* Place w, a compatible node for a full snapshot when need_full and one exists, else any
 * (the resume then restores files; the node says why in its result). 0 / 1 / -1 as
 * coved_place; *full says which. */
static int place_maybe_full(struct coved *d, struct coved_place_want *w, int need_full,
                            const char *full_from, char node[64], int *full, char *why, size_t cap,
                            struct cove_err *err)
{
        *full = 0;
        if (need_full) {
                w->need_full = 1;
                w->full_from = full_from;
                int r = coved_place(d, w, node, why, cap, err);
                if (r != 1) {
                        *full = r == 0;
                        return r;
                }
        }
        w->need_full = 0;
        w->full_from = NULL;
        return coved_place(d, w, node, why, cap, err);
}

static int64_t mono_ms(void)
{
        return cove_mono_ns() / 1000000;
}

/* The newest snapshot of sandbox id (any tenant): 0 found, 1 none, -1 error. */
static int newest_cb(const struct cove_snapshot_row *row, void *arg)
{
        *(struct cove_snapshot_row *)arg = *row;
        return -1; /* newest first: the first one is it */
}

static int newest_snapshot(struct coved *d, const char *id, struct cove_snapshot_row *out,
                           struct cove_err *err)
{
        memset(out, 0, sizeof(*out));
        if (d->cat_ops->snapshot_list(d->cat, NULL, id, newest_cb, out, err) < 0)
                return -1;
        return out->id[0] ? 0 : 1;
}

/* Move a sandbox at rest (paused, or stopped by its node's timeout: nothing runs, only the
 * placement changes; desired is its desired state, kept). 0 moved, 1 no node can take it or
 * another replica moved it first, -1 error. */
static int move_at_rest(struct coved *d, struct cove_sandbox_row *s,
                        const struct cove_placement_row *p, const char *desired, const char *reason,
                        struct cove_err *err)
{
        struct coved_place_want w = want_of(s, p->node);
        char target[64], why[512];
        int r = coved_place(d, &w, target, why, sizeof(why), err);
        if (r != 0)
                return r;
        if (place_write(d, s->id, target, desired, NULL, NULL, p->generation, NULL, err) < 0)
                return err->kind == COVE_E_CONFLICT ? 1 : -1;
        snprintf(s->node, sizeof(s->node), "%s", target); /* no job: nobody else writes it */
        if (d->cat_ops->sandbox_update(d->cat, s, err) < 0)
                cove_warn(&d->log, "node.move", "sandbox %s: %s", s->id, err->msg);
        cove_audit_log(d->audit, s->tenant, s->id, "control", "sandbox.move", "",
                       json_pack("{s:s, s:s, s:s, s:s}", "from", p->node, "to", target, "state",
                                 s->state, "reason", reason));
        return 0;
}

static int full_ok(const char *features)
{
        json_error_t je;
        json_t *f = json_loads(features, 0, &je);
        const char *v = json_string_value(json_object_get(f, "full"));
        int ok = v && !strcmp(v, "ok");
        json_decref(f);
        return ok;
}

/* Drain one running sandbox off node n: pause (full where n can), resume elsewhere. 0 moved,
 * 2 no node can take it (it keeps running), 3 a step failed (audited), -1 error. */
static int move_running(struct coved *d, const struct cove_node_row *n, struct cove_sandbox_row *s,
                        const struct cove_placement_row *p, struct cove_err *err)
{
        int64_t t0 = mono_ms();
        struct coved_place_want w = want_of(s, n->name);
        char target[64], why[512];
        int full;
        /* somewhere to go before it is paused: a sandbox no node can take keeps running */
        int r = coved_place(d, &w, target, why, sizeof(why), err);
        if (r != 0)
                return r == 1 ? 2 : -1;
        json_t *res = NULL;
        json_t *args =
            json_pack("{s:o, s:s}", "kind",
                      full_ok(n->features) ? json_string("full") : json_null(), "reason", "drain");
        int64_t tp = mono_ms();
        /* the drain's pause, not the user's: the desired state stays "running", so a node
         * lost in the middle of the move has the sandbox recovered running elsewhere (from
         * this pause's snapshot once it committed), and a drain step that finds it paused
         * here moves it on (the pause job of a paused sandbox is done at once) */
        r = coved_cluster_step(d, s->id, NULL, "running", "pause", args, p->generation,
                               COVED_MOVE_TIMEOUT_MS, &res, err);
        json_decref(args);
        if (r < 0) {
                cove_audit_log(d->audit, s->tenant, s->id, "control", "sandbox.move", "error",
                               json_pack("{s:s, s:s, s:s}", "from", n->name, "step", "pause",
                                         "error", err->msg));
                return 3;
        }
        int64_t t1 = mono_ms();
        /* the pause's snapshot: {"snapshot":{…}} as the public pause answers, or the row */
        const char *sid =
            json_string_value(json_object_get(json_object_get(res, "snapshot"), "id"));
        if (!sid)
                sid = json_string_value(
                    json_object_get(json_object_get(res, "sandbox"), "last_snapshot_id"));
        char snap_id[64] = "";
        snprintf(snap_id, sizeof(snap_id), "%s", sid ? sid : "");
        json_decref(res);
        struct cove_snapshot_row snap;
        if (!snap_id[0] && newest_snapshot(d, s->id, &snap, err) == 0)
                snprintf(snap_id, sizeof(snap_id), "%s", snap.id);
        int need_full = 0;
        if (snap_id[0] && d->cat_ops->snapshot_get(d->cat, NULL, snap_id, &snap, err) == 0)
                need_full = !strcmp(snap.kind, "full");
        r = place_maybe_full(d, &w, need_full, n->features, target, &full, why, sizeof(why), err);
        if (r != 0) {
                /* it stays paused on n: the next step moves it as a paused sandbox */
                cove_audit_log(d->audit, s->tenant, s->id, "control", "sandbox.move", "error",
                               json_pack("{s:s, s:s, s:s}", "from", n->name, "step", "place",
                                         "error", r == 1 ? why : err->msg));
                return 3;
        }
        args = snap_id[0] ? json_pack("{s:s}", "snapshot_id", snap_id)
                          : json_pack("{s:n}", "snapshot_id");
        res = NULL;
        r = coved_cluster_step(d, s->id, target, "running", "resume", args, p->generation,
                               COVED_MOVE_TIMEOUT_MS, &res, err);
        json_decref(args);
        int64_t t2 = mono_ms();
        json_t *detail = json_pack(
            "{s:s, s:s, s:s, s:s, s:I, s:I, s:I}", "from", n->name, "to", target, "snapshot_id",
            snap_id, "restore", full ? "full" : "files", "wall_ms", (json_int_t)(t2 - t0),
            "pause_ms", (json_int_t)(t2 - tp), "capture_ms", (json_int_t)(t1 - tp));
        if (r < 0) {
                json_object_set_new(detail, "step", json_string("resume"));
                json_object_set_new(detail, "error", json_string(err->msg));
                cove_audit_log(d->audit, s->tenant, s->id, "control", "sandbox.move", "error",
                               detail);
                return 3;
        }
        json_decref(res);
        cove_audit_log(d->audit, s->tenant, s->id, "control", "sandbox.move", "", detail);
        cove_info(&d->log, "node.drain", "sandbox %s: %s → %s in %lld ms (paused %lld ms)", s->id,
                  n->name, target, (long long)(t2 - t0), (long long)(t2 - tp));
        return 0;
}

int coved_nodes_drain_step(struct coved *d, const char *node, struct cove_err *err)
{
        struct coved_node_rows x;
        if (coved_nodes_read(d, &x, err) < 0)
                return -1;
        const struct cove_node_row *found = node_find(&x, node);
        if (!found || strcmp(found->state, "draining") != 0) {
                free(x.v);
                return 1;
        }
        struct cove_node_row n = *found;
        free(x.v);
        json_t *ids = placed_on(d, node, 0, err);
        if (!ids)
                return -1;
        int rc = json_array_size(ids) ? 2 : 1;
        size_t i;
        json_t *v;
        json_array_foreach(ids, i, v)
        {
                const char *id = json_string_value(v);
                struct cove_placement_row p;
                struct cove_sandbox_row s;
                int r = d->cat_ops->placement_get(d->cat, id, &p, err);
                if (r == 0 && (strcmp(p.node, node) != 0 || !strcmp(p.desired_state, "stopped")))
                        continue; /* moved or stopped meanwhile */
                if (r == 0)
                        r = d->cat_ops->sandbox_get(d->cat, NULL, id, &s, err);
                if (r < 0) {
                        rc = -1;
                        break;
                }
                if (r == 1 || move_backoff(d, id)) {
                        if (r == 0)
                                cove_sandbox_row_clear(&s);
                        continue;
                }
                r = !strcmp(p.desired_state, "paused")
                        ? move_at_rest(d, &s, &p, "paused", "drain", err)
                        : move_running(d, &n, &s, &p, err);
                cove_sandbox_row_clear(&s);
                if (r == 3) {
                        move_failed(d, id);
                        r = 0;
                }
                if (r == 0 || r < 0) {
                        rc = r; /* one at a time */
                        break;
                }
                /* 1 / 2: no node can take this one now; try the next */
        }
        json_decref(ids);
        return rc;
}

/* ---- node loss ---- */

/* Recover sandbox s (placed on the lost node n at p): 1 changed, 0 left (another replica
 * won, or no node can take it yet), -1 error. */
static int recover_one(struct coved *d, const struct cove_node_row *n, struct cove_sandbox_row *s,
                       const struct cove_placement_row *p, struct cove_err *err)
{
        char why[512], target[64];
        struct cove_snapshot_row snap;
        int r = newest_snapshot(d, s->id, &snap, err);
        if (r < 0)
                return -1;
        /* paused by its user: it stays paused, moved to a node that can take it, at the
         * pause's snapshot; a pause the node did not finish leaves it at the newest
         * committed one (none: stopped, below) */
        if (!strcmp(p->desired_state, "paused") && r == 0) {
                if (strcmp(s->state, "paused") != 0 || !s->last_snapshot_id[0]) {
                        char msg[160];
                        snprintf(msg, sizeof(msg),
                                 "node %s was lost while pausing it: paused at its last "
                                 "snapshot",
                                 n->name);
                        snprintf(s->state, sizeof(s->state), "paused");
                        snprintf(s->last_snapshot_id, sizeof(s->last_snapshot_id), "%s", snap.id);
                        s->uid_base = 0;
                        s->expires_at = 0;
                        free(s->error);
                        s->error = strdup(msg);
                }
                r = move_at_rest(d, s, p, "paused", "node lost", err);
                return r < 0 ? -1 : r == 0;
        }
        if (r == 1) {
                if (place_write(d, s->id, NULL, "stopped", NULL, NULL, p->generation, NULL, err) <
                    0)
                        return err->kind == COVE_E_CONFLICT ? 0 : -1;
                char msg[160];
                snprintf(msg, sizeof(msg),
                         "node %s was lost and the sandbox had no snapshot to recover from",
                         n->name);
                snprintf(s->state, sizeof(s->state), "stopped");
                free(s->error);
                s->error = strdup(msg);
                if (d->cat_ops->sandbox_update(d->cat, s, err) < 0)
                        return -1;
                cove_audit_log(d->audit, s->tenant, s->id, "control", "sandbox.lost", "",
                               json_pack("{s:s, s:s}", "node", n->name, "reason", msg));
                cove_warn(&d->log, "node.lost", "sandbox %s: %s", s->id, msg);
                /* onto a node that can delete or resume it (none now: the next sweep) */
                if (move_at_rest(d, s, p, "stopped", "node lost", err) < 0)
                        return -1;
                return 1;
        }
        struct coved_place_want w = want_of(s, n->name);
        int full;
        r = place_maybe_full(d, &w, !strcmp(snap.kind, "full"), n->features, target, &full, why,
                             sizeof(why), err);
        if (r < 0)
                return -1;
        if (r == 1) {
                cove_warn(&d->log, "node.lost", "sandbox %s waits for a node: %s", s->id, why);
                return 0;
        }
        /* recovered_from first: the recover job reads it. Replicas racing here write the
         * same values (the newest snapshot, the node's last renewal); the row is read again
         * right before, and left alone once another replica has placed it */
        struct cove_placement_row p2;
        r = d->cat_ops->placement_get(d->cat, s->id, &p2, err);
        if (r != 0)
                return r < 0 ? -1 : 0;
        if (p2.generation != p->generation)
                return 0;
        cove_sandbox_row_clear(s);
        r = d->cat_ops->sandbox_get(d->cat, NULL, p->sandbox_id, s, err);
        if (r != 0)
                return r < 0 ? -1 : 0;
        char at[40];
        cove_rfc3339(snap.created_at, at, sizeof(at));
        double lost_s = n->last_seen > snap.created_at
                            ? (double)(n->last_seen - snap.created_at) / 1000.0
                            : 0.0;
        json_t *rf =
            json_pack("{s:s, s:s, s:f}", "snapshot_id", snap.id, "at", at, "lost_s", lost_s);
        char *txt = json_dumps(rf, JSON_COMPACT | JSON_SORT_KEYS);
        if (!txt) {
                json_decref(rf);
                return cove_err_set(err, ENOMEM, "recover %s", s->id);
        }
        free(s->recovered_from_json);
        s->recovered_from_json = txt;
        snprintf(s->last_snapshot_id, sizeof(s->last_snapshot_id), "%s", snap.id);
        /* paused at that snapshot, as coved leaves a sandbox after its own crash: the
         * recover job resumes it from there */
        snprintf(s->state, sizeof(s->state), "paused");
        if (d->cat_ops->sandbox_update(d->cat, s, err) < 0) {
                json_decref(rf);
                return -1;
        }
        int64_t job = 0;
        json_t *aj = json_pack("{s:s}", "snapshot_id", snap.id);
        char *args = aj ? json_dumps(aj, JSON_COMPACT) : NULL;
        json_decref(aj);
        r = place_write(d, s->id, target, "running", "recover", args, p->generation, &job, err);
        free(args);
        if (r < 0) {
                json_decref(rf);
                return err->kind == COVE_E_CONFLICT ? 0 : -1;
        }
        cove_audit_log(d->audit, s->tenant, s->id, "control", "sandbox.recover", "",
                       json_pack("{s:s, s:s, s:o, s:s, s:I}", "from", n->name, "to", target,
                                 "recovered_from", rf, "restore", full ? "full" : "files", "job",
                                 (json_int_t)job));
        cove_info(&d->log, "node.lost", "sandbox %s: recovering on %s from %s (%.1f s lost)", s->id,
                  target, snap.id, lost_s);
        return 1;
}

static int recover_node(struct coved *d, const struct cove_node_row *n, struct cove_err *err)
{
        json_t *ids = placed_on(d, n->name, 1, err); /* the stopped ones move off it too */
        if (!ids)
                return -1;
        int changed = 0;
        size_t i;
        json_t *v;
        json_array_foreach(ids, i, v)
        {
                const char *id = json_string_value(v);
                struct cove_placement_row p;
                struct cove_sandbox_row s;
                int r = d->cat_ops->placement_get(d->cat, id, &p, err);
                if (r == 0 && strcmp(p.node, n->name) != 0)
                        continue;
                if (r == 0)
                        r = d->cat_ops->sandbox_get(d->cat, NULL, id, &s, err);
                if (r == 1)
                        continue;
                int stopped = r == 0 && !strcmp(p.desired_state, "stopped");
                if (stopped && (!strcmp(s.state, "stopped") || !strcmp(s.state, "error"))) {
                        /* stopped by its node's timeout: it stays stopped, on a node that can
                         * delete or resume it */
                        r = move_at_rest(d, &s, &p, "stopped", "node lost", err);
                        r = r < 0 ? -1 : r == 0;
                        cove_sandbox_row_clear(&s);
                } else if (stopped) { /* a stop under way: its job waits for the node */
                        cove_sandbox_row_clear(&s);
                        continue;
                } else if (r == 0) {
                        r = recover_one(d, n, &s, &p, err);
                        cove_sandbox_row_clear(&s);
                }
                if (r < 0) {
                        json_decref(ids);
                        return -1;
                }
                changed += r;
        }
        json_decref(ids);
        return changed;
}

/* ---- a node's restart (docs/cluster.md "A node restarted") ---- */

/* How long after this replica first saw a node's new epoch it looks for the sandboxes that
 * node's start-up reconcile left paused (the reconcile runs right after the acquire; this
 * covers a slow one on a loaded host). */
#define RESTART_WINDOW_MS 60000

/* The tried set of node nr's current epoch while it is within RESTART_WINDOW_MS of being
 * first seen (borrowed: only the sweeper thread uses it), else NULL. A new epoch (a
 * restart, or this replica's first look at the node) opens the window. */
static json_t *restart_window(struct coved *d, const struct cove_node_row *nr)
{
        struct coved_nodes *n = d->nodes;
        if (!n || !n->epochs)
                return NULL;
        int64_t now = mono_ms();
        pthread_mutex_lock(&n->mu);
        json_t *e = json_object_get(n->epochs, nr->name);
        if (!e || json_integer_value(json_object_get(e, "epoch")) != nr->epoch) {
                e = json_pack("{s:I, s:I, s:{}}", "epoch", (json_int_t)nr->epoch, "since",
                              (json_int_t)now, "tried");
                if (e)
                        json_object_set_new(n->epochs, nr->name, e);
        }
        json_t *tried = NULL;
        if (e && now - json_integer_value(json_object_get(e, "since")) < RESTART_WINDOW_MS)
                tried = json_object_get(e, "tried");
        pthread_mutex_unlock(&n->mu);
        return tried;
}

#define OPEN_JOB_KINDS "start,stop,pause,resume,recover,snapshot,rewind,fork"

struct on_node {
        const char *node;
        json_t *ids;
};

static int collect_on(const struct cove_sandbox_row *row, void *arg)
{
        struct on_node *x = arg;
        if (!strcmp(row->node, x->node) && row->last_snapshot_id[0])
                json_array_append_new(x->ids, json_string(row->id));
        return 0;
}

struct node_busy {
        const char *node;
        int busy; /* open jobs for sandboxes placed on it */
};

static int open_jobs_cb(const char *node, int64_t count, void *arg)
{
        struct node_busy *x = arg;
        if (!strcmp(node, x->node) && count > 0)
                x->busy = 1;
        return 0;
}

int coved_nodes_resume_restarted(struct coved *d, const char *node, json_t *tried,
                                 struct cove_err *err)
{
        /* a job the node's old process claimed (its new one takes it back: a resume or a
         * start under way converges by itself) or any other in flight: a later pass */
        struct node_busy busy = {node, 0};
        if (d->cat_ops->job_counts(d->cat, OPEN_JOB_KINDS, open_jobs_cb, &busy, err) < 0)
                return -1;
        if (busy.busy)
                return 0;
        struct on_node x = {node, json_array()};
        if (!x.ids)
                return cove_err_set(err, ENOMEM, "node %s", node);
        if (d->cat_ops->sandbox_list(d->cat, NULL, "paused", collect_on, &x, err) < 0) {
                json_decref(x.ids);
                return -1;
        }
        int placed = 0;
        size_t i;
        json_t *v;
        json_array_foreach(x.ids, i, v)
        {
                const char *id = json_string_value(v);
                if (tried && json_object_get(tried, id))
                        continue;
                struct cove_placement_row p;
                struct cove_err e2;
                int r = d->cat_ops->placement_get(d->cat, id, &p, &e2);
                if (r != 0 || strcmp(p.node, node) || strcmp(p.desired_state, "running") ||
                    strcmp(p.observed_state, "paused"))
                        continue;
                struct cove_sandbox_row s;
                if (d->cat_ops->sandbox_get(d->cat, NULL, id, &s, &e2) != 0)
                        continue;
                /* the row is settled after the observe: until then, a later pass */
                if (strcmp(s.state, "paused") || !s.last_snapshot_id[0] || strcmp(s.node, node)) {
                        cove_sandbox_row_clear(&s);
                        continue;
                }
                if (tried) /* once: a resume that fails is not retried from here */
                        json_object_set_new(tried, id, json_true());
                int64_t job = 0;
                if (place_write(d, id, node, "running", "resume", NULL, p.generation, &job, &e2) ==
                    0) {
                        placed++;
                        cove_audit_log(d->audit, s.tenant, id, "control", "sandbox.resume", "",
                                       json_pack("{s:s, s:s, s:s, s:I}", "node", node,
                                                 "snapshot_id", s.last_snapshot_id, "reason",
                                                 "node restarted", "job", (json_int_t)job));
                        cove_info(&d->log, "node.restart",
                                  "sandbox %s: node %s restarted: resuming it there from %s", id,
                                  node, s.last_snapshot_id);
                } else if (e2.kind != COVE_E_CONFLICT) { /* conflict: placed meanwhile */
                        cove_warn(&d->log, "node.restart", "sandbox %s: %s", id, e2.msg);
                }
                cove_sandbox_row_clear(&s);
        }
        json_decref(x.ids);
        return placed;
}

int coved_nodes_sweep(struct coved *d, int64_t now_ms, struct cove_err *err)
{
        struct coved_node_rows x;
        if (coved_nodes_read(d, &x, err) < 0)
                return -1;
        int64_t grace = d->nodes_opt.lost_grace_ms > 0 ? d->nodes_opt.lost_grace_ms : 5000;
        int64_t ttl = d->lease_ttl_ms > 0 ? d->lease_ttl_ms : 10000;
        int changed = 0, rc = 0;
        for (size_t i = 0; i < x.n && rc == 0; i++) {
                struct cove_node_row *n = &x.v[i];
                /* never before TTL + grace since its last renewal: by then its guests have
                 * frozen themselves and the node has fenced itself */
                int64_t until = n->lease_expires_at > n->last_seen + ttl ? n->lease_expires_at
                                                                         : n->last_seen + ttl;
                if (n->epoch > 0 && !strcmp(n->state, "ready") && now_ms < n->lease_expires_at) {
                        json_t *tried = restart_window(d, n);
                        struct cove_err e2;
                        int r = tried ? coved_nodes_resume_restarted(d, n->name, tried, &e2) : 0;
                        if (r < 0)
                                cove_warn(&d->log, "node.restart", "node %s: %s", n->name, e2.msg);
                        else
                                changed += r;
                }
                if (n->epoch <= 0 || now_ms <= until + grace)
                        continue;
                if (strcmp(n->state, "lost") != 0) {
                        if (d->cat_ops->node_set_state(d->cat, n->name, "lost", err) < 0) {
                                rc = -1;
                                break;
                        }
                        /* it may have taken its lease again between the list and the write:
                         * then it is not lost (a new epoch), and keeps its former state */
                        struct coved_node_rows y;
                        if (coved_nodes_read(d, &y, err) < 0) {
                                rc = -1;
                                break;
                        }
                        const struct cove_node_row *now = node_find(&y, n->name);
                        int back = now && now->epoch != n->epoch;
                        free(y.v);
                        if (back) {
                                d->cat_ops->node_set_state(d->cat, n->name, n->state, err);
                                continue;
                        }
                        cove_audit_log(d->audit, "default", "", "control", "node.lost", "",
                                       json_pack("{s:s, s:I, s:I, s:s}", "node", n->name, "epoch",
                                                 (json_int_t)n->epoch, "last_seen",
                                                 (json_int_t)n->last_seen, "was", n->state));
                        cove_warn(&d->log, "node.lost",
                                  "node %s: no lease renewal for %lld ms: lost", n->name,
                                  (long long)(now_ms - n->last_seen));
                        snprintf(n->state, sizeof(n->state), "lost");
                }
                if (!n->alloc_cpus && !n->alloc_memory_mb && !n->alloc_disk_mb)
                        continue; /* nothing placed there any more */
                int r = recover_node(d, n, err);
                if (r < 0)
                        rc = -1;
                else
                        changed += r;
        }
        free(x.v);
        return rc < 0 ? -1 : changed;
}

/* ---- the thread ---- */

/* Wait up to wait_ms or until kicked (drain only) or quitting; 1 when quitting. mu held. */
static int nodes_wait(struct coved_nodes *n, int wait_ms, int kickable)
{
        if (n->quit)
                return 1;
        if (!(kickable && n->kicked)) {
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                ts.tv_sec += wait_ms / 1000;
                ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&n->cv, &n->mu, &ts);
        }
        if (kickable)
                n->kicked = 0;
        return n->quit;
}

static int tick_ms(const struct coved *d)
{
        return d->lease_renew_ms > 0 && d->lease_renew_ms < 1000 ? d->lease_renew_ms : 1000;
}

/* The node-loss sweeper: its own thread, so a long drain step never delays it. */
static void *sweep_main(void *arg)
{
        struct coved *d = arg;
        struct coved_nodes *n = d->nodes;
        pthread_mutex_lock(&n->mu);
        while (!n->quit) {
                pthread_mutex_unlock(&n->mu);
                struct cove_err err;
                if (coved_nodes_sweep(d, cove_now_ms(), &err) < 0)
                        cove_warn(&d->log, "node.sweep", "%s", err.msg);
                pthread_mutex_lock(&n->mu);
                if (nodes_wait(n, tick_ms(d), 0))
                        break;
        }
        pthread_mutex_unlock(&n->mu);
        return NULL;
}

/* Drains: one move per draining node per round, a short pause between rounds. */
static void *drain_main(void *arg)
{
        struct coved *d = arg;
        struct coved_nodes *n = d->nodes;
        pthread_mutex_lock(&n->mu);
        while (!n->quit) {
                pthread_mutex_unlock(&n->mu);
                struct cove_err err;
                int more = 0;
                struct coved_node_rows x;
                if (coved_nodes_read(d, &x, &err) == 0) {
                        for (size_t i = 0; i < x.n; i++) {
                                if (strcmp(x.v[i].state, "draining") != 0)
                                        continue;
                                int r = coved_nodes_drain_step(d, x.v[i].name, &err);
                                if (r < 0)
                                        cove_warn(&d->log, "node.drain", "%s: %s", x.v[i].name,
                                                  err.msg);
                                more |= r == 0;
                        }
                        free(x.v);
                }
                pthread_mutex_lock(&n->mu);
                if (nodes_wait(n, more ? COVED_DRAIN_PAUSE_MS : tick_ms(d), 1))
                        break;
        }
        pthread_mutex_unlock(&n->mu);
        return NULL;
}

int coved_nodes_start(struct coved *d, struct cove_err *err)
{
        if (d->role != COVED_ROLE_CONTROL || d->nodes)
                return 0;
        struct coved_nodes *n = calloc(1, sizeof(*n));
        if (!n)
                return cove_err_set(err, ENOMEM, "node sweeper");
        pthread_mutex_init(&n->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&n->cv, &ca);
        pthread_condattr_destroy(&ca);
        n->retry = json_object();
        n->epochs = json_object();
        d->nodes = n;
        int e = pthread_create(&n->th_sweep, NULL, sweep_main, d);
        if (!e) {
                e = pthread_create(&n->th_drain, NULL, drain_main, d);
                if (e) {
                        pthread_mutex_lock(&n->mu);
                        n->quit = 1;
                        pthread_cond_broadcast(&n->cv);
                        pthread_mutex_unlock(&n->mu);
                        pthread_join(n->th_sweep, NULL);
                }
        }
        if (e) {
                d->nodes = NULL;
                pthread_cond_destroy(&n->cv);
                pthread_mutex_destroy(&n->mu);
                json_decref(n->retry);
                json_decref(n->epochs);
                free(n);
                return cove_err_set(err, e, "node sweeper and drain threads");
        }
        return 0;
}

void coved_nodes_stop(struct coved *d)
{
        struct coved_nodes *n = d->nodes;
        if (!n)
                return;
        pthread_mutex_lock(&n->mu);
        n->quit = 1;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->th_sweep, NULL);
        pthread_join(n->th_drain, NULL);
        d->nodes = NULL;
        pthread_cond_destroy(&n->cv);
        pthread_mutex_destroy(&n->mu);
        json_decref(n->retry);
        json_decref(n->epochs);
        free(n);
}
