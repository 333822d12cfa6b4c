/* The coved process context (control plane + node gateway in one process, the embedded
 * default): catalog, node, HTTP front end, timers. Passed to every handler; nothing of it
 * is global. */
#ifndef COVE_CONTROL_COVED_H
#define COVE_CONTROL_COVED_H

#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>

#include "control/egress.h"
#include "control/ports.h"
#include "node/node.h"
#include "store/catalog.h"
#include "util/err.h"
#include "util/log.h"

/* Where snapshots live (store/chunkstore.h): the local directory <data_dir>/store by
 * default, or an S3-compatible bucket (credentials from AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_REGION) with a local chunk cache <data_dir>/chunk-cache. */
struct coved_store_options {
        const char *url;         /* NULL: local directory; "s3://BUCKET[/PREFIX]" */
        const char *s3_endpoint; /* http(s)://HOST[:PORT], required with s3:// */
        int s3_timeout_s;        /* deadline of one S3 request (0: 30 s) */
        int cache_mb;            /* chunk cache budget (0: 1024 MiB) */
};

/* What this process is in a cluster (docs/cluster.md). COVED_ROLE_ALL (the default) is the
 * single process of the embedded default: control plane and node in one, nothing of the
 * cluster runs. */
enum coved_role { COVED_ROLE_ALL = 0, COVED_ROLE_CONTROL, COVED_ROLE_NODE };

struct coved_cluster_options {
        enum coved_role role;
        const char *node_name;        /* node: its name (cluster/nodeauth.h rules) */
        const char *node_token_file;  /* node: its token (`coved node-token`) */
        const char *cluster_key_file; /* control: the cluster key every replica holds */
        const char *control_url;      /* node: a control replica, http://HOST:PORT */
        const char *advertise;        /* node: URL of its node API for controls (default:
                                       * http://<--listen>) */
        int lease_ttl_ms;             /* node lease TTL (0: 10000) */
        int lease_renew_ms;           /* node lease renewal interval (0: 2000) */
        /* Guest self-freeze for the cluster agent and tests (node/node.h
         * cove_node_fence_config): TTL and heartbeat interval in ms; 0: off */
        int guest_fence_ttl_ms;
        int guest_fence_beat_ms;
};

/* Role control: forwarding sandbox traffic to nodes (api/forward.h); 0 = default. */
struct coved_forward_options {
        int connect_timeout_ms; /* reaching a node (5000) */
        int head_timeout_ms;    /* a node's answer head, exec excepted (60000) */
};

/* Placement, node loss and drain (control/placement.h, control/nodes.h); role control. */
struct coved_nodes_options {
        int placement_k;         /* best of K ready nodes (0: 3) */
        int max_starts_per_node; /* starts/resumes/recoveries in flight per node (0: 4) */
        int lost_grace_ms;       /* a node is lost this long after its lease expired (0: 5000) */
        int cpu_overcommit;      /* sandbox cpus placed per cpu a node announced (0: 4) */
};

