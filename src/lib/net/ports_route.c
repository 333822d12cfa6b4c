/* Request heads of the port listener; see ports_route.h. */
#include "net/ports_route.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

size_t cove_ports_head_len(const uint8_t *buf, size_t n)
{
        for (size_t i = 3; i < n; i++)
                if (buf[i] == '\n' && buf[i - 1] == '\r' && buf[i - 2] == '\n' &&
                    buf[i - 3] == '\r')
                        return i + 1;
        return 0;
}

static int tchar(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int id_char(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
}

static int eq(const char *p, size_t n, const char *lit)
{
        return strlen(lit) == n && !strncasecmp(p, lit, n);
}

/* A port number "1".."65535" without leading zeros; 0 when not one. */
static uint16_t parse_port(const char *p, size_t n)
{
        if (!n || n > 5 || p[0] == '0')
                return 0;
        unsigned v = 0;
        for (size_t i = 0; i < n; i++) {
                if (p[i] < '0' || p[i] > '9')
                        return 0;
                v = v * 10 + (unsigned)(p[i] - '0');
        }
        return v <= 65535 ? (uint16_t)v : 0;
}

static int set_id(struct cove_ports_req *rq, const char *p, size_t n)
{
        if (!n || n > COVE_PORTS_ID_MAX)
                return -1;
        for (size_t i = 0; i < n; i++)
                if (!id_char((unsigned char)p[i]))
                        return -1;
        memcpy(rq->sandbox, p, n);
        rq->sandbox[n] = '\0';
        return 0;
}

static void set_token(struct cove_ports_req *rq, const char *p, size_t n, enum cove_ports_tsrc src)
{
        if (rq->tsrc != COVE_PORTS_TOK_NONE && rq->tsrc <= src)
                return; /* an earlier source wins */
        if (n > COVE_PORTS_TOKEN_MAX)
                n = COVE_PORTS_TOKEN_MAX + 1; /* too long: kept as a wrong token */
        size_t k = n > COVE_PORTS_TOKEN_MAX ? COVE_PORTS_TOKEN_MAX : n;
        memcpy(rq->token, p, k);
        rq->token[k] = '\0';
        if (n > COVE_PORTS_TOKEN_MAX)
                rq->token[0] = '!'; /* never equal to a token */
        rq->tsrc = src;
}

/* Host "{port}-{id}.{domain}[:N]" */
static int route_host(struct cove_ports_req *rq, const char *h, size_t n, const char *domain)
{
        if (!domain || !*domain || !n)
                return 0;
        const char *colon = memchr(h, ':', n);
        size_t hl = colon ? (size_t)(colon - h) : n;
        size_t dl = strlen(domain);
        if (hl <= dl + 1 || h[hl - dl - 1] != '.' || strncasecmp(h + hl - dl, domain, dl) != 0)
                return 0;
        size_t ll = hl - dl - 1; /* the label(s) before the domain */
        const char *dash = memchr(h, '-', ll);
        if (!dash)
                return 0;
        uint16_t port = parse_port(h, (size_t)(dash - h));
        if (!port || set_id(rq, dash + 1, ll - (size_t)(dash + 1 - h)) < 0)
                return 0;
        rq->port = port;
        rq->mode = COVE_PORTS_HOST;
        return 1;
}

/* target "/p/{id}/{port}" then "/", "?" or the end */
static int route_path(struct cove_ports_req *rq, const char *t, size_t n)
{
        if (n < 3 || memcmp(t, "/p/", 3) != 0)
                return 0;
        const char *id = t + 3, *end = t + n;
        const char *slash = memchr(id, '/', (size_t)(end - id));
        if (!slash)
                return 0;
        const char *pp = slash + 1, *pe = pp;
        while (pe < end && *pe != '/' && *pe != '?')
                pe++;
        uint16_t port = parse_port(pp, (size_t)(pe - pp));
        if (!port || set_id(rq, id, (size_t)(slash - id)) < 0)
                return 0;
        rq->port = port;
        rq->prefix = (uint32_t)(pe - t);
        rq->mode = COVE_PORTS_PATH;
        return 1;
}

/* cove_token=… in the query part of the target */
static void query_token(struct cove_ports_req *rq, const char *t, size_t n)
{
        const char *q = memchr(t, '?', n);
        if (!q)
                return;
        const char *end = t + n, *p = q + 1;
        size_t kl = strlen(COVE_PORTS_QUERY);
        while (p < end) {
                const char *amp = memchr(p, '&', (size_t)(end - p));
                const char *pe = amp ? amp : end;
                if ((size_t)(pe - p) > kl && !memcmp(p, COVE_PORTS_QUERY, kl) && p[kl] == '=') {
                        set_token(rq, p + kl + 1, (size_t)(pe - p - (ptrdiff_t)kl - 1),
                                  COVE_PORTS_TOK_QUERY);
                        return;
                }
                p = pe + 1;
        }
}

/* cookie-string "a=b; c=d" */
static void cookie_token(struct cove_ports_req *rq, const char *v, size_t n)
{
        const char *p = v, *end = v + n;
        size_t kl = strlen(COVE_PORTS_COOKIE);
        while (p < end) {
                while (p < end && (*p == ' ' || *p == ';'))
                        p++;
                const char *semi = memchr(p, ';', (size_t)(end - p));
                const char *pe = semi ? semi : end;
                if ((size_t)(pe - p) > kl && !memcmp(p, COVE_PORTS_COOKIE, kl) && p[kl] == '=') {
                        set_token(rq, p + kl + 1, (size_t)(pe - p - (ptrdiff_t)kl - 1),
                                  COVE_PORTS_TOK_COOKIE);
                        return;
                }
                p = pe;
        }
}

static int trim(const char *head, struct cove_ports_span *s)
{
        while (s->len && (head[s->off] == ' ' || head[s->off] == '\t')) {
                s->off++;
                s->len--;
        }
        while (s->len && (head[s->off + s->len - 1] == ' ' || head[s->off + s->len - 1] == '\t'))
                s->len--;
        return 0;
}

int cove_ports_parse(const char *head, size_t len, const char *domain, struct cove_ports_req *rq,
                     const char **why)
{
        memset(rq, 0, sizeof(*rq));
        rq->clen = -1;
        if (len > COVE_PORTS_HEAD_MAX) {
                *why = "request head over 32 KiB";
                return 431;
        }
        if (len < 4 || memcmp(head + len - 4, "\r\n\r\n", 4) != 0) {
                *why = "incomplete request head";
                return 400;
        }
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)head[i];
                if (!c || (c == '\r' && head[i + 1] != '\n') ||
                    (c == '\n' && (!i || head[i - 1] != '\r'))) {
                        *why = "NUL, bare CR or bare LF in the request head";
                        return 400;
                }
        }
        /* request line */
        const char *eol = strstr(head, "\r\n");
        const char *sp1 = memchr(head, ' ', (size_t)(eol - head));
        if (!sp1 || sp1 == head || (size_t)(sp1 - head) >= sizeof(rq->method)) {
                *why = "malformed request line";
                return 400;
        }
        for (const char *p = head; p < sp1; p++)
                if (!tchar((unsigned char)*p)) {
                        *why = "malformed request method";
                        return 400;
                }
        memcpy(rq->method, head, (size_t)(sp1 - head));
        const char *tg = sp1 + 1;
        const char *sp2 = memchr(tg, ' ', (size_t)(eol - tg));
        if (!sp2 || sp2 == tg || eol - sp2 != 9 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 ||
            (sp2[8] != '0' && sp2[8] != '1')) {
                *why = "malformed request line (want METHOD SP target SP HTTP/1.x)";
                return 400;
        }
        rq->minor = sp2[8] - '0';
        if (!strcmp(rq->method, "CONNECT")) {
                *why = "CONNECT is not served here";
                return 405;
        }
        if (*tg != '/') {
                *why = "the request target must be a path (origin form)";
                return 400;
        }
        for (const char *p = tg; p < sp2; p++)
                if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
                        *why = "control or non-ASCII byte in the request target";
                        return 400;
                }
        rq->target = (struct cove_ports_span){(uint32_t)(tg - head), (uint32_t)(sp2 - tg)};
        /* header lines */
        const char *p = eol + 2, *end = head + len - 2;
        int nhost = 0, ncl = 0, nte = 0;
        struct cove_ports_span e2b_id = {0, 0}, e2b_port = {0, 0};
        while (p < end) {
                const char *le = strstr(p, "\r\n");
                if (*p == ' ' || *p == '\t') {
                        *why = "obsolete header line folding";
                        return 400;
                }
                const char *colon = memchr(p, ':', (size_t)(le - p));
                if (!colon || colon == p) {
                        *why = "malformed header line";
                        return 400;
                }
                for (const char *q = p; q < colon; q++)
                        if (!tchar((unsigned char)*q)) {
                                *why = "malformed header name";
                                return 400;
                        }
                if (rq->nh >= COVE_PORTS_HEADERS_MAX) {
                        *why = "more than 128 header lines";
                        return 431;
                }
                struct cove_ports_span nm = {(uint32_t)(p - head), (uint32_t)(colon - p)};
                struct cove_ports_span v = {(uint32_t)(colon + 1 - head),
                                            (uint32_t)(le - colon - 1)};
                trim(head, &v);
                rq->hname[rq->nh] = nm;
                rq->hval[rq->nh] = v;
                rq->nh++;
                const char *n = head + nm.off, *vv = head + v.off;
                if (eq(n, nm.len, "Host")) {
                        nhost++;
                        rq->host = v;
                } else if (eq(n, nm.len, "Content-Length")) {
                        ncl++;
                        int64_t cl = 0;
                        if (!v.len || v.len > 18) {
                                *why = "invalid Content-Length";
                                return 400;
                        }
                        for (uint32_t i = 0; i < v.len; i++) {
                                if (vv[i] < '0' || vv[i] > '9') {
                                        *why = "invalid Content-Length";
                                        return 400;
                                }
                                cl = cl * 10 + (vv[i] - '0');
                        }
                        rq->clen = cl;
                } else if (eq(n, nm.len, "Transfer-Encoding")) {
                        nte++;
                        if (!eq(vv, v.len, "chunked")) {
                                *why = "Transfer-Encoding other than chunked";
                                return 501;
                        }
                        rq->chunked = 1;
                } else if (eq(n, nm.len, "Upgrade")) {
                        rq->upgrade = 1;
                } else if (eq(n, nm.len, "X-Cove-Port-Token") ||
                           eq(n, nm.len, "e2b-traffic-access-token")) {
                        set_token(rq, vv, v.len, COVE_PORTS_TOK_HEADER);
                } else if (eq(n, nm.len, "Cookie")) {
                        cookie_token(rq, vv, v.len);
                } else if (eq(n, nm.len, "E2b-Sandbox-Id")) {
                        e2b_id = v;
                } else if (eq(n, nm.len, "E2b-Sandbox-Port")) {
                        e2b_port = v;
                }
                p = le + 2;
        }
        if (nhost > 1 || ncl > 1 || nte > 1) {
                *why = "several Host, Content-Length or Transfer-Encoding headers";
                return 400;
        }
        if (ncl && nte) {
                *why = "both Content-Length and Transfer-Encoding";
                return 400;
        }
        if (rq->minor == 1 && !nhost) {
                *why = "HTTP/1.1 request without Host";
                return 400;
        }
        query_token(rq, head + rq->target.off, rq->target.len);
        if (route_host(rq, head + rq->host.off, rq->host.len, domain))
                return 0;
        if (e2b_id.len && e2b_port.len) {
                uint16_t port = parse_port(head + e2b_port.off, e2b_port.len);
                if (port && set_id(rq, head + e2b_id.off, e2b_id.len) == 0) {
                        rq->port = port;
                        rq->mode = COVE_PORTS_E2B;
                        return 0;
                }
        }
        route_path(rq, head + rq->target.off, rq->target.len);
        if (rq->mode == COVE_PORTS_NONE)
                rq->sandbox[0] = '\0';
        return 0;
}

