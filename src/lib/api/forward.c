/* Forwarding of sandbox traffic from a control replica to the owning node, and the node
 * API's authentication (api/forward.h). One TCP connection per forwarded request
 * (Connection: close): a stream owns its connection, and closing it is how either side
 * learns the other went away. */
#include "api/forward.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "cluster/nodeauth.h"
#include "control/placement.h"
#include "util/cleanup.h"
#include "util/util.h"

/* ---- process state: options, the node API's replay cache -------------------------- */

/* Nonces of accepted requests, in three generations of COVE_NODEAUTH_SKEW_MS each: a
 * request is fresh for 2 × skew around its timestamp, and every nonce is kept 2 to 3
 * generations after it was accepted, so no replay inside the window finds it forgotten.
 * Only requests whose signature verified are remembered, so only a control replica can
 * fill it; when it is full, requests are refused (503) rather than remembered less. */
#define NONCE_SLOTS (1u << 16) /* per generation; 3/4 of it usable */
#define NONCE_GENS 3

struct cove_fwd {
        struct cove_fwd_options o;
        pthread_mutex_t mu;
        uint64_t *gen[NONCE_GENS];
        size_t used[NONCE_GENS];
        int cur;
        int64_t cur_since; /* wall ms the current generation began */
        struct cove_route *routes;
        size_t nroutes;
};

struct cove_fwd *cove_fwd_new(const struct cove_fwd_options *o, struct cove_err *err)
{
        struct cove_fwd *f = calloc(1, sizeof(*f));
        if (!f) {
                cove_err_set(err, ENOMEM, "forward");
                return NULL;
        }
        if (o)
                f->o = *o;
        if (f->o.connect_timeout_ms <= 0)
                f->o.connect_timeout_ms = 5000;
        if (f->o.head_timeout_ms <= 0)
                f->o.head_timeout_ms = 60000;
        if (f->o.stall_timeout_ms <= 0)
                f->o.stall_timeout_ms = 60000;
        pthread_mutex_init(&f->mu, NULL);
        for (int i = 0; i < NONCE_GENS; i++) {
                f->gen[i] = calloc(NONCE_SLOTS, sizeof(uint64_t));
                if (!f->gen[i]) {
                        cove_fwd_free(f);
                        cove_err_set(err, ENOMEM, "forward: replay cache");
                        return NULL;
                }
        }
        f->cur_since = cove_now_ms();
        return f;
}

void cove_fwd_free(struct cove_fwd *f)
{
        if (!f)
                return;
        for (int i = 0; i < NONCE_GENS; i++)
                free(f->gen[i]);
        free(f->routes);
        pthread_mutex_destroy(&f->mu);
        free(f);
}

static int gen_has(const uint64_t *g, uint64_t v)
{
        for (size_t i = v & (NONCE_SLOTS - 1), k = 0; k < NONCE_SLOTS;
             i = (i + 1) & (NONCE_SLOTS - 1), k++) {
                if (g[i] == 0)
                        return 0;
                if (g[i] == v)
                        return 1;
        }
        return 0;
}

/* 0 remembered (first time), 1 seen before, 2 the cache is full. */
static int nonce_check(struct cove_fwd *f, uint64_t v, int64_t now)
{
        if (v == 0)
                v = 1; /* 0 marks an empty slot; a 2^-64 collision costs one refusal */
        pthread_mutex_lock(&f->mu);
        while (now - f->cur_since >= COVE_NODEAUTH_SKEW_MS) {
                f->cur = (f->cur + 1) % NONCE_GENS;
                memset(f->gen[f->cur], 0, NONCE_SLOTS * sizeof(uint64_t));
                f->used[f->cur] = 0;
                f->cur_since = now - f->cur_since >= 2 * COVE_NODEAUTH_SKEW_MS
                                   ? now
                                   : f->cur_since + COVE_NODEAUTH_SKEW_MS;
        }
        int rc = 0;
        for (int i = 0; i < NONCE_GENS && !rc; i++)
                if (gen_has(f->gen[i], v))
                        rc = 1;
        if (!rc && f->used[f->cur] >= NONCE_SLOTS / 4 * 3)
                rc = 2;
        if (!rc) {
                uint64_t *g = f->gen[f->cur];
                size_t i = v & (NONCE_SLOTS - 1);
                while (g[i])
                        i = (i + 1) & (NONCE_SLOTS - 1);
                g[i] = v;
                f->used[f->cur]++;
        }
        pthread_mutex_unlock(&f->mu);
        return rc;
}

static const struct cove_fwd_options *fwd_o(struct coved *d)
{
        static const struct cove_fwd_options dflt = {5000, 60000, 60000};
        return d->fwd ? &d->fwd->o : &dflt;
}

