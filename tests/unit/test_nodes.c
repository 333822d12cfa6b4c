/* The control plane's node decisions (control/nodes.h, control/placement.h) on a real
 * catalog: node loss (lost only after TTL + grace, running sandboxes re-placed with a
 * recover job and recovered_from, paused ones moved, ones without a snapshot stopped, two
 * replicas racing write one recovery), drains (pause then resume elsewhere, one at a time,
 * audited with their pause; a sandbox no node can take keeps running; a drain carries on
 * after a replica restart), cordon/uncordon/drain and the node list. Nodes here are rows
 * with leases and a stand-in node thread that claims and finishes jobs the way a node
 * does. Runs on SQLite, then on PostgreSQL when COVE_TEST_PG_URL names a server
 * (tests/integration/test_pg_nodes.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster/catsrv.h"
#include "control/audit.h"
#include "control/cluster.h"
#include "control/coved.h"
#include "control/nodes.h"
#include "control/placement.h"
#include "catalog_fixture.h"
#include "store/catalog.h"
#include "util/util.h"

static const struct cove_catalog_ops *ops; /* the backend under test (catfx_main) */

#define FEAT                                                                                       \
        "{\"runtimes\":[\"ns\"],\"full\":\"ok\",\"criu\":\"4.1.1\",\"kernel\":\"6.1.0\","          \
        "\"cpu\":\"Xeon\",\"templates\":[\"busybox\"]}"

struct fx {
        struct catfx db;
        struct coved d; /* a control replica: catalog, audit, options */
        int64_t epoch[4];
        char names[4][16];
        int nnodes;
        /* the stand-in node thread */
        pthread_t th;
        struct cove_catalog *nc; /* its own catalog handle */
        int th_on, quit;
        pthread_mutex_t mu;
        char log[4096]; /* "node:kind:sandbox " per job it ran */
};

/* A control replica on the test's database. */
static void replica_open(struct fx *f, struct coved *d)
{
        memset(d, 0, sizeof(*d));
        d->log.fd = 2;
        d->log.level = COVE_LOG_ERROR;
        d->role = COVED_ROLE_CONTROL;
        d->lease_ttl_ms = 1000;
        d->lease_renew_ms = 200;
        d->nodes_opt.lost_grace_ms = 500;
        d->nodes_opt.placement_k = 3;
        d->nodes_opt.max_starts_per_node = 4;
        d->nodes_opt.cpu_overcommit = 1; /* capacities as announced, unless a test says */
        pthread_mutex_init(&d->mu, NULL);
        pthread_cond_init(&d->cv, NULL);
        struct cove_err err = {0};
        d->cat_ops = ops;
        d->cat = ops->open(f->db.path, &err);
        if (!d->cat)
                fail_msg("open %s: %s", f->db.path, err.msg);
        d->audit = cove_audit_open(ops, d->cat, &d->log, &err);
        if (!d->audit)
                fail_msg("audit: %s", err.msg);
        if (coved_cluster_open(d, &err) < 0)
                fail_msg("cluster: %s", err.msg);
}

static void replica_close(struct coved *d)
{
        coved_nodes_stop(d);
        coved_cluster_close(d);
        cove_catsrv_free(d->catsrv); /* made by the cluster's waiter (coved.c frees it too) */
        d->catsrv = NULL;
        if (d->audit)
                cove_audit_close(d->audit);
        d->audit = NULL;
        if (d->cat)
                d->cat_ops->close(d->cat);
        d->cat = NULL;
}

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        if (catfx_create(&f->db, ops, "nodes") < 0)
                return -1;
        pthread_mutex_init(&f->mu, NULL);
        replica_open(f, &f->d);
        struct cove_tenant_row t = {0};
        struct cove_err err = {0};
        snprintf(t.id, sizeof(t.id), "default");
        snprintf(t.name, sizeof(t.name), "default");
        if (ops->tenant_put(f->d.cat, &t, &err) < 0)
                fail_msg("tenant_put: %s", err.msg);
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fx *f = *state;
        if (f->th_on) {
                pthread_mutex_lock(&f->mu);
                f->quit = 1;
                pthread_mutex_unlock(&f->mu);
                pthread_join(f->th, NULL);
                ops->close(f->nc);
        }
        replica_close(&f->d);
        catfx_drop(&f->db);
        free(f);
        return 0;
}

/* A node row holding a lease of ttl_ms with capacity and features. */
static int node_up(struct fx *f, const char *name, int64_t cpus, int64_t ttl_ms, const char *feat)
{
        struct cove_node_row n;
        memset(&n, 0, sizeof(n));
        snprintf(n.name, sizeof(n.name), "%s", name);
        snprintf(n.address, sizeof(n.address), "http://127.0.0.1:1");
        snprintf(n.features, sizeof(n.features), "%s", feat);
        n.cpus = cpus;
        n.memory_mb = cpus * 1024;
        n.disk_mb = cpus * 4096;
        struct cove_err err = {0};
        int i = f->nnodes++;
        snprintf(f->names[i], sizeof(f->names[i]), "%s", name);
        if (ops->node_lease_acquire(f->d.cat, &n, ttl_ms, &f->epoch[i], NULL, &err) < 0)
                fail_msg("acquire %s: %s", name, err.msg);
        return i;
}

struct find_node {
        const char *name;
        struct cove_node_row *out;
};

static int find_node_cb(const struct cove_node_row *row, void *arg)
{
        struct find_node *x = arg;
        if (!strcmp(row->name, x->name))
                *x->out = *row;
        return 0;
}

