/* Image layers unpacked by hand (tarx.h): a pull decompressor (gzip, zstd, plain) that hashes
 * what it reads, a ustar/GNU/PAX header parser, and entry creation below a directory fd
 * with O_NOFOLLOW at every step; then whiteout-aware merging of layers by hard links. */
#include "control/tarx.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <zlib.h>
#include <zstd.h>

#include "util/cleanup.h"
#include "util/util.h"

#define IN_BUF (128 * 1024)
#define PATH_LEN_MAX 4096
#define PAX_MAX (1024 * 1024)
#define DEPTH_MAX 256
#define TICK_EVERY (8ULL << 20)

enum { K_UNKNOWN, K_PLAIN, K_GZIP, K_ZSTD };

struct tsrc {
        int fd;                 /* -1: memory */
        const unsigned char *m; /* memory source */
        size_t mlen, moff;
        EVP_MD_CTX *blob, *diff;
        int kind;
        z_stream z;
        int z_init;
        ZSTD_DStream *zs;
        unsigned char *in;
        size_t in_len, in_off;
        int in_eof;
        int z_end; /* a gzip member ended: reset if more input follows */
        uint64_t out_total;
        struct cove_tarx_budget *budget;
        cove_tarx_tick_fn tick;
        void *tick_arg;
        uint64_t next_tick;
};

/* Refill the raw input buffer; 0 on EOF, -1 on error. */
static ssize_t raw_fill(struct tsrc *s, struct cove_err *err)
{
        if (s->in_eof)
                return 0;
        ssize_t n;
        if (s->fd < 0) {
                size_t left = s->mlen - s->moff;
                n = (ssize_t)(left < IN_BUF ? left : IN_BUF);
                memcpy(s->in, s->m + s->moff, (size_t)n);
                s->moff += (size_t)n;
        } else {
                do
                        n = read(s->fd, s->in, IN_BUF);
                while (n < 0 && errno == EINTR);
                if (n < 0)
                        return cove_err_set(err, errno, "read blob");
        }
        if (n == 0) {
                s->in_eof = 1;
                return 0;
        }
        if (s->blob)
                EVP_DigestUpdate(s->blob, s->in, (size_t)n);
        s->in_len = (size_t)n;
        s->in_off = 0;
        return n;
}

static int count_out(struct tsrc *s, size_t n, struct cove_err *err)
{
        if (s->budget) {
                if (n > s->budget->bytes_left)
                        return cove_err_setk(err, COVE_E_LIMIT, EFBIG,
                                             "larger than the size limit once unpacked");
                s->budget->bytes_left -= n;
        }
        s->out_total += n;
        if (s->tick && s->out_total >= s->next_tick) {
                s->next_tick = s->out_total + TICK_EVERY;
                if (s->tick(s->tick_arg, s->out_total))
                        return cove_err_setk(err, COVE_E_CONFLICT, ECANCELED, "cancelled");
        }
        return 0;
}

