/* HTTP/1.1 request stream rewriting for intercepted egress connections (pure code, no I/O;
 * tests/unit/test_http1.c). The client's decrypted bytes are fed in as they come; each
 * request head is checked and rewritten (credentials injected), bodies pass through with
 * their framing (Content-Length or chunked) followed, so keep-alive and pipelined requests
 * are each seen. A request that cannot be handled safely is refused: nothing of it is
 * emitted and the stream stops (the caller answers with the status and closes).
 * Head rules: request line "METHOD SP target SP HTTP/1.x"; no CONNECT, no Upgrade; header
 * names are tokens, no obsolete line folding, no bare CR or NUL; exactly one Host, equal
 * to the TLS SNI (a port, if any, must be the connection's); an absolute-form target names
 * the same host; Transfer-Encoding only "chunked" and never together with Content-Length;
 * at most one Content-Length. Injection, per applicable secret: header mode removes every
 * client copy of the header and adds it with the secret; placeholder mode replaces the
 * sandbox's placeholder in the target and header values. Bodies are never rewritten: a
 * placeholder-mode secret with a compressed (Content-Encoding) request body is refused at
 * the head, and a placeholder seen in a body stops the stream (COVE_H1_BODY_PLACEHOLDER). */
#ifndef COVE_NET_HTTP1_H
#define COVE_NET_HTTP1_H

#include <stddef.h>
#include <stdint.h>

#include "net/policy.h"

#define COVE_H1_HEAD_MAX 32768
#define COVE_H1_MAX_INJ 8

struct cove_bytes {
        uint8_t *b;
        size_t len, cap;
};
int cove_bytes_add(struct cove_bytes *x, const void *p, size_t n); /* 0 or -1 (ENOMEM) */
void cove_bytes_consume(struct cove_bytes *x, size_t n);
void cove_bytes_free(struct cove_bytes *x); /* wipes first: it may hold a secret */

enum cove_h1_state { H1_HEAD, H1_BODY, H1_CHUNK_LINE, H1_CHUNK_DATA, H1_CHUNK_CRLF, H1_TRAILER };

/* Called once per request head: which injections apply (at most COVE_H1_MAX_INJ). */
typedef int (*cove_h1_inj_fn)(void *arg, const struct cove_inject **out, int max);
/* Called after a head was rewritten: the request's method and the injections applied. */
typedef void (*cove_h1_done_fn)(void *arg, const char *method, const char *target,
                                const struct cove_inject *const *applied, int n);

struct cove_h1 {
        enum cove_h1_state st;
        char sni[254];
        uint16_t port;
        cove_h1_inj_fn inj;
        cove_h1_done_fn done;
        void *arg;
        uint8_t head[COVE_H1_HEAD_MAX];
        size_t hlen;
        uint64_t left; /* body or chunk bytes left */
        char line[512];
        size_t llen;
        /* placeholders to watch for in the current body, with a carry across feeds */
        char watch[COVE_H1_MAX_INJ][COVE_PLACEHOLDER_LEN + 1];
        int nwatch;
        char carry[COVE_PLACEHOLDER_LEN];
        size_t clen;
        int requests; /* heads seen */
};

void cove_h1_init(struct cove_h1 *h, const char *sni, uint16_t port, cove_h1_inj_fn inj,
                  cove_h1_done_fn done, void *arg);

/* Feed n bytes; what may be forwarded is appended to out. Returns 0, or an HTTP status
 * (400, 411, 415, 421, 431, 501) with *why set when the stream must stop (out holds
 * only whole earlier requests' bytes and the refused request's body bytes before the
 * point of refusal are never emitted), or -1 on ENOMEM. */
int cove_h1_feed(struct cove_h1 *h, const uint8_t *in, size_t n, struct cove_bytes *out,
                 const char **why);

/* Rewrite one complete head (ending in CRLF CRLF) into out. On success fills *chunked,
 * *clen (-1 none), *compressed and the applied injections. Exposed for the unit tests. */
int cove_h1_rewrite_head(const char *head, size_t len, const char *sni, uint16_t port,
                         const struct cove_inject *const *inj, int ninj, struct cove_bytes *out,
                         int *chunked, int64_t *clen, int *compressed,
                         const struct cove_inject **applied, int *napplied, char *method,
                         size_t mcap, char *target, size_t tcap, const char **why);

#endif
