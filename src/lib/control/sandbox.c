/* Sandbox lifecycle in the control plane: validate requests, keep the catalog row and the
 * node instance in step, expire sandboxes on timeout, reconcile after a crash.
 * Order on create: row (starting) → instance → row (running); on any failure the instance
 * and uid range are released and the row removed, so nothing half-made stays visible. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "control/cluster.h"
#include "control/coved.h"
#include "control/egress.h"
#include "control/secrets.h"
#include "control/retention.h"
#include "control/snapshot.h"
#include "control/template.h"
#include "control/tbuild.h"
#include "control/tenant.h"
#include "node/tm.h"
#include "crypto/keys.h"
#include "util/cleanup.h"
#include "util/util.h"

#define MAX_TIMEOUT_S (30 * 24 * 3600)
#define MAX_META 64
#define MAX_ENV 256

json_t *cove_sandbox_json(const struct cove_sandbox_row *s)
{
        char created[40], expires[40];
        cove_rfc3339(s->created_at, created, sizeof(created));
        cove_rfc3339(s->expires_at, expires, sizeof(expires));
        json_error_t je;
        json_t *meta = s->metadata_json ? json_loads(s->metadata_json, 0, &je) : NULL;
        json_t *o = json_pack(
            "{s:s, s:s, s:s, s:s, s:s, s:o, s:i, s:i, s:i, s:i, s:s, s:o, s:s, "
            "s:o}",
            "id", s->id, "state", s->state, "template", s->template_name, "runtime", s->runtime,
            "created_at", created, "expires_at", s->expires_at ? json_string(expires) : json_null(),
            "cpus", s->cpus, "memory_mb", s->memory_mb, "disk_mb", s->disk_mb, "timeout_s",
            s->timeout_s, "on_timeout", s->on_timeout, "metadata", meta ? meta : json_object(),
            "node", s->node, "last_snapshot_id",
            s->last_snapshot_id[0] ? json_string(s->last_snapshot_id) : json_null());
        if (o && s->error && s->error[0])
                json_object_set_new(o, "error", json_string(s->error));
        struct cove_retention pol;
        if (o && cove_retention_parse(s->retention_json, &pol, NULL) == 0) {
                char *txt = cove_retention_dump(&pol);
                json_error_t je2;
                json_t *rv = txt ? json_loads(txt, 0, &je2) : NULL;
                free(txt);
                if (rv)
                        json_object_set_new(o, "retention", rv);
        }
        if (o)
                json_object_set_new(o, "snapshot_interval_s", json_integer(s->snapshot_interval_s));
        /* the writable layer at rest: fscrypt under a key from the tenant's DEK when asked
         * for at create (snapshots are always encrypted: docs/storage.md) */
        if (o)
                json_object_set_new(o, "storage_encrypted", json_boolean(s->storage_encrypted));
        /* after its node was lost: the snapshot it was recovered from (control/nodes.h) */
        json_error_t je3;
        json_t *rf =
            o && s->recovered_from_json ? json_loads(s->recovered_from_json, 0, &je3) : NULL;
        if (rf && json_is_object(rf))
                json_object_set_new(o, "recovered_from", rf);
        else
                json_decref(rf);
        return o;
}

static int bad(struct cove_err *err, const char *fmt, const char *field)
{
        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, fmt, field);
}

/* Optional integer field within [lo, hi]; *out keeps its default when absent. */
static int int_field(json_t *body, const char *key, long lo, long hi, int *out,
                     struct cove_err *err)
{
        json_t *v = json_object_get(body, key);
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_integer(v))
                return bad(err, "%s must be an integer", key);
        json_int_t x = json_integer_value(v);
        if (x < lo || x > hi)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "%s must be between %ld and %ld (got %lld)", key, lo, hi,
                                     (long long)x);
        *out = (int)x;
        return 0;
}

/* An object of string values with bounded sizes; returns a new reference (empty if absent). */
static json_t *string_map(json_t *body, const char *key, size_t max_entries, size_t max_key,
                          size_t max_val, int env_names, struct cove_err *err)
{
        json_t *v = json_object_get(body, key);
        if (!v || json_is_null(v))
                return json_object();
        if (!json_is_object(v)) {
                bad(err, "%s must be an object of strings", key);
                return NULL;
        }
        if (json_object_size(v) > max_entries) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s has more than %zu entries", key,
                              max_entries);
                return NULL;
        }
        const char *k;
        json_t *val;
        json_object_foreach(v, k, val)
        {
                size_t kl = strlen(k);
                int ok = kl > 0 && kl <= max_key && json_is_string(val) &&
                         json_string_length(val) <= max_val &&
                         strlen(json_string_value(val)) == json_string_length(val);
                for (size_t i = 0; ok && env_names && i < kl; i++)
                        ok = k[i] == '_' || isalnum((unsigned char)k[i]);
                if (ok && env_names)
                        ok = !isdigit((unsigned char)k[0]);
                if (!ok) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                      "%s: entry \"%.64s\" is invalid (%s; values are strings "
                                      "of at most %zu bytes)",
                                      key, k,
                                      env_names ? "names are [A-Za-z_][A-Za-z0-9_]*"
                                                : "keys are non-empty strings",
                                      max_val);
                        return NULL;
                }
        }
        return json_incref(v);
}

static int string_field(json_t *body, const char *key, char *out, size_t cap, int required,
                        struct cove_err *err)
{
        json_t *v = json_object_get(body, key);
        if (!v || json_is_null(v))
                return required ? bad(err, "%s is required", key) : 0;
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= cap)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "%s must be a non-empty string of at most %zu bytes", key,
                                     cap - 1);
        snprintf(out, cap, "%s", json_string_value(v));
        return 0;
}

