/* POST /v1/cluster/catalog/{op}: the catalog for nodes that hold no database credentials
 * (store/catalog_remote.c is the other end). Role control only (role all and node answer
 * 404). The caller authenticates with Cove-Node (its token derived from the cluster key;
 * time window; nonce cache), then each op is authorized for that node N alone
 * (docs/cluster.md "Trust"): its own lease, jobs and node row; the sandboxes placed on it
 * (placements.node == N) and their snapshots, egress policies, leases and audit events;
 * tenant rows; never API keys, node states, tenants' writes or placements. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "api/routes.h"
#include "cluster/catsrv.h"
#include "cluster/nodeauth.h"
#include "store/catalog_remote.h"
#include "store/catalog_wire.h"
#include "util/util.h"

struct cx {
        struct coved *d;
        const struct cove_catalog_ops *ops;
        struct cove_catalog *cat;
        const char *node; /* the authenticated caller */
};

enum { OK = 0, FAIL = -1, DENY = -2 }; /* DENY: 403 forbidden, message in err */

static int deny(struct cove_err *err, const char *fmt, const char *a, const char *b)
{
        cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, fmt, a, b);
        return DENY;
}

/* 0 when sandbox_id is placed on the caller, 1 when not (or never placed), -1 error */
static int placed_here(struct cx *x, const char *sandbox_id, struct cove_err *err)
{
        if (!sandbox_id || !sandbox_id[0])
                return 1;
        struct cove_placement_row p;
        int rc = x->ops->placement_get(x->cat, sandbox_id, &p, err);
        if (rc != 0)
                return rc;
        return strcmp(p.node, x->node) == 0 ? 0 : 1;
}

/* the tenant of a sandbox placed on the caller: 0, 1 not (placed here / existing), -1 */
static int tenant_here(struct cx *x, const char *sandbox_id, char tenant[64], struct cove_err *err)
{
        int rc = placed_here(x, sandbox_id, err);
        if (rc != 0)
                return rc;
        struct cove_sandbox_row s;
        rc = x->ops->sandbox_get(x->cat, NULL, sandbox_id, &s, err);
        if (rc != 0)
                return rc;
        snprintf(tenant, 64, "%s", s.tenant);
        cove_sandbox_row_clear(&s);
        return 0;
}

static int placed_write(struct cx *x, const char *sandbox_id, const char *what,
                        struct cove_err *err)
{
        int rc = placed_here(x, sandbox_id, err);
        if (rc < 0)
                return FAIL;
        if (rc)
                return deny(err, "%s of a sandbox not placed on this node (%s)", what,
                            sandbox_id ? sandbox_id : "");
        return OK;
}

