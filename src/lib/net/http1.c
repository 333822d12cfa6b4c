/* HTTP/1.1 request stream rewriting; see http1.h. */
#include "net/http1.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int cove_bytes_add(struct cove_bytes *x, const void *p, size_t n)
{
        if (x->len + n > x->cap) {
                size_t nc = x->cap ? x->cap : 4096;
                while (nc < x->len + n)
                        nc *= 2;
                uint8_t *nb = malloc(nc);
                if (!nb)
                        return -1;
                if (x->len)
                        memcpy(nb, x->b, x->len);
                if (x->b) { /* never realloc: the old copy may hold a secret */
                        OPENSSL_cleanse(x->b, x->cap);
                        free(x->b);
                }
                x->b = nb;
                x->cap = nc;
        }
        if (n)
                memcpy(x->b + x->len, p, n);
        x->len += n;
        return 0;
}

void cove_bytes_consume(struct cove_bytes *x, size_t n)
{
        if (n >= x->len) {
                if (x->len)
                        OPENSSL_cleanse(x->b, x->len);
                x->len = 0;
                return;
        }
        memmove(x->b, x->b + n, x->len - n);
        x->len -= n;
        OPENSSL_cleanse(x->b + x->len, n);
}

void cove_bytes_free(struct cove_bytes *x)
{
        if (x->b) {
                OPENSSL_cleanse(x->b, x->cap);
                free(x->b);
        }
        *x = (struct cove_bytes){0};
}

void cove_h1_init(struct cove_h1 *h, const char *sni, uint16_t port, cove_h1_inj_fn inj,
                  cove_h1_done_fn done, void *arg)
{
        memset(h, 0, sizeof(*h));
        snprintf(h->sni, sizeof(h->sni), "%s", sni);
        h->port = port;
        h->inj = inj;
        h->done = done;
        h->arg = arg;
}