/* The runtime a sandbox asks for: one this node can run, or (role control: no node here)
 * one of the drivers any node may have. */
static int runtime_check(struct coved *d, const char *runtime, struct cove_err *err)
{
        if (d->node)
                return cove_node_runtime_check(d->node, runtime, err);
        if (strcmp(runtime, "ns") && strcmp(runtime, "vm"))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "unknown runtime \"%s\" (ns or vm)", runtime);
        return 0;
}

/* The row of a new sandbox from a create body, every field validated (shared by every
 * role: the start is the role's). *eg: the egress policy (borrowed from body, NULL: none).
 * -1 with nothing to clean (s is cleared). */
static int create_row(struct coved *d, const char *tenant, json_t *body,
                      struct cove_sandbox_row *s_out, json_t **eg_out, struct cove_err *err)
{
        struct cove_sandbox_row s;
        memset(&s, 0, sizeof(s));
        memset(s_out, 0, sizeof(*s_out));
        *eg_out = NULL;
        snprintf(s.tenant, sizeof(s.tenant), "%s", tenant);
        snprintf(s.runtime, sizeof(s.runtime), "%s",
                 d->node ? cove_node_runtime_name(d->node) : "ns");
        snprintf(s.on_timeout, sizeof(s.on_timeout), "kill");
        snprintf(s.node, sizeof(s.node), "%s", d->node_name);
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        s.cpus = COVE_DEFAULT_CPUS;
        s.memory_mb = COVE_DEFAULT_MEMORY_MB;
        s.disk_mb = COVE_DEFAULT_DISK_MB;
        s.timeout_s = d->default_timeout_s;
        s.snapshot_interval_s = COVE_DEFAULT_SNAPSHOT_INTERVAL_S;
        char runtime[16] = "";
        if (string_field(body, "template", s.template_name, sizeof(s.template_name), 1, err) < 0 ||
            string_field(body, "runtime", runtime, sizeof(runtime), 0, err) < 0 ||
            string_field(body, "on_timeout", s.on_timeout, sizeof(s.on_timeout), 0, err) < 0 ||
            int_field(body, "cpus", 1, ncpu > 0 ? ncpu : 1, &s.cpus, err) < 0 ||
            int_field(body, "memory_mb", 32, 65536, &s.memory_mb, err) < 0 ||
            int_field(body, "disk_mb", 16, 1024 * 1024, &s.disk_mb, err) < 0 ||
            int_field(body, "timeout_s", 1, MAX_TIMEOUT_S, &s.timeout_s, err) < 0 ||
            int_field(body, "snapshot_interval_s", 0, 7 * 24 * 3600, &s.snapshot_interval_s, err) <
                0)
                return -1;
        if (runtime[0]) {
                if (runtime_check(d, runtime, err) < 0)
                        return -1;
                snprintf(s.runtime, sizeof(s.runtime), "%s", runtime);
        }
        /* a vm's rolling snapshot is a full one (its RAM too, the VM stopped while written):
         * off unless asked for */
        if (!strcmp(s.runtime, "vm") && !json_object_get(body, "snapshot_interval_s"))
                s.snapshot_interval_s = 0;
        if (strcmp(s.on_timeout, "kill") != 0 && strcmp(s.on_timeout, "pause") != 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "on_timeout must be \"kill\" or \"pause\" (got \"%s\")",
                                     s.on_timeout);
        /* encrypted working storage: ns layers (fscrypt) and vm disks (a LUKS qcow2
         * overlay). On by default for a tenant holding its own key (BYOK: every byte stored
         * for it is under that key, so it cannot ask for false), for ns also under
         * --encrypt-layers; else asked for per sandbox */
        int is_ns = !strcmp(s.runtime, "ns"), is_vm = !strcmp(s.runtime, "vm");
        int byok = coved_tenant_byok(d, tenant, err);
        if (byok < 0)
                return -1;
        s.storage_encrypted = (d->encrypt_layers && is_ns) || (byok && (is_ns || is_vm));
        json_t *enc = json_object_get(body, "storage_encrypted");
        if (enc && !json_is_null(enc)) {
                if (!json_is_boolean(enc))
                        return bad(err, "%s must be a boolean", "storage_encrypted");
                if (byok && !json_is_true(enc))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "storage_encrypted: false is refused: tenant %s "
                                             "holds its own key, so its sandboxes' storage is "
                                             "always encrypted under it",
                                             tenant);
                s.storage_encrypted = json_is_true(enc);
                if (s.storage_encrypted && !is_ns && !is_vm)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "storage_encrypted needs runtime ns or vm (runtime "
                                             "%s disks are not encrypted)",
                                             s.runtime);
        }
        json_t *ret = json_object_get(body, "retention");
        if (ret && !json_is_null(ret)) {
                struct cove_retention pol;
                char *txt = json_dumps(ret, JSON_COMPACT | JSON_ENCODE_ANY);
                if (!txt || cove_retention_parse(txt, &pol, err) < 0) {
                        free(txt);
                        return -1;
                }
                free(txt);
                s.retention_json = cove_retention_dump(&pol);
        }
        /* egress: validated now, attached once the instance runs; absent = no network */
        json_t *eg = json_object_get(body, "egress");
        if (eg && json_is_null(eg))
                eg = NULL;
        if (eg && coved_egress_create_check(d, tenant, eg, err) < 0) {
                cove_sandbox_row_clear(&s);
                return -1;
        }
        json_t *meta = string_map(body, "metadata", MAX_META, 128, 1024, 0, err);
        if (!meta) {
                cove_sandbox_row_clear(&s);
                return -1;
        }
        json_t *env = string_map(body, "env", MAX_ENV, 256, 32768, 1, err);
        if (!env) {
                json_decref(meta);
                cove_sandbox_row_clear(&s);
                return -1;
        }
        /* the template's image env (PATH…) as defaults under the body's */
        json_t *tcfg = coved_template_config(d, tenant, s.template_name);
        json_t *tenv = json_object_get(tcfg, "env");
        if (json_is_object(tenv)) {
                json_t *merged = json_deep_copy(tenv);
                json_object_update(merged, env);
                json_decref(env);
                env = merged;
        }
        json_decref(tcfg);
        s.metadata_json = json_dumps(meta, JSON_COMPACT);
        s.env_json = json_dumps(env, JSON_COMPACT);
        json_decref(meta);
        json_decref(env);
        *s_out = s;
        *eg_out = eg;
        return 0;
}