/* Read up to max decompressed bytes: >0 count, 0 end of stream, -1 error. */
static ssize_t src_read(struct tsrc *s, unsigned char *buf, size_t max, struct cove_err *err)
{
        for (;;) {
                if (s->in_off == s->in_len) {
                        ssize_t r = raw_fill(s, err);
                        if (r < 0)
                                return -1;
                        if (r == 0 && s->kind != K_ZSTD && s->kind != K_GZIP)
                                return 0;
                }
                if (s->kind == K_UNKNOWN) {
                        size_t have = s->in_len - s->in_off;
                        const unsigned char *p = s->in + s->in_off;
                        if (have >= 2 && p[0] == 0x1f && p[1] == 0x8b)
                                s->kind = K_GZIP;
                        else if (have >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f &&
                                 p[3] == 0xfd)
                                s->kind = K_ZSTD;
                        else
                                s->kind = K_PLAIN;
                        if (s->kind == K_GZIP) {
                                memset(&s->z, 0, sizeof s->z);
                                if (inflateInit2(&s->z, 15 + 16) != Z_OK)
                                        return cove_err_set(err, ENOMEM, "gzip");
                                s->z_init = 1;
                        } else if (s->kind == K_ZSTD) {
                                s->zs = ZSTD_createDStream();
                                if (!s->zs || ZSTD_isError(ZSTD_initDStream(s->zs)))
                                        return cove_err_set(err, ENOMEM, "zstd");
                        }
                }
                size_t have = s->in_len - s->in_off;
                size_t produced = 0;
                if (s->kind == K_PLAIN) {
                        if (have == 0)
                                return 0;
                        produced = have < max ? have : max;
                        memcpy(buf, s->in + s->in_off, produced);
                        s->in_off += produced;
                } else if (s->kind == K_GZIP) {
                        if (have == 0 && s->in_eof) {
                                if (!s->z_end && s->z.total_in > 0)
                                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                             "gzip stream truncated");
                                return 0;
                        }
                        if (s->z_end) {
                                if (have == 0)
                                        continue;
                                inflateReset(&s->z); /* another member follows */
                                s->z_end = 0;
                        }
                        s->z.next_in = s->in + s->in_off;
                        s->z.avail_in = (uInt)have;
                        s->z.next_out = buf;
                        s->z.avail_out = (uInt)max;
                        int zr = inflate(&s->z, Z_NO_FLUSH);
                        s->in_off = s->in_len - s->z.avail_in;
                        produced = max - s->z.avail_out;
                        if (zr == Z_STREAM_END)
                                s->z_end = 1;
                        else if (zr != Z_OK && zr != Z_BUF_ERROR)
                                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                     "gzip: corrupt data (%s)",
                                                     s->z.msg ? s->z.msg : "inflate");
                        if (zr == Z_BUF_ERROR && produced == 0 && have > 0)
                                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                     "gzip: corrupt data");
                } else {
                        if (have == 0 && s->in_eof)
                                return 0;
                        ZSTD_inBuffer ib = {s->in + s->in_off, have, 0};
                        ZSTD_outBuffer ob = {buf, max, 0};
                        size_t zr = ZSTD_decompressStream(s->zs, &ob, &ib);
                        if (ZSTD_isError(zr))
                                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "zstd: %s",
                                                     ZSTD_getErrorName(zr));
                        s->in_off += ib.pos;
                        produced = ob.pos;
                }
                if (produced == 0)
                        continue;
                if (s->diff)
                        EVP_DigestUpdate(s->diff, buf, produced);
                if (count_out(s, produced, err) < 0)
                        return -1;
                return (ssize_t)produced;
        }
}

/* Exactly n bytes (an entry's data or a header); a short stream is an error. */
static int src_full(struct tsrc *s, unsigned char *buf, size_t n, struct cove_err *err)
{
        size_t got = 0;
        while (got < n) {
                ssize_t r = src_read(s, buf + got, n - got, err);
                if (r < 0)
                        return -1;
                if (r == 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "tar stream truncated");
                got += (size_t)r;
        }
        return 0;
}

static int src_skip(struct tsrc *s, uint64_t n, struct cove_err *err)
{
        unsigned char buf[16384];
        while (n > 0) {
                size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
                if (src_full(s, buf, k, err) < 0)
                        return -1;
                n -= k;
        }
        return 0;
}

/* ---- tar headers ------------------------------------------------------------------- */

/* File capabilities: struct vfs_cap_data, revision 2 (magic_etc, then permitted and
 * inheritable for two 32-bit words: 20 bytes) or 3 (a rootid after them: 24). */
#define FCAP_LEN 20
#define FCAP_REV_MASK 0xff000000u
#define FCAP_REV2 0x02000000u
#define FCAP_REV3 0x03000000u
#define FCAP_FLAGS 0x000001u /* VFS_CAP_FLAGS_EFFECTIVE, the only flag */

struct entry {
        char path[PATH_LEN_MAX + 1];
        char link[PATH_LEN_MAX + 1];
        char type;
        uint64_t size;
        uint64_t mode, uid, gid, devmajor, devminor;
        int64_t mtime;
        unsigned char fcap[FCAP_LEN]; /* security.capability (v2) of a regular file */
        int has_fcap;
};

/* Printable copy of a hostile name for messages. */
static const char *shown(const char *p, char *out, size_t cap)
{
        size_t o = 0;
        for (; *p && o + 4 < cap; p++)
                out[o++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
        if (*p && o + 4 <= cap) {
                memcpy(out + o, "...", 3);
                o += 3;
        }
        out[o] = '\0';
        return out;
}

static int num_field(const unsigned char *f, size_t n, uint64_t *out)
{
        uint64_t v = 0;
        if (f[0] & 0x80) { /* base-256 (GNU): positive values only */
                if (f[0] & 0x40)
                        return -1;
                v = f[0] & 0x3f;
                for (size_t i = 1; i < n; i++) {
                        if (v >> 55)
                                return -1;
                        v = (v << 8) | f[i];
                }
                *out = v;
                return 0;
        }
        size_t i = 0;
        while (i < n && (f[i] == ' ' || f[i] == '\0'))
                i++;
        int digits = 0;
        for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
                if (v >> 60)
                        return -1;
                v = v * 8 + (uint64_t)(f[i] - '0');
        }
        for (; i < n; i++)
                if (f[i] != ' ' && f[i] != '\0')
                        return -1;
        *out = v;
        return 0;
}

