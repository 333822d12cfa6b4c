/* SQLite catalog backend (the embedded default): one connection in WAL mode guarded by a
 * mutex, versioned schema migrations applied at open, and every statement prepared once.
 * No SQL is ever built from caller data: all values are bound parameters. */
#include "store/catalog.h"
#include "store/catalog_schema.h"
#include "util/cleanup.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Schema migrations: store/catalog_schema.c, shared with PostgreSQL. */
#define SCHEMA_VERSION cove_catalog_schema_version

#define SBX_COLS                                                                                   \
        "id, tenant, state, template_name, runtime, created_at, expires_at, cpus, memory_mb,"      \
        " disk_mb, timeout_s, on_timeout, uid_base, node, last_snapshot_id, metadata_json,"        \
        " env_json, error, snapshot_interval_s, retention_json, storage_encrypted, recovered_from"
#define SNAP_COLS                                                                                  \
        "id, tenant, sandbox_id, parent_id, kind, created_at, label, size_bytes, new_bytes,"       \
        " pause_us, rolling"

#define TENANT_COLS                                                                                \
        "id, name, created_at, max_sandboxes, max_cpus, max_memory_mb, max_storage_mb, deleted_at"
#define NODE_COLS_IN                                                                               \
        "name, state, epoch, lease_expires_at, cpus, memory_mb, disk_mb, address, last_seen,"      \
        " features"
#define NODE_LIST_COLS                                                                             \
        "n.name, n.state, n.epoch, n.lease_expires_at, n.cpus, n.memory_mb, n.disk_mb,"            \
        " coalesce(sum(s.cpus), 0), coalesce(sum(s.memory_mb), 0), coalesce(sum(s.disk_mb), 0),"   \
        " n.address, n.last_seen, n.features"
#define PLACE_COLS "sandbox_id, node, generation, desired_state, observed_state, updated_at"
#define JOB_COLS                                                                                   \
        "id, sandbox_id, kind, generation, state, claimed_by, claimed_epoch, result_json,"         \
        " created_at, updated_at, args_json"
#define AUDIT_COLS "seq, at, tenant, sandbox, kind, action, verdict, detail_json, prev_hash, hash"

#define SBX_UPDATE_SQL                                                                             \
        "UPDATE sandboxes SET state = ?3, template_name = ?4, runtime = ?5,"                       \
        " created_at = ?6, expires_at = ?7, cpus = ?8, memory_mb = ?9,"                            \
        " disk_mb = ?10, timeout_s = ?11, on_timeout = ?12, uid_base = ?13,"                       \
        " node = ?14, last_snapshot_id = ?15, metadata_json = ?16,"                                \
        " env_json = ?17, error = ?18, snapshot_interval_s = ?19,"                                 \
        " retention_json = ?20, storage_encrypted = ?21, recovered_from = ?22"                     \
        " WHERE id = ?1 AND tenant = ?2"

enum stmt_id {
        ST_VERSION,
        ST_TENANT_PUT,
        ST_TENANT_GET,
        ST_TENANT_LIST,
        ST_KEY_LIST,
        ST_KEY_PUT,
        ST_KEY_GET,
        ST_KEY_COUNT,
        ST_SBX_INSERT,
        ST_SBX_UPDATE,
        ST_SBX_UPDATE_FENCED,
        ST_SBX_GET,
        ST_SBX_GET_T,
        ST_SBX_LIST,
        ST_SBX_LIST_T,
        ST_SBX_DELETE,
        ST_SNAP_INSERT,
        ST_SNAP_GET,
        ST_SNAP_GET_T,
        ST_SNAP_LIST,
        ST_SNAP_DELETE,
        ST_SYNC_FULL,
        ST_SYNC_NORMAL,
        ST_AUDIT_INSERT,
        ST_AUDIT_LAST,
        ST_AUDIT_LIST,
        ST_EGRESS_PUT,
        ST_EGRESS_GET,
        ST_EGRESS_DELETE,
        ST_DOC_PUT,
        ST_DOC_GET,
        ST_DOC_LIST,
        ST_DOC_DELETE,
        ST_NODE_ACQUIRE,
        ST_NODE_RENEW,
        ST_NODE_SET_STATE,
        ST_NODE_LIST,
        ST_NODE_STATE,
        ST_PLACE_GET,
        ST_PLACE_PUT,
        ST_PLACE_DESIRE,
        ST_PLACE_OBSERVE,
        ST_JOB_SUPERSEDE,
        ST_JOB_INSERT,
        ST_JOB_CLAIM,
        ST_JOB_FINISH,
        ST_JOB_GET,
        ST_LEASE_LIVE,
        ST__COUNT
};

static const char *const stmt_sql[ST__COUNT] = {
    [ST_VERSION] = "SELECT coalesce(max(version), 0) FROM schema_migrations",
    [ST_TENANT_PUT] = "INSERT INTO tenants(" TENANT_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,"
                      " ?8) ON CONFLICT(id) DO UPDATE SET name = excluded.name,"
                      " max_sandboxes = excluded.max_sandboxes, max_cpus = excluded.max_cpus,"
                      " max_memory_mb = excluded.max_memory_mb,"
                      " max_storage_mb = excluded.max_storage_mb,"
                      " deleted_at = max(deleted_at, excluded.deleted_at)",
    [ST_TENANT_GET] = "SELECT " TENANT_COLS " FROM tenants WHERE id = ?1",
    [ST_TENANT_LIST] = "SELECT " TENANT_COLS " FROM tenants WHERE deleted_at = 0"
                       " ORDER BY created_at, rowid",
    [ST_KEY_LIST] = "SELECT id, tenant, salt_hex, hash_hex, admin, revoked, created_at"
                    " FROM api_keys WHERE tenant = ?1 ORDER BY created_at, rowid",
    /* A key's tenant, salt and hash never change, and a revoked key stays revoked:
     * a conflicting put updates nothing and is reported as a conflict. */
    [ST_KEY_PUT] = "INSERT INTO api_keys(id, tenant, salt_hex, hash_hex, admin, revoked,"
                   " created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                   " ON CONFLICT(id) DO UPDATE SET admin = excluded.admin,"
                   " revoked = max(revoked, excluded.revoked)"
                   " WHERE tenant = excluded.tenant AND salt_hex = excluded.salt_hex"
                   " AND hash_hex = excluded.hash_hex",
    [ST_KEY_GET] = "SELECT id, tenant, salt_hex, hash_hex, admin, revoked, created_at"
                   " FROM api_keys WHERE id = ?1",
    [ST_KEY_COUNT] = "SELECT count(*) FROM api_keys",
    [ST_SBX_INSERT] =
        "INSERT INTO sandboxes(" SBX_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6,"
        " ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
    [ST_SBX_UPDATE] = SBX_UPDATE_SQL,
    /* the fence of placement_observe, in the same statement as the write: ?23 node,
     * ?24 epoch, ?25 generation, ?26 now */
    [ST_SBX_UPDATE_FENCED] =
        SBX_UPDATE_SQL " AND EXISTS (SELECT 1 FROM placements"
                       " WHERE sandbox_id = ?1 AND node = ?23 AND generation = ?25)"
                       " AND EXISTS (SELECT 1 FROM nodes WHERE name = ?23"
                       " AND epoch = ?24 AND lease_expires_at > ?26)",
    [ST_SBX_GET] = "SELECT " SBX_COLS " FROM sandboxes WHERE id = ?1",
    [ST_SBX_GET_T] = "SELECT " SBX_COLS " FROM sandboxes WHERE id = ?1 AND tenant = ?2",
    /* ?1 is NULL (any state) or ",s1,s2," built only from known state names. */
    [ST_SBX_LIST] = "SELECT " SBX_COLS " FROM sandboxes"
                    " WHERE (?1 IS NULL OR instr(?1, ',' || state || ',') > 0)"
                    " ORDER BY created_at, rowid",
    [ST_SBX_LIST_T] = "SELECT " SBX_COLS " FROM sandboxes WHERE tenant = ?2"
                      " AND (?1 IS NULL OR instr(?1, ',' || state || ',') > 0)"
                      " ORDER BY created_at, rowid",
    [ST_SBX_DELETE] = "DELETE FROM sandboxes WHERE id = ?1",
    [ST_SNAP_INSERT] = "INSERT INTO snapshots(" SNAP_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,"
                       " ?8, ?9, ?10, ?11)",
    [ST_SNAP_GET] = "SELECT " SNAP_COLS " FROM snapshots WHERE id = ?1",
    [ST_SNAP_GET_T] = "SELECT " SNAP_COLS " FROM snapshots WHERE id = ?1 AND tenant = ?2",
    [ST_SNAP_LIST] = "SELECT " SNAP_COLS " FROM snapshots"
                     " WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR sandbox_id = ?2)"
                     " ORDER BY created_at DESC, rowid DESC",
    [ST_SNAP_DELETE] = "DELETE FROM snapshots WHERE id = ?1",
    [ST_SYNC_FULL] = "PRAGMA synchronous = FULL",
    [ST_SYNC_NORMAL] = "PRAGMA synchronous = NORMAL",
    [ST_AUDIT_INSERT] = "INSERT INTO audit_events(" AUDIT_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6,"
                        " ?7, ?8, ?9, ?10)",
    [ST_AUDIT_LAST] = "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1",
    [ST_AUDIT_LIST] = "SELECT " AUDIT_COLS " FROM audit_events WHERE seq > ?4 AND at >= ?5"
                      " AND (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR sandbox = ?2)"
                      " AND (?3 IS NULL OR kind = ?3) ORDER BY seq LIMIT ?6",
    [ST_EGRESS_PUT] = "INSERT INTO egress_policies(sandbox_id, tenant, policy_json, updated_at)"
                      " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(sandbox_id) DO UPDATE SET"
                      " policy_json = excluded.policy_json, updated_at = excluded.updated_at"
                      " WHERE tenant = excluded.tenant",
    [ST_EGRESS_GET] = "SELECT policy_json FROM egress_policies WHERE sandbox_id = ?1",
    [ST_EGRESS_DELETE] = "DELETE FROM egress_policies WHERE sandbox_id = ?1",
    [ST_DOC_PUT] = "INSERT INTO egress_docs(kind, tenant, key, owner, doc_json, updated_at)"
                   " VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(kind, tenant, key) DO UPDATE"
                   " SET owner = excluded.owner, doc_json = excluded.doc_json,"
                   " updated_at = excluded.updated_at",
    [ST_DOC_GET] = "SELECT key, owner, doc_json FROM egress_docs"
                   " WHERE kind = ?1 AND tenant = ?2 AND key = ?3",
    [ST_DOC_LIST] = "SELECT key, owner, doc_json, tenant FROM egress_docs WHERE kind = ?1"
                    " AND (?2 IS NULL OR tenant = ?2) AND (?3 IS NULL OR owner = ?3)"
                    " ORDER BY key",
    [ST_DOC_DELETE] = "DELETE FROM egress_docs WHERE kind = ?1 AND tenant = ?2 AND key = ?3",
    /* cluster (schema 6): "now" is the process clock, bound; the checks of catalog.h are in
     * the WHERE clauses, so a stale caller changes no row */
    [ST_NODE_ACQUIRE] = "INSERT INTO nodes(" NODE_COLS_IN ") VALUES (?1, 'ready', 1, ?2, ?3, ?4,"
                        " ?5, ?6, ?7, ?8) ON CONFLICT(name) DO UPDATE SET epoch = nodes.epoch + 1,"
                        " lease_expires_at = excluded.lease_expires_at, cpus = excluded.cpus,"
                        " memory_mb = excluded.memory_mb, disk_mb = excluded.disk_mb,"
                        " address = excluded.address, last_seen = excluded.last_seen,"
                        " features = excluded.features,"
                        " state = CASE nodes.state WHEN 'lost' THEN 'ready' ELSE nodes.state END"
                        " WHERE nodes.lease_expires_at <= excluded.last_seen"
                        " RETURNING epoch, lease_expires_at",
    [ST_NODE_RENEW] = "UPDATE nodes SET lease_expires_at = ?3, last_seen = ?4 WHERE name = ?1"
                      " AND epoch = ?2 AND lease_expires_at > ?4 RETURNING lease_expires_at",
    [ST_NODE_SET_STATE] = "UPDATE nodes SET state = ?2 WHERE name = ?1",
    [ST_NODE_LIST] =
        "SELECT " NODE_LIST_COLS " FROM nodes n LEFT JOIN placements p"
        " ON p.node = n.name AND p.desired_state <> 'stopped'"
        " LEFT JOIN sandboxes s ON s.id = p.sandbox_id GROUP BY n.name ORDER BY n.name",
    [ST_NODE_STATE] = "SELECT state FROM nodes WHERE name = ?1",
    [ST_PLACE_GET] = "SELECT " PLACE_COLS " FROM placements WHERE sandbox_id = ?1",
    [ST_PLACE_PUT] = "INSERT INTO placements(sandbox_id, node, generation, desired_state,"
                     " observed_state, updated_at) VALUES (?1, ?2, ?3, ?4, '', ?5)"
                     " ON CONFLICT(sandbox_id) DO UPDATE SET node = excluded.node,"
                     " generation = excluded.generation, desired_state = excluded.desired_state,"
                     " observed_state = '', updated_at = excluded.updated_at",
    [ST_PLACE_DESIRE] = "UPDATE placements SET desired_state = ?2, updated_at = ?3"
                        " WHERE sandbox_id = ?1",
    [ST_PLACE_OBSERVE] = "UPDATE placements SET observed_state = ?5, updated_at = ?6,"
                         " desired_state = coalesce(?7, desired_state)"
                         " WHERE sandbox_id = ?1 AND node = ?2 AND generation = ?4"
                         " AND EXISTS (SELECT 1 FROM nodes WHERE name = ?2 AND epoch = ?3"
                         " AND lease_expires_at > ?6)",
    [ST_JOB_SUPERSEDE] = "UPDATE jobs SET state = 'failed', result_json = '\"superseded\"',"
                         " updated_at = ?3 WHERE sandbox_id = ?1 AND generation < ?2"
                         " AND state IN ('queued', 'claimed')",
    [ST_JOB_INSERT] = "INSERT INTO jobs(sandbox_id, kind, generation, created_at, updated_at,"
                      " args_json) VALUES (?1, ?2, ?3, ?4, ?4, ?5) RETURNING id",
    [ST_JOB_CLAIM] = "UPDATE jobs SET state = 'claimed', claimed_by = ?1, claimed_epoch = ?2,"
                     " updated_at = ?3 WHERE id = (SELECT j.id FROM jobs j JOIN placements p"
                     " ON p.sandbox_id = j.sandbox_id AND p.generation = j.generation"
                     " WHERE p.node = ?1 AND (j.state = 'queued' OR (j.state = 'claimed'"
                     " AND j.claimed_by = ?1 AND j.claimed_epoch < ?2)) ORDER BY j.id LIMIT 1)"
                     " AND EXISTS (SELECT 1 FROM nodes WHERE name = ?1 AND epoch = ?2"
                     " AND lease_expires_at > ?3) RETURNING " JOB_COLS,
    [ST_JOB_FINISH] = "UPDATE jobs SET state = ?5, result_json = ?6, updated_at = ?7"
                      " WHERE id = ?1 AND claimed_by = ?2 AND claimed_epoch = ?3"
                      " AND generation = ?4 AND (state = 'claimed' OR (state = ?5"
                      " AND result_json IS ?6))"
                      " AND EXISTS (SELECT 1 FROM placements p WHERE p.sandbox_id = jobs.sandbox_id"
                      " AND p.generation = jobs.generation AND p.node = ?2)"
                      " AND EXISTS (SELECT 1 FROM nodes WHERE name = ?2 AND epoch = ?3"
                      " AND lease_expires_at > ?7)",
    [ST_JOB_GET] = "SELECT " JOB_COLS " FROM jobs WHERE id = ?1",
    [ST_LEASE_LIVE] = "SELECT count(*) FROM nodes WHERE name = ?1 AND epoch = ?2"
                      " AND lease_expires_at > ?3",
};