/* The root filesystem of s's template on this node: 0, or -1 (BAD_REQUEST unknown,
 * UNAVAILABLE not built here). */
static int template_rootfs(struct coved *d, const struct cove_sandbox_row *sr, char *rootfs,
                           size_t cap, struct cove_err *err)
{
        const struct cove_sandbox_row s = *sr;
        int r =
            cove_template_lookup_for(d->templates_dir, s.tenant, s.template_name, rootfs, cap, err);
        if (r == 1) {
                r = cove_template_known(s.template_name)
                        ? cove_err_setk(
                              err, COVE_E_UNAVAILABLE, 0,
                              "template \"%s\" is not built on this node yet: restart coved "
                              "with --templates %s%s (the templates it builds at "
                              "start), or start it with `cove up`, which builds "
                              "busybox and base",
                              s.template_name, strcmp(s.template_name, "busybox") ? "busybox," : "",
                              s.template_name)
                        : cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                        "unknown template \"%s\" (GET /v1/templates lists "
                                        "them)",
                                        s.template_name);
        }
        return r == 0 ? 0 : -1;
}

int cove_sandbox_create(struct coved *d, const char *tenant, json_t *body, json_t **out,
                        struct cove_err *err)
{
        if (d->node && coved_space_check(d, "create sandbox", err) < 0)
                return -1;
        struct cove_sandbox_row s;
        json_t *eg = NULL;
        if (create_row(d, tenant, body, &s, &eg, err) < 0)
                return -1;
        int is_ns = !strcmp(s.runtime, "ns"), is_vm = !strcmp(s.runtime, "vm");
        char rootfs[PATH_MAX];
        /* a control replica has no templates: the node that takes it looks its one up */
        if (d->role != COVED_ROLE_CONTROL &&
            template_rootfs(d, &s, rootfs, sizeof(rootfs), err) < 0) {
                cove_sandbox_row_clear(&s);
                return -1;
        }
        /* the tenant's key must unwrap and its quotas allow the shape: checked before
         * anything is made, so a refusal leaves nothing behind */
        if (coved_key_gate(d, tenant, err) < 0) {
                cove_sandbox_row_clear(&s);
                return -1;
        }
        coved_quota_lock(d);
        if (coved_quota_admit(d, tenant, 1, s.cpus, s.memory_mb, s.disk_mb, err) < 0) {
                coved_quota_unlock(d);
                cove_sandbox_row_clear(&s);
                return -1;
        }
        if (d->role == COVED_ROLE_CONTROL) { /* placed, started by its node (a job) */
                int rc = coved_cluster_create(d, tenant, &s, eg, out, err);
                cove_sandbox_row_clear(&s);
                return rc;
        }
        int64_t t0 = cove_mono_ns();
        /* a warm instance of this template and shape, if one is ready: it already has its
         * id, uid range, limits and a guest that answered the handshake. An encrypted layer
         * is keyed for its tenant and id when it is made, so an encrypted create takes from
         * its tenant's own pool (made on its first miss, default shape, ns) */
        const char *owner = s.storage_encrypted ? tenant : NULL;
        int pooled =
            cove_node_pool_take(d->node, s.runtime, rootfs, (unsigned)s.cpus, (unsigned)s.memory_mb,
                                (unsigned)s.disk_mb, owner, s.id, sizeof(s.id), &s.uid_base) == 0;
        if (!pooled && owner && is_ns && s.cpus == COVE_DEFAULT_CPUS &&
            s.memory_mb == COVE_DEFAULT_MEMORY_MB && s.disk_mb == COVE_DEFAULT_DISK_MB) {
                struct cove_err e2;
                if (cove_node_pool_add(d->node, s.runtime, rootfs, (unsigned)s.cpus,
                                       (unsigned)s.memory_mb, (unsigned)s.disk_mb,
                                       d->pool_size < 2 ? d->pool_size : 2, owner, &e2) < 0 &&
                    e2.kind != COVE_E_LIMIT) /* all owner pools in use: cold, as before */
                        cove_warn(&d->log, "pool", "tenant %s: %s", tenant, e2.msg);
        }
        if (!pooled && (cove_id_new("sbx_", s.id, sizeof(s.id), err) < 0 ||
                        cove_node_uid_reserve(d->node, &s.uid_base, err) < 0)) {
                coved_quota_unlock(d);
                cove_sandbox_row_clear(&s);
                return -1;
        }
        s.created_at = cove_now_ms();
        s.expires_at = s.created_at + (int64_t)s.timeout_s * 1000;
        /* a template with start/ready commands: "starting" until ready (a warm instance too:
         * it is handed out only once its ready_cmd passed, below) */
        json_t *run = coved_template_run(d, tenant, s.template_name);
        snprintf(s.state, sizeof(s.state), pooled && !run ? "running" : "starting");
        int ins = d->cat_ops->sandbox_insert(d->cat, &s, err);
        coved_quota_unlock(d); /* the row counts from here on */
        if (ins < 0) {
                struct cove_err e2;
                if (pooled)
                        cove_node_stop(d->node, s.id, 1, &e2); /* releases its uid range */
                else
                        cove_node_uid_release(d->node, s.uid_base);
                json_decref(run);
                cove_sandbox_row_clear(&s);
                return -1;
        }
        if (!pooled) {
                uint8_t key[COVE_FSCRYPT_KEY_LEN];
                int layer_enc = s.storage_encrypted && !is_vm; /* vm: its disk key, below */
                struct coved_disk_key_ctx kc = {.d = d, .tenant = tenant};
                struct cove_instance_spec spec = {
                    .sandbox_id = s.id,
                    .runtime = s.runtime,
                    .rootfs = rootfs,
                    .cpus = (unsigned)s.cpus,
                    .memory_mb = (unsigned)s.memory_mb,
                    .disk_mb = (unsigned)s.disk_mb,
                    .uid_base = s.uid_base,
                    .uid_count = COVE_UID_RANGE,
                    .layer_key = layer_enc ? key : NULL,
                    .disk_encrypted = s.storage_encrypted && is_vm,
                    .disk_key = coved_disk_key_cb,
                    .disk_key_ctx = &kc,
                };
                int started = layer_enc ? coved_layer_key(d, tenant, s.id, key, err) : 0;
                if (started == 0)
                        started = cove_node_start(d->node, &spec, err);
                OPENSSL_cleanse(key, sizeof(key));
                if (started < 0) {
                        struct cove_err e2;
                        cove_node_stop(d->node, s.id, 1, &e2);
                        cove_node_uid_release(d->node, s.uid_base);
                        d->cat_ops->sandbox_delete(d->cat, s.id, &e2);
                        pthread_mutex_lock(&d->mu);
                        d->m.create_failures++;
                        pthread_mutex_unlock(&d->mu);
                        cove_warn(&d->log, "sandbox.create", "%s", err->msg);
                        json_decref(run);
                        cove_sandbox_row_clear(&s);
                        if (err->kind == COVE_E_INTERNAL)
                                err->kind = COVE_E_UNAVAILABLE;
                        return -1;
                }
                snprintf(s.state, sizeof(s.state), run ? "starting" : "running");
                if (!run && coved_cluster_sandbox_update(d, &s, err) != 0) {
                        struct cove_err e2;
                        cove_node_stop(d->node, s.id, 1, &e2);
                        d->cat_ops->sandbox_delete(d->cat, s.id, &e2);
                        cove_sandbox_row_clear(&s);
                        return -1;
                }
        }
        if (eg && coved_egress_attach(d, tenant, s.id, eg, err) < 0) {
                struct cove_err e2;
                cove_node_stop(d->node, s.id, 1, &e2);
                d->cat_ops->sandbox_delete(d->cat, s.id, &e2);
                coved_egress_forget(d, s.id);
                json_decref(run);
                cove_sandbox_row_clear(&s);
                return cove_err_wrap(err, "egress");
        }
        /* start_cmd, then running once ready_cmd passed (egress attached first: the start
         * command may need it); else the sandbox goes whole */
        if (run) {
                int ok = coved_template_start(d, &s, run, err) == 0;
                json_decref(run);
                if (ok) {
                        snprintf(s.state, sizeof(s.state), "running");
                        ok = coved_cluster_sandbox_update(d, &s, err) == 0;
                }
                if (!ok) {
                        struct cove_err e2;
                        cove_node_stop(d->node, s.id, 1, &e2);
                        d->cat_ops->sandbox_delete(d->cat, s.id, &e2);
                        coved_egress_forget(d, s.id);
                        pthread_mutex_lock(&d->mu);
                        d->m.create_failures++;
                        pthread_mutex_unlock(&d->mu);
                        cove_warn(&d->log, "sandbox.create", "sandbox %s: %s", s.id, err->msg);
                        cove_sandbox_row_clear(&s);
                        return -1;
                }
        }
        int64_t dt = cove_mono_ns() - t0;
        pthread_mutex_lock(&d->mu);
        d->m.creates++;
        d->m.create_ns_sum += (uint64_t)dt;
        pthread_cond_broadcast(&d->cv); /* the timer may need an earlier wake-up */
        pthread_mutex_unlock(&d->mu);
        cove_info(&d->log, "sandbox.create", "sandbox %s template %s tenant %s in %.2f ms (%s)",
                  s.id, s.template_name, tenant, (double)dt / 1e6, pooled ? "warm" : "cold");
        coved_audit_control(
            d, tenant, s.id, "create",
            json_pack("{s:s, s:b}", "template", s.template_name, "egress", eg != NULL));
        *out = cove_sandbox_json(&s);
        cove_sandbox_row_clear(&s);
        return 0;
}