#define STR_IN(name, cap)                                                                          \
        const char *name;                                                                          \
        if (cove_wire_opt(in, #name, &name, (cap), err) < 0)                                       \
        return FAIL
#define I64_IN(name, lo, hi)                                                                       \
        int64_t name;                                                                              \
        if (cove_wire_i64(in, #name, &name, (lo), (hi), 0, err) < 0)                               \
        return FAIL

static json_t *found(int f)
{
        return json_pack("{s:b}", "found", f);
}

/* An op's answer from its catalog call's rc (< 0 failed, 0 done or found, 1 absent). */

/* {} once done */
static int answer_done(int rc, json_t **out)
{
        if (rc < 0)
                return FAIL;
        *out = json_object();
        return OK;
}

/* {"found": rc == 0, name: val}; val (taken, may be NULL) only when found */
static int answer_found(int rc, json_t **out, const char *name, json_t *val)
{
        if (rc < 0) {
                json_decref(val);
                return FAIL;
        }
        *out = found(rc == 0);
        if (rc == 0 && name)
                json_object_set_new(*out, name, val);
        else
                json_decref(val);
        return OK;
}

/* a list op's rows, kept by the keep_* callbacks */
struct filt {
        struct cx *x;
        json_t *arr;
        struct cove_err *err;
        int failed;
};

/* 0 to keep a row of sandbox_id (placed on the caller), 1 to skip it, -1 stops the listing */
static int keep_here(struct filt *f, const char *sandbox_id)
{
        int here = placed_here(f->x, sandbox_id, f->err);
        if (here < 0)
                f->failed = 1;
        return here;
}

/* {name: [rows]} */
static int answer_list(int rc, struct filt *f, json_t **out, const char *name)
{
        if (rc < 0 || f->failed) {
                json_decref(f->arr);
                return FAIL;
        }
        *out = json_pack("{s:o}", name, f->arr);
        return OK;
}

static int o_schema_version(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        (void)in;
        int v;
        if (x->ops->schema_version(x->cat, &v, err) < 0)
                return FAIL;
        *out = json_pack("{s:i}", "version", v);
        return OK;
}

static int o_forbidden(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        (void)in;
        (void)out;
        return deny(err, "node %s may not call this catalog op%s", x->node, "");
}

static int o_tenant_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(id, 64);
        struct cove_tenant_row t;
        int rc = x->ops->tenant_get(x->cat, id ? id : "", &t, err);
        return answer_found(rc, out, "tenant", rc == 0 ? cove_wire_tenant(&t) : NULL);
}

static int add_tenant(const struct cove_tenant_row *t, void *arg)
{
        json_array_append_new(arg, cove_wire_tenant(t));
        return 0;
}

static int o_tenant_list(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        (void)in;
        struct filt f = {x, json_array(), err, 0};
        return answer_list(x->ops->tenant_list(x->cat, add_tenant, f.arr, err), &f, out, "tenants");
}

/* fence: NULL, or the node (the caller itself) whose epoch and generation the update must
 * hold under (sandbox_update_fenced) */
static int o_sandbox_write(struct cx *x, json_t *in, json_t **out, struct cove_err *err, int insert,
                           const char *fence, int64_t epoch, int64_t generation)
{
        struct cove_sandbox_row s;
        if (cove_wire_sandbox_from(json_object_get(in, "sandbox"), &s, err) < 0)
                return FAIL;
        int rc = placed_write(x, s.id, insert ? "insert" : "update", err);
        if (rc == OK && strcmp(s.node, x->node) != 0)
                rc = deny(err, "a sandbox row of node %s must name it as its node, not \"%s\"",
                          x->node, s.node);
        if (rc == OK) {
                rc = insert ? x->ops->sandbox_insert(x->cat, &s, err)
                     : fence
                         ? x->ops->sandbox_update_fenced(x->cat, &s, fence, epoch, generation, err)
                         : x->ops->sandbox_update(x->cat, &s, err);
                if (rc >= 0)
                        *out = insert ? json_object() : found(rc == 0);
                rc = rc < 0 ? FAIL : OK;
        }
        cove_sandbox_row_clear(&s);
        return rc;
}

static int o_sandbox_insert(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        return o_sandbox_write(x, in, out, err, 1, NULL, 0, 0);
}

/* A node writes a sandbox row only under its fence (sandbox_update_fenced): a plain update
 * would land even after its lease lapsed or the sandbox moved. */
static int o_sandbox_update(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        (void)in;
        (void)out;
        return deny(err, "node %s may write a sandbox row only %s", x->node,
                    "under its fence (sandbox_update_fenced)");
}

static int o_sandbox_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(tenant, 64);
        STR_IN(id, 64);
        struct cove_sandbox_row s;
        int rc = x->ops->sandbox_get(x->cat, tenant, id ? id : "", &s, err);
        if (rc < 0)
                return FAIL;
        if (rc == 0) {
                int here = placed_here(x, s.id, err);
                if (here < 0) {
                        cove_sandbox_row_clear(&s);
                        return FAIL;
                }
                if (here) { /* another node's: as if absent */
                        cove_sandbox_row_clear(&s);
                        rc = 1;
                }
        }
        json_t *row = rc == 0 ? cove_wire_sandbox(&s) : NULL;
        if (rc == 0)
                cove_sandbox_row_clear(&s);
        return answer_found(rc, out, "sandbox", row);
}

static int keep_sandbox(const struct cove_sandbox_row *s, void *arg)
{
        struct filt *f = arg;
        int here = keep_here(f, s->id);
        if (here == 0)
                json_array_append_new(f->arr, cove_wire_sandbox(s));
        return here < 0 ? -1 : 0;
}

static int o_sandbox_list(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(tenant, 64);
        STR_IN(states, 256);
        struct filt f = {x, json_array(), err, 0};
        return answer_list(x->ops->sandbox_list(x->cat, tenant, states, keep_sandbox, &f, err), &f,
                           out, "sandboxes");
}

static int o_sandbox_delete(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(id, 64);
        int rc = placed_write(x, id, "delete", err);
        if (rc != OK)
                return rc;
        return answer_found(x->ops->sandbox_delete(x->cat, id, err), out, NULL, NULL);
}

/* the sandbox must be placed here and belong to tenant */
static int owned_write(struct cx *x, const char *sandbox_id, const char *tenant, const char *what,
                       struct cove_err *err)
{
        char t[64];
        int rc = tenant_here(x, sandbox_id, t, err);
        if (rc < 0)
                return FAIL;
        if (rc)
                return deny(err, "%s for a sandbox not placed on this node (%s)", what,
                            sandbox_id ? sandbox_id : "");
        if (!tenant || strcmp(t, tenant) != 0)
                return deny(err, "%s for sandbox %s names another tenant", what, sandbox_id);
        return OK;
}

static int o_snapshot_insert(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        struct cove_snapshot_row s;
        if (cove_wire_snapshot_from(json_object_get(in, "snapshot"), &s, err) < 0)
                return FAIL;
        int rc = owned_write(x, s.sandbox_id, s.tenant, "snapshot", err);
        if (rc != OK)
                return rc;
        return answer_done(x->ops->snapshot_insert(x->cat, &s, err), out);
}

/* a snapshot row the caller may see: its sandbox is placed here. 0, 1 (hidden/absent), -1 */
static int snapshot_here(struct cx *x, const char *tenant, const char *id,
                         struct cove_snapshot_row *s, struct cove_err *err)
{
        int rc = x->ops->snapshot_get(x->cat, tenant, id ? id : "", s, err);
        if (rc != 0)
                return rc;
        return placed_here(x, s->sandbox_id, err);
}

static int o_snapshot_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(tenant, 64);
        STR_IN(id, 64);
        struct cove_snapshot_row s;
        int rc = snapshot_here(x, tenant, id, &s, err);
        return answer_found(rc, out, "snapshot", rc == 0 ? cove_wire_snapshot(&s) : NULL);
}

static int keep_snapshot(const struct cove_snapshot_row *s, void *arg)
{
        struct filt *f = arg;
        int here = keep_here(f, s->sandbox_id);
        if (here == 0)
                json_array_append_new(f->arr, cove_wire_snapshot(s));
        return here < 0 ? -1 : 0;
}

static int o_snapshot_list(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(tenant, 64);
        STR_IN(sandbox_id, 64);
        struct filt f = {x, json_array(), err, 0};
        return answer_list(
            x->ops->snapshot_list(x->cat, tenant, sandbox_id, keep_snapshot, &f, err), &f, out,
            "snapshots");
}

static int o_snapshot_delete(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(id, 64);
        struct cove_snapshot_row s;
        int rc = x->ops->snapshot_get(x->cat, NULL, id ? id : "", &s, err);
        if (rc < 0)
                return FAIL;
        if (rc == 1) {
                *out = found(0);
                return OK;
        }
        rc = placed_write(x, s.sandbox_id, "snapshot delete", err);
        if (rc != OK)
                return rc;
        return answer_found(x->ops->snapshot_delete(x->cat, id, err), out, NULL, NULL);
}

/* An event of a sandbox placed on the caller, of that sandbox's tenant. A sandbox the
 * control deleted while its node still flushes events has no row: its placement (kept)
 * must still name the caller and the tenant must exist. */
static int audit_allowed(struct cx *x, const struct cove_audit_row *a, struct cove_err *err)
{
        struct cove_sandbox_row s;
        int rc = x->ops->sandbox_get(x->cat, NULL, a->sandbox[0] ? a->sandbox : "", &s, err);
        if (rc < 0)
                return FAIL;
        if (rc == 0)
                cove_sandbox_row_clear(&s);
        if (rc == 0 || !a->sandbox[0])
                return owned_write(x, a->sandbox, a->tenant, "audit event", err);
        rc = placed_write(x, a->sandbox, "audit event", err);
        if (rc != OK)
                return rc;
        struct cove_tenant_row t;
        rc = x->ops->tenant_get(x->cat, a->tenant, &t, err);
        if (rc < 0)
                return FAIL;
        if (rc)
                return deny(err, "audit event for sandbox %s names an unknown tenant%s", a->sandbox,
                            "");
        return OK;
}

static int o_audit_append(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        json_t *rows = json_object_get(in, "rows");
        if (!json_is_array(rows) || json_array_size(rows) > 4096)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "catalog wire: \"rows\" is not an array of at most 4096");
        size_t n = json_array_size(rows);
        struct cove_audit_row *a = calloc(n ? n : 1, sizeof(*a));
        if (!a)
                return cove_err_set(err, 12, "audit append");
        int rc = OK;
        size_t got = 0;
        for (; got < n && rc == OK; got++) {
                if (cove_wire_audit_from(json_array_get(rows, got), &a[got], err) < 0) {
                        rc = FAIL;
                        break;
                }
                rc = audit_allowed(x, &a[got], err);
        }
        if (rc == OK && x->ops->audit_append(x->cat, a, n, err) < 0)
                rc = FAIL;
        for (size_t i = 0; i < n; i++)
                free(a[i].detail_json);
        free(a);
        if (rc == OK)
                *out = json_object();
        return rc;
}

