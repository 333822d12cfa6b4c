/* The catalog's rows as JSON, for the remote catalog (store/catalog_remote.c, the node's
 * side) and the control's endpoint (api/routes_cluster.c, POST /v1/cluster/catalog/<op>).
 * Both sides decode what the other sent as untrusted input: every member must have its
 * type, strings must fit the row's field (strnlen < size), contain no NUL byte and owned
 * texts stay under COVE_WIRE_TEXT_MAX; numbers are integers in range. A decoder fills the
 * row only on success (owned strings are freed on failure) and returns -1 with
 * COVE_E_BAD_REQUEST naming the member, never its value. */
#ifndef COVE_STORE_CATALOG_WIRE_H
#define COVE_STORE_CATALOG_WIRE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "store/catalog.h"
#include "util/err.h"

#define COVE_WIRE_TEXT_MAX (1u << 20) /* an owned JSON text (metadata, a document, …) */

/* Members of an object. required 0: a missing member (or JSON null) gives "" / 0 / NULL. */
int cove_wire_str(const json_t *o, const char *key, char *buf, size_t cap, int required,
                  struct cove_err *err);
int cove_wire_i64(const json_t *o, const char *key, int64_t *v, int64_t min, int64_t max,
                  int required, struct cove_err *err);
int cove_wire_bool(const json_t *o, const char *key, int *v, int required, struct cove_err *err);
/* An owned text (malloc'd, NUL-free, < max bytes); NULL when missing or null. */
int cove_wire_text(const json_t *o, const char *key, char **out, size_t max, int required,
                   struct cove_err *err);
/* A member that may be a string or null: *out points into o (valid while o lives), NULL
 * for null / missing. Bounded by cap like cove_wire_str. */
int cove_wire_opt(const json_t *o, const char *key, const char **out, size_t cap,
                  struct cove_err *err);

json_t *cove_wire_tenant(const struct cove_tenant_row *t);
int cove_wire_tenant_from(const json_t *o, struct cove_tenant_row *t, struct cove_err *err);
json_t *cove_wire_apikey(const struct cove_apikey_row *k);
int cove_wire_apikey_from(const json_t *o, struct cove_apikey_row *k, struct cove_err *err);
json_t *cove_wire_sandbox(const struct cove_sandbox_row *s);
/* Frees nothing of *s beforehand; on success the owned strings are new. */
int cove_wire_sandbox_from(const json_t *o, struct cove_sandbox_row *s, struct cove_err *err);
json_t *cove_wire_snapshot(const struct cove_snapshot_row *s);
int cove_wire_snapshot_from(const json_t *o, struct cove_snapshot_row *s, struct cove_err *err);
json_t *cove_wire_audit(const struct cove_audit_row *a);
int cove_wire_audit_from(const json_t *o, struct cove_audit_row *a, struct cove_err *err);
json_t *cove_wire_node(const struct cove_node_row *n);
int cove_wire_node_from(const json_t *o, struct cove_node_row *n, struct cove_err *err);
json_t *cove_wire_placement(const struct cove_placement_row *p);
int cove_wire_placement_from(const json_t *o, struct cove_placement_row *p, struct cove_err *err);
json_t *cove_wire_job(const struct cove_job_row *j);
int cove_wire_job_from(const json_t *o, struct cove_job_row *j, struct cove_err *err);

#endif
