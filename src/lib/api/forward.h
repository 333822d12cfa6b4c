/* Sandbox traffic between a control replica and the node that runs the sandbox
 * (docs/cluster.md "Sandbox traffic", "Trust"):
 *
 * - control side: cove_forward() sends a request as it came (method, canonical target,
 *   the headers that matter, the body streamed from the upload callback) to the owning
 *   node's node API, signed with that node's token (cluster/nodeauth.h), and relays the
 *   answer (status, safe headers, the body chunk by chunk). Nothing is buffered whole:
 *   blocking writes to the node socket hold back the client (back-pressure), and the answer
 *   goes through one fixed buffer. A client that goes away closes the node connection, so
 *   a stream (process events, fs watch) ends on both sides.
 * - node side: cove_nodeapi_auth() is the node API's authentication hook: only Cove-Node
 *   requests signed with this node's token, fresh, never seen before (a nonce cache over
 *   the time window), for a sandbox placed on this node.
 *
 * Nothing here runs in role all. */
#ifndef COVE_API_FORWARD_H
#define COVE_API_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "api/http.h"
#include "control/coved.h"

#define COVE_FWD_HEAD_MAX 16384 /* a node's answer head */
#define COVE_FWD_HDRS_MAX 32    /* header lines in it */
#define COVE_FWD_BUF 65536      /* the relay buffer, per forwarded request */
#define COVE_FWD_TARGET_MAX 8192

struct cove_fwd_options {
        int connect_timeout_ms; /* connecting to a node (0: 5000) */
        int head_timeout_ms;    /* a node's answer head, exec excepted (0: 60000) */
        int stall_timeout_ms;   /* one blocked write of a request body to a node (0: 60000) */
};

/* The forwarder's and the node API's process state (d->fwd): options, the node API's
 * replay cache. */
struct cove_fwd;
struct cove_fwd *cove_fwd_new(const struct cove_fwd_options *o, struct cove_err *err);
void cove_fwd_free(struct cove_fwd *f);

/* The route table a role serves, built from base (owned by f, valid until the next call
 * or cove_fwd_free): role control forwards every COVE_ROUTE_SANDBOX route (cove_fwd_h /
 * cove_fwd_up) and keeps the others; role node serves only the COVE_ROUTE_SANDBOX routes,
 * /healthz (public), /metrics (Cove-Node authenticated) and extra (the node's own routes:
 * the E2B envd surface). NULL on ENOMEM. */
const struct cove_route *cove_fwd_routes(struct cove_fwd *f, enum coved_role role,
                                         const struct cove_route *base, size_t n,
                                         const struct cove_route *extra, size_t nextra,
                                         size_t *out_n);

/* Role control: forward r to the node that runs sandbox_id (placement_get → node row →
 * address) and answer r with the node's answer. Checks first that the sandbox is r's
 * tenant's (404 otherwise, as every route does). Answers 503 unavailable itself when the
 * sandbox is not placed, its node is unknown, unreachable or lost, or the node's answer is
 * not authentic or malformed. For upload routes, call cove_forward_upload() from the
 * route's upload callback; cove_forward() then finishes the request. Returns 0. */
int cove_forward(struct coved *d, struct cove_req *r, const char *sandbox_id);
/* The upload callback of a forwarded route: the first piece opens the node connection,
 * each piece is written to it (blocking: back-pressure). Non-zero stops the upload (the
 * error is answered by cove_forward()). */
int cove_forward_upload(struct coved *d, struct cove_req *r, const char *sandbox_id,
                        const char *data, size_t len);

/* What a caller forwarding on another surface (the E2B envd listener) changes. */
struct cove_fwd_req {
        const char *prefix;      /* put before the target on the node ("/e2b"); NULL: none */
        int any_tenant;          /* the caller checked access itself: the sandbox may be any
                                  * tenant's, and X-Cove-Tenant is the sandbox's own */
        const char *const *hdrs; /* extra request headers (name, value pairs), replacing
                                  * forwarded ones of the same name; at most 8 */
        size_t nhdrs;
        /* answers an error the forwarder itself found (NULL: cove_reply_err) */
        int (*reply_err)(struct cove_req *r, const struct cove_err *err);
};
int cove_forward_ex(struct coved *d, struct cove_req *r, const char *sandbox_id,
                    const struct cove_fwd_req *q);
int cove_forward_upload_ex(struct coved *d, struct cove_req *r, const char *sandbox_id,
                           const struct cove_fwd_req *q, const char *data, size_t len);

/* Route handlers for role control over the route table's COVE_ROUTE_SANDBOX routes: they
 * forward with r->params[0] as the sandbox id. app is the struct coved. */
int cove_fwd_h(void *app, struct cove_req *r);
int cove_fwd_up(void *app, struct cove_req *r, const char *data, size_t len);

/* Role node: the node API's authentication hook (struct cove_http_config.auth, app = the
 * struct coved). Accepts only "Cove-Node" Authorization signed with d->node_token for
 * d->node_name within the time window and with a nonce not seen before; takes the tenant
 * from X-Cove-Tenant; a route whose first {param} is a sandbox (COVE_ROUTE_SANDBOX), or
 * whose E2b-Sandbox-Id header names it (COVE_ROUTE_E2B), is answered only when the sandbox
 * is placed on this node (404 otherwise). Sets the request's Cove-Node-Answer; key_id
 * becomes "node:<name>" (how a handler knows a control replica vouches for the call). */
int cove_nodeapi_auth(void *app, struct cove_req *r, const char *authorization,
                      struct cove_err *err);

/* A node's answer head, parsed (pure: no I/O; tests/fuzz/fuzz_fwd_head.c). */
struct cove_fwd_head {
        unsigned status;        /* 200..599 */
        int64_t content_length; /* -1: none */
        int chunked;
        size_t head_len; /* bytes of the head, CRLF CRLF included */
        char answer[65]; /* Cove-Node-Answer, "" when absent */
        /* the headers relayed to the client (name, value), pointing into names[]/vals */
        int nkeep;
        const char *keep_name[COVE_FWD_HDRS_MAX];
        char keep_val[COVE_FWD_HDRS_MAX][512];
};
/* Parse buf[0..len) as an HTTP/1.x answer head. 1 parsed, 0 incomplete (need more
 * bytes; never when len >= COVE_FWD_HEAD_MAX), -1 malformed with *why. Strict: status
 * line "HTTP/1.x NNN …", header names are tokens, values free of control bytes, at most
 * COVE_FWD_HDRS_MAX lines, one Content-Length of digits, Transfer-Encoding only
 * "chunked" and never with a Content-Length, no 1xx. */
int cove_fwd_parse_head(const char *buf, size_t len, struct cove_fwd_head *h, const char **why);

/* Decode HTTP/1.1 chunked framing (pure; fuzzed with the head). Feed in bytes; decoded
 * data is copied to out (at most out_cap); returns bytes consumed from in, or -1 malformed.
 * *out_len gets the data bytes; *done becomes 1 after the last chunk and its trailer. */
struct cove_fwd_chunked {
        int st; /* 0 size line, 1 data, 2 CRLF after data, 3 trailer line, 4 done */
        uint64_t left;
        char line[80];
        size_t llen;
};
long cove_fwd_dechunk(struct cove_fwd_chunked *c, const char *in, size_t n, char *out,
                      size_t out_cap, size_t *out_len, int *done);

#endif
