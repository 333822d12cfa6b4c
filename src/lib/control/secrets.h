/* Egress secrets and credential leases (docs/egress.md; docs/architecture.md, trust rule 2).
 * A secret: a name ([A-Za-z_][A-Za-z0-9_]*, also the sandbox's env variable), a value
 * encrypted at rest with AES-256-GCM under HKDF(tenant DEK, COVE_KEY_INFO_SECRETS) (the
 * tenant and name are the associated data), host patterns it is bound to, and an injection
 * rule: {"header": H, "format": "… {value} …"} or {"placeholder": true}. No call returns a
 * value; values are decrypted only to build the gateway's injection table.
 * A lease lets one sandbox have one secret injected until it expires, whatever its policy
 * lists: created by the API (active at once) or asked for by the sandbox (pending until
 * approved or denied). Forks never inherit leases. */
#ifndef COVE_CONTROL_SECRETS_H
#define COVE_CONTROL_SECRETS_H

#include <jansson.h>

#include "node/egress.h" /* struct cove_policy, cove_inject: what the node is handed */
#include "util/err.h"

struct coved;

#define COVE_SECRET_VALUE_MAX 8192
#define COVE_LEASE_TTL_MAX (7 * 24 * 3600)

int coved_secret_put(struct coved *d, const char *tenant, const char *name, json_t *body,
                     json_t **out, struct cove_err *err);
int coved_secret_get(struct coved *d, const char *tenant, const char *name, json_t **out,
                     struct cove_err *err);
int coved_secret_list(struct coved *d, const char *tenant, json_t **out, struct cove_err *err);
int coved_secret_delete(struct coved *d, const char *tenant, const char *name,
                        struct cove_err *err);
/* 0 when every secret the policy lists exists for the tenant, else -1 BAD_REQUEST. */
int coved_secrets_check(struct coved *d, const char *tenant, const struct cove_policy *p,
                        struct cove_err *err);
/* Build the policy's injection table: its listed secrets and the sandbox's active leases,
 * with the sandbox's placeholders (an object name → token; a missing token is minted and
 * added, *changed set). Secrets that vanished are skipped (logged). */
int coved_secrets_injects(struct coved *d, const char *tenant, const char *sandbox,
                          struct cove_policy *p, json_t *placeholders, int *changed,
                          struct cove_err *err);

/* The value of the tenant's secret name for a connection to host (a registry: "h[:port]"),
 * for template pulls: -1 BAD_REQUEST unless the secret's hosts allow host. *value is
 * malloc'd; the caller wipes (OPENSSL_cleanse) and frees it, and never stores or logs it. */
int coved_secret_value_for_host(struct coved *d, const char *tenant, const char *name,
                                const char *host, char **value, struct cove_err *err);

/* Leases. body {secret, ttl_s}: active at once. */
int coved_lease_create(struct coved *d, const char *tenant, const char *sandbox, json_t *body,
                       json_t **out, struct cove_err *err);
/* From the sandbox (guest request): pending, reason kept (bounded). */
int coved_lease_request(struct coved *d, const char *tenant, const char *sandbox,
                        const char *secret, const char *reason, int ttl_s, json_t **out,
                        struct cove_err *err);
/* sandbox NULL: every lease of the tenant. */
int coved_lease_list(struct coved *d, const char *tenant, const char *sandbox, json_t **out,
                     struct cove_err *err);
/* approve (1) or deny (0) a pending lease; body may carry ttl_s for approve. */
int coved_lease_answer(struct coved *d, const char *tenant, const char *id, int approve,
                       json_t *body, json_t **out, struct cove_err *err);
int coved_lease_delete(struct coved *d, const char *tenant, const char *id, struct cove_err *err);
/* node on_ask: a sandbox program asks for a credential (a pending lease). */
json_t *coved_on_ask(void *arg, const char *sandbox_id, json_t *ask);
/* The sandbox is gone: its leases go too. */
void coved_leases_forget(struct coved *d, const char *tenant, const char *sandbox);

#endif
