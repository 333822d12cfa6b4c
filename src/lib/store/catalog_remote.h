/* The catalog through a control replica (store/catalog_remote.c): what a node uses when it
 * is given --control URL and no --db, so it holds no database credentials. Each op of
 * cove_catalog_remote is one POST /v1/cluster/catalog/<op> to the control, signed with the
 * node's token (cluster/nodeauth.h); the control runs it on its catalog only where this
 * node may (docs/cluster.md "Trust": its own lease and jobs, the sandboxes placed on it),
 * and answers 403 forbidden / not found otherwise (COVE_E_UNAUTHORIZED / 1 here).
 *
 * Failures: COVE_E_UNAVAILABLE when the control cannot be reached, did not answer in time
 * or answered something malformed or too large (COVE_REMOTE_ANSWER_MAX); the outcome of a
 * write is then unknown, as with a database. Reads and idempotent writes (catalog.h: an
 * overwrite, renew, observe, finish, put) are retried up to twice with backoff and jitter;
 * other writes only when the connection was never made. An answer whose Cove-Node-Answer
 * does not prove the control holds this node's token is refused (COVE_E_UNAUTHORIZED).
 * Each call waits at most COVE_REMOTE_CALL_TIMEOUT_MS (environment, default 35000). */
#ifndef COVE_STORE_CATALOG_REMOTE_H
#define COVE_STORE_CATALOG_REMOTE_H

#include <stddef.h>

#include "store/catalog.h"

#define COVE_REMOTE_ANSWER_MAX (64u << 20) /* bytes of one answer */
#define COVE_REMOTE_WAIT_MAX_MS 25000      /* one wait_wakeup long poll */

extern const struct cove_catalog_ops cove_catalog_remote;

/* url: http(s)://HOST:PORT of a control replica ("cove+" in front is accepted); node_name
 * and token (64 hex digits, copied) are this node's identity. Checks the control answers
 * and that its schema is not newer than this build. ops->open(dsn) refuses: the remote
 * catalog needs an identity, not a dsn. */
struct cove_catalog *cove_catalog_remote_open(const char *url, const char *node_name,
                                              const char *token, struct cove_err *err);

/* Tests and fuzzing only: a handle that sends nothing and takes answer[0..len) as the
 * control's (signed) answer to every call, so each op's decoder runs on those bytes. */
struct cove_catalog *cove_catalog_remote_canned(const char *answer, size_t len);

#endif
