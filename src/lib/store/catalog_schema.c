/* The catalog's schema migrations, one list for both backends (see catalog_schema.h).
 * Never edit a released step; append a new one. Each step runs in its own transaction
 * with its schema_migrations row, so a crash leaves the database at one version or the
 * next. */
#include "store/catalog_schema.h"

#include <stdlib.h>
#include <string.h>

#include "util/cleanup.h"

const struct cove_migration cove_catalog_migrations[] = {
    /* 1: tenants, API keys (hashed), sandboxes */
    {.sql = "CREATE TABLE tenants ("
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
            /* Tenants never share host uids (docs/architecture.md, trust rule 4): two live rows
             * with the same allocated range is a bug the catalog refuses rather than records. */
            "CREATE UNIQUE INDEX sandboxes_uid_base ON sandboxes(uid_base) WHERE uid_base <> 0;",
     /* PostgreSQL has no json_valid/json_type: the same names, so the CHECKs read alike.
      * Both are exception-safe (a malformed text is a CHECK failure, not an error). */
     .pg_before = "CREATE FUNCTION json_valid(t text) RETURNS boolean LANGUAGE plpgsql"
                  " IMMUTABLE AS $$ BEGIN PERFORM t::json; RETURN true;"
                  " EXCEPTION WHEN others THEN RETURN false; END $$;"
                  "CREATE FUNCTION json_type(t text) RETURNS text LANGUAGE plpgsql"
                  " IMMUTABLE AS $$ BEGIN RETURN json_typeof(t::json);"
                  " EXCEPTION WHEN others THEN RETURN NULL; END $$;",
     /* lists are "oldest first, then insertion order": SQLite's rowid, PostgreSQL's rid */
     .pg_after = "ALTER TABLE tenants ADD COLUMN rid BIGSERIAL;"
                 "ALTER TABLE api_keys ADD COLUMN rid BIGSERIAL;"
                 "ALTER TABLE sandboxes ADD COLUMN rid BIGSERIAL;"},
    /* 2: the time machine: snapshot schedule per sandbox, complete snapshots. A snapshot
     * row outlives its sandbox (no foreign key to sandboxes). */
    {.sql = "ALTER TABLE sandboxes ADD COLUMN snapshot_interval_s INTEGER NOT NULL DEFAULT 0;"
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
     .pg_after = "ALTER TABLE snapshots ADD COLUMN rid BIGSERIAL;"},
    /* 3: the audit log (append-only, hash-chained: control/audit.h) and egress policies */
    {.sql = "CREATE TABLE audit_events ("
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
            "CREATE TABLE egress_policies ("
            "  sandbox_id TEXT PRIMARY KEY,"
            "  tenant TEXT NOT NULL REFERENCES tenants(id),"
            "  policy_json TEXT NOT NULL CHECK (json_valid(policy_json)),"
            "  updated_at INTEGER NOT NULL"
            ");",
     .sqlite = "CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events"
               "  BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;"
               "CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events"
               "  BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;",
     .pg_after = "CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql"
                 " AS $$ BEGIN RAISE EXCEPTION 'audit events are append-only'; END $$;"
                 "CREATE TRIGGER audit_events_no_change BEFORE UPDATE OR DELETE ON audit_events"
                 "  FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();"
                 "CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events"
                 "  FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();"},
    /* 4: tenants: quotas (0 = unlimited) and soft deletion (rows stay: snapshots and audit
     * events refer to them) */
    {.sql =
         "ALTER TABLE tenants ADD COLUMN max_sandboxes INTEGER NOT NULL DEFAULT 0;"
         "ALTER TABLE tenants ADD COLUMN max_cpus INTEGER NOT NULL DEFAULT 0;"
         "ALTER TABLE tenants ADD COLUMN max_memory_mb INTEGER NOT NULL DEFAULT 0;"
         "ALTER TABLE tenants ADD COLUMN max_storage_mb INTEGER NOT NULL DEFAULT 0;"
         "ALTER TABLE tenants ADD COLUMN deleted_at INTEGER NOT NULL DEFAULT 0;"
         /* and sandboxes whose writable layer is encrypted at rest (fscrypt, control/tenant.h) */
         "ALTER TABLE sandboxes ADD COLUMN storage_encrypted INTEGER NOT NULL DEFAULT 0;"},
    /* 5: egress secrets (value encrypted under the tenant's key: control/secrets.h) and
     * credential leases, as JSON documents keyed by (kind, tenant, key) */
    {.sql = "CREATE TABLE egress_docs ("
            "  kind TEXT NOT NULL CHECK (kind IN ('secret', 'lease')),"
            "  tenant TEXT NOT NULL REFERENCES tenants(id),"
            "  key TEXT NOT NULL,"
            "  owner TEXT NOT NULL DEFAULT '',"
            "  doc_json TEXT NOT NULL CHECK (json_valid(doc_json)),"
            "  updated_at INTEGER NOT NULL,"
            "  PRIMARY KEY (kind, tenant, key)"
            ");"
            "CREATE INDEX egress_docs_owner ON egress_docs(kind, owner);"},
    /* 6: the cluster: nodes holding leases (epoch bumped on every acquire), where each
     * sandbox is placed (generation bumped on every placement) and what it should be, and
     * the jobs the owning node claims. Fencing checks are in the queries (catalog.h). */
    {.sql = "CREATE TABLE nodes ("
            "  name TEXT PRIMARY KEY,"
            "  state TEXT NOT NULL DEFAULT 'ready'"
            "    CHECK (state IN ('ready', 'cordoned', 'draining', 'lost')),"
            "  epoch INTEGER NOT NULL DEFAULT 0,"
            "  lease_expires_at INTEGER NOT NULL DEFAULT 0,"
            "  cpus INTEGER NOT NULL DEFAULT 0,"
            "  memory_mb INTEGER NOT NULL DEFAULT 0,"
            "  disk_mb INTEGER NOT NULL DEFAULT 0,"
            "  address TEXT NOT NULL DEFAULT '',"
            "  last_seen INTEGER NOT NULL DEFAULT 0"
            ");"
            "CREATE TABLE placements ("
            "  sandbox_id TEXT PRIMARY KEY,"
            "  node TEXT NOT NULL REFERENCES nodes(name),"
            "  generation INTEGER NOT NULL,"
            "  desired_state TEXT NOT NULL,"
            "  observed_state TEXT NOT NULL DEFAULT '',"
            "  updated_at INTEGER NOT NULL"
            ");"
            "CREATE INDEX placements_node ON placements(node);"
            "CREATE TABLE jobs ("
            "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
            "  sandbox_id TEXT NOT NULL,"
            "  kind TEXT NOT NULL,"
            "  generation INTEGER NOT NULL,"
            "  state TEXT NOT NULL DEFAULT 'queued'"
            "    CHECK (state IN ('queued', 'claimed', 'done', 'failed')),"
            "  claimed_by TEXT NOT NULL DEFAULT '',"
            "  claimed_epoch INTEGER NOT NULL DEFAULT 0,"
            "  result_json TEXT CHECK (result_json IS NULL OR json_valid(result_json)),"
            "  created_at INTEGER NOT NULL,"
            "  updated_at INTEGER NOT NULL"
            ");"
            "CREATE INDEX jobs_open ON jobs(sandbox_id, id) WHERE state IN ('queued', 'claimed');"},
    /* 7: documents of exposed ports (control/ports.h) too: the kind check is widened by
     * copying the table (SQLite cannot alter a CHECK; the same steps work in PostgreSQL) */
    {.sql = "CREATE TABLE egress_docs_7 ("
            "  kind TEXT NOT NULL CHECK (kind IN ('secret', 'lease', 'port')),"
            "  tenant TEXT NOT NULL REFERENCES tenants(id),"
            "  key TEXT NOT NULL,"
            "  owner TEXT NOT NULL DEFAULT '',"
            "  doc_json TEXT NOT NULL CHECK (json_valid(doc_json)),"
            "  updated_at INTEGER NOT NULL,"
            "  PRIMARY KEY (kind, tenant, key)"
            ");"
            "INSERT INTO egress_docs_7 SELECT kind, tenant, key, owner, doc_json, updated_at"
            "  FROM egress_docs;"
            "DROP TABLE egress_docs;"
            "ALTER TABLE egress_docs_7 RENAME TO egress_docs;"
            "CREATE INDEX egress_docs_owner ON egress_docs(kind, owner);"},
    /* 8: what a job is asked to do (its arguments, JSON) and what a node announces of
     * itself at lease acquire (runtimes, full-snapshot support, CRIU, kernel, CPU,
     * templates: a JSON object placement filters on) */
    {.sql = "ALTER TABLE jobs ADD COLUMN args_json TEXT"
            "  CHECK (args_json IS NULL OR json_valid(args_json));"
            "ALTER TABLE nodes ADD COLUMN features TEXT NOT NULL DEFAULT '{}';"},
    /* 9 (the cluster plan's step 10): tenants' key records shared by every process of a
     * cluster (crypto/keys.h record store); gen is bumped by every write, which is a
     * compare-and-set on it. No foreign key: a record outlives its tenant's deletion. */
    {.sql = "CREATE TABLE key_records ("
            "  tenant TEXT PRIMARY KEY,"
            "  gen INTEGER NOT NULL CHECK (gen > 0),"
            "  record_json TEXT NOT NULL CHECK (json_valid(record_json)),"
            "  updated_at INTEGER NOT NULL"
            ");"},
    /* 10: where a sandbox recovered from after its node was lost (control/nodes.h), JSON
     * text {"snapshot_id","at","lost_s"}; NULL = never recovered */
    {.sql = "ALTER TABLE sandboxes ADD COLUMN recovered_from TEXT"
            "  CHECK (recovered_from IS NULL OR json_valid(recovered_from));"},
};
const int cove_catalog_schema_version = (int)COVE_ARRAY_SIZE(cove_catalog_migrations);