static int is_zero_block(const unsigned char *h)
{
        for (int i = 0; i < 512; i++)
                if (h[i])
                        return 0;
        return 1;
}

static int header_sum_ok(const unsigned char *h)
{
        uint64_t want;
        if (num_field(h + 148, 8, &want) < 0)
                return 0;
        unsigned long u = 0;
        long sgn = 0;
        for (int i = 0; i < 512; i++) {
                unsigned char c = (i >= 148 && i < 156) ? ' ' : h[i];
                u += c;
                sgn += (signed char)c;
        }
        return want == u || (long)want == sgn;
}

static void field_str(char *out, const unsigned char *f, size_t n)
{
        size_t l = strnlen((const char *)f, n);
        memcpy(out, f, l);
        out[l] = '\0';
}

struct pax {
        char path[PATH_LEN_MAX + 1], link[PATH_LEN_MAX + 1];
        int has_path, has_link, has_size, has_uid, has_gid, has_mtime;
        uint64_t size, uid, gid;
        int64_t mtime;
        unsigned char fcap[FCAP_LEN];
        int has_fcap;
};

/* An image's SCHILY.xattr.security.capability value, as stored for the template: revision
 * 2 kept, revision 3 made revision 2 (its rootid named the image builder's namespace, not
 * ours: the sandbox's root is the file's root); anything else, or unknown flag or
 * capability bits beyond the kernel's two words, refused. 0 or -1. */
static int fcap_parse(const unsigned char *v, size_t vl, unsigned char out[FCAP_LEN])
{
        if (vl != 20 && vl != 24)
                return -1;
        uint32_t magic =
            (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 | (uint32_t)v[3] << 24;
        uint32_t rev = magic & FCAP_REV_MASK;
        if ((vl == 20 && rev != FCAP_REV2) || (vl == 24 && rev != FCAP_REV3) ||
            (magic & ~FCAP_REV_MASK & ~FCAP_FLAGS))
                return -1;
        memcpy(out, v, FCAP_LEN);
        out[3] = (unsigned char)(FCAP_REV2 >> 24);
        return 0;
}

static int pax_num(const char *v, size_t vl, uint64_t *out)
{
        uint64_t x = 0;
        size_t i = 0;
        if (vl == 0)
                return -1;
        for (; i < vl && v[i] >= '0' && v[i] <= '9'; i++) {
                if (x > (UINT64_MAX - 9) / 10)
                        return -1;
                x = x * 10 + (uint64_t)(v[i] - '0');
        }
        if (i == 0 || (i < vl && v[i] != '.'))
                return -1;
        *out = x;
        return 0;
}

/* Records "LEN key=value\n" (LEN counts the whole record). */
static int pax_parse(const char *d, size_t n, struct pax *p, struct cove_err *err)
{
        size_t off = 0;
        while (off < n) {
                size_t len = 0, i = off;
                while (i < n && d[i] >= '0' && d[i] <= '9' && i - off < 8)
                        len = len * 10 + (size_t)(d[i++] - '0');
                if (i >= n || d[i] != ' ' || len == 0 || len > n - off || d[off + len - 1] != '\n')
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "malformed PAX header");
                const char *k = d + i + 1, *end = d + off + len - 1;
                const char *eq = memchr(k, '=', (size_t)(end - k));
                if (!eq)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "malformed PAX record");
                size_t kl = (size_t)(eq - k), vl = (size_t)(end - eq - 1);
                const char *v = eq + 1;
                int bad = 0;
                if (kl == 4 && !memcmp(k, "path", 4)) {
                        bad = vl > PATH_LEN_MAX || memchr(v, '\0', vl);
                        if (!bad) {
                                memcpy(p->path, v, vl);
                                p->path[vl] = '\0';
                                p->has_path = 1;
                        }
                } else if (kl == 8 && !memcmp(k, "linkpath", 8)) {
                        bad = vl > PATH_LEN_MAX || memchr(v, '\0', vl);
                        if (!bad) {
                                memcpy(p->link, v, vl);
                                p->link[vl] = '\0';
                                p->has_link = 1;
                        }
                } else if (kl == 4 && !memcmp(k, "size", 4)) {
                        bad = pax_num(v, vl, &p->size) < 0;
                        p->has_size = !bad;
                } else if (kl == 3 && !memcmp(k, "uid", 3)) {
                        bad = pax_num(v, vl, &p->uid) < 0;
                        p->has_uid = !bad;
                } else if (kl == 3 && !memcmp(k, "gid", 3)) {
                        bad = pax_num(v, vl, &p->gid) < 0;
                        p->has_gid = !bad;
                } else if (kl == 5 && !memcmp(k, "mtime", 5)) {
                        uint64_t t;
                        if (pax_num(v, vl, &t) == 0 && t < (1ULL << 62)) {
                                p->mtime = (int64_t)t;
                                p->has_mtime = 1;
                        }
                } else if (kl == 32 && !memcmp(k, "SCHILY.xattr.security.capability", 32)) {
                        bad = fcap_parse((const unsigned char *)v, vl, p->fcap) < 0;
                        p->has_fcap = !bad;
                } /* other keys (other xattrs, atime, comments…) are not kept */
                if (bad)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "bad PAX value for %.*s",
                                             (int)(kl < 32 ? kl : 32), k);
                off += len;
        }
        return 0;
}