static struct cove_node_row node_row(struct fx *f, const char *name)
{
        struct cove_node_row out;
        memset(&out, 0, sizeof(out));
        struct cove_err err = {0};
        struct find_node x = {name, &out};
        assert_int_equal(ops->node_list(f->d.cat, find_node_cb, &x, &err), 0);
        return out;
}

/* placement_write without job arguments */
static int place_as_control(struct fx *f, const char *id, const char *node, const char *desired,
                            const char *kind, int64_t expect, struct cove_err *err)
{
        return ops->placement_write(f->d.cat, id, node, desired, kind, NULL, expect, NULL, NULL,
                                    err);
}

/* A sandbox row placed on node with desired state desired (row state the same). */
static void sbx_add(struct fx *f, const char *id, const char *node, const char *desired)
{
        struct cove_sandbox_row r;
        memset(&r, 0, sizeof(r));
        snprintf(r.id, sizeof(r.id), "%s", id);
        snprintf(r.tenant, sizeof(r.tenant), "default");
        snprintf(r.state, sizeof(r.state), "%s", desired);
        strcpy(r.template_name, "busybox");
        strcpy(r.runtime, "ns");
        r.created_at = cove_now_ms();
        r.cpus = 1;
        r.memory_mb = 512;
        r.disk_mb = 1024;
        r.timeout_s = 300;
        strcpy(r.on_timeout, "kill");
        snprintf(r.node, sizeof(r.node), "%s", node);
        struct cove_err err = {0};
        if (ops->sandbox_insert(f->d.cat, &r, &err) < 0)
                fail_msg("insert %s: %s", id, err.msg);
        if (place_as_control(f, id, node, desired, NULL, 0, &err) < 0)
                fail_msg("place %s: %s", id, err.msg);
}

static void snap_add_on(struct cove_catalog *c, const char *sbx, const char *id, const char *kind,
                        int64_t created)
{
        struct cove_snapshot_row s;
        memset(&s, 0, sizeof(s));
        snprintf(s.id, sizeof(s.id), "%s", id);
        snprintf(s.tenant, sizeof(s.tenant), "default");
        snprintf(s.sandbox_id, sizeof(s.sandbox_id), "%s", sbx);
        snprintf(s.kind, sizeof(s.kind), "%s", kind);
        s.created_at = created;
        struct cove_err err = {0};
        if (ops->snapshot_insert(c, &s, &err) < 0)
                fail_msg("snapshot %s: %s", id, err.msg);
}

static void snap_add(struct fx *f, const char *sbx, const char *id, const char *kind,
                     int64_t created)
{
        snap_add_on(f->d.cat, sbx, id, kind, created);
}

static struct cove_placement_row placement(struct fx *f, const char *id)
{
        struct cove_placement_row p;
        memset(&p, 0, sizeof(p));
        struct cove_err err = {0};
        assert_int_equal(ops->placement_get(f->d.cat, id, &p, &err), 0);
        return p;
}

static struct cove_sandbox_row sbx_get(struct fx *f, const char *id)
{
        struct cove_sandbox_row r;
        struct cove_err err = {0};
        assert_int_equal(ops->sandbox_get(f->d.cat, NULL, id, &r, &err), 0);
        return r;
}

/* Claim every job of node i: "kind:sandbox " each into out (how a node would see them). */
static void claim_all(struct fx *f, int i, char *out, size_t cap)
{
        out[0] = '\0';
        struct cove_job_row j;
        struct cove_err err = {0};
        while (ops->job_claim(f->d.cat, f->names[i], f->epoch[i], &j, &err) == 0) {
                size_t len = strlen(out);
                snprintf(out + len, cap - len, "%s:%s ", j.kind, j.sandbox_id);
                cove_job_row_clear(&j);
        }
}

/* ---- the stand-in node thread: runs pause and resume jobs of every node ---- */

static void run_job(struct fx *f, int i, struct cove_job_row *j)
{
        struct cove_err err = {0};
        struct cove_sandbox_row r;
        assert_int_equal(ops->sandbox_get(f->nc, NULL, j->sandbox_id, &r, &err), 0);
        char result[256];
        if (!strcmp(j->kind, "pause")) {
                char sid[64];
                snprintf(sid, sizeof(sid), "snap_%s_%lld", j->sandbox_id, (long long)j->id);
                snap_add_on(f->nc, j->sandbox_id, sid, "full", cove_now_ms());
                snprintf(r.state, sizeof(r.state), "paused");
                snprintf(r.last_snapshot_id, sizeof(r.last_snapshot_id), "%s", sid);
                snprintf(result, sizeof(result),
                         "{\"sandbox\":{\"id\":\"%s\",\"state\":\"paused\","
                         "\"last_snapshot_id\":\"%s\"}}",
                         j->sandbox_id, sid);
        } else {
                snprintf(r.state, sizeof(r.state), "running");
                snprintf(r.node, sizeof(r.node), "%s", f->names[i]);
                snprintf(result, sizeof(result),
                         "{\"sandbox\":{\"id\":\"%s\",\"state\":\"running\"}}", j->sandbox_id);
        }
        assert_int_equal(ops->sandbox_update(f->nc, &r, &err), 0);
        cove_sandbox_row_clear(&r);
        assert_int_equal(
            ops->job_finish(f->nc, j->id, f->names[i], f->epoch[i], j->generation, 1, result, &err),
            0);
        pthread_mutex_lock(&f->mu);
        size_t len = strlen(f->log);
        snprintf(f->log + len, sizeof(f->log) - len, "%s:%s:%s ", f->names[i], j->kind,
                 j->sandbox_id);
        pthread_mutex_unlock(&f->mu);
}

