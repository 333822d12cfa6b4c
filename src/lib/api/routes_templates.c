/* Template routes (docs/api.md "Templates"): the built-ins and a tenant's own, built from
 * images (control/tbuild.h), with their build events as NDJSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/routes.h"
#include "control/tbuild.h"
#include "control/template.h"

int cove_h_templates_list(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_template_list(app, r->tenant, &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

/* POST {name} alone builds a built-in (admin, synchronous, 201); with from, a tenant's
 * template (202, building). */
int cove_h_template_post(void *app, struct cove_req *r)
{
        struct coved *d = app;
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        const char *name = json_string_value(json_object_get(body, "name"));
        json_t *from = json_object_get(body, "from");
        struct cove_err err;
        json_t *out = NULL;
        int rc;
        if (from) {
                if (!r->admin && json_is_object(from) &&
                    (json_object_get(from, "oci_archive") ||
                     json_object_get(from, "docker_archive"))) {
                        json_decref(body);
                        return cove_reply_error(r, 403, "unauthorized",
                                                "importing an archive from this node's "
                                                "filesystem is admin only");
                }
                rc = coved_template_create(d, r->tenant, r->admin, body, &out, &err);
                json_decref(body);
                return cove_reply_result(r, rc, 202, out, &err);
        }
        if (!r->admin) {
                json_decref(body);
                return cove_reply_error(r, 403, "unauthorized",
                                        "building a built-in template is admin only");
        }
        if (!name)
                rc = cove_err_setk(&err, COVE_E_BAD_REQUEST, 0, "name is required");
        else if (!cove_template_known(name))
                rc = cove_err_setk(&err, COVE_E_NOT_FOUND, 0,
                                   "unknown template '%s': built-ins are busybox, base and "
                                   "code-interpreter; "
                                   "other templates need \"from\"",
                                   name);
        else
                rc = cove_template_build(d->templates_dir, name, NULL, NULL, &err);
        if (rc == 0)
                rc = coved_template_get(d, r->tenant, name, &out, &err);
        json_decref(body);
        return cove_reply_result(r, rc, 201, out, &err);
}

int cove_h_template_get(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_template_get(app, r->tenant, r->params[0], &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_template_delete(void *app, struct cove_req *r)
{
        struct cove_err err;
        int rc = coved_template_delete(app, r->tenant, r->params[0], &err);
        return cove_reply_result(r, rc, 204, NULL, &err);
}

static ssize_t ev_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        return coved_tbuild_read(ctx, pos, buf, max, 1000);
}

static void ev_free(void *ctx)
{
        coved_tbuild_unref(ctx);
}

int cove_h_template_events(void *app, struct cove_req *r)
{
        struct cove_err err;
        struct coved_tbuild *b = coved_template_events(app, r->tenant, r->params[0], &err);
        if (!b)
                return cove_reply_err(r, &err);
        return cove_reply_stream(r, 200, "application/x-ndjson", -1, ev_read, ev_free, b);
}
