/* Unified line diffs (util/linediff.h): lines are hashed once, the common head and tail
 * are trimmed, Myers' greedy search keeps one V vector per edit step for the backtrack. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/linediff.h"

struct line {
        const char *p;
        size_t len; /* without the '\n' */
        uint64_t h;
        int nl; /* ends with '\n' */
};

static struct line *split(const char *s, size_t n, size_t *count)
{
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
                k += s[i] == '\n';
        if (n && s[n - 1] != '\n')
                k++;
        struct line *v = calloc(k ? k : 1, sizeof(*v));
        if (!v)
                return NULL;
        size_t j = 0, start = 0;
        for (size_t i = 0; i <= n && j < k; i++) {
                if (i == n || s[i] == '\n') {
                        struct line *l = &v[j++];
                        l->p = s + start;
                        l->len = i - start;
                        l->nl = i < n;
                        uint64_t h = 1469598103934665603ull;
                        for (size_t q = 0; q < l->len; q++)
                                h = (h ^ (unsigned char)l->p[q]) * 1099511628211ull;
                        l->h = h ^ (uint64_t)l->nl;
                        start = i + 1;
                }
        }
        *count = k;
        return v;
}

static int eq(const struct line *a, const struct line *b)
{
        return a->h == b->h && a->len == b->len && a->nl == b->nl && !memcmp(a->p, b->p, a->len);
}

/* Edit script of a[0..n) -> b[0..m) into ops (n + m slots): '=', '-', '+'. Returns the
 * count, -1 on ENOMEM; past COVE_LINEDIFF_MAX_D everything is '-' then '+'. */
static long myers(const struct line *a, long n, const struct line *b, long m, char *ops)
{
        long max = COVE_LINEDIFF_MAX_D;
        if (max > n + m)
                max = n + m;
        long off = max + 1;
        long *v = calloc((size_t)(2 * max + 3), sizeof(long));
        long **trace = calloc((size_t)(max + 1), sizeof(long *));
        long found = -1, nops = 0;
        if (!v || !trace)
                goto out;
        for (long d = 0; d <= max && found < 0; d++) {
                for (long k = -d; k <= d; k += 2) {
                        long x = (k == -d || (k != d && v[off + k - 1] < v[off + k + 1]))
                                     ? v[off + k + 1]
                                     : v[off + k - 1] + 1;
                        long y = x - k;
                        while (x < n && y < m && eq(&a[x], &b[y]))
                                x++, y++;
                        v[off + k] = x;
                        if (x >= n && y >= m) {
                                found = d;
                                break;
                        }
                }
                trace[d] = malloc((size_t)(2 * d + 1) * sizeof(long));
                if (!trace[d]) {
                        found = -2;
                        break;
                }
                memcpy(trace[d], v + off - d, (size_t)(2 * d + 1) * sizeof(long));
        }
        if (found == -2) {
                nops = -1;
        } else if (found < 0) { /* too far apart for a minimal script */
                for (long i = 0; i < n; i++)
                        ops[nops++] = '-';
                for (long i = 0; i < m; i++)
                        ops[nops++] = '+';
        } else { /* backtrack, writing ops from the end */
                long x = n, y = m, w = n + m;
                char *rev = ops;
                for (long d = found; d > 0; d--) {
                        const long *vp = trace[d - 1]; /* k in [-(d-1), d-1] at vp[k + d - 1] */
                        long k = x - y, pk;
                        if (k == -d || (k != d && vp[k - 1 + d - 1] < vp[k + 1 + d - 1]))
                                pk = k + 1;
                        else
                                pk = k - 1;
                        long px = vp[pk + d - 1], py = px - pk;
                        while (x > px && y > py) {
                                rev[--w] = '=';
                                x--, y--;
                        }
                        if (x == px) {
                                rev[--w] = '+';
                                y--;
                        } else {
                                rev[--w] = '-';
                                x--;
                        }
                }
                while (x > 0 && y > 0) {
                        rev[--w] = '=';
                        x--, y--;
                }
                nops = n + m - w;
                memmove(ops, ops + w, (size_t)nops);
        }
out:
        if (trace)
                for (long d = 0; d <= max; d++)
                        free(trace[d]);
        free(trace);
        free(v);
        return (!v || !trace) ? -1 : nops;
}

struct buf {
        char *p;
        size_t len, cap, max;
        int over;
};