static int o_audit_last(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        (void)in;
        int64_t seq = 0;
        char hash[65] = "";
        int rc = x->ops->audit_last(x->cat, &seq, hash, err);
        if (rc < 0)
                return FAIL;
        *out = found(rc == 0);
        if (rc == 0) {
                json_object_set_new(*out, "seq", json_integer(seq));
                json_object_set_new(*out, "hash", json_string(hash));
        }
        return OK;
}

static int keep_audit(const struct cove_audit_row *a, void *arg)
{
        struct filt *f = arg;
        int here = keep_here(f, a->sandbox);
        if (here == 0)
                json_array_append_new(f->arr, cove_wire_audit(a));
        return here < 0 ? -1 : 0;
}

static int o_audit_list(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(tenant, 64);
        STR_IN(sandbox, 64);
        STR_IN(kind, 32);
        I64_IN(after_seq, 0, INT64_MAX);
        I64_IN(since_ms, 0, INT64_MAX);
        I64_IN(limit, 0, 100000);
        struct filt f = {x, json_array(), err, 0};
        return answer_list(x->ops->audit_list(x->cat, tenant, sandbox, kind, after_seq, since_ms,
                                              (int)limit, keep_audit, &f, err),
                           &f, out, "rows");
}

static int o_egress_put(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(sandbox_id, 64);
        STR_IN(tenant, 64);
        STR_IN(json, COVE_WIRE_TEXT_MAX);
        int rc = owned_write(x, sandbox_id, tenant, "egress policy", err);
        if (rc != OK)
                return rc;
        if (!json)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "egress_put: \"json\" missing");
        return answer_done(x->ops->egress_put(x->cat, sandbox_id, tenant, json, err), out);
}

