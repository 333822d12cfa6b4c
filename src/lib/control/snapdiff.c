/* Snapshot diffs (control/snapdiff.h): both manifests are loaded, their entries sorted by
 * path and walked together; each path is resolved the way the sandbox saw it (its layer's
 * entry, a whiteout, or the template below), and the two views are compared. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "control/snapdiff.h"
#include "control/snapshot.h"
#include "control/template.h"
#include "control/tenant.h"
#include "store/manifest.h"
#include "store/snapshot.h"
#include "util/linediff.h"
#include "util/util.h"

#define CMP_LOWER_MAX (8u << 20)  /* copied-up files of this size or less compare by content */
#define CMP_BUDGET (256ull << 20) /* bytes one diff reads for such comparisons, in all */

struct side {
        struct cove_snapshot_row row;
        struct cove_manifest m;
        const struct cove_mentry **sorted; /* entries by path */
        size_t n;
        int tfd; /* template rootfs (O_PATH) below the layer, -1: none known */
};

/* What one snapshot holds at a path. */
struct view {
        int present;
        const struct cove_mentry *e; /* from the layer (content: hard links resolved) */
        int lower;                   /* from the template: st */
        struct stat st;
};

static int cmp_ent(const void *x, const void *y)
{
        const struct cove_mentry *const *a = x, *const *b = y;
        return strcmp((*a)->path, (*b)->path);
}

static const struct cove_mentry *find(const struct side *s, const char *path)
{
        size_t lo = 0, hi = s->n;
        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                int c = strcmp(s->sorted[mid]->path, path);
                if (c == 0)
                        return s->sorted[mid];
                if (c < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return NULL;
}

static int whiteout(const struct cove_mentry *e)
{
        return e->type == COVE_ENT_CHAR && e->rdev == 0;
}

static int opaque(const struct cove_mentry *e)
{
        for (size_t i = 0; i < e->nxattrs; i++)
                if ((!strcmp(e->xattrs[i].name, "user.overlay.opaque") ||
                     !strcmp(e->xattrs[i].name, "trusted.overlay.opaque")) &&
                    e->xattrs[i].len >= 1 && e->xattrs[i].value[0] == 'y')
                        return 1;
        return 0;
}

static int open_lower(int tfd, const char *path, int flags)
{
        struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW),
                               .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                          RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
        return (int)syscall(SYS_openat2, tfd, path, &how, sizeof(how));
}

/* The template's entry at path, unless the layer hides it (an ancestor that is a whiteout,
 * not a directory, or an opaque directory). */
static int lower_of(const struct side *s, const char *path, struct stat *st)
{
        if (s->tfd < 0)
                return 0;
        char buf[COVE_PATH_MAX + 1];
        snprintf(buf, sizeof(buf), "%s", path);
        for (char *p = strchr(buf, '/'); p; p = strchr(p + 1, '/')) {
                *p = 0;
                const struct cove_mentry *a = find(s, buf);
                *p = '/';
                if (a && (a->type != COVE_ENT_DIR || opaque(a)))
                        return 0;
        }
        int fd = open_lower(s->tfd, path, O_PATH);
        if (fd < 0)
                return 0;
        int r = fstat(fd, st) == 0;
        close(fd);
        return r;
}

static struct view view_of(const struct side *s, const char *path, const struct cove_mentry *e)
{
        struct view v = {0};
        if (e) {
                if (whiteout(e))
                        return v;
                if (e->link) {
                        const struct cove_mentry *t = find(s, e->link);
                        if (t)
                                e = t;
                }
                v.present = 1;
                v.e = e;
                return v;
        }
        if (lower_of(s, path, &v.st))
                v.present = v.lower = 1;
        return v;
}

static const char *type_of_mode(mode_t m)
{
        switch (m & S_IFMT) {
        case S_IFREG:
                return "file";
        case S_IFDIR:
                return "dir";
        case S_IFLNK:
                return "symlink";
        case S_IFCHR:
                return "char";
        case S_IFBLK:
                return "block";
        case S_IFIFO:
                return "fifo";
        default:
                return "socket";
        }
}

static const char *vtype(const struct view *v)
{
        return v->lower ? type_of_mode(v->st.st_mode) : cove_ent_type_name(v->e->type);
}

static uint32_t vmode(const struct view *v)
{
        return v->lower ? (uint32_t)(v->st.st_mode & 07777) : v->e->mode;
}

