/* Tenants, their API keys (admin only) and data keys (docs/api.md "Tenants", "Keys").
 * A tenant's own key may read its key status and revoke its key; adding, rotating and
 * everything about tenants and API keys needs an admin key (commands and key files named
 * in a key spec run and are read on the node). */
#include <string.h>

#include "api/routes.h"
#include "control/tenant.h"

static int need_admin(struct cove_req *r)
{
        if (r->admin)
                return 0;
        cove_reply_error(r, 403, "unauthorized", "this call needs an admin key");
        return -1;
}

int cove_h_tenant_create(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_tenant_create(app, r->key_id, body, &out, &err);
        json_decref(body);
        return cove_reply_result(r, rc, 201, out, &err);
}

int cove_h_tenant_list(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_tenant_list(app, &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_tenant_get(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_tenant_get(app, r->params[0], &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_tenant_quotas(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_tenant_set_quotas(app, r->key_id, r->params[0], body, &out, &err);
        json_decref(body);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_tenant_delete(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        struct cove_err err;
        int rc = coved_tenant_delete(app, r->key_id, r->params[0], &err);
        return cove_reply_result(r, rc, 204, NULL, &err);
}

int cove_h_apikey_create(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        json_t *body = cove_req_json(r, 1);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_apikey_issue(app, r->key_id, r->params[0], body, &out, &err);
        json_decref(body);
        return cove_reply_result(r, rc, 201, out, &err);
}

int cove_h_apikey_list(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_apikey_list(app, r->params[0], &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_apikey_revoke(void *app, struct cove_req *r)
{
        if (need_admin(r) < 0)
                return 0;
        struct cove_err err;
        int rc = coved_apikey_revoke(app, r->key_id, r->params[0], r->params[1], &err);
        return cove_reply_result(r, rc, 204, NULL, &err);
}

const char *cove_req_scoped_tenant(struct cove_req *r, json_t *body)
{
        const char *t = cove_req_query(r, "tenant");
        if ((!t || !*t) && body && json_is_string(json_object_get(body, "tenant")))
                t = json_string_value(json_object_get(body, "tenant"));
        if (!t || !*t || !strcmp(t, r->tenant))
                return r->tenant;
        if (!r->admin) {
                /* another tenant's key looks like a tenant that does not exist */
                cove_reply_error(r, 404, "not_found", "tenant %.64s not found", t);
                return NULL;
        }
        return t;
}

int cove_h_keys_get(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        const char *all = cove_req_query(r, "all");
        if (all && !strcmp(all, "true")) {
                if (need_admin(r) < 0)
                        return 0;
                int rc = coved_key_list(app, &out, &err);
                return cove_reply_result(r, rc, 200, out, &err);
        }
        const char *t = cove_req_scoped_tenant(r, NULL);
        if (!t)
                return 0;
        int rc = coved_key_status(app, t, &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

static int rewrap(void *app, struct cove_req *r, int rotate)
{
        if (need_admin(r) < 0)
                return 0;
        json_t *body = cove_req_json(r, rotate);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = -1;
        const char *t = cove_req_scoped_tenant(r, body);
        if (t)
                rc = coved_key_rewrap(app, r->key_id, t, body, rotate, &out, &err);
        json_decref(body);
        if (!t)
                return 0;
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_keys_add(void *app, struct cove_req *r)
{
        return rewrap(app, r, 0);
}

int cove_h_keys_rotate(void *app, struct cove_req *r)
{
        return rewrap(app, r, 1);
}

int cove_h_keys_revoke(void *app, struct cove_req *r)
{
        json_t *body = cove_req_json(r, 1);
        if (!body)
                return 0;
        /* revocation is final: the tenant is always named, never implied */
        if (!json_is_string(json_object_get(body, "tenant"))) {
                json_decref(body);
                return cove_reply_error(r, 400, "bad_request",
                                        "tenant is required: the tenant whose key is revoked "
                                        "(revocation is final)");
        }
        json_t *out = NULL;
        struct cove_err err;
        int rc = -1;
        const char *t = cove_req_scoped_tenant(r, body);
        if (t)
                rc = coved_key_revoke(app, r->key_id, t, body, &out, &err);
        json_decref(body);
        if (!t)
                return 0;
        return cove_reply_result(r, rc, 200, out, &err);
}