struct cove_catalog {
        sqlite3 *db;
        pthread_mutex_t lock; /* serialises every use of db and st[] (connection is NOMUTEX) */
        sqlite3_stmt *st[ST__COUNT];
        /* wait_wakeup: placement writes through this handle bump wake_seq under lock and
         * broadcast wake; a waiter returns at once when it has not seen the latest */
        pthread_cond_t wake;
        uint64_t wake_seq, wake_seen;
};

/* Classify a failed sqlite call and fill err with "catalog: <context>: <sqlite message>".
 * Must run under c->lock: sqlite3_errmsg is per connection. */
static int db_err(sqlite3 *db, int rc, struct cove_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int db_err(sqlite3 *db, int rc, struct cove_err *err, const char *fmt, ...)
{
        char ctx[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx, sizeof(ctx), fmt, ap);
        va_end(ap);
        enum cove_err_kind kind = COVE_E_INTERNAL;
        int errnum = 0;
        switch (rc) {
        case SQLITE_CONSTRAINT_PRIMARYKEY:
        case SQLITE_CONSTRAINT_UNIQUE:
                kind = COVE_E_CONFLICT;
                break;
        case SQLITE_CONSTRAINT_FOREIGNKEY:
                kind = COVE_E_NOT_FOUND;
                break;
        case SQLITE_CONSTRAINT_CHECK:
        case SQLITE_CONSTRAINT_NOTNULL:
        case SQLITE_TOOBIG:
                kind = COVE_E_BAD_REQUEST;
                break;
        default:
                switch (rc & 0xff) {
                case SQLITE_BUSY:
                case SQLITE_LOCKED:
                        kind = COVE_E_UNAVAILABLE;
                        break;
                case SQLITE_FULL:
                        kind = COVE_E_UNAVAILABLE;
                        errnum = ENOSPC;
                        break;
                case SQLITE_IOERR:
                case SQLITE_CANTOPEN:
                case SQLITE_READONLY:
                        kind = COVE_E_UNAVAILABLE;
                        errnum = db ? sqlite3_system_errno(db) : 0;
                        break;
                }
        }
        const char *m = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
        return cove_err_setk(err, kind, errnum, "catalog: %s: %s", ctx, m);
}

static void done(sqlite3_stmt *s)
{
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
}

/* Fixed-size string fields must be NUL-terminated within their array. */
static int field_ok(const char *f, size_t cap)
{
        return strnlen(f, cap) < cap;
}

static int bind_text(sqlite3_stmt *s, int i, const char *v)
{
        return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}

/* Copy a text column into a fixed array; -1 if it does not fit (never truncate silently). */
static int col_copy(sqlite3_stmt *s, int i, char *dst, size_t cap)
{
        const unsigned char *v = sqlite3_column_text(s, i);
        size_t n = (size_t)sqlite3_column_bytes(s, i);
        if (n >= cap)
                return -1;
        if (n)
                memcpy(dst, v, n);
        dst[n] = '\0';
        return 0;
}

static char *col_dup(sqlite3_stmt *s, int i, const char *dflt)
{
        const unsigned char *v = sqlite3_column_text(s, i);
        if (!v)
                return dflt ? strdup(dflt) : NULL;
        return strndup((const char *)v, (size_t)sqlite3_column_bytes(s, i));
}

static int step_done(sqlite3_stmt *s)
{
        int rc = sqlite3_step(s);
        return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* ---- open, migrations, close ---- */

static int exec_sql(sqlite3 *db, const char *sql, struct cove_err *err, const char *what)
{
        int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        if (rc != SQLITE_OK)
                return db_err(db, rc, err, "%s", what);
        return 0;
}

static int read_version(sqlite3 *db, int *version, struct cove_err *err)
{
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(db, stmt_sql[ST_VERSION], -1, &s, NULL);
        if (rc == SQLITE_OK) {
                rc = sqlite3_step(s);
                if (rc == SQLITE_ROW) {
                        *version = sqlite3_column_int(s, 0);
                        rc = SQLITE_OK;
                }
        }
        if (rc != SQLITE_OK) {
                db_err(db, rc, err, "read schema version");
                sqlite3_finalize(s);
                return -1;
        }
        sqlite3_finalize(s);
        return 0;
}

static int migrate(sqlite3 *db, const char *dsn, struct cove_err *err)
{
        if (exec_sql(db,
                     "CREATE TABLE IF NOT EXISTS schema_migrations ("
                     " version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
                     err, "create schema_migrations") < 0)
                return -1;
        for (;;) {
                /* IMMEDIATE takes the write lock before reading the version, so two processes
                 * opening the same file at once apply each step exactly once. */
                if (exec_sql(db, "BEGIN IMMEDIATE", err, "begin migration") < 0)
                        return -1;
                int v = 0;
                if (read_version(db, &v, err) < 0)
                        goto fail;
                if (v > SCHEMA_VERSION) {
                        cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                      "catalog %s: schema version %d is newer than this build "
                                      "supports (%d); run a newer cove or restore a backup",
                                      dsn, v, SCHEMA_VERSION);
                        goto fail;
                }
                if (v == SCHEMA_VERSION) {
                        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
                        return 0;
                }
                char what[64];
                snprintf(what, sizeof(what), "migration %d", v + 1);
                if (exec_sql(db, cove_catalog_migrations[v].sql, err, what) < 0 ||
                    (cove_catalog_migrations[v].sqlite &&
                     exec_sql(db, cove_catalog_migrations[v].sqlite, err, what) < 0))
                        goto fail;
                sqlite3_stmt *s = NULL;
                int rc = sqlite3_prepare_v2(
                    db, "INSERT INTO schema_migrations(version, applied_at) VALUES (?1, ?2)", -1,
                    &s, NULL);
                if (rc == SQLITE_OK) {
                        sqlite3_bind_int(s, 1, v + 1);
                        sqlite3_bind_int64(s, 2, cove_now_ms());
                        rc = sqlite3_step(s);
                        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
                }
                if (rc != SQLITE_OK)
                        db_err(db, rc, err, "record %s", what);
                sqlite3_finalize(s);
                if (rc != SQLITE_OK)
                        goto fail;
                if (exec_sql(db, "COMMIT", err, what) < 0)
                        goto fail;
        }
fail:
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return cove_err_wrap(err, "open catalog %s", dsn);
}

static void sqlite_close(struct cove_catalog *c)
{
        if (!c)
                return;
        for (int i = 0; i < ST__COUNT; i++)
                sqlite3_finalize(c->st[i]);
        sqlite3_close(c->db);
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->wake);
        free(c);
}

