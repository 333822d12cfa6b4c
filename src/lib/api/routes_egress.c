/* Egress policy, secrets, leases and audit routes: PUT/GET /v1/sandboxes/{id}/egress,
 * /v1/secrets[/{name}], /v1/sandboxes/{id}/leases, /v1/leases[/{lid}[/approve|/deny]],
 * GET /v1/audit, GET /v1/audit/verify (docs/api.md, docs/egress.md). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/routes.h"
#include "control/audit.h"
#include "control/egress.h"
#include "control/secrets.h"

#define AUDIT_LIMIT_DEFAULT 1000
#define AUDIT_LIMIT_MAX 10000

int cove_h_egress_put(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_egress_put(d, r->tenant, r->params[0], body, &out, &err);
        json_decref(body);
        return rc < 0 ? cove_reply_err(r, &err) : cove_reply_json(r, 200, out);
}

int cove_h_secret_put(void *app, struct cove_req *r)
{
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_secret_put(app, r->tenant, r->params[0], body, &out, &err);
        json_decref(body); /* the value: jansson frees it (not wiped; coved's own heap) */
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_secret_get(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_secret_get(app, r->tenant, r->params[0], &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_secret_list(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_secret_list(app, r->tenant, &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_secret_delete(void *app, struct cove_req *r)
{
        struct cove_err err;
        if (coved_secret_delete(app, r->tenant, r->params[0], &err) < 0)
                return cove_reply_err(r, &err);
        return cove_reply_empty(r, 204);
}

int cove_h_lease_create(void *app, struct cove_req *r)
{
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_lease_create(app, r->tenant, r->params[0], body, &out, &err);
        json_decref(body);
        return cove_reply_result(r, rc, 201, out, &err);
}

int cove_h_lease_list_sbx(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_lease_list(app, r->tenant, r->params[0], &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_lease_list(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_lease_list(app, r->tenant, NULL, &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

static int answer_lease(void *app, struct cove_req *r, int approve)
{
        json_t *body = cove_req_json(r, 1);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_lease_answer(app, r->tenant, r->params[0], approve, body, &out, &err);
        json_decref(body);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_lease_approve(void *app, struct cove_req *r)
{
        return answer_lease(app, r, 1);
}

int cove_h_lease_deny(void *app, struct cove_req *r)
{
        return answer_lease(app, r, 0);
}

int cove_h_lease_delete(void *app, struct cove_req *r)
{
        struct cove_err err;
        if (coved_lease_delete(app, r->tenant, r->params[0], &err) < 0)
                return cove_reply_err(r, &err);
        return cove_reply_empty(r, 204);
}

int cove_h_egress_get(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *out = NULL;
        struct cove_err err;
        if (coved_egress_get(d, r->tenant, r->params[0], &out, &err) < 0)
                return cove_reply_err(r, &err);
        return cove_reply_json(r, 200, out);
}

/* Optional non-negative integer query parameter; -1 when malformed. */
static int64_t q_int(struct cove_req *r, const char *key, int64_t dflt)
{
        const char *v = cove_req_query(r, key);
        if (!v || !*v)
                return dflt;
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (*end || errno || x < 0)
                return -1;
        return x;
}

static int add_event(const struct cove_audit_row *row, void *arg)
{
        json_array_append_new(arg, cove_audit_json(row));
        return 0;
}

int cove_h_audit(void *app, struct cove_req *r)
{
        struct coved *d = app;
        int64_t after = q_int(r, "after", 0), since = q_int(r, "since", 0),
                limit = q_int(r, "limit", AUDIT_LIMIT_DEFAULT);
        if (after < 0 || since < 0 || limit < 1 || limit > AUDIT_LIMIT_MAX)
                return cove_reply_error(r, 400, "bad_request",
                                        "after (seq), since (unix ms) must be non-negative "
                                        "integers and limit 1 to %d",
                                        AUDIT_LIMIT_MAX);
        const char *sbx = cove_req_query(r, "sandbox"), *kind = cove_req_query(r, "kind");
        /* an admin reads any tenant's chain with ?tenant= (a deleted one's too: its events
         * outlive it); a tenant key only its own */
        const char *tenant = cove_req_scoped_tenant(r, NULL);
        if (!tenant)
                return 0;
        struct cove_err err;
        if (strcmp(tenant, r->tenant) != 0) {
                struct cove_tenant_row tr;
                int g = d->cat_ops->tenant_get(d->cat, tenant, &tr, &err);
                if (g < 0)
                        return cove_reply_err(r, &err);
                if (g == 1)
                        return cove_reply_error(r, 404, "not_found", "tenant %.64s not found",
                                                tenant);
        }
        /* events queued a moment ago (by this request's own sandbox, say) are included */
        cove_audit_flush(d->audit);
        json_t *arr = json_array();
        if (d->cat_ops->audit_list(d->cat, tenant, sbx && *sbx ? sbx : NULL,
                                   kind && *kind ? kind : NULL, after, since, (int)limit, add_event,
                                   arr, &err) < 0) {
                json_decref(arr);
                return cove_reply_err(r, &err);
        }
        size_t n = json_array_size(arr);
        json_t *last = n ? json_array_get(arr, n - 1) : NULL;
        json_int_t next = last ? json_integer_value(json_object_get(last, "seq")) : after;
        return cove_reply_json(r, 200, json_pack("{s:o, s:I}", "events", arr, "next_after", next));
}

int cove_h_audit_verify(void *app, struct cove_req *r)
{
        struct coved *d = app;
        if (!r->admin)
                return cove_reply_error(r, 403, "unauthorized",
                                        "verifying the audit chain is admin only (it reads every "
                                        "tenant's events)");
        cove_audit_flush(d->audit);
        int64_t checked = 0, bad = 0;
        char why[256];
        struct cove_err err;
        if (cove_audit_verify(d->cat_ops, d->cat, &checked, &bad, why, sizeof(why), &err) < 0)
                return cove_reply_err(r, &err);
        return cove_reply_json(r, 200,
                               json_pack("{s:b, s:I, s:o, s:o, s:I}", "ok", bad == 0, "checked",
                                         (json_int_t)checked, "first_broken_seq",
                                         bad ? json_integer(bad) : json_null(), "reason",
                                         bad ? json_string(why) : json_null(), "dropped",
                                         (json_int_t)cove_audit_dropped(d->audit)));
}
