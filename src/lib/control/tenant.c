/* Tenants, API keys, quotas and data-key operations (control/tenant.h). Key material never
 * leaves crypto/: this file sees statuses, not keys. */
#include "control/tenant.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "control/apikey.h"
#include "control/audit.h"
#include "control/snapshot.h"
#include "crypto/keys.h"
#include "node/tm.h"
#include "util/cleanup.h"
#include "util/util.h"

void coved_keys_dir(const struct coved *d, char *out, size_t cap)
{
        snprintf(out, cap, "%s/keys", d->data_dir);
}

static int kc_get(void *ctx, const char *tenant, char **json, int64_t *gen, struct cove_err *err)
{
        struct coved_keys_cat *k = ctx;
        if (!k->ops->keyrec_get)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "this catalog backend keeps no key records");
        return k->ops->keyrec_get(k->cat, tenant, json, gen, err);
}

static int kc_put(void *ctx, const char *tenant, const char *json, int64_t expect_gen, int64_t *gen,
                  struct cove_err *err)
{
        struct coved_keys_cat *k = ctx;
        if (!k->ops->keyrec_put)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "this catalog backend keeps no key records");
        return k->ops->keyrec_put(k->cat, tenant, json, expect_gen, gen, err);
}

const struct cove_key_store_ops coved_keys_catalog_ops = {.get = kc_get, .put = kc_put};

int coved_keys_open(struct coved *d, const char *default_kek_file, struct cove_err *err)
{
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        int shared = d->cat_ops != &cove_catalog_sqlite;
        if (!shared && default_kek_file)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--default-kek-file is the shared default key of a "
                                     "cluster's key records (--db postgres://…); with the "
                                     "SQLite catalog the node key %s/node.kek is used",
                                     dir);
        if (!shared)
                return 0;
        d->keys_cat.ops = d->cat_ops;
        d->keys_cat.cat = d->cat;
        if (cove_keys_attach(dir, &coved_keys_catalog_ops, &d->keys_cat, default_kek_file, err) < 0)
                return -1;
        d->keys_attached = 1;
        cove_info(&d->log, "coved.start", "key records: in the catalog, default key %s",
                  default_kek_file ? default_kek_file : "<data>/keys/node.kek (this node only)");
        return 0;
}

void coved_keys_close(struct coved *d)
{
        if (!d->keys_attached)
                return;
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        cove_keys_detach(dir);
        d->keys_attached = 0;
}

static void audit(struct coved *d, const char *tenant, const char *kind, const char *action,
                  const char *verdict, const char *actor, json_t *detail)
{
        if (!detail)
                detail = json_object();
        if (actor)
                json_object_set_new(detail, "actor", json_string(actor));
        if (d->audit)
                cove_audit_log(d->audit, tenant, "", kind, action, verdict, detail);
        else
                json_decref(detail);
}

int coved_key_gate(struct coved *d, const char *tenant, struct cove_err *err)
{
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        if (cove_key_check(dir, tenant, 1, err) == 0)
                return 0;
        if (err->kind != COVE_E_KEY_REVOKED && err->kind != COVE_E_BAD_REQUEST)
                err->kind = COVE_E_UNAVAILABLE;
        audit(d, tenant, "key", "unwrap", "deny", NULL,
              json_pack("{s:s}", "error",
                        err->kind == COVE_E_KEY_REVOKED ? "key_revoked" : "unavailable"));
        return -1;
}

/* The tenant's subkeys, with the key gate's error mapping (revoked stays KEY_REVOKED, a
 * KMS or key record that fails is UNAVAILABLE). */
static struct cove_tenant_keys *tenant_keys(struct coved *d, const char *tenant,
                                            struct cove_err *err)
{
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        struct cove_tenant_keys *k = NULL;
        if (cove_tenant_keys_open(dir, tenant, &k, err) < 0) {
                if (err->kind != COVE_E_KEY_REVOKED && err->kind != COVE_E_BAD_REQUEST)
                        err->kind = COVE_E_UNAVAILABLE;
                return NULL;
        }
        return k;
}

int coved_layer_key(struct coved *d, const char *tenant, const char *sandbox_id, uint8_t *out,
                    struct cove_err *err)
{
        struct cove_tenant_keys *k = tenant_keys(d, tenant, err);
        if (!k)
                return -1;
        int rc = cove_fscrypt_key_derive(k, sandbox_id, out, err);
        cove_tenant_keys_free(k);
        return rc;
}