static void put(struct buf *b, const char *s, size_t n)
{
        if (b->over)
                return;
        if (b->len + n + 1 > b->max) {
                b->over = 1;
                return;
        }
        if (b->len + n + 1 > b->cap) {
                size_t c = b->cap ? b->cap : 4096;
                while (c < b->len + n + 1)
                        c *= 2;
                char *q = realloc(b->p, c);
                if (!q) {
                        b->over = 2;
                        return;
                }
                b->p = q;
                b->cap = c;
        }
        memcpy(b->p + b->len, s, n);
        b->len += n;
        b->p[b->len] = 0;
}

static void put_line(struct buf *o, char tag, const struct line *l)
{
        put(o, &tag, 1);
        put(o, l->p, l->len);
        put(o, "\n", 1);
        if (!l->nl)
                put(o, "\\ No newline at end of file\n", 28);
}

static void range(char *s, size_t cap, long start, long len)
{
        if (len == 1)
                snprintf(s, cap, "%ld", start + 1);
        else
                snprintf(s, cap, "%ld,%ld", len ? start + 1 : start, len);
}

int cove_linediff(const char *a, size_t alen, const char *b, size_t blen, const char *name_a,
                  const char *name_b, unsigned context, size_t max_out, char **out, size_t *outlen,
                  struct cove_err *err)
{
        *out = NULL;
        *outlen = 0;
        size_t na = 0, nb = 0;
        struct line *la = split(a, alen, &na), *lb = split(b, blen, &nb);
        char *ops = malloc(na + nb + 1);
        struct buf o = {.max = max_out};
        int rc = -1;
        if (!la || !lb || !ops) {
                cove_err_set(err, ENOMEM, "diff");
                goto out;
        }
        size_t pre = 0, suf = 0;
        while (pre < na && pre < nb && eq(&la[pre], &lb[pre]))
                pre++;
        while (suf < na - pre && suf < nb - pre && eq(&la[na - 1 - suf], &lb[nb - 1 - suf]))
                suf++;
        memset(ops, '=', pre);
        long mid =
            myers(la + pre, (long)(na - pre - suf), lb + pre, (long)(nb - pre - suf), ops + pre);
        if (mid < 0) {
                cove_err_set(err, ENOMEM, "diff");
                goto out;
        }
        size_t nops = pre + (size_t)mid;
        memset(ops + nops, '=', suf);
        nops += suf;
        if (pre == na && pre == nb) { /* equal */
                *out = strdup("");
                rc = *out ? 0 : cove_err_set(err, ENOMEM, "diff");
                goto out;
        }
        put(&o, "--- ", 4);
        put(&o, name_a, strlen(name_a));
        put(&o, "\n+++ ", 5);
        put(&o, name_b, strlen(name_b));
        put(&o, "\n", 1);
        /* ai/bi: line numbers at op index p, advanced as hunks are cut */
        size_t p = 0, ai = 0, bi = 0, i = 0;
        while (i < nops && !o.over) {
                if (ops[i] == '=') {
                        i++;
                        continue;
                }
                size_t start = i > p + context ? i - context : p, end = i + 1, j = end;
                while (j < nops) {
                        if (ops[j] != '=') {
                                end = ++j;
                                continue;
                        }
                        size_t r = j;
                        while (r < nops && ops[r] == '=')
                                r++;
                        if (r < nops && r - j <= 2 * (size_t)context) {
                                j = r;
                                continue;
                        }
                        break;
                }
                size_t hend = end + context < nops ? end + context : nops;
                for (; p < start; p++) {
                        ai += ops[p] != '+';
                        bi += ops[p] != '-';
                }
                long ac = 0, bc = 0;
                for (size_t q = start; q < hend; q++) {
                        ac += ops[q] != '+';
                        bc += ops[q] != '-';
                }
                char h[96], ra[40], rb[40];
                range(ra, sizeof(ra), (long)ai, ac);
                range(rb, sizeof(rb), (long)bi, bc);
                int hn = snprintf(h, sizeof(h), "@@ -%s +%s @@\n", ra, rb);
                put(&o, h, (size_t)hn);
                for (; p < hend; p++) {
                        if (ops[p] == '=')
                                put_line(&o, ' ', &la[ai]);
                        else if (ops[p] == '-')
                                put_line(&o, '-', &la[ai]);
                        else
                                put_line(&o, '+', &lb[bi]);
                        ai += ops[p] != '+';
                        bi += ops[p] != '-';
                }
                i = hend;
        }
        if (o.over == 2) {
                cove_err_set(err, ENOMEM, "diff");
                goto out;
        }
        if (o.over) {
                cove_err_setk(err, COVE_E_LIMIT, 0, "the diff is larger than %zu bytes", max_out);
                goto out;
        }
        *out = o.p;
        *outlen = o.len;
        o.p = NULL;
        rc = 0;
out:
        free(o.p);
        free(ops);
        free(la);
        free(lb);
        return rc;
}