/* The exposed ports' routes: the node's answer has URLs, of this replica's preview address */
static int fwd_ports_h(void *app, struct cove_req *r)
{
        struct coved *d = app;
        const char *via = coved_ports_via(d);
        const char *h[2] = {"X-Cove-Ports-Via", via};
        struct cove_fwd_req q = {.hdrs = h, .nhdrs = via[0] ? 1 : 0};
        return cove_forward_ex(d, r, r->params[0], &q);
}

const struct cove_route *cove_fwd_routes(struct cove_fwd *f, enum coved_role role,
                                         const struct cove_route *base, size_t n,
                                         const struct cove_route *extra, size_t nextra,
                                         size_t *out_n)
{
        free(f->routes);
        f->routes = calloc(n + nextra + 1, sizeof(*f->routes));
        f->nroutes = 0;
        if (!f->routes)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                struct cove_route rt = base[i];
                int sandbox = rt.flags & COVE_ROUTE_SANDBOX;
                if (role == COVED_ROLE_CONTROL && sandbox) {
                        rt.handler = strncmp(rt.pattern, "/v1/sandboxes/{id}/ports", 24)
                                         ? cove_fwd_h
                                         : fwd_ports_h;
                        rt.upload = rt.upload ? cove_fwd_up : NULL;
                } else if (role == COVED_ROLE_NODE) {
                        if (!strcmp(rt.pattern, "/healthz"))
                                ; /* stays public: a load balancer's probe */
                        else if (!strcmp(rt.pattern, "/metrics"))
                                rt.flags &= ~COVE_ROUTE_PUBLIC;
                        else if (!sandbox)
                                continue;
                }
                f->routes[f->nroutes++] = rt;
        }
        for (size_t i = 0; role == COVED_ROLE_NODE && i < nextra; i++)
                f->routes[f->nroutes++] = extra[i];
        *out_n = f->nroutes;
        return f->routes;
}

/* ---- the node's answer head and chunked bodies (pure) ----------------------------- */

/* Answer headers relayed to the client; everything else a node sends is dropped. */
static const char *const relay_hdrs[] = {
    "Content-Type",  "Content-Disposition",    "Content-Range",
    "Accept-Ranges", "Last-Modified",          "ETag",
    "Retry-After",   "X-Content-Type-Options",
};

static int is_tchar(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               (c && strchr("!#$%&'*+-.^_`|~", c));
}