static struct cove_catalog *sqlite_open(const char *dsn, struct cove_err *err)
{
        if (!dsn || !*dsn) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "catalog: empty database path");
                return NULL;
        }
        int mem = strcmp(dsn, ":memory:") == 0;
        /* The catalog holds key hashes and tenant data: create it owner-only. SQLite gives
         * its -wal and -shm files the main file's mode. */
        if (!mem && strncmp(dsn, "file:", 5) != 0) {
                int fd = open(dsn, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0) {
                        cove_err_setk(err, COVE_E_UNAVAILABLE, errno, "catalog: open %s", dsn);
                        return NULL;
                }
                close(fd);
        }
        struct cove_catalog *c = calloc(1, sizeof(*c));
        if (!c) {
                cove_err_set(err, ENOMEM, "catalog: open %s", dsn);
                return NULL;
        }
        pthread_mutex_init(&c->lock, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&c->wake, &ca);
        pthread_condattr_destroy(&ca);
        int rc = sqlite3_open_v2(dsn, &c->db,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX |
                                     SQLITE_OPEN_URI,
                                 NULL);
        if (rc != SQLITE_OK) {
                db_err(c->db, rc, err, "open %s", dsn);
                goto fail;
        }
        sqlite3_extended_result_codes(c->db, 1);
        sqlite3_busy_timeout(c->db, 5000);

        /* WAL + synchronous=NORMAL: a commit is appended to the WAL without fsync; the WAL is
         * fsynced at checkpoints. A killed process loses nothing (the WAL is in the page
         * cache); a power cut may lose the last commits since the previous checkpoint but
         * never corrupts the file (WAL frames are checksummed, a torn tail is discarded).
         * That is right for sandbox rows, which the node reconciles against what runs.
         * Tenant and API-key writes switch to FULL for their commit: a revocation, or a key
         * just shown to a user, must not silently vanish on power loss. */
        sqlite3_stmt *s = NULL;
        rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
        if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
                const char *mode = (const char *)sqlite3_column_text(s, 0);
                rc = (mode && (strcmp(mode, "wal") == 0 || (mem && strcmp(mode, "memory") == 0)))
                         ? SQLITE_OK
                         : -1;
        }
        sqlite3_finalize(s);
        if (rc == -1) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                              "catalog: open %s: cannot enable WAL journal mode "
                              "(is it on a network filesystem?)",
                              dsn);
                goto fail;
        }
        if (rc != SQLITE_OK) {
                db_err(c->db, rc, err, "open %s: set WAL mode", dsn);
                goto fail;
        }
        if (exec_sql(c->db, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON", err,
                     "set pragmas") < 0) {
                cove_err_wrap(err, "open %s", dsn);
                goto fail;
        }
        if (migrate(c->db, dsn, err) < 0)
                goto fail;
        for (int i = 0; i < ST__COUNT; i++) {
                rc = sqlite3_prepare_v3(c->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
                                        &c->st[i], NULL);
                if (rc != SQLITE_OK) {
                        db_err(c->db, rc, err, "open %s: prepare statement %d", dsn, i);
                        goto fail;
                }
        }
        return c;
fail:
        sqlite_close(c);
        return NULL;
}

static int sqlite_schema_version(struct cove_catalog *c, int *version, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_VERSION];
        int rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
                *version = sqlite3_column_int(s, 0);
                rc = SQLITE_OK;
        }
        int r = rc == SQLITE_OK ? 0 : db_err(c->db, rc, err, "read schema version");
        done(s);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* Run one write statement with synchronous=FULL for its commit (see sqlite_open). */
static int step_durable(struct cove_catalog *c, sqlite3_stmt *s)
{
        int rc = step_done(c->st[ST_SYNC_FULL]);
        done(c->st[ST_SYNC_FULL]);
        if (rc != SQLITE_OK)
                return rc;
        rc = step_done(s);
        int rc2 = step_done(c->st[ST_SYNC_NORMAL]);
        done(c->st[ST_SYNC_NORMAL]);
        return rc != SQLITE_OK ? rc : rc2;
}

/* ---- tenants ---- */

static int sqlite_tenant_put(struct cove_catalog *c, const struct cove_tenant_row *t,
                             struct cove_err *err)
{
        if (!field_ok(t->id, sizeof(t->id)) || !field_ok(t->name, sizeof(t->name)) || !t->id[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: put tenant: id or name missing or too long");
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_TENANT_PUT];
        bind_text(s, 1, t->id);
        bind_text(s, 2, t->name);
        sqlite3_bind_int64(s, 3, t->created_at);
        sqlite3_bind_int64(s, 4, t->max_sandboxes);
        sqlite3_bind_int64(s, 5, t->max_cpus);
        sqlite3_bind_int64(s, 6, t->max_memory_mb);
        sqlite3_bind_int64(s, 7, t->max_storage_mb);
        sqlite3_bind_int64(s, 8, t->deleted_at);
        int rc = step_durable(c, s);
        int r = rc == SQLITE_OK ? 0 : db_err(c->db, rc, err, "put tenant %s", t->id);
        done(s);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int tenant_cols(sqlite3_stmt *s, struct cove_tenant_row *out)
{
        memset(out, 0, sizeof(*out));
        int r = col_copy(s, 0, out->id, sizeof(out->id)) < 0 ||
                        col_copy(s, 1, out->name, sizeof(out->name)) < 0
                    ? -1
                    : 0;
        out->created_at = sqlite3_column_int64(s, 2);
        out->max_sandboxes = sqlite3_column_int64(s, 3);
        out->max_cpus = sqlite3_column_int64(s, 4);
        out->max_memory_mb = sqlite3_column_int64(s, 5);
        out->max_storage_mb = sqlite3_column_int64(s, 6);
        out->deleted_at = sqlite3_column_int64(s, 7);
        return r;
}

static int sqlite_tenant_list(struct cove_catalog *c, cove_tenant_cb cb, void *arg,
                              struct cove_err *err)
{
        /* rows are collected under the lock and handed to cb after it (cb may call us) */
        struct cove_tenant_row *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0, rc;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_TENANT_LIST];
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                if (n == cap) {
                        cap = cap ? 2 * cap : 16;
                        struct cove_tenant_row *nr = realloc(rows, cap * sizeof(*rows));
                        if (!nr) {
                                r = cove_err_set(err, ENOMEM, "catalog: list tenants");
                                break;
                        }
                        rows = nr;
                }
                if (tenant_cols(s, &rows[n]) == 0)
                        n++;
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = db_err(c->db, rc, err, "list tenants");
        done(s);
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (cb(&rows[i], arg) < 0)
                        break;
        free(rows);
        return r;
}

static int sqlite_apikey_list(struct cove_catalog *c, const char *tenant, cove_apikey_cb cb,
                              void *arg, struct cove_err *err)
{
        struct cove_apikey_row *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0, rc;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_KEY_LIST];
        bind_text(s, 1, tenant);
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                if (n == cap) {
                        cap = cap ? 2 * cap : 16;
                        struct cove_apikey_row *nr = realloc(rows, cap * sizeof(*rows));
                        if (!nr) {
                                r = cove_err_set(err, ENOMEM, "catalog: list api keys");
                                break;
                        }
                        rows = nr;
                }
                struct cove_apikey_row *k = &rows[n];
                memset(k, 0, sizeof(*k));
                if (col_copy(s, 0, k->id, sizeof(k->id)) < 0 ||
                    col_copy(s, 1, k->tenant, sizeof(k->tenant)) < 0)
                        continue;
                k->admin = sqlite3_column_int(s, 4);
                k->revoked = sqlite3_column_int(s, 5);
                k->created_at = sqlite3_column_int64(s, 6);
                n++; /* salt and hash are not handed out by a list */
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = db_err(c->db, rc, err, "list api keys of %s", tenant);
        done(s);
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (cb(&rows[i], arg) < 0)
                        break;
        free(rows);
        return r;
}

static int sqlite_tenant_get(struct cove_catalog *c, const char *id, struct cove_tenant_row *out,
                             struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_TENANT_GET];
        bind_text(s, 1, id);
        int r, rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
                if (tenant_cols(s, out) < 0)
                        r = cove_err_set(err, 0, "catalog: get tenant %s: stored field too long",
                                         id);
                else
                        r = 0;
        } else if (rc == SQLITE_DONE) {
                r = 1;
        } else {
                r = db_err(c->db, rc, err, "get tenant %s", id);
        }
        done(s);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- API keys ---- */

