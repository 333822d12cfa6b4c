/* How control replicas and nodes authenticate each other (docs/cluster.md "Trust"):
 *
 * - Every control replica holds the cluster key K (32 random bytes, --cluster-key-file).
 * - A node holds only its own node token T = HMAC-SHA256(K, "cove-node-token\0" || name),
 *   written to --node-token-file by `coved node-token` (run where K is). A control replica
 *   derives T from the name; a node cannot derive another node's token.
 * - A request either way carries
 *       Authorization: Cove-Node name=NAME,ts=UNIX_MS,nonce=HEX16,sig=HEX64
 *   sig = HMAC-SHA256(T, "cove-node-req\0" METHOD "\0" PATH_AND_QUERY "\0" TS "\0" NONCE "\0"
 *                        TENANT "\0" BODY_SHA256_HEX_OR_EMPTY)
 *   where TENANT is the X-Cove-Tenant header the caller vouches for ("" when none) and the
 *   body hash is "" for a streamed body (its bytes are then covered by the connection
 *   only). A request older or newer than COVE_NODEAUTH_SKEW_MS is refused.
 * - The answer carries Cove-Node-Answer: HMAC-SHA256(T, "cove-node-ans\0" || request sig)
 *   so the caller knows the holder of T answered, not whatever took the address.
 *
 * Pure functions, no I/O, no state: replay protection beyond the time window (a nonce
 * cache) is the caller's. */
#ifndef COVE_CLUSTER_NODEAUTH_H
#define COVE_CLUSTER_NODEAUTH_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_NODEAUTH_KEY_LEN 32
#define COVE_NODEAUTH_TOKEN_HEX 65 /* 64 hex digits + NUL */
#define COVE_NODEAUTH_HDR_MAX 256  /* an Authorization value */
#define COVE_NODEAUTH_SKEW_MS 60000
#define COVE_NODE_NAME_MAX 63 /* node names: 1..63 of [a-z0-9-], not starting with '-' */

/* 1 when name is a valid node name. */
int cove_node_name_valid(const char *name);
/* The node token of name under the cluster key, as 64 lowercase hex digits. -1 with
 * BAD_REQUEST for an invalid name. */
int cove_nodeauth_token(const uint8_t key[COVE_NODEAUTH_KEY_LEN], const char *name,
                        char token[COVE_NODEAUTH_TOKEN_HEX], struct cove_err *err);
/* Read a cluster key file (32 raw bytes or 64 hex digits, mode not readable by others) or a
 * node token file (64 hex digits). Errors name the file, never its content. */
int cove_nodeauth_read_key(const char *path, uint8_t key[COVE_NODEAUTH_KEY_LEN],
                           struct cove_err *err);
int cove_nodeauth_read_token(const char *path, char token[COVE_NODEAUTH_TOKEN_HEX],
                             struct cove_err *err);

struct cove_nodeauth_req {
        const char *method;
        const char *path_query;      /* "/v1/…?a=b" exactly as sent */
        const char *tenant;          /* X-Cove-Tenant, NULL/"" when none */
        const char *body_sha256_hex; /* NULL/"" for a streamed body */
};

/* Authorization header value for a request by the holder of token acting as name, at now_ms
 * (a fresh random nonce). out >= COVE_NODEAUTH_HDR_MAX. sig (optional, 65 bytes) gets the
 * request's signature, to check the answer with. */
int cove_nodeauth_sign(const char *token, const char *name, const struct cove_nodeauth_req *q,
                       int64_t now_ms, char *out, size_t cap, char sig[65], struct cove_err *err);
/* Parse an Authorization value: fills name (>= 64 bytes) and the signed parts. -1 with
 * UNAUTHORIZED when it is not a well-formed Cove-Node value. */
struct cove_nodeauth_hdr {
        char name[COVE_NODE_NAME_MAX + 1];
        int64_t ts;
        char nonce[17];
        char sig[65];
};
int cove_nodeauth_parse(const char *authorization, struct cove_nodeauth_hdr *h,
                        struct cove_err *err);
/* Verify a parsed header with the token of h->name (the caller derives it, or holds it and
 * checks h->name is its own). 0, or -1 with UNAUTHORIZED (bad signature, or outside the
 * time window; the message never shows a token or signature). */
int cove_nodeauth_verify(const char *token, const struct cove_nodeauth_hdr *h,
                         const struct cove_nodeauth_req *q, int64_t now_ms, struct cove_err *err);
/* The Cove-Node-Answer value for a request signature (out 65 bytes), and its check
 * (0 or -1 UNAUTHORIZED). */
void cove_nodeauth_answer(const char *token, const char *req_sig, char out[65]);
int cove_nodeauth_answer_check(const char *token, const char *req_sig, const char *answer,
                               struct cove_err *err);

#endif