static uint64_t vsize(const struct view *v)
{
        if (v->lower)
                return S_ISREG(v->st.st_mode) ? (uint64_t)v->st.st_size : 0;
        if (v->e->type == COVE_ENT_SYMLINK)
                return v->e->target ? strlen(v->e->target) : 0;
        return v->e->type == COVE_ENT_FILE ? v->e->size : 0;
}

/* "sha256:…" of a layer file's chunk list: equal contents have equal chunk lists within a
 * tenant (content-defined chunks named by a keyed hash), so equal hashes mean equal files. */
static void chunk_hash(const struct cove_manifest *m, const struct cove_mentry *e, char out[72])
{
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        uint8_t h[32];
        memset(h, 0, sizeof(h));
        if (c)
                EVP_DigestInit_ex(c, EVP_sha256(), NULL);
        for (size_t i = 0; i < e->nchunks; i++) {
                const struct cove_mchunk *ch = &m->chunks[e->chunk_off + i];
                uint8_t len[8];
                for (int b = 0; b < 8; b++)
                        len[b] = (uint8_t)(ch->len >> (8 * b));
                if (c) {
                        EVP_DigestUpdate(c, ch->id, 32);
                        EVP_DigestUpdate(c, len, 8);
                }
        }
        if (c)
                EVP_DigestFinal_ex(c, h, NULL);
        EVP_MD_CTX_free(c);
        memcpy(out, "sha256:", 7);
        cove_hex(h, 32, out + 7);
}

static int same_chunks(const struct side *a, const struct cove_mentry *x, const struct side *b,
                       const struct cove_mentry *y)
{
        if (x->nchunks != y->nchunks)
                return 0;
        for (size_t i = 0; i < x->nchunks; i++) {
                const struct cove_mchunk *p = &a->m.chunks[x->chunk_off + i],
                                         *q = &b->m.chunks[y->chunk_off + i];
                if (p->len != q->len || p->hole != q->hole || memcmp(p->id, q->id, 32))
                        return 0;
        }
        return 1;
}

/* Bytes of a template file, at most max (LIMIT past it). */
static int read_lower(const struct side *s, const char *path, size_t max, char **out, size_t *len,
                      struct cove_err *err)
{
        int fd = open_lower(s->tfd, path, O_RDONLY);
        if (fd < 0)
                return cove_err_set(err, errno, "template file %s", path);
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                close(fd);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s is not a regular file", path);
        }
        if ((uint64_t)st.st_size > max) {
                close(fd);
                return cove_err_setk(err, COVE_E_LIMIT, 0, "/%s is %lld bytes in the template",
                                     path, (long long)st.st_size);
        }
        char *buf = malloc((size_t)st.st_size + 1);
        size_t got = 0;
        while (buf && got < (size_t)st.st_size) {
                ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                got += (size_t)n;
        }
        close(fd);
        if (!buf)
                return cove_err_set(err, ENOMEM, "read %s", path);
        *out = buf;
        *len = got;
        return 0;
}

/* The content of a view (files: the data; symlinks: the target), bounded. */
static int content(struct coved *d, const struct side *s, const struct view *v, const char *path,
                   size_t max, char **out, size_t *len, struct cove_err *err)
{
        *out = NULL;
        *len = 0;
        if (!v->present)
                return 0;
        if (v->lower) {
                if (S_ISLNK(v->st.st_mode)) {
                        char t[4096];
                        int fd = open_lower(s->tfd, path, O_PATH);
                        ssize_t n = fd < 0 ? -1 : readlinkat(fd, "", t, sizeof(t));
                        if (fd >= 0)
                                close(fd);
                        if (n < 0)
                                return cove_err_set(err, errno, "template symlink %s", path);
                        *out = strndup(t, (size_t)n);
                        *len = (size_t)n;
                        return *out ? 0 : cove_err_set(err, ENOMEM, "read %s", path);
                }
                return read_lower(s, path, max, out, len, err);
        }
        if (v->e->type == COVE_ENT_SYMLINK) {
                *out = strdup(v->e->target ? v->e->target : "");
                *len = strlen(*out ? *out : "");
                return *out ? 0 : cove_err_set(err, ENOMEM, "read %s", path);
        }
        if (v->e->size > max)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "/%s is %llu bytes in %s", path,
                                     (unsigned long long)v->e->size, s->row.id);
        uint8_t *b = NULL;
        if (cove_snapshot_read_entry(cove_tm_store(d), s->row.tenant, &s->m, v->e, max, &b, len,
                                     err) < 0) {
                if (err->kind != COVE_E_LIMIT && err->kind != COVE_E_KEY_REVOKED &&
                    err->kind != COVE_E_BAD_REQUEST)
                        err->kind = COVE_E_UNAVAILABLE;
                return -1;
        }
        *out = (char *)b;
        return 0;
}