static int sqlite_apikey_put(struct cove_catalog *c, const struct cove_apikey_row *k,
                             struct cove_err *err)
{
        if (!field_ok(k->id, sizeof(k->id)) || !field_ok(k->tenant, sizeof(k->tenant)) ||
            !field_ok(k->salt_hex, sizeof(k->salt_hex)) ||
            !field_ok(k->hash_hex, sizeof(k->hash_hex)) || !k->id[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: put api key: a field is missing or too long");
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_KEY_PUT];
        bind_text(s, 1, k->id);
        bind_text(s, 2, k->tenant);
        bind_text(s, 3, k->salt_hex);
        bind_text(s, 4, k->hash_hex);
        sqlite3_bind_int(s, 5, k->admin ? 1 : 0);
        sqlite3_bind_int(s, 6, k->revoked ? 1 : 0);
        sqlite3_bind_int64(s, 7, k->created_at);
        int r, rc = step_durable(c, s);
        if (rc != SQLITE_OK)
                r = db_err(c->db, rc, err, "put api key %s (tenant %s)", k->id, k->tenant);
        else if (sqlite3_changes(c->db) == 0)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: put api key %s: exists with another tenant or secret",
                                  k->id);
        else
                r = 0;
        done(s);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_apikey_get(struct cove_catalog *c, const char *id, struct cove_apikey_row *out,
                             struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_KEY_GET];
        bind_text(s, 1, id);
        int r, rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
                memset(out, 0, sizeof(*out));
                if (col_copy(s, 0, out->id, sizeof(out->id)) < 0 ||
                    col_copy(s, 1, out->tenant, sizeof(out->tenant)) < 0 ||
                    col_copy(s, 2, out->salt_hex, sizeof(out->salt_hex)) < 0 ||
                    col_copy(s, 3, out->hash_hex, sizeof(out->hash_hex)) < 0)
                        r = cove_err_set(err, 0, "catalog: get api key %s: stored field too long",
                                         id);
                else
                        r = 0;
                out->admin = sqlite3_column_int(s, 4);
                out->revoked = sqlite3_column_int(s, 5);
                out->created_at = sqlite3_column_int64(s, 6);
        } else if (rc == SQLITE_DONE) {
                r = 1;
        } else {
                r = db_err(c->db, rc, err, "get api key %s", id);
        }
        done(s);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_apikey_count(struct cove_catalog *c, int64_t *n, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *s = c->st[ST_KEY_COUNT];
        int r, rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
                *n = sqlite3_column_int64(s, 0);
                r = 0;
        } else {
                r = db_err(c->db, rc, err, "count api keys");
        }
        done(s);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- sandboxes ---- */

static void sbx_bind(sqlite3_stmt *st, const struct cove_sandbox_row *s)
{
        bind_text(st, 1, s->id);
        bind_text(st, 2, s->tenant);
        bind_text(st, 3, s->state);
        bind_text(st, 4, s->template_name);
        bind_text(st, 5, s->runtime);
        sqlite3_bind_int64(st, 6, s->created_at);
        sqlite3_bind_int64(st, 7, s->expires_at);
        sqlite3_bind_int(st, 8, s->cpus);
        sqlite3_bind_int(st, 9, s->memory_mb);
        sqlite3_bind_int(st, 10, s->disk_mb);
        sqlite3_bind_int(st, 11, s->timeout_s);
        bind_text(st, 12, s->on_timeout);
        sqlite3_bind_int64(st, 13, (sqlite3_int64)s->uid_base);
        bind_text(st, 14, s->node);
        bind_text(st, 15, s->last_snapshot_id);
        bind_text(st, 16, s->metadata_json ? s->metadata_json : "{}");
        bind_text(st, 17, s->env_json ? s->env_json : "{}");
        bind_text(st, 18, s->error);
        sqlite3_bind_int(st, 19, s->snapshot_interval_s);
        bind_text(st, 20, s->retention_json);
        sqlite3_bind_int(st, 21, s->storage_encrypted ? 1 : 0);
        bind_text(st, 22, s->recovered_from_json);
}

/* Fill out from the current row of st (columns SBX_COLS); out owns its strings. */
static int sbx_read(sqlite3_stmt *st, struct cove_sandbox_row *out)
{
        memset(out, 0, sizeof(*out));
        if (col_copy(st, 0, out->id, sizeof(out->id)) < 0 ||
            col_copy(st, 1, out->tenant, sizeof(out->tenant)) < 0 ||
            col_copy(st, 2, out->state, sizeof(out->state)) < 0 ||
            col_copy(st, 3, out->template_name, sizeof(out->template_name)) < 0 ||
            col_copy(st, 4, out->runtime, sizeof(out->runtime)) < 0 ||
            col_copy(st, 11, out->on_timeout, sizeof(out->on_timeout)) < 0 ||
            col_copy(st, 13, out->node, sizeof(out->node)) < 0 ||
            col_copy(st, 14, out->last_snapshot_id, sizeof(out->last_snapshot_id)) < 0)
                return -EOVERFLOW;
        out->created_at = sqlite3_column_int64(st, 5);
        out->expires_at = sqlite3_column_int64(st, 6);
        out->cpus = sqlite3_column_int(st, 7);
        out->memory_mb = sqlite3_column_int(st, 8);
        out->disk_mb = sqlite3_column_int(st, 9);
        out->timeout_s = sqlite3_column_int(st, 10);
        out->uid_base = (uint32_t)sqlite3_column_int64(st, 12);
        out->metadata_json = col_dup(st, 15, "{}");
        out->env_json = col_dup(st, 16, "{}");
        out->error = col_dup(st, 17, NULL);
        out->snapshot_interval_s = sqlite3_column_int(st, 18);
        out->retention_json = col_dup(st, 19, NULL);
        out->storage_encrypted = sqlite3_column_int(st, 20);
        out->recovered_from_json = col_dup(st, 21, NULL);
        if (!out->metadata_json || !out->env_json ||
            (!out->error && sqlite3_column_type(st, 17) != SQLITE_NULL) ||
            (!out->recovered_from_json && sqlite3_column_type(st, 21) != SQLITE_NULL) ||
            (!out->retention_json && sqlite3_column_type(st, 19) != SQLITE_NULL)) {
                cove_sandbox_row_clear(out);
                return -ENOMEM;
        }
        return 0;
}

static int sbx_read_err(int r, const char *id, struct cove_err *err)
{
        if (r == -ENOMEM)
                return cove_err_set(err, ENOMEM, "catalog: read sandbox %s", id);
        return cove_err_set(err, 0, "catalog: read sandbox %s: stored field too long", id);
}