static int o_egress_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(sandbox_id, 64);
        int rc = placed_here(x, sandbox_id, err);
        char *json = NULL;
        if (rc == 0)
                rc = x->ops->egress_get(x->cat, sandbox_id, &json, err);
        json_t *val = rc == 0 ? json_string(json) : NULL;
        free(json);
        return answer_found(rc, out, "json", val);
}

static int o_egress_delete(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(sandbox_id, 64);
        int rc = placed_write(x, sandbox_id, "egress delete", err);
        if (rc != OK)
                return rc;
        return answer_found(x->ops->egress_delete(x->cat, sandbox_id, err), out, NULL, NULL);
}

/* documents: "lease" (credential leases) and "port" (exposed ports) rows are owned by a
 * sandbox (owner = its id): the caller reads and writes those of the sandboxes placed on it.
 * "secret" rows are the tenant's (written by users through the public API): read-only, and only for
 * a tenant with a sandbox placed on the caller (its egress proxy needs them). */
static int owned_kind(const char *kind)
{
        return !strcmp(kind, "lease") || !strcmp(kind, "port");
}

struct tfind {
        struct cx *x;
        struct cove_err *err;
        int found, failed;
};

static int find_placed(const struct cove_sandbox_row *s, void *arg)
{
        struct tfind *t = arg;
        int here = placed_here(t->x, s->id, t->err);
        if (here < 0) {
                t->failed = 1;
                return -1;
        }
        if (here == 0) {
                t->found = 1;
                return -1;
        }
        return 0;
}

/* 0 when tenant has a live sandbox placed on the caller, 1 not, -1 error */
static int tenant_on_node(struct cx *x, const char *tenant, struct cove_err *err)
{
        if (!tenant || !tenant[0])
                return 1;
        struct tfind t = {x, err, 0, 0};
        if (x->ops->sandbox_list(x->cat, tenant, "starting,running,pausing,paused,resuming",
                                 find_placed, &t, err) < 0 &&
            !t.found)
                return -1;
        if (t.failed)
                return -1;
        return t.found ? 0 : 1;
}

struct dfind {
        const char *key;
        char owner[64];
        int found;
};

