/* State of a control replica's catalog endpoint for nodes (api/routes_cluster.c,
 * POST /v1/cluster/catalog/<op>): the nonce cache that refuses a replayed Cove-Node
 * request within the signature's time window, and the hub that lets many nodes long-poll
 * wait_wakeup on the replica's one catalog waiter. Created on first use, freed by
 * coved_close. Thread-safe. */
#ifndef COVE_CLUSTER_CATSRV_H
#define COVE_CLUSTER_CATSRV_H

#include <stdint.h>

#include "store/catalog.h"
#include "util/err.h"

struct cove_catsrv;

struct cove_catsrv *cove_catsrv_new(void);
void cove_catsrv_free(struct cove_catsrv *s);

/* Record (name, nonce) of a request signed at ts (already verified, so inside the window).
 * 0 first use, -1 with UNAUTHORIZED for a replay, or UNAVAILABLE when the cache is full of
 * live entries (the caller answers 503; entries live twice COVE_NODEAUTH_SKEW_MS). */
int cove_catsrv_nonce(struct cove_catsrv *s, const char *name, const char *nonce, int64_t ts,
                      int64_t now_ms, struct cove_err *err);

/* Nodes' long polls (wait_wakeup through the control) wait here, up to timeout_ms, for the
 * replica's one catalog waiter (cluster/lifecycle.c: wait_wakeup(NULL) in a loop) to report
 * a wake-up with cove_catsrv_woken: PostgreSQL's listener serves one waiter at a time, so
 * nodes never call it themselves. 0 woken, 1 timed out (or quitting). A hint, like
 * wait_wakeup itself: any placement or finished job wakes every node's poll. */
int cove_catsrv_wait(struct cove_catsrv *s, int timeout_ms, const int *quitting);
void cove_catsrv_woken(struct cove_catsrv *s);

/* d's catsrv, created on first use (NULL on ENOMEM); freed by coved_close. */
struct coved;
struct cove_catsrv *coved_catsrv(struct coved *d);

#endif