int coved_disk_key(struct coved *d, const char *tenant, const char *disk_id, uint8_t *out,
                   struct cove_err *err)
{
        struct cove_tenant_keys *k = tenant_keys(d, tenant, err);
        if (!k)
                return -1;
        int rc = cove_disk_key_derive(k, disk_id, out, err);
        cove_tenant_keys_free(k);
        return rc;
}

int coved_disk_key_cb(void *ctx, const char *disk_id, uint8_t key[32], struct cove_err *err)
{
        const struct coved_disk_key_ctx *c = ctx;
        return coved_disk_key(c->d, c->tenant, disk_id, key, err);
}

int coved_tenant_byok(struct coved *d, const char *tenant, struct cove_err *err)
{
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        int r = cove_key_tenant_held(dir, tenant, err);
        if (r < 0) {
                err->kind = COVE_E_UNAVAILABLE;
                return cove_err_wrap(err, "tenant %s", tenant);
        }
        return r;
}

int coved_pool_layer_key(void *arg, const char *tenant, const char *sandbox_id, uint8_t *out,
                         struct cove_err *err)
{
        return coved_layer_key(arg, tenant, sandbox_id, out, err);
}

/* ---- quotas ---- */

struct usage {
        int64_t sandboxes, cpus, memory_mb, storage_mb;
};

static int running_state(const char *s)
{
        return !strcmp(s, "starting") || !strcmp(s, "running") || !strcmp(s, "pausing") ||
               !strcmp(s, "resuming");
}

static int add_usage(const struct cove_sandbox_row *row, void *arg)
{
        struct usage *u = arg;
        if (!strcmp(row->state, "stopped") || !strcmp(row->state, "error"))
                return 0;
        u->sandboxes++;
        u->storage_mb += row->disk_mb;
        if (running_state(row->state)) {
                u->cpus += row->cpus;
                u->memory_mb += row->memory_mb;
        }
        return 0;
}

static int usage_of(struct coved *d, const char *tenant, struct usage *u, struct cove_err *err)
{
        memset(u, 0, sizeof(*u));
        return d->cat_ops->sandbox_list(d->cat, tenant, NULL, add_usage, u, err);
}

void coved_quota_lock(struct coved *d)
{
        pthread_mutex_lock(&d->quota_mu);
}

void coved_quota_unlock(struct coved *d)
{
        pthread_mutex_unlock(&d->quota_mu);
}

int coved_quota_admit(struct coved *d, const char *tenant, int sandboxes, int cpus, int memory_mb,
                      int storage_mb, struct cove_err *err)
{
        struct cove_tenant_row t;
        int g = d->cat_ops->tenant_get(d->cat, tenant, &t, err);
        if (g < 0)
                return -1;
        if (g == 1 || t.deleted_at)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "tenant %s not found", tenant);
        if (!t.max_sandboxes && !t.max_cpus && !t.max_memory_mb && !t.max_storage_mb)
                return 0;
        struct usage u;
        if (usage_of(d, tenant, &u, err) < 0)
                return -1;
        const struct {
                const char *name;
                int64_t used, add, max;
        } q[] = {
            {"sandboxes", u.sandboxes, sandboxes, t.max_sandboxes},
            {"cpus", u.cpus, cpus, t.max_cpus},
            {"memory_mb", u.memory_mb, memory_mb, t.max_memory_mb},
            {"storage_mb", u.storage_mb, storage_mb, t.max_storage_mb},
        };
        for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++)
                if (q[i].max > 0 && q[i].add > 0 && q[i].used + q[i].add > q[i].max)
                        return cove_err_setk(err, COVE_E_LIMIT, 0,
                                             "quota %s of tenant %s exceeded: %lld in use + %lld "
                                             "requested > %lld",
                                             q[i].name, tenant, (long long)q[i].used,
                                             (long long)q[i].add, (long long)q[i].max);
        return 0;
}

/* ---- tenants ---- */