static void *node_main(void *arg)
{
        struct fx *f = arg;
        for (;;) {
                pthread_mutex_lock(&f->mu);
                int quit = f->quit;
                pthread_mutex_unlock(&f->mu);
                if (quit)
                        return NULL;
                int any = 0;
                for (int i = 0; i < f->nnodes; i++) {
                        struct cove_job_row j;
                        struct cove_err err = {0};
                        if (ops->job_claim(f->nc, f->names[i], f->epoch[i], &j, &err) == 0) {
                                run_job(f, i, &j);
                                cove_job_row_clear(&j);
                                any = 1;
                        }
                }
                if (!any) {
                        struct timespec ts = {0, 10 * 1000000};
                        nanosleep(&ts, NULL);
                }
        }
}

static void nodes_run(struct fx *f)
{
        struct cove_err err = {0};
        f->nc = ops->open(f->db.path, &err);
        assert_non_null(f->nc);
        assert_int_equal(pthread_create(&f->th, NULL, node_main, f), 0);
        f->th_on = 1;
}

static int count(const char *hay, const char *needle)
{
        int n = 0;
        for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
                n++;
        return n;
}

struct audit_x {
        char actions[2048];
        json_t *moves; /* details of sandbox.move events */
        json_t *recover;
};

static int audit_cb(const struct cove_audit_row *row, void *arg)
{
        struct audit_x *x = arg;
        size_t len = strlen(x->actions);
        snprintf(x->actions + len, sizeof(x->actions) - len, "%s:%s:%s ", row->action, row->sandbox,
                 row->verdict);
        json_error_t je;
        json_t *det = json_loads(row->detail_json, 0, &je);
        if (!strcmp(row->action, "sandbox.move") && !row->verdict[0])
                json_array_append(x->moves, det);
        if (!strcmp(row->action, "sandbox.recover"))
                json_array_append(x->recover, det);
        json_decref(det);
        return 0;
}

static void audit_read(struct fx *f, struct audit_x *x)
{
        memset(x->actions, 0, sizeof(x->actions));
        x->moves = json_array();
        x->recover = json_array();
        cove_audit_flush(f->d.audit);
        struct cove_err err = {0};
        assert_int_equal(ops->audit_list(f->d.cat, NULL, NULL, NULL, 0, 0, 0, audit_cb, x, &err),
                         0);
}

/* ---- node loss ---- */

static void lost_only_after_ttl_and_grace(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 4, 300, FEAT); /* a short lease; the flag's TTL is 1000 ms */
        node_up(f, "b", 4, 60000, FEAT);
        sbx_add(f, "sbx_1", "a", "running");
        snap_add(f, "sbx_1", "snap_1", "files", cove_now_ms() - 2000);
        struct cove_node_row a = node_row(f, "a");
        struct cove_err err = {0};
        /* the lease has expired (+ grace), but not TTL (the flag) + grace since the last
         * renewal: its guests may still run */
        int64_t ttl_grace = a.last_seen + 1000 + 500;
        assert_int_equal(coved_nodes_sweep(&f->d, a.lease_expires_at + 501, &err), 0);
        assert_int_equal(coved_nodes_sweep(&f->d, ttl_grace, &err), 0);
        assert_string_equal(node_row(f, "a").state, "ready");
        assert_string_equal(placement(f, "sbx_1").node, "a");
        assert_int_equal(coved_nodes_sweep(&f->d, ttl_grace + 1, &err), 1);
        assert_string_equal(node_row(f, "a").state, "lost");
        assert_string_equal(placement(f, "sbx_1").node, "b");
        /* b itself is live: never lost */
        assert_string_equal(node_row(f, "b").state, "ready");
}

