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

/* Wait up to timeout_ms for a placement_write that may have enqueued work: one caller at a
 * time runs the catalog's wait_wakeup (any node, slices of at most 1 s) and wakes all the
 * others. 0 woken, 1 timed out, -1 error (of this caller's own wait). A hint, like
 * wait_wakeup itself: a wake-up for one node wakes every waiter. */
int cove_catsrv_wait(struct cove_catsrv *s, const struct cove_catalog_ops *ops,
                     struct cove_catalog *cat, int timeout_ms, const int *quitting,
                     struct cove_err *err);

#endif
