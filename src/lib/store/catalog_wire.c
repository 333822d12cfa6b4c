/* Catalog rows as JSON, decoded as untrusted input (store/catalog_wire.h). */
#include "store/catalog_wire.h"

#include <stddef.h>
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

/* A row on the wire is an object whose members are the row's fields, by the field's name.
 * One table a row type drives both directions; a field's kind comes from its C type
 * (_Generic), so a row struct changed under its table does not compile. */
enum wire_kind { W_STR, W_I64, W_INT, W_U32, W_BOOL, W_TEXT };

struct wire_field {
        const char *key;
        enum wire_kind kind;
        size_t off, size; /* the field in the row */
        int64_t min, max; /* numbers */
        int required;
};

// clang-format off
#define FIELD_(kd, m, lo, hi, req)                                                                 \
        {.kind = (kd), .key = #m, .off = offsetof(ROW, m), .size = sizeof(((ROW *)0)->m),          \
         .min = (lo), .max = (hi), .required = (req)}
#define BY_TYPE_(m, i64, u64, i, u32)                                                              \
        _Generic(&((ROW *)0)->m, int64_t *: (i64), uint64_t *: (u64), int *: (i), uint32_t *: (u32))
/* a char array: < its size, NUL-free */
#define STR(m, req)                                                                                \
        FIELD_(_Generic(&((ROW *)0)->m, char(*)[sizeof(((ROW *)0)->m)]: W_STR), m, 0, 0, req)
/* an integer from lo to the largest value of its type (uint64_t: of int64_t) */
#define NUM_(m, lo, req)                                                                           \
        FIELD_(BY_TYPE_(m, W_I64, W_I64, W_INT, W_U32), m, lo,                                     \
               BY_TYPE_(m, INT64_MAX, INT64_MAX, INT32_MAX, UINT32_MAX), req)
#define NUM(m) NUM_(m, 0, 0)
#define SEQ(m) NUM_(m, 1, 1) /* required, from 1 */
#define BOOL(m) FIELD_(_Generic(&((ROW *)0)->m, int *: W_BOOL), m, 0, 1, 0)
#define TEXT(m) FIELD_(_Generic(&((ROW *)0)->m, char **: W_TEXT), m, 0, 0, 0) /* owned */
#define FIELDS_END {.key = NULL}

// clang-format on

static json_t *field_json(const struct wire_field *f, const void *row)
{
        const char *p = (const char *)row + f->off;
        switch (f->kind) {
        case W_STR:
                return json_string(p);
        case W_I64:
                return json_integer(*(const int64_t *)p);
        case W_INT:
                return json_integer(*(const int *)p);
        case W_U32:
                return json_integer(*(const uint32_t *)p);
        case W_BOOL:
                return json_boolean(*(const int *)p);
        case W_TEXT:
                return *(char *const *)p ? json_string(*(char *const *)p) : json_null();
        }
        return NULL;
}

/* NULL when out of memory or a string is not UTF-8 */
static json_t *encode(const struct wire_field *f, const void *row)
{
        json_t *o = json_object();
        for (; o && f->key; f++)
                if (json_object_set_new(o, f->key, field_json(f, row)) < 0) {
                        json_decref(o);
                        return NULL;
                }
        return o;
}

static void free_texts(const struct wire_field *f, void *row)
{
        for (; f->key; f++)
                if (f->kind == W_TEXT) {
                        char **t = (char **)((char *)row + f->off);
                        free(*t);
                        *t = NULL;
                }
}

static int field_from(const json_t *o, const struct wire_field *f, void *row, struct cove_err *err)
{
        char *p = (char *)row + f->off;
        int64_t v;
        switch (f->kind) {
        case W_STR:
                return cove_wire_str(o, f->key, p, f->size, f->required, err);
        case W_BOOL:
                return cove_wire_bool(o, f->key, (int *)p, f->required, err);
        case W_TEXT:
                return cove_wire_text(o, f->key, (char **)p, COVE_WIRE_TEXT_MAX, f->required, err);
        case W_I64:
        case W_INT:
        case W_U32:
                break;
        }
        if (cove_wire_i64(o, f->key, &v, f->min, f->max, f->required, err) < 0)
                return -1;
        if (f->kind == W_I64)
                *(int64_t *)p = v;
        else if (f->kind == W_INT)
                *(int *)p = (int)v;
        else
                *(uint32_t *)p = (uint32_t)v;
        return 0;
}

