/* Bounded XML reader for S3 answers (store/s3xml.h): one pass over the caller's buffer,
 * a fixed stack of element names, text decoded into a fixed buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/s3xml.h"

struct xw {
        const char *p, *end;
        char path[COVE_XML_MAX_PATH + 1];
        size_t plen;
        size_t start[COVE_XML_MAX_DEPTH]; /* offset of each open element's name in path */
        size_t qlen[COVE_XML_MAX_DEPTH];  /* length of its qualified name in the input */
        const char *qname[COVE_XML_MAX_DEPTH];
        int depth;
        char text[COVE_XML_MAX_TEXT + 1];
        size_t tlen;
};

#define BAD(w, what) cove_err_set(err, 0, "malformed XML: %s", what)

static int is_space(char c)
{
        return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static int name_char(char c)
{
        return !is_space(c) && c != '/' && c != '>' && c != '<' && c != '=' && c != '"' &&
               c != '\'' && c != '&' && c != '\0';
}

static int text_add(struct xw *w, const char *s, size_t n, struct cove_err *err)
{
        if (w->depth == 0) { /* outside the root only whitespace is allowed */
                for (size_t i = 0; i < n; i++)
                        if (!is_space(s[i]))
                                return BAD(w, "text outside the root element");
                return 0;
        }
        if (w->tlen + n > COVE_XML_MAX_TEXT)
                return BAD(w, "text too long");
        memcpy(w->text + w->tlen, s, n);
        w->tlen += n;
        return 0;
}

static int utf8_put(struct xw *w, unsigned long cp, struct cove_err *err)
{
        char b[4];
        size_t n;
        if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return BAD(w, "bad character reference");
        if (cp < 0x80) {
                b[0] = (char)cp;
                n = 1;
        } else if (cp < 0x800) {
                b[0] = (char)(0xC0 | (cp >> 6));
                b[1] = (char)(0x80 | (cp & 0x3F));
                n = 2;
        } else if (cp < 0x10000) {
                b[0] = (char)(0xE0 | (cp >> 12));
                b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                b[2] = (char)(0x80 | (cp & 0x3F));
                n = 3;
        } else {
                b[0] = (char)(0xF0 | (cp >> 18));
                b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
                b[3] = (char)(0x80 | (cp & 0x3F));
                n = 4;
        }
        return text_add(w, b, n, err);
}

/* At '&': decode one reference into the text. */
static int entity(struct xw *w, struct cove_err *err)
{
        const char *semi =
            memchr(w->p, ';', (size_t)(w->end - w->p) < 12 ? (size_t)(w->end - w->p) : 12);
        if (!semi)
                return BAD(w, "unterminated reference");
        const char *s = w->p + 1;
        size_t n = (size_t)(semi - s);
        static const struct {
                const char *name;
                char c;
        } named[] = {{"lt", '<'}, {"gt", '>'}, {"amp", '&'}, {"quot", '"'}, {"apos", '\''}};
        int rc = -2;
        for (size_t i = 0; i < sizeof(named) / sizeof(*named); i++)
                if (strlen(named[i].name) == n && !memcmp(s, named[i].name, n))
                        rc = text_add(w, &named[i].c, 1, err);
        if (rc == -2) {
                if (n < 2 || s[0] != '#')
                        return BAD(w, "unknown entity");
                int hex = s[1] == 'x';
                const char *d = s + 1 + hex;
                if (d >= semi)
                        return BAD(w, "bad character reference");
                unsigned long cp = 0;
                for (; d < semi; d++) {
                        int v = *d >= '0' && *d <= '9'          ? *d - '0'
                                : hex && *d >= 'a' && *d <= 'f' ? *d - 'a' + 10
                                : hex && *d >= 'A' && *d <= 'F' ? *d - 'A' + 10
                                                                : -1;
                        if (v < 0)
                                return BAD(w, "bad character reference");
                        cp = cp * (hex ? 16 : 10) + (unsigned long)v;
                        if (cp > 0x10FFFF)
                                return BAD(w, "bad character reference");
                }
                rc = utf8_put(w, cp, err);
        }
        w->p = semi + 1;
        return rc;
}

/* Skip past the first occurrence of the terminator; error if absent. */
static int skip_past(struct xw *w, const char *term, struct cove_err *err)
{
        size_t tl = strlen(term);
        for (const char *q = w->p; q + tl <= w->end; q++)
                if (!memcmp(q, term, tl)) {
                        w->p = q + tl;
                        return 0;
                }
        return BAD(w, "unterminated markup");
}

static int open_elem(struct xw *w, const char *q, size_t ql, struct cove_err *err)
{
        if (w->depth >= COVE_XML_MAX_DEPTH)
                return BAD(w, "nested too deep");
        const char *colon = memchr(q, ':', ql);
        const char *local = colon ? colon + 1 : q;
        size_t ll = ql - (size_t)(local - q);
        if (ll == 0)
                return BAD(w, "empty element name");
        size_t need = w->plen + (w->depth ? 1 : 0) + ll;
        if (need > COVE_XML_MAX_PATH)
                return BAD(w, "element path too long");
        if (w->depth)
                w->path[w->plen++] = '/';
        w->start[w->depth] = w->plen;
        memcpy(w->path + w->plen, local, ll);
        w->plen += ll;
        w->path[w->plen] = '\0';
        w->qname[w->depth] = q;
        w->qlen[w->depth] = ql;
        w->depth++;
        w->tlen = 0;
        return 0;
}

static int close_elem(struct xw *w, cove_xml_cb cb, void *arg, struct cove_err *err)
{
        w->text[w->tlen] = '\0';
        if (cb && cb(w->path, w->text, w->tlen, arg, err) < 0)
                return -1;
        w->depth--;
        w->plen = w->start[w->depth] ? w->start[w->depth] - 1 : 0;
        w->path[w->plen] = '\0';
        w->tlen = 0;
        return 0;
}

int cove_xml_walk(const char *buf, size_t len, cove_xml_cb cb, void *arg, struct cove_err *err)
{
        struct xw w;
        w.p = buf;
        w.end = buf + len;
        w.plen = 0;
        w.path[0] = '\0';
        w.depth = 0;
        w.tlen = 0;
        int roots = 0;
        /* a UTF-8 byte order mark may precede the document */
        if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3))
                w.p += 3;
        while (w.p < w.end) {
                char c = *w.p;
                if (c == '\0')
                        return BAD(&w, "NUL byte");
                if (c == '&') {
                        if (w.depth == 0)
                                return BAD(&w, "text outside the root element");
                        if (entity(&w, err) < 0)
                                return -1;
                        continue;
                }
                if (c != '<') {
                        const char *q = w.p;
                        while (q < w.end && *q != '<' && *q != '&' && *q != '\0')
                                q++;
                        if (text_add(&w, w.p, (size_t)(q - w.p), err) < 0)
                                return -1;
                        w.p = q;
                        continue;
                }
                size_t rest = (size_t)(w.end - w.p);
                if (rest >= 4 && !memcmp(w.p, "<!--", 4)) {
                        w.p += 4;
                        if (skip_past(&w, "-->", err) < 0)
                                return -1;
                        continue;
                }
                if (rest >= 2 && w.p[1] == '?') {
                        w.p += 2;
                        if (skip_past(&w, "?>", err) < 0)
                                return -1;
                        continue;
                }
                if (rest >= 9 && !memcmp(w.p, "<![CDATA[", 9)) {
                        if (w.depth == 0)
                                return BAD(&w, "CDATA outside the root element");
                        const char *s = w.p + 9;
                        w.p = s;
                        if (skip_past(&w, "]]>", err) < 0)
                                return -1;
                        if (text_add(&w, s, (size_t)(w.p - 3 - s), err) < 0)
                                return -1;
                        continue;
                }
                if (rest >= 2 && w.p[1] == '!')
                        return BAD(&w, "DOCTYPE or declaration not allowed");
                int closing = rest >= 2 && w.p[1] == '/';
                const char *q = w.p + 1 + closing, *qe = q;
                while (qe < w.end && name_char(*qe))
                        qe++;
                size_t ql = (size_t)(qe - q);
                if (ql == 0)
                        return BAD(&w, "missing element name");
                if (closing) {
                        const char *e = qe;
                        while (e < w.end && is_space(*e))
                                e++;
                        if (e >= w.end || *e != '>')
                                return BAD(&w, "bad end tag");
                        if (w.depth == 0 || w.qlen[w.depth - 1] != ql ||
                            memcmp(w.qname[w.depth - 1], q, ql))
                                return BAD(&w, "mismatched end tag");
                        w.p = e + 1;
                        if (close_elem(&w, cb, arg, err) < 0)
                                return -1;
                        continue;
                }
                if (w.depth == 0 && roots++)
                        return BAD(&w, "more than one root element");
                /* attributes: name="value" or name='value', skipped */
                const char *e = qe;
                int empty = 0;
                for (;;) {
                        while (e < w.end && is_space(*e))
                                e++;
                        if (e >= w.end)
                                return BAD(&w, "unterminated start tag");
                        if (*e == '>')
                                break;
                        if (*e == '/') {
                                if (e + 1 >= w.end || e[1] != '>')
                                        return BAD(&w, "bad start tag");
                                empty = 1;
                                e++;
                                break;
                        }
                        const char *an = e;
                        while (e < w.end && name_char(*e))
                                e++;
                        if (e == an)
                                return BAD(&w, "bad attribute");
                        while (e < w.end && is_space(*e))
                                e++;
                        if (e >= w.end || *e != '=')
                                return BAD(&w, "attribute without value");
                        e++;
                        while (e < w.end && is_space(*e))
                                e++;
                        if (e >= w.end || (*e != '"' && *e != '\''))
                                return BAD(&w, "unquoted attribute");
                        char quote = *e++;
                        while (e < w.end && *e != quote && *e != '<')
                                e++;
                        if (e >= w.end || *e != quote)
                                return BAD(&w, "unterminated attribute");
                        e++;
                }
                w.p = e + 1;
                if (open_elem(&w, q, ql, err) < 0)
                        return -1;
                if (empty && close_elem(&w, cb, arg, err) < 0)
                        return -1;
        }
        if (w.depth)
                return BAD(&w, "unclosed element");
        if (!roots)
                return BAD(&w, "no root element");
        return 0;
}

