/* E2B-compatible surface (docs/e2b.md): agents written for the E2B SDKs run on cove unchanged.
 * Two extra HTTP listeners over the same coved context:
 *   - the control plane (E2B_API_URL, default port 3000): sandboxes create/list/get/kill,
 *     timeout, connect, pause (answered "not possible" until snapshots land), metrics;
 *   - the in-sandbox surface (E2B_SANDBOX_URL, default port 49983): envd's Connect RPC
 *     (JSON codec) for process.Process and filesystem.Filesystem, plain /health and
 *     GET/POST /files, routed by the E2b-Sandbox-Id header (or a {port}-{id}.domain host),
 *     translated into guest channel calls by this node. cove-guest has no HTTP server.
 * Stateless credentials: an E2B API key is "e2b_" + hex(cove API key), and a sandbox's
 * envdAccessToken is hex HMAC-SHA256(secret, sandbox id) with a per-node 32-byte secret
 * kept in <data_dir>/e2b.secret (0600). See docs/e2b.md. */
#ifndef COVE_API_E2B_H
#define COVE_API_E2B_H

#include <stdarg.h>

#include "api/http.h"
#include "control/coved.h"

#define COVE_E2B_ENVD_VERSION "0.6.4" /* the envd behaviour this surface matches */
#define COVE_E2B_ENVD_PORT 49983
#define COVE_E2B_USER "user"  /* default user of processes and file operations */
#define COVE_E2B_TOKEN_HEX 65 /* buffer for a hex envdAccessToken */

struct cove_e2b {
        struct coved *d;
        unsigned char secret[32]; /* HMAC key of the envd access tokens */
        struct cove_http *api;    /* control plane listener, may be NULL */
        struct cove_http *envd;   /* in-sandbox listener, may be NULL */
};

/* Load or create <data_dir>/e2b.secret and start the listeners given (either may be NULL;
 * both NULL starts nothing and sets *out to NULL). On failure nothing is left running. */
int cove_e2b_start(struct coved *d, const char *api_listen, const char *sandbox_listen,
                   struct cove_e2b **out, struct cove_err *err);
/* Stop the listeners (open streams end) and free. NULL is fine. */
void cove_e2b_stop(struct cove_e2b *e);

/* ---- shared by api/e2b.c and api/e2b_envd.c ---------------------------------------- */

/* The sandbox's envdAccessToken: lowercase hex HMAC-SHA256(secret, id). */
void cove_e2b_token(const struct cove_e2b *e, const char *sandbox_id, char out[COVE_E2B_TOKEN_HEX]);
/* The sandbox's trafficAccessToken (its ports): "cpt_" + hex HMAC-SHA256(secret,
 * "traffic:" + id), 52 characters. */
void cove_e2b_traffic_token(const struct cove_e2b *e, const char *sandbox_id, char out[80]);
/* Decode an "e2b_<hex>" key to the cove key it carries (out >= 128 bytes). 0 or -1. */
int cove_e2b_key_decode(const char *e2b_key, char *out, size_t cap);

extern const struct cove_route cove_e2b_envd_routes[];
extern const size_t cove_e2b_envd_nroutes;

/* In a cluster (docs/cluster.md "Sandbox traffic"): a control replica's envd listener checks
 * access (token, signed URL) and forwards to the sandbox's node (api/forward.h); the node
 * serves the same handlers under /e2b on its node API, to control replicas only. */
extern const struct cove_route cove_e2b_envd_ctl_routes[];
extern const size_t cove_e2b_envd_ctl_nroutes;
extern const struct cove_route cove_e2b_node_routes[]; /* app: the struct coved */
extern const size_t cove_e2b_node_nroutes;
/* Role node: the E2B context of the node API (no listener, a random secret that checks
 * nothing: the control replicas check access). Freed by cove_e2b_stop(). */
struct cove_e2b *cove_e2b_node_new(struct coved *d, struct cove_err *err);

#endif
