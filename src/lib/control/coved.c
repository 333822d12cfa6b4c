/* coved start-up and shutdown: the order matters. Catalog first (it says which sandboxes
 * exist), then the node (runtime state on the host), then reconciliation of the two; the
 * HTTP front end starts only after all of it (daemon/daemon.h), so no request sees a
 * half-reconciled node. */
#include "control/coved.h"
#include "control/nodes.h"
#include "control/tbuild.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "control/apikey.h"
#include "control/cluster.h"
#include "control/secrets.h"
#include "control/audit.h"
#include "control/migrate.h"
#include "control/snapshot.h"
#include "control/template.h"
#include "control/tenant.h"
#include "cluster/catsrv.h"
#include "cluster/nodeauth.h"
#include "store/catalog_remote.h"
#include "crypto/keys.h"
#include "node/drivers.h"
#include "node/tm.h"
#include "util/cleanup.h"
#include "util/util.h"

void coved_on_instance_dead(void *arg, const char *id, const char *why);
void *coved_timer_main(void *arg);

/* Make sure data_dir/admin.key holds a valid admin key of tenant "default". */
static int ensure_admin_key(struct coved *d, struct cove_err *err)
{
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/admin.key", d->data_dir);
        cleanup_free char *have = NULL;
        size_t len;
        if (cove_read_file(path, 4096, &have, &len, NULL) == 0) {
                while (len && (have[len - 1] == '\n' || have[len - 1] == ' '))
                        have[--len] = '\0';
                struct cove_err e2;
                if (cove_apikey_verify(d->cat_ops, d->cat, have, NULL, &e2) == 0)
                        return 0;
                cove_warn(&d->log, "admin_key", "%s does not hold a valid key: issuing a new one",
                          path);
        }
        char key[COVE_APIKEY_BUF + 1];
        if (cove_apikey_create(d->cat_ops, d->cat, "default", 1, key, sizeof(key), err) < 0)
                return -1;
        size_t n = strlen(key);
        key[n] = '\n';
        int r = cove_write_file_atomic(d->data_dir, "admin.key", key, n + 1, 0600, err);
        memset(key, 0, sizeof(key));
        if (r == 0)
                cove_info(&d->log, "admin_key", "admin key written to %s (mode 0600)", path);
        return r;
}

static void progress_tty(void *arg, const char *stage, int percent)
{
        const char *name = arg;
        if (!isatty(2))
                return;
        if (percent >= 0)
                fprintf(stderr, "\rtemplate %s: %-10s %3d%%   ", name, stage, percent);
        else
                fprintf(stderr, "\rtemplate %s: %-10s ...    ", name, stage);
        fflush(stderr);
}

static int build_templates(struct coved *d, const char *list, struct cove_err *err)
{
        char buf[512];
        snprintf(buf, sizeof(buf), "%s", list);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (!*t)
                        continue;
                char rootfs[PATH_MAX];
                if (cove_template_lookup(d->templates_dir, t, rootfs, sizeof(rootfs), NULL) == 0)
                        continue;
                cove_info(&d->log, "template", "building template %s into %s", t, d->templates_dir);
                int64_t t0 = cove_mono_ns();
                int r = cove_template_build(d->templates_dir, t, progress_tty, t, err);
                if (isatty(2))
                        fprintf(stderr, "\n");
                if (r < 0)
                        return cove_err_wrap(err, "template %s", t);
                cove_info(&d->log, "template", "template %s built in %.1f s", t,
                          (double)(cove_mono_ns() - t0) / 1e9);
        }
        return 0;
}

/* One warm pool per built template of the list, in the default shape. */
static int start_pools(struct coved *d, const char *runtime, const char *list, int size, int max,
                       struct cove_err *err)
{
        char buf[512];
        snprintf(buf, sizeof(buf), "%s", list);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t && size > 0; t = strtok_r(NULL, ",", &save)) {
                char rootfs[PATH_MAX];
                if (cove_template_lookup(d->templates_dir, t, rootfs, sizeof(rootfs), NULL) != 0)
                        continue;
                if (cove_node_pool_add_max(d->node, runtime, rootfs, COVE_DEFAULT_CPUS,
                                           COVE_DEFAULT_MEMORY_MB, COVE_DEFAULT_DISK_MB, size, max,
                                           NULL, err) < 0)
                        return cove_err_wrap(err, "warm pool of %s", t);
                if (max > size)
                        cove_info(&d->log, "pool",
                                  "keeping %d to %d warm %s sandboxes of template %s", size, max,
                                  runtime, t);
                else
                        cove_info(&d->log, "pool", "keeping %d warm %s sandboxes of template %s",
                                  size, runtime, t);
        }
        return 0;
}