static json_t *tenant_json(struct coved *d, const struct cove_tenant_row *t)
{
        char created[40];
        cove_rfc3339(t->created_at, created, sizeof(created));
        struct usage u;
        struct cove_err err;
        if (usage_of(d, t->id, &u, &err) < 0)
                memset(&u, 0, sizeof(u));
        return json_pack("{s:s, s:s, s:s, s:{s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "id",
                         t->id, "name", t->name, "created_at", created, "quotas", "sandboxes",
                         (json_int_t)t->max_sandboxes, "cpus", (json_int_t)t->max_cpus, "memory_mb",
                         (json_int_t)t->max_memory_mb, "storage_mb", (json_int_t)t->max_storage_mb,
                         "usage", "sandboxes", (json_int_t)u.sandboxes, "cpus", (json_int_t)u.cpus,
                         "memory_mb", (json_int_t)u.memory_mb, "storage_mb",
                         (json_int_t)u.storage_mb);
}

/* Apply body.quotas (an object; absent keys keep their value, 0 or null = unlimited). */
static int quotas_apply(json_t *body, struct cove_tenant_row *t, struct cove_err *err)
{
        json_t *q = json_object_get(body, "quotas");
        if (!q || json_is_null(q))
                return 0;
        if (!json_is_object(q))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "quotas must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(q, k, v)
        {
                int64_t *dst = !strcmp(k, "sandboxes")    ? &t->max_sandboxes
                               : !strcmp(k, "cpus")       ? &t->max_cpus
                               : !strcmp(k, "memory_mb")  ? &t->max_memory_mb
                               : !strcmp(k, "storage_mb") ? &t->max_storage_mb
                                                          : NULL;
                if (!dst)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "unknown quota \"%.64s\" (sandboxes, cpus, "
                                             "memory_mb, storage_mb)",
                                             k);
                if (json_is_null(v)) {
                        *dst = 0;
                        continue;
                }
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) > (json_int_t)1 << 40)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "quota %s must be a non-negative integer (0 = "
                                             "unlimited)",
                                             k);
                *dst = json_integer_value(v);
        }
        return 0;
}

static int load_tenant(struct coved *d, const char *id, struct cove_tenant_row *t,
                       struct cove_err *err)
{
        int g = d->cat_ops->tenant_get(d->cat, id, t, err);
        if (g < 0)
                return -1;
        if (g == 1 || t->deleted_at)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "tenant %.64s not found", id);
        return 0;
}

int coved_tenant_create(struct coved *d, const char *actor, json_t *body, json_t **out,
                        struct cove_err *err)
{
        struct cove_tenant_row t;
        memset(&t, 0, sizeof(t));
        json_t *id = json_object_get(body, "id"), *name = json_object_get(body, "name");
        if (id && !json_is_null(id)) {
                if (!json_is_string(id) || !cove_tenant_name_valid(json_string_value(id)))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "id must be 1..63 of [A-Za-z0-9_-]");
                snprintf(t.id, sizeof(t.id), "%s", json_string_value(id));
                struct cove_tenant_row old;
                int g = d->cat_ops->tenant_get(d->cat, t.id, &old, err);
                if (g < 0)
                        return -1;
                if (g == 0)
                        return cove_err_setk(err, COVE_E_CONFLICT, 0, "tenant %s exists%s", t.id,
                                             old.deleted_at ? " (deleted; ids are not reused)"
                                                            : "");
        } else if (cove_id_new("ten_", t.id, sizeof(t.id), err) < 0) {
                return -1;
        }
        if (name && !json_is_null(name)) {
                if (!json_is_string(name) || json_string_length(name) == 0 ||
                    json_string_length(name) >= sizeof(t.name))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "name must be a string of 1..127 bytes");
                snprintf(t.name, sizeof(t.name), "%s", json_string_value(name));
        } else {
                snprintf(t.name, sizeof(t.name), "%s", t.id);
        }
        if (quotas_apply(body, &t, err) < 0)
                return -1;
        t.created_at = cove_now_ms();
        if (d->cat_ops->tenant_put(d->cat, &t, err) < 0)
                return -1;
        audit(d, t.id, "tenant", "create", "allow", actor, json_pack("{s:s}", "name", t.name));
        *out = tenant_json(d, &t);
        return 0;
}

static int add_tenant(const struct cove_tenant_row *t, void *arg)
{
        void **a = arg;
        json_array_append_new(a[1], tenant_json(a[0], t));
        return 0;
}

