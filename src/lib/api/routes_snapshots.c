/* REST routes of the time machine (docs/api.md "Snapshots" and the pause, resume, rewind
 * and fork calls). Thin: bodies go to control/snapshot.c, which validates them. */
#include <string.h>

#include "api/routes.h"
#include "control/tenant.h"
#include "control/snapshot.h"

/* Parse the optional JSON body; NULL means the error was answered. */
static json_t *body_of(struct cove_req *r)
{
        return cove_req_json(r, 1);
}

static int reply(struct cove_req *r, int rc, unsigned status, json_t *out, struct cove_err *err)
{
        return rc < 0 ? cove_reply_err(r, err) : cove_reply_json(r, status, out);
}

int cove_h_snapshot_create(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *body = body_of(r);
        if (!body)
                return 0;
        struct cove_err err;
        json_t *lv = json_object_get(body, "label"), *kv = json_object_get(body, "kind");
        int rc = 0;
        if (lv && !json_is_null(lv) &&
            (!json_is_string(lv) || strlen(json_string_value(lv)) != json_string_length(lv)))
                rc = cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "label must be a string");
        else if (kv && !json_is_null(kv) && !json_is_string(kv))
                rc = cove_err_setk(&err, COVE_E_BAD_REQUEST, 0,
                                   "kind must be \"files\" or \"full\"");
        struct cove_snapshot_row s = {0};
        if (rc == 0)
                rc = cove_snapshot_take(d, r->tenant, r->params[0], json_string_value(lv),
                                        json_string_value(kv), 0, &s, &err);
        json_decref(body);
        return reply(r, rc, 201, rc < 0 ? NULL : cove_snapshot_json(&s), &err);
}

int cove_h_snapshot_list(void *app, struct cove_req *r)
{
        struct coved *d = app;
        struct cove_err err;
        json_t *out = NULL;
        int rc = cove_snapshot_list_json(d, r->tenant, r->params[0], &out, &err);
        return reply(r, rc, 200, out, &err);
}

int cove_h_snapshot_get(void *app, struct cove_req *r)
{
        struct coved *d = app;
        struct cove_err err;
        struct cove_snapshot_row s;
        int rc = cove_snapshot_load(d, r->tenant, r->params[0], &s, &err);
        if (rc == 0) /* reading a snapshot needs the tenant's key (after the 404 check) */
                rc = coved_key_gate(d, s.tenant, &err);
        return reply(r, rc, 200, rc < 0 ? NULL : cove_snapshot_json(&s), &err);
}

int cove_h_snapshot_delete(void *app, struct cove_req *r)
{
        struct coved *d = app;
        struct cove_err err;
        if (cove_snapshot_remove(d, r->tenant, r->params[0], &err) < 0)
                return cove_reply_err(r, &err);
        return cove_reply_empty(r, 204);
}

typedef int (*op_fn)(struct coved *d, const char *tenant, const char *id, json_t *body,
                     json_t **out, struct cove_err *err);

static int op(void *app, struct cove_req *r, op_fn fn, unsigned status)
{
        json_t *body = body_of(r);
        if (!body)
                return 0;
        struct cove_err err;
        json_t *out = NULL;
        int rc = fn(app, r->tenant, r->params[0], body, &out, &err);
        json_decref(body);
        return reply(r, rc, status, out, &err);
}

static int pause_fn(struct coved *d, const char *tenant, const char *id, json_t *body, json_t **out,
                    struct cove_err *err)
{
        (void)body;
        return cove_sandbox_pause(d, tenant, id, out, err);
}

int cove_h_pause(void *app, struct cove_req *r)
{
        return op(app, r, pause_fn, 200);
}

int cove_h_resume(void *app, struct cove_req *r)
{
        return op(app, r, cove_sandbox_resume, 200);
}

int cove_h_rewind(void *app, struct cove_req *r)
{
        return op(app, r, cove_sandbox_rewind, 200);
}

int cove_h_fork(void *app, struct cove_req *r)
{
        return op(app, r, cove_sandbox_fork, 201);
}