static void lost_node_sandboxes_recover_elsewhere(void **state)
{
        struct fx *f = *state;
        int a = node_up(f, "a", 8, 200, FEAT);
        int b = node_up(f, "b", 8, 60000, FEAT);
        (void)a;
        int64_t t0 = cove_now_ms();
        sbx_add(f, "sbx_run", "a", "running");
        snap_add(f, "sbx_run", "snap_old", "full", t0 - 9000);
        snap_add(f, "sbx_run", "snap_new", "full", t0 - 3000);
        sbx_add(f, "sbx_paused", "a", "paused");
        snap_add(f, "sbx_paused", "snap_p", "files", t0 - 5000);
        sbx_add(f, "sbx_nosnap", "a", "running");
        sbx_add(f, "sbx_gone", "a", "stopped");
        sbx_add(f, "sbx_other", "b", "running");
        struct cove_node_row na = node_row(f, "a");
        int64_t gen_run = placement(f, "sbx_run").generation;
        struct cove_err err = {0};
        int64_t late = na.last_seen + 1000 + 500 + 1;
        assert_int_equal(coved_nodes_sweep(&f->d, late, &err), 4);
        assert_string_equal(node_row(f, "a").state, "lost");

        /* the running one: on b, one generation later, with a recover job */
        struct cove_placement_row p = placement(f, "sbx_run");
        assert_string_equal(p.node, "b");
        assert_string_equal(p.desired_state, "running");
        assert_int_equal(p.generation, gen_run + 1);
        struct cove_sandbox_row r = sbx_get(f, "sbx_run");
        assert_string_equal(r.state, "paused"); /* at snap_new, until the recover job ran */
        assert_string_equal(r.last_snapshot_id, "snap_new");
        assert_non_null(r.recovered_from_json);
        json_error_t je;
        json_t *rf = json_loads(r.recovered_from_json, 0, &je);
        assert_string_equal(json_string_value(json_object_get(rf, "snapshot_id")), "snap_new");
        double lost_s = json_real_value(json_object_get(rf, "lost_s"));
        assert_true(lost_s > (double)(na.last_seen - (t0 - 3000)) / 1000.0 - 0.001 &&
                    lost_s < (double)(na.last_seen - (t0 - 3000)) / 1000.0 + 0.001);
        assert_non_null(json_string_value(json_object_get(rf, "at")));
        /* the API shows it */
        json_t *api = cove_sandbox_json(&r);
        assert_true(json_equal(json_object_get(api, "recovered_from"), rf));
        json_decref(api);
        json_decref(rf);
        cove_sandbox_row_clear(&r);

        /* the paused one: moved, no job; the one without a snapshot: stopped, with why */
        p = placement(f, "sbx_paused");
        assert_string_equal(p.node, "b");
        assert_string_equal(p.desired_state, "paused");
        r = sbx_get(f, "sbx_paused");
        assert_string_equal(r.node, "b");
        assert_null(r.recovered_from_json);
        cove_sandbox_row_clear(&r);
        p = placement(f, "sbx_nosnap"); /* off the lost node, so it can be deleted */
        assert_string_equal(p.node, "b");
        assert_string_equal(p.desired_state, "stopped");
        r = sbx_get(f, "sbx_nosnap");
        assert_string_equal(r.state, "stopped");
        assert_non_null(strstr(r.error, "node a was lost and the sandbox had no snapshot"));
        cove_sandbox_row_clear(&r);
        /* stopped: moved too, still stopped (a lost node could not delete it) */
        assert_string_equal(placement(f, "sbx_gone").node, "b");
        assert_string_equal(placement(f, "sbx_gone").desired_state, "stopped");
        assert_string_equal(placement(f, "sbx_other").node, "b");

        char jobs[512];
        claim_all(f, b, jobs, sizeof(jobs));
        assert_string_equal(jobs, "recover:sbx_run ");

        /* again: nothing left to do */
        assert_int_equal(coved_nodes_sweep(&f->d, late + 1000, &err), 0);
        claim_all(f, b, jobs, sizeof(jobs));
        assert_string_equal(jobs, "");
        struct cove_node_row nb = node_row(f, "a");
        assert_int_equal(nb.alloc_cpus, 0);

        struct audit_x x;
        audit_read(f, &x);
        assert_int_equal(count(x.actions, "node.lost::"), 1);
        assert_int_equal(count(x.actions, "sandbox.recover:sbx_run:"), 1);
        assert_int_equal(count(x.actions, "sandbox.lost:sbx_nosnap:"), 1);
        assert_int_equal(count(x.actions, "sandbox.move:sbx_paused:"), 1);
        json_t *det = json_array_get(x.recover, 0);
        assert_string_equal(json_string_value(json_object_get(det, "to")), "b");
        assert_string_equal(json_string_value(json_object_get(
                                json_object_get(det, "recovered_from"), "snapshot_id")),
                            "snap_new");
        json_decref(x.moves);
        json_decref(x.recover);
}

static void lost_recovery_waits_for_a_node(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 8, 200, FEAT);
        node_up(f, "b", 8, 60000, "{\"runtimes\":[\"vm\"],\"templates\":[\"busybox\"]}");
        sbx_add(f, "sbx_1", "a", "running");
        snap_add(f, "sbx_1", "snap_1", "files", cove_now_ms() - 1000);
        struct cove_err err = {0};
        int64_t late = node_row(f, "a").last_seen + 1501;
        /* b has no ns runtime: the node is lost, the sandbox stays placed, no recover yet */
        assert_int_equal(coved_nodes_sweep(&f->d, late, &err), 0);
        assert_string_equal(node_row(f, "a").state, "lost");
        assert_string_equal(placement(f, "sbx_1").node, "a");
        struct cove_sandbox_row r = sbx_get(f, "sbx_1");
        assert_null(r.recovered_from_json);
        cove_sandbox_row_clear(&r);
        /* a node that can take it joins: the next sweep recovers it */
        node_up(f, "c", 8, 60000, FEAT);
        assert_int_equal(coved_nodes_sweep(&f->d, late + 1000, &err), 1);
        assert_string_equal(placement(f, "sbx_1").node, "c");
}

struct race {
        struct coved *d;
        int64_t now;
        int changed;
};

static void *sweep_main(void *arg)
{
        struct race *r = arg;
        struct cove_err err = {0};
        r->changed = coved_nodes_sweep(r->d, r->now, &err);
        return NULL;
}