int coved_tenant_list(struct coved *d, json_t **out, struct cove_err *err)
{
        json_t *arr = json_array();
        void *a[2] = {d, arr};
        if (d->cat_ops->tenant_list(d->cat, add_tenant, a, err) < 0) {
                json_decref(arr);
                return -1;
        }
        *out = json_pack("{s:o}", "tenants", arr);
        return 0;
}

int coved_tenant_get(struct coved *d, const char *id, json_t **out, struct cove_err *err)
{
        struct cove_tenant_row t;
        if (load_tenant(d, id, &t, err) < 0)
                return -1;
        *out = tenant_json(d, &t);
        return 0;
}

int coved_tenant_set_quotas(struct coved *d, const char *actor, const char *id, json_t *body,
                            json_t **out, struct cove_err *err)
{
        struct cove_tenant_row t;
        if (load_tenant(d, id, &t, err) < 0)
                return -1;
        if (!json_object_get(body, "quotas"))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "quotas is required");
        if (quotas_apply(body, &t, err) < 0 || d->cat_ops->tenant_put(d->cat, &t, err) < 0)
                return -1;
        audit(d, t.id, "tenant", "quotas", "allow", actor,
              json_pack("{s:I, s:I, s:I, s:I}", "sandboxes", (json_int_t)t.max_sandboxes, "cpus",
                        (json_int_t)t.max_cpus, "memory_mb", (json_int_t)t.max_memory_mb,
                        "storage_mb", (json_int_t)t.max_storage_mb));
        *out = tenant_json(d, &t);
        return 0;
}

static int count_rows(const struct cove_sandbox_row *row, void *arg)
{
        (void)row;
        (*(int *)arg)++;
        return 0;
}

static int revoke_one(const struct cove_apikey_row *k, void *arg)
{
        void **a = arg;
        struct coved *d = a[0];
        struct cove_err e2;
        if (!k->revoked)
                cove_apikey_revoke(d->cat_ops, d->cat, k->tenant, k->id, &e2);
        return 0;
}

int coved_tenant_delete(struct coved *d, const char *actor, const char *id, struct cove_err *err)
{
        struct cove_tenant_row t;
        if (load_tenant(d, id, &t, err) < 0)
                return -1;
        if (!strcmp(id, "default"))
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "tenant default cannot be deleted");
        int n = 0;
        if (d->cat_ops->sandbox_list(d->cat, id, NULL, count_rows, &n, err) < 0)
                return -1;
        if (n)
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "tenant %s still has %d sandboxes: delete them first", id, n);
        void *a[1] = {d};
        if (d->cat_ops->apikey_list(d->cat, id, revoke_one, a, err) < 0)
                return -1;
        /* crypto-shred: its snapshots stay, unreadable, until retention removes them */
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        struct cove_err e2;
        if (cove_key_revoke(dir, id, NULL, &e2) < 0)
                cove_warn(&d->log, "tenant.delete", "%s", e2.msg);
        if (d->node) /* role control: no pools here */
                cove_node_pool_drop(d->node, id);
        t.deleted_at = cove_now_ms();
        if (d->cat_ops->tenant_put(d->cat, &t, err) < 0)
                return -1;
        audit(d, id, "tenant", "delete", "allow", actor, NULL);
        return 0;
}

/* ---- API keys ---- */

static json_t *apikey_json(const struct cove_apikey_row *k)
{
        char created[40];
        cove_rfc3339(k->created_at, created, sizeof(created));
        return json_pack("{s:s, s:s, s:b, s:b, s:s}", "id", k->id, "tenant", k->tenant, "admin",
                         k->admin, "revoked", k->revoked, "created_at", created);
}