static int sqlite_sandbox_write(struct cove_catalog *c, enum stmt_id which,
                                const struct cove_sandbox_row *s, struct cove_err *err)
{
        const char *op = which == ST_SBX_INSERT ? "insert" : "update";
        if (cove__sandbox_check(s, err, op) < 0)
                return -1;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[which];
        sbx_bind(st, s);
        int r, rc = step_done(st);
        if (rc != SQLITE_OK)
                r = db_err(c->db, rc, err, "%s sandbox %s (tenant %s)", op, s->id, s->tenant);
        else
                r = (which == ST_SBX_UPDATE && sqlite3_changes(c->db) == 0) ? 1 : 0;
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_sandbox_insert(struct cove_catalog *c, const struct cove_sandbox_row *s,
                                 struct cove_err *err)
{
        return sqlite_sandbox_write(c, ST_SBX_INSERT, s, err);
}

static int sqlite_sandbox_update(struct cove_catalog *c, const struct cove_sandbox_row *s,
                                 struct cove_err *err)
{
        return sqlite_sandbox_write(c, ST_SBX_UPDATE, s, err);
}

static int sqlite_sandbox_update_fenced(struct cove_catalog *c, const struct cove_sandbox_row *s,
                                        const char *node, int64_t epoch, int64_t generation,
                                        struct cove_err *err)
{
        if (cove__sandbox_check(s, err, "update") < 0)
                return -1;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_SBX_UPDATE_FENCED];
        sbx_bind(st, s);
        bind_text(st, 23, node);
        sqlite3_bind_int64(st, 24, epoch);
        sqlite3_bind_int64(st, 25, generation);
        sqlite3_bind_int64(st, 26, cove_now_ms());
        int r, rc = step_done(st);
        int n = rc == SQLITE_OK ? sqlite3_changes(c->db) : 0;
        if (rc != SQLITE_OK)
                r = db_err(c->db, rc, err, "update sandbox %s (tenant %s)", s->id, s->tenant);
        done(st);
        if (rc == SQLITE_OK && n == 0) { /* absent, or the fence did not hold: which? */
                sqlite3_stmt *g = c->st[ST_SBX_GET_T];
                bind_text(g, 1, s->id);
                bind_text(g, 2, s->tenant);
                rc = sqlite3_step(g);
                if (rc == SQLITE_DONE)
                        r = 1;
                else if (rc == SQLITE_ROW)
                        r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                          "catalog: update sandbox %s: node %s epoch %lld "
                                          "generation %lld is stale",
                                          s->id, node, (long long)epoch, (long long)generation);
                else
                        r = db_err(c->db, rc, err, "get sandbox %s", s->id);
                done(g);
        } else if (rc == SQLITE_OK) {
                r = 0;
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_sandbox_get(struct cove_catalog *c, const char *tenant, const char *id,
                              struct cove_sandbox_row *out, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[tenant ? ST_SBX_GET_T : ST_SBX_GET];
        bind_text(st, 1, id);
        if (tenant)
                bind_text(st, 2, tenant);
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                r = sbx_read(st, out);
                if (r < 0)
                        r = sbx_read_err(r, id, err);
        } else if (rc == SQLITE_DONE) {
                r = 1;
        } else {
                r = db_err(c->db, rc, err, "get sandbox %s", id);
        }
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_sandbox_list(struct cove_catalog *c, const char *tenant, const char *states,
                               cove_sandbox_cb cb, void *arg, struct cove_err *err)
{
        char filter[256];
        int any;
        if (cove__states_filter(states, filter, sizeof(filter), &any) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: list sandboxes: state filter too long");
        if (!any && filter[0] == '\0')
                return 0; /* only unknown states: nothing can match */

        /* Rows are collected under the lock and handed to cb after it is released, so a
         * callback may itself call the catalog (e.g. update the row it is given). */
        struct cove_sandbox_row *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[tenant ? ST_SBX_LIST_T : ST_SBX_LIST];
        if (any)
                sqlite3_bind_null(st, 1);
        else
                bind_text(st, 1, filter);
        if (tenant)
                bind_text(st, 2, tenant);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        struct cove_sandbox_row *nr = realloc(rows, ncap * sizeof(*rows));
                        if (!nr) {
                                r = cove_err_set(err, ENOMEM, "catalog: list sandboxes");
                                break;
                        }
                        rows = nr;
                        cap = ncap;
                }
                int e = sbx_read(st, &rows[n]);
                if (e < 0) {
                        r = sbx_read_err(e, (const char *)sqlite3_column_text(st, 0), err);
                        break;
                }
                n++;
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = db_err(c->db, rc, err, "list sandboxes");
        done(st);
        pthread_mutex_unlock(&c->lock);

        int stop = r < 0; /* on error no row is handed out: the list would be partial */
        for (size_t i = 0; i < n; i++) {
                if (!stop && cb(&rows[i], arg) < 0)
                        stop = 1;
                cove_sandbox_row_clear(&rows[i]);
        }
        free(rows);
        return r;
}

/* Run a bound DELETE statement (lock held) and reset it: 0 when a row went, 1 when none
 * matched, -1 with err (its context formatted from fmt) on failure. */
static int run_delete(struct cove_catalog *c, sqlite3_stmt *st, struct cove_err *err,
                      const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int run_delete(struct cove_catalog *c, sqlite3_stmt *st, struct cove_err *err,
                      const char *fmt, ...)
{
        int r, rc = step_done(st);
        if (rc != SQLITE_OK) {
                char ctx[256];
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(ctx, sizeof(ctx), fmt, ap);
                va_end(ap);
                r = db_err(c->db, rc, err, "%s", ctx);
        } else {
                r = sqlite3_changes(c->db) == 0 ? 1 : 0;
        }
        done(st);
        return r;
}

static int sqlite_sandbox_delete(struct cove_catalog *c, const char *id, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_SBX_DELETE];
        bind_text(st, 1, id);
        int r = run_delete(c, st, err, "delete sandbox %s", id);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- snapshots ---- */

static int sqlite_snapshot_insert(struct cove_catalog *c, const struct cove_snapshot_row *s,
                                  struct cove_err *err)
{
        if (!field_ok(s->id, sizeof(s->id)) || !s->id[0] ||
            !field_ok(s->tenant, sizeof(s->tenant)) || !s->tenant[0] ||
            !field_ok(s->sandbox_id, sizeof(s->sandbox_id)) ||
            !field_ok(s->parent_id, sizeof(s->parent_id)) || !field_ok(s->kind, sizeof(s->kind)) ||
            !field_ok(s->label, sizeof(s->label)) || s->size_bytes > INT64_MAX ||
            s->new_bytes > INT64_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: insert snapshot: a field is missing or too long");
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_SNAP_INSERT];
        bind_text(st, 1, s->id);
        bind_text(st, 2, s->tenant);
        bind_text(st, 3, s->sandbox_id);
        bind_text(st, 4, s->parent_id);
        bind_text(st, 5, s->kind);
        sqlite3_bind_int64(st, 6, s->created_at);
        bind_text(st, 7, s->label);
        sqlite3_bind_int64(st, 8, (sqlite3_int64)s->size_bytes);
        sqlite3_bind_int64(st, 9, (sqlite3_int64)s->new_bytes);
        sqlite3_bind_int64(st, 10, s->pause_us);
        sqlite3_bind_int(st, 11, s->rolling ? 1 : 0);
        int rc = step_durable(c, st);
        int r = rc == SQLITE_OK ? 0
                                : db_err(c->db, rc, err, "insert snapshot %s (sandbox %s)", s->id,
                                         s->sandbox_id);
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int snap_read(sqlite3_stmt *st, struct cove_snapshot_row *out)
{
        memset(out, 0, sizeof(*out));
        if (col_copy(st, 0, out->id, sizeof(out->id)) < 0 ||
            col_copy(st, 1, out->tenant, sizeof(out->tenant)) < 0 ||
            col_copy(st, 2, out->sandbox_id, sizeof(out->sandbox_id)) < 0 ||
            col_copy(st, 3, out->parent_id, sizeof(out->parent_id)) < 0 ||
            col_copy(st, 4, out->kind, sizeof(out->kind)) < 0 ||
            col_copy(st, 6, out->label, sizeof(out->label)) < 0)
                return -1;
        out->created_at = sqlite3_column_int64(st, 5);
        out->size_bytes = (uint64_t)sqlite3_column_int64(st, 7);
        out->new_bytes = (uint64_t)sqlite3_column_int64(st, 8);
        out->pause_us = sqlite3_column_int64(st, 9);
        out->rolling = sqlite3_column_int(st, 10);
        return 0;
}

static int sqlite_snapshot_get(struct cove_catalog *c, const char *tenant, const char *id,
                               struct cove_snapshot_row *out, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[tenant ? ST_SNAP_GET_T : ST_SNAP_GET];
        bind_text(st, 1, id);
        if (tenant)
                bind_text(st, 2, tenant);
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
                r = snap_read(st, out) < 0
                        ? cove_err_set(err, 0, "catalog: get snapshot %s: stored field too long",
                                       id)
                        : 0;
        else if (rc == SQLITE_DONE)
                r = 1;
        else
                r = db_err(c->db, rc, err, "get snapshot %s", id);
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_snapshot_list(struct cove_catalog *c, const char *tenant, const char *sandbox_id,
                                cove_snapshot_cb cb, void *arg, struct cove_err *err)
{
        struct cove_snapshot_row *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0, rc;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_SNAP_LIST];
        bind_text(st, 1, tenant);
        bind_text(st, 2, sandbox_id);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        struct cove_snapshot_row *nr = realloc(rows, ncap * sizeof(*rows));
                        if (!nr) {
                                r = cove_err_set(err, ENOMEM, "catalog: list snapshots");
                                break;
                        }
                        rows = nr;
                        cap = ncap;
                }
                if (snap_read(st, &rows[n]) < 0) {
                        r = cove_err_set(err, 0, "catalog: list snapshots: stored field too long");
                        break;
                }
                n++;
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = db_err(c->db, rc, err, "list snapshots");
        done(st);
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (cb(&rows[i], arg) < 0)
                        break;
        free(rows);
        return r;
}

static int sqlite_snapshot_delete(struct cove_catalog *c, const char *id, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_SNAP_DELETE];
        bind_text(st, 1, id);
        int r = run_delete(c, st, err, "delete snapshot %s", id);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- audit events, egress policies ---- */

static int sqlite_audit_append(struct cove_catalog *c, const struct cove_audit_row *rows, size_t n,
                               struct cove_err *err)
{
        for (size_t i = 0; i < n; i++)
                if (!field_ok(rows[i].tenant, sizeof(rows[i].tenant)) ||
                    !field_ok(rows[i].sandbox, sizeof(rows[i].sandbox)) ||
                    !field_ok(rows[i].kind, sizeof(rows[i].kind)) ||
                    !field_ok(rows[i].action, sizeof(rows[i].action)) ||
                    !field_ok(rows[i].verdict, sizeof(rows[i].verdict)) ||
                    strnlen(rows[i].prev_hash, 65) != 64 || strnlen(rows[i].hash, 65) != 64)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "catalog: append audit event: bad field");
        pthread_mutex_lock(&c->lock);
        int r = 0;
        if (exec_sql(c->db, "BEGIN IMMEDIATE", err, "begin audit append") < 0) {
                pthread_mutex_unlock(&c->lock);
                return -1;
        }
        /* the chain has no gaps: the first row must follow the newest stored one */
        sqlite3_stmt *last = c->st[ST_AUDIT_LAST];
        int64_t have = 0;
        if (sqlite3_step(last) == SQLITE_ROW)
                have = sqlite3_column_int64(last, 0);
        done(last);
        if (n && rows[0].seq != have + 1)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: audit event %lld does not follow %lld",
                                  (long long)rows[0].seq, (long long)have);
        sqlite3_stmt *st = c->st[ST_AUDIT_INSERT];
        for (size_t i = 0; r == 0 && i < n; i++) {
                const struct cove_audit_row *a = &rows[i];
                sqlite3_bind_int64(st, 1, a->seq);
                sqlite3_bind_int64(st, 2, a->at);
                bind_text(st, 3, a->tenant);
                bind_text(st, 4, a->sandbox);
                bind_text(st, 5, a->kind);
                bind_text(st, 6, a->action);
                bind_text(st, 7, a->verdict);
                bind_text(st, 8, a->detail_json ? a->detail_json : "{}");
                bind_text(st, 9, a->prev_hash);
                bind_text(st, 10, a->hash);
                int rc = step_done(st);
                if (rc != SQLITE_OK)
                        r = db_err(c->db, rc, err, "append audit event %lld", (long long)a->seq);
                done(st);
        }
        if (r == 0)
                r = exec_sql(c->db, "COMMIT", err, "commit audit events");
        if (r < 0)
                sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_audit_last(struct cove_catalog *c, int64_t *seq, char hash[65],
                             struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_AUDIT_LAST];
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                *seq = sqlite3_column_int64(st, 0);
                r = col_copy(st, 1, hash, 65) < 0
                        ? cove_err_set(err, 0, "catalog: last audit event: bad hash")
                        : 0;
        } else if (rc == SQLITE_DONE) {
                r = 1;
        } else {
                r = db_err(c->db, rc, err, "last audit event");
        }
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_audit_list(struct cove_catalog *c, const char *tenant, const char *sandbox,
                             const char *kind, int64_t after_seq, int64_t since_ms, int limit,
                             cove_audit_cb cb, void *arg, struct cove_err *err)
{
        struct cove_audit_row *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0, rc;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_AUDIT_LIST];
        bind_text(st, 1, tenant);
        bind_text(st, 2, sandbox);
        bind_text(st, 3, kind);
        sqlite3_bind_int64(st, 4, after_seq);
        sqlite3_bind_int64(st, 5, since_ms);
        sqlite3_bind_int64(st, 6, limit > 0 ? limit : -1);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 64;
                        struct cove_audit_row *nr = realloc(rows, ncap * sizeof(*rows));
                        if (!nr) {
                                r = cove_err_set(err, ENOMEM, "catalog: list audit events");
                                break;
                        }
                        rows = nr;
                        cap = ncap;
                }
                struct cove_audit_row *a = &rows[n];
                memset(a, 0, sizeof(*a));
                a->seq = sqlite3_column_int64(st, 0);
                a->at = sqlite3_column_int64(st, 1);
                if (col_copy(st, 2, a->tenant, sizeof(a->tenant)) < 0 ||
                    col_copy(st, 3, a->sandbox, sizeof(a->sandbox)) < 0 ||
                    col_copy(st, 4, a->kind, sizeof(a->kind)) < 0 ||
                    col_copy(st, 5, a->action, sizeof(a->action)) < 0 ||
                    col_copy(st, 6, a->verdict, sizeof(a->verdict)) < 0 ||
                    col_copy(st, 8, a->prev_hash, sizeof(a->prev_hash)) < 0 ||
                    col_copy(st, 9, a->hash, sizeof(a->hash)) < 0 ||
                    !(a->detail_json = col_dup(st, 7, "{}"))) {
                        r = cove_err_set(err, 0, "catalog: list audit events: bad stored row");
                        break;
                }
                n++;
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = db_err(c->db, rc, err, "list audit events");
        done(st);
        pthread_mutex_unlock(&c->lock);
        size_t i;
        for (i = 0; r == 0 && i < n; i++)
                if (cb(&rows[i], arg) < 0)
                        break;
        for (i = 0; i < n; i++)
                free(rows[i].detail_json);
        free(rows);
        return r;
}

