/* API keys: "cove_<key id>_<secret>", where the key id ("key_" + 20 base32 chars) is public
 * and the secret (32 random bytes, lowercase hex) is stored only as SHA-256(salt || secret)
 * with a per-key random salt. Verification is one hash plus one indexed lookup; no cache,
 * so a revocation takes effect on the next request. */
#ifndef COVE_CONTROL_APIKEY_H
#define COVE_CONTROL_APIKEY_H

#include <stddef.h>

#include "store/catalog.h"
#include "util/err.h"

#define COVE_APIKEY_PREFIX "cove_"
#define COVE_APIKEY_ID_LEN 24     /* "key_" + 20 */
#define COVE_APIKEY_SECRET_LEN 32 /* bytes; 64 hex chars in the key string */
#define COVE_APIKEY_LEN (5 + COVE_APIKEY_ID_LEN + 1 + 2 * COVE_APIKEY_SECRET_LEN) /* 94 */
#define COVE_APIKEY_BUF (COVE_APIKEY_LEN + 1) /* a buffer for key_out */

/* Create a key for tenant (which must exist: COVE_E_NOT_FOUND otherwise) and store its
 * hashed row. On success writes the full key (NUL-terminated) to key_out (cap >=
 * COVE_APIKEY_BUF) — the only time it exists: show it once, never log it. Its public id is
 * key_out[5..29). On failure nothing is stored and key_out holds "". */
int cove_apikey_create(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                       const char *tenant, int admin, char *key_out, size_t cap,
                       struct cove_err *err);

/* Check a presented key string. 0: valid and not revoked, *out filled (if non-NULL).
 * -1 with kind COVE_E_UNAUTHORIZED for a malformed, unknown, wrong or revoked key (the
 * message never contains the presented string); -1 with another kind if the catalog
 * failed (callers must refuse the request either way). */
int cove_apikey_verify(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                       const char *presented, struct cove_apikey_row *out, struct cove_err *err);

/* Revoke key id. tenant non-NULL: the key must belong to it. 0 revoked (or already),
 * 1 not found, -1 error. Irreversible. */
int cove_apikey_revoke(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                       const char *tenant, const char *id, struct cove_err *err);

/* Create tenant "default" (name "default") if missing. 1 created, 0 existed, -1 error. */
int cove_tenant_ensure_default(const struct cove_catalog_ops *ops, struct cove_catalog *c,
                               struct cove_err *err);

#endif
