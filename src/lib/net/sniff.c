/* TLS SNI and HTTP Host extraction; see sniff.h. Every length read is checked against the
 * bytes that are really there before it is used. */
#include "net/sniff.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

#include "net/policy.h"

enum cove_sniff_proto cove_sniff_proto(const uint8_t *buf, size_t len)
{
        if (len >= 1 && buf[0] == 0x16)
                return COVE_PROTO_TLS;
        size_t i = 0;
        while (i < len && i < 16 && buf[i] >= 'A' && buf[i] <= 'Z')
                i++;
        if (i > 0 && (i == len || (i < len && buf[i] == ' ')))
                return COVE_PROTO_HTTP;
        return COVE_PROTO_UNKNOWN;
}

static unsigned rd16(const uint8_t *p)
{
        return (unsigned)p[0] << 8 | p[1];
}

/* Join the handshake fragments of consecutive handshake records into hs (cap bytes).
 * Returns the joined length, 0 when more records are needed, -1 when malformed. */
static long join_records(const uint8_t *buf, size_t len, uint8_t *hs, size_t cap)
{
        size_t off = 0, n = 0;
        while (off + 5 <= len) {
                if (buf[off] != 0x16 || buf[off + 1] != 0x03)
                        return -1;
                size_t rl = rd16(buf + off + 3);
                if (rl == 0 || rl > 16384)
                        return -1;
                if (off + 5 + rl > len)
                        break;
                if (n + rl > cap)
                        return -1;
                memcpy(hs + n, buf + off + 5, rl);
                n += rl;
                off += 5 + rl;
                if (n >= 4) {
                        if (hs[0] != 0x01) /* ClientHello */
                                return -1;
                        size_t hl = (size_t)hs[1] << 16 | (size_t)hs[2] << 8 | hs[3];
                        if (hl + 4 > cap)
                                return -1;
                        if (n >= hl + 4)
                                return (long)(hl + 4);
                }
        }
        if (off + 5 > len && len - off >= 1 && buf[off] != 0x16)
                return -1;
        return 0;
}

int cove_sniff_tls_sni(const uint8_t *buf, size_t len, char *name, size_t cap)
{
        static __thread uint8_t hs[COVE_SNIFF_MAX];
        if (len > COVE_SNIFF_MAX + 5 * 4)
                len = COVE_SNIFF_MAX + 5 * 4;
        long hl = join_records(buf, len, hs, sizeof(hs));
        if (hl <= 0)
                return hl == 0 && len < COVE_SNIFF_MAX ? 0 : -1;
        const uint8_t *p = hs + 4, *end = hs + hl;
        /* version(2) random(32) */
        if (end - p < 34)
                return -1;
        p += 34;
        /* session id */
        if (end - p < 1 || end - p < 1 + p[0])
                return -1;
        p += 1 + p[0];
        /* cipher suites */
        if (end - p < 2 || end - p < 2 + (long)rd16(p))
                return -1;
        p += 2 + rd16(p);
        /* compression methods */
        if (end - p < 1 || end - p < 1 + p[0])
                return -1;
        p += 1 + p[0];
        name[0] = '\0';
        if (p == end) /* no extensions */
                return 1;
        if (end - p < 2 || end - p < 2 + (long)rd16(p))
                return -1;
        const uint8_t *xend = p + 2 + rd16(p);
        p += 2;
        int seen = 0;
        while (p < xend) {
                if (xend - p < 4)
                        return -1;
                unsigned type = rd16(p), el = rd16(p + 2);
                p += 4;
                if (xend - p < (long)el)
                        return -1;
                if (type == 0) { /* server_name */
                        if (seen++)
                                return -1;
                        const uint8_t *q = p, *qe = p + el;
                        if (qe - q < 2 || (long)rd16(q) != qe - q - 2)
                                return -1;
                        q += 2;
                        int names = 0;
                        while (q < qe) {
                                if (qe - q < 3)
                                        return -1;
                                unsigned nt = q[0], nl = rd16(q + 1);
                                q += 3;
                                if (qe - q < (long)nl)
                                        return -1;
                                if (nt == 0) { /* host_name: exactly one allowed */
                                        char tmp[256];
                                        if (names++ || nl == 0 || nl >= sizeof(tmp) ||
                                            memchr(q, 0, nl))
                                                return -1;
                                        memcpy(tmp, q, nl);
                                        tmp[nl] = '\0';
                                        if (cove_name_normalise(tmp, name, cap) < 0)
                                                return -1;
                                }
                                q += nl;
                        }
                }
                p += el;
        }
        return 1;
}

int cove_sniff_http_host(const uint8_t *buf, size_t len, char *host, size_t cap, uint16_t *port)
{
        const char *s = (const char *)buf;
        size_t lim = len < 8192 ? len : 8192;
        const char *eoh = memmem(s, lim, "\r\n\r\n", 4);
        if (!eoh)
                return len >= 8192 ? -1 : 0;
        const char *line_end = memmem(s, (size_t)(eoh - s) + 2, "\r\n", 2);
        /* request line: METHOD SP target SP HTTP/x */
        const char *sp1 = memchr(s, ' ', (size_t)(line_end - s));
        if (!sp1)
                return -1;
        const char *sp2 = memchr(sp1 + 1, ' ', (size_t)(line_end - sp1 - 1));
        if (!sp2 || line_end - sp2 < 9 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0)
                return -1;
        char abs_auth[256] = "";
        if (sp2 - sp1 - 1 > 7 && strncasecmp(sp1 + 1, "http://", 7) == 0) {
                const char *a = sp1 + 8, *ae = a;
                while (ae < sp2 && *ae != '/' && *ae != '?')
                        ae++;
                if (ae - a == 0 || (size_t)(ae - a) >= sizeof(abs_auth))
                        return -1;
                memcpy(abs_auth, a, (size_t)(ae - a));
                abs_auth[ae - a] = '\0';
        }
        char val[256] = "";
        int found = 0;
        const char *p = line_end + 2;
        while (p < eoh + 2) {
                const char *le = memmem(p, (size_t)(eoh + 2 - p), "\r\n", 2);
                if (!le)
                        return -1;
                const char *colon = memchr(p, ':', (size_t)(le - p));
                if (!colon)
                        return -1;
                if (colon - p == 4 && strncasecmp(p, "host", 4) == 0) {
                        if (found++)
                                return -1;
                        const char *v = colon + 1, *ve = le;
                        while (v < ve && (*v == ' ' || *v == '\t'))
                                v++;
                        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                                ve--;
                        if ((size_t)(ve - v) >= sizeof(val) || memchr(v, 0, (size_t)(ve - v)))
                                return -1;
                        memcpy(val, v, (size_t)(ve - v));
                        val[ve - v] = '\0';
                }
                p = le + 2;
        }
        if (abs_auth[0] && strcasecmp(abs_auth, val) != 0)
                return -1;
        *port = 0;
        host[0] = '\0';
        if (!val[0])
                return 1;
        char *c = strrchr(val, ':');
        if (c) {
                *c = '\0';
                unsigned v = 0;
                if (!c[1] || strlen(c + 1) > 5)
                        return -1;
                for (const char *d = c + 1; *d; d++) {
                        if (!isdigit((unsigned char)*d))
                                return -1;
                        v = v * 10 + (unsigned)(*d - '0');
                }
                if (v == 0 || v > 65535)
                        return -1;
                *port = (uint16_t)v;
        }
        if (cove_name_normalise(val, host, cap) < 0)
                return -1;
        return 1;
}