/* 1 when the two views differ. A layer file against a template file (copied up) compares
 * by content when both are small, else counts as changed. */
static int differs(struct coved *d, const struct side *a, const struct view *x,
                   const struct side *b, const struct view *y, const char *path, uint64_t *budget,
                   int *inexact)
{
        if (strcmp(vtype(x), vtype(y)) || vmode(x) != vmode(y))
                return 1;
        if (!strcmp(vtype(x), "dir"))
                return !x->lower && !y->lower && (x->e->uid != y->e->uid || x->e->gid != y->e->gid);
        if (vsize(x) != vsize(y))
                return 1;
        if (x->lower && y->lower)
                return 0;
        if (!x->lower && !y->lower) {
                if (x->e->uid != y->e->uid || x->e->gid != y->e->gid || x->e->rdev != y->e->rdev)
                        return 1;
                if (x->e->type == COVE_ENT_SYMLINK)
                        return strcmp(x->e->target ? x->e->target : "",
                                      y->e->target ? y->e->target : "") != 0;
                return x->e->type == COVE_ENT_FILE && !same_chunks(a, x->e, b, y->e);
        }
        if (strcmp(vtype(x), "file") && strcmp(vtype(x), "symlink"))
                return 0;
        if (vsize(x) > CMP_LOWER_MAX || 2 * vsize(x) > *budget) {
                *inexact = 1; /* not compared: reported as changed */
                return 1;
        }
        *budget -= 2 * vsize(x);
        char *p = NULL, *q = NULL;
        size_t pl = 0, ql = 0;
        struct cove_err e;
        int r = 1;
        if (content(d, a, x, path, CMP_LOWER_MAX, &p, &pl, &e) == 0 &&
            content(d, b, y, path, CMP_LOWER_MAX, &q, &ql, &e) == 0)
                r = pl != ql || memcmp(p, q, pl) != 0;
        free(p);
        free(q);
        return r;
}

/* o[key] = prefix + the n bytes of s as a JSON string. Bytes that are not UTF-8 (a sandbox
 * names its files as it likes) cannot be: then o[key] shows them as '?' and
 * o[key + "_b64"] holds the exact bytes. */
static void set_text(json_t *o, const char *key, const char *prefix, const char *s, size_t n)
{
        size_t pl = strlen(prefix);
        char *buf = malloc(pl + n + 1);
        if (!buf)
                return;
        memcpy(buf, prefix, pl);
        memcpy(buf + pl, s, n);
        buf[pl + n] = 0;
        json_t *v = json_stringn(buf, pl + n);
        if (!v) {
                char k[64];
                char *b64 = malloc(4 * ((pl + n + 2) / 3) + 1);
                if (b64) {
                        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)buf,
                                        (int)(pl + n));
                        snprintf(k, sizeof(k), "%s_b64", key);
                        json_object_set_new(o, k, json_string(b64));
                        free(b64);
                }
                for (size_t i = 0; i < pl + n; i++)
                        if ((unsigned char)buf[i] >= 0x80)
                                buf[i] = '?';
                v = json_stringn(buf, pl + n);
        }
        json_object_set_new(o, key, v);
        free(buf);
}