static int doc_owner_cb(const char *tenant, const char *key, const char *owner, const char *json,
                        void *arg)
{
        (void)tenant;
        (void)json;
        struct dfind *f = arg;
        if (strcmp(key, f->key) == 0) {
                snprintf(f->owner, sizeof(f->owner), "%s", owner ? owner : "");
                f->found = 1;
                return -1;
        }
        return 0;
}

/* may the caller see/touch (kind, tenant, key)? 0 yes, 1 hidden, -1 error. write: for a
 * write (secrets: never) */
static int doc_allowed(struct cx *x, const char *kind, const char *tenant, const char *key,
                       int write, struct cove_err *err)
{
        if (!kind || !tenant || !key)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "doc: kind, tenant and key are needed");
        if (!strcmp(kind, "secret"))
                return write ? deny(err, "node %s may not write %s documents", x->node, kind)
                             : tenant_on_node(x, tenant, err);
        if (!owned_kind(kind))
                return deny(err, "node %s may not touch %s documents", x->node, kind);
        struct dfind f = {.key = key};
        if (x->ops->doc_list(x->cat, kind, tenant, NULL, doc_owner_cb, &f, err) < 0 && !f.found)
                return -1;
        if (!f.found)
                return 1;
        return placed_here(x, f.owner, err);
}

static int o_doc_put(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(kind, 16);
        STR_IN(tenant, 64);
        STR_IN(key, 128);
        STR_IN(owner, 64);
        STR_IN(json, COVE_WIRE_TEXT_MAX);
        if (!kind || !tenant || !key || !json)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "doc_put: kind, tenant, key and json are needed");
        if (!owned_kind(kind))
                return deny(err, "node %s may not write %s documents", x->node, kind);
        int rc = owned_write(x, owner, tenant, "sandbox document", err);
        if (rc != OK)
                return rc;
        /* an existing lease of another sandbox keeps its owner */
        struct dfind f = {.key = key};
        if (x->ops->doc_list(x->cat, kind, tenant, NULL, doc_owner_cb, &f, err) < 0 && !f.found)
                return FAIL;
        if (f.found && strcmp(f.owner, owner) != 0)
                return deny(err, "lease %s belongs to another sandbox (%s)", key, f.owner);
        return answer_done(x->ops->doc_put(x->cat, kind, tenant, key, owner, json, err), out);
}

/* A tenant's key record: readable by a node that runs one of its sandboxes (to unwrap the
 * data key through the tenant's provider on the node); never written by a node: a record
 * names its key provider (for a command provider, programs every process runs), so a
 * node that could write one could run code on every other member. */
static int o_keyrec_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(tenant, 64);
        if (!tenant || !tenant[0])
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "keyrec_get: tenant is needed");
        int rc = tenant_on_node(x, tenant, err);
        if (rc < 0)
                return FAIL;
        if (rc == 1) { /* not its tenant: as if there were none (a node's sweep of every
                        * tenant's key state asks for all of them) */
                *out = found(0);
                return OK;
        }
        char *json = NULL;
        int64_t gen = 0;
        rc = x->ops->keyrec_get(x->cat, tenant, &json, &gen, err);
        if (rc < 0)
                return FAIL;
        *out = found(rc == 0);
        if (rc == 0) {
                json_object_set_new(*out, "json", json_string(json));
                json_object_set_new(*out, "gen", json_integer(gen));
                OPENSSL_cleanse(json, strlen(json));
        }
        free(json);
        return OK;
}

static int o_keyrec_put(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        (void)in;
        (void)out;
        return deny(err, "node %s may not write key records (%s)", x->node,
                    "they are the control plane's");
}

static int o_doc_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(kind, 16);
        STR_IN(tenant, 64);
        STR_IN(key, 128);
        int rc = doc_allowed(x, kind, tenant, key, 0, err);
        char *json = NULL;
        if (rc == 0)
                rc = x->ops->doc_get(x->cat, kind, tenant, key, &json, err);
        if (rc == DENY)
                return DENY;
        json_t *val = rc == 0 ? json_string(json) : NULL;
        free(json);
        return answer_found(rc, out, "json", val);
}

struct dlist {
        struct cx *x;
        json_t *arr;
        struct cove_err *err;
        int secrets_ok; /* kind secret: the tenant was checked */
        int failed;
};