/* ---- timestamps ---- */

static int digits(const char *s, int n, int *out)
{
        int v = 0;
        for (int i = 0; i < n; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return -1;
                v = v * 10 + (s[i] - '0');
        }
        *out = v;
        return 0;
}

static int64_t tm_ms(int y, int mo, int d, int h, int mi, int s, int ms)
{
        if (y < 1970 || y > 9999 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 ||
            s > 60)
                return -1;
        struct tm tm = {.tm_year = y - 1900,
                        .tm_mon = mo - 1,
                        .tm_mday = d,
                        .tm_hour = h,
                        .tm_min = mi,
                        .tm_sec = s};
        time_t t = timegm(&tm);
        if (t < 0)
                return -1;
        return (int64_t)t * 1000 + ms;
}

int64_t cove_s3_parse_iso8601(const char *s)
{
        int y, mo, d, h, mi, sec, ms = 0;
        if (strlen(s) < 20 || digits(s, 4, &y) || s[4] != '-' || digits(s + 5, 2, &mo) ||
            s[7] != '-' || digits(s + 8, 2, &d) || s[10] != 'T' || digits(s + 11, 2, &h) ||
            s[13] != ':' || digits(s + 14, 2, &mi) || s[16] != ':' || digits(s + 17, 2, &sec))
                return -1;
        const char *p = s + 19;
        if (*p == '.') {
                p++;
                int n = 0, scale = 100;
                while (*p >= '0' && *p <= '9' && n < 9) {
                        ms += (*p - '0') * scale;
                        scale /= 10;
                        p++;
                        n++;
                }
                if (n == 0)
                        return -1;
        }
        if (strcmp(p, "Z"))
                return -1;
        return tm_ms(y, mo, d, h, mi, sec, ms);
}