struct coved_options {
        const char *data_dir;      /* required */
        const char *listen;        /* "127.0.0.1:7677"; NULL for none */
        const char *templates_dir; /* default <data_dir>/templates */
        const char *guest_binary;  /* default: cove-guest next to the coved binary */
        const char *templates;     /* comma list built at start if missing (default "busybox") */
        int log_level;
        int default_timeout_s;              /* 300 */
        const char *e2b_api_listen;         /* E2B control plane "HOST:PORT"; NULL for none */
        const char *e2b_sandbox_listen;     /* E2B in-sandbox (envd) surface; NULL for none */
        struct coved_egress_options egress; /* gateway: pool, resolvers (control/egress.h) */
        int pool_size;       /* warm instances per template (-1: default 4, 0: none) */
        int pool_max;        /* a burst grows each ns pool up to this (< pool_size: no growth) */
        int pool_idle_s;     /* a grown pool shrinks back after this long unused (0: 60) */
        int key_cache_ttl_s; /* unwrapped data keys are re-unwrapped after this (-1: 60) */
        int encrypt_layers;  /* 1: sandboxes default to storage_encrypted */
        int vm_pool_size;    /* warm vm instances per template (0: none) */
        const char *runtime; /* default runtime "ns"/"vm"; NULL: vm where KVM works, else ns */
        struct coved_store_options store; /* snapshot store */
        const char *db; /* catalog: "postgres://…" or a SQLite path; NULL: <data>/catalog.db */
        struct coved_ports_options ports;     /* exposed ports listener (control/ports.h) */
        struct coved_cluster_options cluster; /* role and cluster identity */
        struct coved_forward_options forward; /* role control */
        /* The default KEK of tenants without their own key when key records are shared
         * (catalog on PostgreSQL): the same 32-byte file on every control and node (needed
         * in roles control and node; NULL in role all: <data>/keys/node.kek). */
        const char *default_kek_file;
        struct coved_nodes_options nodes; /* placement, node loss, drain */
        /* Hot pauses (control/snapshot.h): a sandbox paused with a full snapshot stays frozen
         * in memory this many seconds, so a resume within it is a thaw (0: 120; -1: off,
         * every pause stops the instance); at most pause_hot_mb MiB of them (0: 2048). */
        int pause_hot_s;
        int pause_hot_mb;
};

/* The shape of a sandbox created without cpus/memory_mb/disk_mb; the warm pools hold it. */
#define COVE_DEFAULT_CPUS 1
#define COVE_DEFAULT_MEMORY_MB 512
#define COVE_DEFAULT_DISK_MB 1024
#define COVE_DEFAULT_SNAPSHOT_INTERVAL_S 60 /* rolling snapshots while running; 0 = off */

struct cove_e2b;
struct cove_fwd;
struct cove_http;
struct cove_gateway;
struct cove_audit;
struct cove_tm;
struct coved_ports;
struct cove_node_tm;
struct cove_catsrv;

struct coved_metrics {
        uint64_t creates, create_failures, deletes, execs, timeouts_fired;
        uint64_t create_ns_sum; /* total create latency, for the average */
};

/* A catalog as the key records' store (control/tenant.h coved_keys_catalog_ops). */
struct coved_keys_cat {
        const struct cove_catalog_ops *ops;
        struct cove_catalog *cat;
};

struct coved {
        struct cove_log log;
        char data_dir[PATH_MAX];
        char templates_dir[PATH_MAX];
        char guest_binary[PATH_MAX];
        int default_timeout_s;
        const struct cove_catalog_ops *cat_ops;
        struct cove_catalog *cat;
        struct cove_node *node;
        struct cove_http *http;
        struct cove_e2b *e2b;      /* E2B-compatible listeners (api/e2b.h), NULL when off */
        struct cove_gateway *gw;   /* egress gateway (node/egress.h), NULL when unavailable */
        struct cove_audit *audit;  /* audit log (control/audit.h) */
        struct cove_tm *tm;        /* snapshots: rolling/retention thread (control/snapshot.h) */
        struct cove_node_tm *ntm;  /* the node's captures, restores, chunk store (node/tm.h) */
        struct coved_ports *ports; /* exposed ports (control/ports.h), NULL when off */
        int quitting;
        pthread_mutex_t mu; /* metrics, timer wake-up */
        pthread_cond_t cv;
        pthread_t timer;
        int timer_started;
        struct coved_metrics m;
        int64_t started_at;
        /* nodes' catalog endpoint (cluster/catsrv.h): created on first use */
        struct cove_catsrv *catsrv;
        pthread_mutex_t quota_mu; /* quota admission (control/tenant.h) */
        int64_t key_sweep_at;     /* mono ms of the last revoked-key sweep */
        int encrypt_layers;       /* default of storage_encrypted on create */
        int pool_size;            /* warm ns instances per template (owner pools: at most 2) */
        struct coved_store_options store; /* snapshot store (strings owned by the caller) */
        struct coved_tbuilds *tb;         /* tenant template builds (control/tbuild.h) */
        /* cluster (docs/cluster.md): role, this node's name ("local" in role all) and
         * credentials; lease timing. Secrets are wiped by coved_close. */
        enum coved_role role;
        char node_name[64];
        char node_token[65];     /* node role: its token (hex) */
        uint8_t cluster_key[32]; /* control role: the cluster key */
        int has_cluster_key;
        char control_url[256];    /* node role */
        char advertise[256];      /* node role: its node API URL */
        char ports_advertise[96]; /* node role: its port listener, HOST:PORT ("" none) */
        int lease_ttl_ms, lease_renew_ms;
        struct coved_cluster *cl;       /* the cluster side (control/cluster.h); NULL in role all */
        struct cove_fwd *fwd;           /* control: forwarding options; node: the node API's replay
                                         * cache (api/forward.h, owned by daemon/); NULL in role all */
        struct coved_keys_cat keys_cat; /* key records in the catalog (coved_keys_open) */
        int keys_attached;
        int dir_lock; /* <data>/coved.lock, locked (control/migrate.h); > 0 while open */
        struct coved_nodes_options nodes_opt; /* defaults filled by coved_open */
        struct coved_nodes *nodes; /* node-loss sweeper and drains (control/nodes.h); NULL
                                    * unless role control */
        int pause_hot_s;           /* hot pauses: seconds a paused sandbox stays frozen (0: off) */
        int pause_hot_mb;          /* hot pauses: memory they may hold, MiB */
};

