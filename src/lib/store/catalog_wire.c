/* Catalog rows as JSON, decoded as untrusted input (store/catalog_wire.h). */
#include "store/catalog_wire.h"

#include <stdlib.h>
#include <string.h>

static int bad(struct cove_err *err, const char *key, const char *why)
{
        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "catalog wire: \"%s\" %s", key, why);
}

/* the member as a NUL-free string of fewer than cap bytes, NULL when missing/null */
static int get_string(const json_t *o, const char *key, const char **out, size_t cap, int required,
                      struct cove_err *err)
{
        *out = NULL;
        json_t *v = json_is_object(o) ? json_object_get(o, key) : NULL;
        if (!v || json_is_null(v))
                return required ? bad(err, key, "is missing") : 0;
        if (!json_is_string(v))
                return bad(err, key, "is not a string");
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (strlen(s) != n)
                return bad(err, key, "holds a NUL byte");
        if (n >= cap)
                return bad(err, key, "is too long");
        *out = s;
        return 0;
}

int cove_wire_str(const json_t *o, const char *key, char *buf, size_t cap, int required,
                  struct cove_err *err)
{
        const char *s;
        if (get_string(o, key, &s, cap, required, err) < 0)
                return -1;
        size_t n = s ? strlen(s) : 0;
        if (n)
                memcpy(buf, s, n);
        buf[n] = '\0';
        return 0;
}

int cove_wire_opt(const json_t *o, const char *key, const char **out, size_t cap,
                  struct cove_err *err)
{
        return get_string(o, key, out, cap, 0, err);
}

int cove_wire_i64(const json_t *o, const char *key, int64_t *v, int64_t min, int64_t max,
                  int required, struct cove_err *err)
{
        json_t *j = json_is_object(o) ? json_object_get(o, key) : NULL;
        if (!j || json_is_null(j)) {
                if (required)
                        return bad(err, key, "is missing");
                *v = 0;
                return 0;
        }
        if (!json_is_integer(j))
                return bad(err, key, "is not an integer");
        json_int_t x = json_integer_value(j);
        if (x < min || x > max)
                return bad(err, key, "is out of range");
        *v = (int64_t)x;
        return 0;
}

int cove_wire_bool(const json_t *o, const char *key, int *v, int required, struct cove_err *err)
{
        json_t *j = json_is_object(o) ? json_object_get(o, key) : NULL;
        if (!j || json_is_null(j)) {
                if (required)
                        return bad(err, key, "is missing");
                *v = 0;
                return 0;
        }
        if (!json_is_boolean(j))
                return bad(err, key, "is not a boolean");
        *v = json_is_true(j);
        return 0;
}

int cove_wire_text(const json_t *o, const char *key, char **out, size_t max, int required,
                   struct cove_err *err)
{
        const char *s;
        *out = NULL;
        if (get_string(o, key, &s, max, required, err) < 0)
                return -1;
        if (!s)
                return 0;
        *out = strdup(s);
        if (!*out)
                return cove_err_set(err, 12, "catalog wire: \"%s\"", key);
        return 0;
}

#define STR(o, k, f, req)                                                                          \
        do {                                                                                       \
                if (cove_wire_str((o), (k), (f), sizeof(f), (req), err) < 0)                       \
                        goto fail;                                                                 \
        } while (0)
#define I64(o, k, f, lo, hi)                                                                       \
        do {                                                                                       \
                int64_t v_;                                                                        \
                if (cove_wire_i64((o), (k), &v_, (lo), (hi), 0, err) < 0)                          \
                        goto fail;                                                                 \
                (f) = v_;                                                                          \
        } while (0)
#define I64R(o, k, f, lo, hi) /* required */                                                       \
        do {                                                                                       \
                int64_t v_;                                                                        \
                if (cove_wire_i64((o), (k), &v_, (lo), (hi), 1, err) < 0)                          \
                        goto fail;                                                                 \
                (f) = v_;                                                                          \
        } while (0)
#define BOOL(o, k, f)                                                                              \
        do {                                                                                       \
                if (cove_wire_bool((o), (k), &(f), 0, err) < 0)                                    \
                        goto fail;                                                                 \
        } while (0)
#define TEXT(o, k, f)                                                                              \
        do {                                                                                       \
                if (cove_wire_text((o), (k), &(f), COVE_WIRE_TEXT_MAX, 0, err) < 0)                \
                        goto fail;                                                                 \
        } while (0)

static int need_object(const json_t *o, const char *what, struct cove_err *err)
{
        return json_is_object(o) ? 0 : bad(err, what, "is not an object");
}

