/* SQLite catalog backend (the embedded default): one connection in WAL mode guarded by a
 * mutex, versioned schema migrations applied at open, and every statement prepared once.
 * No SQL is ever built from caller data: all values are bound parameters. */
#include "store/catalog.h"
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

/* Schema migrations, in order: step i brings the schema from version i to i+1. Each step
 * runs in its own transaction together with its schema_migrations row, so a crash leaves
 * the database at one version or the next. Never edit a released step; append a new one. */
static const char *const migrations[] = {
    /* 1: tenants, API keys (hashed), sandboxes */
    "CREATE TABLE tenants ("
    "  id TEXT PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL"
    ");"
    "CREATE TABLE api_keys ("
    "  id TEXT PRIMARY KEY,"
    "  tenant TEXT NOT NULL REFERENCES tenants(id),"
    "  salt_hex TEXT NOT NULL CHECK (length(salt_hex) = 64),"
    "  hash_hex TEXT NOT NULL CHECK (length(hash_hex) = 64),"
    "  admin INTEGER NOT NULL DEFAULT 0,"
    "  revoked INTEGER NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL"
    ");"
    "CREATE INDEX api_keys_tenant ON api_keys(tenant);"
    "CREATE TABLE sandboxes ("
    "  id TEXT PRIMARY KEY,"
    "  tenant TEXT NOT NULL REFERENCES tenants(id),"
    "  state TEXT NOT NULL,"
    "  template_name TEXT NOT NULL,"
    "  runtime TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  expires_at INTEGER NOT NULL DEFAULT 0,"
    "  cpus INTEGER NOT NULL,"
    "  memory_mb INTEGER NOT NULL,"
    "  disk_mb INTEGER NOT NULL,"
    "  timeout_s INTEGER NOT NULL,"
    "  on_timeout TEXT NOT NULL,"
    "  uid_base INTEGER NOT NULL DEFAULT 0,"
    "  node TEXT NOT NULL DEFAULT '',"
    "  last_snapshot_id TEXT NOT NULL DEFAULT '',"
    "  metadata_json TEXT NOT NULL DEFAULT '{}'"
    "    CHECK (json_valid(metadata_json) AND json_type(metadata_json) = 'object'),"
    "  env_json TEXT NOT NULL DEFAULT '{}'"
    "    CHECK (json_valid(env_json) AND json_type(env_json) = 'object'),"
    "  error TEXT"
    ");"
    "CREATE INDEX sandboxes_tenant_created ON sandboxes(tenant, created_at);"
    /* Tenants never share host uids (DESIGN.md §2.4): two live rows with the same
     * allocated range is a bug the catalog refuses rather than records. */
    "CREATE UNIQUE INDEX sandboxes_uid_base ON sandboxes(uid_base) WHERE uid_base <> 0;",
    /* 2: the time machine: snapshot schedule per sandbox, complete snapshots. A snapshot
     * row outlives its sandbox (no foreign key to sandboxes). */
    "ALTER TABLE sandboxes ADD COLUMN snapshot_interval_s INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE sandboxes ADD COLUMN retention_json TEXT"
    "  CHECK (retention_json IS NULL OR json_valid(retention_json));"
    "CREATE TABLE snapshots ("
    "  id TEXT PRIMARY KEY,"
    "  tenant TEXT NOT NULL REFERENCES tenants(id),"
    "  sandbox_id TEXT NOT NULL,"
    "  parent_id TEXT NOT NULL DEFAULT '',"
    "  kind TEXT NOT NULL CHECK (kind IN ('files', 'full')),"
    "  created_at INTEGER NOT NULL,"
    "  label TEXT NOT NULL DEFAULT '',"
    "  size_bytes INTEGER NOT NULL DEFAULT 0,"
    "  new_bytes INTEGER NOT NULL DEFAULT 0,"
    "  pause_us INTEGER NOT NULL DEFAULT 0,"
    "  rolling INTEGER NOT NULL DEFAULT 0"
    ");"
    "CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at);"
    "CREATE INDEX snapshots_tenant ON snapshots(tenant, created_at);",
    /* 3: the audit log (append-only, hash-chained: control/audit.h) and egress policies */
    "CREATE TABLE audit_events ("
    "  seq INTEGER PRIMARY KEY,"
    "  at INTEGER NOT NULL,"
    "  tenant TEXT NOT NULL,"
    "  sandbox TEXT NOT NULL DEFAULT '',"
    "  kind TEXT NOT NULL,"
    "  action TEXT NOT NULL,"
    "  verdict TEXT NOT NULL DEFAULT '',"
    "  detail_json TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail_json)),"
    "  prev_hash TEXT NOT NULL CHECK (length(prev_hash) = 64),"
    "  hash TEXT NOT NULL CHECK (length(hash) = 64)"
    ");"
    "CREATE INDEX audit_events_tenant ON audit_events(tenant, seq);"
    "CREATE INDEX audit_events_sandbox ON audit_events(sandbox, seq);"
    "CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events"
    "  BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;"
    "CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events"
    "  BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;"
    "CREATE TABLE egress_policies ("
    "  sandbox_id TEXT PRIMARY KEY,"
    "  tenant TEXT NOT NULL REFERENCES tenants(id),"
    "  policy_json TEXT NOT NULL CHECK (json_valid(policy_json)),"
    "  updated_at INTEGER NOT NULL"
    ");",
    /* 4: tenants: quotas (0 = unlimited) and soft deletion (rows stay: snapshots and audit
     * events refer to them) */
    "ALTER TABLE tenants ADD COLUMN max_sandboxes INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tenants ADD COLUMN max_cpus INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tenants ADD COLUMN max_memory_mb INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tenants ADD COLUMN max_storage_mb INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tenants ADD COLUMN deleted_at INTEGER NOT NULL DEFAULT 0;"
    /* and sandboxes whose writable layer is encrypted at rest (fscrypt, control/tenant.h) */
    "ALTER TABLE sandboxes ADD COLUMN storage_encrypted INTEGER NOT NULL DEFAULT 0;",
    /* 5: egress secrets (value encrypted under the tenant's key: control/secrets.h) and
     * credential leases, as JSON documents keyed by (kind, tenant, key) */
    "CREATE TABLE egress_docs ("
    "  kind TEXT NOT NULL CHECK (kind IN ('secret', 'lease')),"
    "  tenant TEXT NOT NULL REFERENCES tenants(id),"
    "  key TEXT NOT NULL,"
    "  owner TEXT NOT NULL DEFAULT '',"
    "  doc_json TEXT NOT NULL CHECK (json_valid(doc_json)),"
    "  updated_at INTEGER NOT NULL,"
    "  PRIMARY KEY (kind, tenant, key)"
    ");"
    "CREATE INDEX egress_docs_owner ON egress_docs(kind, owner);",
    /* 6: documents of exposed ports (control/ports.h) too: the kind check is widened by
     * copying the table (SQLite cannot alter a CHECK) */
    "CREATE TABLE egress_docs_6 ("
    "  kind TEXT NOT NULL CHECK (kind IN ('secret', 'lease', 'port')),"
    "  tenant TEXT NOT NULL REFERENCES tenants(id),"
    "  key TEXT NOT NULL,"
    "  owner TEXT NOT NULL DEFAULT '',"
    "  doc_json TEXT NOT NULL CHECK (json_valid(doc_json)),"
    "  updated_at INTEGER NOT NULL,"
    "  PRIMARY KEY (kind, tenant, key)"
    ");"
    "INSERT INTO egress_docs_6 SELECT kind, tenant, key, owner, doc_json, updated_at"
    "  FROM egress_docs;"
    "DROP TABLE egress_docs;"
    "ALTER TABLE egress_docs_6 RENAME TO egress_docs;"
    "CREATE INDEX egress_docs_owner ON egress_docs(kind, owner);",
};
#define SCHEMA_VERSION ((int)COVE_ARRAY_SIZE(migrations))