int cove_sandbox_start_placed(struct coved *d, const char *id, json_t *egress, json_t **out,
                              struct cove_err *err)
{
        struct cove_sandbox_row s;
        if (cove_sandbox_load(d, NULL, id, &s, err) < 0)
                return -1;
        if (strcmp(s.node, d->node_name) != 0) {
                cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is on node %s, not %s", id,
                              s.node, d->node_name);
                cove_sandbox_row_clear(&s);
                return -1;
        }
        if (!strcmp(s.state, "running") && cove_node_pid(d->node, id) > 0) {
                *out = cove_sandbox_json(&s); /* a retry of a start that ran: done already */
                cove_sandbox_row_clear(&s);
                return 0;
        }
        if (!strcmp(s.state, "paused")) {
                /* it ran here and a restart paused it at its last snapshot: resume that */
                cove_sandbox_row_clear(&s);
                return cove_sandbox_resume(d, NULL, id, NULL, out, err);
        }
        char rootfs[PATH_MAX];
        int r = coved_space_check(d, "create sandbox", err);
        if (r == 0)
                r = template_rootfs(d, &s, rootfs, sizeof(rootfs), err);
        if (r == 0)
                r = coved_key_gate(d, s.tenant, err);
        /* what a crash left of an earlier attempt goes first */
        struct cove_err e2;
        cove_node_stop(d->node, id, 1, &e2);
        s.uid_base = 0;
        if (r == 0)
                r = cove_node_uid_reserve(d->node, &s.uid_base, err);
        if (r < 0) {
                cove_sandbox_row_clear(&s);
                return -1;
        }
        int64_t t0 = cove_mono_ns();
        int is_vm = !strcmp(s.runtime, "vm");
        uint8_t key[COVE_FSCRYPT_KEY_LEN];
        int layer_enc = s.storage_encrypted && !is_vm;
        struct coved_disk_key_ctx kc = {.d = d, .tenant = s.tenant};
        struct cove_instance_spec spec = {
            .sandbox_id = s.id,
            .runtime = s.runtime,
            .rootfs = rootfs,
            .cpus = (unsigned)s.cpus,
            .memory_mb = (unsigned)s.memory_mb,
            .disk_mb = (unsigned)s.disk_mb,
            .uid_base = s.uid_base,
            .uid_count = COVE_UID_RANGE,
            .layer_key = layer_enc ? key : NULL,
            .disk_encrypted = s.storage_encrypted && is_vm,
            .disk_key = coved_disk_key_cb,
            .disk_key_ctx = &kc,
        };
        r = layer_enc ? coved_layer_key(d, s.tenant, s.id, key, err) : 0;
        if (r == 0)
                r = cove_node_start(d->node, &spec, err);
        OPENSSL_cleanse(key, sizeof(key));
        if (r == 0) {
                snprintf(s.state, sizeof(s.state), "running");
                free(s.error);
                s.error = NULL;
                s.expires_at = cove_now_ms() + (int64_t)s.timeout_s * 1000;
                r = coved_cluster_sandbox_update(d, &s, err);
                if (r == 1)
                        r = cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %s was deleted", id);
        }
        if (r == 0 && egress && coved_egress_attach(d, s.tenant, s.id, egress, err) < 0)
                r = cove_err_wrap(err, "egress");
        if (r < 0) {
                cove_node_stop(d->node, s.id, 1, &e2);
                cove_node_uid_release(d->node, s.uid_base);
                coved_egress_forget(d, s.id);
                pthread_mutex_lock(&d->mu);
                d->m.create_failures++;
                pthread_mutex_unlock(&d->mu);
                if (err->kind == COVE_E_INTERNAL)
                        err->kind = COVE_E_UNAVAILABLE;
                cove_sandbox_row_clear(&s);
                return -1;
        }
        int64_t dt = cove_mono_ns() - t0;
        pthread_mutex_lock(&d->mu);
        d->m.creates++;
        d->m.create_ns_sum += (uint64_t)dt;
        pthread_cond_broadcast(&d->cv); /* the timer may need an earlier wake-up */
        pthread_mutex_unlock(&d->mu);
        cove_tm_kick(d);
        cove_info(&d->log, "sandbox.start", "sandbox %s template %s tenant %s started in %.2f ms",
                  s.id, s.template_name, s.tenant, (double)dt / 1e6);
        *out = cove_sandbox_json(&s);
        cove_sandbox_row_clear(&s);
        return 0;
}