int cove_fwd_parse_head(const char *buf, size_t len, struct cove_fwd_head *h, const char **why)
{
        memset(h, 0, sizeof(*h));
        h->content_length = -1;
        size_t lim = len < COVE_FWD_HEAD_MAX ? len : COVE_FWD_HEAD_MAX;
        size_t end = 0;
        for (size_t i = 0; i + 3 < lim; i++)
                if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' &&
                    buf[i + 3] == '\n') {
                        end = i + 4;
                        break;
                }
        if (!end) {
                if (len >= COVE_FWD_HEAD_MAX)
                        return *why = "answer head larger than 16 KiB", -1;
                return 0;
        }
        h->head_len = end;
        /* status line */
        if (end < 17 || memcmp(buf, "HTTP/1.", 7) != 0 || (buf[7] != '0' && buf[7] != '1') ||
            buf[8] != ' ' || buf[9] < '1' || buf[9] > '5' || buf[10] < '0' || buf[10] > '9' ||
            buf[11] < '0' || buf[11] > '9' || (buf[12] != ' ' && buf[12] != '\r'))
                return *why = "malformed status line", -1;
        h->status = (unsigned)((buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0'));
        if (h->status < 200)
                return *why = "informational status", -1;
        size_t p = 12;
        while (p < end && buf[p] != '\r') {
                unsigned char c = (unsigned char)buf[p];
                if ((c < 0x20 && c != '\t') || c == 0x7f)
                        return *why = "control byte in the status line", -1;
                p++;
        }
        if (p + 1 >= end || buf[p + 1] != '\n')
                return *why = "malformed status line", -1;
        p += 2;
        int nlines = 0, have_cl = 0, have_te = 0;
        while (p < end - 2) {
                size_t ls = p, le = p;
                while (le < end && buf[le] != '\r')
                        le++;
                if (le + 1 >= end || buf[le + 1] != '\n')
                        return *why = "bare CR in a header", -1;
                if (++nlines > COVE_FWD_HDRS_MAX)
                        return *why = "too many header lines", -1;
                size_t ne = ls;
                while (ne < le && is_tchar((unsigned char)buf[ne]))
                        ne++;
                if (ne == ls || ne >= le || buf[ne] != ':')
                        return *why = "malformed header line", -1;
                size_t vs = ne + 1, ve = le;
                while (vs < ve && (buf[vs] == ' ' || buf[vs] == '\t'))
                        vs++;
                while (ve > vs && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t'))
                        ve--;
                for (size_t i = vs; i < ve; i++) {
                        unsigned char c = (unsigned char)buf[i];
                        if ((c < 0x20 && c != '\t') || c == 0x7f)
                                return *why = "control byte in a header value", -1;
                }
                size_t nl = ne - ls, vl = ve - vs;
                const char *name = buf + ls, *val = buf + vs;
                if (nl == 14 && !strncasecmp(name, "Content-Length", 14)) {
                        if (have_cl++ || vl == 0 || vl > 18)
                                return *why = "bad or repeated Content-Length", -1;
                        int64_t v = 0;
                        for (size_t i = 0; i < vl; i++) {
                                if (val[i] < '0' || val[i] > '9')
                                        return *why = "bad Content-Length", -1;
                                v = v * 10 + (val[i] - '0');
                        }
                        h->content_length = v;
                } else if (nl == 17 && !strncasecmp(name, "Transfer-Encoding", 17)) {
                        if (have_te++ || vl != 7 || strncasecmp(val, "chunked", 7))
                                return *why = "Transfer-Encoding other than chunked", -1;
                        h->chunked = 1;
                } else if (nl == 16 && !strncasecmp(name, "Cove-Node-Answer", 16)) {
                        if (vl == 64 && !h->answer[0]) {
                                memcpy(h->answer, val, 64);
                                h->answer[64] = '\0';
                        } else {
                                h->answer[0] = '\0';
                                h->answer[1] = 'x'; /* repeated or malformed: never valid */
                        }
                } else {
                        for (size_t k = 0; k < COVE_ARRAY_SIZE(relay_hdrs); k++) {
                                if (strlen(relay_hdrs[k]) != nl ||
                                    strncasecmp(relay_hdrs[k], name, nl) != 0 ||
                                    vl >= sizeof(h->keep_val[0]))
                                        continue;
                                h->keep_name[h->nkeep] = relay_hdrs[k];
                                memcpy(h->keep_val[h->nkeep], val, vl);
                                h->keep_val[h->nkeep][vl] = '\0';
                                h->nkeep++;
                                break;
                        }
                }
                p = le + 2;
        }
        if (have_cl && have_te)
                return *why = "both Content-Length and Transfer-Encoding", -1;
        if (h->status == 204 || h->status == 304) {
                if (h->chunked || h->content_length > 0)
                        return *why = "a body on a bodiless status", -1;
                h->content_length = 0;
        }
        if (!have_cl && !have_te && h->content_length < 0)
                return *why = "answer without a length (neither Content-Length nor chunked)", -1;
        return 1;
}

long cove_fwd_dechunk(struct cove_fwd_chunked *c, const char *in, size_t n, char *out,
                      size_t out_cap, size_t *out_len, int *done)
{
        size_t i = 0, o = 0;
        while (i < n && c->st != 4) {
                if (c->st == 1) {
                        uint64_t k = n - i;
                        if (k > c->left)
                                k = c->left;
                        if (k > out_cap - o)
                                k = out_cap - o;
                        if (k == 0)
                                break; /* out is full */
                        memcpy(out + o, in + i, (size_t)k);
                        i += (size_t)k;
                        o += (size_t)k;
                        c->left -= k;
                        if (c->left == 0)
                                c->st = 2;
                        continue;
                }
                char ch = in[i++];
                if (c->st == 2) {
                        if (c->llen == 0 && ch == '\r')
                                c->llen = 1;
                        else if (c->llen == 1 && ch == '\n') {
                                c->llen = 0;
                                c->st = 0;
                        } else
                                return -1;
                        continue;
                }
                /* st 0 (size line) or 3 (trailer line) */
                if (ch != '\n') {
                        if (c->llen >= sizeof(c->line) - 1 ||
                            ((unsigned char)ch < 0x20 && ch != '\r' && ch != '\t'))
                                return -1;
                        c->line[c->llen++] = ch;
                        continue;
                }
                if (c->llen == 0 || c->line[c->llen - 1] != '\r')
                        return -1;
                c->llen--;
                c->line[c->llen] = '\0';
                if (c->st == 3) {
                        if (c->llen == 0)
                                c->st = 4;
                        c->llen = 0;
                        continue;
                }
                uint64_t v = 0;
                size_t digits = 0;
                for (size_t k = 0; k < c->llen && c->line[k] != ';'; k++) {
                        char d = c->line[k];
                        int x = d >= '0' && d <= '9'   ? d - '0'
                                : d >= 'a' && d <= 'f' ? d - 'a' + 10
                                : d >= 'A' && d <= 'F' ? d - 'A' + 10
                                                       : -1;
                        if (x < 0 || ++digits > 15)
                                return -1;
                        v = v << 4 | (uint64_t)x;
                }
                if (digits == 0)
                        return -1;
                c->llen = 0;
                c->left = v;
                c->st = v ? 1 : 3;
        }
        *out_len = o;
        *done = c->st == 4;
        return (long)i;
}

/* ---- control side ------------------------------------------------------------------- */

/* Request headers sent on to the node as they came (the client's Authorization, cookies
 * and everything else stay behind). */
static const char *const fwd_req_hdrs[] = {
    "Content-Type",
    "Content-Encoding",
    "Range",
    "If-Range",
    "Accept",
    "E2b-Sandbox-Id",
    "E2b-Sandbox-Port",
    "Connect-Protocol-Version",
    "Connect-Timeout-Ms",
    "Keepalive-Ping-Interval",
};

struct fwd {
        struct coved *d;
        int fd;
        int chunked_up; /* the request body goes out chunked */
        int failed;     /* err holds what to answer */
        struct cove_err err;
        char node[64];
        char token[COVE_NODEAUTH_TOKEN_HEX];
        char sig[65];
        int client_fd;
        /* relay */
        int chunked;
        int64_t left; /* Content-Length mode: bytes still due */
        struct cove_fwd_chunked ch;
        char *in;
        size_t ilen, ioff;
};

static void fwd_free(struct fwd *c)
{
        if (!c)
                return;
        if (c->fd >= 0)
                close(c->fd);
        OPENSSL_cleanse(c->token, sizeof(c->token));
        free(c->in);
        free(c);
}

static void fwd_cleanup(void *app, struct cove_req *r)
{
        fwd_free(r->state);
        r->state = NULL;
}

static int fail(struct fwd *c, enum cove_err_kind kind, const char *fmt, const char *a,
                const char *b)
{
        c->failed = 1;
        cove_err_setk(&c->err, kind, 0, fmt, a, b);
        return -1;
}

/* "http://HOST:PORT[/]" → host, port. */
static int parse_address(const char *a, char *host, size_t hcap, char *port, size_t pcap)
{
        if (strncmp(a, "http://", 7) != 0)
                return -1;
        a += 7;
        const char *hs = a, *he;
        if (*a == '[') {
                he = strchr(a, ']');
                if (!he)
                        return -1;
                hs = a + 1;
                a = he + 1;
        } else {
                he = a + strcspn(a, ":/");
                a = he;
        }
        if ((size_t)(he - hs) == 0 || (size_t)(he - hs) >= hcap || *a != ':')
                return -1;
        memcpy(host, hs, (size_t)(he - hs));
        host[he - hs] = '\0';
        a++;
        size_t pl = strspn(a, "0123456789");
        if (pl == 0 || pl >= pcap || (a[pl] && strcmp(a + pl, "/") != 0))
                return -1;
        memcpy(port, a, pl);
        port[pl] = '\0';
        return 0;
}

static int connect_node(const char *host, const char *port, int timeout_ms)
{
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC}, *ai = NULL;
        if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
                return -1;
        int fd = -1;
        for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
                fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                            p->ai_protocol);
                if (fd < 0)
                        continue;
                int rc = connect(fd, p->ai_addr, p->ai_addrlen);
                if (rc < 0 && errno == EINPROGRESS) {
                        struct pollfd pf = {.fd = fd, .events = POLLOUT};
                        int e = 0;
                        socklen_t el = sizeof(e);
                        if (poll(&pf, 1, timeout_ms) == 1 &&
                            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0)
                                rc = 0;
                }
                if (rc < 0) {
                        close(fd);
                        fd = -1;
                }
        }
        freeaddrinfo(ai);
        if (fd < 0)
                return -1;
        /* blocking from here on: writes block while the node is slower than the client
         * (back-pressure), bounded by SO_SNDTIMEO; reads poll first */
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
                close(fd);
                return -1;
        }
        fl = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &fl, sizeof(fl));
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &fl, sizeof(fl));
        int idle = 10, intvl = 5, cnt = 3;
        unsigned user_to = 30000;
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_to, sizeof(user_to));
        return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
        while (n) {
                ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return -1;
                p += k;
                n -= (size_t)k;
        }
        return 0;
}