json_t *cove_wire_tenant(const struct cove_tenant_row *t)
{
        return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "id", t->id, "name", t->name,
                         "created_at", (json_int_t)t->created_at, "max_sandboxes",
                         (json_int_t)t->max_sandboxes, "max_cpus", (json_int_t)t->max_cpus,
                         "max_memory_mb", (json_int_t)t->max_memory_mb, "max_storage_mb",
                         (json_int_t)t->max_storage_mb, "deleted_at", (json_int_t)t->deleted_at);
}

int cove_wire_tenant_from(const json_t *o, struct cove_tenant_row *t, struct cove_err *err)
{
        struct cove_tenant_row x = {0};
        if (need_object(o, "tenant", err) < 0)
                return -1;
        STR(o, "id", x.id, 1);
        STR(o, "name", x.name, 0);
        I64(o, "created_at", x.created_at, 0, INT64_MAX);
        I64(o, "max_sandboxes", x.max_sandboxes, 0, INT64_MAX);
        I64(o, "max_cpus", x.max_cpus, 0, INT64_MAX);
        I64(o, "max_memory_mb", x.max_memory_mb, 0, INT64_MAX);
        I64(o, "max_storage_mb", x.max_storage_mb, 0, INT64_MAX);
        I64(o, "deleted_at", x.deleted_at, 0, INT64_MAX);
        *t = x;
        return 0;
fail:
        return -1;
}

json_t *cove_wire_apikey(const struct cove_apikey_row *k)
{
        return json_pack("{s:s, s:s, s:s, s:s, s:b, s:b, s:I}", "id", k->id, "tenant", k->tenant,
                         "salt_hex", k->salt_hex, "hash_hex", k->hash_hex, "admin", k->admin,
                         "revoked", k->revoked, "created_at", (json_int_t)k->created_at);
}

int cove_wire_apikey_from(const json_t *o, struct cove_apikey_row *k, struct cove_err *err)
{
        struct cove_apikey_row x = {0};
        if (need_object(o, "key", err) < 0)
                return -1;
        STR(o, "id", x.id, 1);
        STR(o, "tenant", x.tenant, 1);
        STR(o, "salt_hex", x.salt_hex, 0);
        STR(o, "hash_hex", x.hash_hex, 0);
        BOOL(o, "admin", x.admin);
        BOOL(o, "revoked", x.revoked);
        I64(o, "created_at", x.created_at, 0, INT64_MAX);
        *k = x;
        return 0;
fail:
        return -1;
}

json_t *cove_wire_sandbox(const struct cove_sandbox_row *s)
{
        json_t *o = json_pack(
            "{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:i, s:i, s:i, s:s, s:I, s:s, s:s, s:i, "
            "s:b}",
            "id", s->id, "tenant", s->tenant, "state", s->state, "template_name", s->template_name,
            "runtime", s->runtime, "created_at", (json_int_t)s->created_at, "expires_at",
            (json_int_t)s->expires_at, "cpus", s->cpus, "memory_mb", s->memory_mb, "disk_mb",
            s->disk_mb, "timeout_s", s->timeout_s, "on_timeout", s->on_timeout, "uid_base",
            (json_int_t)s->uid_base, "node", s->node, "last_snapshot_id", s->last_snapshot_id,
            "snapshot_interval_s", s->snapshot_interval_s, "storage_encrypted",
            s->storage_encrypted);
        if (!o)
                return NULL;
        const char *names[] = {"metadata_json", "env_json", "error", "retention_json"};
        const char *vals[] = {s->metadata_json, s->env_json, s->error, s->retention_json};
        for (int i = 0; i < 4; i++)
                json_object_set_new(o, names[i], vals[i] ? json_string(vals[i]) : json_null());
        return o;
}

