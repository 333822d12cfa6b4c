/* STAND-IN for the cluster core's coved_cluster_step (control/cluster.h) until it is merged:
 * delete this file at the merge. It writes the placement and the job in one transaction
 * (placement_write) and polls the job until the node finishes it. It cannot pass args (the
 * jobs table has no column for them before the core's schema step), so the node side sees
 * none; the node admin code (control/nodes.c) is written against the real contract. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "control/cluster.h"
#include "control/coved.h"
#include "util/util.h"

int coved_cluster_step(struct coved *d, const char *sandbox_id, const char *place_on,
                       const char *desired, const char *kind, json_t *args,
                       int64_t expect_generation, int timeout_ms, json_t **result,
                       struct cove_err *err)
{
        (void)args;
        int64_t gen = 0, job = 0;
        if (d->cat_ops->placement_write(d->cat, sandbox_id, place_on, desired, kind,
                                        expect_generation, &gen, &job, err) < 0)
                return -1;
        int64_t deadline = cove_mono_ns() / 1000000 + timeout_ms;
        for (;;) {
                struct cove_job_row j;
                int r = d->cat_ops->job_get(d->cat, job, &j, err);
                if (r < 0)
                        return -1;
                if (r == 0 && (!strcmp(j.state, "done") || !strcmp(j.state, "failed"))) {
                        json_error_t je;
                        json_t *res = j.result_json ? json_loads(j.result_json, 0, &je) : NULL;
                        int ok = !strcmp(j.state, "done");
                        cove_job_row_clear(&j);
                        if (ok) {
                                *result = res ? res : json_object();
                                return 0;
                        }
                        const char *msg = json_string_value(
                            json_object_get(json_object_get(res, "error"), "message"));
                        cove_err_setk(err, COVE_E_CONFLICT, 0, "%s of %s failed on its node: %s",
                                      kind, sandbox_id, msg ? msg : "no reason given");
                        json_decref(res);
                        return -1;
                }
                if (r == 0)
                        cove_job_row_clear(&j);
                if (cove_mono_ns() / 1000000 >= deadline)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "%s of %s: its node did not answer within %d ms", kind,
                                             sandbox_id, timeout_ms);
                struct timespec ts = {0, 20 * 1000000};
                nanosleep(&ts, NULL);
        }
}
