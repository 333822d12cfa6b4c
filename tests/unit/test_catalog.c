/* Unit tests for the SQLite catalog (store/catalog_sqlite.c): migrations, tenant isolation,
 * sandbox CRUD and filters, JSON round trips, crash safety under SIGKILL, and op cost. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/catalog.h"
#include "util/util.h"

static const struct cove_catalog_ops *ops = &cove_catalog_sqlite;

struct fx {
        char dir[64];
        char path[128];
        struct cove_catalog *c;
};

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        strcpy(f->dir, "/tmp/cove-test-cat-XXXXXX");
        if (!mkdtemp(f->dir))
                return -1;
        snprintf(f->path, sizeof(f->path), "%s/catalog.db", f->dir);
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fx *f = *state;
        if (f->c)
                ops->close(f->c);
        cove_rm_rf(f->dir, NULL);
        free(f);
        return 0;
}

static struct cove_catalog *open_ok(struct fx *f)
{
        struct cove_err err = {0};
        struct cove_catalog *c = ops->open(f->path, &err);
        if (!c)
                fail_msg("open: %s", err.msg);
        return c;
}

/* Raw access for checks the ops do not expose. */
static sqlite3 *raw_open(const char *path)
{
        sqlite3 *db = NULL;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        return db;
}

static int64_t raw_int(sqlite3 *db, const char *sql)
{
        sqlite3_stmt *s;
        assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        int64_t v = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
        return v;
}

static void raw_text(sqlite3 *db, const char *sql, char *out, size_t cap)
{
        sqlite3_stmt *s;
        assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        snprintf(out, cap, "%s", (const char *)sqlite3_column_text(s, 0));
        sqlite3_finalize(s);
}

static void add_tenant(struct cove_catalog *c, const char *id)
{
        struct cove_tenant_row t = {0};
        struct cove_err err = {0};
        snprintf(t.id, sizeof(t.id), "%s", id);
        snprintf(t.name, sizeof(t.name), "tenant %s", id);
        t.created_at = 1000;
        if (ops->tenant_put(c, &t, &err) < 0)
                fail_msg("tenant_put: %s", err.msg);
}

static void mkrow(struct cove_sandbox_row *r, const char *id, const char *tenant, const char *state,
                  int64_t created)
{
        memset(r, 0, sizeof(*r));
        snprintf(r->id, sizeof(r->id), "%s", id);
        snprintf(r->tenant, sizeof(r->tenant), "%s", tenant);
        snprintf(r->state, sizeof(r->state), "%s", state);
        strcpy(r->template_name, "base");
        strcpy(r->runtime, "ns");
        r->created_at = created;
        r->expires_at = created + 300000;
        r->cpus = 2;
        r->memory_mb = 512;
        r->disk_mb = 2048;
        r->timeout_s = 300;
        strcpy(r->on_timeout, "kill");
        strcpy(r->node, "node-1");
        r->metadata_json = "{\"k\":\"v\"}";
        r->env_json = "{\"A\":\"1\"}";
}

/* ---- migrations ---- */