static int sqlite_egress_put(struct cove_catalog *c, const char *sandbox_id, const char *tenant,
                             const char *json, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_EGRESS_PUT];
        bind_text(st, 1, sandbox_id);
        bind_text(st, 2, tenant);
        bind_text(st, 3, json);
        sqlite3_bind_int64(st, 4, cove_now_ms());
        int rc = step_done(st);
        int r = rc == SQLITE_OK ? 0 : db_err(c->db, rc, err, "put egress policy of %s", sandbox_id);
        if (r == 0 && sqlite3_changes(c->db) == 0)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: egress policy of %s belongs to another tenant",
                                  sandbox_id);
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_egress_get(struct cove_catalog *c, const char *sandbox_id, char **json,
                             struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_EGRESS_GET];
        bind_text(st, 1, sandbox_id);
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
                r = (*json = col_dup(st, 0, "{}")) ? 0 : cove_err_set(err, ENOMEM, "egress");
        else if (rc == SQLITE_DONE)
                r = 1;
        else
                r = db_err(c->db, rc, err, "get egress policy of %s", sandbox_id);
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_egress_delete(struct cove_catalog *c, const char *sandbox_id,
                                struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_EGRESS_DELETE];
        bind_text(st, 1, sandbox_id);
        int r = run_delete(c, st, err, "delete egress policy of %s", sandbox_id);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- egress documents (secrets, leases) ---- */

static int sqlite_doc_put(struct cove_catalog *c, const char *kind, const char *tenant,
                          const char *key, const char *owner, const char *json,
                          struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *sync = c->st[ST_SYNC_FULL];
        step_done(sync);
        done(sync);
        sqlite3_stmt *st = c->st[ST_DOC_PUT];
        bind_text(st, 1, kind);
        bind_text(st, 2, tenant);
        bind_text(st, 3, key);
        bind_text(st, 4, owner ? owner : "");
        bind_text(st, 5, json);
        sqlite3_bind_int64(st, 6, cove_now_ms());
        int rc = step_done(st);
        int r = rc == SQLITE_OK ? 0 : db_err(c->db, rc, err, "put %s %s", kind, key);
        done(st);
        sync = c->st[ST_SYNC_NORMAL];
        step_done(sync);
        done(sync);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- key records (schema 8): statements prepared per call (not on a hot path) ---- */

static int sqlite_keyrec_get(struct cove_catalog *c, const char *tenant, char **json, int64_t *gen,
                             struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(
            c->db, "SELECT record_json, gen FROM key_records WHERE tenant = ?1", -1, &st, NULL);
        int r;
        if (rc == SQLITE_OK) {
                bind_text(st, 1, tenant);
                rc = sqlite3_step(st);
        }
        if (rc == SQLITE_ROW) {
                *gen = sqlite3_column_int64(st, 1);
                r = (*json = col_dup(st, 0, "{}")) ? 0 : cove_err_set(err, ENOMEM, "key record");
        } else if (rc == SQLITE_DONE) {
                r = 1;
        } else {
                r = db_err(c->db, rc, err, "key record of %s", tenant);
        }
        sqlite3_finalize(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_keyrec_put(struct cove_catalog *c, const char *tenant, const char *json,
                             int64_t expect_gen, int64_t *gen, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *sync = c->st[ST_SYNC_FULL];
        step_done(sync);
        done(sync);
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(
            c->db,
            expect_gen == 0 ? "INSERT INTO key_records(tenant, gen, record_json, updated_at)"
                              " VALUES (?1, 1, ?2, ?3) ON CONFLICT(tenant) DO NOTHING"
                            : "UPDATE key_records SET gen = gen + 1, record_json = ?2,"
                              " updated_at = ?3 WHERE tenant = ?1 AND gen = ?4",
            -1, &st, NULL);
        if (rc == SQLITE_OK) {
                bind_text(st, 1, tenant);
                bind_text(st, 2, json);
                sqlite3_bind_int64(st, 3, cove_now_ms());
                if (expect_gen)
                        sqlite3_bind_int64(st, 4, expect_gen);
                rc = step_done(st);
        }
        int r;
        if (rc != SQLITE_OK)
                r = db_err(c->db, rc, err, "put key record of %s", tenant);
        else if (sqlite3_changes(c->db) != 1)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: key record of %s was %s by another process", tenant,
                                  expect_gen == 0 ? "created" : "changed");
        else {
                *gen = expect_gen + 1;
                r = 0;
        }
        sqlite3_finalize(st);
        sync = c->st[ST_SYNC_NORMAL];
        step_done(sync);
        done(sync);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_doc_get(struct cove_catalog *c, const char *kind, const char *tenant,
                          const char *key, char **json, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_DOC_GET];
        bind_text(st, 1, kind);
        bind_text(st, 2, tenant);
        bind_text(st, 3, key);
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
                r = (*json = col_dup(st, 2, "{}")) ? 0 : cove_err_set(err, ENOMEM, "%s", kind);
        else if (rc == SQLITE_DONE)
                r = 1;
        else
                r = db_err(c->db, rc, err, "get %s %s", kind, key);
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

struct doc_tmp {
        char *key, *owner, *json, *tenant;
};

static int sqlite_doc_list(struct cove_catalog *c, const char *kind, const char *tenant,
                           const char *owner, cove_doc_cb cb, void *arg, struct cove_err *err)
{
        struct doc_tmp *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0, rc;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_DOC_LIST];
        bind_text(st, 1, kind);
        bind_text(st, 2, tenant);
        bind_text(st, 3, owner);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 32;
                        struct doc_tmp *nr = realloc(rows, ncap * sizeof(*rows));
                        if (!nr) {
                                r = cove_err_set(err, ENOMEM, "catalog: list %s", kind);
                                break;
                        }
                        rows = nr;
                        cap = ncap;
                }
                struct doc_tmp *t = &rows[n];
                t->key = col_dup(st, 0, "");
                t->owner = col_dup(st, 1, "");
                t->json = col_dup(st, 2, "{}");
                t->tenant = col_dup(st, 3, "");
                n++;
                if (!t->key || !t->owner || !t->json || !t->tenant) {
                        r = cove_err_set(err, ENOMEM, "catalog: list %s", kind);
                        break;
                }
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = db_err(c->db, rc, err, "list %s", kind);
        done(st);
        pthread_mutex_unlock(&c->lock);
        size_t i;
        for (i = 0; r == 0 && i < n; i++)
                if (cb(rows[i].tenant, rows[i].key, rows[i].owner, rows[i].json, arg) < 0)
                        break;
        for (i = 0; i < n; i++) {
                free(rows[i].key);
                free(rows[i].owner);
                free(rows[i].json);
                free(rows[i].tenant);
        }
        free(rows);
        return r;
}

static int sqlite_doc_delete(struct cove_catalog *c, const char *kind, const char *tenant,
                             const char *key, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_DOC_DELETE];
        bind_text(st, 1, kind);
        bind_text(st, 2, tenant);
        bind_text(st, 3, key);
        int r = run_delete(c, st, err, "delete %s %s", kind, key);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- cluster (schema 6): leases, placements, jobs ---- */

static int name_ok(const char *s, size_t cap)
{
        return s && s[0] && strnlen(s, cap) < cap;
}

static int sqlite_node_lease_acquire(struct cove_catalog *c, const struct cove_node_row *n,
                                     int64_t ttl_ms, int64_t *epoch, int64_t *expires_at,
                                     struct cove_err *err)
{
        if (!name_ok(n->name, sizeof(n->name)) || !field_ok(n->address, sizeof(n->address)) ||
            !field_ok(n->features, sizeof(n->features)) || ttl_ms <= 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: acquire node lease: bad name, address, features "
                                     "or ttl");
        int64_t now = cove_now_ms();
        pthread_mutex_lock(&c->lock);
        step_done(c->st[ST_SYNC_FULL]);
        done(c->st[ST_SYNC_FULL]);
        sqlite3_stmt *st = c->st[ST_NODE_ACQUIRE];
        bind_text(st, 1, n->name);
        sqlite3_bind_int64(st, 2, now + ttl_ms);
        sqlite3_bind_int64(st, 3, n->cpus);
        sqlite3_bind_int64(st, 4, n->memory_mb);
        sqlite3_bind_int64(st, 5, n->disk_mb);
        bind_text(st, 6, n->address);
        sqlite3_bind_int64(st, 7, now);
        bind_text(st, 8, n->features[0] ? n->features : "{}");
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                if (epoch)
                        *epoch = sqlite3_column_int64(st, 0);
                if (expires_at)
                        *expires_at = sqlite3_column_int64(st, 1);
                r = 0;
                rc = sqlite3_step(st); /* finish the statement: the upsert commits now */
                if (rc != SQLITE_DONE)
                        r = db_err(c->db, rc, err, "acquire lease of node %s", n->name);
        } else if (rc == SQLITE_DONE) {
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: node %s: its lease is held and has not expired",
                                  n->name);
        } else {
                r = db_err(c->db, rc, err, "acquire lease of node %s", n->name);
        }
        done(st);
        step_done(c->st[ST_SYNC_NORMAL]);
        done(c->st[ST_SYNC_NORMAL]);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_node_lease_renew(struct cove_catalog *c, const char *name, int64_t epoch,
                                   int64_t ttl_ms, int64_t *expires_at, struct cove_err *err)
{
        if (ttl_ms <= 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "catalog: renew lease: bad ttl");
        int64_t now = cove_now_ms();
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_NODE_RENEW];
        bind_text(st, 1, name);
        sqlite3_bind_int64(st, 2, epoch);
        sqlite3_bind_int64(st, 3, now + ttl_ms);
        sqlite3_bind_int64(st, 4, now);
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                if (expires_at)
                        *expires_at = sqlite3_column_int64(st, 0);
                rc = sqlite3_step(st);
                r = rc == SQLITE_DONE ? 0 : db_err(c->db, rc, err, "renew lease of %s", name);
        } else if (rc == SQLITE_DONE) {
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: node %s: lease of epoch %lld is stale or expired", name,
                                  (long long)epoch);
        } else {
                r = db_err(c->db, rc, err, "renew lease of node %s", name);
        }
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_node_set_state(struct cove_catalog *c, const char *name, const char *state,
                                 struct cove_err *err)
{
        if (!cove_node_state_valid(state))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: node state must be ready, cordoned, draining or "
                                     "lost");
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_NODE_SET_STATE];
        bind_text(st, 1, name);
        bind_text(st, 2, state);
        int r = run_delete(c, st, err, "set state of node %s", name); /* 0 changed, 1 none */
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_node_list(struct cove_catalog *c, cove_node_cb cb, void *arg,
                            struct cove_err *err)
{
        struct cove_node_row *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0, rc;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_NODE_LIST];
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        struct cove_node_row *nr = realloc(rows, ncap * sizeof(*rows));
                        if (!nr) {
                                r = cove_err_set(err, ENOMEM, "catalog: list nodes");
                                break;
                        }
                        rows = nr;
                        cap = ncap;
                }
                struct cove_node_row *o = &rows[n];
                memset(o, 0, sizeof(*o));
                if (col_copy(st, 0, o->name, sizeof(o->name)) < 0 ||
                    col_copy(st, 1, o->state, sizeof(o->state)) < 0 ||
                    col_copy(st, 10, o->address, sizeof(o->address)) < 0 ||
                    col_copy(st, 12, o->features, sizeof(o->features)) < 0) {
                        r = cove_err_set(err, 0, "catalog: list nodes: stored field too long");
                        break;
                }
                o->epoch = sqlite3_column_int64(st, 2);
                o->lease_expires_at = sqlite3_column_int64(st, 3);
                o->cpus = sqlite3_column_int64(st, 4);
                o->memory_mb = sqlite3_column_int64(st, 5);
                o->disk_mb = sqlite3_column_int64(st, 6);
                o->alloc_cpus = sqlite3_column_int64(st, 7);
                o->alloc_memory_mb = sqlite3_column_int64(st, 8);
                o->alloc_disk_mb = sqlite3_column_int64(st, 9);
                o->last_seen = sqlite3_column_int64(st, 11);
                n++;
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = db_err(c->db, rc, err, "list nodes");
        done(st);
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (cb(&rows[i], arg) < 0)
                        break;
        free(rows);
        return r;
}