static json_t *item(const struct side *s_b, const struct view *x, const struct view *y,
                    const struct side *s_a, const char *path)
{
        const struct view *now = y->present ? y : x;
        const struct side *sn = y->present ? s_b : s_a;
        char mode[8], hash[72];
        snprintf(mode, sizeof(mode), "%04o", vmode(now));
        json_t *o = json_object();
        set_text(o, "path", "/", path, strlen(path));
        json_object_set_new(o, "type", json_string(vtype(now)));
        json_object_set_new(o, "mode", json_string(mode));
        json_object_set_new(o, "size_before",
                            x->present ? json_integer((json_int_t)vsize(x)) : json_null());
        json_object_set_new(o, "size_after",
                            y->present ? json_integer((json_int_t)vsize(y)) : json_null());
        if (x->present && y->present && vmode(x) != vmode(y)) {
                snprintf(mode, sizeof(mode), "%04o", vmode(x));
                json_object_set_new(o, "mode_before", json_string(mode));
        }
        if (!now->lower && now->e->type == COVE_ENT_FILE) {
                chunk_hash(&sn->m, now->e, hash);
                json_object_set_new(o, "hash", json_string(hash));
        } else {
                json_object_set_new(o, "hash", json_null());
        }
        if (!now->lower && now->e->type == COVE_ENT_SYMLINK)
                set_text(o, "target", "", now->e->target ? now->e->target : "",
                         now->e->target ? strlen(now->e->target) : 0);
        if (x->present && y->present && !x->lower && x->e->type == COVE_ENT_FILE && y->e &&
            !y->lower && y->e->type == COVE_ENT_FILE) {
                chunk_hash(&s_a->m, x->e, hash);
                json_object_set_new(o, "hash_before", json_string(hash));
        }
        return o;
}

static void side_clear(struct side *s)
{
        free(s->sorted);
        cove_manifest_clear(&s->m);
        if (s->tfd >= 0)
                close(s->tfd);
}

static int side_open(struct coved *d, const char *tenant, const char *id, struct side *s,
                     struct cove_err *err)
{
        memset(s, 0, sizeof(*s));
        s->tfd = -1;
        cove_manifest_init(&s->m);
        if (cove_snapshot_load(d, tenant, id, &s->row, err) < 0)
                return -1;
        if (coved_key_gate(d, s->row.tenant, err) < 0)
                return -1;
        if (!cove_tm_store(d))
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "this node has no snapshot store");
        if (cove_snapshot_manifest(cove_tm_store(d), s->row.tenant, s->row.id, &s->m, err) < 0) {
                if (err->kind != COVE_E_KEY_REVOKED)
                        err->kind = COVE_E_UNAVAILABLE;
                return -1;
        }
        if (strcmp(s->m.kind, "files"))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "snapshot %s is a VM full snapshot (one memory image): "
                                     "its files are not listed, so it cannot be diffed",
                                     s->row.id);
        s->sorted = malloc((s->m.n ? s->m.n : 1) * sizeof(*s->sorted));
        if (!s->sorted)
                return cove_err_set(err, ENOMEM, "diff");
        for (size_t i = 0; i < s->m.n; i++)
                s->sorted[i] = &s->m.entries[i];
        s->n = s->m.n;
        qsort(s->sorted, s->n, sizeof(*s->sorted), cmp_ent);
        /* the template below an ns layer; a sandbox row gone or another runtime: none */
        struct cove_sandbox_row sb;
        if (cove_sandbox_load(d, s->row.tenant, s->row.sandbox_id, &sb, NULL) == 0) {
                char rootfs[4096];
                if (!strcmp(sb.runtime, "ns") &&
                    cove_template_lookup(d->templates_dir, sb.template_name, rootfs, sizeof(rootfs),
                                         NULL) == 0)
                        s->tfd = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
                cove_sandbox_row_clear(&sb);
        }
        return 0;
}

/* "/a/b/" → "a/b"; "" or "/" → "" (everything). -1 for "." or ".." components. */
static int norm_path(const char *in, char *out, size_t cap)
{
        while (*in == '/')
                in++;
        size_t n = strlen(in);
        while (n && in[n - 1] == '/')
                n--;
        if (n >= cap)
                return -1;
        memcpy(out, in, n);
        out[n] = 0;
        for (char *c = out; *c;) {
                char *e = strchr(c, '/');
                size_t l = e ? (size_t)(e - c) : strlen(c);
                if (l == 0 || (l == 1 && c[0] == '.') || (l == 2 && c[0] == '.' && c[1] == '.'))
                        return -1;
                c += l + (e ? 1 : 0);
        }
        return 0;
}

static int under(const char *path, const char *prefix)
{
        size_t n = strlen(prefix);
        return n == 0 || (!strncmp(path, prefix, n) && (path[n] == 0 || path[n] == '/'));
}