static void migrations_from_empty(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        int v = -1;
        struct cove_err err = {0};
        assert_int_equal(ops->schema_version(f->c, &v, &err), 0);
        assert_true(v >= 1);

        sqlite3 *db = raw_open(f->path);
        assert_int_equal(raw_int(db, "SELECT count(*) FROM schema_migrations"), v);
        assert_int_equal(raw_int(db, "SELECT max(version) FROM schema_migrations"), v);
        assert_int_equal(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND "
                                     "name IN ('tenants','api_keys','sandboxes')"),
                         3);
        char mode[16];
        raw_text(db, "PRAGMA journal_mode", mode, sizeof(mode));
        assert_string_equal(mode, "wal");
        sqlite3_close(db);

        struct stat st;
        assert_int_equal(stat(f->path, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
}

static void reopen_is_noop(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        ops->close(f->c);
        sqlite3 *db = raw_open(f->path);
        int64_t rows = raw_int(db, "SELECT count(*) FROM schema_migrations");
        int64_t sum = raw_int(db, "SELECT sum(applied_at * version) FROM schema_migrations");
        int64_t cookie = raw_int(db, "PRAGMA schema_version");
        sqlite3_close(db);

        f->c = open_ok(f);
        int v = -1;
        assert_int_equal(ops->schema_version(f->c, &v, NULL), 0);
        assert_int_equal(v, rows);
        db = raw_open(f->path);
        assert_int_equal(raw_int(db, "SELECT count(*) FROM schema_migrations"), rows);
        assert_int_equal(raw_int(db, "SELECT sum(applied_at * version) FROM schema_migrations"),
                         sum);
        /* the schema cookie changes on any DDL: nothing was re-applied */
        assert_int_equal(raw_int(db, "PRAGMA schema_version"), cookie);
        sqlite3_close(db);
}

static void newer_schema_refused(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        int v = 0;
        assert_int_equal(ops->schema_version(f->c, &v, NULL), 0);
        ops->close(f->c);
        f->c = NULL;

        sqlite3 *db = raw_open(f->path);
        char sql[128];
        snprintf(sql, sizeof(sql), "INSERT INTO schema_migrations VALUES (%d, 1)", v + 1);
        assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);

        struct cove_err err = {0};
        assert_null(ops->open(f->path, &err));
        assert_non_null(strstr(err.msg, "newer"));
        assert_non_null(strstr(err.msg, f->path));
        db = raw_open(f->path);
        assert_int_equal(raw_int(db, "SELECT max(version) FROM schema_migrations"), v + 1);
        sqlite3_close(db);
}

/* ---- sandboxes ---- */

struct collect {
        int n;
        char ids[16][64];
};

static int collect_cb(const struct cove_sandbox_row *row, void *arg)
{
        struct collect *col = arg;
        if (col->n < 16)
                snprintf(col->ids[col->n], 64, "%s", row->id);
        col->n++;
        return 0;
}

static int list(struct cove_catalog *c, const char *tenant, const char *states, struct collect *col)
{
        memset(col, 0, sizeof(*col));
        struct cove_err err = {0};
        int r = ops->sandbox_list(c, tenant, states, collect_cb, col, &err);
        if (r < 0)
                fail_msg("list: %s", err.msg);
        return col->n;
}