/* Read the next real entry (following PAX and GNU long-name records). 1 = end of archive,
 * 0 = entry, -1 = error. */
static int next_entry(struct tsrc *s, struct entry *e, struct cove_err *err)
{
        struct pax px;
        memset(&px, 0, sizeof px);
        int have_pax = 0;
        char longname[PATH_LEN_MAX + 1] = "", longlink[PATH_LEN_MAX + 1] = "";
        for (int guard = 0; guard < 16; guard++) {
                unsigned char h[512];
                ssize_t r = src_read(s, h, 512, err);
                if (r < 0)
                        return -1;
                if (r == 0)
                        return 1; /* no end blocks: tolerated, like GNU tar */
                if (r < 512 && src_full(s, h + r, 512 - (size_t)r, err) < 0)
                        return -1;
                if (is_zero_block(h))
                        return 1;
                if (!header_sum_ok(h))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "not a tar stream (bad header checksum)");
                uint64_t size;
                if (num_field(h + 124, 12, &size) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "bad size field");
                char t = (char)h[156];
                if (t == 'x' || t == 'g' || t == 'L' || t == 'K') {
                        if (size > PAX_MAX)
                                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                     "extended header of %llu bytes",
                                                     (unsigned long long)size);
                        cleanup_free unsigned char *d = malloc(size + 1);
                        if (!d)
                                return cove_err_set(err, ENOMEM, "tar");
                        if (src_full(s, d, size, err) < 0 ||
                            src_skip(s, (512 - size % 512) % 512, err) < 0)
                                return -1;
                        d[size] = '\0';
                        if (t == 'x') {
                                if (pax_parse((char *)d, size, &px, err) < 0)
                                        return -1;
                                have_pax = 1;
                        } else if (t == 'L' || t == 'K') {
                                size_t l = strnlen((char *)d, size);
                                if (l > PATH_LEN_MAX)
                                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                             "name longer than %d bytes",
                                                             PATH_LEN_MAX);
                                memcpy(t == 'L' ? longname : longlink, d, l + 1);
                        }
                        continue;
                }
                memset(e, 0, sizeof *e);
                e->type = t ? t : '0';
                e->size = size;
                char name[101], prefix[156];
                field_str(name, h, 100);
                field_str(e->link, h + 157, 100);
                if (!memcmp(h + 257, "ustar\0", 6) && h[345]) {
                        field_str(prefix, h + 345, 155);
                        snprintf(e->path, sizeof e->path, "%s/%s", prefix, name);
                } else {
                        snprintf(e->path, sizeof e->path, "%s", name);
                }
                if (num_field(h + 100, 8, &e->mode) < 0 || num_field(h + 108, 8, &e->uid) < 0 ||
                    num_field(h + 116, 8, &e->gid) < 0 || num_field(h + 329, 8, &e->devmajor) < 0 ||
                    num_field(h + 337, 8, &e->devminor) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "bad numeric field in the header of \"%s\"",
                                             shown(e->path, name, sizeof name));
                uint64_t mt = 0;
                num_field(h + 136, 12, &mt);
                e->mtime = (int64_t)(mt & ((1ULL << 62) - 1));
                if (longname[0])
                        snprintf(e->path, sizeof e->path, "%s", longname);
                if (longlink[0])
                        snprintf(e->link, sizeof e->link, "%s", longlink);
                if (have_pax) {
                        if (px.has_path)
                                snprintf(e->path, sizeof e->path, "%s", px.path);
                        if (px.has_link)
                                snprintf(e->link, sizeof e->link, "%s", px.link);
                        if (px.has_size)
                                e->size = px.size;
                        if (px.has_uid)
                                e->uid = px.uid;
                        if (px.has_gid)
                                e->gid = px.gid;
                        if (px.has_mtime)
                                e->mtime = px.mtime;
                        if (px.has_fcap) {
                                memcpy(e->fcap, px.fcap, FCAP_LEN);
                                e->has_fcap = 1;
                        }
                }
                if (e->uid > 0xfffffffeULL || e->gid > 0xfffffffeULL)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "\"%s\": owner out of range",
                                             shown(e->path, name, sizeof name));
                return 0;
        }
        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "too many extended headers in a row");
}