int coved_apikey_issue(struct coved *d, const char *actor, const char *tenant, json_t *body,
                       json_t **out, struct cove_err *err)
{
        struct cove_tenant_row t;
        if (load_tenant(d, tenant, &t, err) < 0)
                return -1;
        json_t *adm = body ? json_object_get(body, "admin") : NULL;
        if (adm && !json_is_boolean(adm) && !json_is_null(adm))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "admin must be a boolean");
        int admin = adm && json_is_true(adm);
        if (admin && strcmp(tenant, "default") != 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "admin keys belong to tenant default");
        char key[COVE_APIKEY_BUF];
        if (cove_apikey_create(d->cat_ops, d->cat, tenant, admin, key, sizeof(key), err) < 0)
                return -1;
        struct cove_apikey_row row;
        memset(&row, 0, sizeof(row));
        memcpy(row.id, key + 5, COVE_APIKEY_ID_LEN);
        snprintf(row.tenant, sizeof(row.tenant), "%s", tenant);
        row.admin = admin;
        row.created_at = cove_now_ms();
        *out = apikey_json(&row);
        json_object_set_new(*out, "key", json_string(key)); /* shown once */
        memset(key, 0, sizeof(key));
        audit(d, tenant, "api_key", "create", "allow", actor,
              json_pack("{s:s, s:b}", "key_id", row.id, "admin", admin));
        return 0;
}

static int add_key(const struct cove_apikey_row *k, void *arg)
{
        json_array_append_new(arg, apikey_json(k));
        return 0;
}

int coved_apikey_list(struct coved *d, const char *tenant, json_t **out, struct cove_err *err)
{
        struct cove_tenant_row t;
        if (load_tenant(d, tenant, &t, err) < 0)
                return -1;
        json_t *arr = json_array();
        if (d->cat_ops->apikey_list(d->cat, tenant, add_key, arr, err) < 0) {
                json_decref(arr);
                return -1;
        }
        *out = json_pack("{s:o}", "api_keys", arr);
        return 0;
}

int coved_apikey_revoke(struct coved *d, const char *actor, const char *tenant, const char *id,
                        struct cove_err *err)
{
        struct cove_tenant_row t;
        if (load_tenant(d, tenant, &t, err) < 0)
                return -1;
        if (actor && !strcmp(actor, id))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "a key cannot revoke itself here; use another admin key");
        int r = cove_apikey_revoke(d->cat_ops, d->cat, tenant, id, err);
        if (r < 0)
                return -1;
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "api key %.64s not found", id);
        audit(d, tenant, "api_key", "revoke", "allow", actor, json_pack("{s:s}", "key_id", id));
        return 0;
}

/* ---- data keys ---- */

static json_t *key_json(const struct cove_key_status *s)
{
        char created[40], rotated[40], revoked[40], cached[40];
        cove_rfc3339(s->rec.created_at, created, sizeof(created));
        cove_rfc3339(s->rec.rotated_at, rotated, sizeof(rotated));
        cove_rfc3339(s->rec.revoked_at, revoked, sizeof(revoked));
        cove_rfc3339(s->cached_at, cached, sizeof(cached));
        if (!s->exists)
                return json_pack("{s:s, s:s, s:s, s:n, s:i, s:b, s:I}", "tenant", s->rec.tenant,
                                 "state", "none", "provider", "local", "key_id", "version", 0,
                                 "cached", 0, "cache_ttl_ms", (json_int_t)s->cache_ttl_ms);
        json_t *o =
            json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:o, s:o, s:b, s:o, s:I}", "tenant",
                      s->rec.tenant, "state", s->rec.state, "provider", s->rec.provider, "key_id",
                      s->rec.key_id, "version", s->rec.version, "created_at", created, "rotated_at",
                      s->rec.rotated_at ? json_string(rotated) : json_null(), "revoked_at",
                      s->rec.revoked_at ? json_string(revoked) : json_null(), "cached", s->cached,
                      "cached_at", s->cached ? json_string(cached) : json_null(), "cache_ttl_ms",
                      (json_int_t)s->cache_ttl_ms);
        /* where the KEK is: the file's path or the commands (operator data, admin-visible) */
        if (o && !strcmp(s->rec.provider, "local"))
                json_object_set_new(
                    o, "key_file", s->rec.key_file[0] ? json_string(s->rec.key_file) : json_null());
        if (o && !strcmp(s->rec.provider, "command")) {
                json_object_set_new(o, "wrap_cmd", json_string(s->rec.wrap_cmd));
                json_object_set_new(o, "unwrap_cmd", json_string(s->rec.unwrap_cmd));
        }
        return o;
}

static int tenant_live(struct coved *d, const char *tenant, struct cove_err *err)
{
        struct cove_tenant_row t;
        return load_tenant(d, tenant, &t, err);
}

