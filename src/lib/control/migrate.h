/* From one machine to many (docs/cluster.md "From one machine to many"): copy a stopped
 * single-node data dir into a cluster's PostgreSQL catalog and S3 store.
 *
 * Order, so that a kill at any point leaves nothing half-visible and a re-run completes:
 * key records first (a tenant's data key must be readable by the cluster before anything
 * encrypted under it is), then every object of the local store (chunks before manifests;
 * a put never overwrites, every object is read back and its SHA-256 compared), then the
 * catalog rows (tenants, API keys, sandboxes, egress policies, snapshots, egress
 * documents, audit events with their hashes unchanged). Every step is idempotent: a row
 * or object already there with the same content is left alone, so a second run changes
 * nothing. Sandboxes that were running (a crash left them so) become paused at their last
 * snapshot, or stopped when they have none.
 *
 * Nothing in the data dir is modified: the catalog is read from a private copy, the store
 * and the key files are only read. The data dir's lock (coved.lock, held by a running
 * coved) is taken for the whole run, so a coved cannot start on it meanwhile. */
#ifndef COVE_CONTROL_MIGRATE_H
#define COVE_CONTROL_MIGRATE_H

#include <stdint.h>

#include "util/err.h"

struct coved_migrate_options {
        const char *data_dir;         /* the single node's data dir (required) */
        const char *db;               /* postgres://… (required) */
        const char *store_url;        /* s3://BUCKET[/PREFIX] (required) */
        const char *s3_endpoint;      /* http(s)://HOST[:PORT] (required) */
        int s3_timeout_s;             /* 0: 30 */
        const char *default_kek_file; /* the cluster's; NULL: <data_dir>/keys/node.kek */
        /* progress lines (no secrets); NULL: quiet */
        void (*say)(void *arg, const char *line);
        void *arg;
};

struct coved_migrate_count {
        uint64_t copied, already; /* new in the cluster / there with the same content */
};

struct coved_migrate_stats {
        struct coved_migrate_count keys, objects, tenants, api_keys, sandboxes, policies, snapshots,
            docs, audit;
        uint64_t keys_rewrapped; /* of keys.copied: wrapped again under the default KEK */
        uint64_t bytes_uploaded;
        uint64_t paused, stopped; /* running sandboxes paused / stopped by the migration */
};

int coved_migrate(const struct coved_migrate_options *o, struct coved_migrate_stats *st,
                  struct cove_err *err);

/* Lock <data_dir>/coved.lock (a POSIX record lock, not waiting): coved 1 takes it for
 * writing, creating the file (coved holds it while it runs); coved 0 for reading (a
 * migration: NOT_FOUND when there is no lock file). fd >= 0, or -1 with CONFLICT when the
 * other kind holds it. The lock lasts until fd is closed or the process exits. */
int coved_data_dir_lock(const char *data_dir, int coved, struct cove_err *err);

#endif