/* ---- paths ------------------------------------------------------------------------- */

/* Normalise a tar path: strip "./" and duplicate slashes; refuse absolute paths, "..", and
 * empty names. out receives the cleaned relative path; "" means the layer root itself. */
static int clean_path(const char *in, char *out, size_t cap, const char **why)
{
        if (in[0] == '/') {
                *why = "absolute path";
                return -1;
        }
        size_t o = 0;
        const char *p = in;
        int comps = 0;
        while (*p) {
                while (*p == '/')
                        p++;
                if (!*p)
                        break;
                const char *q = strchr(p, '/');
                size_t l = q ? (size_t)(q - p) : strlen(p);
                if (l == 1 && p[0] == '.') {
                        p += l;
                        continue;
                }
                if (l == 2 && p[0] == '.' && p[1] == '.') {
                        *why = "\"..\" in the path";
                        return -1;
                }
                if (++comps > DEPTH_MAX) {
                        *why = "path too deep";
                        return -1;
                }
                if (o + l + 2 > cap) {
                        *why = "path too long";
                        return -1;
                }
                if (o)
                        out[o++] = '/';
                memcpy(out + o, p, l);
                o += l;
                p += l;
        }
        out[o] = '\0';
        return 0;
}

/* Open the parent directory of rel (clean) below root, creating missing directories (0755,
 * root) when create; *leaf points into rel. Never follows a symlink: a component that is
 * not a directory fails with ENOTDIR. Returns an fd or -1 with errno. */
static int open_parent(int root, const char *rel, int create, const char **leaf)
{
        int cur = dup(root);
        if (cur < 0)
                return -1;
        const char *p = rel;
        for (;;) {
                const char *slash = strchr(p, '/');
                if (!slash) {
                        *leaf = p;
                        return cur;
                }
                char comp[256];
                size_t l = (size_t)(slash - p);
                if (l >= sizeof comp) {
                        close(cur);
                        errno = ENAMETOOLONG;
                        return -1;
                }
                memcpy(comp, p, l);
                comp[l] = '\0';
                int nfd = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (nfd < 0 && errno == ENOENT && create) {
                        if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST) {
                                int e = errno;
                                close(cur);
                                errno = e;
                                return -1;
                        }
                        nfd = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                }
                int e = errno;
                close(cur);
                if (nfd < 0) {
                        errno = (e == ELOOP) ? ENOTDIR : e;
                        return -1;
                }
                cur = nfd;
                p = slash + 1;
        }
}