int cove_wire_sandbox_from(const json_t *o, struct cove_sandbox_row *s, struct cove_err *err)
{
        struct cove_sandbox_row x = {0};
        if (need_object(o, "sandbox", err) < 0)
                return -1;
        STR(o, "id", x.id, 1);
        STR(o, "tenant", x.tenant, 1);
        STR(o, "state", x.state, 1);
        STR(o, "template_name", x.template_name, 0);
        STR(o, "runtime", x.runtime, 0);
        I64(o, "created_at", x.created_at, 0, INT64_MAX);
        I64(o, "expires_at", x.expires_at, 0, INT64_MAX);
        I64(o, "cpus", x.cpus, 0, INT32_MAX);
        I64(o, "memory_mb", x.memory_mb, 0, INT32_MAX);
        I64(o, "disk_mb", x.disk_mb, 0, INT32_MAX);
        I64(o, "timeout_s", x.timeout_s, 0, INT32_MAX);
        STR(o, "on_timeout", x.on_timeout, 0);
        I64(o, "uid_base", x.uid_base, 0, UINT32_MAX);
        STR(o, "node", x.node, 0);
        STR(o, "last_snapshot_id", x.last_snapshot_id, 0);
        I64(o, "snapshot_interval_s", x.snapshot_interval_s, 0, INT32_MAX);
        BOOL(o, "storage_encrypted", x.storage_encrypted);
        TEXT(o, "metadata_json", x.metadata_json);
        TEXT(o, "env_json", x.env_json);
        TEXT(o, "error", x.error);
        TEXT(o, "retention_json", x.retention_json);
        if (!cove_sandbox_state_valid(x.state, strlen(x.state))) {
                bad(err, "state", "is not a sandbox state");
                goto fail;
        }
        *s = x;
        return 0;
fail:
        cove_sandbox_row_clear(&x);
        return -1;
}

json_t *cove_wire_snapshot(const struct cove_snapshot_row *s)
{
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:I, s:b}", "id", s->id,
                         "tenant", s->tenant, "sandbox_id", s->sandbox_id, "parent_id",
                         s->parent_id, "kind", s->kind, "created_at", (json_int_t)s->created_at,
                         "label", s->label, "size_bytes", (json_int_t)s->size_bytes, "new_bytes",
                         (json_int_t)s->new_bytes, "pause_us", (json_int_t)s->pause_us, "rolling",
                         s->rolling);
}

int cove_wire_snapshot_from(const json_t *o, struct cove_snapshot_row *s, struct cove_err *err)
{
        struct cove_snapshot_row x = {0};
        if (need_object(o, "snapshot", err) < 0)
                return -1;
        STR(o, "id", x.id, 1);
        STR(o, "tenant", x.tenant, 1);
        STR(o, "sandbox_id", x.sandbox_id, 0);
        STR(o, "parent_id", x.parent_id, 0);
        STR(o, "kind", x.kind, 0);
        I64(o, "created_at", x.created_at, 0, INT64_MAX);
        STR(o, "label", x.label, 0);
        I64(o, "size_bytes", x.size_bytes, 0, INT64_MAX);
        I64(o, "new_bytes", x.new_bytes, 0, INT64_MAX);
        I64(o, "pause_us", x.pause_us, 0, INT64_MAX);
        BOOL(o, "rolling", x.rolling);
        *s = x;
        return 0;
fail:
        return -1;
}

static int hex64(const char *h)
{
        if (strlen(h) != 64)
                return 0;
        for (; *h; h++)
                if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f')))
                        return 0;
        return 1;
}

json_t *cove_wire_audit(const struct cove_audit_row *a)
{
        return json_pack("{s:I, s:I, s:s, s:s, s:s, s:s, s:s, s:s?, s:s, s:s}", "seq",
                         (json_int_t)a->seq, "at", (json_int_t)a->at, "tenant", a->tenant,
                         "sandbox", a->sandbox, "kind", a->kind, "action", a->action, "verdict",
                         a->verdict, "detail_json", a->detail_json, "prev_hash", a->prev_hash,
                         "hash", a->hash);
}

int cove_wire_audit_from(const json_t *o, struct cove_audit_row *a, struct cove_err *err)
{
        struct cove_audit_row x = {0};
        if (need_object(o, "audit event", err) < 0)
                return -1;
        I64R(o, "seq", x.seq, 1, INT64_MAX);
        I64(o, "at", x.at, 0, INT64_MAX);
        STR(o, "tenant", x.tenant, 1);
        STR(o, "sandbox", x.sandbox, 0);
        STR(o, "kind", x.kind, 0);
        STR(o, "action", x.action, 0);
        STR(o, "verdict", x.verdict, 0);
        STR(o, "prev_hash", x.prev_hash, 1);
        STR(o, "hash", x.hash, 1);
        if (!hex64(x.prev_hash) || !hex64(x.hash)) {
                bad(err, "hash", "is not 64 hex digits");
                goto fail;
        }
        TEXT(o, "detail_json", x.detail_json);
        *a = x;
        return 0;
fail:
        return -1;
}