static int place_read(sqlite3_stmt *st, struct cove_placement_row *o)
{
        memset(o, 0, sizeof(*o));
        if (col_copy(st, 0, o->sandbox_id, sizeof(o->sandbox_id)) < 0 ||
            col_copy(st, 1, o->node, sizeof(o->node)) < 0 ||
            col_copy(st, 3, o->desired_state, sizeof(o->desired_state)) < 0 ||
            col_copy(st, 4, o->observed_state, sizeof(o->observed_state)) < 0)
                return -1;
        o->generation = sqlite3_column_int64(st, 2);
        o->updated_at = sqlite3_column_int64(st, 5);
        return 0;
}

static int sqlite_placement_get(struct cove_catalog *c, const char *sandbox_id,
                                struct cove_placement_row *out, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_PLACE_GET];
        bind_text(st, 1, sandbox_id);
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
                r = place_read(st, out) < 0
                        ? cove_err_set(err, 0, "catalog: placement of %s: bad stored row",
                                       sandbox_id)
                        : 0;
        else if (rc == SQLITE_DONE)
                r = 1;
        else
                r = db_err(c->db, rc, err, "get placement of %s", sandbox_id);
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* Lock held, inside BEGIN IMMEDIATE: the body of placement_write. */
static int place_txn(struct cove_catalog *c, const char *sandbox_id, const char *node,
                     const char *desired_state, const char *job_kind, const char *job_args,
                     int64_t expect_generation, int64_t *generation, int64_t *job_id,
                     struct cove_err *err)
{
        int64_t now = cove_now_ms(), cur = 0;
        sqlite3_stmt *st = c->st[ST_PLACE_GET];
        bind_text(st, 1, sandbox_id);
        int rc = sqlite3_step(st), placed = rc == SQLITE_ROW;
        if (placed)
                cur = sqlite3_column_int64(st, 2);
        done(st);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
                return db_err(c->db, rc, err, "place %s", sandbox_id);
        if (expect_generation >= 0 && cur != expect_generation)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "catalog: place %s: generation is %lld, not %lld", sandbox_id,
                                     (long long)cur, (long long)expect_generation);
        int64_t gen = cur;
        if (node) {
                st = c->st[ST_NODE_STATE];
                bind_text(st, 1, node);
                rc = sqlite3_step(st);
                char state[16] = "";
                if (rc == SQLITE_ROW)
                        col_copy(st, 0, state, sizeof(state));
                done(st);
                if (rc == SQLITE_DONE)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                             "catalog: place %s: no node %s", sandbox_id, node);
                if (rc != SQLITE_ROW)
                        return db_err(c->db, rc, err, "place %s: node %s", sandbox_id, node);
                if (strcmp(state, "ready") != 0)
                        return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                             "catalog: place %s: node %s is %s", sandbox_id, node,
                                             state);
                gen = cur + 1;
                st = c->st[ST_PLACE_PUT];
                bind_text(st, 1, sandbox_id);
                bind_text(st, 2, node);
                sqlite3_bind_int64(st, 3, gen);
                bind_text(st, 4, desired_state);
                sqlite3_bind_int64(st, 5, now);
        } else {
                if (!placed)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                             "catalog: %s is not placed on any node", sandbox_id);
                st = c->st[ST_PLACE_DESIRE];
                bind_text(st, 1, sandbox_id);
                bind_text(st, 2, desired_state);
                sqlite3_bind_int64(st, 3, now);
        }
        rc = step_done(st);
        done(st);
        if (rc != SQLITE_OK)
                return db_err(c->db, rc, err, "place %s", sandbox_id);
        st = c->st[ST_JOB_SUPERSEDE];
        bind_text(st, 1, sandbox_id);
        sqlite3_bind_int64(st, 2, gen);
        sqlite3_bind_int64(st, 3, now);
        rc = step_done(st);
        done(st);
        if (rc != SQLITE_OK)
                return db_err(c->db, rc, err, "place %s: supersede jobs", sandbox_id);
        int64_t id = 0;
        if (job_kind) {
                st = c->st[ST_JOB_INSERT];
                bind_text(st, 1, sandbox_id);
                bind_text(st, 2, job_kind);
                sqlite3_bind_int64(st, 3, gen);
                sqlite3_bind_int64(st, 4, now);
                bind_text(st, 5, job_args);
                rc = sqlite3_step(st);
                if (rc == SQLITE_ROW) {
                        id = sqlite3_column_int64(st, 0);
                        rc = step_done(st);
                }
                done(st);
                if (rc != SQLITE_OK)
                        return db_err(c->db, rc, err, "enqueue %s job of %s", job_kind, sandbox_id);
        }
        if (generation)
                *generation = gen;
        if (job_id)
                *job_id = id;
        return 0;
}

static int place_args_ok(const char *sandbox_id, const char *node, const char *desired_state,
                         const char *job_kind, struct cove_err *err)
{
        if (!name_ok(sandbox_id, 64) || (node && !name_ok(node, 64)) || !desired_state ||
            !cove_sandbox_state_valid(desired_state, strlen(desired_state)) ||
            (job_kind && !name_ok(job_kind, 16)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: place: bad sandbox id, node, desired state or "
                                     "job kind");
        return 0;
}

static int sqlite_placement_write(struct cove_catalog *c, const char *sandbox_id, const char *node,
                                  const char *desired_state, const char *job_kind,
                                  const char *job_args_json, int64_t expect_generation,
                                  int64_t *generation, int64_t *job_id, struct cove_err *err)
{
        if (place_args_ok(sandbox_id, node, desired_state, job_kind, err) < 0)
                return -1;
        pthread_mutex_lock(&c->lock);
        step_done(c->st[ST_SYNC_FULL]);
        done(c->st[ST_SYNC_FULL]);
        int r = exec_sql(c->db, "BEGIN IMMEDIATE", err, "begin placement");
        if (r == 0) {
                r = place_txn(c, sandbox_id, node, desired_state, job_kind, job_args_json,
                              expect_generation, generation, job_id, err);
                if (r == 0)
                        r = exec_sql(c->db, "COMMIT", err, "commit placement");
                if (r < 0)
                        sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
        }
        step_done(c->st[ST_SYNC_NORMAL]);
        done(c->st[ST_SYNC_NORMAL]);
        if (r == 0) {
                c->wake_seq++;
                pthread_cond_broadcast(&c->wake);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_placement_observe(struct cove_catalog *c, const char *sandbox_id,
                                    const char *node, int64_t epoch, int64_t generation,
                                    const char *observed_state, const char *desired_state,
                                    struct cove_err *err)
{
        if (cove_observe_valid(sandbox_id, observed_state, desired_state, err) < 0)
                return -1;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_PLACE_OBSERVE];
        bind_text(st, 1, sandbox_id);
        bind_text(st, 2, node);
        sqlite3_bind_int64(st, 3, epoch);
        sqlite3_bind_int64(st, 4, generation);
        bind_text(st, 5, observed_state);
        sqlite3_bind_int64(st, 6, cove_now_ms());
        bind_text(st, 7, desired_state);
        int r = run_delete(c, st, err, "observe %s", sandbox_id);
        pthread_mutex_unlock(&c->lock);
        if (r == 1)
                r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                  "catalog: observe %s: node %s epoch %lld generation %lld is "
                                  "stale",
                                  sandbox_id, node, (long long)epoch, (long long)generation);
        return r;
}

static int job_read(sqlite3_stmt *st, struct cove_job_row *o)
{
        memset(o, 0, sizeof(*o));
        o->id = sqlite3_column_int64(st, 0);
        if (col_copy(st, 1, o->sandbox_id, sizeof(o->sandbox_id)) < 0 ||
            col_copy(st, 2, o->kind, sizeof(o->kind)) < 0 ||
            col_copy(st, 4, o->state, sizeof(o->state)) < 0 ||
            col_copy(st, 5, o->claimed_by, sizeof(o->claimed_by)) < 0)
                return -1;
        o->generation = sqlite3_column_int64(st, 3);
        o->claimed_epoch = sqlite3_column_int64(st, 6);
        if (sqlite3_column_type(st, 7) != SQLITE_NULL && !(o->result_json = col_dup(st, 7, NULL)))
                return -1;
        o->created_at = sqlite3_column_int64(st, 8);
        o->updated_at = sqlite3_column_int64(st, 9);
        if (sqlite3_column_type(st, 10) != SQLITE_NULL && !(o->args_json = col_dup(st, 10, NULL)))
                return -1;
        return 0;
}

/* Lock held: 1 when (node, epoch) holds a live lease now, 0 not, -1 error. */
static int lease_live(struct cove_catalog *c, const char *node, int64_t epoch, struct cove_err *err)
{
        sqlite3_stmt *st = c->st[ST_LEASE_LIVE];
        bind_text(st, 1, node);
        sqlite3_bind_int64(st, 2, epoch);
        sqlite3_bind_int64(st, 3, cove_now_ms());
        int rc = sqlite3_step(st);
        int r = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) > 0
                                 : db_err(c->db, rc, err, "lease of node %s", node);
        done(st);
        return r;
}