/* Open the catalog, ensure the default tenant and admin key (data_dir/admin.key, 0600),
 * build missing templates, start the node, reconcile sandboxes left by a crash. The HTTP
 * front end is started on top of it by daemon/daemon.h (coved_daemon_open). */
int coved_open(struct coved *d, const struct coved_options *o, struct cove_err *err);
/* Stop every instance (marking the sandboxes stopped), close everything (the front end,
 * if any, is stopped first: coved_daemon_close). */
void coved_close(struct coved *d);

/* Sandbox lifecycle (control/sandbox.c). Bodies are validated here; errors carry kinds
 * the API maps to statuses. JSON answers are new references. */
json_t *cove_sandbox_json(const struct cove_sandbox_row *row);
int cove_sandbox_create(struct coved *d, const char *tenant, json_t *body, json_t **out,
                        struct cove_err *err);
/* Role node, a `start` job: start the instance of sandbox id, whose row the control
 * inserted (state starting, node = this node), attach egress (borrowed, NULL: none) and
 * set it running. Idempotent: a sandbox already running here is answered as it is; one a
 * restart paused at its last snapshot is resumed. On failure the instance is gone and the
 * row unchanged. */
int cove_sandbox_start_placed(struct coved *d, const char *id, json_t *egress, json_t **out,
                              struct cove_err *err);
/* 0 found (row filled, caller clears it), -1 with NOT_FOUND otherwise. */
int cove_sandbox_load(struct coved *d, const char *tenant, const char *id,
                      struct cove_sandbox_row *row, struct cove_err *err);
/* 1 when the row's metadata holds every key/value of want (an object of strings). */
int cove_sandbox_metadata_matches(const struct cove_sandbox_row *row, json_t *want);
int cove_sandbox_delete(struct coved *d, const char *tenant, const char *id, int purge,
                        struct cove_err *err);
int cove_sandbox_set_timeout(struct coved *d, const char *tenant, const char *id, json_t *body,
                             json_t **out, struct cove_err *err);
/* The running sandbox's channel (referenced), or -1 with NOT_FOUND / CONFLICT. */
int cove_sandbox_chan(struct coved *d, const char *tenant, const char *id, struct cove_chan **chan,
                      struct cove_sandbox_row *row, struct cove_err *err);
void coved_reconcile(struct coved *d);
/* The instance of sandbox id is gone: paused at its last snapshot (why_paused), or stopped
 * (why_stopped) when it has none. */
void cove_sandbox_settle(struct coved *d, const char *id, const char *why_paused,
                         const char *why_stopped);
/* Stop sandbox id's instance, remove its host state (working storage included) and mark
 * it stopped with why (the tenant's key was revoked). */
void cove_sandbox_stop_purge(struct coved *d, const char *id, const char *why);

#endif
