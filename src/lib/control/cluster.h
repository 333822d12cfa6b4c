/* The control plane's side of the cluster (role control only): lifecycle steps through
 * placements and jobs. The cluster core provides this header and its implementation; until
 * it is merged, control/cluster_standin.c implements the one call the node admin code uses
 * (a STAND-IN: delete it at the merge). */
#ifndef COVE_CONTROL_CLUSTER_H
#define COVE_CONTROL_CLUSTER_H

#include <jansson.h>
#include <stdint.h>

#include "util/err.h"

struct coved;

/* Run one lifecycle step of sandbox_id on its node and wait for the node's outcome.
 * place_on: a node name to (re)place it on (generation + 1), NULL: stay where it is.
 * desired: the desired state after the step ("running", "paused", "stopped").
 * kind: job kind (below). args: job arguments (borrowed, may be NULL).
 * expect_generation: CAS (-1: any). timeout_ms: how long to wait for the node.
 * 0 with *result (new ref: the job's result object), or -1 with err (the node's error
 * re-raised with its kind; UNAVAILABLE when the node did not answer in time). */
int coved_cluster_step(struct coved *d, const char *sandbox_id, const char *place_on,
                       const char *desired, const char *kind, json_t *args,
                       int64_t expect_generation, int timeout_ms, json_t **result,
                       struct cove_err *err);

#endif