static void two_replicas_recover_once(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 16, 200, FEAT);
        int b = node_up(f, "b", 16, 60000, FEAT);
        char id[32], sid[32];
        for (int i = 0; i < 6; i++) {
                snprintf(id, sizeof(id), "sbx_%d", i);
                snprintf(sid, sizeof(sid), "snap_%d", i);
                sbx_add(f, id, "a", "running");
                snap_add(f, id, sid, "files", cove_now_ms() - 1000);
        }
        struct coved other;
        replica_open(f, &other);
        f->d.nodes_opt.max_starts_per_node = other.nodes_opt.max_starts_per_node = 16;
        int64_t late = node_row(f, "a").last_seen + 1501;
        struct race r1 = {&f->d, late, 0}, r2 = {&other, late, 0};
        pthread_t t1, t2;
        pthread_create(&t1, NULL, sweep_main, &r1);
        pthread_create(&t2, NULL, sweep_main, &r2);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        replica_close(&other);
        assert_true(r1.changed >= 0 && r2.changed >= 0);
        assert_int_equal(r1.changed + r2.changed, 6);
        char jobs[1024];
        claim_all(f, b, jobs, sizeof(jobs));
        for (int i = 0; i < 6; i++) {
                snprintf(id, sizeof(id), "recover:sbx_%d ", i);
                assert_int_equal(count(jobs, id), 1);
                snprintf(id, sizeof(id), "sbx_%d", i);
                assert_string_equal(placement(f, id).node, "b");
        }
}

static void recovery_respects_the_starts_cap(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 16, 200, FEAT);
        int b = node_up(f, "b", 16, 60000, FEAT);
        f->d.nodes_opt.max_starts_per_node = 4;
        char id[32], sid[32];
        for (int i = 0; i < 6; i++) {
                snprintf(id, sizeof(id), "sbx_%d", i);
                snprintf(sid, sizeof(sid), "snap_%d", i);
                sbx_add(f, id, "a", "running");
                snap_add(f, id, sid, "files", cove_now_ms() - 1000);
        }
        int64_t late = node_row(f, "a").last_seen + 1501;
        struct cove_err err = {0};
        assert_int_equal(coved_nodes_sweep(&f->d, late, &err), 4);
        assert_int_equal(coved_nodes_sweep(&f->d, late, &err), 0); /* b has 4 in flight */
        /* b finishes them: the other two follow */
        struct cove_job_row j;
        while (ops->job_claim(f->d.cat, "b", f->epoch[b], &j, &err) == 0) {
                assert_int_equal(
                    ops->job_finish(f->d.cat, j.id, "b", f->epoch[b], j.generation, 1, NULL, &err),
                    0);
                cove_job_row_clear(&j);
        }
        assert_int_equal(coved_nodes_sweep(&f->d, late, &err), 2);
        for (int i = 0; i < 6; i++) {
                snprintf(id, sizeof(id), "sbx_%d", i);
                assert_string_equal(placement(f, id).node, "b");
        }
}

/* ---- drain ---- */

static void drain_moves_each_sandbox_once(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 8, 60000, FEAT);
        node_up(f, "b", 8, 60000, FEAT);
        sbx_add(f, "sbx_1", "a", "running");
        sbx_add(f, "sbx_2", "a", "running");
        sbx_add(f, "sbx_3", "a", "paused");
        sbx_add(f, "sbx_b", "b", "running");
        nodes_run(f);
        json_t *out = NULL;
        struct cove_err err = {0};
        assert_int_equal(coved_node_admin(&f->d, "a", "drain", "key_admin", &out, &err), 0);
        assert_string_equal(json_string_value(json_object_get(out, "state")), "draining");
        json_decref(out);
        /* no new placement on a draining node */
        struct coved_place_want w = {.runtime = "ns", .template_name = "busybox", .cpus = 1};
        char node[64], why[256];
        for (int i = 0; i < 10; i++) {
                assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 0);
                assert_string_equal(node, "b");
        }
        int steps = 0, r;
        while ((r = coved_nodes_drain_step(&f->d, "a", &err)) == 0)
                assert_true(++steps <= 3);
        assert_int_equal(r, 1);
        assert_int_equal(steps, 3);
        for (int i = 1; i <= 3; i++) {
                char id[16];
                snprintf(id, sizeof(id), "sbx_%d", i);
                struct cove_placement_row p = placement(f, id);
                assert_string_equal(p.node, "b");
                assert_string_equal(p.desired_state, i == 3 ? "paused" : "running");
        }
        struct cove_sandbox_row s = sbx_get(f, "sbx_1");
        assert_string_equal(s.state, "running");
        assert_string_equal(s.node, "b");
        cove_sandbox_row_clear(&s);
        pthread_mutex_lock(&f->mu);
        /* each running one paused on a, then resumed on b, one after the other */
        assert_string_equal(f->log, "a:pause:sbx_1 b:resume:sbx_1 a:pause:sbx_2 b:resume:sbx_2 ");
        pthread_mutex_unlock(&f->mu);
        struct cove_node_row na = node_row(f, "a");
        assert_string_equal(na.state, "draining"); /* until uncordoned */
        assert_int_equal(na.alloc_cpus, 0);
        struct audit_x x;
        audit_read(f, &x);
        assert_int_equal(count(x.actions, "node.drain::"), 1);
        assert_int_equal(json_array_size(x.moves), 3);
        for (size_t i = 0; i < 2; i++) {
                json_t *m = json_array_get(x.moves, i);
                assert_string_equal(json_string_value(json_object_get(m, "from")), "a");
                assert_string_equal(json_string_value(json_object_get(m, "to")), "b");
                assert_string_equal(json_string_value(json_object_get(m, "restore")), "full");
                json_int_t wall = json_integer_value(json_object_get(m, "wall_ms"));
                json_int_t pause = json_integer_value(json_object_get(m, "pause_ms"));
                assert_true(pause >= 0 && wall >= pause);
                assert_non_null(
                    strstr(json_string_value(json_object_get(m, "snapshot_id")), "snap_sbx_"));
        }
        json_decref(x.moves);
        json_decref(x.recover);
}