#define SBX_COLS                                                                                   \
        "id, tenant, state, template_name, runtime, created_at, expires_at, cpus, memory_mb,"      \
        " disk_mb, timeout_s, on_timeout, uid_base, node, last_snapshot_id, metadata_json,"        \
        " env_json, error, snapshot_interval_s, retention_json, storage_encrypted"
#define SNAP_COLS                                                                                  \
        "id, tenant, sandbox_id, parent_id, kind, created_at, label, size_bytes, new_bytes,"       \
        " pause_us, rolling"

#define TENANT_COLS                                                                                \
        "id, name, created_at, max_sandboxes, max_cpus, max_memory_mb, max_storage_mb, deleted_at"
#define AUDIT_COLS "seq, at, tenant, sandbox, kind, action, verdict, detail_json, prev_hash, hash"

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
    [ST_SBX_INSERT] = "INSERT INTO sandboxes(" SBX_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6,"
                      " ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
    [ST_SBX_UPDATE] = "UPDATE sandboxes SET state = ?3, template_name = ?4, runtime = ?5,"
                      " created_at = ?6, expires_at = ?7, cpus = ?8, memory_mb = ?9,"
                      " disk_mb = ?10, timeout_s = ?11, on_timeout = ?12, uid_base = ?13,"
                      " node = ?14, last_snapshot_id = ?15, metadata_json = ?16,"
                      " env_json = ?17, error = ?18, snapshot_interval_s = ?19,"
                      " retention_json = ?20, storage_encrypted = ?21"
                      " WHERE id = ?1 AND tenant = ?2",
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
};