static int rm_at(int at, const char *name, int depth)
{
        struct stat st;
        if (depth > DEPTH_MAX + 8) {
                errno = ELOOP;
                return -1;
        }
        if (fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -1;
        if (!S_ISDIR(st.st_mode))
                return unlinkat(at, name, 0) < 0 && errno != ENOENT ? -1 : 0;
        int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -1;
        DIR *d = fdopendir(fd);
        if (!d) {
                close(fd);
                return -1;
        }
        struct dirent *de;
        int rc = 0;
        while ((de = readdir(d))) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                if (rm_at(dirfd(d), de->d_name, depth + 1) < 0)
                        rc = -1;
        }
        closedir(d);
        if (rc < 0)
                return -1;
        return unlinkat(at, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? -1 : 0;
}

int cove_tarx_rm_at(int dirfd, const char *name)
{
        return rm_at(dirfd, name, 0);
}

/* ---- entries ----------------------------------------------------------------------- */

static int write_data(struct tsrc *s, int fd, uint64_t size, struct cove_err *err)
{
        unsigned char buf[65536];
        while (size > 0) {
                size_t k = size < sizeof buf ? (size_t)size : sizeof buf;
                if (src_full(s, buf, k, err) < 0)
                        return -1;
                size_t off = 0;
                while (off < k) {
                        ssize_t w = write(fd, buf + off, k - off);
                        if (w < 0 && errno == EINTR)
                                continue;
                        if (w < 0)
                                return cove_err_set(err, errno, "write");
                        off += (size_t)w;
                }
                size -= k;
        }
        return 0;
}

static int entry_apply(struct tsrc *s, int root, struct entry *e, const char *rel,
                       struct cove_err *err)
{
        char sh[160];
        const char *leaf = NULL;
        cleanup_close int pfd = open_parent(root, rel, 1, &leaf);
        if (pfd < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, errno, "\"%s\": %s",
                                     shown(rel, sh, sizeof sh),
                                     errno == ENOTDIR ? "a parent is not a directory (a symlink?)"
                                                      : "cannot create its directory");
        struct stat st;
        int exists = fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0;
        if (exists && S_ISDIR(st.st_mode) && e->type != '5') {
                if (cove_tarx_rm_at(pfd, leaf) < 0)
                        return cove_err_set(err, errno, "\"%s\": replace a directory",
                                            shown(rel, sh, sizeof sh));
                exists = 0;
        }
        if (exists && !S_ISDIR(st.st_mode)) {
                if (unlinkat(pfd, leaf, 0) < 0)
                        return cove_err_set(err, errno, "\"%s\": replace",
                                            shown(rel, sh, sizeof sh));
                exists = 0;
        }
        mode_t mode = (mode_t)(e->mode & 07777);
        uid_t uid = (uid_t)e->uid;
        gid_t gid = (gid_t)e->gid;
        struct timespec ts[2] = {{e->mtime, 0}, {e->mtime, 0}};
        switch (e->type) {
        case '0':
        case '7': {
                cleanup_close int fd =
                    openat(pfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (fd < 0)
                        return cove_err_set(err, errno, "\"%s\": create",
                                            shown(rel, sh, sizeof sh));
                if (write_data(s, fd, e->size, err) < 0)
                        return cove_err_wrap(err, "\"%s\"", shown(rel, sh, sizeof sh));
                /* chown before chmod: chown clears the setuid and setgid bits */
                if (fchown(fd, uid, gid) < 0 || fchmod(fd, mode) < 0)
                        return cove_err_set(err, errno, "\"%s\": owner and mode",
                                            shown(rel, sh, sizeof sh));
                /* file capabilities as the image says, after chown (which clears them): in
                 * effect in a sandbox (for its root, through the idmapped template); on the
                 * host the file is below 0700 directories only root reaches */
                if (e->has_fcap && fsetxattr(fd, "security.capability", e->fcap, FCAP_LEN, 0) < 0)
                        return cove_err_set(err, errno, "\"%s\": security.capability",
                                            shown(rel, sh, sizeof sh));
                futimens(fd, ts);
                return 0;
        }
        case '5': {
                if (!exists && mkdirat(pfd, leaf, 0700) < 0)
                        return cove_err_set(err, errno, "\"%s\": mkdir", shown(rel, sh, sizeof sh));
                cleanup_close int fd =
                    openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0 || fchown(fd, uid, gid) < 0 || fchmod(fd, mode) < 0)
                        return cove_err_set(err, errno, "\"%s\": directory",
                                            shown(rel, sh, sizeof sh));
                return 0;
        }
        case '2':
                if (!e->link[0])
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "\"%s\": symlink without a target",
                                             shown(rel, sh, sizeof sh));
                /* the target is never followed here (every open below is O_NOFOLLOW) and
                 * inside a sandbox it resolves in the sandbox's own root */
                if (symlinkat(e->link, pfd, leaf) < 0 ||
                    fchownat(pfd, leaf, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
                        return cove_err_set(err, errno, "\"%s\": symlink",
                                            shown(rel, sh, sizeof sh));
                utimensat(pfd, leaf, ts, AT_SYMLINK_NOFOLLOW);
                return 0;
        case '1': {
                char target[PATH_LEN_MAX + 1];
                const char *why = NULL;
                if (clean_path(e->link, target, sizeof target, &why) < 0 || !target[0])
                        return cove_err_setk(
                            err, COVE_E_BAD_REQUEST, 0, "\"%s\": hardlink target %s",
                            shown(rel, sh, sizeof sh), why ? why : "is the layer root");
                const char *tleaf = NULL;
                cleanup_close int tfd = open_parent(root, target, 0, &tleaf);
                struct stat ts2;
                if (tfd < 0 || fstatat(tfd, tleaf, &ts2, AT_SYMLINK_NOFOLLOW) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, errno,
                                             "\"%s\": hardlink to a file not in this layer",
                                             shown(rel, sh, sizeof sh));
                if (S_ISDIR(ts2.st_mode))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "\"%s\": hardlink to a directory",
                                             shown(rel, sh, sizeof sh));
                if (linkat(tfd, tleaf, pfd, leaf, 0) < 0)
                        return cove_err_set(err, errno, "\"%s\": hardlink",
                                            shown(rel, sh, sizeof sh));
                return 0;
        }
        case '6':
                if (mkfifoat(pfd, leaf, 0600) < 0 ||
                    fchownat(pfd, leaf, uid, gid, AT_SYMLINK_NOFOLLOW) < 0 ||
                    fchmodat(pfd, leaf, mode & 0777, 0) < 0)
                        return cove_err_set(err, errno, "\"%s\": fifo", shown(rel, sh, sizeof sh));
                return 0;
        default:
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "\"%s\": unsupported entry type",
                                     shown(rel, sh, sizeof sh));
        }
}