/* Processes of an ns full snapshot: the pids of its checkpoint's core-<pid>.img files. */
static json_t *pids_of(struct coved *d, const struct side *s)
{
        if (strcmp(s->row.kind, "full"))
                return json_null();
        char mid[96];
        snprintf(mid, sizeof(mid), "%s-mem", s->row.id);
        struct cove_manifest m;
        struct cove_err e;
        if (cove_snapshot_manifest(cove_tm_store(d), s->row.tenant, mid, &m, &e) < 0) {
                cove_manifest_clear(&m);
                return json_null();
        }
        json_t *arr = json_array();
        for (size_t i = 0; i < m.n; i++) {
                unsigned long pid;
                char tail[8];
                if (sscanf(m.entries[i].path, "core-%lu.im%1[g]", &pid, tail) == 2)
                        json_array_append_new(arr, json_pack("{s:I}", "pid", (json_int_t)pid));
        }
        cove_manifest_clear(&m);
        return arr;
}

int cove_snapshot_diff(struct coved *d, const char *tenant, const char *a, const char *b,
                       const char *prefix_in, size_t limit, json_t **out, struct cove_err *err)
{
        *out = NULL;
        char prefix[COVE_PATH_MAX + 1] = "";
        if (limit == 0)
                limit = COVE_DIFF_ENTRIES_DEFAULT;
        struct side sa, sb;
        int rc = side_open(d, tenant, a, &sa, err);
        if (rc == 0)
                rc = side_open(d, tenant, b, &sb, err);
        else
                memset(&sb, 0, sizeof(sb)), sb.tfd = -1, cove_manifest_init(&sb.m);
        if (rc == 0 && strcmp(sa.row.tenant, sb.row.tenant))
                rc = cove_err_setk(err, COVE_E_NOT_FOUND, 0, "snapshot %.64s not found", b);
        /* the path is checked once both snapshots are found: another tenant's ids are 404
         * whatever else is wrong */
        if (rc == 0 && norm_path(prefix_in ? prefix_in : "", prefix, sizeof(prefix)) < 0)
                rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                   "path must be an absolute path without . or .. components");
        if (rc < 0) {
                side_clear(&sa);
                side_clear(&sb);
                return -1;
        }
        json_t *added = json_array(), *changed = json_array(), *removed = json_array();
        size_t i = 0, j = 0, count = 0;
        int truncated = 0, inexact = 0;
        uint64_t budget = CMP_BUDGET;
        while (i < sa.n || j < sb.n) {
                const struct cove_mentry *x = i < sa.n ? sa.sorted[i] : NULL,
                                         *y = j < sb.n ? sb.sorted[j] : NULL;
                int c = !x ? 1 : !y ? -1 : strcmp(x->path, y->path);
                const char *path = c <= 0 ? x->path : y->path;
                const struct cove_mentry *ex = c <= 0 ? x : NULL, *ey = c >= 0 ? y : NULL;
                if (c <= 0)
                        i++;
                if (c >= 0)
                        j++;
                if (!strcmp(path, ".") || !under(path, prefix))
                        continue;
                struct view vx = view_of(&sa, path, ex), vy = view_of(&sb, path, ey);
                json_t *list = NULL;
                if (!vx.present && vy.present)
                        list = added;
                else if (vx.present && !vy.present)
                        list = removed;
                else if (vx.present && differs(d, &sa, &vx, &sb, &vy, path, &budget, &inexact))
                        list = changed;
                if (!list)
                        continue;
                if (count >= limit) {
                        truncated = 1;
                        break;
                }
                count++;
                json_array_append_new(list, item(&sb, &vx, &vy, &sa, path));
        }
        /* renames: an added file with the content of a removed one (indexed by hash) */
        json_t *by_hash = json_object(), *ad, *rm;
        size_t k;
        json_array_foreach(removed, k, rm)
        {
                const char *h = json_string_value(json_object_get(rm, "hash"));
                if (h && !json_object_get(by_hash, h))
                        json_object_set(by_hash, h, rm);
        }
        json_array_foreach(added, k, ad)
        {
                const char *h = json_string_value(json_object_get(ad, "hash"));
                if (!h || json_integer_value(json_object_get(ad, "size_after")) == 0 ||
                    !(rm = json_object_get(by_hash, h)))
                        continue;
                json_object_set(ad, "renamed_from", json_object_get(rm, "path"));
                json_object_set(rm, "renamed_to", json_object_get(ad, "path"));
                json_object_del(by_hash, h); /* each removed file pairs once */
        }
        json_decref(by_hash);
        json_t *o =
            json_pack("{s:s, s:s, s:o, s:o, s:o, s:b}", "from", sa.row.id, "to", sb.row.id, "added",
                      added, "changed", changed, "removed", removed, "truncated", truncated);
        if (inexact)
                json_object_set_new(o, "inexact", json_true());
        if (!strcmp(sa.row.kind, "full") || !strcmp(sb.row.kind, "full"))
                json_object_set_new(
                    o, "processes",
                    json_pack("{s:o, s:o}", "before", pids_of(d, &sa), "after", pids_of(d, &sb)));
        side_clear(&sa);
        side_clear(&sb);
        *out = o;
        return 0;
}

