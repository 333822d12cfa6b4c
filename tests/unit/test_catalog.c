/* Contract tests of the catalog (store/catalog.h): migrations, tenant isolation, sandbox
 * CRUD and filters, JSON round trips, crash safety under SIGKILL, op cost, the cluster's
 * leases, placements and jobs, and audit appends from two writers. They run on SQLite,
 * then again on PostgreSQL when COVE_TEST_PG_URL names a server (each test in a database
 * of its own; tests/integration/test_pg_catalog.py starts one and sets it). With
 * COVE_TEST_PG_STOP / COVE_TEST_PG_START (shell commands) a restart test runs too, and with
 * COVE_TEST_PG_FREEZE / COVE_TEST_PG_THAW (SIGSTOP / SIGCONT of the server) a hung-server
 * test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control/audit.h"
#include "control/tenant.h"
#include "crypto/keys.h"
#include "catalog_fixture.h"
#include "store/catalog.h"
#include "util/util.h"

/* the backend under test: SQLite first, then PostgreSQL (main) */
static const struct cove_catalog_ops *ops; /* the backend under test (catfx_main) */

struct fx {
        struct catfx db;
        struct cove_catalog *c;
};

static int setup(void **state)
{
        struct fx *f = calloc(1, sizeof(*f));
        if (catfx_create(&f->db, ops, "cat") < 0)
                return -1;
        *state = f;
        return 0;
}

static int teardown(void **state)
{
        struct fx *f = *state;
        if (f->c)
                ops->close(f->c);
        catfx_drop(&f->db);
        free(f);
        return 0;
}

/* A value of one row and column of sql on the test's own database, either backend. */
static int64_t any_int(struct fx *f, const char *sql)
{
        if (!f->db.pg) {
                sqlite3 *db = NULL;
                sqlite3_stmt *s;
                assert_int_equal(sqlite3_open(f->db.path, &db), SQLITE_OK);
                assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
                int rc = sqlite3_step(s);
                assert_true(rc == SQLITE_ROW || rc == SQLITE_DONE);
                int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
                sqlite3_finalize(s);
                sqlite3_close(db);
                return v;
        }
        PGconn *conn = PQconnectdb(f->db.path);
        assert_int_equal(PQstatus(conn), CONNECTION_OK);
        PGresult *res = PQexec(conn, sql);
        if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
                fail_msg("%s: %s", sql, PQerrorMessage(conn));
        int64_t v = PQntuples(res) ? strtoll(PQgetvalue(res, 0, 0), NULL, 10) : 0;
        PQclear(res);
        PQfinish(conn);
        return v;
}

static struct cove_catalog *open_ok(struct fx *f)
{
        struct cove_err err = {0};
        struct cove_catalog *c = ops->open(f->db.path, &err);
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
        assert_int_equal(any_int(f, "SELECT count(*) FROM schema_migrations"), v);
        assert_int_equal(any_int(f, "SELECT max(version) FROM schema_migrations"), v);
        if (f->db.pg) {
                assert_int_equal(any_int(f, "SELECT count(*) FROM information_schema.tables"
                                            " WHERE table_name IN ('tenants','api_keys',"
                                            "'sandboxes','nodes','placements','jobs')"),
                                 6);
                return;
        }