union any_row { /* room for a row of any table while it is decoded */
        struct cove_tenant_row tenant;
        struct cove_apikey_row apikey;
        struct cove_sandbox_row sandbox;
        struct cove_snapshot_row snapshot;
        struct cove_audit_row audit;
        struct cove_node_row node;
        struct cove_placement_row placement;
        struct cove_job_row job;
};

/* Fills *out (size bytes) only when every field decoded and check (may be NULL) accepts the
 * row; on failure nothing is left allocated. */
static int decode(const json_t *o, const char *what, const struct wire_field *fields,
                  int (*check)(const void *row, struct cove_err *err), void *out, size_t size,
                  struct cove_err *err)
{
        union any_row x;
        memset(&x, 0, sizeof(x));
        if (!json_is_object(o))
                return bad(err, what, "is not an object");
        for (const struct wire_field *f = fields; f->key; f++)
                if (field_from(o, f, &x, err) < 0)
                        goto fail;
        if (check && check(&x, err) < 0)
                goto fail;
        memcpy(out, &x, size);
        return 0;
fail:
        free_texts(fields, &x);
        return -1;
}

#define ROW struct cove_tenant_row
static const struct wire_field tenant_fields[] = {
    STR(id, 1),         STR(name, 0),        NUM(created_at), NUM(max_sandboxes), NUM(max_cpus),
    NUM(max_memory_mb), NUM(max_storage_mb), NUM(deleted_at), FIELDS_END,
};
#undef ROW
#define ROW struct cove_apikey_row
static const struct wire_field apikey_fields[] = {
    STR(id, 1),  STR(tenant, 1), STR(salt_hex, 0), STR(hash_hex, 0),
    BOOL(admin), BOOL(revoked),  NUM(created_at),  FIELDS_END,
};
#undef ROW
#define ROW struct cove_sandbox_row
static const struct wire_field sandbox_fields[] = {
    STR(id, 1),
    STR(tenant, 1),
    STR(state, 1),
    STR(template_name, 0),
    STR(runtime, 0),
    NUM(created_at),
    NUM(expires_at),
    NUM(cpus),
    NUM(memory_mb),
    NUM(disk_mb),
    NUM(timeout_s),
    STR(on_timeout, 0),
    NUM(uid_base),
    STR(node, 0),
    STR(last_snapshot_id, 0),
    NUM(snapshot_interval_s),
    BOOL(storage_encrypted),
    TEXT(metadata_json),
    TEXT(env_json),
    TEXT(error),
    TEXT(retention_json),
    FIELDS_END,
};
#undef ROW
#define ROW struct cove_snapshot_row
static const struct wire_field snapshot_fields[] = {
    STR(id, 1),     STR(tenant, 1),  STR(sandbox_id, 0), STR(parent_id, 0),
    STR(kind, 0),   NUM(created_at), STR(label, 0),      NUM(size_bytes),
    NUM(new_bytes), NUM(pause_us),   BOOL(rolling),      FIELDS_END,
};
#undef ROW
#define ROW struct cove_audit_row
static const struct wire_field audit_fields[] = {
    SEQ(seq),     NUM(at),           STR(tenant, 1),  STR(sandbox, 0),
    STR(kind, 0), STR(action, 0),    STR(verdict, 0), STR(prev_hash, 1),
    STR(hash, 1), TEXT(detail_json), FIELDS_END,
};
#undef ROW
#define ROW struct cove_node_row
static const struct wire_field node_fields[] = {
    STR(name, 1),          STR(state, 0),   NUM(epoch),
    NUM(lease_expires_at), NUM(cpus),       NUM(memory_mb),
    NUM(disk_mb),          NUM(alloc_cpus), NUM(alloc_memory_mb),
    NUM(alloc_disk_mb),    STR(address, 0), NUM(last_seen),
    STR(features, 0),      FIELDS_END,
};
#undef ROW
#define ROW struct cove_placement_row
static const struct wire_field placement_fields[] = {
    STR(sandbox_id, 1),     STR(node, 0),    NUM(generation), STR(desired_state, 0),
    STR(observed_state, 0), NUM(updated_at), FIELDS_END,
};
#undef ROW
#define ROW struct cove_job_row
static const struct wire_field job_fields[] = {
    SEQ(id),         STR(sandbox_id, 1), STR(kind, 0),       NUM(generation),
    STR(state, 0),   STR(claimed_by, 0), NUM(claimed_epoch), NUM(created_at),
    NUM(updated_at), TEXT(result_json),  TEXT(args_json),    FIELDS_END,
};
#undef ROW

