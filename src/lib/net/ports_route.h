/* Request heads on the node's port listener (net/ports.h): which sandbox and port a request
 * is for, the token it presents, its body framing, and the head forwarded to the sandbox.
 * Pure code, no I/O (tests/unit/test_ports_route.c, tests/fuzz/fuzz_ports_route.c).
 *
 * Routes, tried in this order:
 *   - Host "{port}-{id}.{domain}" (any port after it) when a domain is configured;
 *   - E2b-Sandbox-Id + E2b-Sandbox-Port headers (what E2B's SDKs send to one URL);
 *   - target "/p/{id}/{port}" followed by "/", "?" or nothing (the prefix is removed
 *     before the head goes to the sandbox: "/p/{id}/{port}/x?y" → "/x?y").
 * A token comes from the X-Cove-Port-Token header, E2B's e2b-traffic-access-token header,
 * a "cove_token" query parameter, or the cove_port_token cookie (the listener sets it after
 * a query token), first found in that order. None of them reaches the sandbox: the header,
 * the parameter and that cookie are removed, as are client-sent X-Forwarded-* and the E2B
 * routing headers, and X-Forwarded-For/-Proto/-Host (and -Prefix for a path route) are
 * set by the node.
 * Head rules (so the node and the sandbox's server frame the stream alike): request line
 * "METHOD SP origin-form SP HTTP/1.x" (no CONNECT, no absolute or authority form); header
 * names are tokens, no obsolete line folding, no bare CR, LF or NUL in a line; at most one
 * Host; at most one Content-Length (digits only); Transfer-Encoding only "chunked", never
 * with Content-Length. */
#ifndef COVE_NET_PORTS_ROUTE_H
#define COVE_NET_PORTS_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "net/http1.h"

#define COVE_PORTS_HEAD_MAX 32768
#define COVE_PORTS_HEADERS_MAX 128
#define COVE_PORTS_TOKEN_MAX 128
#define COVE_PORTS_ID_MAX 63
#define COVE_PORTS_COOKIE "cove_port_token"
#define COVE_PORTS_QUERY "cove_token"

enum cove_ports_mode { COVE_PORTS_NONE, COVE_PORTS_HOST, COVE_PORTS_E2B, COVE_PORTS_PATH };
enum cove_ports_tsrc {
        COVE_PORTS_TOK_NONE,
        COVE_PORTS_TOK_HEADER,
        COVE_PORTS_TOK_QUERY,
        COVE_PORTS_TOK_COOKIE
};

struct cove_ports_span {
        uint32_t off, len;
};

struct cove_ports_req {
        char method[24];
        int minor;                     /* HTTP/1.minor */
        struct cove_ports_span target; /* as sent */
        struct cove_ports_span host;   /* value; len 0 when absent */
        enum cove_ports_mode mode;
        char sandbox[COVE_PORTS_ID_MAX + 1];
        uint16_t port;
        uint32_t prefix; /* path route: bytes of the target's "/p/{id}/{port}" */
        char token[COVE_PORTS_TOKEN_MAX + 1];
        enum cove_ports_tsrc tsrc;
        int chunked;
        int64_t clen; /* -1 none */
        int upgrade;  /* an Upgrade header (WebSocket): opaque bytes follow a 101 */
        int nh;
        struct cove_ports_span hname[COVE_PORTS_HEADERS_MAX], hval[COVE_PORTS_HEADERS_MAX];
};

/* Length of the head at the start of buf (through CRLF CRLF), 0 when incomplete. */
size_t cove_ports_head_len(const uint8_t *buf, size_t n);

/* Parse one complete head (cove_ports_head_len bytes). domain may be NULL (no host
 * routes). Returns 0 (rq->mode NONE when no route matched), or an HTTP status (400, 405,
 * 431, 501) with *why. */
int cove_ports_parse(const char *head, size_t len, const char *domain, struct cove_ports_req *rq,
                     const char **why);

/* The head forwarded to the sandbox (see above); client_ip is the peer's address text.
 * 0, or -1 on ENOMEM. */
int cove_ports_rewrite(const char *head, const struct cove_ports_req *rq, const char *client_ip,
                       struct cove_bytes *out);

/* The value of header name in a parsed head into out: 1 found once, 0 absent, -1 more than
 * once or longer than cap - 1. */
int cove_ports_req_header(const char *head, const struct cove_ports_req *rq, const char *name,
                          char *out, size_t cap);
/* The head a control replica relays to a node (net/ports.h relay): the request line and
 * headers as sent, but for client-sent X-Cove-Relay and X-Cove-Client, with the lines extra
 * ("Name: value\r\n"…) added. 0, or -1 on ENOMEM. */
int cove_ports_relay_head(const char *head, const struct cove_ports_req *rq, const char *extra,
                          struct cove_bytes *out);
#endif