        sqlite3 *db = raw_open(f->db.path);
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
        assert_int_equal(stat(f->db.path, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
}

/* pg: the catalog rows of the schema's tables change with any DDL */
#define PG_DDL_COOKIE                                                                              \
        "SELECT sum(xmin::text::bigint) FROM pg_class WHERE relnamespace = 'public'::regnamespace"

static void reopen_is_noop(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        ops->close(f->c);
        if (f->db.pg) {
                int64_t rows = any_int(f, "SELECT count(*) FROM schema_migrations");
                int64_t sum = any_int(f, "SELECT sum(applied_at * version) FROM schema_migrations");
                int64_t cookie = any_int(f, PG_DDL_COOKIE);
                f->c = open_ok(f);
                int v = -1;
                assert_int_equal(ops->schema_version(f->c, &v, NULL), 0);
                assert_int_equal(v, rows);
                assert_int_equal(any_int(f, "SELECT count(*) FROM schema_migrations"), rows);
                assert_int_equal(any_int(f, "SELECT sum(applied_at * version) FROM "
                                            "schema_migrations"),
                                 sum);
                assert_int_equal(any_int(f, PG_DDL_COOKIE), cookie);
                return;
        }
        sqlite3 *db = raw_open(f->db.path);
        int64_t rows = raw_int(db, "SELECT count(*) FROM schema_migrations");
        int64_t sum = raw_int(db, "SELECT sum(applied_at * version) FROM schema_migrations");
        int64_t cookie = raw_int(db, "PRAGMA schema_version");
        sqlite3_close(db);

        f->c = open_ok(f);
        int v = -1;
        assert_int_equal(ops->schema_version(f->c, &v, NULL), 0);
        assert_int_equal(v, rows);
        db = raw_open(f->db.path);
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

        char sql[128];
        snprintf(sql, sizeof(sql), "INSERT INTO schema_migrations VALUES (%d, 1)", v + 1);
        any_int(f, sql);

        struct cove_err err = {0};
        assert_null(ops->open(f->db.path, &err));
        assert_non_null(strstr(err.msg, "newer"));
        char shown[512];
        cove_catalog_dsn_redact(f->db.path, shown, sizeof(shown));
        assert_non_null(strstr(err.msg, shown));
        if (f->db.pg) { /* the URL's password never reaches a message */
                const char *pw = strchr(strstr(f->db.path, "://") + 3, ':');
                assert_non_null(pw);
                char secret[64];
                snprintf(secret, sizeof(secret), "%.*s", (int)strcspn(pw + 1, "@"), pw + 1);
                assert_true(strlen(secret) > 0);
                assert_null(strstr(err.msg, secret));
        }
        assert_int_equal(any_int(f, "SELECT max(version) FROM schema_migrations"), v + 1);
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
        if (ops->sandbox_update(re->c, &upd, NULL) != 0)
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
        struct cove_catalog *c = ops->open(path, NULL);
        if (!c)
                _exit(2);
        for (int i = 0;; i++) {
                struct cove_sandbox_row r;
                char id[32], meta[64];
                snprintf(id, sizeof(id), "sbx_crash_%07d", i);
                snprintf(meta, sizeof(meta), "{\"i\":%d,\"pad\":\"%0*d\"}", i, 40, i);
                mkrow(&r, id, "t1", "running", 1000 + i);
                r.metadata_json = meta;
                if (ops->sandbox_insert(c, &r, NULL) != 0)
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
                child_insert_loop(f->db.path, p[1]);
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
        if (!f->db.pg) {
                sqlite3 *db = raw_open(f->db.path);
                char ic[64];
                raw_text(db, "PRAGMA integrity_check", ic, sizeof(ic));
                assert_string_equal(ic, "ok");
                sqlite3_close(db);
        }
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
        const int N = f->db.pg ? 300 : 2000;
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
        print_message(
            "%s catalog cost per op (N=%d): insert %.1f us, update %.1f us, get %.1f us\n",
            ops->name, N, ins, upd, get);
        if (f->db.pg)
                return; /* a server round trip and a WAL flush per write: bench/, not here */
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

/* ---- cluster: leases, placements, jobs ---- */

static struct cove_node_row mknode(const char *name)
{
        struct cove_node_row n;
        memset(&n, 0, sizeof(n));
        snprintf(n.name, sizeof(n.name), "%s", name);
        n.cpus = 8;
        n.memory_mb = 16384;
        n.disk_mb = 100000;
        snprintf(n.address, sizeof(n.address), "https://%s:7690", name);
        return n;
}

static int64_t acquire_ok(struct cove_catalog *c, const char *name, int64_t ttl_ms)
{
        struct cove_node_row n = mknode(name);
        struct cove_err err = {0};
        int64_t epoch = 0, exp = 0;
        if (ops->node_lease_acquire(c, &n, ttl_ms, &epoch, &exp, &err) < 0)
                fail_msg("acquire %s: %s", name, err.msg);
        return epoch;
}

struct race {
        struct cove_catalog *c;
        pthread_barrier_t *go;
        char name[64];
        int rc;
        enum cove_err_kind kind;
};

static void *race_acquire(void *arg)
{
        struct race *r = arg;
        struct cove_node_row n = mknode(r->name);
        struct cove_err err = {0};
        int64_t epoch, exp;
        pthread_barrier_wait(r->go);
        r->rc = ops->node_lease_acquire(r->c, &n, 60000, &epoch, &exp, &err);
        r->kind = err.kind;
        return NULL;
}

/* Two node processes (two handles) racing for one name: exactly one holds the lease; a
 * renew with a stale epoch, or after expiry, is refused; a lapsed lease is taken over
 * with the next epoch, and the old holder can then change nothing. */
static void lease_race_and_fencing(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        struct cove_catalog *c2 = open_ok(f);
        struct cove_err err = {0};
        for (int round = 0; round < 10; round++) {
                pthread_barrier_t go;
                pthread_barrier_init(&go, NULL, 2);
                struct race a = {f->c, &go, "", 0, 0}, b = {c2, &go, "", 0, 0};
                snprintf(a.name, sizeof(a.name), "race-%d", round);
                snprintf(b.name, sizeof(b.name), "race-%d", round);
                pthread_t ta, tb;
                pthread_create(&ta, NULL, race_acquire, &a);
                pthread_create(&tb, NULL, race_acquire, &b);
                pthread_join(ta, NULL);
                pthread_join(tb, NULL);
                pthread_barrier_destroy(&go);
                assert_int_equal((a.rc == 0) + (b.rc == 0), 1);
                assert_int_equal(a.rc == 0 ? b.kind : a.kind, COVE_E_CONFLICT);
        }
        /* held: a third acquire is refused; renew works only with the current epoch */
        int64_t e1 = acquire_ok(f->c, "n1", 60000);
        assert_int_equal(e1, 1);
        struct cove_node_row n = mknode("n1");
        int64_t epoch = 0, exp = 0, exp2 = 0;
        assert_int_equal(ops->node_lease_acquire(c2, &n, 60000, &epoch, &exp, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->node_lease_renew(f->c, "n1", e1, 60000, &exp, &err), 0);
        assert_int_equal(ops->node_lease_renew(f->c, "n1", e1, 120000, &exp2, &err), 0);
        assert_true(exp2 > exp);
        assert_int_equal(ops->node_lease_renew(f->c, "n1", e1 + 1, 60000, &exp, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);

        /* a short lease lapses; the next holder gets epoch + 1 (await it, bounded) */
        int64_t old = acquire_ok(f->c, "n2", 200);
        int64_t deadline = cove_mono_ns() + 30000000000LL, e2 = 0;
        n = mknode("n2");
        while (ops->node_lease_acquire(c2, &n, 60000, &e2, &exp, &err) < 0) {
                assert_int_equal(err.kind, COVE_E_CONFLICT);
                assert_true(cove_mono_ns() < deadline);
                usleep(20000); /* the condition is the clock: poll it */
        }
        assert_int_equal(e2, old + 1);
        assert_int_equal(ops->node_lease_renew(f->c, "n2", old, 60000, &exp, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->node_lease_renew(c2, "n2", e2, 60000, &exp, &err), 0);

        /* the old epoch can neither claim nor finish nor report */
        int64_t gen = 0, job = 0;
        assert_int_equal(
            ops->placement_write(c2, "sbx_f", "n2", "running", "start", NULL, 0, &gen, &job, &err),
            0);
        struct cove_job_row j;
        assert_int_equal(ops->job_claim(f->c, "n2", old, &j, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->job_claim(c2, "n2", e2, &j, &err), 0);
        assert_int_equal(j.id, job);
        cove_job_row_clear(&j);
        assert_int_equal(ops->job_finish(f->c, job, "n2", old, gen, 1, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(
            ops->placement_observe(f->c, "sbx_f", "n2", old, gen, "running", NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->job_finish(c2, job, "n2", e2, gen, 1, "{\"ok\":true}", &err), 0);
        ops->close(c2);
}

static void expect_state(struct cove_catalog *c, const char *id, const char *state)
{
        struct cove_sandbox_row got;
        struct cove_err err = {0};
        assert_int_equal(ops->sandbox_get(c, NULL, id, &got, &err), 0);
        assert_string_equal(got.state, state);
        cove_sandbox_row_clear(&got);
}

/* A node's write of a sandbox row is applied only while, in the same statement, the
 * sandbox is placed on that node at that generation and the node's lease is live with that
 * epoch: a lease that lapsed (even before anyone took it again), an older epoch, an older
 * generation or another node change nothing; a missing row is "absent", not a conflict. */
static void fenced_sandbox_update(void **state)
{
        struct fx *f = *state;
        struct cove_catalog *c = f->c = open_ok(f);
        struct cove_err err = {0};
        int64_t e2 = acquire_ok(c, "n2", 60000);
        int64_t e1 = acquire_ok(c, "n1", 300);
        add_tenant(c, "t1");
        struct cove_sandbox_row row;
        mkrow(&row, "sbx_1", "t1", "starting", 1);
        strcpy(row.node, "n1");
        assert_int_equal(ops->sandbox_insert(c, &row, &err), 0);
        int64_t gen = 0;
        assert_int_equal(
            ops->placement_write(c, "sbx_1", "n1", "running", "start", NULL, 0, &gen, NULL, &err),
            0);
        assert_int_equal(gen, 1);

        strcpy(row.state, "running");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n1", e1, gen, &err), 0);
        expect_state(c, "sbx_1", "running");
        strcpy(row.state, "error");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n1", e1, gen + 1, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n2", e2, gen, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        expect_state(c, "sbx_1", "running");

        /* n1's lease lapses: refused before any other process acquires it. The probe
         * rewrites the row as it stands, so a write that lands while the lease is still
         * live changes nothing (a probe writing another state, then putting it back, loses
         * the race when the lease lapses between the two). */
        int64_t deadline = cove_mono_ns() + 30000000000LL;
        int r;
        strcpy(row.state, "running");
        while ((r = ops->sandbox_update_fenced(c, &row, "n1", e1, gen, &err)) == 0) {
                assert_true(cove_mono_ns() < deadline);
                usleep(20000); /* the condition is the clock: poll it */
        }
        assert_int_equal(r, -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        strcpy(row.state, "error");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n1", e1, gen, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        expect_state(c, "sbx_1", "running");

        /* taken again (a new epoch): the old epoch stays refused, the new one writes */
        int64_t e1b = acquire_ok(c, "n1", 60000);
        assert_int_equal(e1b, e1 + 1);
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n1", e1, gen, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        expect_state(c, "sbx_1", "running");
        strcpy(row.state, "paused");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n1", e1b, gen, &err), 0);
        expect_state(c, "sbx_1", "paused");

        /* moved to n2 (generation + 1): n1 can no longer write, n2 can */
        assert_int_equal(ops->placement_write(c, "sbx_1", "n2", "running", "resume", NULL, gen,
                                              &gen, NULL, &err),
                         0);
        strcpy(row.state, "error");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n1", e1b, gen - 1, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        expect_state(c, "sbx_1", "paused");
        strcpy(row.node, "n2");
        strcpy(row.state, "running");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n2", e2, gen, &err), 0);
        expect_state(c, "sbx_1", "running");

        /* absent (other id, other tenant): 1, not a conflict; bad rows are still refused */
        struct cove_sandbox_row other;
        mkrow(&other, "sbx_none", "t1", "running", 1);
        assert_int_equal(ops->sandbox_update_fenced(c, &other, "n2", e2, gen, &err), 1);
        strcpy(row.tenant, "t2");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n2", e2, gen, &err), 1);
        strcpy(row.tenant, "t1");
        strcpy(row.state, "bogus");
        assert_int_equal(ops->sandbox_update_fenced(c, &row, "n2", e2, gen, &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
}

static int count_nodes(const struct cove_node_row *n, void *arg)
{
        struct cove_node_row *out = arg;
        if (strcmp(n->name, out->name) == 0)
                *out = *n;
        return 0;
}

/* Placement writes desired state and a job at once; a node claims only the jobs of the
 * sandboxes placed on it at their current generation; finishing checks (node, epoch,
 * generation) and is idempotent; a move bumps the generation and supersedes older jobs;
 * a compare-and-set placement lets one of two replicas win. */
static void placement_jobs_and_generations(void **state)
{
        struct fx *f = *state;
        struct cove_catalog *c = f->c = open_ok(f);
        struct cove_err err = {0};
        int64_t e1 = acquire_ok(c, "n1", 60000), e2 = acquire_ok(c, "n2", 60000);
        add_tenant(c, "t1");
        struct cove_sandbox_row row;
        mkrow(&row, "sbx_1", "t1", "starting", 1);
        assert_int_equal(ops->sandbox_insert(c, &row, &err), 0);

        int64_t gen = -1, job = -1;
        assert_int_equal(
            ops->placement_write(c, "sbx_1", "n1", "running", "start", NULL, 0, &gen, &job, &err),
            0);
        assert_int_equal(gen, 1);
        assert_true(job > 0);
        /* the second replica placing the same sandbox from generation 0 loses */
        assert_int_equal(
            ops->placement_write(c, "sbx_1", "n2", "running", "start", NULL, 0, NULL, NULL, &err),
            -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        struct cove_placement_row pl;
        assert_int_equal(ops->placement_get(c, "sbx_1", &pl, &err), 0);
        assert_string_equal(pl.node, "n1");
        assert_int_equal(pl.generation, 1);
        assert_string_equal(pl.desired_state, "running");
        assert_int_equal(ops->placement_get(c, "sbx_none", &pl, &err), 1);

        struct cove_node_row nr = mknode("n1");
        assert_int_equal(ops->node_list(c, count_nodes, &nr, &err), 0);
        assert_int_equal(nr.alloc_cpus, 2);
        assert_int_equal(nr.alloc_memory_mb, 512);
        assert_int_equal(nr.epoch, e1);
        assert_string_equal(nr.state, "ready");

        /* n2 has nothing; n1 gets the job once */
        struct cove_job_row j;
        assert_int_equal(ops->job_claim(c, "n2", e2, &j, &err), 1);
        assert_int_equal(ops->job_claim(c, "n1", e1, &j, &err), 0);
        assert_int_equal(j.id, job);
        assert_string_equal(j.kind, "start");
        assert_string_equal(j.state, "claimed");
        assert_string_equal(j.claimed_by, "n1");
        assert_int_equal(j.claimed_epoch, e1);
        assert_int_equal(j.generation, 1);
        cove_job_row_clear(&j);
        assert_int_equal(ops->job_claim(c, "n1", e1, &j, &err), 1);

        /* stale generation, wrong node: refused; then done, and done again (a retry) */
        assert_int_equal(ops->job_finish(c, job, "n1", e1, 2, 1, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->job_finish(c, job, "n2", e2, 1, 1, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->job_finish(c, 999999, "n1", e1, 1, 1, NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(ops->job_finish(c, job, "n1", e1, 1, 1, "{\"pid\":7}", &err), 0);
        assert_int_equal(ops->job_finish(c, job, "n1", e1, 1, 1, "{\"pid\":7}", &err), 0);
        assert_int_equal(ops->job_finish(c, job, "n1", e1, 1, 0, "{\"other\":1}", &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->job_get(c, job, &j, &err), 0);
        assert_string_equal(j.state, "done");
        assert_string_equal(j.result_json, "{\"pid\":7}");
        cove_job_row_clear(&j);
        assert_int_equal(ops->placement_observe(c, "sbx_1", "n1", e1, 1, "running", NULL, &err), 0);
        assert_int_equal(ops->placement_observe(c, "sbx_1", "n1", e1, 1, "running", NULL, &err), 0);
        /* a node settling its sandbox on its own (a timeout) writes the desired state too;
         * it may only settle it down (paused, stopped) */
        assert_int_equal(
            ops->placement_observe(c, "sbx_1", "n1", e1, 1, "pausing", "running", &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_int_equal(ops->placement_observe(c, "sbx_1", "n1", e1, 1, "pausing", "paused", &err),
                         0);
        assert_int_equal(ops->placement_get(c, "sbx_1", &pl, &err), 0);
        assert_string_equal(pl.desired_state, "paused");
        assert_string_equal(pl.observed_state, "pausing");
        assert_int_equal(
            ops->placement_observe(c, "sbx_1", "n2", e2, 1, "stopped", "stopped", &err),
            -1); /* not n2's: nothing written */
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->placement_get(c, "sbx_1", &pl, &err), 0);
        assert_string_equal(pl.desired_state, "paused");
        assert_int_equal(
            ops->placement_write(c, "sbx_1", NULL, "running", NULL, NULL, -1, NULL, NULL, &err), 0);

        /* desired state alone keeps the generation; a move bumps it, supersedes the queued
         * pause, and n1 can no longer report */
        int64_t job2 = 0;
        assert_int_equal(
            ops->placement_write(c, "sbx_1", NULL, "paused", "pause", NULL, -1, &gen, &job2, &err),
            0);
        assert_int_equal(gen, 1);
        int64_t job3 = 0;
        assert_int_equal(
            ops->placement_write(c, "sbx_1", "n2", "running", "resume", NULL, 1, &gen, &job3, &err),
            0);
        assert_int_equal(gen, 2);
        assert_int_equal(ops->job_get(c, job2, &j, &err), 0);
        assert_string_equal(j.state, "failed");
        cove_job_row_clear(&j);
        assert_int_equal(ops->job_claim(c, "n1", e1, &j, &err), 1);
        assert_int_equal(ops->placement_observe(c, "sbx_1", "n1", e1, 1, "paused", NULL, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->job_claim(c, "n2", e2, &j, &err), 0);
        assert_int_equal(j.id, job3);
        assert_int_equal(j.generation, 2);
        cove_job_row_clear(&j);

        /* a node's restart (new epoch) takes back the jobs its old epoch claimed */
        int64_t job4 = 0;
        assert_int_equal(
            ops->placement_write(c, "sbx_1", NULL, "running", "exec", NULL, -1, NULL, &job4, &err),
            0);
        assert_int_equal(ops->job_claim(c, "n2", e2, &j, &err), 0);
        cove_job_row_clear(&j);
        assert_int_equal(ops->node_set_state(c, "n2", "lost", &err), 0);
        assert_int_equal(ops->job_finish(c, job3, "n2", e2, 2, 1, NULL, &err), 0);

        /* placement needs a ready, known node; bad input is BAD_REQUEST */
        assert_int_equal(ops->node_set_state(c, "n1", "cordoned", &err), 0);
        assert_int_equal(
            ops->placement_write(c, "sbx_2", "n1", "running", "start", NULL, -1, NULL, NULL, &err),
            -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(
            ops->placement_write(c, "sbx_2", "nx", "running", "start", NULL, -1, NULL, NULL, &err),
            -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(
            ops->placement_write(c, "sbx_2", NULL, "running", "start", NULL, -1, NULL, NULL, &err),
            -1);
        assert_int_equal(err.kind, COVE_E_NOT_FOUND);
        assert_int_equal(
            ops->placement_write(c, "sbx_2", "n1", "flying", "start", NULL, -1, NULL, NULL, &err),
            -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_int_equal(ops->node_set_state(c, "n1", "gone", &err), -1);
        assert_int_equal(err.kind, COVE_E_BAD_REQUEST);
        assert_int_equal(ops->node_set_state(c, "nx", "ready", &err), 1);
}

struct claimer {
        struct cove_catalog *c;
        int64_t epoch;
        pthread_barrier_t *go;
        int64_t ids[64];
        int n, err;
};

static void *claim_loop(void *arg)
{
        struct claimer *k = arg;
        struct cove_err err = {0};
        pthread_barrier_wait(k->go);
        for (;;) {
                struct cove_job_row j;
                int r = ops->job_claim(k->c, "n1", k->epoch, &j, &err);
                if (r == 1)
                        break;
                if (r < 0 || k->n >= 64) {
                        k->err++;
                        break;
                }
                k->ids[k->n++] = j.id;
                if (ops->job_finish(k->c, j.id, "n1", k->epoch, j.generation, 1, NULL, &err) < 0)
                        k->err++;
                cove_job_row_clear(&j);
        }
        return NULL;
}

/* Two claimers (two connections) for one node drain its queue: every job is claimed by
 * exactly one of them. */
static void concurrent_claimers_take_each_job_once(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        struct cove_catalog *c2 = open_ok(f);
        struct cove_err err = {0};
        int64_t e = acquire_ok(f->c, "n1", 120000);
        enum { JOBS = 40 };
        for (int i = 0; i < JOBS; i++) {
                char id[32];
                snprintf(id, sizeof(id), "sbx_%02d", i);
                assert_int_equal(ops->placement_write(f->c, id, "n1", "running", "start", NULL, 0,
                                                      NULL, NULL, &err),
                                 0);
        }
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        struct claimer a = {.c = f->c, .epoch = e, .go = &go}, b = {.c = c2, .epoch = e, .go = &go};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, claim_loop, &a);
        pthread_create(&tb, NULL, claim_loop, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        pthread_barrier_destroy(&go);
        assert_int_equal(a.err + b.err, 0);
        assert_int_equal(a.n + b.n, JOBS);
        int seen[JOBS + 1] = {0};
        int64_t all[2 * 64];
        memcpy(all, a.ids, sizeof(int64_t) * (size_t)a.n);
        memcpy(all + a.n, b.ids, sizeof(int64_t) * (size_t)b.n);
        for (int i = 0; i < JOBS; i++) {
                assert_true(all[i] >= 1 && all[i] <= JOBS);
                seen[all[i]]++;
        }
        for (int i = 1; i <= JOBS; i++)
                assert_int_equal(seen[i], 1);
        print_message("%s: claimers took %d and %d jobs\n", ops->name, a.n, b.n);
        ops->close(c2);
}

struct placer {
        struct cove_catalog *c;
        int rc;
};

static void *place_one(void *arg)
{
        struct placer *p = arg;
        p->rc = ops->placement_write(p->c, "sbx_w", "n1", "running", "start", NULL, -1, NULL, NULL,
                                     NULL);
        return NULL;
}

/* A placement wakes the node's waiter: on PostgreSQL a write through another connection
 * (another process) arrives by NOTIFY; on SQLite writes through the same handle do. */
static void placement_wakes_waiter(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        struct cove_catalog *writer = f->db.pg ? open_ok(f) : f->c;
        struct cove_err err = {0};
        acquire_ok(f->c, "n1", 60000);
        /* the first call starts listening; nothing was written since */
        assert_int_equal(ops->wait_wakeup(f->c, "n1", 0, &err), 1);
        struct placer p = {writer, -1};
        pthread_t t;
        pthread_create(&t, NULL, place_one, &p);
        int64_t t0 = cove_mono_ns();
        int r = ops->wait_wakeup(f->c, "n1", 60000, &err);
        pthread_join(t, NULL);
        assert_int_equal(p.rc, 0);
        assert_int_equal(r, 0); /* woken, not timed out */
        print_message("%s: woken %.1f ms after the write began\n", ops->name,
                      (double)(cove_mono_ns() - t0) / 1e6);
        if (writer != f->c)
                ops->close(writer);
}

/* Schema 8: a job carries its arguments from the placement to the claimer, a node row
 * carries the features its node announced, and finishing a job wakes a waiter for any
 * work (a control replica waiting for the outcome), from another connection on
 * PostgreSQL. */
static void job_args_features_and_done_wakeup(void **state)
{
        struct fx *f = *state;
        struct cove_catalog *c = f->c = open_ok(f);
        struct cove_catalog *node = f->db.pg ? open_ok(f) : c;
        struct cove_err err = {0};
        struct cove_node_row n = mknode("n1");
        snprintf(n.features, sizeof(n.features), "{\"runtimes\":[\"ns\"],\"full\":\"ok\"}");
        int64_t epoch = 0;
        assert_int_equal(ops->node_lease_acquire(node, &n, 60000, &epoch, NULL, &err), 0);
        struct cove_node_row got = mknode("n1");
        assert_int_equal(ops->node_list(c, count_nodes, &got, &err), 0);
        assert_string_equal(got.features, "{\"runtimes\":[\"ns\"],\"full\":\"ok\"}");
        /* a row that never announced any reads "{}" */
        acquire_ok(c, "n2", 60000);
        struct cove_node_row got2 = mknode("n2");
        assert_int_equal(ops->node_list(c, count_nodes, &got2, &err), 0);
        assert_string_equal(got2.features, "{}");
        /* arguments that are not JSON are refused by the schema */
        assert_int_equal(ops->placement_write(c, "sbx_a", "n1", "running", "start", "{nope", 0,
                                              NULL, NULL, &err),
                         -1);
        int64_t gen = 0, job = 0, job2 = 0;
        assert_int_equal(ops->placement_write(c, "sbx_a", "n1", "running", "start",
                                              "{\"purge\":true}", 0, &gen, &job, &err),
                         0);
        struct cove_job_row j;
        assert_int_equal(ops->job_claim(node, "n1", epoch, &j, &err), 0);
        assert_int_equal(j.id, job);
        assert_string_equal(j.args_json, "{\"purge\":true}");
        cove_job_row_clear(&j);
        assert_null(j.args_json);
        assert_int_equal(
            ops->placement_write(c, "sbx_a", NULL, "paused", "pause", NULL, -1, NULL, &job2, &err),
            0);
        assert_int_equal(ops->job_get(c, job2, &j, &err), 0);
        assert_null(j.args_json);
        cove_job_row_clear(&j);
        /* the waiter listens from its first call; a finish from the node wakes it */
        while (ops->wait_wakeup(c, NULL, 0, &err) == 0)
                ;
        assert_int_equal(ops->job_finish(node, job, "n1", epoch, gen, 1, "{\"ok\":1}", &err), 0);
        assert_int_equal(ops->wait_wakeup(c, NULL, 60000, &err), 0);
        /* a node's own waiter does not wake on finished jobs */
        if (f->db.pg) {
                while (ops->wait_wakeup(node, "n1", 0, &err) == 0)
                        ;
                assert_int_equal(ops->job_claim(node, "n1", epoch, &j, &err), 0);
                cove_job_row_clear(&j);
                assert_int_equal(ops->job_finish(node, job2, "n1", epoch, gen, 1, NULL, &err), 0);
                assert_int_equal(ops->wait_wakeup(node, "n1", 300, &err), 1);
        }
        if (node != c)
                ops->close(node);
}

/* Two audit writers on one catalog (two coved processes) keep one chain: each re-reads
 * the head when the other moved it, so no event is lost and the chain verifies. */
static void audit_two_writers_one_chain(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        struct cove_catalog *c2 = open_ok(f);
        struct cove_log log = {.fd = open("/dev/null", O_WRONLY), .level = COVE_LOG_ERROR};
        struct cove_err err = {0};
        struct cove_audit *a1 = cove_audit_open(ops, f->c, &log, &err);
        struct cove_audit *a2 = cove_audit_open(ops, c2, &log, &err);
        assert_non_null(a1);
        assert_non_null(a2);
        cove_audit_log(a1, "t1", NULL, "test", "first", "", NULL); /* a batch of one */
        cove_audit_flush(a1);
        assert_int_equal(cove_audit_dropped(a1), 0);
        enum { ROUNDS = 30, PER = 5 };
        for (int i = 0; i < ROUNDS; i++) {
                for (int k = 0; k < PER; k++) {
                        cove_audit_log(a1, "t1", NULL, "test", "one", "allow",
                                       json_pack("{s:i}", "i", i * PER + k));
                        cove_audit_log(a2, "t1", NULL, "test", "two", "allow",
                                       json_pack("{s:i}", "i", i * PER + k));
                }
                cove_audit_flush(a1); /* interleave the two writers' batches */
                cove_audit_flush(a2);
        }
        uint64_t dropped = cove_audit_dropped(a1) + cove_audit_dropped(a2);
        cove_audit_close(a1);
        cove_audit_close(a2);
        close(log.fd);
        assert_int_equal(dropped, 0);
        int64_t checked = 0, bad = -1;
        char why[256];
        assert_int_equal(cove_audit_verify(ops, f->c, &checked, &bad, why, sizeof(why), &err), 0);
        assert_int_equal(bad, 0);
        assert_int_equal(checked, 2 * ROUNDS * PER + 1);
        ops->close(c2);
}

/* Key records: an insert never replaces (two first writers: one wins), a replace is a
 * compare-and-set on gen (a stale writer is refused), across two handles (processes). */
static void keyrec_insert_once_and_cas(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        struct cove_catalog *c2 = open_ok(f);
        struct cove_err err = {0};
        char *json = NULL;
        int64_t gen = 0, g2 = 0;
        assert_int_equal(ops->keyrec_get(f->c, "t1", &json, &gen, &err), 1);
        assert_int_equal(ops->keyrec_put(f->c, "t1", "{\"v\":1}", 0, &gen, &err), 0);
        assert_int_equal(gen, 1);
        assert_int_equal(ops->keyrec_put(c2, "t1", "{\"v\":2}", 0, &g2, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->keyrec_put(f->c, "t1", "{\"v\":3}", 1, &gen, &err), 0);
        assert_int_equal(gen, 2);
        assert_int_equal(ops->keyrec_put(c2, "t1", "{\"v\":4}", 1, &g2, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->keyrec_put(c2, "absent", "{}", 5, &g2, &err), -1);
        assert_int_equal(err.kind, COVE_E_CONFLICT);
        assert_int_equal(ops->keyrec_get(c2, "t1", &json, &g2, &err), 0);
        assert_int_equal(g2, 2);
        assert_string_equal(json, "{\"v\":3}");
        free(json);
        assert_int_equal(ops->keyrec_put(f->c, "t1", "not json", 2, &gen, &err), -1);
        ops->close(c2);
}

/* Two processes' key code over one catalog (two keys dirs, one default KEK file): the
 * second opens the data key the first created; a revocation through the second is seen
 * by the first at its next check although its cached key is within the TTL. */
static void shared_key_records_revoke_reaches_cache(void **state)
{
        struct fx *f = *state;
        f->c = open_ok(f);
        struct cove_catalog *c2 = open_ok(f);
        struct cove_err err = {0};
        char kek[PATH_MAX + 8], d1[PATH_MAX + 8], d2[PATH_MAX + 8];
        snprintf(kek, sizeof(kek), "%s/default.kek", f->db.dir);
        snprintf(d1, sizeof(d1), "%s/n1", f->db.dir);
        snprintf(d2, sizeof(d2), "%s/n2", f->db.dir);
        uint8_t raw[32], k1[32], k2[32];
        assert_int_equal(cove_random(raw, sizeof(raw), &err), 0);
        assert_int_equal(
            cove_write_file_atomic(f->db.dir, "default.kek", raw, sizeof(raw), 0600, &err), 0);
        struct coved_keys_cat s1 = {ops, f->c}, s2 = {ops, c2};
        assert_int_equal(cove_keys_attach(d1, &coved_keys_catalog_ops, &s1, kek, &err), 0);
        assert_int_equal(cove_keys_attach(d2, &coved_keys_catalog_ops, &s2, kek, &err), 0);
        cove_keys_cache_ttl_set(60000);
        assert_int_equal(cove_dek_load(d1, "ten1", 1, k1, &err), 0);
        assert_int_equal(cove_dek_load(d2, "ten1", 0, k2, &err), 0);
        assert_memory_equal(k1, k2, 32);
        assert_int_equal(access(d1, F_OK), -1); /* no file was written */
        assert_int_equal(cove_key_revoke(d2, "ten1", NULL, &err), 0);
        assert_int_equal(cove_key_check(d1, "ten1", 1, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        /* a rotation racing from a stale read cannot undo it */
        assert_int_equal(cove_key_rewrap(d1, "ten1", NULL, NULL, &err), -1);
        assert_int_equal(cove_key_check(d2, "ten1", 1, &err), -1);
        assert_int_equal(err.kind, COVE_E_KEY_REVOKED);
        cove_keys_detach(d1);
        cove_keys_detach(d2);
        cove_keys_cache_clear();
        ops->close(c2);
}

/* PostgreSQL stopped under a running catalog: calls fail fast with UNAVAILABLE and a
 * message naming the cause (never the password); once it is back the next calls work,
 * the waiter included. */
static void pg_restart_unavailable_then_recovers(void **state)
{
        struct fx *f = *state;
        const char *stop = getenv("COVE_TEST_PG_STOP"), *start = getenv("COVE_TEST_PG_START");
        if (!f->db.pg || !stop || !start) {
                print_message("skipped: needs PostgreSQL and COVE_TEST_PG_STOP/START\n");
                skip();
        }
        f->c = open_ok(f);
        struct cove_err err = {0};
        struct cove_tenant_row t;
        add_tenant(f->c, "t1");
        assert_int_equal(ops->wait_wakeup(f->c, NULL, 0, &err), 1);
        assert_int_equal(system(stop), 0);
        int64_t t0 = cove_mono_ns();
        for (int i = 0; i < 3; i++) {
                assert_int_equal(ops->tenant_get(f->c, "t1", &t, &err), -1);
                assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
                assert_non_null(strstr(err.msg, "catalog"));
                assert_null(strstr(err.msg, "password="));
        }
        assert_int_equal(ops->wait_wakeup(f->c, NULL, 100, &err), -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        print_message("failed calls took %.1f ms; last: %s\n", (double)(cove_mono_ns() - t0) / 1e6,
                      err.msg);
        assert_int_equal(system(start), 0);
        assert_int_equal(ops->tenant_get(f->c, "t1", &t, &err), 0);
        assert_string_equal(t.id, "t1");
        add_tenant(f->c, "t2");
        /* the waiter reconnects and says it may have missed wake-ups */
        assert_int_equal(ops->wait_wakeup(f->c, NULL, 60000, &err), 0);
}

/* PostgreSQL restarted while the catalog's connections sat idle: the first call after it
 * works (the pool drops the connections the server closed instead of failing one call with
 * "connection lost"). */
static void pg_restart_while_idle_first_call_works(void **state)
{
        struct fx *f = *state;
        const char *stop = getenv("COVE_TEST_PG_STOP"), *start = getenv("COVE_TEST_PG_START");
        if (!f->db.pg || !stop || !start) {
                print_message("skipped: needs PostgreSQL and COVE_TEST_PG_STOP/START\n");
                skip();
        }
        f->c = open_ok(f);
        struct cove_err err = {0};
        struct cove_tenant_row t;
        add_tenant(f->c, "t1");
        assert_int_equal(ops->tenant_get(f->c, "t1", &t, &err), 0); /* a pooled connection */
        assert_int_equal(system(stop), 0);
        assert_int_equal(system(start), 0);
        for (int i = 0; i < 3; i++) {
                int rc = ops->tenant_get(f->c, "t1", &t, &err);
                if (rc != 0)
                        print_message("call %d after the restart: %s\n", i, err.msg);
                assert_int_equal(rc, 0);
                assert_string_equal(t.id, "t1");
        }
}

/* A server that stops answering (SIGSTOP: its kernel still ACKs, so no TCP timeout fires)
 * never hangs a caller: the call gives up after the call timeout with UNAVAILABLE, and once
 * the server runs again the next call works. */
static void pg_frozen_server_bounded(void **state)
{
        struct fx *f = *state;
        const char *freeze = getenv("COVE_TEST_PG_FREEZE"), *thaw = getenv("COVE_TEST_PG_THAW");
        if (!f->db.pg || !freeze || !thaw) {
                print_message("skipped: needs PostgreSQL and COVE_TEST_PG_FREEZE/THAW\n");
                skip();
        }
        setenv("COVE_PG_CALL_TIMEOUT_MS", "2000", 1);
        f->c = open_ok(f);
        unsetenv("COVE_PG_CALL_TIMEOUT_MS");
        struct cove_err err = {0};
        struct cove_tenant_row t;
        add_tenant(f->c, "t1");
        assert_int_equal(system(freeze), 0);
        int64_t t0 = cove_mono_ns();
        int r = ops->tenant_get(f->c, "t1", &t, &err);
        double ms = (double)(cove_mono_ns() - t0) / 1e6;
        assert_int_equal(system(thaw), 0);
        assert_int_equal(r, -1);
        assert_int_equal(err.kind, COVE_E_UNAVAILABLE);
        assert_non_null(strstr(err.msg, "did not answer"));
        print_message("frozen server: the call gave up after %.0f ms: %s\n", ms, err.msg);
        assert_int_equal(ops->tenant_get(f->c, "t1", &t, &err), 0);
}

/* A DSN's password never reaches a message: the userinfo's and a password= parameter's. */
static void dsn_redact_hides_passwords(void **state)
{
        (void)state;
        char out[256];
        cove_catalog_dsn_redact("postgres://cove:s3cr%40t@db:5432/cove?sslmode=require", out,
                                sizeof(out));
        assert_string_equal(out, "postgres://cove:***@db:5432/cove?sslmode=require");
        cove_catalog_dsn_redact("postgresql://db/cove?user=u&password=hunter2&x=1", out,
                                sizeof(out));
        assert_string_equal(out, "postgresql://db/cove?user=u&password=***&x=1");
        cove_catalog_dsn_redact("postgres://u@db/cove", out, sizeof(out));
        assert_string_equal(out, "postgres://u@db/cove");
        cove_catalog_dsn_redact("/var/lib/cove/catalog.db", out, sizeof(out));
        assert_string_equal(out, "/var/lib/cove/catalog.db");
        assert_ptr_equal(cove_catalog_for("postgres://x/y"), &cove_catalog_pg);
        assert_ptr_equal(cove_catalog_for("postgresql://x/y"), &cove_catalog_pg);
        assert_ptr_equal(cove_catalog_for("/tmp/postgres://x"), &cove_catalog_sqlite);
}

static int run_all(const char *name)
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
            cmocka_unit_test_setup_teardown(lease_race_and_fencing, setup, teardown),
            cmocka_unit_test_setup_teardown(placement_jobs_and_generations, setup, teardown),
            cmocka_unit_test_setup_teardown(fenced_sandbox_update, setup, teardown),
            cmocka_unit_test_setup_teardown(concurrent_claimers_take_each_job_once, setup,
                                            teardown),
            cmocka_unit_test_setup_teardown(placement_wakes_waiter, setup, teardown),
            cmocka_unit_test_setup_teardown(job_args_features_and_done_wakeup, setup, teardown),
            cmocka_unit_test_setup_teardown(audit_two_writers_one_chain, setup, teardown),
            cmocka_unit_test_setup_teardown(keyrec_insert_once_and_cas, setup, teardown),
            cmocka_unit_test_setup_teardown(shared_key_records_revoke_reaches_cache, setup,
                                            teardown),
            cmocka_unit_test_setup_teardown(pg_restart_unavailable_then_recovers, setup, teardown),
            cmocka_unit_test_setup_teardown(pg_restart_while_idle_first_call_works, setup,
                                            teardown),
            cmocka_unit_test_setup_teardown(pg_frozen_server_bounded, setup, teardown),
            cmocka_unit_test(dsn_redact_hides_passwords),
        };
        return _cmocka_run_group_tests(name, tests, sizeof(tests) / sizeof(tests[0]), NULL, NULL);
}

int main(void)
{
        return catfx_main("catalog", run_all, &ops);
}