/* Append n bytes of s to the buffer (b, len, cap); -1 on ENOMEM. */
static int put(char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
        if (*len + n + 1 > *cap) {
                size_t nc = (*cap + n + 1) * 2;
                char *nb = realloc(*b, nc);
                if (!nb)
                        return -1;
                *b = nb;
                *cap = nc;
        }
        memcpy(*b + *len, s, n);
        *len += n;
        (*b)[*len] = '\0';
        return 0;
}

static int word_at(const char *p, const char *start, const char *w)
{
        size_t n = strlen(w);
        if (strncmp(p, w, n) != 0)
                return 0;
        int before =
            p > start && (p[-1] == '_' || (p[-1] >= 'A' && p[-1] <= 'Z') ||
                          (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= '0' && p[-1] <= '9'));
        char a = p[n];
        int after =
            a == '_' || (a >= 'A' && a <= 'Z') || (a >= 'a' && a <= 'z') || (a >= '0' && a <= '9');
        return !before && !after;
}

char *cove_catalog_sql_pg(const char *sql)
{
        static const char *const from[] = {"INTEGER PRIMARY KEY AUTOINCREMENT", "INTEGER"};
        static const char *const to[] = {"BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
                                         "BIGINT"};
        char *b = NULL;
        size_t len = 0, cap = 0;
        int quoted = 0;
        if (put(&b, &len, &cap, "", 0) < 0)
                return NULL;
        for (const char *p = sql; *p;) {
                if (*p == '\'')
                        quoted = !quoted;
                size_t i = 0;
                if (!quoted)
                        for (; i < COVE_ARRAY_SIZE(from); i++)
                                if (word_at(p, sql, from[i]))
                                        break;
                if (!quoted && i < COVE_ARRAY_SIZE(from)) {
                        if (put(&b, &len, &cap, to[i], strlen(to[i])) < 0)
                                goto fail;
                        p += strlen(from[i]);
                        continue;
                }
                if (put(&b, &len, &cap, p, 1) < 0)
                        goto fail;
                p++;
        }
        return b;
fail:
        free(b);
        return NULL;
}