static void drain_keeps_running_what_no_node_can_take(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 8, 60000, FEAT);
        node_up(f, "b", 1, 60000, FEAT);
        sbx_add(f, "sbx_b", "b", "running"); /* b is full */
        sbx_add(f, "sbx_1", "a", "running");
        nodes_run(f);
        json_t *out = NULL;
        struct cove_err err = {0};
        assert_int_equal(coved_node_admin(&f->d, "a", "drain", NULL, &out, &err), 0);
        json_decref(out);
        assert_int_equal(coved_nodes_drain_step(&f->d, "a", &err), 2);
        struct cove_placement_row p = placement(f, "sbx_1");
        assert_string_equal(p.node, "a");
        assert_string_equal(p.desired_state, "running");
        pthread_mutex_lock(&f->mu);
        assert_string_equal(f->log, ""); /* never paused */
        pthread_mutex_unlock(&f->mu);
        /* uncordon stops the drain */
        assert_int_equal(coved_node_admin(&f->d, "a", "uncordon", NULL, &out, &err), 0);
        json_decref(out);
        assert_int_equal(coved_nodes_drain_step(&f->d, "a", &err), 1);
}

static void drain_carries_on_after_a_replica_restart(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 8, 60000, FEAT);
        node_up(f, "b", 8, 60000, FEAT);
        sbx_add(f, "sbx_1", "a", "running");
        sbx_add(f, "sbx_2", "a", "running");
        sbx_add(f, "sbx_3", "a", "running");
        nodes_run(f);
        json_t *out = NULL;
        struct cove_err err = {0};
        assert_int_equal(coved_node_admin(&f->d, "a", "drain", NULL, &out, &err), 0);
        json_decref(out);
        assert_int_equal(coved_nodes_drain_step(&f->d, "a", &err), 0); /* one moved... */
        replica_close(&f->d); /* ...and the replica goes away */
        replica_open(f, &f->d);
        f->d.lease_ttl_ms = 60000; /* the nodes' own leases: nobody is lost here */
        assert_int_equal(coved_nodes_start(&f->d, &err), 0);
        int64_t deadline = cove_now_ms() + 60000;
        int done = 0;
        while (!done && cove_now_ms() < deadline) {
                done = 1;
                for (int i = 1; i <= 3; i++) {
                        char id[16];
                        snprintf(id, sizeof(id), "sbx_%d", i);
                        struct cove_placement_row p = placement(f, id);
                        struct cove_sandbox_row s = sbx_get(f, id);
                        done &= !strcmp(p.node, "b") && !strcmp(s.state, "running");
                        cove_sandbox_row_clear(&s);
                }
                struct timespec ts = {0, 20 * 1000000};
                nanosleep(&ts, NULL);
        }
        coved_nodes_stop(&f->d);
        assert_true(done);
        pthread_mutex_lock(&f->mu);
        for (int i = 1; i <= 3; i++) {
                char one[32];
                snprintf(one, sizeof(one), "a:pause:sbx_%d ", i);
                assert_int_equal(count(f->log, one), 1);
                snprintf(one, sizeof(one), "b:resume:sbx_%d ", i);
                assert_int_equal(count(f->log, one), 1);
        }
        pthread_mutex_unlock(&f->mu);
}

/* ---- admin and list ---- */

