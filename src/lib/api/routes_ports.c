/* Exposed ports: POST/GET /v1/sandboxes/{id}/ports, DELETE /v1/sandboxes/{id}/ports/{port}
 * (docs/api.md, docs/ports.md). */
#include <stdlib.h>
#include <string.h>

#include "api/http.h"

#include "api/routes.h"
#include "control/ports.h"

/* A control replica that forwarded the call names its preview address (X-Cove-Ports-Via),
 * for the URLs in the answer; trusted only from a control (node API, Cove-Node signed). */
static const char *via(struct cove_req *r)
{
        if (strncmp(r->key_id, "node:", 5) != 0)
                return NULL;
        const char *v = cove_req_header(r, "X-Cove-Ports-Via");
        if (!v || !*v || strlen(v) > 79 ||
            strspn(v, "0123456789abcdefghijklmnopqrstuvwxyz"
                      "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-:[]") != strlen(v) ||
            !strchr(v, ':'))
                return NULL;
        return v;
}

int cove_h_port_add(void *app, struct cove_req *r)
{
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return 0;
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_port_add(app, r->tenant, r->params[0], body, via(r), &out, &err);
        json_decref(body);
        return cove_reply_result(r, rc, 201, out, &err);
}

int cove_h_port_list(void *app, struct cove_req *r)
{
        json_t *out = NULL;
        struct cove_err err;
        int rc = coved_port_list(app, r->tenant, r->params[0], via(r), &out, &err);
        return cove_reply_result(r, rc, 200, out, &err);
}

int cove_h_port_delete(void *app, struct cove_req *r)
{
        const char *s = r->params[1];
        char *end = NULL;
        long port = strtol(s, &end, 10);
        if (!*s || *end || port < 1 || port > 65535)
                port = 0; /* refused after the sandbox lookup: another tenant's id is 404 */
        struct cove_err err;
        if (coved_port_delete(app, r->tenant, r->params[0], (unsigned)port, &err) < 0)
                return cove_reply_err(r, &err);
        return cove_reply_empty(r, 204);
}