static int is_tchar(int c)
{
        return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* host[:port] equal to sni (and port, if any, to the connection's) */
static int host_ok(const char *v, size_t n, const char *sni, uint16_t port)
{
        char buf[300], norm[254];
        if (n == 0 || n >= sizeof(buf))
                return 0;
        memcpy(buf, v, n);
        buf[n] = '\0';
        char *colon = strrchr(buf, ':');
        if (colon) {
                *colon = '\0';
                char *end;
                long p = strtol(colon + 1, &end, 10);
                if (*end || colon[1] == '\0' || p < 1 || p > 65535 || (uint16_t)p != port)
                        return 0;
        }
        return cove_name_normalise(buf, norm, sizeof(norm)) == 0 && strcmp(norm, sni) == 0;
}

/* append s[0..n) with every placeholder of the placeholder-mode injections replaced;
 * marks the injections that replaced something */
static int put_replaced(struct cove_bytes *o, const char *s, size_t n,
                        const struct cove_inject *const *inj, int ninj, int *used)
{
        size_t i = 0;
        while (i < n) {
                int hit = -1;
                for (int k = 0; k < ninj && hit < 0; k++)
                        if (inj[k]->placeholder && n - i >= COVE_PLACEHOLDER_LEN &&
                            !memcmp(s + i, inj[k]->ph, COVE_PLACEHOLDER_LEN))
                                hit = k;
                if (hit >= 0) {
                        if (cove_bytes_add(o, inj[hit]->value, strlen(inj[hit]->value)) < 0)
                                return -1;
                        used[hit] = 1;
                        i += COVE_PLACEHOLDER_LEN;
                } else {
                        if (cove_bytes_add(o, s + i, 1) < 0)
                                return -1;
                        i++;
                }
        }
        return 0;
}

int cove_h1_rewrite_head(const char *head, size_t len, const char *sni, uint16_t port,
                         const struct cove_inject *const *inj, int ninj, struct cove_bytes *out,
                         int *chunked, int64_t *clen, int *compressed,
                         const struct cove_inject **applied, int *napplied, char *method,
                         size_t mcap, char *target, size_t tcap, const char **why)
{
        *chunked = 0;
        *clen = -1;
        *compressed = 0;
        *napplied = 0;
        method[0] = target[0] = '\0';
        int used[COVE_H1_MAX_INJ] = {0};
        if (ninj > COVE_H1_MAX_INJ)
                ninj = COVE_H1_MAX_INJ;
        for (size_t i = 0; i < len; i++)
                if (head[i] == '\0' || (head[i] == '\r' && (i + 1 >= len || head[i + 1] != '\n')) ||
                    (head[i] == '\n' && (i == 0 || head[i - 1] != '\r'))) {
                        *why = "malformed request head (NUL, bare CR or bare LF)";
                        return 400;
                }
        /* request line */
        const char *eol = strstr(head, "\r\n");
        const char *sp1 = memchr(head, ' ', (size_t)(eol - head));
        const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
        if (!sp1 || !sp2 || sp1 == head || sp2 == sp1 + 1 || (size_t)(sp1 - head) >= mcap ||
            (eol - sp2 - 1 != 8) ||
            (strncmp(sp2 + 1, "HTTP/1.1", 8) && strncmp(sp2 + 1, "HTTP/1.0", 8))) {
                *why = "malformed request line (want METHOD target HTTP/1.x)";
                return 400;
        }
        for (const char *p = head; p < sp1; p++)
                if (!is_tchar((unsigned char)*p)) {
                        *why = "malformed request method";
                        return 400;
                }
        memcpy(method, head, (size_t)(sp1 - head));
        method[sp1 - head] = '\0';
        size_t tl = (size_t)(sp2 - sp1 - 1);
        snprintf(target, tcap, "%.*s", (int)(tl < tcap ? tl : tcap - 1), sp1 + 1);
        for (const char *p = sp1 + 1; p < sp2; p++)
                if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
                        *why = "malformed request target";
                        return 400;
                }
        if (!strcmp(method, "CONNECT")) {
                *why = "CONNECT is not allowed on an intercepted connection";
                return 501;
        }
        /* absolute-form: its authority must be the SNI too */
        const char *t = sp1 + 1;
        if (tl > 8 && (!strncasecmp(t, "https://", 8) || !strncasecmp(t, "http://", 7))) {
                const char *a = t + (t[4] == ':' ? 7 : 8);
                const char *ae = a;
                while (ae < sp2 && *ae != '/' && *ae != '?' && *ae != '#')
                        ae++;
                const char *at = memchr(a, '@', (size_t)(ae - a));
                if (at || !host_ok(a, (size_t)(ae - a), sni, port)) {
                        *why = "the request target names another host than the TLS SNI";
                        return 421;
                }
        }
        /* headers */
        int hosts = 0, cls = 0, te = 0, upgrade = 0;
        int64_t cl = -1;
        const char *p = eol + 2;
        while (p < head + len - 2) {
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
                        if (!is_tchar((unsigned char)*q)) {
                                *why = "malformed header name";
                                return 400;
                        }
                size_t nl = (size_t)(colon - p);
                const char *v = colon + 1, *ve = le;
                while (v < ve && (*v == ' ' || *v == '\t'))
                        v++;
                while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                        ve--;
                size_t vl = (size_t)(ve - v);
#define HN(s) (nl == sizeof(s) - 1 && !strncasecmp(p, s, nl))
                if (HN("host")) {
                        hosts++;
                        if (!host_ok(v, vl, sni, port)) {
                                *why = "the Host header differs from the TLS SNI (domain fronting)";
                                return 421;
                        }
                } else if (HN("content-length")) {
                        cls++;
                        char num[24];
                        if (vl == 0 || vl >= sizeof(num)) {
                                *why = "malformed Content-Length";
                                return 400;
                        }
                        memcpy(num, v, vl);
                        num[vl] = '\0';
                        char *end;
                        long long x = strtoll(num, &end, 10);
                        if (*end || !isdigit((unsigned char)num[0]) || x < 0) {
                                *why = "malformed Content-Length";
                                return 400;
                        }
                        cl = x;
                } else if (HN("transfer-encoding")) {
                        te++;
                        if (vl != 7 || strncasecmp(v, "chunked", 7)) {
                                *why = "only Transfer-Encoding: chunked is supported";
                                return 501;
                        }
                } else if (HN("upgrade")) {
                        upgrade = 1;
                } else if (HN("content-encoding")) {
                        if (!(vl == 8 && !strncasecmp(v, "identity", 8)))
                                *compressed = 1;
                }
#undef HN
                p = le + 2;
        }
        if (hosts != 1) {
                *why = hosts ? "several Host headers" : "no Host header";
                return 400;
        }
        if (cls > 1 || (te && cls) || te > 1) {
                *why = "ambiguous request framing (several Content-Length, or Content-Length "
                       "with Transfer-Encoding)";
                return 400;
        }
        if (upgrade) {
                *why = "protocol upgrades (h2c, WebSocket) are not allowed on an intercepted "
                       "connection";
                return 501;
        }
        *chunked = te > 0;
        *clen = cl;
        int has_body = *chunked || cl > 0;
        for (int k = 0; k < ninj; k++)
                if (inj[k]->placeholder && *compressed && has_body) {
                        *why = "a compressed request body to a host with a placeholder secret "
                               "(bodies are never rewritten, and a compressed one cannot be "
                               "checked)";
                        return 415;
                }
        /* emit: request line, kept headers (placeholders replaced), injected headers */
        if (cove_bytes_add(out, head, (size_t)(sp1 + 1 - head)) < 0 ||
            put_replaced(out, sp1 + 1, tl, inj, ninj, used) < 0 ||
            cove_bytes_add(out, sp2, (size_t)(eol + 2 - sp2)) < 0)
                return -1;
        p = eol + 2;
        while (p < head + len - 2) {
                const char *le = strstr(p, "\r\n");
                const char *colon = memchr(p, ':', (size_t)(le - p));
                size_t nl = (size_t)(colon - p);
                int drop = 0;
                for (int k = 0; k < ninj; k++)
                        if (!inj[k]->placeholder && strlen(inj[k]->header) == nl &&
                            !strncasecmp(inj[k]->header, p, nl))
                                drop = 1;
                if (!drop && (cove_bytes_add(out, p, nl + 1) < 0 ||
                              put_replaced(out, colon + 1, (size_t)(le + 2 - colon - 1), inj, ninj,
                                           used) < 0))
                        return -1;
                p = le + 2;
        }
        for (int k = 0; k < ninj; k++) {
                if (inj[k]->placeholder)
                        continue;
                const char *f = inj[k]->format ? inj[k]->format : "{value}";
                const char *at = strstr(f, "{value}");
                if (cove_bytes_add(out, inj[k]->header, strlen(inj[k]->header)) < 0 ||
                    cove_bytes_add(out, ": ", 2) < 0 ||
                    cove_bytes_add(out, f, at ? (size_t)(at - f) : strlen(f)) < 0 ||
                    (at && (cove_bytes_add(out, inj[k]->value, strlen(inj[k]->value)) < 0 ||
                            cove_bytes_add(out, at + 7, strlen(at + 7)) < 0)) ||
                    cove_bytes_add(out, "\r\n", 2) < 0)
                        return -1;
                used[k] = 1;
        }
        if (cove_bytes_add(out, "\r\n", 2) < 0)
                return -1;
        for (int k = 0; k < ninj; k++)
                if (used[k])
                        applied[(*napplied)++] = inj[k];
        return 0;
}

/* a watched placeholder in carry + s? updates the carry */
static int body_scan(struct cove_h1 *h, const uint8_t *s, size_t n)
{
        if (!h->nwatch || !n)
                return 0;
        uint8_t edge[2 * COVE_PLACEHOLDER_LEN];
        size_t k = n < COVE_PLACEHOLDER_LEN ? n : COVE_PLACEHOLDER_LEN;
        memcpy(edge, h->carry, h->clen);
        memcpy(edge + h->clen, s, k);
        for (int w = 0; w < h->nwatch; w++)
                if (memmem(edge, h->clen + k, h->watch[w], COVE_PLACEHOLDER_LEN) ||
                    memmem(s, n, h->watch[w], COVE_PLACEHOLDER_LEN))
                        return 1;
        size_t keep = COVE_PLACEHOLDER_LEN - 1;
        if (n >= keep) {
                memcpy(h->carry, s + n - keep, keep);
                h->clen = keep;
        } else {
                size_t tot = h->clen + n, drop = tot > keep ? tot - keep : 0;
                memmove(h->carry, h->carry + drop, h->clen - drop);
                memcpy(h->carry + h->clen - drop, s, n);
                h->clen = tot - drop;
        }
        return 0;
}

static int end_head(struct cove_h1 *h, struct cove_bytes *out, const char **why)
{
        const struct cove_inject *inj[COVE_H1_MAX_INJ], *applied[COVE_H1_MAX_INJ];
        int ninj = h->inj ? h->inj(h->arg, inj, COVE_H1_MAX_INJ) : 0, napplied = 0, chunked;
        int64_t clen;
        int compressed;
        char method[32], target[256];
        struct cove_bytes tmp = {0};
        int r = cove_h1_rewrite_head((const char *)h->head, h->hlen, h->sni, h->port, inj, ninj,
                                     &tmp, &chunked, &clen, &compressed, applied, &napplied, method,
                                     sizeof(method), target, sizeof(target), why);
        OPENSSL_cleanse(h->head, h->hlen);
        h->hlen = 0;
        if (r == 0 && cove_bytes_add(out, tmp.b, tmp.len) < 0)
                r = -1;
        cove_bytes_free(&tmp);
        if (r != 0)
                return r;
        h->requests++;
        if (h->done)
                h->done(h->arg, method, target, applied, napplied);
        h->nwatch = 0;
        h->clen = 0;
        for (int k = 0; k < ninj; k++)
                if (inj[k]->placeholder)
                        memcpy(h->watch[h->nwatch++], inj[k]->ph, COVE_PLACEHOLDER_LEN + 1);
        if (chunked) {
                h->st = H1_CHUNK_LINE;
                h->llen = 0;
        } else if (clen > 0) {
                h->st = H1_BODY;
                h->left = (uint64_t)clen;
        } else {
                h->st = H1_HEAD;
        }
        return 0;
}

int cove_h1_feed(struct cove_h1 *h, const uint8_t *in, size_t n, struct cove_bytes *out,
                 const char **why)
{
        size_t i = 0;
        while (i < n) {
                switch (h->st) {
                case H1_HEAD: {
                        uint8_t c = in[i++];
                        if (h->hlen == 0 && (c == '\r' || c == '\n'))
                                continue; /* empty lines before a request line are ignored */
                        if (h->hlen >= sizeof(h->head) - 1) {
                                *why = "request head larger than 32 KiB";
                                return 431;
                        }
                        h->head[h->hlen++] = c;
                        if (h->hlen >= 4 && !memcmp(h->head + h->hlen - 4, "\r\n\r\n", 4)) {
                                h->head[h->hlen] = '\0';
                                int r = end_head(h, out, why);
                                if (r)
                                        return r;
                        }
                        break;
                }
                case H1_BODY:
                case H1_CHUNK_DATA: {
                        size_t k = n - i;
                        if (k > h->left)
                                k = (size_t)h->left;
                        if (body_scan(h, in + i, k)) {
                                *why = "a placeholder in a request body (bodies are never "
                                       "rewritten)";
                                return 400;
                        }
                        if (cove_bytes_add(out, in + i, k) < 0)
                                return -1;
                        i += k;
                        h->left -= k;
                        if (!h->left) {
                                if (h->st == H1_CHUNK_DATA) {
                                        h->st = H1_CHUNK_CRLF;
                                        h->llen = 0;
                                } else {
                                        h->st = H1_HEAD;
                                }
                        }
                        break;
                }
                case H1_CHUNK_CRLF: {
                        uint8_t c = in[i++];
                        if (c != (h->llen == 0 ? '\r' : '\n')) {
                                *why = "malformed chunked body (no CRLF after a chunk)";
                                return 400;
                        }
                        if (cove_bytes_add(out, &c, 1) < 0)
                                return -1;
                        if (++h->llen == 2) {
                                h->st = H1_CHUNK_LINE;
                                h->llen = 0;
                        }
                        break;
                }
                case H1_CHUNK_LINE:
                case H1_TRAILER: {
                        uint8_t c = in[i++];
                        if (h->llen >= sizeof(h->line) - 1 || c == '\0') {
                                *why = "malformed chunked body (chunk line or trailer)";
                                return 400;
                        }
                        h->line[h->llen++] = (char)c;
                        if (c != '\n')
                                break;
                        if (h->llen < 2 || h->line[h->llen - 2] != '\r') {
                                *why = "malformed chunked body (bare LF)";
                                return 400;
                        }
                        h->line[h->llen] = '\0';
                        if (body_scan(h, (const uint8_t *)h->line, h->llen)) {
                                *why = "a placeholder in a request body (bodies are never "
                                       "rewritten)";
                                return 400;
                        }
                        if (cove_bytes_add(out, h->line, h->llen) < 0)
                                return -1;
                        if (h->st == H1_TRAILER) {
                                if (h->llen == 2)
                                        h->st = H1_HEAD;
                                h->llen = 0;
                                break;
                        }
                        char *end;
                        if (!isxdigit((unsigned char)h->line[0])) {
                                *why = "malformed chunk size";
                                return 400;
                        }
                        unsigned long long sz = strtoull(h->line, &end, 16);
                        if ((*end != '\r' && *end != ';' && *end != ' ' && *end != '\t') ||
                            end - h->line > 15) {
                                *why = "malformed chunk size";
                                return 400;
                        }
                        h->llen = 0;
                        if (sz == 0) {
                                h->st = H1_TRAILER;
                        } else {
                                h->st = H1_CHUNK_DATA;
                                h->left = sz;
                        }
                        break;
                }
                }
        }
        return 0;
}