#define GUEST_MAX (256u << 20)
#define GUEST_RUN_DIR "/run/cove/guest"

/* every directory from / down to path is open to others (o+x): a sandbox's uid can reach it */
static int reachable_by_all(const char *path)
{
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s", path);
        for (;;) {
                struct stat st;
                if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode) || !(st.st_mode & S_IXOTH))
                        return 0;
                char *slash = strrchr(p, '/');
                if (!slash || slash == p)
                        break;
                *slash = 0;
        }
        struct stat st;
        return stat("/", &st) == 0 && (st.st_mode & S_IXOTH);
}

/* Sandboxes run a copy of cove-guest that coved owns, not the build's file: a restore (CRIU)
 * opens the guest's bind mount source by its host path from inside the sandbox's user
 * namespace, so it must be reachable by the sandbox's uids wherever the project was built
 * (under root's home or a `mktemp -d` directory, both 0700, it is not). The copy is named by
 * its content's digest (cove-guest-<sha256 prefix>: a running sandbox's binary never changes
 * under it, and a full snapshot finds the build it was taken with), written atomically, mode
 * 0755, in /run/cove/guest: the path is in every sandbox's mountinfo, and that one names no
 * data dir or home. Where /run is not usable, in <data>/guest when every directory above the
 * data dir is open to others. Copies are never deleted here (a full snapshot of an older
 * build needs its own); /run empties at boot. */
static int stage_guest(struct coved *d, struct cove_err *err)
{
        cleanup_free char *bin = NULL;
        size_t len = 0;
        if (cove_read_file(d->guest_binary, GUEST_MAX, &bin, &len, err) < 0)
                return cove_err_wrap(err, "guest binary %s", d->guest_binary);
        uint8_t md[EVP_MAX_MD_SIZE];
        unsigned ml = 0;
        if (EVP_Digest(bin, len, md, &ml, EVP_sha256(), NULL) != 1 || ml < 8)
                return cove_err_setk(err, COVE_E_INTERNAL, 0, "guest binary: digest");
        char hex[17], name[64], dir[PATH_MAX];
        cove_hex(md, 8, hex);
        snprintf(name, sizeof(name), "cove-guest-%s", hex);
        if (reachable_by_all("/run") || !reachable_by_all(d->data_dir))
                snprintf(dir, sizeof(dir), "%s", GUEST_RUN_DIR);
        else
                snprintf(dir, sizeof(dir), "%s/guest", d->data_dir);
        struct stat st;
        if (cove_mkdir_p(dir, 0755, err) < 0)
                return cove_err_wrap(err, "guest copy");
        if (lstat(dir, &st) < 0)
                return cove_err_set(err, errno, "guest copy: %s", dir);
        if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
                return cove_err_set(err, ENOTDIR, "guest copy: %s is not coved's directory", dir);
        if (chmod(dir, 0755) < 0)
                return cove_err_set(err, errno, "guest copy: %s", dir);
        char path[PATH_MAX + 80];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        cleanup_free char *have = NULL;
        size_t hl = 0;
        int exists = lstat(path, &st) == 0;
        if (!exists || !S_ISREG(st.st_mode) || (st.st_mode & 07777) != 0755 ||
            cove_read_file(path, GUEST_MAX, &have, &hl, NULL) < 0 || hl != len ||
            memcmp(have, bin, len)) {
                /* written aside, then linked in: a copy another coved put there meanwhile is
                 * kept (sandboxes may run it: replacing it would leave them a deleted file);
                 * only a damaged one is replaced */
                char tmp[96], tp[PATH_MAX + 100];
                snprintf(tmp, sizeof(tmp), ".%s.%d", name, (int)getpid());
                snprintf(tp, sizeof(tp), "%s/%s", dir, tmp);
                if (cove_write_file_atomic(dir, tmp, bin, len, 0755, err) < 0)
                        return cove_err_wrap(err, "guest copy");
                int rc = exists ? rename(tp, path) : link(tp, path);
                if (rc < 0 && !(errno == EEXIST && !exists)) {
                        int e = errno;
                        unlink(tp);
                        return cove_err_set(err, e, "guest copy %s", path);
                }
                unlink(tp); /* after a rename: ENOENT, harmless */
        }
        cove_info(&d->log, "guest", "sandboxes run %s (a copy of %s)", path, d->guest_binary);
        snprintf(d->guest_binary, sizeof(d->guest_binary), "%s", path);
        return 0;
}

