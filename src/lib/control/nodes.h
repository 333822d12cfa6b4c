/* Nodes seen from the control plane (docs/cluster.md "Node loss, drain, cordon"): the node
 * list and its admin calls, drains, and the node-loss sweeper. Role control; the admin
 * calls answer for role all too (no cluster nodes there).
 *
 * Every replica runs the same background thread; what one replica does another may do at
 * the same moment, so each decision is a compare-and-set on the sandbox's placement
 * generation (placement_write): of two replicas moving or recovering the same sandbox, one
 * wins and the other leaves it. The state a drain or a recovery continues from is in the
 * catalog (the node's state, the placements), never in a replica's memory, so a restarted
 * replica carries on where another left off. */
#ifndef COVE_CONTROL_NODES_H
#define COVE_CONTROL_NODES_H

#include <jansson.h>
#include <stdint.h>

#include "util/err.h"

struct coved;

#define COVED_DRAIN_PAUSE_MS 200     /* between two moves of one drain */
#define COVED_MOVE_TIMEOUT_MS 120000 /* one pause or resume on a node */

/* Start the sweeper/drain thread (role control; a no-op in other roles). Options come from
 * d->nodes_opt (0s are defaults). */
int coved_nodes_start(struct coved *d, struct cove_err *err);
/* Stop and join it (no-op when not started). */
void coved_nodes_stop(struct coved *d);

/* GET /v1/nodes: {"nodes":[…]} by name (new reference in *out). */
int coved_nodes_list(struct coved *d, json_t **out, struct cove_err *err);
/* POST /v1/nodes/{name}/cordon|uncordon|drain by the admin key actor: cordon → "cordoned"
 * (no new placements), uncordon → "ready" (also stops a drain), drain → "draining" (no new
 * placements; the thread moves its sandboxes off one at a time). 0 with the node's JSON;
 * -1 with NOT_FOUND (unknown node), CONFLICT (a lost node), BAD_REQUEST (action). */
int coved_node_admin(struct coved *d, const char *name, const char *action, const char *actor,
                     json_t **out, struct cove_err *err);

/* One pass of the node-loss sweeper at now_ms (unix ms): a node whose lease expired more
 * than the grace ago (and more than its TTL + grace after its last renewal) becomes "lost";
 * each sandbox placed on a lost node whose desired state is not "stopped" is re-placed:
 * a running one on another node with a "recover" job from its newest snapshot (the row's
 * recovered_from written first), a paused one moved without a job, one without any
 * snapshot stopped with the reason in its error. Returns how many sandboxes it changed,
 * -1 on a catalog error. */
int coved_nodes_sweep(struct coved *d, int64_t now_ms, struct cove_err *err);

/* A node restarted (docs/cluster.md "A node restarted"): for node (ready, its lease live),
 * a "resume" job on it for every sandbox placed there whose desired state is "running"
 * and that its start-up reconcile left paused at a snapshot (observed and row "paused"),
 * placed with a compare-and-set on the generation read. Nothing while the node has any job
 * open (one its old process claimed is taken back and converges by itself). tried (a JSON
 * object, NULL: none) holds the ids already resumed this way: they are skipped, and each
 * one placed is added. The sweeper calls it for a while after it sees a node's new epoch.
 * Returns how many it placed, -1 on a catalog error. */
int coved_nodes_resume_restarted(struct coved *d, const char *node, json_t *tried,
                                 struct cove_err *err);
/* One step of the drain of node: moves one sandbox off it (running: pause, full where the
 * node can, then resume elsewhere; paused: re-placed). 0 a sandbox was handled (moved, or
 * its move failed and was audited), 1 nothing left to move (or node is not draining), 2
 * nothing can move now (no node can take any of them), -1 on a catalog error. */
int coved_nodes_drain_step(struct coved *d, const char *node, struct cove_err *err);

#endif