int cove_sandbox_metadata_matches(const struct cove_sandbox_row *row, json_t *want)
{
        if (!json_object_size(want))
                return 1;
        json_error_t je;
        json_t *m = json_loads(row->metadata_json ? row->metadata_json : "{}", 0, &je);
        const char *k;
        json_t *v;
        int ok = 1;
        json_object_foreach(want, k, v)
        {
                const char *have = json_string_value(json_object_get(m, k));
                if (!have || !json_is_string(v) || strcmp(have, json_string_value(v)) != 0)
                        ok = 0;
        }
        json_decref(m);
        return ok;
}

int cove_sandbox_load(struct coved *d, const char *tenant, const char *id,
                      struct cove_sandbox_row *row, struct cove_err *err)
{
        memset(row, 0, sizeof(*row));
        int r = d->cat_ops->sandbox_get(d->cat, tenant, id, row, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %.64s not found", id);
        return r;
}

int cove_sandbox_chan(struct coved *d, const char *tenant, const char *id, struct cove_chan **chan,
                      struct cove_sandbox_row *row, struct cove_err *err)
{
        if (cove_sandbox_load(d, tenant, id, row, err) < 0)
                return -1;
        if (!d->node) { /* TODO(cl-fwd): forward to the sandbox's node */
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                              "sandbox %s runs on node %s: this control replica does not forward "
                              "sandbox traffic yet (ask the node)",
                              id, row->node);
                cove_sandbox_row_clear(row);
                return -1;
        }
        int running = strcmp(row->state, "running") == 0;
        *chan = running ? cove_node_chan(d->node, id) : NULL;
        if (!*chan) {
                /* a row still "running" without a channel: its guest just died and the row
                 * is about to say so (on_dead) — the sandbox is unavailable, not in conflict */
                if (running)
                        cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                      "sandbox %s: guest channel closed (instance stopping)", id);
                else if (!strcmp(row->state, "error"))
                        /* its guest died or hung: unavailable, and why (the row's reason) */
                        cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                      "sandbox %s is in state error: %.300s", id,
                                      row->error ? row->error : "instance failed");
                else
                        cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is %s, not running", id,
                                      row->state);
                cove_sandbox_row_clear(row);
                return -1;
        }
        return 0;
}

