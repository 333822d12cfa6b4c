/* Catalog: the control plane's durable state (tenants, API keys, sandboxes, …) behind
 * one interface. SQLite is the embedded default (store/catalog_sqlite.c); PostgreSQL
 * (store/catalog_pg.c) implements the same ops with the same schema migrations
 * (store/catalog_schema.c), for a cluster of control replicas and nodes.
 * All calls are thread-safe (the backend serialises, or uses one connection per call);
 * strings in rows are owned by the row and freed with cove_sandbox_row_clear().
 * Errors: COVE_E_UNAVAILABLE when the database cannot be reached or answered in time (the
 * call did not happen, or its outcome is unknown for a write; the next call reconnects). */
#ifndef COVE_STORE_CATALOG_H
#define COVE_STORE_CATALOG_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

struct cove_catalog; /* backend handle */

struct cove_tenant_row {
        char id[64]; /* "ten_…" or "default" */
        char name[128];
        int64_t created_at; /* unix ms */
        /* quotas (schema 4), 0 = unlimited: live sandboxes, and the cpus / memory_mb of the
         * running ones and disk_mb of the live ones summed */
        int64_t max_sandboxes, max_cpus, max_memory_mb, max_storage_mb;
        int64_t deleted_at; /* unix ms; 0 = live. Deletion is one-way (a put never undoes it) */
};
typedef int (*cove_tenant_cb)(const struct cove_tenant_row *row, void *arg); /* <0 stops */

struct cove_apikey_row {
        char id[64]; /* public key id, "key_…", part of the key string */
        char tenant[64];
        char salt_hex[65]; /* 32 random bytes, hex */
        char hash_hex[65]; /* sha256(salt || secret), hex */
        int admin;         /* 1: may call admin endpoints */
        int revoked;
        int64_t created_at;
};
typedef int (*cove_apikey_cb)(const struct cove_apikey_row *row, void *arg); /* <0 stops */

struct cove_sandbox_row {
        char id[64]; /* "sbx_…" */
        char tenant[64];
        char state[16]; /* starting running pausing paused resuming stopped error */
        char template_name[64];
        char runtime[16];   /* "ns", "vm" */
        int64_t created_at; /* unix ms */
        int64_t expires_at; /* unix ms; 0 = never */
        int cpus;
        int memory_mb;
        int disk_mb;
        int timeout_s;
        char on_timeout[8]; /* "kill" or "pause" */
        uint32_t uid_base;  /* host uid range start (0 = none allocated) */
        char node[64];
        char last_snapshot_id[64];
        char *metadata_json;     /* JSON object text, owned; never NULL after a get */
        char *env_json;          /* JSON object text, owned; default env of execs */
        char *error;             /* last error message, owned, may be NULL */
        int snapshot_interval_s; /* rolling snapshots every N s while running; 0 = off */
        char *retention_json;    /* retention policy (JSON array), owned, NULL = default */
        int storage_encrypted;   /* schema 4: the writable layer is encrypted at rest */
        /* schema 9: {"snapshot_id","at","lost_s"} after a recovery from a lost node, JSON
         * object text, owned, NULL = never recovered */
        char *recovered_from_json;
};

void cove_sandbox_row_clear(struct cove_sandbox_row *row); /* frees the owned strings */
/* 1 if state[0..len) is one of the sandbox states listed above, else 0. */
int cove_sandbox_state_valid(const char *state, size_t len);
/* The arguments of placement_observe: 0, or -1 with COVE_E_BAD_REQUEST (an unknown observed
 * state, a desired state other than NULL, "paused" and "stopped"). */
int cove_observe_valid(const char *sandbox_id, const char *observed, const char *desired,
                       struct cove_err *err);

typedef int (*cove_sandbox_cb)(const struct cove_sandbox_row *row, void *arg); /* <0 stops */

/* A complete snapshot (the row is written only once its manifest is durable). Snapshots
 * outlive their sandbox (sandbox_id is not a foreign key). */