struct cove_catalog {
        sqlite3 *db;
        pthread_mutex_t lock; /* serialises every use of db and st[] (connection is NOMUTEX) */
        sqlite3_stmt *st[ST__COUNT];
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
                if (exec_sql(db, migrations[v], err, what) < 0)
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

static int sbx_check(const struct cove_sandbox_row *s, struct cove_err *err, const char *op)
{
        if (!field_ok(s->id, sizeof(s->id)) || !s->id[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox: id missing or too long", op);
        if (!field_ok(s->tenant, sizeof(s->tenant)) || !s->tenant[0] ||
            !field_ok(s->state, sizeof(s->state)) ||
            !field_ok(s->template_name, sizeof(s->template_name)) ||
            !field_ok(s->runtime, sizeof(s->runtime)) ||
            !field_ok(s->on_timeout, sizeof(s->on_timeout)) ||
            !field_ok(s->node, sizeof(s->node)) ||
            !field_ok(s->last_snapshot_id, sizeof(s->last_snapshot_id)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox %s: a field is missing or too long", op,
                                     s->id);
        /* States are checked here rather than by a CHECK constraint so that adding a state
         * is a code change, not a table rebuild. */
        if (!cove_sandbox_state_valid(s->state, strlen(s->state)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox %s: unknown state \"%s\"", op, s->id,
                                     s->state);
        if (strcmp(s->on_timeout, "kill") != 0 && strcmp(s->on_timeout, "pause") != 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog: %s sandbox %s: on_timeout must be kill or pause", op,
                                     s->id);
        return 0;
}

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
        if (!out->metadata_json || !out->env_json ||
            (!out->error && sqlite3_column_type(st, 17) != SQLITE_NULL) ||
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
        if (sbx_check(s, err, op) < 0)
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

/* Turn "running, paused,bogus" into ",running,paused," keeping only known states. Returns
 * 0 with *any = 1 when no filter applies (NULL or no tokens), 0 otherwise, -1 too long. An
 * all-unknown list yields "" (matches nothing). */
static int parse_states(const char *states, char *out, size_t cap, int *any)
{
        *any = 1;
        out[0] = '\0';
        if (!states)
                return 0;
        size_t n = 0;
        int tokens = 0;
        const char *p = states;
        while (*p) {
                while (*p == ' ' || *p == '\t')
                        p++;
                const char *start = p;
                while (*p && *p != ',')
                        p++;
                const char *end = p;
                while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
                        end--;
                if (*p == ',')
                        p++;
                size_t len = (size_t)(end - start);
                if (len == 0)
                        continue;
                tokens++;
                if (!cove_sandbox_state_valid(start, len))
                        continue;
                if (n + len + 2 >= cap)
                        return -1;
                if (n == 0)
                        out[n++] = ',';
                memcpy(out + n, start, len);
                n += len;
                out[n++] = ',';
                out[n] = '\0';
        }
        *any = tokens == 0;
        return 0;
}

static int sqlite_sandbox_list(struct cove_catalog *c, const char *tenant, const char *states,
                               cove_sandbox_cb cb, void *arg, struct cove_err *err)
{
        char filter[256];
        int any;
        if (parse_states(states, filter, sizeof(filter), &any) < 0)
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
    .audit_last = sqlite_audit_last,
    .audit_list = sqlite_audit_list,
    .egress_put = sqlite_egress_put,
    .egress_get = sqlite_egress_get,
    .egress_delete = sqlite_egress_delete,
    .doc_put = sqlite_doc_put,
    .doc_get = sqlite_doc_get,
    .doc_list = sqlite_doc_list,
    .doc_delete = sqlite_doc_delete,
};
