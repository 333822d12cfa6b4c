/* Internal to cluster/: the state behind struct coved's `cl` (control/cluster.h), shared by
 * the control's lifecycle (lifecycle.c) and the node's agent (agent.c). */
#ifndef COVE_CLUSTER_INTERNAL_H
#define COVE_CLUSTER_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "control/coved.h"

struct cove_agent;

struct coved_cluster {
        pthread_mutex_t mu;
        pthread_cond_t cv; /* control: a job may have finished; node: quit */
        int quit;
        /* role control: the job-outcome waiter */
        uint64_t seq; /* bumped on every wake-up (or poll tick) */
        pthread_t waiter;
        int waiter_started;
        /* role node */
        struct cove_agent *agent;
};

/* agent.c: start (acquire the lease, start the threads) and stop the node's agent. */
int cove_agent_open(struct coved *d, struct coved_cluster *cl, struct cove_err *err);
void cove_agent_close(struct coved *d, struct coved_cluster *cl);

#endif