struct cove_snapshot_row {
        char id[64]; /* "snap_…" */
        char tenant[64];
        char sandbox_id[64];
        char parent_id[64]; /* "" for none; may name a snapshot since deleted */
        char kind[16];      /* "files" or "full" */
        int64_t created_at; /* unix ms */
        char label[128];
        uint64_t size_bytes; /* logical bytes captured */
        uint64_t new_bytes;  /* bytes of chunks this snapshot added to the store */
        int64_t pause_us;    /* how long the sandbox was held for the capture */
        int rolling;         /* 1: taken by the schedule (thinned by retention) */
};
typedef int (*cove_snapshot_cb)(const struct cove_snapshot_row *row, void *arg); /* <0 stops */

/* An audit event (schema 3): append-only and hash-chained (control/audit.h computes the
 * hashes; the catalog stores them and refuses updates and deletes). */
struct cove_audit_row {
        int64_t seq; /* 1, 2, … without gaps */
        int64_t at;  /* unix ms */
        char tenant[64];
        char sandbox[64];   /* "" when none */
        char kind[32];      /* "egress", "dns", … */
        char action[32];    /* "connect", "close", "query", … */
        char verdict[16];   /* "allow", "deny", "" */
        char *detail_json;  /* canonical JSON object text, owned by the row's creator */
        char prev_hash[65]; /* hex SHA-256 of the previous event ("0"×64 for the first) */
        char hash[65];      /* hex SHA-256(prev_hash || canonical event) */
};
typedef int (*cove_audit_cb)(const struct cove_audit_row *row, void *arg); /* <0 stops */
/* ---- the cluster (schema 6): nodes with leases, placements, jobs ----
 * The control plane places a sandbox on a node and enqueues a job in one transaction;
 * the owning node claims the job, converges and reports. A node's every write names
 * (node, epoch, generation) and is refused with COVE_E_CONFLICT when any is stale, so a
 * node that lost its lease (or a sandbox that moved) can change nothing. Lease times are
 * the database's clock (PostgreSQL's, or the process's for SQLite), never the caller's. */
struct cove_node_row {
        char name[64];
        char state[16];                   /* "ready", "cordoned", "draining", "lost" */
        int64_t epoch;                    /* bumped by every lease acquire; 0 = never held */
        int64_t lease_expires_at;         /* unix ms (database clock) */
        int64_t cpus, memory_mb, disk_mb; /* capacity the node announced */
        /* summed cpus / memory_mb / disk_mb of the sandboxes placed on it whose desired
         * state is not "stopped" (computed by node_list, ignored by node_lease_acquire) */
        int64_t alloc_cpus, alloc_memory_mb, alloc_disk_mb;
        char address[256]; /* its node API, "https://host:port" */
        int64_t last_seen; /* unix ms of the last acquire or renew */
        /* schema 8: what the node announced at acquire, a JSON object ("" = "{}"):
         * {"runtimes":[…], "full":"ok"|why not, "criu", "kernel", "cpu", "templates":[…]} */
        char features[1024];
};
typedef int (*cove_node_cb)(const struct cove_node_row *row, void *arg);  /* <0 stops */
typedef int (*cove_count_cb)(const char *name, int64_t count, void *arg); /* <0 stops */

/* Where a sandbox runs and what it should be. generation is bumped on every placement
 * (a new node, or the same node again); a desired-state change alone keeps it. */
struct cove_placement_row {
        char sandbox_id[64];
        char node[64];
        int64_t generation;
        char desired_state[16];  /* a sandbox state ("running", "paused", "stopped") */
        char observed_state[16]; /* last report of the owning node, "" before any */
        int64_t updated_at;      /* unix ms of the last write */
};

struct cove_job_row {
        int64_t id; /* increasing: claims take the oldest first */
        char sandbox_id[64];
        char kind[16];      /* "start", "pause", "resume", "stop", … (the caller's vocabulary) */
        int64_t generation; /* the placement's generation the job was written for */
        char state[16];     /* "queued", "claimed", "done", "failed" */
        char claimed_by[64];
        int64_t claimed_epoch;
        char *result_json; /* owned by the row (free()), NULL before finish */
        int64_t created_at, updated_at;
        char *args_json; /* schema 8: the job's arguments (JSON), owned (free()), NULL: none */
};

