/* DNS wire format for the node resolver; see dnsmsg.h. */
#include "net/dnsmsg.h"

#include <stdio.h>
#include <string.h>

#include "net/policy.h"

static unsigned rd16(const uint8_t *p)
{
        return (unsigned)p[0] << 8 | p[1];
}

static void wr16(uint8_t *p, unsigned v)
{
        p[0] = (uint8_t)(v >> 8);
        p[1] = (uint8_t)v;
}

/* Read a (possibly compressed) name at off into out (dotted, raw). Returns the offset just
 * after the name in the original position, or -1. */
static long read_name(const uint8_t *buf, size_t len, size_t off, char *out, size_t cap,
                      int allow_ptr)
{
        size_t o = 0, pos = off;
        long after = -1;
        int jumps = 0;
        for (;;) {
                if (pos >= len)
                        return -1;
                unsigned l = buf[pos];
                if (l == 0) {
                        if (after < 0)
                                after = (long)pos + 1;
                        break;
                }
                if ((l & 0xc0) == 0xc0) {
                        if (!allow_ptr || pos + 1 >= len || ++jumps > 64)
                                return -1;
                        if (after < 0)
                                after = (long)pos + 2;
                        size_t np = (size_t)(l & 0x3f) << 8 | buf[pos + 1];
                        if (np >= pos) /* only backwards: no loops */
                                return -1;
                        pos = np;
                        continue;
                }
                if (l & 0xc0)
                        return -1;
                if (pos + 1 + l > len || o + l + 2 > cap || o + l + 1 > 255)
                        return -1;
                if (o)
                        out[o++] = '.';
                memcpy(out + o, buf + pos + 1, l);
                o += l;
                pos += 1 + l;
        }
        out[o] = '\0';
        return after;
}

int cove_dns_parse_query(const uint8_t *buf, size_t len, struct cove_dns_query *q)
{
        memset(q, 0, sizeof(*q));
        if (len < 12 || len > 4096)
                return -1;
        q->id = (uint16_t)rd16(buf);
        q->flags = (uint16_t)rd16(buf + 2);
        if (q->flags & 0x8000) /* a response */
                return -1;
        if (((q->flags >> 11) & 0xf) != 0) /* opcode QUERY only */
                return -1;
        if (rd16(buf + 4) != 1 || rd16(buf + 6) != 0 || rd16(buf + 8) != 0)
                return -1;
        char raw[256];
        long after = read_name(buf, len, 12, raw, sizeof(raw), 0);
        if (after < 0 || (size_t)after + 4 > len)
                return -1;
        if (raw[0] && cove_name_normalise(raw, q->name, sizeof(q->name)) < 0)
                return -1;
        q->qtype = (uint16_t)rd16(buf + after);
        q->qclass = (uint16_t)rd16(buf + after + 2);
        q->q = buf + 12;
        q->qlen = (size_t)after + 4 - 12;
        return 0;
}