static int sqlite_job_claim(struct cove_catalog *c, const char *node, int64_t epoch,
                            struct cove_job_row *out, struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_JOB_CLAIM];
        bind_text(st, 1, node);
        sqlite3_bind_int64(st, 2, epoch);
        sqlite3_bind_int64(st, 3, cove_now_ms());
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                r = job_read(st, out) < 0 ? cove_err_set(err, 0, "catalog: claim: bad stored job")
                                          : 0;
                rc = sqlite3_step(st);
                if (r == 0 && rc != SQLITE_DONE) {
                        cove_job_row_clear(out);
                        r = db_err(c->db, rc, err, "claim a job for node %s", node);
                }
        } else if (rc == SQLITE_DONE) {
                r = 1;
        } else {
                r = db_err(c->db, rc, err, "claim a job for node %s", node);
        }
        done(st);
        if (r == 1) {
                int live = lease_live(c, node, epoch, err);
                if (live < 0)
                        r = -1;
                else if (!live)
                        r = cove_err_setk(err, COVE_E_CONFLICT, 0,
                                          "catalog: claim: node %s epoch %lld holds no live lease",
                                          node, (long long)epoch);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_job_get(struct cove_catalog *c, int64_t job_id, struct cove_job_row *out,
                          struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_JOB_GET];
        sqlite3_bind_int64(st, 1, job_id);
        int r, rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
                r = job_read(st, out) < 0
                        ? cove_err_set(err, 0, "catalog: job %lld: bad row", (long long)job_id)
                        : 0;
        else if (rc == SQLITE_DONE)
                r = 1;
        else
                r = db_err(c->db, rc, err, "get job %lld", (long long)job_id);
        done(st);
        pthread_mutex_unlock(&c->lock);
        return r;
}

static int sqlite_job_finish(struct cove_catalog *c, int64_t job_id, const char *node,
                             int64_t epoch, int64_t generation, int ok, const char *result_json,
                             struct cove_err *err)
{
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = c->st[ST_JOB_FINISH];
        sqlite3_bind_int64(st, 1, job_id);
        bind_text(st, 2, node);
        sqlite3_bind_int64(st, 3, epoch);
        sqlite3_bind_int64(st, 4, generation);
        bind_text(st, 5, ok ? "done" : "failed");
        bind_text(st, 6, result_json);
        sqlite3_bind_int64(st, 7, cove_now_ms());
        step_done(c->st[ST_SYNC_FULL]);
        done(c->st[ST_SYNC_FULL]);
        int r = run_delete(c, st, err, "finish job %lld", (long long)job_id);
        step_done(c->st[ST_SYNC_NORMAL]);
        done(c->st[ST_SYNC_NORMAL]);
        if (r == 0) { /* wakes a waiter for the job's outcome (wait_wakeup with NULL) */
                c->wake_seq++;
                pthread_cond_broadcast(&c->wake);
        }
        pthread_mutex_unlock(&c->lock);
        if (r == 1) {
                struct cove_job_row j;
                int g = sqlite_job_get(c, job_id, &j, err);
                if (g < 0)
                        return -1;
                if (g == 1)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "catalog: no job %lld",
                                             (long long)job_id);
                cove_job_row_clear(&j);
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "catalog: finish job %lld: node %s epoch %lld generation "
                                     "%lld is stale (or the job is not claimed by it)",
                                     (long long)job_id, node, (long long)epoch,
                                     (long long)generation);
        }
        return r;
}

struct count_row {
        char name[64];
        int64_t count;
};

static int sqlite_job_counts(struct cove_catalog *c, const char *kinds, cove_count_cb cb, void *arg,
                             struct cove_err *err)
{
        char filter[260];
        if (cove__kinds_filter(kinds, filter, sizeof(filter)) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "catalog: job kinds too long");
        struct count_row *rows = NULL;
        size_t n = 0, cap = 0;
        int r = 0, rc;
        pthread_mutex_lock(&c->lock);
        sqlite3_stmt *st = NULL;
        rc = sqlite3_prepare_v2(c->db,
                                "SELECT p.node, count(*) FROM jobs j JOIN placements p"
                                " ON p.sandbox_id = j.sandbox_id AND p.generation = j.generation"
                                " WHERE j.state IN ('queued', 'claimed')"
                                " AND instr(?1, ',' || j.kind || ',') > 0"
                                " GROUP BY p.node ORDER BY p.node",
                                -1, &st, NULL);
        if (rc != SQLITE_OK) {
                r = db_err(c->db, rc, err, "count jobs");
        } else {
                bind_text(st, 1, filter);
                while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                        if (n == cap) {
                                size_t ncap = cap ? cap * 2 : 16;
                                struct count_row *nr = realloc(rows, ncap * sizeof(*rows));
                                if (!nr) {
                                        r = cove_err_set(err, ENOMEM, "catalog: count jobs");
                                        break;
                                }
                                rows = nr;
                                cap = ncap;
                        }
                        if (col_copy(st, 0, rows[n].name, sizeof(rows[n].name)) < 0) {
                                r = cove_err_set(err, 0, "catalog: count jobs: node name too long");
                                break;
                        }
                        rows[n++].count = sqlite3_column_int64(st, 1);
                }
                if (r == 0 && rc != SQLITE_DONE)
                        r = db_err(c->db, rc, err, "count jobs");
        }
        sqlite3_finalize(st);
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (cb(rows[i].name, rows[i].count, arg) < 0)
                        break;
        free(rows);
        return r;
}

static int sqlite_wait_wakeup(struct cove_catalog *c, const char *node, int timeout_ms,
                              struct cove_err *err)
{
        (void)node; /* one counter per handle: a wake-up may be for another node */
        (void)err;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        int64_t ns = until.tv_nsec + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
        until.tv_sec += ns / 1000000000;
        until.tv_nsec = ns % 1000000000;
        pthread_mutex_lock(&c->lock);
        int r = 0;
        while (c->wake_seen == c->wake_seq) {
                if (timeout_ms <= 0 || pthread_cond_timedwait(&c->wake, &c->lock, &until) != 0) {
                        r = c->wake_seen == c->wake_seq;
                        break;
                }
        }
        c->wake_seen = c->wake_seq;
        pthread_mutex_unlock(&c->lock);
        return r;
}

const struct cove_catalog_ops cove_catalog_sqlite = {
    .name = "sqlite",
    .open = sqlite_open,
    .close = sqlite_close,
    .schema_version = sqlite_schema_version,
    .tenant_put = sqlite_tenant_put,
    .tenant_get = sqlite_tenant_get,
    .tenant_list = sqlite_tenant_list,
    .apikey_list = sqlite_apikey_list,
    .apikey_put = sqlite_apikey_put,
    .apikey_get = sqlite_apikey_get,
    .apikey_count = sqlite_apikey_count,
    .sandbox_insert = sqlite_sandbox_insert,
    .sandbox_update = sqlite_sandbox_update,
    .sandbox_get = sqlite_sandbox_get,
    .sandbox_list = sqlite_sandbox_list,
    .sandbox_delete = sqlite_sandbox_delete,
    .snapshot_insert = sqlite_snapshot_insert,
    .snapshot_get = sqlite_snapshot_get,
    .snapshot_list = sqlite_snapshot_list,
    .snapshot_delete = sqlite_snapshot_delete,
    .audit_append = sqlite_audit_append,
    .keyrec_get = sqlite_keyrec_get,
    .keyrec_put = sqlite_keyrec_put,
    .audit_last = sqlite_audit_last,
    .audit_list = sqlite_audit_list,
    .egress_put = sqlite_egress_put,
    .egress_get = sqlite_egress_get,
    .egress_delete = sqlite_egress_delete,
    .doc_put = sqlite_doc_put,
    .doc_get = sqlite_doc_get,
    .doc_list = sqlite_doc_list,
    .doc_delete = sqlite_doc_delete,
    .node_lease_acquire = sqlite_node_lease_acquire,
    .node_lease_renew = sqlite_node_lease_renew,
    .node_set_state = sqlite_node_set_state,
    .node_list = sqlite_node_list,
    .placement_write = sqlite_placement_write,
    .placement_get = sqlite_placement_get,
    .placement_observe = sqlite_placement_observe,
    .sandbox_update_fenced = sqlite_sandbox_update_fenced,
    .job_claim = sqlite_job_claim,
    .job_finish = sqlite_job_finish,
    .job_get = sqlite_job_get,
    .wait_wakeup = sqlite_wait_wakeup,
    .job_counts = sqlite_job_counts,
};