int coved_key_status(struct coved *d, const char *tenant, json_t **out, struct cove_err *err)
{
        if (tenant_live(d, tenant, err) < 0)
                return -1;
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        struct cove_key_status s;
        if (cove_key_status_get(dir, tenant, &s, err) < 0)
                return -1;
        *out = key_json(&s);
        return 0;
}

static int add_key_status(const struct cove_tenant_row *t, void *arg)
{
        void **a = arg;
        struct coved *d = a[0];
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        struct cove_key_status s;
        struct cove_err err;
        if (cove_key_status_get(dir, t->id, &s, &err) == 0)
                json_array_append_new(a[1], key_json(&s));
        else
                json_array_append_new(a[1], json_pack("{s:s, s:s, s:s}", "tenant", t->id, "state",
                                                      "error", "error", err.msg));
        return 0;
}

int coved_key_list(struct coved *d, json_t **out, struct cove_err *err)
{
        json_t *arr = json_array();
        void *a[2] = {d, arr};
        if (d->cat_ops->tenant_list(d->cat, add_key_status, a, err) < 0) {
                json_decref(arr);
                return -1;
        }
        *out = json_pack("{s:o}", "keys", arr);
        return 0;
}

static const char *opt_str(json_t *body, const char *k, int *bad)
{
        json_t *v = json_object_get(body, k);
        if (!v || json_is_null(v))
                return NULL;
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
                *bad = 1;
                return NULL;
        }
        return json_string_value(v);
}

int coved_key_rewrap(struct coved *d, const char *actor, const char *tenant, json_t *body,
                     int rotate, json_t **out, struct cove_err *err)
{
        if (tenant_live(d, tenant, err) < 0)
                return -1;
        int bad = 0;
        struct cove_key_spec spec = {
            .provider = opt_str(body, "provider", &bad),
            .key_file = opt_str(body, "key_file", &bad),
            .wrap_cmd = opt_str(body, "wrap_cmd", &bad),
            .unwrap_cmd = opt_str(body, "unwrap_cmd", &bad),
            .key_id = opt_str(body, "key_id", &bad),
        };
        json_t *to = json_object_get(body, "timeout_ms");
        if (to && !json_is_null(to)) {
                if (!json_is_integer(to))
                        bad = 1;
                else
                        spec.timeout_ms = (int)json_integer_value(to);
        }
        if (bad)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "provider, key_file, wrap_cmd, unwrap_cmd, key_id must be "
                                     "strings, timeout_ms an integer");
        if (!rotate && !spec.provider)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "provider is required (local or command)");
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        struct cove_key_status s;
        const char *action = rotate ? "rotate" : "add";
        if (cove_key_rewrap(dir, tenant, spec.provider ? &spec : NULL, &s, err) < 0) {
                if (err->kind == COVE_E_INTERNAL)
                        err->kind = COVE_E_UNAVAILABLE;
                audit(d, tenant, "key", action, "deny", actor,
                      json_pack("{s:s}", "provider", spec.provider ? spec.provider : ""));
                return -1;
        }
        audit(d, tenant, "key", action, "allow", actor,
              json_pack("{s:s, s:s, s:i}", "provider", s.rec.provider, "key_id", s.rec.key_id,
                        "version", s.rec.version));
        cove_info(&d->log, "key", "tenant %s: key %s (%s %s, version %d)", tenant,
                  rotate ? "rotated" : "added", s.rec.provider, s.rec.key_id, s.rec.version);
        *out = key_json(&s);
        return 0;
}

struct stop_ctx {
        char (*ids)[64];
        size_t n, cap;
        int all; /* 1: every sandbox (purge host state); 0: only running ones; -1: the others */
};

static int collect_stop(const struct cove_sandbox_row *row, void *arg)
{
        struct stop_ctx *x = arg;
        if ((x->all == 0 && !running_state(row->state)) ||
            (x->all < 0 && running_state(row->state)))
                return 0;
        if (x->n == x->cap) {
                size_t nc = x->cap ? 2 * x->cap : 16;
                void *nb = realloc(x->ids, nc * sizeof(*x->ids));
                if (!nb)
                        return -1;
                x->ids = nb;
                x->cap = nc;
        }
        snprintf(x->ids[x->n++], 64, "%s", row->id);
        return 0;
}