/* The role and the cluster identity of this process (docs/cluster.md "Roles"): checks that
 * the flags fit the role and loads the key or token. Nothing of it in role all. */
static int cluster_identity(struct coved *d, const struct coved_options *o, struct cove_err *err)
{
        const struct coved_cluster_options *c = &o->cluster;
        d->role = c->role;
        d->lease_ttl_ms = c->lease_ttl_ms > 0 ? c->lease_ttl_ms : 10000;
        d->lease_renew_ms = c->lease_renew_ms > 0 ? c->lease_renew_ms : 2000;
        snprintf(d->node_name, sizeof(d->node_name), "local");
        if (d->lease_renew_ms * 2 > d->lease_ttl_ms)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--lease-renew (%d ms) must be at most half of --lease-ttl "
                                     "(%d ms)",
                                     d->lease_renew_ms, d->lease_ttl_ms);
        int pg = o->db && cove_catalog_for(o->db) == &cove_catalog_pg;
        int s3 = o->store.url && !strncmp(o->store.url, "s3://", 5);
        switch (c->role) {
        case COVED_ROLE_ALL:
                if (c->node_name || c->node_token_file || c->cluster_key_file || c->control_url ||
                    c->advertise)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--node-name, --node-token-file, --cluster-key-file, "
                                             "--control and --advertise need --role control or "
                                             "--role node");
                return 0;
        case COVED_ROLE_CONTROL:
                if (!pg || !s3 || !c->cluster_key_file)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--role control needs --db postgres://…, --store "
                                             "s3://… with --s3-endpoint, and --cluster-key-file");
                if (c->node_name || c->node_token_file || c->control_url || c->advertise)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--node-name, --node-token-file, --control and "
                                             "--advertise are flags of --role node");
                if (cove_nodeauth_read_key(c->cluster_key_file, d->cluster_key, err) < 0)
                        return -1;
                d->has_cluster_key = 1;
                snprintf(d->node_name, sizeof(d->node_name), "%s", "");
                return 0;
        case COVED_ROLE_NODE:
                if (!c->node_name || !cove_node_name_valid(c->node_name))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--role node needs --node-name NAME (1 to %d of a-z "
                                             "0-9 -, not starting with -)",
                                             COVE_NODE_NAME_MAX);
                if (!c->node_token_file || !s3 || (!pg && !c->control_url))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--role node needs --node-token-file, --store "
                                             "s3://… with --s3-endpoint, and --control URL (or "
                                             "--db postgres://…)");
                if (o->db && c->control_url) /* one source of truth for the catalog */
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--role node takes its catalog from --control URL "
                                             "(no database credentials) or from --db, not both");
                if (c->cluster_key_file)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "a node does not hold the cluster key: give it "
                                             "--node-token-file only");
                if (cove_nodeauth_read_token(c->node_token_file, d->node_token, err) < 0)
                        return -1;
                snprintf(d->node_name, sizeof(d->node_name), "%s", c->node_name);
                snprintf(d->control_url, sizeof(d->control_url), "%s",
                         c->control_url ? c->control_url : "");
                if (c->advertise)
                        snprintf(d->advertise, sizeof(d->advertise), "%s", c->advertise);
                else if (o->listen)
                        snprintf(d->advertise, sizeof(d->advertise), "http://%s", o->listen);
                else
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "--role node needs --listen (its node API) or "
                                             "--advertise URL");
                /* where control replicas relay preview requests: the port listener's
                 * address, its host the advertised one's when it listens on every address */
                const char *pl = o->ports.listen;
                if (pl && !strncmp(pl, "0.0.0.0:", 8)) {
                        const char *h = strstr(d->advertise, "://");
                        h = h ? h + 3 : d->advertise;
                        size_t n = strcspn(h, ":/");
                        snprintf(d->ports_advertise, sizeof(d->ports_advertise), "%.*s%s",
                                 (int)(n < 64 ? n : 64), h, pl + 7);
                } else if (pl) {
                        snprintf(d->ports_advertise, sizeof(d->ports_advertise), "%s", pl);
                }
                return 0;
        }
        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "unknown role");
}