static int header_ok(const char *v)
{
        for (; *v; v++)
                if (((unsigned char)*v < 0x20 && *v != '\t') || *v == 0x7f)
                        return 0;
        return 1;
}

/* Resolve the node, connect, send the head (and a buffered body). body_len < 0: the body
 * follows chunked. */
static int fwd_open(struct coved *d, struct cove_req *r, const char *id,
                    const struct cove_fwd_req *fq, struct fwd *c, int64_t body_len)
{
        struct cove_err err;
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, fq->any_tenant ? NULL : r->tenant, id, &row, &err) < 0) {
                c->failed = 1;
                c->err = err;
                return -1;
        }
        char tenant[64];
        snprintf(tenant, sizeof(tenant), "%s", row.tenant);
        cove_sandbox_row_clear(&row);
        struct cove_placement_row pl;
        int rc = d->cat_ops->placement_get(d->cat, id, &pl, &err);
        if (rc < 0) {
                c->failed = 1;
                c->err = err;
                if (c->err.kind != COVE_E_UNAVAILABLE)
                        c->err.kind = COVE_E_UNAVAILABLE;
                return -1;
        }
        if (rc == 1 || !pl.node[0])
                return fail(c, COVE_E_UNAVAILABLE, "sandbox %s is not placed on any node%s", id,
                            " (it is starting, or was never started)");
        struct cove_node_row nrow;
        int nr = coved_node_get(d, pl.node, &nrow, &err);
        if (nr < 0) {
                c->failed = 1;
                c->err = err;
                c->err.kind = COVE_E_UNAVAILABLE;
                return -1;
        }
        snprintf(c->node, sizeof(c->node), "%s", pl.node);
        if (nr == 1)
                return fail(c, COVE_E_UNAVAILABLE,
                            "sandbox %s is placed on node %s, which is unknown", id, c->node);
        if (!strcmp(nrow.state, "lost"))
                return fail(c, COVE_E_UNAVAILABLE,
                            "sandbox %s: its node %s is lost (it will be recovered elsewhere)", id,
                            c->node);
        char host[256], port[16];
        if (parse_address(nrow.address, host, sizeof(host), port, sizeof(port)) < 0)
                return fail(c, COVE_E_UNAVAILABLE,
                            "node %s announced the address \"%.200s\", not http://HOST:PORT",
                            c->node, nrow.address);
        if (!d->has_cluster_key || cove_nodeauth_token(d->cluster_key, c->node, c->token, &err) < 0)
                return fail(c, COVE_E_UNAVAILABLE, "no token for node %s%s", c->node,
                            d->has_cluster_key ? "" : " (no cluster key)");
        char target[COVE_FWD_TARGET_MAX];
        size_t pfx = fq->prefix ? strlen(fq->prefix) : 0;
        if (pfx >= 64 || cove_req_target(r, target + pfx, sizeof(target) - pfx) < 0)
                return fail(c, COVE_E_BAD_REQUEST, "request target longer than %s%s", "8 KiB", "");
        if (pfx)
                memcpy(target, fq->prefix, pfx);
        struct cove_nodeauth_req q = {.method = r->method, .path_query = target, .tenant = tenant};
        char authz[COVE_NODEAUTH_HDR_MAX];
        if (cove_nodeauth_sign(c->token, c->node, &q, cove_now_ms(), authz, sizeof(authz), c->sig,
                               &err) < 0) {
                c->failed = 1;
                c->err = err;
                return -1;
        }
        c->fd = connect_node(host, port, fwd_o(d)->connect_timeout_ms);
        if (c->fd < 0)
                return fail(c, COVE_E_UNAVAILABLE,
                            "node %s (%s) is unreachable: the sandbox's traffic cannot reach it; "
                            "retry, or wait for the node to come back or be replaced",
                            c->node, nrow.address);
        struct timeval tv = {.tv_sec = fwd_o(d)->stall_timeout_ms / 1000};
        setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        size_t cap = 4096 + strlen(target) + 16 * 1024;
        cleanup_free char *head = malloc(cap);
        if (!head)
                return fail(c, COVE_E_INTERNAL, "out of memory%s%s", "", "");
        int n = snprintf(head, cap,
                         "%s %s HTTP/1.1\r\nHost: %s:%s\r\nAuthorization: %s\r\n"
                         "X-Cove-Tenant: %s\r\nConnection: close\r\n",
                         r->method, target, host, port, authz, tenant);
        if (body_len < 0)
                n += snprintf(head + n, cap - (size_t)n, "Transfer-Encoding: chunked\r\n");
        else
                n += snprintf(head + n, cap - (size_t)n, "Content-Length: %lld\r\n",
                              (long long)body_len);
        for (size_t i = 0; i < COVE_ARRAY_SIZE(fwd_req_hdrs); i++) {
                const char *v = cove_req_header(r, fwd_req_hdrs[i]);
                int replaced = 0;
                for (size_t k = 0; k < fq->nhdrs; k++)
                        replaced |= !strcasecmp(fq->hdrs[2 * k], fwd_req_hdrs[i]);
                if (!v || replaced || !header_ok(v) || strlen(v) > 1024)
                        continue;
                n += snprintf(head + n, cap - (size_t)n, "%s: %s\r\n", fwd_req_hdrs[i], v);
        }
        for (size_t k = 0; k < fq->nhdrs && k < 8; k++) {
                const char *v = fq->hdrs[2 * k + 1];
                if (v && header_ok(v) && strlen(v) <= 1024)
                        n += snprintf(head + n, cap - (size_t)n, "%s: %s\r\n", fq->hdrs[2 * k], v);
        }
        n += snprintf(head + n, cap - (size_t)n, "\r\n");
        if ((size_t)n >= cap || send_all(c->fd, head, (size_t)n) < 0)
                return fail(c, COVE_E_UNAVAILABLE, "node %s: sending the request failed%s", c->node,
                            "");
        c->chunked_up = body_len < 0;
        return 0;
}