int cove_sandbox_delete(struct coved *d, const char *tenant, const char *id, int purge,
                        struct cove_err *err)
{
        if (d->role == COVED_ROLE_CONTROL) /* its node stops it (a job) */
                return coved_cluster_delete(d, tenant, id, purge, err);
        int64_t t0 = cove_mono_ns();
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        cove_sandbox_row_clear(&row);
        /* the instance and its state go; snapshots stay (retention thins the rolling ones)
         * unless purge. Its processes are gone when this returns, the rest of the cleanup
         * runs on the node's reaper */
        if (cove_node_kill(d->node, id, 1, err) < 0)
                return -1;
        int64_t t1 = cove_mono_ns();
        int r = d->cat_ops->sandbox_delete(d->cat, id, err);
        if (r < 0)
                return -1;
        if (r == 1) /* a concurrent DELETE removed it first */
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %.64s not found", id);
        coved_egress_forget(d, id);
        coved_leases_forget(d, tenant, id);
        coved_ports_forget(d, tenant, id);
        if (purge && cove_snapshot_purge_sandbox(d, tenant, id, err) < 0)
                return cove_err_wrap(err, "sandbox %s deleted, but purging its snapshots", id);
        pthread_mutex_lock(&d->mu);
        d->m.deletes++;
        pthread_mutex_unlock(&d->mu);
        int64_t t2 = cove_mono_ns();
        cove_info(&d->log, "sandbox.delete",
                  "sandbox %s deleted in %.2f ms (kill %.2f, catalog %.2f)", id,
                  (double)(t2 - t0) / 1e6, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6);
        coved_audit_control(d, tenant, id, "delete", json_pack("{s:b}", "purge", purge != 0));
        return 0;
}

int cove_sandbox_set_timeout(struct coved *d, const char *tenant, const char *id, json_t *body,
                             json_t **out, struct cove_err *err)
{
        int t = -1;
        if (int_field(body, "timeout_s", 1, MAX_TIMEOUT_S, &t, err) < 0)
                return -1;
        if (t < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "timeout_s is required");
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        if (strcmp(row.state, "running") != 0) {
                cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is %s, not running", id,
                              row.state);
                cove_sandbox_row_clear(&row);
                return -1;
        }
        row.timeout_s = t;
        row.expires_at = cove_now_ms() + (int64_t)t * 1000;
        int r = coved_cluster_sandbox_update(d, &row, err);
        if (r == 0)
                *out = cove_sandbox_json(&row);
        else if (r == 1)
                r = cove_err_setk(err, COVE_E_NOT_FOUND, 0, "sandbox %s not found", id);
        cove_sandbox_row_clear(&row);
        pthread_mutex_lock(&d->mu);
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        return r;
}

/* Move a sandbox to a final state after its instance ended. */
static void mark(struct coved *d, const char *id, const char *state, const char *why)
{
        struct cove_sandbox_row row;
        struct cove_err err;
        memset(&row, 0, sizeof(row));
        if (d->cat_ops->sandbox_get(d->cat, NULL, id, &row, &err) != 0)
                return;
        snprintf(row.state, sizeof(row.state), "%s", state);
        free(row.error);
        row.error = why ? strdup(why) : NULL;
        if (coved_cluster_sandbox_update(d, &row, &err) < 0)
                cove_warn(&d->log, "sandbox.state", "sandbox %s: %s", id, err.msg);
        cove_sandbox_row_clear(&row);
}

/* A sandbox whose instance is gone (coved stopped or crashed): paused at its last
 * snapshot when it has one (no instance, uid range or expiry left), stopped otherwise; the
 * error says which, with the caller's words. */
void cove_sandbox_settle(struct coved *d, const char *id, const char *why_paused,
                         const char *why_stopped)
{
        struct cove_sandbox_row row;
        struct cove_err err;
        memset(&row, 0, sizeof(row));
        if (d->cat_ops->sandbox_get(d->cat, NULL, id, &row, &err) != 0)
                return;
        int snap = row.last_snapshot_id[0] != '\0';
        snprintf(row.state, sizeof(row.state), snap ? "paused" : "stopped");
        if (snap) {
                row.uid_base = 0;
                row.expires_at = 0;
        }
        free(row.error);
        row.error = strdup(snap ? why_paused : why_stopped);
        if (coved_cluster_sandbox_update(d, &row, &err) < 0)
                cove_warn(&d->log, "sandbox.state", "sandbox %s: %s", id, err.msg);
        cove_info(&d->log, "sandbox.state", "sandbox %s %s", id, snap ? "paused" : "stopped");
        cove_sandbox_row_clear(&row);
}

void cove_sandbox_stop_purge(struct coved *d, const char *id, const char *why)
{
        struct cove_err err;
        struct cove_sandbox_row row;
        memset(&row, 0, sizeof(row));
        int r = d->cat_ops->sandbox_get(d->cat, NULL, id, &row, &err);
        /* a control replica runs nothing (each node's key sweep stops its own sandboxes);
         * a node stops only its own */
        if (!d->node || (r == 0 && !coved_cluster_mine(d, &row))) {
                cove_sandbox_row_clear(&row);
                return;
        }
        /* a hot pause's frozen instance goes like any (it holds the layer in clear); the
         * sandbox stays paused at its snapshot, which only the key opens */
        cove_tm_hot_drop(d, id, why);
        cove_node_tm_forget(d->ntm, id);
        if (cove_node_stop(d->node, id, 1, &err) < 0)
                cove_warn(&d->log, "sandbox.stop", "%s", err.msg);
        if (r == 0 && strcmp(row.state, "paused") != 0 && strcmp(row.state, "stopped") != 0) {
                row.uid_base = 0;
                row.expires_at = 0;
                snprintf(row.state, sizeof(row.state), "stopped");
                free(row.error);
                row.error = strdup(why);
                if (coved_cluster_sandbox_update(d, &row, &err) < 0)
                        cove_warn(&d->log, "sandbox.stop", "sandbox %s: %s", id, err.msg);
        }
        cove_sandbox_row_clear(&row);
}