/* Walk the tar stream; apply entries below root (root < 0: validate only). */
static int walk(struct tsrc *s, int root, struct cove_tarx_result *res, struct cove_err *err)
{
        struct entry *e = malloc(sizeof *e);
        char *rel = malloc(PATH_LEN_MAX + 2);
        int rc = -1;
        if (!e || !rel) {
                cove_err_set(err, ENOMEM, "tar");
                goto out;
        }
        for (;;) {
                int r = next_entry(s, e, err);
                if (r < 0)
                        goto out;
                if (r == 1)
                        break;
                char sh[160];
                const char *why = NULL;
                if (clean_path(e->path, rel, PATH_LEN_MAX + 2, &why) < 0) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "\"%s\": %s refused",
                                      shown(e->path, sh, sizeof sh), why);
                        goto out;
                }
                if (s->budget) {
                        if (s->budget->entries_left == 0) {
                                cove_err_setk(err, COVE_E_LIMIT, 0,
                                              "more entries than the limit allows");
                                goto out;
                        }
                        s->budget->entries_left--;
                }
                res->entries++;
                if (e->type == '3' || e->type == '4') {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                      "\"%s\": device node (%s %llu:%llu) refused: a template "
                                      "holds no device files",
                                      shown(rel, sh, sizeof sh), e->type == '3' ? "char" : "block",
                                      (unsigned long long)e->devmajor,
                                      (unsigned long long)e->devminor);
                        goto out;
                }
                int has_data = e->type == '0' || e->type == '7';
                uint64_t data = has_data ? e->size : 0;
                if (!rel[0]) { /* "./" itself: the layer root */
                        if (e->type != '5') {
                                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                              "the layer root is not a directory");
                                goto out;
                        }
                } else if (root >= 0) {
                        if (entry_apply(s, root, e, rel, err) < 0)
                                goto out;
                        data = 0; /* consumed */
                } else if (e->type == '1' || e->type == '2') {
                        char t[PATH_LEN_MAX + 2];
                        if (e->type == '1' &&
                            (clean_path(e->link, t, sizeof t, &why) < 0 || !t[0])) {
                                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                              "\"%s\": hardlink target refused",
                                              shown(rel, sh, sizeof sh));
                                goto out;
                        }
                } else if (!strchr("0756", e->type)) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "\"%s\": unsupported entry type",
                                      shown(rel, sh, sizeof sh));
                        goto out;
                }
                uint64_t pad = has_data ? (512 - e->size % 512) % 512 : 0;
                if (src_skip(s, data + pad, err) < 0)
                        goto out;
        }
        rc = 0;
out:
        free(e);
        free(rel);
        return rc;
}

static void digest_hex(EVP_MD_CTX *c, char out[72])
{
        unsigned char md[32];
        unsigned int l = 0;
        EVP_DigestFinal_ex(c, md, &l);
        char hex[65];
        cove_hex(md, 32, hex);
        snprintf(out, 72, "sha256:%s", hex);
}

static int src_open(struct tsrc *s, struct cove_err *err)
{
        s->in = malloc(IN_BUF);
        s->blob = EVP_MD_CTX_new();
        s->diff = EVP_MD_CTX_new();
        if (!s->in || !s->blob || !s->diff || !EVP_DigestInit_ex(s->blob, EVP_sha256(), NULL) ||
            !EVP_DigestInit_ex(s->diff, EVP_sha256(), NULL))
                return cove_err_set(err, ENOMEM, "unpack");
        s->next_tick = TICK_EVERY;
        return 0;
}

static void src_close(struct tsrc *s)
{
        if (s->z_init)
                inflateEnd(&s->z);
        if (s->zs)
                ZSTD_freeDStream(s->zs);
        EVP_MD_CTX_free(s->blob);
        EVP_MD_CTX_free(s->diff);
        free(s->in);
}

int cove_tarx_unpack(int blob_fd, int dirfd, struct cove_tarx_budget *budget,
                     cove_tarx_tick_fn tick, void *tick_arg, struct cove_tarx_result *res,
                     struct cove_err *err)
{
        memset(res, 0, sizeof *res);
        struct tsrc s = {.fd = blob_fd, .budget = budget, .tick = tick, .tick_arg = tick_arg};
        int rc = -1;
        if (src_open(&s, err) < 0)
                goto out;
        if (walk(&s, dirfd, res, err) < 0)
                goto out;
        /* the rest of the stream (end blocks, padding, trailing data) still counts for the
         * digests, and is bounded by the same budget */
        unsigned char buf[65536];
        for (;;) {
                ssize_t r = src_read(&s, buf, sizeof buf, err);
                if (r < 0)
                        goto out;
                if (r == 0)
                        break;
        }
        while (!s.in_eof) {
                s.in_off = s.in_len;
                if (raw_fill(&s, err) < 0)
                        goto out;
        }
        digest_hex(s.blob, res->blob_digest);
        digest_hex(s.diff, res->diff_id);
        res->bytes = s.out_total;
        rc = 0;
out:
        src_close(&s);
        return rc;
}