static const struct cove_fwd_req plain_req;

int cove_forward_upload(struct coved *d, struct cove_req *r, const char *sandbox_id,
                        const char *data, size_t len)
{
        return cove_forward_upload_ex(d, r, sandbox_id, &plain_req, data, len);
}

int cove_forward_upload_ex(struct coved *d, struct cove_req *r, const char *sandbox_id,
                           const struct cove_fwd_req *fq, const char *data, size_t len)
{
        struct fwd *c = r->state;
        if (!c) {
                if (!fq)
                        return -1;
                c = calloc(1, sizeof(*c));
                if (!c)
                        return -1;
                c->fd = -1;
                c->d = d;
                r->state = c;
                r->cleanup = fwd_cleanup;
                const char *cl = cove_req_header(r, "Content-Length");
                int64_t blen = cl ? (int64_t)strtoull(cl, NULL, 10) : -1;
                if (fwd_open(d, r, sandbox_id, fq, c, blen) < 0)
                        return -1;
        }
        if (c->failed || c->fd < 0)
                return -1;
        int bad = 0;
        if (c->chunked_up) {
                char hx[24];
                int k = snprintf(hx, sizeof(hx), "%zx\r\n", len);
                bad = send_all(c->fd, hx, (size_t)k) < 0 || send_all(c->fd, data, len) < 0 ||
                      send_all(c->fd, "\r\n", 2) < 0;
        } else {
                bad = send_all(c->fd, data, len) < 0;
        }
        /* a node that stopped reading (or answered early and closed): stop sending; what it
         * answered, if anything, is still read and relayed */
        return bad ? -1 : 0;
}