/* An egress document (schema 4): kind "secret" or "lease"; <0 stops. */
typedef int (*cove_doc_cb)(const char *tenant, const char *key, const char *owner, const char *json,
                           void *arg);

struct cove_catalog_ops {
        const char *name;
        /* dsn: a file path for sqlite (created 0600 if absent). Runs schema migrations;
         * refuses (NULL, err) a database whose schema is newer than this build. */
        struct cove_catalog *(*open)(const char *dsn, struct cove_err *err);
        void (*close)(struct cove_catalog *c);
        int (*schema_version)(struct cove_catalog *c, int *version, struct cove_err *err);

        /* Insert, or update name, quotas and deleted_at of an existing tenant (created_at
         * kept). */
        int (*tenant_put)(struct cove_catalog *c, const struct cove_tenant_row *t,
                          struct cove_err *err);
        /* Returns 0 found, 1 not found, -1 error. */
        int (*tenant_get)(struct cove_catalog *c, const char *id, struct cove_tenant_row *out,
                          struct cove_err *err);

        /* Live (not deleted) tenants, oldest first; cb runs after the lock is released. */
        int (*tenant_list)(struct cove_catalog *c, cove_tenant_cb cb, void *arg,
                           struct cove_err *err);
        /* A tenant's keys, oldest first, revoked too; salt_hex/hash_hex are left empty. */
        int (*apikey_list)(struct cove_catalog *c, const char *tenant, cove_apikey_cb cb, void *arg,
                           struct cove_err *err);

        /* Insert a key, or update admin/revoked of an existing one. Tenant, salt and hash
         * never change (COVE_E_CONFLICT), and revoked never goes back to 0. The tenant must
         * exist (COVE_E_NOT_FOUND). Committed with a full fsync. */
        int (*apikey_put)(struct cove_catalog *c, const struct cove_apikey_row *k,
                          struct cove_err *err);
        int (*apikey_get)(struct cove_catalog *c, const char *id, struct cove_apikey_row *out,
                          struct cove_err *err); /* 0 found, 1 not found, -1 error */
        int (*apikey_count)(struct cove_catalog *c, int64_t *n,
                            struct cove_err *err); /* all keys, revoked too */

        /* Insert a new sandbox. Errors: id exists or uid_base (non-zero) is taken by another
         * row → COVE_E_CONFLICT; tenant does not exist → COVE_E_NOT_FOUND; unknown state,
         * on_timeout not kill/pause, metadata/env not a JSON object → COVE_E_BAD_REQUEST.
         * NULL metadata_json/env_json are stored as "{}". */
        int (*sandbox_insert)(struct cove_catalog *c, const struct cove_sandbox_row *s,
                              struct cove_err *err);
        /* Overwrite every column of an existing row (by id). A row's tenant never changes:
         * the row must match s->id and s->tenant, else 1 (absent). Same checks as insert. */
        int (*sandbox_update)(struct cove_catalog *c, const struct cove_sandbox_row *s,
                              struct cove_err *err);
        /* tenant NULL = any tenant (node-internal use). 0 found, 1 not found, -1 error. */
        int (*sandbox_get)(struct cove_catalog *c, const char *tenant, const char *id,
                           struct cove_sandbox_row *out, struct cove_err *err);
        /* Rows of a tenant (NULL = all), oldest first; states: NULL or a comma list
         * ("running,paused"; blanks around names ignored; unknown names match nothing; a
         * list with no names = no filter). cb runs after the catalog lock is released, so it
         * may call the catalog; rows are valid only during the call. */
        int (*sandbox_list)(struct cove_catalog *c, const char *tenant, const char *states,
                            cove_sandbox_cb cb, void *arg, struct cove_err *err);
        /* 0 deleted, 1 not found, -1 error. */
        int (*sandbox_delete)(struct cove_catalog *c, const char *id, struct cove_err *err);