static int add(struct cove_bytes *o, const char *p, size_t n)
{
        return cove_bytes_add(o, p, n);
}

static int adds(struct cove_bytes *o, const char *s)
{
        return cove_bytes_add(o, s, strlen(s));
}

/* the target without the route prefix and without cove_token */
static int put_target(struct cove_bytes *o, const char *t, size_t n, uint32_t prefix)
{
        t += prefix;
        n -= prefix;
        const char *q = memchr(t, '?', n);
        size_t pl = q ? (size_t)(q - t) : n;
        if (!pl || t[0] != '/') {
                if (adds(o, "/") < 0)
                        return -1;
        }
        if (pl && add(o, t, pl) < 0)
                return -1;
        if (!q)
                return 0;
        const char *end = t + n, *p = q + 1;
        size_t kl = strlen(COVE_PORTS_QUERY);
        int first = 1;
        while (p <= end) {
                const char *amp = memchr(p, '&', (size_t)(end - p));
                const char *pe = amp ? amp : end;
                int drop =
                    (size_t)(pe - p) >= kl + 1 && !memcmp(p, COVE_PORTS_QUERY, kl) && p[kl] == '=';
                if (!drop && (pe > p || amp)) {
                        if (adds(o, first ? "?" : "&") < 0 || add(o, p, (size_t)(pe - p)) < 0)
                                return -1;
                        first = 0;
                }
                if (!amp)
                        break;
                p = pe + 1;
        }
        return 0;
}