static void sandbox_crud_and_filters(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        struct cove_catalog *c = f->c;
        struct cove_err err = {0};
        add_tenant(c, "t1");
        add_tenant(c, "t2");
        struct cove_sandbox_row a, b, d, got;
        mkrow(&a, "sbx_a", "t1", "running", 3000);
        mkrow(&b, "sbx_b", "t1", "paused", 1000); /* older: listed first */
        mkrow(&d, "sbx_d", "t2", "running", 2000);
        a.uid_base = 100000;
        assert_int_equal(ops->sandbox_insert(c, &a, &err), 0);
        assert_int_equal(ops->sandbox_insert(c, &b, &err), 0);
        assert_int_equal(ops->sandbox_insert(c, &d, &err), 0);

        /* duplicate id, reused uid range, unknown tenant, bad state, bad JSON */
        assert_int_equal(ops->sandbox_insert(c, &a, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_non_null(strstr(err.msg, "sbx_a"));
        struct cove_sandbox_row x;
        mkrow(&x, "sbx_x", "t2", "running", 1);
        x.uid_base = 100000;
        assert_int_equal(ops->sandbox_insert(c, &x, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        mkrow(&x, "sbx_x", "nobody", "running", 1);
        assert_int_equal(ops->sandbox_insert(c, &x, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        mkrow(&x, "sbx_x", "t1", "flying", 1);
        assert_int_equal(ops->sandbox_insert(c, &x, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        mkrow(&x, "sbx_x", "t1", "running", 1);
        x.metadata_json = "[1,2]";
        assert_int_equal(ops->sandbox_insert(c, &x, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        x.metadata_json = "{\"broken\":";
        assert_int_equal(ops->sandbox_insert(c, &x, &err), -1);
        assert_int_equal(ops->sandbox_get(c, NULL, "sbx_x", &got, &err), 1);

        /* get: every column back */
        assert_int_equal(ops->sandbox_get(c, "t1", "sbx_a", &got, &err), 0);
        assert_string_equal(got.id, "sbx_a");
        assert_string_equal(got.tenant, "t1");
        assert_string_equal(got.state, "running");
        assert_string_equal(got.template_name, "base");
        assert_string_equal(got.runtime, "ns");
        assert_int_equal(got.created_at, 3000);
        assert_int_equal(got.expires_at, 303000);
        assert_int_equal(got.cpus, 2);
        assert_int_equal(got.memory_mb, 512);
        assert_int_equal(got.disk_mb, 2048);
        assert_int_equal(got.timeout_s, 300);
        assert_string_equal(got.on_timeout, "kill");
        assert_int_equal(got.uid_base, 100000);
        assert_string_equal(got.node, "node-1");
        assert_string_equal(got.last_snapshot_id, "");
        assert_string_equal(got.metadata_json, "{\"k\":\"v\"}");
        assert_string_equal(got.env_json, "{\"A\":\"1\"}");
        assert_null(got.error);
        cove_sandbox_row_clear(&got);

        /* another tenant's id is not found, for get and update */
        assert_int_equal(ops->sandbox_get(c, "t2", "sbx_a", &got, &err), 1);
        struct cove_sandbox_row steal = a;
        strcpy(steal.tenant, "t2");
        strcpy(steal.state, "stopped");
        assert_int_equal(ops->sandbox_update(c, &steal, &err), 1);

        /* update overwrites every column */
        a.metadata_json = NULL; /* stored as {} */
        strcpy(a.state, "paused");
        strcpy(a.last_snapshot_id, "snap_1");
        strcpy(a.on_timeout, "pause");
        a.uid_base = 0;
        a.error = "disk full";
        a.timeout_s = 60;
        assert_int_equal(ops->sandbox_update(c, &a, &err), 0);
        assert_int_equal(ops->sandbox_get(c, NULL, "sbx_a", &got, &err), 0);
        assert_string_equal(got.state, "paused");
        assert_string_equal(got.last_snapshot_id, "snap_1");
        assert_string_equal(got.on_timeout, "pause");
        assert_int_equal(got.uid_base, 0);
        assert_string_equal(got.error, "disk full");
        assert_int_equal(got.timeout_s, 60);
        assert_string_equal(got.metadata_json, "{}");
        cove_sandbox_row_clear(&got);
        struct cove_sandbox_row ghost;
        mkrow(&ghost, "sbx_ghost", "t1", "running", 1);
        assert_int_equal(ops->sandbox_update(c, &ghost, &err), 1);

        /* list: tenant, states, order */
        struct collect col;
        assert_int_equal(list(c, "t1", NULL, &col), 2);
        assert_string_equal(col.ids[0], "sbx_b");
        assert_string_equal(col.ids[1], "sbx_a");
        assert_int_equal(list(c, NULL, NULL, &col), 3);
        assert_string_equal(col.ids[0], "sbx_b");
        assert_string_equal(col.ids[1], "sbx_d");
        assert_string_equal(col.ids[2], "sbx_a");
        assert_int_equal(list(c, "t1", "running", &col), 0);
        assert_int_equal(list(c, "t2", "running", &col), 1);
        assert_string_equal(col.ids[0], "sbx_d");
        assert_int_equal(list(c, NULL, " running , bogus", &col), 1);
        assert_int_equal(list(c, NULL, "paused,running", &col), 3);
        assert_int_equal(list(c, "t1", "paused", &col), 2);
        assert_int_equal(list(c, NULL, "bogus", &col), 0);
        assert_int_equal(list(c, NULL, "run", &col), 0);          /* no prefix match */
        assert_int_equal(list(c, NULL, "running,paus", &col), 1); /* no substring match */
        assert_int_equal(list(c, NULL, "", &col), 3);
        assert_int_equal(list(c, NULL, ",,", &col), 3);
        assert_int_equal(list(c, NULL, "x' OR 1=1 --", &col), 0);
        assert_int_equal(list(c, "t1' OR '1'='1", NULL, &col), 0);
        assert_int_equal(list(c, "t3", NULL, &col), 0);

        /* delete */
        assert_int_equal(ops->sandbox_delete(c, "sbx_b", &err), 0);
        assert_int_equal(ops->sandbox_get(c, NULL, "sbx_b", &got, &err), 1);
        assert_int_equal(ops->sandbox_delete(c, "sbx_b", &err), 1);
        assert_int_equal(list(c, "t1", NULL, &col), 1);

        /* survives reopen */
        ops->close(f->c);
        f->c = open_ok(f);
        assert_int_equal(ops->sandbox_get(f->c, "t2", "sbx_d", &got, &err), 0);
        assert_string_equal(got.state, "running");
        cove_sandbox_row_clear(&got);
}

static void metadata_unicode_roundtrip(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        add_tenant(f->c, "t1");
        struct cove_sandbox_row r, got;
        struct cove_err err = {0};
        const char *meta = "{\"name\":\"café ☕ 日本語 🚀\",\"esc\":\"\\u00e9\\n\\\"q\\\"\","
                           "\"nested\":{\"a\":[1,2.5,null,true]},\"empty\":\"\"}";
        const char *env = "{\"LANG\":\"C.UTF-8\",\"GREETING\":\"привет\"}";
        mkrow(&r, "sbx_u", "t1", "starting", 5);
        r.metadata_json = (char *)meta;
        r.env_json = (char *)env;
        r.error = "ошибка: 💥";
        assert_int_equal(ops->sandbox_insert(f->c, &r, &err), 0);
        assert_int_equal(ops->sandbox_get(f->c, "t1", "sbx_u", &got, &err), 0);
        assert_string_equal(got.metadata_json, meta);
        assert_string_equal(got.env_json, env);
        assert_string_equal(got.error, "ошибка: 💥");
        cove_sandbox_row_clear(&got);
}

struct reenter {
        struct cove_catalog *c;
        int seen;
};

/* A list callback may call back into the catalog (no deadlock), and <0 stops the list. */
static int reenter_cb(const struct cove_sandbox_row *row, void *arg)
{
        struct reenter *re = arg;
        struct cove_sandbox_row upd = *row;
        strcpy(upd.state, "stopped");
        if (cove_catalog_sqlite.sandbox_update(re->c, &upd, NULL) != 0)
                return -1;
        re->seen++;
        return re->seen == 2 ? -1 : 0;
}

static void list_callback_reenters_and_stops(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        add_tenant(f->c, "t1");
        for (int i = 0; i < 4; i++) {
                struct cove_sandbox_row r;
                char id[32];
                snprintf(id, sizeof(id), "sbx_%d", i);
                mkrow(&r, id, "t1", "running", 10 + i);
                assert_int_equal(ops->sandbox_insert(f->c, &r, NULL), 0);
        }
        struct reenter re = {f->c, 0};
        assert_int_equal(ops->sandbox_list(f->c, "t1", "running", reenter_cb, &re, NULL), 0);
        assert_int_equal(re.seen, 2);
        struct collect col;
        assert_int_equal(list(f->c, "t1", "stopped", &col), 2);
        assert_string_equal(col.ids[0], "sbx_0");
        assert_string_equal(col.ids[1], "sbx_1");
        assert_int_equal(list(f->c, "t1", "running", &col), 2);
}

/* ---- crash safety ---- */

#define CRASH_MIN_ACKED 300

static void child_insert_loop(const char *path, int wfd)
{
        struct cove_catalog *c = cove_catalog_sqlite.open(path, NULL);
        if (!c)
                _exit(2);
        for (int i = 0;; i++) {
                struct cove_sandbox_row r;
                char id[32], meta[64];
                snprintf(id, sizeof(id), "sbx_crash_%07d", i);
                snprintf(meta, sizeof(meta), "{\"i\":%d,\"pad\":\"%0*d\"}", i, 40, i);
                mkrow(&r, id, "t1", "running", 1000 + i);
                r.metadata_json = meta;
                if (cove_catalog_sqlite.sandbox_insert(c, &r, NULL) != 0)
                        _exit(3);
                /* committed: acknowledge */
                if (write(wfd, &i, sizeof(i)) != (ssize_t)sizeof(i))
                        _exit(4);
        }
}

struct crash_check {
        int n;
        int bad;
};

static int crash_cb(const struct cove_sandbox_row *row, void *arg)
{
        struct crash_check *cc = arg;
        char id[32], meta[64];
        snprintf(id, sizeof(id), "sbx_crash_%07d", cc->n);
        snprintf(meta, sizeof(meta), "{\"i\":%d,\"pad\":\"%0*d\"}", cc->n, 40, cc->n);
        if (strcmp(row->id, id) != 0 || strcmp(row->metadata_json, meta) != 0 ||
            row->created_at != 1000 + cc->n)
                cc->bad++;
        cc->n++;
        return 0;
}

static void sigkill_midwrite_keeps_db_intact(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        add_tenant(f->c, "t1");
        ops->close(f->c);
        f->c = NULL;

        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                close(p[0]);
                child_insert_loop(f->path, p[1]);
        }
        close(p[1]);
        int last = -1, v;
        while (last + 1 < CRASH_MIN_ACKED && read(p[0], &v, sizeof(v)) == (ssize_t)sizeof(v))
                last = v;
        assert_int_equal(kill(pid, SIGKILL), 0);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        /* acknowledgements written before the kill are still in the pipe */
        while (read(p[0], &v, sizeof(v)) == (ssize_t)sizeof(v))
                last = v;
        close(p[0]);
        assert_true(last + 1 >= CRASH_MIN_ACKED);

        f->c = open_ok(f);
        sqlite3 *db = raw_open(f->path);
        char ic[64];
        raw_text(db, "PRAGMA integrity_check", ic, sizeof(ic));
        assert_string_equal(ic, "ok");
        sqlite3_close(db);
        struct crash_check cc = {0, 0};
        assert_int_equal(ops->sandbox_list(f->c, "t1", NULL, crash_cb, &cc, NULL), 0);
        assert_int_equal(cc.bad, 0);
        /* every acknowledged commit survived (at most one more, committed but unacked) */
        assert_true(cc.n >= last + 1);
        assert_true(cc.n <= last + 2);
}

/* ---- cost of the create-path ops ---- */

static void op_cost(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        add_tenant(f->c, "t1");
        enum { N = 2000 };
        struct cove_sandbox_row r, got;
        struct cove_err err = {0};
        char id[64];
        int64_t t0 = cove_mono_ns();
        for (int i = 0; i < N; i++) {
                snprintf(id, sizeof(id), "sbx_perf_%06d", i);
                mkrow(&r, id, "t1", "starting", i);
                if (ops->sandbox_insert(f->c, &r, &err) != 0)
                        fail_msg("insert: %s", err.msg);
        }
        int64_t t1 = cove_mono_ns();
        for (int i = 0; i < N; i++) {
                snprintf(id, sizeof(id), "sbx_perf_%06d", i);
                mkrow(&r, id, "t1", "running", i);
                if (ops->sandbox_update(f->c, &r, &err) != 0)
                        fail_msg("update: %s", err.msg);
        }
        int64_t t2 = cove_mono_ns();
        for (int i = 0; i < N; i++) {
                snprintf(id, sizeof(id), "sbx_perf_%06d", i);
                if (ops->sandbox_get(f->c, "t1", id, &got, &err) != 0)
                        fail_msg("get: %s", err.msg);
                cove_sandbox_row_clear(&got);
        }
        int64_t t3 = cove_mono_ns();
        double ins = (double)(t1 - t0) / N / 1000, upd = (double)(t2 - t1) / N / 1000,
               get = (double)(t3 - t2) / N / 1000;
        print_message("catalog cost per op (N=%d): insert %.1f us, update %.1f us, get %.1f us\n",
                      N, ins, upd, get);
        assert_true(ins < 1000.0);
        assert_true(upd < 1000.0);
        assert_true(get < 1000.0);
}

static int count_tenant(const struct cove_tenant_row *t, void *arg)
{
        (void)t;
        (*(int *)arg)++;
        return 0;
}

static int check_key(const struct cove_apikey_row *k, void *arg)
{
        assert_string_equal(k->salt_hex, ""); /* a list never hands out salt or hash */
        assert_string_equal(k->hash_hex, "");
        (*(int *)arg)++;
        return 0;
}

/* Schema 4: quotas round-trip, deletion is one-way and hides the tenant from the list, and
 * a tenant's key list carries no secrets. */
static void tenant_quotas_delete_and_key_list(void **state)
{
        struct fx *f = *state;
        struct cove_catalog *c = f->c = open_ok(f); /* teardown closes it */
        struct cove_err err = {0};
        struct cove_tenant_row t = {0}, g;
        snprintf(t.id, sizeof(t.id), "ten_q");
        snprintf(t.name, sizeof(t.name), "q");
        t.created_at = 5;
        t.max_sandboxes = 3;
        t.max_cpus = 4;
        t.max_memory_mb = 1024;
        t.max_storage_mb = 1 << 20;
        assert_int_equal(ops->tenant_put(c, &t, &err), 0);
        assert_int_equal(ops->tenant_get(c, "ten_q", &g, &err), 0);
        assert_int_equal(g.max_sandboxes, 3);
        assert_int_equal(g.max_cpus, 4);
        assert_int_equal(g.max_memory_mb, 1024);
        assert_int_equal(g.max_storage_mb, 1 << 20);
        assert_int_equal(g.deleted_at, 0);
        add_tenant(c, "ten_other");
        int n = 0;
        assert_int_equal(ops->tenant_list(c, count_tenant, &n, &err), 0);
        assert_int_equal(n, 2);
        struct cove_apikey_row k = {0};
        snprintf(k.id, sizeof(k.id), "key_aaaaaaaaaaaaaaaaaaaa");
        snprintf(k.tenant, sizeof(k.tenant), "ten_q");
        memset(k.salt_hex, 'a', 64);
        memset(k.hash_hex, 'b', 64);
        k.created_at = 7;
        assert_int_equal(ops->apikey_put(c, &k, &err), 0);
        n = 0;
        assert_int_equal(ops->apikey_list(c, "ten_q", check_key, &n, &err), 0);
        assert_int_equal(n, 1);
        n = 0;
        assert_int_equal(ops->apikey_list(c, "ten_other", check_key, &n, &err), 0);
        assert_int_equal(n, 0);
        g.deleted_at = 99;
        assert_int_equal(ops->tenant_put(c, &g, &err), 0);
        g.deleted_at = 0; /* a put never undeletes */
        assert_int_equal(ops->tenant_put(c, &g, &err), 0);
        assert_int_equal(ops->tenant_get(c, "ten_q", &g, &err), 0);
        assert_int_equal(g.deleted_at, 99);
        n = 0;
        assert_int_equal(ops->tenant_list(c, count_tenant, &n, &err), 0);
        assert_int_equal(n, 1);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(migrations_from_empty, setup, teardown),
            cmocka_unit_test_setup_teardown(reopen_is_noop, setup, teardown),
            cmocka_unit_test_setup_teardown(newer_schema_refused, setup, teardown),
            cmocka_unit_test_setup_teardown(sandbox_crud_and_filters, setup, teardown),
            cmocka_unit_test_setup_teardown(metadata_unicode_roundtrip, setup, teardown),
            cmocka_unit_test_setup_teardown(list_callback_reenters_and_stops, setup, teardown),
            cmocka_unit_test_setup_teardown(sigkill_midwrite_keeps_db_intact, setup, teardown),
            cmocka_unit_test_setup_teardown(op_cost, setup, teardown),
            cmocka_unit_test_setup_teardown(tenant_quotas_delete_and_key_list, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