static ssize_t relay_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        struct fwd *c = ctx;
        for (;;) {
                if (c->chunked) {
                        if (c->ioff < c->ilen) {
                                size_t ol = 0;
                                int done = 0;
                                long used =
                                    cove_fwd_dechunk(&c->ch, c->in + c->ioff, c->ilen - c->ioff,
                                                     buf, max, &ol, &done);
                                if (used < 0) {
                                        cove_warn(&c->d->log, "forward.relay",
                                                  "node %s: malformed chunked answer; cut",
                                                  c->node);
                                        return -2;
                                }
                                c->ioff += (size_t)used;
                                if (ol)
                                        return (ssize_t)ol;
                        }
                        if (c->ch.st == 4)
                                return -1;
                } else {
                        if (c->left == 0)
                                return -1;
                        if (c->ioff < c->ilen) {
                                size_t k = c->ilen - c->ioff;
                                if (k > max)
                                        k = max;
                                if ((int64_t)k > c->left)
                                        k = (size_t)c->left;
                                memcpy(buf, c->in + c->ioff, k);
                                c->ioff += k;
                                c->left -= (int64_t)k;
                                return (ssize_t)k;
                        }
                }
                if (c->ioff == c->ilen)
                        c->ioff = c->ilen = 0;
                struct pollfd pf = {.fd = c->fd, .events = POLLIN};
                int pr = poll(&pf, 1, 1000);
                if (pr == 0) {
                        if (c->d->quitting || cove_sock_closed(c->client_fd))
                                return -2; /* client gone: the node connection closes in free */
                        return 0;
                }
                if (pr < 0 && errno == EINTR)
                        continue;
                ssize_t n;
                if (!c->chunked) {
                        /* straight into the client's buffer: no copy */
                        size_t want = max;
                        if ((int64_t)want > c->left)
                                want = (size_t)c->left;
                        n = recv(c->fd, buf, want, 0);
                        if (n > 0) {
                                c->left -= n;
                                return n;
                        }
                } else {
                        n = recv(c->fd, c->in + c->ilen, COVE_FWD_BUF - c->ilen, 0);
                        if (n > 0) {
                                c->ilen += (size_t)n;
                                continue;
                        }
                }
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                cove_warn(&c->d->log, "forward.relay",
                          "node %s closed its answer before the end; the client's answer is cut",
                          c->node);
                return -2;
        }
}