static int binary(const char *p, size_t n)
{
        return memchr(p, 0, n < 8000 ? n : 8000) != NULL;
}

int cove_snapshot_diff_file(struct coved *d, const char *tenant, const char *a, const char *b,
                            const char *path_in, json_t **out, struct cove_err *err)
{
        *out = NULL;
        char path[COVE_PATH_MAX + 1] = "";
        struct side sa, sb;
        int rc = side_open(d, tenant, a, &sa, err);
        if (rc == 0)
                rc = side_open(d, tenant, b, &sb, err);
        else
                memset(&sb, 0, sizeof(sb)), sb.tfd = -1, cove_manifest_init(&sb.m);
        if (rc == 0 && strcmp(sa.row.tenant, sb.row.tenant))
                rc = cove_err_setk(err, COVE_E_NOT_FOUND, 0, "snapshot %.64s not found", b);
        if (rc == 0 && (!path_in || norm_path(path_in, path, sizeof(path)) < 0 || !path[0]))
                rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                   "path must name a file: an absolute path without . or .. "
                                   "components");
        char *p = NULL, *q = NULL, *diff = NULL;
        size_t pl = 0, ql = 0, dl = 0;
        struct view vx = {0}, vy = {0};
        if (rc == 0) {
                vx = view_of(&sa, path, find(&sa, path));
                vy = view_of(&sb, path, find(&sb, path));
                if ((vx.present && !strcmp(vtype(&vx), "dir")) ||
                    (vy.present && !strcmp(vtype(&vy), "dir")))
                        rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                           "/%s is a directory: diff the snapshots with "
                                           "?path= instead",
                                           path);
        }
        if (rc == 0)
                rc = content(d, &sa, &vx, path, COVE_DIFF_FILE_MAX, &p, &pl, err);
        if (rc == 0)
                rc = content(d, &sb, &vy, path, COVE_DIFF_FILE_MAX, &q, &ql, err);
        if (rc < 0 && err->kind == COVE_E_LIMIT)
                cove_err_wrap(err, "file diffs read files up to %u bytes", COVE_DIFF_FILE_MAX);
        const char *status = !vx.present && !vy.present               ? "absent"
                             : !vx.present                            ? "added"
                             : !vy.present                            ? "removed"
                             : (pl != ql || (pl && memcmp(p, q, pl))) ? "changed"
                                                                      : "unchanged";
        int bin = rc == 0 && (binary(p ? p : "", pl) || binary(q ? q : "", ql));
        char na[COVE_PATH_MAX + 8], nb[COVE_PATH_MAX + 8];
        snprintf(na, sizeof(na), vx.present ? "a/%s" : "/dev/null", path);
        snprintf(nb, sizeof(nb), vy.present ? "b/%s" : "/dev/null", path);
        if (rc == 0 && bin) {
                if (strcmp(status, "unchanged") && strcmp(status, "absent") &&
                    asprintf(&diff, "Binary files %s and %s differ\n", na, nb) < 0)
                        diff = NULL;
        } else if (rc == 0) {
                rc = cove_linediff(p ? p : "", pl, q ? q : "", ql, na, nb, 3, COVE_DIFF_OUT_MAX,
                                   &diff, &dl, err);
        }
        if (rc == 0 && !(*out = json_pack("{s:s, s:b}", "status", status, "binary", bin)))
                rc = cove_err_set(err, ENOMEM, "diff");
        if (rc == 0) {
                set_text(*out, "path", "/", path, strlen(path));
                set_text(*out, "diff", "", diff ? diff : "", diff ? strlen(diff) : 0);
        }
        free(diff);
        free(p);
        free(q);
        side_clear(&sa);
        side_clear(&sb);
        return rc;
}