static int keep_doc(const char *tenant, const char *key, const char *owner, const char *json,
                    void *arg)
{
        struct dlist *l = arg;
        if (!l->secrets_ok) {
                int here = placed_here(l->x, owner, l->err);
                if (here < 0) {
                        l->failed = 1;
                        return -1;
                }
                if (here)
                        return 0;
        }
        json_array_append_new(l->arr, json_pack("{s:s, s:s, s:s, s:s}", "tenant", tenant, "key",
                                                key, "owner", owner ? owner : "", "json", json));
        return 0;
}

static int o_doc_list(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(kind, 16);
        STR_IN(tenant, 64);
        STR_IN(owner, 64);
        if (!kind)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "doc_list: kind is needed");
        struct dlist l = {x, NULL, err, 0, 0};
        if (!strcmp(kind, "secret")) {
                int rc = tenant_on_node(x, tenant, err);
                if (rc < 0)
                        return FAIL;
                if (rc)
                        return deny(err, "node %s runs no sandbox of tenant %s", x->node,
                                    tenant ? tenant : "(any)");
                l.secrets_ok = 1;
        } else if (!owned_kind(kind)) {
                return deny(err, "node %s may not touch %s documents", x->node, kind);
        }
        l.arr = json_array();
        if (x->ops->doc_list(x->cat, kind, tenant, owner, keep_doc, &l, err) < 0 || l.failed) {
                json_decref(l.arr);
                return FAIL;
        }
        *out = json_pack("{s:o}", "docs", l.arr);
        return OK;
}

static int o_doc_delete(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(kind, 16);
        STR_IN(tenant, 64);
        STR_IN(key, 128);
        int rc = doc_allowed(x, kind, tenant, key, 1, err);
        if (rc == DENY)
                return DENY;
        if (rc < 0)
                return FAIL;
        if (rc == 1) {
                *out = found(0);
                return OK;
        }
        return answer_found(x->ops->doc_delete(x->cat, kind, tenant, key, err), out, NULL, NULL);
}

static int self_only(struct cx *x, const char *name, const char *what, struct cove_err *err)
{
        if (!name || strcmp(name, x->node) != 0)
                return deny(err, "node %s may act only as itself (%s)", x->node, what);
        return OK;
}

static int o_node_lease_acquire(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        struct cove_node_row n;
        if (cove_wire_node_from(json_object_get(in, "node"), &n, err) < 0)
                return FAIL;
        I64_IN(ttl_ms, 1, 3600000);
        if (self_only(x, n.name, "lease", err) != OK)
                return DENY;
        int64_t epoch, exp;
        if (x->ops->node_lease_acquire(x->cat, &n, ttl_ms, &epoch, &exp, err) < 0)
                return FAIL;
        *out = json_pack("{s:I, s:I}", "epoch", (json_int_t)epoch, "expires_at", (json_int_t)exp);
        return OK;
}

static int o_node_lease_renew(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(name, 64);
        I64_IN(epoch, 0, INT64_MAX);
        I64_IN(ttl_ms, 1, 3600000);
        if (self_only(x, name, "lease", err) != OK)
                return DENY;
        int64_t exp;
        if (x->ops->node_lease_renew(x->cat, name, epoch, ttl_ms, &exp, err) < 0)
                return FAIL;
        *out = json_pack("{s:I}", "expires_at", (json_int_t)exp);
        return OK;
}

static int keep_node(const struct cove_node_row *n, void *arg)
{
        struct filt *f = arg;
        if (!strcmp(n->name, f->x->node))
                json_array_append_new(f->arr, cove_wire_node(n));
        return 0;
}

static int o_node_list(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        (void)in;
        struct filt f = {x, json_array(), err, 0};
        return answer_list(x->ops->node_list(x->cat, keep_node, &f, err), &f, out, "nodes");
}

static int o_placement_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(sandbox_id, 64);
        struct cove_placement_row p;
        int rc = x->ops->placement_get(x->cat, sandbox_id ? sandbox_id : "", &p, err);
        if (rc < 0)
                return FAIL;
        if (rc == 0 && strcmp(p.node, x->node) != 0)
                rc = 1;
        return answer_found(rc, out, "placement", rc == 0 ? cove_wire_placement(&p) : NULL);
}

static int o_placement_observe(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(sandbox_id, 64);
        STR_IN(node, 64);
        I64_IN(epoch, 0, INT64_MAX);
        I64_IN(generation, 0, INT64_MAX);
        STR_IN(observed_state, 16);
        STR_IN(desired_state, 16);
        if (self_only(x, node, "observe", err) != OK)
                return DENY;
        return answer_done(
            x->ops->placement_observe(x->cat, sandbox_id ? sandbox_id : "", node, epoch, generation,
                                      observed_state ? observed_state : "", desired_state, err),
            out);
}