static void relay_free(void *ctx)
{
        fwd_free(ctx);
}

/* Read the answer head. 0 with h, -1 with c->err. */
static int read_head(struct fwd *c, struct cove_req *r, struct cove_fwd_head *h)
{
        const struct cove_fwd_options *o = fwd_o(c->d);
        /* exec with wait answers its head when the process ends: no deadline there (the
         * client leaving, the node's connection breaking or shutdown end the wait) */
        size_t pl = strlen(r->route->pattern);
        int no_deadline = pl >= 5 && !strcmp(r->route->pattern + pl - 5, "/exec");
        int64_t deadline = (cove_mono_ns() / 1000000) + o->head_timeout_ms;
        /* the code interpreter's calls first start its server in the sandbox (up to 60 s on
         * the node, api/routes_code.c): that wait comes on top */
        const char *pat = r->route->pattern;
        if ((pl >= 5 && !strcmp(pat + pl - 5, "/code")) || strstr(pat, "/execute") ||
            strstr(pat, "/contexts"))
                deadline += 60000;
        c->in = malloc(COVE_FWD_BUF);
        if (!c->in)
                return fail(c, COVE_E_INTERNAL, "out of memory%s%s", "", "");
        for (;;) {
                const char *why = NULL;
                int pr = c->ilen ? cove_fwd_parse_head(c->in, c->ilen, h, &why) : 0;
                if (pr == 1)
                        break;
                if (pr < 0) {
                        cove_warn(&c->d->log, "forward.head", "node %s: %s", c->node, why);
                        return fail(c, COVE_E_UNAVAILABLE, "node %s gave a malformed answer (%s)",
                                    c->node, why);
                }
                int64_t now = (cove_mono_ns() / 1000000);
                if (!no_deadline && now >= deadline)
                        return fail(c, COVE_E_UNAVAILABLE, "node %s did not answer within %s",
                                    c->node, "the head timeout");
                struct pollfd pf = {.fd = c->fd, .events = POLLIN};
                int wait = 1000;
                if (!no_deadline && deadline - now < wait)
                        wait = (int)(deadline - now);
                int k = poll(&pf, 1, wait);
                if (k == 0) {
                        if (c->d->quitting || cove_sock_closed(c->client_fd))
                                return fail(c, COVE_E_UNAVAILABLE, "%s%s", "the client went away",
                                            "");
                        continue;
                }
                if (k < 0 && errno == EINTR)
                        continue;
                ssize_t n = recv(c->fd, c->in + c->ilen, COVE_FWD_HEAD_MAX + 1 - c->ilen, 0);
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (n <= 0)
                        return fail(c, COVE_E_UNAVAILABLE,
                                    "node %s closed the connection without an answer%s", c->node,
                                    "");
                c->ilen += (size_t)n;
        }
        struct cove_err e2;
        if (!h->answer[0] || cove_nodeauth_answer_check(c->token, c->sig, h->answer, &e2) < 0) {
                cove_warn(&c->d->log, "forward.answer",
                          "node %s answered without a valid Cove-Node-Answer: not relayed",
                          c->node);
                return fail(
                    c, COVE_E_UNAVAILABLE,
                    "the answer from node %s is not authentic (no valid Cove-Node-Answer)%s",
                    c->node, "");
        }
        c->ioff = h->head_len;
        return 0;
}

int cove_forward(struct coved *d, struct cove_req *r, const char *sandbox_id)
{
        return cove_forward_ex(d, r, sandbox_id, &plain_req);
}