/* the Cookie value without cove_port_token; empty when nothing else is left */
static int put_cookie(struct cove_bytes *o, const char *v, size_t n)
{
        const char *p = v, *end = v + n;
        size_t kl = strlen(COVE_PORTS_COOKIE);
        int first = 1;
        while (p < end) {
                while (p < end && (*p == ' ' || *p == ';'))
                        p++;
                const char *semi = memchr(p, ';', (size_t)(end - p));
                const char *pe = semi ? semi : end;
                int drop =
                    (size_t)(pe - p) > kl && !memcmp(p, COVE_PORTS_COOKIE, kl) && p[kl] == '=';
                if (!drop && pe > p) {
                        if ((!first && adds(o, "; ") < 0) || add(o, p, (size_t)(pe - p)) < 0)
                                return -1;
                        first = 0;
                }
                p = pe;
        }
        return 0;
}

static int dropped(const char *n, size_t l)
{
        static const char *const names[] = {"X-Cove-Port-Token", "e2b-traffic-access-token",
                                            "E2b-Sandbox-Id",    "E2b-Sandbox-Port",
                                            "X-Forwarded-For",   "X-Forwarded-Proto",
                                            "X-Forwarded-Host",  "X-Forwarded-Prefix",
                                            "Forwarded",         "X-Real-IP",
                                            "X-Cove-Relay",      "X-Cove-Client"};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
                if (eq(n, l, names[i]))
                        return 1;
        return 0;
}