/* Role control: the catalog (PostgreSQL) and the job waiter; no node, gateway, pools,
 * templates or timers here (each node runs its own sandboxes' timers). */
static int control_open(struct coved *d, const struct coved_options *o, struct cove_err *err)
{
        char db[PATH_MAX], shown[512];
        snprintf(db, sizeof(db), "%s", o->db);
        d->cat_ops = cove_catalog_for(db);
        cove_catalog_dsn_redact(db, shown, sizeof(shown));
        d->cat = d->cat_ops->open(db, err);
        explicit_bzero(db, sizeof(db));
        if (!d->cat)
                return cove_err_wrap(err, "catalog %s", shown);
        cove_info(&d->log, "coved.start", "control replica; catalog: %s %s", d->cat_ops->name,
                  shown);
        snprintf(d->templates_dir, sizeof(d->templates_dir), "%s/templates", d->data_dir);
        d->tb = coved_tbuilds_new(d->templates_dir); /* lists; builds are refused here */
        if (!d->tb)
                return cove_err_set(err, ENOMEM, "template builds");
        d->audit = cove_audit_open(d->cat_ops, d->cat, &d->log, err);
        if (!d->audit || coved_keys_open(d, o->default_kek_file, err) < 0 ||
            cove_tenant_ensure_default(d->cat_ops, d->cat, err) < 0 ||
            ensure_admin_key(d, err) < 0 || coved_cluster_open(d, err) < 0 ||
            coved_nodes_start(d, err) < 0) {
                coved_close(d);
                return -1;
        }
        return 0;
}