void coved_on_instance_dead(void *arg, const char *id, const char *why)
{
        struct coved *d = arg;
        if (cove_tm_hot_has(d, id)) {
                /* a hot pause's frozen instance ended (killed from outside): the sandbox is
                 * paused at its snapshot as before; the sweep ends the hot pause and the
                 * next resume restores from the store */
                cove_info(&d->log, "sandbox.pause",
                          "sandbox %s: the frozen instance of its hot pause ended (%s); it "
                          "stays paused",
                          id, why);
                struct cove_err e2;
                if (cove_node_stop(d->node, id, 0, &e2) < 0)
                        cove_warn(&d->log, "sandbox.pause", "%s", e2.msg);
                return;
        }
        cove_warn(&d->log, "sandbox.dead", "sandbox %s: %s", id, why);
        /* free the host side (cgroups, uid range) now; the row says what happened */
        struct cove_err err;
        if (cove_node_stop(d->node, id, 0, &err) < 0)
                cove_warn(&d->log, "sandbox.dead", "%s", err.msg);
        /* role node: the row is written only while it is this node's, under its lease */
        if (coved_cluster_observe(d, id, "error", NULL, &err) < 0) {
                cove_info(&d->log, "sandbox.dead", "sandbox %s: row left as it is: %s", id,
                          err.msg);
                return;
        }
        mark(d, id, "error", why);
}

struct expire_ctx {
        const struct coved *d;
        int64_t now;
        int64_t next; /* earliest future expiry */
        char (*ids)[64];
        size_t n, cap;
};

static int collect_expired(const struct cove_sandbox_row *row, void *arg)
{
        struct expire_ctx *x = arg;
        if (!row->expires_at || !coved_cluster_mine(x->d, row)) /* role node: its own only */
                return 0;
        if (row->expires_at <= x->now) {
                if (x->n == x->cap) {
                        size_t nc = x->cap ? x->cap * 2 : 16;
                        void *nb = realloc(x->ids, nc * sizeof(*x->ids));
                        if (!nb)
                                return -1;
                        x->ids = nb;
                        x->cap = nc;
                }
                snprintf(x->ids[x->n++], 64, "%s", row->id);
        } else if (!x->next || row->expires_at < x->next) {
                x->next = row->expires_at;
        }
        return 0;
}

/* Timer thread: ends sandboxes whose timeout passed; sleeps until the next expiry or until
 * a create/timeout change wakes it. */
void *coved_timer_main(void *arg)
{
        struct coved *d = arg;
        pthread_mutex_lock(&d->mu);
        while (!d->quitting) {
                pthread_mutex_unlock(&d->mu);
                struct expire_ctx x = {.d = d, .now = cove_now_ms()};
                struct cove_err err;
                /* role node: nothing ends while its lease is not confirmed (next tick) */
                if (coved_cluster_writable(d) &&
                    d->cat_ops->sandbox_list(d->cat, NULL, "running", collect_expired, &x, &err) <
                        0)
                        cove_warn(&d->log, "timer", "%s", err.msg);
                for (size_t i = 0; i < x.n; i++) {
                        struct cove_sandbox_row row;
                        memset(&row, 0, sizeof(row));
                        int pause =
                            d->cat_ops->sandbox_get(d->cat, NULL, x.ids[i], &row, &err) == 0 &&
                            !strcmp(row.on_timeout, "pause");
                        cove_sandbox_row_clear(&row);
                        /* role node: the node's own decision, so the desired state too
                         * (fenced: a sandbox no longer this node's is left alone) */
                        if (coved_cluster_observe(d, x.ids[i], pause ? "pausing" : "stopped",
                                                  pause ? "paused" : "stopped", &err) < 0) {
                                cove_info(&d->log, "sandbox.timeout",
                                          "sandbox %s timed out, left as it is: %s", x.ids[i],
                                          err.msg);
                                continue;
                        }
                        if (pause) {
                                json_t *out = NULL;
                                if (cove_sandbox_pause(d, NULL, x.ids[i], &out, &err) == 0) {
                                        cove_info(&d->log, "sandbox.timeout",
                                                  "sandbox %s timed out: paused", x.ids[i]);
                                        json_decref(out);
                                        continue;
                                }
                                if (err.kind == COVE_E_CONFLICT || err.kind == COVE_E_NOT_FOUND)
                                        continue; /* paused, deleted or busy meanwhile */
                                cove_warn(&d->log, "sandbox.timeout",
                                          "sandbox %s timed out; pause failed, stopping: %s",
                                          x.ids[i], err.msg);
                                struct cove_err e2;
                                if (coved_cluster_observe(d, x.ids[i], "stopped", "stopped", &e2) <
                                    0)
                                        cove_warn(&d->log, "sandbox.timeout", "%s", e2.msg);
                        }
                        cove_info(&d->log, "sandbox.timeout", "sandbox %s timed out: stopping",
                                  x.ids[i]);
                        if (cove_node_stop(d->node, x.ids[i], 0, &err) < 0)
                                cove_warn(&d->log, "sandbox.timeout", "%s", err.msg);
                        mark(d, x.ids[i], "stopped", "timeout reached");
                }
                free(x.ids);
                coved_key_sweep(d); /* keys revoked in a KMS: within the cache TTL */
                pthread_mutex_lock(&d->mu);
                d->m.timeouts_fired += x.n;
                if (d->quitting)
                        break;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                int64_t wait_ms = x.next ? x.next - cove_now_ms() : 60000;
                int64_t ttl = cove_keys_cache_ttl() < 1000 ? 1000 : cove_keys_cache_ttl();
                if (wait_ms > 60000)
                        wait_ms = 60000;
                if (wait_ms > ttl) /* the key sweep's period */
                        wait_ms = ttl;
                /* role node: a control replica changes timeouts without waking this thread */
                if (d->role == COVED_ROLE_NODE && wait_ms > d->lease_renew_ms)
                        wait_ms = d->lease_renew_ms;
                if (wait_ms < 10)
                        wait_ms = 10;
                ts.tv_sec += wait_ms / 1000;
                ts.tv_nsec += (wait_ms % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&d->cv, &d->mu, &ts);
        }
        pthread_mutex_unlock(&d->mu);
        return NULL;
}