static int o_sandbox_update_fenced(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(node, 64);
        I64_IN(epoch, 0, INT64_MAX);
        I64_IN(generation, 0, INT64_MAX);
        if (self_only(x, node, "fenced update", err) != OK)
                return DENY;
        return o_sandbox_write(x, in, out, err, 0, node, epoch, generation);
}

static int o_job_claim(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(node, 64);
        I64_IN(epoch, 0, INT64_MAX);
        if (self_only(x, node, "job claim", err) != OK)
                return DENY;
        struct cove_job_row j = {0};
        int rc = x->ops->job_claim(x->cat, node, epoch, &j, err);
        json_t *row = rc == 0 ? cove_wire_job(&j) : NULL;
        cove_job_row_clear(&j);
        return answer_found(rc, out, "job", row);
}

static int o_job_finish(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        I64_IN(job_id, 1, INT64_MAX);
        STR_IN(node, 64);
        I64_IN(epoch, 0, INT64_MAX);
        I64_IN(generation, 0, INT64_MAX);
        STR_IN(result_json, COVE_WIRE_TEXT_MAX);
        int ok;
        if (cove_wire_bool(in, "ok", &ok, 1, err) < 0)
                return FAIL;
        if (self_only(x, node, "job finish", err) != OK)
                return DENY;
        return answer_done(
            x->ops->job_finish(x->cat, job_id, node, epoch, generation, ok, result_json, err), out);
}

static int o_job_get(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        I64_IN(job_id, 0, INT64_MAX);
        struct cove_job_row j = {0};
        int rc = x->ops->job_get(x->cat, job_id, &j, err);
        if (rc == 0) {
                rc = placed_here(x, j.sandbox_id, err);
                if (rc != 0)
                        cove_job_row_clear(&j);
        }
        json_t *row = rc == 0 ? cove_wire_job(&j) : NULL;
        cove_job_row_clear(&j);
        return answer_found(rc, out, "job", row);
}

static int o_wait_wakeup(struct cx *x, json_t *in, json_t **out, struct cove_err *err);

typedef int (*op_fn)(struct cx *x, json_t *in, json_t **out, struct cove_err *err);
static const struct {
        const char *name;
        op_fn fn;
} op_table[] = {
    {"schema_version", o_schema_version},
    {"tenant_put", o_forbidden},
    {"tenant_get", o_tenant_get},
    {"tenant_list", o_tenant_list},
    {"apikey_list", o_forbidden},
    {"apikey_put", o_forbidden},
    {"apikey_get", o_forbidden},
    {"apikey_count", o_forbidden},
    {"sandbox_insert", o_sandbox_insert},
    {"sandbox_update", o_sandbox_update},
    {"sandbox_get", o_sandbox_get},
    {"sandbox_list", o_sandbox_list},
    {"sandbox_delete", o_sandbox_delete},
    {"snapshot_insert", o_snapshot_insert},
    {"snapshot_get", o_snapshot_get},
    {"snapshot_list", o_snapshot_list},
    {"snapshot_delete", o_snapshot_delete},
    {"audit_append", o_audit_append},
    {"audit_last", o_audit_last},
    {"audit_list", o_audit_list},
    {"egress_put", o_egress_put},
    {"egress_get", o_egress_get},
    {"egress_delete", o_egress_delete},
    {"doc_put", o_doc_put},
    {"doc_get", o_doc_get},
    {"keyrec_get", o_keyrec_get},
    {"keyrec_put", o_keyrec_put},
    {"doc_list", o_doc_list},
    {"doc_delete", o_doc_delete},
    {"node_lease_acquire", o_node_lease_acquire},
    {"node_lease_renew", o_node_lease_renew},
    {"node_set_state", o_forbidden},
    {"node_list", o_node_list},
    {"placement_write", o_forbidden},
    {"placement_get", o_placement_get},
    {"placement_observe", o_placement_observe},
    {"sandbox_update_fenced", o_sandbox_update_fenced},
    {"job_claim", o_job_claim},
    {"job_finish", o_job_finish},
    {"job_get", o_job_get},
    {"wait_wakeup", o_wait_wakeup},
};

/* ---- serving ---- */