int coved_open(struct coved *d, const struct coved_options *o, struct cove_err *err)
{
        memset(d, 0, sizeof(*d));
        d->log.fd = 2;
        d->log.level = (enum cove_log_level)o->log_level;
        d->started_at = cove_now_ms();
        d->default_timeout_s = o->default_timeout_s > 0 ? o->default_timeout_s : 300;
        pthread_mutex_init(&d->mu, NULL);
        pthread_mutex_init(&d->quota_mu, NULL);
        d->encrypt_layers = o->encrypt_layers;
        d->pause_hot_s = o->pause_hot_s < 0 ? 0 : o->pause_hot_s ? o->pause_hot_s : 120;
        d->pause_hot_mb = o->pause_hot_mb > 0 ? o->pause_hot_mb : 2048;
        d->store = o->store;
        pthread_cond_init(&d->cv, NULL);
        cove_keys_cache_ttl_set(o->key_cache_ttl_s < 0 ? 60000
                                                       : (int64_t)o->key_cache_ttl_s * 1000);
        if (cluster_identity(d, o, err) < 0)
                return -1;
        d->nodes_opt = o->nodes; /* placement and node admin (control/nodes.h), role control */
        if (d->role != COVED_ROLE_ALL && !o->default_kek_file)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--role control and --role node need --default-kek-file F: "
                                     "the same 32-byte key file on every control and node (the "
                                     "default key of tenants without their own; create it "
                                     "once with `umask 077; head -c 32 /dev/urandom > F`)");
        if (!realpath(o->data_dir, d->data_dir)) {
                if (cove_mkdir_p(o->data_dir, 0711, err) < 0 || !realpath(o->data_dir, d->data_dir))
                        return cove_err_set(err, errno, "data dir %s", o->data_dir);
        }
        chmod(d->data_dir, 0711);
        /* one process per data dir (a second coved, or `coved migrate` reading it) */
        d->dir_lock = coved_data_dir_lock(d->data_dir, 1, err);
        if (d->dir_lock < 0)
                return -1;
        if (d->role == COVED_ROLE_CONTROL)
                return control_open(d, o, err);
        if (o->templates_dir) {
                /* absolute, so rootfs paths handed to the runtime are too */
                if (cove_mkdir_p(o->templates_dir, 0755, err) < 0 ||
                    !realpath(o->templates_dir, d->templates_dir))
                        return cove_err_set(err, errno, "templates dir %s", o->templates_dir);
        } else
                snprintf(d->templates_dir, sizeof(d->templates_dir), "%s/templates", d->data_dir);
        d->tb = coved_tbuilds_new(d->templates_dir); /* sweeps what killed builds left */
        if (!d->tb)
                return cove_err_set(err, ENOMEM, "template builds");
        if (o->guest_binary) {
                snprintf(d->guest_binary, sizeof(d->guest_binary), "%s", o->guest_binary);
        } else {
                char self[PATH_MAX];
                ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
                if (n < 0)
                        return cove_err_set(err, errno, "find own binary");
                self[n] = '\0';
                snprintf(d->guest_binary, sizeof(d->guest_binary), "%s/cove-guest", dirname(self));
        }
        if (access(d->guest_binary, X_OK) < 0)
                return cove_err_set(err, errno,
                                    "guest binary %s (build it with `make`, or pass "
                                    "--guest-binary)",
                                    d->guest_binary);
        if (stage_guest(d, err) < 0)
                return -1;

        char db[PATH_MAX], shown[512];
        if (o->db)
                snprintf(db, sizeof(db), "%s", o->db);
        else
                snprintf(db, sizeof(db), "%s/catalog.db", d->data_dir);
        d->cat_ops = cove_catalog_for(db);
        cove_catalog_dsn_redact(db, shown, sizeof(shown)); /* never log a password */
        if (d->role == COVED_ROLE_NODE && !o->db) { /* through the control (docs/cluster.md) */
                d->cat_ops = &cove_catalog_remote;
                snprintf(shown, sizeof(shown), "%s", d->control_url);
                d->cat = cove_catalog_remote_open(d->control_url, d->node_name, d->node_token, err);
        } else
                d->cat = d->cat_ops->open(db, err);
        explicit_bzero(db, sizeof(db));
        if (!d->cat)
                return cove_err_wrap(err, "catalog %s", shown);
        cove_info(&d->log, "coved.start", "catalog: %s %s", d->cat_ops->name, shown);
        if (coved_keys_open(d, o->default_kek_file, err) < 0)
                goto fail;
        /* a node takes no API keys: it writes no admin key (its callers are control
         * replicas) */
        if (cove_tenant_ensure_default(d->cat_ops, d->cat, err) < 0 ||
            (d->role == COVED_ROLE_ALL && ensure_admin_key(d, err) < 0))
                goto fail;
        if (build_templates(d, o->templates ? o->templates : "busybox", err) < 0)
                goto fail;

        struct cove_node_config nc = {
            .log = &d->log,
            .data_dir = d->data_dir,
            .guest_binary = d->guest_binary,
            .on_dead = coved_on_instance_dead,
            .on_stop = coved_egress_on_stop,
            .on_ask = coved_on_ask,
            .layer_key = coved_pool_layer_key,
            .arg = d,
            .pool_idle_ms = o->pool_idle_s > 0 ? o->pool_idle_s * 1000 : 0,
        };
        if (cove_node_drivers(o->runtime, &d->log, &nc.rt_ops, &nc.rt_alt_ops, err) < 0)
                goto fail;
        /* the gateway before the node: stopping an instance detaches its link */
        if (coved_egress_open(d, &o->egress, err) < 0)
                goto fail;
        d->node = cove_node_new(&nc, err);
        if (!d->node)
                goto fail;
        /* before any instance starts (pools, restores). Role node: each guest fences itself
         * after the lease TTL without a heartbeat, sent every renew interval while the lease
         * is confirmed (none until the agent holds it: cluster/agent.c) */
        if (d->role == COVED_ROLE_NODE) {
                cove_node_fence_config(
                    d->node,
                    o->cluster.guest_fence_ttl_ms > 0 ? o->cluster.guest_fence_ttl_ms
                                                      : d->lease_ttl_ms,
                    o->cluster.guest_fence_ttl_ms > 0 ? o->cluster.guest_fence_beat_ms
                                                      : d->lease_renew_ms);
                cove_node_heartbeat_pause(d->node, 1);
        } else if (o->cluster.guest_fence_ttl_ms > 0) {
                cove_node_fence_config(d->node, o->cluster.guest_fence_ttl_ms,
                                       o->cluster.guest_fence_beat_ms);
        }
        /* role node: its agent reconciles once it holds its lease (its writes are fenced) */
        if (d->role != COVED_ROLE_NODE)
                coved_reconcile(d);
        struct cove_node_tm_config tc = {
            .log = &d->log,
            .data_dir = d->data_dir,
            .store_url = d->store.url,
            .s3_endpoint = d->store.s3_endpoint,
            .s3_timeout_s = d->store.s3_timeout_s,
            .cache_mb = d->store.cache_mb,
            .keep_images = d->pause_hot_s > 0, /* the same knob as hot pauses */
            .layer_key = coved_pool_layer_key,
            .arg = d,
        };
        if (cove_node_tm_open(d->node, &tc, &d->ntm, err) < 0 || cove_tm_open(d, err) < 0)
                goto fail;
        d->pool_size = o->pool_size < 0 ? 4 : o->pool_size;
        /* a node starts the sandbox ids its control chose: a warm instance (its own id) fits
         * no start job yet */
        if (d->role == COVED_ROLE_NODE)
                d->pool_size = 0;
        if (start_pools(d, "ns", o->templates ? o->templates : "busybox", d->pool_size,
                        d->pool_size ? o->pool_max : 0, err) < 0)
                goto fail;
        if (d->role == COVED_ROLE_ALL && o->vm_pool_size > 0 &&
            start_pools(d, "vm", o->templates ? o->templates : "busybox", o->vm_pool_size, 0, err) <
                0)
                goto fail;
        coved_template_pools_restore(d); /* tenant templates with "pool" */
        int e = pthread_create(&d->timer, NULL, coved_timer_main, d);
        if (e) {
                cove_err_set(err, e, "timer thread");
                goto fail;
        }
        d->timer_started = 1;
        if (coved_cluster_open(d, err) < 0) /* role node: lease, jobs, fence */
                goto fail;
        /* role control: the node-loss sweeper and drains (a no-op in the other roles) */
        if (coved_nodes_start(d, err) < 0)
                goto fail;
        return 0;