struct reconcile_ctx {
        const struct coved *d;
        char (*ids)[64];
        size_t n, cap;
};

static int collect_live(const struct cove_sandbox_row *row, void *arg)
{
        struct reconcile_ctx *x = arg;
        if (!coved_cluster_mine(x->d, row)) /* role node: another node's sandbox */
                return 0;
        if (x->n == x->cap) {
                size_t nc = x->cap ? x->cap * 2 : 16;
                void *nb = realloc(x->ids, nc * sizeof(*x->ids));
                if (!nb)
                        return -1;
                x->ids = nb;
                x->cap = nc;
        }
        snprintf(x->ids[x->n++], 64, "%s", row->id);
        return 0;
}

/* After a crash (or any restart): no instance survives coved (the guest exits when its
 * channel closes), so every sandbox the catalog still calls live is cleaned on the host and
 * marked paused when it has a snapshot to resume from (its last one), else stopped; state
 * dirs that no row owns are removed. */
void coved_reconcile(struct coved *d)
{
        struct reconcile_ctx x = {.d = d};
        struct cove_err err;
        if (d->cat_ops->sandbox_list(d->cat, NULL, "starting,running,pausing,resuming",
                                     collect_live, &x, &err) < 0)
                cove_warn(&d->log, "reconcile", "%s", err.msg);
        for (size_t i = 0; i < x.n; i++) {
                struct cove_sandbox_row row;
                memset(&row, 0, sizeof(row));
                int got = d->cat_ops->sandbox_get(d->cat, NULL, x.ids[i], &row, &err) == 0;
                int snap = got && row.last_snapshot_id[0];
                /* a running one without a snapshot: nothing can run it again, so its desired
                 * state becomes stopped too (with one, a control replica resumes it:
                 * control/nodes.c). A start, pause or resume under way keeps its job's: the
                 * node takes that job back and converges. */
                int settled = got && !snap && !strcmp(row.state, "running");
                cove_sandbox_row_clear(&row);
                /* role node: only a sandbox still placed here, under the live lease (the
                 * fenced observe first); another node's now is left alone */
                if (coved_cluster_observe(d, x.ids[i], snap ? "paused" : "stopped",
                                          settled ? "stopped" : NULL, &err) < 0) {
                        cove_info(&d->log, "reconcile", "sandbox %s left as it is: %s", x.ids[i],
                                  err.msg);
                        continue;
                }
                /* a paused sandbox owns no instance, layer or uid range */
                if (cove_node_stop(d->node, x.ids[i], snap, &err) < 0)
                        cove_warn(&d->log, "reconcile", "%s", err.msg);
                cove_sandbox_settle(d, x.ids[i], "coved restarted: paused at the last snapshot",
                                    "coved restarted: the running instance was lost (no "
                                    "snapshot to resume from)");
        }
        free(x.ids);
        /* Sandboxes already stopped or failed: their host side was cleaned when they stopped,
         * unless that coved died half-way (a layer still mounted, a cgroup left). Cleaning is
         * idempotent and cheap when there is nothing left, so do it again. */
        struct reconcile_ctx y = {.d = d};
        if (d->cat_ops->sandbox_list(d->cat, NULL, "stopped,error", collect_live, &y, &err) < 0)
                cove_warn(&d->log, "reconcile", "%s", err.msg);
        for (size_t i = 0; i < y.n; i++)
                if (cove_node_stop(d->node, y.ids[i], 0, &err) < 0)
                        cove_warn(&d->log, "reconcile", "%s", err.msg);
        free(y.ids);
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/sandboxes", d->data_dir);
        cleanup_dir DIR *dh = opendir(dir);
        struct dirent *de;
        while (dh && (de = readdir(dh))) {
                if (strncmp(de->d_name, "sbx_", 4) != 0)
                        continue;
                struct cove_sandbox_row row;
                memset(&row, 0, sizeof(row));
                int r = d->cat_ops->sandbox_get(d->cat, NULL, de->d_name, &row, &err);
                /* role node: a sandbox placed elsewhere since left its state here */
                if (r == 0 && !coved_cluster_mine(d, &row))
                        r = 1;
                /* a hot pause's frozen instance (control/snapshot.h) outlives a crash: the
                 * sandbox is paused at its snapshot like any, so it goes */
                int hot = r == 0 && !strcmp(row.state, "paused");
                cove_sandbox_row_clear(&row);
                if (hot) {
                        if (cove_node_stop(d->node, de->d_name, 1, &err) < 0)
                                cove_warn(&d->log, "reconcile", "%s", err.msg);
                        else
                                cove_info(&d->log, "reconcile",
                                          "removed the frozen instance of paused sandbox %s",
                                          de->d_name);
                        continue;
                }
                if (r == 1) {
                        if (cove_node_stop(d->node, de->d_name, 1, &err) < 0)
                                cove_warn(&d->log, "reconcile", "%s", err.msg);
                        else
                                cove_info(&d->log, "reconcile", "removed orphan state of %s",
                                          de->d_name);
                }
        }
}