        /* Snapshots (schema 2). insert is committed with a full fsync; id exists →
         * COVE_E_CONFLICT, tenant missing → COVE_E_NOT_FOUND. */
        int (*snapshot_insert)(struct cove_catalog *c, const struct cove_snapshot_row *s,
                               struct cove_err *err);
        /* tenant NULL = any. 0 found, 1 not found, -1 error. */
        int (*snapshot_get)(struct cove_catalog *c, const char *tenant, const char *id,
                            struct cove_snapshot_row *out, struct cove_err *err);
        /* Newest first (created_at, then insertion order). tenant / sandbox_id NULL = any.
         * cb runs after the catalog lock is released. */
        int (*snapshot_list)(struct cove_catalog *c, const char *tenant, const char *sandbox_id,
                             cove_snapshot_cb cb, void *arg, struct cove_err *err);
        /* 0 deleted, 1 not found, -1 error. */
        int (*snapshot_delete)(struct cove_catalog *c, const char *id, struct cove_err *err);

        /* Audit events (schema 3). append writes rows in one transaction (seq must follow
         * the last one: COVE_E_CONFLICT otherwise). last: 0 and the newest seq and hash, 1
         * when there is none. list: oldest first, seq > after_seq and at >= since_ms; NULL
         * filters match anything; at most limit rows (0 = no limit); cb runs after the
         * catalog lock is released, rows are valid only during the call. */
        int (*audit_append)(struct cove_catalog *c, const struct cove_audit_row *rows, size_t n,
                            struct cove_err *err);
        int (*audit_last)(struct cove_catalog *c, int64_t *seq, char hash[65],
                          struct cove_err *err);
        int (*audit_list)(struct cove_catalog *c, const char *tenant, const char *sandbox,
                          const char *kind, int64_t after_seq, int64_t since_ms, int limit,
                          cove_audit_cb cb, void *arg, struct cove_err *err);

        /* Egress policy of a sandbox (schema 3), JSON text; put inserts or replaces.
         * get: 0 found (*json malloc'd, caller frees), 1 none. delete: 0 or 1 (none). */
        int (*egress_put)(struct cove_catalog *c, const char *sandbox_id, const char *tenant,
                          const char *json, struct cove_err *err);
        int (*egress_get)(struct cove_catalog *c, const char *sandbox_id, char **json,
                          struct cove_err *err);
        int (*egress_delete)(struct cove_catalog *c, const char *sandbox_id, struct cove_err *err);

        /* Egress documents (schema 4): secrets (key = name, value encrypted by the caller)
         * and leases (key = lease id, owner = sandbox id), scoped by tenant. put inserts or
         * replaces (committed with a full fsync); get: 0 found (*json malloc'd), 1 none;
         * list: by key, tenant / owner NULL = any, cb after the lock is released; delete:
         * 0 or 1 (none). */
        int (*doc_put)(struct cove_catalog *c, const char *kind, const char *tenant,
                       const char *key, const char *owner, const char *json, struct cove_err *err);
        int (*doc_get)(struct cove_catalog *c, const char *kind, const char *tenant,
                       const char *key, char **json, struct cove_err *err);
        int (*doc_list)(struct cove_catalog *c, const char *kind, const char *tenant,
                        const char *owner, cove_doc_cb cb, void *arg, struct cove_err *err);
        int (*doc_delete)(struct cove_catalog *c, const char *kind, const char *tenant,
                          const char *key, struct cove_err *err);

        /* ---- tenants' key records (schema 8), crypto/keys.h "record store" ----
         * get: 0 with *json (malloc'd, the caller wipes and frees) and *gen, 1 none.
         * put: expect_gen 0 inserts (COVE_E_CONFLICT if the tenant has a record), else
         * replaces the record whose gen is expect_gen (COVE_E_CONFLICT if it moved on or
         * is absent); the new gen (old + 1, 1 for an insert) in *gen. Committed with a
         * full fsync. */
        int (*keyrec_get)(struct cove_catalog *c, const char *tenant, char **json, int64_t *gen,
                          struct cove_err *err);
        int (*keyrec_put)(struct cove_catalog *c, const char *tenant, const char *json,
                          int64_t expect_gen, int64_t *gen, struct cove_err *err);