json_t *cove_wire_node(const struct cove_node_row *n)
{
        return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:I, s:s}",
                         "name", n->name, "state", n->state, "epoch", (json_int_t)n->epoch,
                         "lease_expires_at", (json_int_t)n->lease_expires_at, "cpus",
                         (json_int_t)n->cpus, "memory_mb", (json_int_t)n->memory_mb, "disk_mb",
                         (json_int_t)n->disk_mb, "alloc_cpus", (json_int_t)n->alloc_cpus,
                         "alloc_memory_mb", (json_int_t)n->alloc_memory_mb, "alloc_disk_mb",
                         (json_int_t)n->alloc_disk_mb, "address", n->address, "last_seen",
                         (json_int_t)n->last_seen, "features", n->features);
}

int cove_wire_node_from(const json_t *o, struct cove_node_row *n, struct cove_err *err)
{
        struct cove_node_row x = {0};
        if (need_object(o, "node", err) < 0)
                return -1;
        STR(o, "name", x.name, 1);
        STR(o, "state", x.state, 0);
        I64(o, "epoch", x.epoch, 0, INT64_MAX);
        I64(o, "lease_expires_at", x.lease_expires_at, 0, INT64_MAX);
        I64(o, "cpus", x.cpus, 0, INT64_MAX);
        I64(o, "memory_mb", x.memory_mb, 0, INT64_MAX);
        I64(o, "disk_mb", x.disk_mb, 0, INT64_MAX);
        I64(o, "alloc_cpus", x.alloc_cpus, 0, INT64_MAX);
        I64(o, "alloc_memory_mb", x.alloc_memory_mb, 0, INT64_MAX);
        I64(o, "alloc_disk_mb", x.alloc_disk_mb, 0, INT64_MAX);
        STR(o, "address", x.address, 0);
        I64(o, "last_seen", x.last_seen, 0, INT64_MAX);
        STR(o, "features", x.features, 0);
        *n = x;
        return 0;
fail:
        return -1;
}

json_t *cove_wire_placement(const struct cove_placement_row *p)
{
        return json_pack("{s:s, s:s, s:I, s:s, s:s, s:I}", "sandbox_id", p->sandbox_id, "node",
                         p->node, "generation", (json_int_t)p->generation, "desired_state",
                         p->desired_state, "observed_state", p->observed_state, "updated_at",
                         (json_int_t)p->updated_at);
}

int cove_wire_placement_from(const json_t *o, struct cove_placement_row *p, struct cove_err *err)
{
        struct cove_placement_row x = {0};
        if (need_object(o, "placement", err) < 0)
                return -1;
        STR(o, "sandbox_id", x.sandbox_id, 1);
        STR(o, "node", x.node, 0);
        I64(o, "generation", x.generation, 0, INT64_MAX);
        STR(o, "desired_state", x.desired_state, 0);
        STR(o, "observed_state", x.observed_state, 0);
        I64(o, "updated_at", x.updated_at, 0, INT64_MAX);
        *p = x;
        return 0;
fail:
        return -1;
}

json_t *cove_wire_job(const struct cove_job_row *j)
{
        return json_pack("{s:I, s:s, s:s, s:I, s:s, s:s, s:I, s:s?, s:I, s:I, s:s?}", "id",
                         (json_int_t)j->id, "sandbox_id", j->sandbox_id, "kind", j->kind,
                         "generation", (json_int_t)j->generation, "state", j->state, "claimed_by",
                         j->claimed_by, "claimed_epoch", (json_int_t)j->claimed_epoch,
                         "result_json", j->result_json, "created_at", (json_int_t)j->created_at,
                         "updated_at", (json_int_t)j->updated_at, "args_json", j->args_json);
}

int cove_wire_job_from(const json_t *o, struct cove_job_row *j, struct cove_err *err)
{
        struct cove_job_row x = {0};
        if (need_object(o, "job", err) < 0)
                return -1;
        I64R(o, "id", x.id, 1, INT64_MAX);
        STR(o, "sandbox_id", x.sandbox_id, 1);
        STR(o, "kind", x.kind, 0);
        I64(o, "generation", x.generation, 0, INT64_MAX);
        STR(o, "state", x.state, 0);
        STR(o, "claimed_by", x.claimed_by, 0);
        I64(o, "claimed_epoch", x.claimed_epoch, 0, INT64_MAX);
        I64(o, "created_at", x.created_at, 0, INT64_MAX);
        I64(o, "updated_at", x.updated_at, 0, INT64_MAX);
        TEXT(o, "result_json", x.result_json);
        TEXT(o, "args_json", x.args_json);
        *j = x;
        return 0;
fail:
        cove_job_row_clear(&x);
        return -1;
}