static void cordon_uncordon_and_the_list(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 4, 60000, FEAT);
        node_up(f, "b", 4, 60000, FEAT);
        sbx_add(f, "sbx_1", "a", "running");
        sbx_add(f, "sbx_2", "a", "paused");
        sbx_add(f, "sbx_3", "a", "stopped");
        json_t *out = NULL;
        struct cove_err err = {0};
        assert_int_equal(coved_node_admin(&f->d, "a", "cordon", "key_x", &out, &err), 0);
        assert_string_equal(json_string_value(json_object_get(out, "state")), "cordoned");
        json_decref(out);
        struct coved_place_want w = {.runtime = "ns", .cpus = 1};
        char node[64], why[256];
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 0);
        assert_string_equal(node, "b");
        assert_int_equal(coved_nodes_list(&f->d, &out, &err), 0);
        json_t *nodes = json_object_get(out, "nodes");
        assert_int_equal(json_array_size(nodes), 2);
        json_t *a = json_array_get(nodes, 0);
        assert_string_equal(json_string_value(json_object_get(a, "name")), "a");
        assert_string_equal(json_string_value(json_object_get(a, "state")), "cordoned");
        assert_true(json_is_true(json_object_get(json_object_get(a, "lease"), "live")));
        assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "lease"), "epoch")),
                         1);
        assert_int_equal(
            json_integer_value(json_object_get(json_object_get(a, "capacity"), "cpus")), 4);
        assert_int_equal(
            json_integer_value(json_object_get(json_object_get(a, "allocated"), "cpus")), 2);
        assert_int_equal(json_integer_value(json_object_get(a, "sandboxes")), 2);
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(a, "features"), "full")), "ok");
        json_decref(out);
        assert_int_equal(coved_node_admin(&f->d, "a", "uncordon", NULL, &out, &err), 0);
        assert_string_equal(json_string_value(json_object_get(out, "state")), "ready");
        json_decref(out);

        assert_int_equal(coved_node_admin(&f->d, "zz", "cordon", NULL, &out, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(coved_node_admin(&f->d, "A B\x01", "cordon", NULL, &out, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_null(strstr(err.msg, "A B"));
        assert_int_equal(coved_node_admin(&f->d, "a", "reboot", NULL, &out, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_int_equal(ops->node_set_state(f->d.cat, "b", "lost", &err), 0);
        assert_int_equal(coved_node_admin(&f->d, "b", "uncordon", NULL, &out, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);

        /* role all: no cluster nodes, whatever the catalog holds */
        f->d.role = COVED_ROLE_ALL;
        assert_int_equal(coved_nodes_list(&f->d, &out, &err), 0);
        assert_int_equal(json_array_size(json_object_get(out, "nodes")), 0);
        json_decref(out);
        assert_int_equal(coved_node_admin(&f->d, "a", "drain", NULL, &out, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        f->d.role = COVED_ROLE_CONTROL;
        struct audit_x x;
        audit_read(f, &x);
        assert_int_equal(count(x.actions, "node.cordon::"), 1);
        assert_int_equal(count(x.actions, "node.uncordon::"), 1);
        json_decref(x.moves);
        json_decref(x.recover);
}

/* sandbox id placed on node with an open job of kind (nobody claims it) */
static void job_add(struct fx *f, const char *id, const char *node, const char *kind)
{
        sbx_add(f, id, node, "starting");
        struct cove_err err = {0};
        if (place_as_control(f, id, node, "running", kind, -1, &err) < 0)
                fail_msg("place %s: %s", id, err.msg);
}

static void starts_in_flight_count_per_node(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 64, 60000, FEAT);
        node_up(f, "b", 8, 60000, FEAT);
        f->d.nodes_opt.max_starts_per_node = 2;
        job_add(f, "sbx_1", "a", "start");
        job_add(f, "sbx_p", "a", "pause"); /* not a start */
        struct coved_place_want w = {.runtime = "ns", .cpus = 1};
        char node[64], why[256];
        struct cove_err err = {0};
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 0);
        assert_string_equal(node, "a");
        job_add(f, "sbx_2", "a", "recover");
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 0);
        assert_string_equal(node, "b"); /* a has 2 starts in flight */
        job_add(f, "sbx_3", "b", "resume");
        job_add(f, "sbx_4", "b", "start");
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 1);
        assert_non_null(strstr(why, "a: 2 starts in flight (cap 2)"));
        assert_non_null(strstr(why, "b: 2 starts in flight (cap 2)"));
        /* a start the node finished no longer counts */
        struct cove_job_row j;
        assert_int_equal(ops->job_claim(f->d.cat, "b", f->epoch[1], &j, &err), 0);
        assert_int_equal(
            ops->job_finish(f->d.cat, j.id, "b", f->epoch[1], j.generation, 1, NULL, &err), 0);
        cove_job_row_clear(&j);
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 0);
        assert_string_equal(node, "b");
}

static void cpus_are_overcommitted_memory_is_not(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 2, 60000, FEAT); /* 2 cpus, 2048 MB, 8192 MB disk */
        sbx_add(f, "sbx_1", "a", "running");
        sbx_add(f, "sbx_2", "a", "running");
        struct coved_place_want w = {.runtime = "ns", .cpus = 1, .memory_mb = 256};
        char node[64], why[256];
        struct cove_err err = {0};
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 1);
        assert_non_null(strstr(why, "a: free 0 cpus"));
        f->d.nodes_opt.cpu_overcommit = 4; /* 8 sandbox cpus on 2 */
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 0);
        assert_string_equal(node, "a");
        w.memory_mb = 1025; /* 2 × 512 MB placed: 1024 MB left, never overcommitted */
        assert_int_equal(coved_place(&f->d, &w, node, why, sizeof(why), &err), 1);
        assert_non_null(strstr(why, "1024 MB memory"));
}

struct counts {
        char text[256];
};

static int count_cb(const char *name, int64_t n, void *arg)
{
        struct counts *x = arg;
        size_t len = strlen(x->text);
        snprintf(x->text + len, sizeof(x->text) - len, "%s=%lld ", name, (long long)n);
        return 0;
}