/* Freed blocks of the layer filesystem (the XFS image that holds every writable layer)
 * still hold what was written there until overwritten: discard them (the loop device
 * punches holes in layerfs.img), so removed layers leave no plaintext in the data dir. */
/* 1 while a loop device is still backed by a removed image on the layer filesystem (a
 * lazily unmounted layer, or a snapshot's clone, lets go of its autoclear loop device, and
 * with it the image's blocks, only when the last user of the mount is gone). */
static int loops_busy(const char *lfs)
{
        cleanup_dir DIR *dh = opendir("/sys/block");
        struct dirent *de;
        size_t ll = strlen(lfs);
        while (dh && (de = readdir(dh))) {
                if (strncmp(de->d_name, "loop", 4) != 0)
                        continue;
                char p[PATH_MAX];
                snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
                cleanup_free char *txt = NULL;
                size_t len = 0;
                if (cove_read_file(p, PATH_MAX, &txt, &len, NULL) < 0)
                        continue;
                if (!strncmp(txt, lfs, ll) && txt[ll] == '/' && strstr(txt, "(deleted)"))
                        return 1;
        }
        return 0;
}

static void trim_layers(struct coved *d)
{
        char lfs[PATH_MAX];
        snprintf(lfs, sizeof(lfs), "%s/ns/lfs", d->data_dir);
        int fd = open(lfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return;
        /* The last close of a removed image frees its blocks late: the loop device lets go of
         * the file when the last user of its mount is gone, then XFS frees the extents in its
         * background inode GC, which nothing but a freeze waits for (statfs and syncfs only
         * kick it). So each round: await the loop devices, freeze and thaw (the freeze drains
         * the inode GC; writers to the layers block for those few ms; a coved killed in
         * between is thawed by the next start), make the frees durable (XFS does not trim
         * extents still busy in its log) and trim. Repeat until a round found nothing newly
         * freed (a file the kernel closed from a worker is put a tick later). */
        int64_t deadline = cove_mono_ns() + 10 * 1000000000LL;
        uint64_t prev = 0;
        for (int round = 0; round < 10; round++) {
                while (loops_busy(lfs) && cove_mono_ns() < deadline) {
                        struct timespec ts = {0, 10 * 1000000};
                        nanosleep(&ts, NULL);
                }
                if (ioctl(fd, FIFREEZE, 0) == 0)
                        ioctl(fd, FITHAW, 0);
                struct statfs a;
                if (fstatfs(fd, &a) < 0 || (round > 0 && (uint64_t)a.f_bfree <= prev))
                        break;
                prev = (uint64_t)a.f_bfree;
                syncfs(fd);
                struct fstrim_range r = {.start = 0, .len = UINT64_MAX, .minlen = 0};
                if (ioctl(fd, FITRIM, &r) < 0) {
                        if (errno != ENOTTY && errno != EOPNOTSUPP)
                                cove_warn(&d->log, "key.revoke", "trim %s: %s", lfs,
                                          strerror(errno));
                        break;
                }
                struct timespec ts = {0, 20 * 1000000};
                nanosleep(&ts, NULL);
        }
        close(fd);
}

/* The stop policy: every sandbox of tenant loses its instance and host state (working
 * storage); rows that were live say why. Returns how many there were. */
static int stop_tenant(struct coved *d, const char *tenant, const char *why)
{
        struct stop_ctx x = {.all = 1};
        struct cove_err err;
        if (d->cat_ops->sandbox_list(d->cat, tenant, NULL, collect_stop, &x, &err) < 0)
                cove_warn(&d->log, "key.revoke", "%s", err.msg);
        for (size_t i = 0; i < x.n; i++)
                cove_sandbox_stop_purge(d, x.ids[i], why);
        trim_layers(d);
        free(x.ids);
        return (int)x.n;
}

/* The finish policy: the running sandboxes go on, but what the others left in clear on
 * this node goes (a hot pause's frozen copy, kept layer images): their snapshots need the
 * key like any. */
static void drop_idle_copies(struct coved *d, const char *tenant, const char *why)
{
        struct stop_ctx x = {.all = -1};
        struct cove_err err;
        if (!d->node)
                return;
        if (d->cat_ops->sandbox_list(d->cat, tenant, NULL, collect_stop, &x, &err) < 0)
                cove_warn(&d->log, "key.revoke", "%s", err.msg);
        for (size_t i = 0; i < x.n; i++) {
                cove_tm_hot_drop(d, x.ids[i], why);
                cove_node_tm_forget(d->ntm, x.ids[i]);
        }
        if (x.n)
                trim_layers(d);
        free(x.ids);
}

int coved_key_revoke(struct coved *d, const char *actor, const char *tenant, json_t *body,
                     json_t **out, struct cove_err *err)
{
        if (tenant_live(d, tenant, err) < 0)
                return -1;
        const char *policy = "stop";
        json_t *pv = body ? json_object_get(body, "policy") : NULL;
        if (pv && !json_is_null(pv)) {
                if (!json_is_string(pv) || (strcmp(json_string_value(pv), "stop") &&
                                            strcmp(json_string_value(pv), "finish")))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "policy must be \"stop\" or \"finish\"");
                policy = json_string_value(pv);
        }
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        struct cove_key_status s;
        int r = cove_key_revoke(dir, tenant, &s, err);
        if (r < 0)
                return -1;
        int stopped = 0;
        /* its warm instances (keyed for it, no data yet) go whatever the policy */
        if (d->node) /* role control: no pools here */
                cove_node_pool_drop(d->node, tenant);
        if (!strcmp(policy, "stop"))
                stopped = stop_tenant(d, tenant, "the tenant's key was revoked");
        else
                drop_idle_copies(d, tenant, "the tenant's key was revoked");
        audit(d, tenant, "key", "revoke", "allow", actor,
              json_pack("{s:s, s:s, s:i, s:b}", "policy", policy, "key_id", s.rec.key_id,
                        "sandboxes_stopped", stopped, "already", r == 1));
        cove_info(&d->log, "key", "tenant %s: key revoked (policy %s, %d sandboxes stopped)",
                  tenant, policy, stopped);
        *out = key_json(&s);
        json_object_set_new(*out, "policy", json_string(policy));
        json_object_set_new(*out, "sandboxes_stopped", json_integer(stopped));
        return 0;
}