fail:
        coved_close(d);
        return -1;
}

struct running_ctx {
        const struct coved *d;
        json_t *ids;
};

static int collect_running(const struct cove_sandbox_row *row, void *arg)
{
        struct running_ctx *x = arg;
        if (coved_cluster_mine(x->d, row)) /* role node: its own only */
                json_array_append_new(x->ids, json_string(row->id));
        return 0;
}

void coved_close(struct coved *d)
{
        pthread_mutex_lock(&d->mu);
        d->quitting = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        coved_cluster_close(d); /* first: no job runs while the rest closes */
        if (d->timer_started)
                pthread_join(d->timer, NULL);
        d->timer_started = 0;
        coved_nodes_stop(d); /* the node-loss sweeper and drains (role control) */
        coved_ports_close(d);
        coved_tbuilds_free(d->tb); /* cancels and waits for template builds */
        d->tb = NULL;
        cove_tm_close(d); /* before the node: its thread snapshots instances */
        cove_node_tm_close(d->ntm);
        d->ntm = NULL;
        if (d->node) {
                /* the instances end with coved; say so in the catalog */
                json_t *ids = json_array();
                struct cove_err err;
                struct running_ctx rc = {d, ids};
                d->cat_ops->sandbox_list(d->cat, NULL, "running", collect_running, &rc, &err);
                cove_node_free(d->node);
                d->node = NULL;
                size_t i;
                json_t *v;
                json_array_foreach(ids, i, v)
                {
                        cove_sandbox_settle(d, json_string_value(v),
                                            "coved was stopped: paused at the last snapshot",
                                            "coved was stopped");
                }
                json_decref(ids);
        }
        coved_egress_close(d); /* after the node: its stops detach links */
        /* the HTTP server is stopped: no node waits in it */
        cove_catsrv_free(d->catsrv);
        d->catsrv = NULL;
        if (d->cat)
                d->cat_ops->close(d->cat);
        d->cat = NULL;
        coved_keys_close(d);
        cove_keys_cache_clear(); /* unwrapped data keys do not outlive coved */
        if (d->dir_lock > 0)
                close(d->dir_lock);
        d->dir_lock = -1;
        OPENSSL_cleanse(d->cluster_key, sizeof(d->cluster_key));
        OPENSSL_cleanse(d->node_token, sizeof(d->node_token));
}