int64_t cove_s3_parse_http_date(const char *s)
{
        static const char *mons[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        int d, y, h, mi, sec, mo = -1;
        /* "Tue, 01 Dec 2026 10:11:29 GMT" */
        if (strlen(s) != 29 || s[3] != ',' || s[4] != ' ' || digits(s + 5, 2, &d) || s[7] != ' ' ||
            s[11] != ' ' || digits(s + 12, 4, &y) || s[16] != ' ' || digits(s + 17, 2, &h) ||
            s[19] != ':' || digits(s + 20, 2, &mi) || s[22] != ':' || digits(s + 23, 2, &sec) ||
            strcmp(s + 25, " GMT"))
                return -1;
        for (int i = 0; i < 12; i++)
                if (!memcmp(s + 8, mons[i], 3))
                        mo = i + 1;
        if (mo < 0)
                return -1;
        return tm_ms(y, mo, d, h, mi, sec, 0);
}

/* ---- ListObjectsV2 ---- */

struct list_ctx {
        struct cove_s3_list_page *pg;
        cove_s3_entry_cb cb;
        void *arg;
        int root_ok;
        char key[1025];
        int have_key, have_size, have_mtime;
        uint64_t size;
        int64_t mtime;
        int have_token;
};

static int parse_u64(const char *s, uint64_t *out)
{
        if (!*s || strlen(s) > 19)
                return -1;
        uint64_t v = 0;
        for (; *s; s++) {
                if (*s < '0' || *s > '9')
                        return -1;
                v = v * 10 + (uint64_t)(*s - '0');
        }
        *out = v;
        return 0;
}

static int list_cb(const char *path, const char *text, size_t len, void *arg, struct cove_err *err)
{
        struct list_ctx *c = arg;
        if (!c->root_ok) {
                /* the first end tag we see is the innermost of the first branch: check the
                 * root's name from the path instead */
                if (strncmp(path, "ListBucketResult", 16) || (path[16] && path[16] != '/'))
                        return cove_err_set(err, 0, "not a ListBucketResult");
                c->root_ok = 1;
        }
        if (!strcmp(path, "ListBucketResult/Contents/Key")) {
                if (len == 0 || len > 1024 || strlen(text) != len)
                        return cove_err_set(err, 0, "listing: bad Key");
                memcpy(c->key, text, len + 1);
                c->have_key = 1;
        } else if (!strcmp(path, "ListBucketResult/Contents/Size")) {
                if (parse_u64(text, &c->size) < 0)
                        return cove_err_set(err, 0, "listing: bad Size");
                c->have_size = 1;
        } else if (!strcmp(path, "ListBucketResult/Contents/LastModified")) {
                if ((c->mtime = cove_s3_parse_iso8601(text)) < 0)
                        return cove_err_set(err, 0, "listing: bad LastModified");
                c->have_mtime = 1;
        } else if (!strcmp(path, "ListBucketResult/Contents")) {
                if (!c->have_key || !c->have_size || !c->have_mtime)
                        return cove_err_set(err, 0,
                                            "listing: entry without Key, Size or "
                                            "LastModified");
                c->have_key = c->have_size = c->have_mtime = 0;
                c->pg->keys++;
                if (c->cb && c->cb(c->key, c->size, c->mtime, c->arg, err) < 0)
                        return -1;
        } else if (!strcmp(path, "ListBucketResult/IsTruncated")) {
                if (!strcmp(text, "true"))
                        c->pg->truncated = 1;
                else if (!strcmp(text, "false"))
                        c->pg->truncated = 0;
                else
                        return cove_err_set(err, 0, "listing: bad IsTruncated");
        } else if (!strcmp(path, "ListBucketResult/NextContinuationToken")) {
                if (len == 0 || len >= sizeof(c->pg->next_token) || strlen(text) != len)
                        return cove_err_set(err, 0, "listing: bad NextContinuationToken");
                memcpy(c->pg->next_token, text, len + 1);
                c->have_token = 1;
        }
        return 0;
}

int cove_s3_parse_list(const char *xml, size_t len, struct cove_s3_list_page *pg,
                       cove_s3_entry_cb cb, void *arg, struct cove_err *err)
{
        memset(pg, 0, sizeof(*pg));
        struct list_ctx c = {.pg = pg, .cb = cb, .arg = arg};
        if (cove_xml_walk(xml, len, list_cb, &c, err) < 0)
                return -1;
        if (!c.root_ok)
                return cove_err_set(err, 0, "not a ListBucketResult");
        if (pg->truncated && !c.have_token)
                return cove_err_set(err, 0, "listing: truncated without NextContinuationToken");
        return 0;
}

/* ---- Error ---- */

struct err_ctx {
        char *code;
        int root; /* 1 Error, 0 other */
        int seen;
};

static int err_cb(const char *path, const char *text, size_t len, void *arg, struct cove_err *err)
{
        (void)err;
        struct err_ctx *c = arg;
        if (!c->seen) {
                c->seen = 1;
                c->root = !strncmp(path, "Error", 5) && (path[5] == '\0' || path[5] == '/');
        }
        if (c->root && !strcmp(path, "Error/Code")) {
                size_t n = len < 63 ? len : 63;
                int ok = n > 0;
                for (size_t i = 0; i < n && ok; i++)
                        ok = text[i] > 0x20 && text[i] < 0x7f;
                if (ok) {
                        memcpy(c->code, text, n);
                        c->code[n] = '\0';
                } else {
                        strcpy(c->code, "?");
                }
        }
        return 0;
}

int cove_s3_parse_error(const char *xml, size_t len, char code[64], struct cove_err *err)
{
        code[0] = '\0';
        struct err_ctx c = {.code = code};
        if (cove_xml_walk(xml, len, err_cb, &c, err) < 0)
                return -1;
        return c.root;
}
