/* REST routes of snapshot diffs (docs/api.md "Snapshot diffs"): thin, the work is in
 * control/snapdiff.c. A size bound is answered 413 limit_exceeded. */
#include <stdlib.h>

#include "api/routes.h"
#include "control/snapdiff.h"

static int reply(struct cove_req *r, int rc, json_t *out, const struct cove_err *err)
{
        if (rc < 0 && err->kind == COVE_E_LIMIT)
                return cove_reply_error(r, 413, "limit_exceeded", "%s", err->msg);
        return cove_reply_result(r, rc, 200, out, err);
}

int cove_h_snapshot_diff(void *app, struct cove_req *r)
{
        struct cove_err err;
        json_t *out = NULL;
        const char *lim = cove_req_query(r, "limit");
        size_t limit = 0;
        if (lim) {
                char *end;
                unsigned long long v = strtoull(lim, &end, 10);
                if (!*lim || *end || v == 0 || v > COVE_DIFF_ENTRIES_MAX)
                        return cove_reply_error(r, 400, "bad_request",
                                                "limit must be an integer from 1 to %u",
                                                COVE_DIFF_ENTRIES_MAX);
                limit = (size_t)v;
        }
        int rc = cove_snapshot_diff(app, r->tenant, r->params[0], r->params[1],
                                    cove_req_query(r, "path"), limit, &out, &err);
        return reply(r, rc, out, &err);
}

int cove_h_snapshot_diff_file(void *app, struct cove_req *r)
{
        struct cove_err err;
        json_t *out = NULL;
        int rc = cove_snapshot_diff_file(app, r->tenant, r->params[0], r->params[1],
                                         cove_req_query(r, "path"), &out, &err);
        return reply(r, rc, out, &err);
}