struct sweep_ctx {
        char (*tenants)[64];
        size_t n, cap;
};

static int collect_tenant(const struct cove_sandbox_row *row, void *arg)
{
        struct sweep_ctx *x = arg;
        for (size_t i = 0; i < x->n; i++)
                if (!strcmp(x->tenants[i], row->tenant))
                        return 0;
        if (x->n == x->cap) {
                size_t nc = x->cap ? 2 * x->cap : 16;
                void *nb = realloc(x->tenants, nc * sizeof(*x->tenants));
                if (!nb)
                        return -1;
                x->tenants = nb;
                x->cap = nc;
        }
        snprintf(x->tenants[x->n++], 64, "%s", row->tenant);
        return 0;
}

void coved_key_sweep(struct coved *d)
{
        int64_t now = cove_mono_ns() / 1000000, ttl = cove_keys_cache_ttl();
        if (ttl < 1000)
                ttl = 1000;
        if (d->key_sweep_at && now - d->key_sweep_at < ttl)
                return;
        d->key_sweep_at = now;
        struct sweep_ctx x = {0};
        struct cove_err err;
        if (d->cat_ops->sandbox_list(d->cat, NULL, "running", collect_tenant, &x, &err) < 0)
                cove_warn(&d->log, "key.sweep", "%s", err.msg);
        char dir[PATH_MAX];
        coved_keys_dir(d, dir, sizeof(dir));
        for (size_t i = 0; i < x.n; i++) {
                if (cove_key_check(dir, x.tenants[i], 1, &err) == 0 ||
                    err.kind != COVE_E_KEY_REVOKED)
                        continue; /* a KMS that is only unreachable does not stop sandboxes */
                if (d->node)      /* role control: no pools here */
                        cove_node_pool_drop(d->node, x.tenants[i]);
                int n = stop_tenant(d, x.tenants[i], "the tenant's key was revoked in its KMS");
                audit(d, x.tenants[i], "key", "revoked_upstream", "deny", NULL,
                      json_pack("{s:i}", "sandboxes_stopped", n));
                cove_warn(&d->log, "key.sweep", "tenant %s: %s; %d sandboxes stopped", x.tenants[i],
                          err.msg, n);
        }
        free(x.tenants);
}