        /* ---- cluster (schema 6); see struct cove_node_row ---- */

        /* A node process takes the lease of its name (n: name, capacity, address, features; the
         * state of a new row is "ready", a "lost" one becomes "ready", cordoned/draining
         * stay). The new epoch is the old one + 1 and the lease runs ttl_ms from now.
         * Refused with COVE_E_CONFLICT while the current lease has not expired (another
         * live holder, or this node's previous process: wait for the TTL). Committed with
         * a full fsync. Fills *epoch and *expires_at. */
        int (*node_lease_acquire)(struct cove_catalog *c, const struct cove_node_row *n,
                                  int64_t ttl_ms, int64_t *epoch, int64_t *expires_at,
                                  struct cove_err *err);
        /* The holder extends its lease to now + ttl_ms. Only with the current epoch and
         * before expiry: otherwise COVE_E_CONFLICT, and the node must fence itself (stop
         * what it runs) and acquire again. Fills *expires_at. */
        int (*node_lease_renew)(struct cove_catalog *c, const char *name, int64_t epoch,
                                int64_t ttl_ms, int64_t *expires_at, struct cove_err *err);
        /* Control plane: set a node's state (ready|cordoned|draining|lost). 0, 1 unknown
         * node, -1 (bad state: COVE_E_BAD_REQUEST). */
        int (*node_set_state)(struct cove_catalog *c, const char *name, const char *state,
                              struct cove_err *err);
        /* Every node by name, with alloc_* summed; cb runs after the lock is released. */
        int (*node_list)(struct cove_catalog *c, cove_node_cb cb, void *arg, struct cove_err *err);

        /* Control plane, ONE transaction: set sandbox_id's desired state, optionally place it
         * (node non-NULL: a new placement, generation + 1; NULL: keep node and generation,
         * the sandbox must be placed already, else COVE_E_NOT_FOUND), and enqueue a job of
         * job_kind (NULL: none) for the resulting generation, with job_args_json (a JSON
         * value or NULL; schema 8) as its arguments. Queued jobs of older
         * generations are failed ("superseded") in the same transaction. expect_generation
         * >= 0 makes it a compare-and-set: the current generation (0 = never placed) must
         * equal it, else COVE_E_CONFLICT (two replicas racing to place the same sandbox:
         * one wins). A node that is not "ready" cannot take a new placement
         * (COVE_E_CONFLICT); an unknown one is COVE_E_NOT_FOUND. Wakes the node's waiters
         * (wait_wakeup) once committed. Fills *generation and *job_id (0 when no job), both
         * optional. The sandbox row itself is not touched and need not exist. */
        int (*placement_write)(struct cove_catalog *c, const char *sandbox_id, const char *node,
                               const char *desired_state, const char *job_kind,
                               const char *job_args_json, int64_t expect_generation,
                               int64_t *generation, int64_t *job_id, struct cove_err *err);
        /* 0 found, 1 never placed, -1 error. */
        int (*placement_get)(struct cove_catalog *c, const char *sandbox_id,
                             struct cove_placement_row *out, struct cove_err *err);
        /* A node records what it observed of a sandbox it owns. Refused (COVE_E_CONFLICT)
         * unless the sandbox is placed on node at generation and node holds a live lease
         * with epoch. Idempotent. desired_state non-NULL ("paused" or "stopped" only, else
         * COVE_E_BAD_REQUEST): the node settled the sandbox on its own (its timeout), so its
         * desired state becomes that too, in the same statement (a lost node's sandbox is
         * then recovered as its timeout left it, not running). */
        int (*placement_observe)(struct cove_catalog *c, const char *sandbox_id, const char *node,
                                 int64_t epoch, int64_t generation, const char *observed_state,
                                 const char *desired_state, struct cove_err *err);
        /* sandbox_update under a node's fence: the row is overwritten only if, in the same
         * statement, the sandbox is placed on node at generation and node holds a live
         * lease with epoch (a lease lapsing or a new placement between the node's checks
         * and its write is caught here). 0 written, 1 absent (no row with s->id and
         * s->tenant), -1 with COVE_E_CONFLICT when the fence does not hold (nothing
         * written), or as sandbox_update. */
        int (*sandbox_update_fenced)(struct cove_catalog *c, const struct cove_sandbox_row *s,
                                     const char *node, int64_t epoch, int64_t generation,
                                     struct cove_err *err);