static void job_counts_per_node(void **state)
{
        struct fx *f = *state;
        node_up(f, "a", 8, 60000, FEAT);
        node_up(f, "b", 8, 60000, FEAT);
        job_add(f, "sbx_1", "a", "start");
        job_add(f, "sbx_2", "a", "resume");
        job_add(f, "sbx_3", "b", "recover");
        job_add(f, "sbx_4", "b", "snapshot");
        struct counts x = {""};
        struct cove_err err = {0};
        assert_int_equal(ops->job_counts(f->d.cat, "start, resume,recover", count_cb, &x, &err), 0);
        assert_string_equal(x.text, "a=2 b=1 ");
        /* moving sbx_2 to b supersedes its job on a: one new job on b instead */
        assert_int_equal(place_as_control(f, "sbx_2", "b", "running", "resume", -1, &err), 0);
        memset(&x, 0, sizeof(x));
        assert_int_equal(ops->job_counts(f->d.cat, "start,resume,recover", count_cb, &x, &err), 0);
        assert_string_equal(x.text, "a=1 b=2 ");
        memset(&x, 0, sizeof(x));
        assert_int_equal(ops->job_counts(f->d.cat, "", count_cb, &x, &err), 0);
        assert_string_equal(x.text, "");
        char big[400];
        memset(big, 'k', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        assert_int_equal(ops->job_counts(f->d.cat, big, count_cb, &x, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
}

/* What a node's start-up reconcile leaves of sandbox id (placed on node i): the row paused
 * at snapshot snap, observed "paused" under the node's epoch, the desired state as it was. */
static void reconciled_paused(struct fx *f, int i, const char *id, const char *snap)
{
        struct cove_err err = {0};
        snap_add(f, id, snap, "files", cove_now_ms());
        struct cove_sandbox_row r = sbx_get(f, id);
        snprintf(r.state, sizeof(r.state), "paused");
        snprintf(r.last_snapshot_id, sizeof(r.last_snapshot_id), "%s", snap);
        assert_int_equal(ops->sandbox_update(f->d.cat, &r, &err), 0);
        cove_sandbox_row_clear(&r);
        struct cove_placement_row p = placement(f, id);
        assert_int_equal(ops->placement_observe(f->d.cat, id, f->names[i], f->epoch[i],
                                                p.generation, "paused", NULL, &err),
                         0);
}

/* Claim node i's oldest job and finish it done, without any observation. */
static void finish_next(struct fx *f, int i, const char *want)
{
        struct cove_job_row j;
        struct cove_err err = {0};
        assert_int_equal(ops->job_claim(f->d.cat, f->names[i], f->epoch[i], &j, &err), 0);
        char got[96];
        snprintf(got, sizeof(got), "%s:%s", j.kind, j.sandbox_id);
        assert_string_equal(got, want);
        assert_int_equal(
            ops->job_finish(f->d.cat, j.id, f->names[i], f->epoch[i], j.generation, 1, "{}", &err),
            0);
        cove_job_row_clear(&j);
}

static void restarted_node_resumes_what_its_reconcile_paused(void **state)
{
        struct fx *f = *state;
        struct cove_err err = {0};
        int a = node_up(f, "a", 8, 60000, FEAT);
        sbx_add(f, "sbx_run", "a", "running");   /* desired running: resumed */
        sbx_add(f, "sbx_user", "a", "paused");   /* paused by its user: left */
        sbx_add(f, "sbx_asked", "a", "running"); /* resumed since, not reported: left */
        reconciled_paused(f, a, "sbx_run", "snap_run");
        reconciled_paused(f, a, "sbx_user", "snap_user");
        reconciled_paused(f, a, "sbx_asked", "snap_asked");
        int64_t gen = placement(f, "sbx_run").generation;

        /* nothing while the node has a job open (one its old process claimed converges) */
        assert_int_equal(place_as_control(f, "sbx_asked", "a", "running", "resume", -1, &err), 0);
        assert_int_equal(coved_nodes_resume_restarted(&f->d, "a", NULL, &err), 0);
        assert_int_equal(placement(f, "sbx_run").generation, gen);
        finish_next(f, a, "resume:sbx_asked"); /* its observation not in yet */

        json_t *tried = json_object();
        assert_int_equal(coved_nodes_resume_restarted(&f->d, "a", tried, &err), 1);
        struct cove_placement_row p = placement(f, "sbx_run");
        assert_string_equal(p.node, "a");
        assert_string_equal(p.desired_state, "running");
        assert_int_equal(p.generation, gen + 1);
        assert_string_equal(placement(f, "sbx_user").desired_state, "paused");
        int64_t asked = placement(f, "sbx_asked").generation;
        finish_next(f, a, "resume:sbx_run");
        assert_int_equal(placement(f, "sbx_asked").generation, asked);
        /* once per sandbox for a tried set: a resume that failed (the row still paused,
         * observed paused again) is not placed twice */
        p = placement(f, "sbx_run");
        assert_int_equal(ops->placement_observe(f->d.cat, "sbx_run", "a", f->epoch[a], p.generation,
                                                "paused", NULL, &err),
                         0);
        assert_int_equal(coved_nodes_resume_restarted(&f->d, "a", tried, &err), 0);
        assert_int_equal(placement(f, "sbx_run").generation, gen + 1);
        json_decref(tried);
        /* the set is what held it back: without one it is placed again */
        assert_int_equal(coved_nodes_resume_restarted(&f->d, "a", NULL, &err), 1);
        assert_int_equal(placement(f, "sbx_run").generation, gen + 2);
        assert_string_equal(placement(f, "sbx_user").desired_state, "paused");
}

static int run_all(const char *name)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(lost_only_after_ttl_and_grace, setup, teardown),
            cmocka_unit_test_setup_teardown(lost_node_sandboxes_recover_elsewhere, setup, teardown),
            cmocka_unit_test_setup_teardown(lost_recovery_waits_for_a_node, setup, teardown),
            cmocka_unit_test_setup_teardown(two_replicas_recover_once, setup, teardown),
            cmocka_unit_test_setup_teardown(recovery_respects_the_starts_cap, setup, teardown),
            cmocka_unit_test_setup_teardown(drain_moves_each_sandbox_once, setup, teardown),
            cmocka_unit_test_setup_teardown(drain_keeps_running_what_no_node_can_take, setup,
                                            teardown),
            cmocka_unit_test_setup_teardown(drain_carries_on_after_a_replica_restart, setup,
                                            teardown),
            cmocka_unit_test_setup_teardown(cordon_uncordon_and_the_list, setup, teardown),
            cmocka_unit_test_setup_teardown(starts_in_flight_count_per_node, setup, teardown),
            cmocka_unit_test_setup_teardown(job_counts_per_node, setup, teardown),
            cmocka_unit_test_setup_teardown(cpus_are_overcommitted_memory_is_not, setup, teardown),
            cmocka_unit_test_setup_teardown(restarted_node_resumes_what_its_reconcile_paused, setup,
                                            teardown),
        };
        return _cmocka_run_group_tests(name, tests, sizeof(tests) / sizeof(tests[0]), NULL, NULL);
}

int main(void)
{
        return catfx_main("nodes", run_all, &ops);
}