static int sandbox_check(const void *row, struct cove_err *err)
{
        const struct cove_sandbox_row *s = row;
        if (!cove_sandbox_state_valid(s->state, strlen(s->state)))
                return bad(err, "state", "is not a sandbox state");
        return 0;
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

static int audit_check(const void *row, struct cove_err *err)
{
        const struct cove_audit_row *a = row;
        if (!hex64(a->prev_hash) || !hex64(a->hash))
                return bad(err, "hash", "is not 64 hex digits");
        return 0;
}

json_t *cove_wire_tenant(const struct cove_tenant_row *t)
{
        return encode(tenant_fields, t);
}

int cove_wire_tenant_from(const json_t *o, struct cove_tenant_row *t, struct cove_err *err)
{
        return decode(o, "tenant", tenant_fields, NULL, t, sizeof(*t), err);
}

json_t *cove_wire_apikey(const struct cove_apikey_row *k)
{
        return encode(apikey_fields, k);
}

int cove_wire_apikey_from(const json_t *o, struct cove_apikey_row *k, struct cove_err *err)
{
        return decode(o, "key", apikey_fields, NULL, k, sizeof(*k), err);
}

json_t *cove_wire_sandbox(const struct cove_sandbox_row *s)
{
        return encode(sandbox_fields, s);
}

int cove_wire_sandbox_from(const json_t *o, struct cove_sandbox_row *s, struct cove_err *err)
{
        return decode(o, "sandbox", sandbox_fields, sandbox_check, s, sizeof(*s), err);
}

json_t *cove_wire_snapshot(const struct cove_snapshot_row *s)
{
        return encode(snapshot_fields, s);
}

int cove_wire_snapshot_from(const json_t *o, struct cove_snapshot_row *s, struct cove_err *err)
{
        return decode(o, "snapshot", snapshot_fields, NULL, s, sizeof(*s), err);
}

json_t *cove_wire_audit(const struct cove_audit_row *a)
{
        return encode(audit_fields, a);
}

int cove_wire_audit_from(const json_t *o, struct cove_audit_row *a, struct cove_err *err)
{
        return decode(o, "audit event", audit_fields, audit_check, a, sizeof(*a), err);
}

json_t *cove_wire_node(const struct cove_node_row *n)
{
        return encode(node_fields, n);
}

int cove_wire_node_from(const json_t *o, struct cove_node_row *n, struct cove_err *err)
{
        return decode(o, "node", node_fields, NULL, n, sizeof(*n), err);
}

json_t *cove_wire_placement(const struct cove_placement_row *p)
{
        return encode(placement_fields, p);
}

int cove_wire_placement_from(const json_t *o, struct cove_placement_row *p, struct cove_err *err)
{
        return decode(o, "placement", placement_fields, NULL, p, sizeof(*p), err);
}

json_t *cove_wire_job(const struct cove_job_row *j)
{
        return encode(job_fields, j);
}

int cove_wire_job_from(const json_t *o, struct cove_job_row *j, struct cove_err *err)
{
        return decode(o, "job", job_fields, NULL, j, sizeof(*j), err);
}