int cove_forward_ex(struct coved *d, struct cove_req *r, const char *sandbox_id,
                    const struct cove_fwd_req *fq)
{
        int (*reply_err)(struct cove_req *, const struct cove_err *) =
            fq->reply_err ? fq->reply_err : cove_reply_err;
        struct fwd *c = r->state;
        if (!c) {
                c = calloc(1, sizeof(*c));
                if (!c)
                        return cove_reply_error(r, 500, "internal", "out of memory");
                c->fd = -1;
                c->d = d;
                r->state = c;
                r->cleanup = fwd_cleanup;
                if (fwd_open(d, r, sandbox_id, fq, c,
                             r->route->upload ? 0 : (int64_t)r->body_len) == 0 &&
                    !r->route->upload && r->body_len && send_all(c->fd, r->body, r->body_len) < 0)
                        fail(c, COVE_E_UNAVAILABLE, "node %s: sending the request failed%s",
                             c->node, "");
        }
        if (c->failed && c->fd < 0)
                return reply_err(r, &c->err);
        if (c->chunked_up && !c->failed)
                send_all(c->fd, "0\r\n\r\n", 5);
        int upload_broke = c->failed;
        c->failed = 0;
        c->client_fd = cove_req_sockfd(r);
        struct cove_fwd_head h;
        if (read_head(c, r, &h) < 0) {
                if (upload_broke)
                        cove_err_setk(&c->err, COVE_E_UNAVAILABLE, 0,
                                      "node %s: the connection broke during the upload", c->node);
                return reply_err(r, &c->err);
        }
        const char *hdrs[2 * COVE_FWD_HDRS_MAX];
        size_t nh = 0;
        for (int i = 0; i < h.nkeep; i++) {
                hdrs[2 * nh] = h.keep_name[i];
                hdrs[2 * nh + 1] = h.keep_val[i];
                nh++;
        }
        c->chunked = h.chunked;
        c->left = h.chunked ? -1 : h.content_length;
        /* the stream owns the connection from here */
        r->state = NULL;
        r->cleanup = NULL;
        return cove_reply_stream_hdrs(r, h.status, hdrs, nh, h.chunked ? -1 : h.content_length,
                                      relay_read, relay_free, c);
}

int cove_fwd_h(void *app, struct cove_req *r)
{
        return cove_forward(app, r, r->params[0]);
}

int cove_fwd_up(void *app, struct cove_req *r, const char *data, size_t len)
{
        return cove_forward_upload(app, r, r->params[0], data, len);
}

/* ---- node side ---------------------------------------------------------------------- */

static int tenant_ok(const char *t)
{
        size_t n = t ? strlen(t) : 0;
        if (n == 0 || n > 63)
                return 0;
        for (size_t i = 0; i < n; i++)
                if (!is_tchar((unsigned char)t[i]) || strchr("!#$%&'*+^`|~", t[i]))
                        return 0;
        return 1;
}

int cove_nodeapi_auth(void *app, struct cove_req *r, const char *authorization,
                      struct cove_err *err)
{
        struct coved *d = app;
        if (!authorization || strncmp(authorization, "Cove-Node ", 10) != 0)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "this is node %s's API: it answers only control replicas "
                                     "(Authorization: Cove-Node …); API keys are not accepted "
                                     "on a node, call a control replica",
                                     d->node_name);
        struct cove_nodeauth_hdr h;
        if (cove_nodeauth_parse(authorization, &h, err) < 0)
                return -1;
        if (strcmp(h.name, d->node_name) != 0)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "request signed for node %s, this is node %s", h.name,
                                     d->node_name);
        const char *tenant = cove_req_header(r, "X-Cove-Tenant");
        if (!tenant_ok(tenant))
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "missing or malformed X-Cove-Tenant");
        char target[COVE_FWD_TARGET_MAX];
        if (cove_req_target(r, target, sizeof(target)) < 0)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0, "request target too long");
        struct cove_nodeauth_req q = {.method = r->method, .path_query = target, .tenant = tenant};
        int64_t now = cove_now_ms();
        if (cove_nodeauth_verify(d->node_token, &h, &q, now, err) < 0)
                return -1;
        uint64_t nv = strtoull(h.nonce, NULL, 16);
        int nc = d->fwd ? nonce_check(d->fwd, nv, now) : 2;
        if (nc == 1)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "replayed request (its nonce was seen already)");
        if (nc == 2)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "node %s: too many requests within the replay window",
                                     d->node_name);
        r->answer_hdr_name = "Cove-Node-Answer";
        cove_nodeauth_answer(d->node_token, h.sig, r->answer_hdr_value);
        snprintf(r->tenant, sizeof(r->tenant), "%s", tenant);
        snprintf(r->key_id, sizeof(r->key_id), "node:%s", d->node_name);
        r->admin = 0;
        const char *sbx = NULL;
        if ((r->route->flags & COVE_ROUTE_SANDBOX) && r->nparams >= 1)
                sbx = r->params[0];
        else if (r->route->flags & COVE_ROUTE_E2B) {
                sbx = cove_req_header(r, "E2b-Sandbox-Id");
                if (!sbx || !*sbx || strlen(sbx) > 63)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "E2b-Sandbox-Id is required on the node API");
        }
        if (sbx) {
                struct cove_placement_row pl;
                int rc = d->cat_ops->placement_get(d->cat, sbx, &pl, err);
                if (rc < 0) {
                        err->kind = COVE_E_UNAVAILABLE;
                        return -1;
                }
                if (rc == 1 || strcmp(pl.node, d->node_name) != 0)
                        return cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                                             "sandbox %.64s is not placed on node %s", r->params[0],
                                             d->node_name);
        }
        return 0;
}