        /* A node claims its oldest job: one whose sandbox is placed on node at the job's
         * generation, queued (or claimed by an older epoch of this same node: a restart
         * takes its jobs back). Needs a live lease with epoch (COVE_E_CONFLICT otherwise).
         * Concurrent claimers never get the same job (PostgreSQL: FOR UPDATE SKIP LOCKED).
         * 0 claimed (*out filled; free out->result_json), 1 nothing to do, -1 error. */
        int (*job_claim)(struct cove_catalog *c, const char *node, int64_t epoch,
                         struct cove_job_row *out, struct cove_err *err);
        /* The claimer finishes job_id: ok 1 → "done", 0 → "failed", with result_json (a
         * JSON value or NULL). Refused (COVE_E_CONFLICT) unless the job is claimed by
         * (node, epoch), its generation is the sandbox's current one and the lease is
         * live; a repeat of the same finish is accepted (idempotent). COVE_E_NOT_FOUND
         * for an unknown job. Committed with a full fsync; wakes wait_wakeup(NULL). */
        int (*job_finish)(struct cove_catalog *c, int64_t job_id, const char *node, int64_t epoch,
                          int64_t generation, int ok, const char *result_json,
                          struct cove_err *err);
        /* 0 found (free out->result_json), 1 none, -1 error. */
        int (*job_get)(struct cove_catalog *c, int64_t job_id, struct cove_job_row *out,
                       struct cove_err *err);
        /* Block until a placement_write for node (NULL: any) may have enqueued work, or
         * timeout_ms passes. 0 woken, 1 timed out, -1 error. A hint only: the caller
         * claims after either answer, and its own poll interval bounds what a lost
         * wake-up costs. PostgreSQL: LISTEN/NOTIFY on a dedicated connection (writes by
         * any process wake it; it listens from its first call on, so call it once with 0
         * before the first claim); SQLite: writes through this handle only. node NULL also
         * wakes on every finished job (schema 8: job_finish notifies cove_job_done), so a
         * control replica waiting for a job's outcome wakes when any node reports. */
        int (*wait_wakeup)(struct cove_catalog *c, const char *node, int timeout_ms,
                           struct cove_err *err);
        /* The open jobs (queued or claimed) of the kinds in the comma list kinds ("start,
         * resume,recover"; at most 255 bytes) at their sandbox's current generation, counted
         * per node the sandbox is placed on: cb(node, count) for each node with any, by
         * name, after the lock is released. Placement's cap on starts in flight. */
        int (*job_counts)(struct cove_catalog *c, const char *kinds, cove_count_cb cb, void *arg,
                          struct cove_err *err);
};

extern const struct cove_catalog_ops cove_catalog_sqlite;
extern const struct cove_catalog_ops cove_catalog_pg;

/* The backend for a --db value: "postgres://…" / "postgresql://…" → PostgreSQL, anything
 * else (a path) → SQLite. */
const struct cove_catalog_ops *cove_catalog_for(const char *dsn);
/* The dsn with any password replaced by "***", for messages and logs. */
void cove_catalog_dsn_redact(const char *dsn, char *out, size_t cap);
/* 1 if s is one of ready cordoned draining lost. */
int cove_node_state_valid(const char *s);
/* Frees result_json and args_json. */
void cove_job_row_clear(struct cove_job_row *row);

#endif