int cove_tarx_check(const void *buf, size_t len, struct cove_err *err)
{
        struct tsrc s = {.fd = -1, .m = buf, .mlen = len, .kind = K_PLAIN};
        struct cove_tarx_budget b = {.bytes_left = 64ULL << 20, .entries_left = 100000};
        s.budget = &b;
        struct cove_tarx_result res;
        memset(&res, 0, sizeof res);
        int rc = -1;
        if (src_open(&s, err) == 0)
                rc = walk(&s, -1, &res, err);
        src_close(&s);
        return rc;
}

/* ---- layering ---------------------------------------------------------------------- */

#define WH ".wh."
#define WH_OPQ ".wh..wh..opq"

static int apply_dir(int lfd, int rfd, int depth, struct cove_err *err)
{
        if (depth > DEPTH_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "layer too deep");
        int dup_fd = dup(lfd);
        if (dup_fd < 0)
                return cove_err_set(err, errno, "layer");
        DIR *d = fdopendir(dup_fd);
        if (!d) {
                close(dup_fd);
                return cove_err_set(err, errno, "layer");
        }
        struct dirent *de;
        int rc = 0;
        /* whiteouts first: they remove what the lower layers put here, never this layer's */
        while (rc == 0 && (de = readdir(d))) {
                const char *n = de->d_name;
                if (strncmp(n, WH, 4) != 0)
                        continue;
                if (!strcmp(n, WH_OPQ)) {
                        int c = dup(rfd);
                        DIR *rd = c >= 0 ? fdopendir(c) : NULL;
                        if (!rd) {
                                if (c >= 0)
                                        close(c);
                                return cove_err_set(err, errno, "opaque directory");
                        }
                        struct dirent *re;
                        while ((re = readdir(rd)))
                                if (strcmp(re->d_name, ".") && strcmp(re->d_name, "..") &&
                                    cove_tarx_rm_at(rfd, re->d_name) < 0)
                                        rc = cove_err_set(err, errno, "opaque directory");
                        closedir(rd);
                        continue;
                }
                const char *victim = n + 4;
                if (!victim[0] || !strcmp(victim, ".") || !strcmp(victim, ".."))
                        rc =
                            cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "whiteout \"%s\" refused", n);
                else if (cove_tarx_rm_at(rfd, victim) < 0)
                        rc = cove_err_set(err, errno, "whiteout %s", n);
        }
        rewinddir(d);
        while (rc == 0 && (de = readdir(d))) {
                const char *n = de->d_name;
                if (!strcmp(n, ".") || !strcmp(n, "..") || !strncmp(n, WH, 4))
                        continue;
                struct stat ls, rs;
                if (fstatat(lfd, n, &ls, AT_SYMLINK_NOFOLLOW) < 0) {
                        rc = cove_err_set(err, errno, "layer entry");
                        break;
                }
                int rex = fstatat(rfd, n, &rs, AT_SYMLINK_NOFOLLOW) == 0;
                if (S_ISDIR(ls.st_mode)) {
                        if (rex && !S_ISDIR(rs.st_mode)) {
                                if (unlinkat(rfd, n, 0) < 0) {
                                        rc = cove_err_set(err, errno, "replace %s", n);
                                        break;
                                }
                                rex = 0;
                        }
                        if (!rex && mkdirat(rfd, n, 0700) < 0) {
                                rc = cove_err_set(err, errno, "mkdir %s", n);
                                break;
                        }
                        int lc = openat(lfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        int rc2 = openat(rfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (lc < 0 || rc2 < 0) {
                                rc = cove_err_set(err, errno, "open %s", n);
                        } else {
                                rc = apply_dir(lc, rc2, depth + 1, err);
                                if (rc == 0 && (fchown(rc2, ls.st_uid, ls.st_gid) < 0 ||
                                                fchmod(rc2, ls.st_mode & 07777) < 0))
                                        rc = cove_err_set(err, errno, "directory %s", n);
                        }
                        if (lc >= 0)
                                close(lc);
                        if (rc2 >= 0)
                                close(rc2);
                        continue;
                }
                if (rex && cove_tarx_rm_at(rfd, n) < 0) {
                        rc = cove_err_set(err, errno, "replace %s", n);
                        break;
                }
                if (linkat(lfd, n, rfd, n, 0) < 0)
                        rc = cove_err_set(err, errno, "link %s", n);
        }
        closedir(d);
        return rc;
}

int cove_tarx_apply(int layer_fd, int root_fd, struct cove_err *err)
{
        return apply_dir(layer_fd, root_fd, 0, err);
}