int cove_ports_rewrite(const char *head, const struct cove_ports_req *rq, const char *client_ip,
                       struct cove_bytes *out)
{
        char ver[16];
        snprintf(ver, sizeof(ver), " HTTP/1.%d\r\n", rq->minor);
        if (adds(out, rq->method) < 0 || adds(out, " ") < 0 ||
            put_target(out, head + rq->target.off, rq->target.len,
                       rq->mode == COVE_PORTS_PATH ? rq->prefix : 0) < 0 ||
            adds(out, ver) < 0)
                return -1;
        for (int i = 0; i < rq->nh; i++) {
                const char *n = head + rq->hname[i].off, *v = head + rq->hval[i].off;
                size_t nl = rq->hname[i].len, vl = rq->hval[i].len;
                if (dropped(n, nl))
                        continue;
                if (eq(n, nl, "Cookie")) {
                        struct cove_bytes c = {0};
                        if (put_cookie(&c, v, vl) < 0) {
                                cove_bytes_free(&c);
                                return -1;
                        }
                        int r = 0;
                        if (c.len)
                                r = add(out, n, nl) < 0 || adds(out, ": ") < 0 ||
                                    add(out, (const char *)c.b, c.len) < 0 || adds(out, "\r\n") < 0;
                        cove_bytes_free(&c);
                        if (r)
                                return -1;
                        continue;
                }
                if (add(out, n, nl) < 0 || adds(out, ": ") < 0 || add(out, v, vl) < 0 ||
                    adds(out, "\r\n") < 0)
                        return -1;
        }
        if (adds(out, "X-Forwarded-For: ") < 0 || adds(out, client_ip) < 0 ||
            adds(out, "\r\nX-Forwarded-Proto: http\r\n") < 0)
                return -1;
        if (rq->host.len &&
            (adds(out, "X-Forwarded-Host: ") < 0 ||
             add(out, head + rq->host.off, rq->host.len) < 0 || adds(out, "\r\n") < 0))
                return -1;
        if (rq->mode == COVE_PORTS_PATH &&
            (adds(out, "X-Forwarded-Prefix: ") < 0 ||
             add(out, head + rq->target.off, rq->prefix) < 0 || adds(out, "\r\n") < 0))
                return -1;
        return adds(out, "\r\n");
}

int cove_ports_req_header(const char *head, const struct cove_ports_req *rq, const char *name,
                          char *out, size_t cap)
{
        int found = 0;
        for (int i = 0; i < rq->nh; i++) {
                if (!eq(head + rq->hname[i].off, rq->hname[i].len, name))
                        continue;
                if (found || rq->hval[i].len >= cap)
                        return -1;
                memcpy(out, head + rq->hval[i].off, rq->hval[i].len);
                out[rq->hval[i].len] = '\0';
                found = 1;
        }
        return found;
}

int cove_ports_relay_head(const char *head, const struct cove_ports_req *rq, const char *extra,
                          struct cove_bytes *out)
{
        const char *eol = strstr(head, "\r\n");
        if (!eol || add(out, head, (size_t)(eol - head) + 2) < 0)
                return -1;
        for (int i = 0; i < rq->nh; i++) {
                const char *n = head + rq->hname[i].off, *v = head + rq->hval[i].off;
                size_t nl = rq->hname[i].len, vl = rq->hval[i].len;
                if (eq(n, nl, "X-Cove-Relay") || eq(n, nl, "X-Cove-Client"))
                        continue;
                if (add(out, n, nl) < 0 || adds(out, ": ") < 0 || add(out, v, vl) < 0 ||
                    adds(out, "\r\n") < 0)
                        return -1;
        }
        return adds(out, extra) < 0 ? -1 : adds(out, "\r\n");
}
