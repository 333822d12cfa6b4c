/* The cluster side of coved (docs/cluster.md): in role control, lifecycle calls become a
 * placement + a job in one catalog transaction and a wait for the owning node's outcome
 * (cluster/lifecycle.c); in role node, the agent that holds the node's lease, claims and
 * runs its jobs and fences the node when it cannot prove its lease (cluster/agent.c).
 * Nothing here runs in role all (d->cl stays NULL). */
#ifndef COVE_CONTROL_CLUSTER_H
#define COVE_CONTROL_CLUSTER_H

#include <jansson.h>
#include <stdint.h>

#include "control/coved.h"
#include "util/err.h"

/* Role control: start the job-outcome waiter (one LISTEN per process, woken by
 * cove_job_done, polled as a fallback). Role node: acquire the lease (waiting, with a log
 * line, while a previous process's lease is live), then start the lease, fence and job
 * threads. Role all: nothing (d->cl stays NULL). */
int coved_cluster_open(struct coved *d, struct cove_err *err);
/* Stop the threads (role node: the lease is left to expire; the instances end with the
 * node). Safe when never opened. */
void coved_cluster_close(struct coved *d);

/* role control only.
 * Run one lifecycle step of sandbox_id on its node and wait for the node's outcome.
 * place_on: a node name to (re)place it on (generation + 1), NULL: stay where it is.
 * desired: the desired state after the step ("running", "paused", "stopped").
 * kind: job kind (docs/cluster.md "Jobs"). args: job arguments (borrowed, may be NULL).
 * expect_generation: CAS (-1: any). timeout_ms: how long to wait for the node.
 * 0 with *result (new ref: the job's result object), or -1 with err (the node's error
 * re-raised with its kind; UNAVAILABLE when the node did not answer in time). */
int coved_cluster_step(struct coved *d, const char *sandbox_id, const char *place_on,
                       const char *desired, const char *kind, json_t *args,
                       int64_t expect_generation, int timeout_ms, json_t **result,
                       struct cove_err *err);

/* Role control: the lifecycle calls of control/sandbox.c and control/snapshot.c, through
 * jobs. create: s is the validated row (id, state, node and uid_base are filled here),
 * egress the validated policy (borrowed, NULL: none); quota was admitted by the caller,
 * under coved_quota_lock, which this releases once the row is inserted. Answers like the
 * in-process calls. */
int coved_cluster_create(struct coved *d, const char *tenant, struct cove_sandbox_row *s,
                         json_t *egress, json_t **out, struct cove_err *err);
int coved_cluster_delete(struct coved *d, const char *tenant, const char *id, int purge,
                         struct cove_err *err);
int coved_cluster_pause(struct coved *d, const char *tenant, const char *id, const char *kind,
                        json_t **out, struct cove_err *err);
int coved_cluster_resume(struct coved *d, const char *tenant, const char *id, json_t *body,
                         json_t **out, struct cove_err *err);
int coved_cluster_rewind(struct coved *d, const char *tenant, const char *id, json_t *body,
                         json_t **out, struct cove_err *err);
int coved_cluster_fork(struct coved *d, const char *tenant, const char *id, json_t *body,
                       json_t **out, struct cove_err *err);
/* A snapshot of a running sandbox taken by its node; *out: the snapshot row. */
int coved_cluster_snapshot(struct coved *d, const char *tenant, const char *id, const char *label,
                           const char *kind, struct cove_snapshot_row *out, struct cove_err *err);

/* Role node: 1 when the sandbox row's node is this node (timers, rolling snapshots and
 * retention act only on those); always 1 in role all. */
int coved_cluster_mine(const struct coved *d, const struct cove_sandbox_row *row);

/* Role node: 1 while the node holds a confirmed lease (not fenced), so it may write about
 * its own sandboxes (timers, instance deaths); role all: always 1; role control: 0. */
int coved_cluster_writable(struct coved *d);
/* Before a node writes sandbox_id's row on its own (not for a job: those are fenced by
 * job_finish): records state as observed through the fenced placement_observe, under the
 * node's current epoch and the sandbox's current generation. 0 when accepted (the sandbox
 * is placed on this node, whose lease is live), -1 with err (CONFLICT: not this node's to
 * write now). Role all: 0, nothing written. desired: NULL, or what the node settles the
 * sandbox to on its own (its timeout: "paused", "stopped"), written as the placement's
 * desired state in the same statement. */
int coved_cluster_observe(struct coved *d, const char *sandbox_id, const char *state,
                          const char *desired, struct cove_err *err);

/* Every write of a sandbox row that may run on a node goes through here. Role node: the
 * catalog's sandbox_update_fenced under the node's live epoch and the generation it works
 * at (the job's being run for that sandbox, else the one its instance runs for, else the
 * current placement's on this node): refused (COVE_E_CONFLICT, nothing written) when the
 * lease lapsed or the sandbox was placed again meanwhile. Other roles: sandbox_update.
 * Answers as sandbox_update (1: absent). */
int coved_cluster_sandbox_update(struct coved *d, const struct cove_sandbox_row *s,
                                 struct cove_err *err);

/* Job results and errors on the wire (jobs.result_json): {"error":{"code","message"}}
 * with the API's error codes. */
json_t *coved_job_error_json(const struct cove_err *err);
/* 0 when result is no error object; else -1 with err filled from it (kind from the code). */
int coved_job_error_from(json_t *result, struct cove_err *err);

#endif