static int o_wait_wakeup(struct cx *x, json_t *in, json_t **out, struct cove_err *err)
{
        STR_IN(node, 64);
        I64_IN(timeout_ms, 0, COVE_REMOTE_WAIT_MAX_MS);
        if (node && self_only(x, node, "wait", err) != OK)
                return DENY;
        struct cove_catsrv *s = coved_catsrv(x->d);
        if (!s)
                return cove_err_set(err, 12, "wait_wakeup");
        int rc = cove_catsrv_wait(s, (int)timeout_ms, &x->d->quitting);
        *out = json_pack("{s:b}", "woken", rc == 0);
        return OK;
}

/* The cluster key this process serves nodes with: a control replica's; NULL elsewhere. */
static const uint8_t *serving_key(struct coved *d)
{
        return d->role == COVED_ROLE_CONTROL && d->has_cluster_key ? d->cluster_key : NULL;
}

static void hash_hex(const char *body, size_t len, char out[65])
{
        unsigned char md[32];
        unsigned int mdlen = 0;
        EVP_Digest(body ? body : "", len, md, &mdlen, EVP_sha256(), NULL);
        cove_hex(md, 32, out);
}

static int authenticate(struct coved *d, struct cove_req *r, const uint8_t *key,
                        struct cove_nodeauth_hdr *h, char token[COVE_NODEAUTH_TOKEN_HEX],
                        struct cove_err *err)
{
        const char *auth = cove_req_header(r, "Authorization");
        const char *tenant = cove_req_header(r, "X-Cove-Tenant");
        if (!auth)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "missing Authorization: Cove-Node …");
        if (tenant && *tenant)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "catalog calls carry no X-Cove-Tenant");
        if (cove_nodeauth_parse(auth, h, err) < 0 ||
            cove_nodeauth_token(key, h->name, token, err) < 0)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "bad Cove-Node authorization");
        char path[160], hash[65];
        snprintf(path, sizeof(path), "%s", r->url);
        hash_hex(r->body, r->body_len, hash);
        struct cove_nodeauth_req q = {
            .method = r->method, .path_query = path, .tenant = NULL, .body_sha256_hex = hash};
        int64_t now = cove_now_ms();
        if (cove_nodeauth_verify(token, h, &q, now, err) < 0)
                return -1;
        struct cove_catsrv *s = coved_catsrv(d);
        if (!s)
                return cove_err_set(err, 12, "node auth");
        return cove_catsrv_nonce(s, h->name, h->nonce, h->ts, now, err);
}

int cove_h_cluster_catalog(void *app, struct cove_req *r)
{
        struct coved *d = app;
        const uint8_t *key = serving_key(d);
        if (!key)
                return cove_reply_error(r, 404, "not_found", "no such endpoint");
        struct cove_nodeauth_hdr h;
        char token[COVE_NODEAUTH_TOKEN_HEX];
        struct cove_err err = {0};
        int arc = authenticate(d, r, key, &h, token, &err);
        if (arc < 0) {
                explicit_bzero(token, sizeof(token));
                cove_warn(&d->log, "cluster.auth", "catalog call refused: %s", err.msg);
                if (err.kind == COVE_E_UNAVAILABLE)
                        return cove_reply_err(r, &err);
                return cove_reply_error(r, 401, "unauthorized", "%s", err.msg);
        }
        /* from here on the answer proves this replica holds the caller's token */
        cove_nodeauth_answer(token, h.sig, r->answer_hdr_value);
        r->answer_hdr_name = "Cove-Node-Answer";
        explicit_bzero(token, sizeof(token));
        const char *op = r->params[0];
        op_fn fn = NULL;
        for (size_t i = 0; i < sizeof(op_table) / sizeof(op_table[0]); i++)
                if (!strcmp(op_table[i].name, op))
                        fn = op_table[i].fn;
        if (!fn)
                return cove_reply_error(r, 404, "not_found", "no catalog op \"%.64s\"", op);
        json_t *in = cove_req_json(r, 1);
        if (!in)
                return 0;
        struct cx x = {.d = d, .ops = d->cat_ops, .cat = d->cat, .node = h.name};
        json_t *out = NULL;
        int rc = fn(&x, in, &out, &err);
        json_decref(in);
        if (rc == DENY) {
                cove_warn(&d->log, "cluster.deny", "node %s: %s: %s", h.name, op, err.msg);
                return cove_reply_error(r, 403, "forbidden", "%s", err.msg);
        }
        if (rc < 0) {
                json_decref(out);
                return cove_reply_err(r, &err);
        }
        return cove_reply_json(r, 200, out ? out : json_object());
}