int cove_dns_parse_answer(const uint8_t *buf, size_t len, uint16_t id, const char *name, int *rcode,
                          uint32_t *addrs, int *naddrs, uint32_t *ttl)
{
        *naddrs = 0;
        *ttl = 0;
        if (len < 12 || rd16(buf) != id || !(buf[2] & 0x80))
                return -1;
        *rcode = buf[3] & 0xf;
        unsigned qd = rd16(buf + 4), an = rd16(buf + 6);
        size_t off = 12;
        char tmp[256];
        for (unsigned i = 0; i < qd; i++) {
                long a = read_name(buf, len, off, tmp, sizeof(tmp), 1);
                if (a < 0 || (size_t)a + 4 > len)
                        return -1;
                off = (size_t)a + 4;
        }
        /* record offsets of the answer section, then follow the chain from name */
        size_t rr[64];
        unsigned nrr = 0;
        for (unsigned i = 0; i < an && nrr < 64; i++) {
                long a = read_name(buf, len, off, tmp, sizeof(tmp), 1);
                if (a < 0 || (size_t)a + 10 > len)
                        return -1;
                size_t rdl = rd16(buf + a + 8);
                if ((size_t)a + 10 + rdl > len)
                        return -1;
                rr[nrr++] = off;
                off = (size_t)a + 10 + rdl;
        }
        char target[256];
        snprintf(target, sizeof(target), "%s", name);
        uint32_t minttl = UINT32_MAX;
        for (int hop = 0; hop < 8; hop++) {
                char next[256] = "";
                for (unsigned i = 0; i < nrr; i++) {
                        char owner[256], norm[256];
                        long a = read_name(buf, len, rr[i], owner, sizeof(owner), 1);
                        if (a < 0 || cove_name_normalise(owner, norm, sizeof(norm)) < 0 ||
                            strcmp(norm, target) != 0)
                                continue;
                        unsigned type = rd16(buf + a), cls = rd16(buf + a + 2);
                        uint32_t t = (uint32_t)rd16(buf + a + 4) << 16 | rd16(buf + a + 6);
                        size_t rdl = rd16(buf + a + 8);
                        if (cls != 1)
                                continue;
                        if (type == COVE_DNS_TYPE_A && rdl == 4) {
                                if (*naddrs < COVE_DNS_MAX_ADDRS) {
                                        uint32_t v;
                                        memcpy(&v, buf + a + 10, 4);
                                        addrs[(*naddrs)++] = v;
                                }
                                if (t < minttl)
                                        minttl = t;
                        } else if (type == 5 && !next[0]) { /* CNAME */
                                char cn[256];
                                if (read_name(buf, len, (size_t)a + 10, cn, sizeof(cn), 1) < 0 ||
                                    cove_name_normalise(cn, next, sizeof(next)) < 0)
                                        return -1;
                                if (t < minttl)
                                        minttl = t;
                        }
                }
                if (*naddrs || !next[0])
                        break;
                snprintf(target, sizeof(target), "%s", next);
        }
        *ttl = minttl == UINT32_MAX ? 0 : minttl;
        return 0;
}

long cove_dns_build_answer(const struct cove_dns_query *q, int rcode, const uint32_t *addrs,
                           int naddrs, uint32_t ttl, uint8_t *out, size_t cap)
{
        size_t need = 12 + q->qlen + (size_t)naddrs * 16;
        if (need > cap)
                return -1;
        wr16(out, q->id);
        /* QR, RD echoed, RA; AA is not claimed */
        wr16(out + 2, 0x8000u | (q->flags & 0x0100u) | 0x0080u | (unsigned)(rcode & 0xf));
        wr16(out + 4, 1);
        wr16(out + 6, (unsigned)naddrs);
        wr16(out + 8, 0);
        wr16(out + 10, 0);
        memcpy(out + 12, q->q, q->qlen);
        uint8_t *p = out + 12 + q->qlen;
        for (int i = 0; i < naddrs; i++) {
                wr16(p, 0xc00c); /* the question's name */
                wr16(p + 2, COVE_DNS_TYPE_A);
                wr16(p + 4, 1);
                wr16(p + 6, ttl >> 16);
                wr16(p + 8, ttl & 0xffff);
                wr16(p + 10, 4);
                memcpy(p + 12, &addrs[i], 4);
                p += 16;
        }
        return (long)need;
}

long cove_dns_build_query(uint16_t id, const char *name, uint8_t *out, size_t cap)
{
        size_t nl = strlen(name);
        if (12 + nl + 2 + 4 > cap || nl > 253)
                return -1;
        memset(out, 0, 12);
        wr16(out, id);
        wr16(out + 2, 0x0100); /* RD */
        wr16(out + 4, 1);
        uint8_t *p = out + 12;
        const char *s = name;
        while (*s) {
                const char *dot = strchr(s, '.');
                size_t l = dot ? (size_t)(dot - s) : strlen(s);
                if (l == 0 || l > 63)
                        return -1;
                *p++ = (uint8_t)l;
                memcpy(p, s, l);
                p += l;
                s += l + (dot ? 1 : 0);
        }
        *p++ = 0;
        wr16(p, COVE_DNS_TYPE_A);
        wr16(p + 2, 1);
        p += 4;
        return p - out;
}
