/* Manifest model, JSON serialisation and the bounded, validating parser (store/manifest.h). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "store/manifest.h"
#include "util/util.h"

static const char *const type_names[] = {"file",  "dir",  "symlink", "char",
                                         "block", "fifo", "socket"};

const char *cove_ent_type_name(enum cove_ent_type t)
{
        return (unsigned)t < 7 ? type_names[t] : "?";
}

int cove_snapshot_id_valid(const char *s)
{
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || n > COVE_ID_MAX)
                return 0;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-'))
                        return 0;
        }
        return 1;
}

void cove_manifest_init(struct cove_manifest *m)
{
        memset(m, 0, sizeof(*m));
}

void cove_manifest_clear(struct cove_manifest *m)
{
        for (size_t i = 0; i < m->n; i++) {
                struct cove_mentry *e = &m->entries[i];
                free(e->path);
                free(e->target);
                free(e->link);
                for (size_t j = 0; j < e->nxattrs; j++) {
                        free(e->xattrs[j].name);
                        free(e->xattrs[j].value);
                }
                free(e->xattrs);
        }
        free(m->entries);
        free(m->chunks);
        memset(m, 0, sizeof(*m));
}

struct cove_mentry *cove_manifest_add(struct cove_manifest *m, const struct cove_mentry *src)
{
        if (m->n == m->cap) {
                size_t nc = m->cap ? m->cap * 2 : 64;
                struct cove_mentry *ne = realloc(m->entries, nc * sizeof(*ne));
                if (!ne)
                        return NULL;
                m->entries = ne;
                m->cap = nc;
        }
        struct cove_mentry *e = &m->entries[m->n];
        *e = *src;
        e->path = strdup(src->path);
        e->target = src->target ? strdup(src->target) : NULL;
        e->link = src->link ? strdup(src->link) : NULL;
        e->xattrs = NULL;
        e->nxattrs = 0;
        e->chunk_off = m->nchunks;
        e->nchunks = 0;
        if (!e->path || (src->target && !e->target) || (src->link && !e->link)) {
                free(e->path);
                free(e->target);
                free(e->link);
                return NULL;
        }
        m->n++;
        return e;
}

int cove_manifest_add_chunk(struct cove_manifest *m, const uint8_t id[32], uint64_t len, int hole)
{
        if (m->nchunks == m->chunks_cap) {
                size_t nc = m->chunks_cap ? m->chunks_cap * 2 : 256;
                struct cove_mchunk *nch = realloc(m->chunks, nc * sizeof(*nch));
                if (!nch)
                        return -1;
                m->chunks = nch;
                m->chunks_cap = nc;
        }
        struct cove_mchunk *c = &m->chunks[m->nchunks++];
        if (id && !hole)
                memcpy(c->id, id, 32);
        else
                memset(c->id, 0, 32);
        c->len = len;
        c->hole = hole;
        m->entries[m->n - 1].nchunks++;
        return 0;
}

int cove_mentry_add_xattr(struct cove_mentry *e, const char *name, const void *val, size_t len)
{
        struct cove_xattr *nx = realloc(e->xattrs, (e->nxattrs + 1) * sizeof(*nx));
        if (!nx)
                return -1;
        e->xattrs = nx;
        struct cove_xattr *x = &nx[e->nxattrs];
        x->name = strdup(name);
        x->value = malloc(len ? len : 1);
        x->len = len;
        if (!x->name || !x->value) {
                free(x->name);
                free(x->value);
                return -1;
        }
        memcpy(x->value, val, len);
        e->nxattrs++;
        return 0;
}

/* ---- serialise ---- */

static json_t *hex_json(const uint8_t *p, size_t n)
{
        char *h = malloc(2 * n + 1);
        if (!h)
                return NULL;
        cove_hex(p, n, h);
        json_t *s = json_stringn(h, 2 * n);
        free(h);
        return s;
}

/* A name field (path, link, target, xattr name): a JSON string when it is UTF-8, else
 * <key>_hex with its bytes (Linux names are bytes; a sandbox may use any, and a manifest
 * that cannot be written would disable its snapshots). */
static int set_name(json_t *o, const char *key, const char *s)
{
        json_t *v = json_string(s);
        if (v)
                return json_object_set_new(o, key, v);
        char k[32];
        snprintf(k, sizeof(k), "%s_hex", key);
        return json_object_set_new(o, k, hex_json((const uint8_t *)s, strlen(s)));
}

int cove_manifest_serialize(const struct cove_manifest *m, char **out, size_t *len,
                            struct cove_err *err)
{
        json_t *root = json_object(), *ents = json_array();
        int oom = !root || !ents;
        if (!oom) {
                oom |= json_object_set_new(root, "format", json_integer(COVE_MANIFEST_FORMAT));
                oom |= json_object_set_new(root, "snapshot", json_string(m->id));
                oom |= json_object_set_new(root, "tenant", json_string(m->tenant));
                oom |= json_object_set_new(root, "parent",
                                           m->parent[0] ? json_string(m->parent) : json_null());
                oom |= json_object_set_new(root, "kind", json_string(m->kind));
                oom |= json_object_set_new(root, "created_at", json_integer(m->created_at));
                oom |= json_object_set_new(root, "size_bytes",
                                           json_integer((json_int_t)m->size_bytes));
                oom |=
                    json_object_set_new(root, "new_bytes", json_integer((json_int_t)m->new_bytes));
        }
        for (size_t i = 0; !oom && i < m->n; i++) {
                const struct cove_mentry *e = &m->entries[i];
                json_t *o = json_object();
                if (!o || json_array_append_new(ents, o)) {
                        oom = 1;
                        break;
                }
                oom |= set_name(o, "path", e->path);
                oom |= json_object_set_new(o, "type", json_string(cove_ent_type_name(e->type)));
                oom |= json_object_set_new(o, "mode", json_integer(e->mode));
                oom |= json_object_set_new(o, "uid", json_integer(e->uid));
                oom |= json_object_set_new(o, "gid", json_integer(e->gid));
                oom |= json_object_set_new(o, "mtime_ns", json_integer(e->mtime_ns));
                if (e->type == COVE_ENT_FILE)
                        oom |= json_object_set_new(o, "size", json_integer((json_int_t)e->size));
                if (e->type == COVE_ENT_FILE && e->ctime_ns > 0) {
                        oom |= json_object_set_new(o, "ctime_ns", json_integer(e->ctime_ns));
                        oom |= json_object_set_new(o, "ino", json_integer((json_int_t)e->ino));
                }
                if (e->type == COVE_ENT_CHAR || e->type == COVE_ENT_BLOCK)
                        oom |= json_object_set_new(o, "rdev", json_integer((json_int_t)e->rdev));
                if (e->target)
                        oom |= set_name(o, "target", e->target);
                if (e->link)
                        oom |= set_name(o, "link", e->link);
                if (e->nxattrs) {
                        json_t *xs = json_array();
                        oom |= !xs || json_object_set_new(o, "xattrs", xs);
                        /* [name, value hex], or [null, value hex, name hex] for a name
                         * that is not UTF-8 */
                        for (size_t j = 0; !oom && j < e->nxattrs; j++) {
                                const struct cove_xattr *x = &e->xattrs[j];
                                json_t *xn = json_string(x->name);
                                oom |= json_array_append_new(
                                    xs, xn ? json_pack("[o o]", xn, hex_json(x->value, x->len))
                                           : json_pack("[n o o]", hex_json(x->value, x->len),
                                                       hex_json((const uint8_t *)x->name,
                                                                strlen(x->name))));
                        }
                }
                if (e->type == COVE_ENT_FILE && !e->link) {
                        json_t *cs = json_array();
                        oom |= !cs || json_object_set_new(o, "chunks", cs);
                        for (size_t j = 0; !oom && j < e->nchunks; j++) {
                                const struct cove_mchunk *c = &m->chunks[e->chunk_off + j];
                                oom |= json_array_append_new(
                                    cs,
                                    json_pack("[o I]", c->hole ? json_null() : hex_json(c->id, 32),
                                              (json_int_t)c->len));
                        }
                }
        }
        if (!oom)
                oom |= json_object_set_new(root, "entries", ents);
        else
                json_decref(ents);
        char *s = oom ? NULL : json_dumps(root, JSON_COMPACT);
        json_decref(root);
        if (!s)
                return cove_err_set(err, ENOMEM, "serialise manifest");
        *out = s;
        *len = strlen(s);
        return 0;
}

/* ---- parse ---- */

static int bad(struct cove_err *err, size_t i, const char *what)
{
        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "manifest entry %zu: %s", i, what);
}

static int unhex(const char *s, size_t n, uint8_t *out)
{
        for (size_t i = 0; i < n; i++) {
                int v = 0;
                for (int k = 0; k < 2; k++) {
                        char c = s[2 * i + k];
                        int d = c >= '0' && c <= '9'   ? c - '0'
                                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                       : -1;
                        if (d < 0)
                                return -1;
                        v = v * 16 + d;
                }
                out[i] = (uint8_t)v;
        }
        return 0;
}

/* A relative path "a/b/c": no empty, ".", ".." components, each <= 255 bytes. */
static int path_ok(const char *p, size_t len)
{
        if (len == 0 || len > COVE_PATH_MAX || strlen(p) != len)
                return 0;
        size_t depth = 0;
        const char *c = p;
        for (size_t i = 0; i <= len; i++) {
                if (p[i] != '/' && p[i] != '\0')
                        continue;
                size_t cl = (size_t)(p + i - c);
                if (cl == 0 || cl > 255 || (cl == 1 && c[0] == '.') ||
                    (cl == 2 && c[0] == '.' && c[1] == '.'))
                        return 0;
                if (++depth > COVE_PATH_DEPTH_MAX)
                        return 0;
                c = p + i + 1;
        }
        return 1;
}

static int get_uint(json_t *o, const char *key, uint64_t max, uint64_t *out)
{
        json_t *v = json_object_get(o, key);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            (uint64_t)json_integer_value(v) > max)
                return -1;
        *out = (uint64_t)json_integer_value(v);
        return 0;
}

static int get_id(json_t *root, const char *key, int nullable, char *out)
{
        json_t *v = json_object_get(root, key);
        if (nullable && (!v || json_is_null(v))) {
                out[0] = '\0';
                return 0;
        }
        if (!json_is_string(v) || !cove_snapshot_id_valid(json_string_value(v)))
                return -1;
        strcpy(out, json_string_value(v));
        return 0;
}

/* A name field written by set_name(): key as a string or key_hex (not both) into buf
 * (cap bytes incl. the NUL); NULL when absent, "" with *bad set when malformed (a NUL inside,
 * too long, not hex). */
static const char *get_name(json_t *o, const char *key, char *buf, size_t cap, size_t *len,
                            int *bad_out)
{
        char k[32];
        snprintf(k, sizeof(k), "%s_hex", key);
        json_t *v = json_object_get(o, key), *h = json_object_get(o, k);
        *len = 0;
        if (!v && !h)
                return NULL;
        if (v && h) {
                *bad_out = 1;
                return "";
        }
        if (v) {
                if (!json_is_string(v) || json_string_length(v) >= cap ||
                    strlen(json_string_value(v)) != json_string_length(v)) {
                        *bad_out = 1;
                        return "";
                }
                *len = json_string_length(v);
                return json_string_value(v);
        }
        size_t n = json_is_string(h) ? json_string_length(h) / 2 : 0;
        if (!json_is_string(h) || json_string_length(h) % 2 || n >= cap ||
            unhex(json_string_value(h), n, (uint8_t *)buf) < 0) {
                *bad_out = 1;
                return "";
        }
        buf[n] = '\0';
        if (strlen(buf) != n) {
                *bad_out = 1;
                return "";
        }
        *len = n;
        return buf;
}

static int parse_entry(struct cove_manifest *m, json_t *o, size_t i, json_t *seen,
                       struct cove_err *err)
{
        if (!json_is_object(o))
                return bad(err, i, "not an object");
        char pbuf[COVE_PATH_MAX + 1], lbuf[COVE_PATH_MAX + 1], tbuf[COVE_PATH_MAX + 1];
        int malformed = 0;
        size_t plen, llen, tlen;
        json_t *jt = json_object_get(o, "type");
        const char *path = get_name(o, "path", pbuf, sizeof(pbuf), &plen, &malformed);
        if (!path || malformed || !json_is_string(jt))
                return bad(err, i, "path and type are required strings");
        int root = i == 0;
        if (root ? strcmp(path, ".") != 0 : !path_ok(path, plen))
                return bad(err, i, root ? "first entry must be \".\"" : "invalid path");
        struct cove_mentry e = {0};
        e.path = (char *)path;
        int t = -1;
        for (int k = 0; k < 7; k++)
                if (!strcmp(json_string_value(jt), type_names[k]))
                        t = k;
        if (t < 0)
                return bad(err, i, "unknown type");
        e.type = (enum cove_ent_type)t;
        if (!strcmp(m->kind, "files") && root && e.type != COVE_ENT_DIR)
                return bad(err, i, "root must be a directory");
        if (!strcmp(m->kind, "memory") && e.type != COVE_ENT_FILE)
                return bad(err, i, "a memory image is one file");
        uint64_t v;
        if (get_uint(o, "mode", 07777, &v) < 0)
                return bad(err, i, "mode");
        e.mode = (uint32_t)v;
        if (get_uint(o, "uid", UINT32_MAX, &v) < 0)
                return bad(err, i, "uid");
        e.uid = (uint32_t)v;
        if (get_uint(o, "gid", UINT32_MAX, &v) < 0)
                return bad(err, i, "gid");
        e.gid = (uint32_t)v;
        json_t *jm = json_object_get(o, "mtime_ns");
        if (!json_is_integer(jm))
                return bad(err, i, "mtime_ns");
        e.mtime_ns = json_integer_value(jm);
        if (e.type == COVE_ENT_FILE && json_object_get(o, "ctime_ns")) {
                uint64_t ct, ino;
                if (get_uint(o, "ctime_ns", INT64_MAX, &ct) < 0 ||
                    get_uint(o, "ino", INT64_MAX, &ino) < 0)
                        return bad(err, i, "ctime_ns/ino");
                e.ctime_ns = (int64_t)ct;
                e.ino = ino;
        }
        if (e.type == COVE_ENT_CHAR || e.type == COVE_ENT_BLOCK) {
                if (get_uint(o, "rdev", UINT64_MAX >> 1, &e.rdev) < 0)
                        return bad(err, i, "rdev");
        }
        const char *jtg = get_name(o, "target", tbuf, sizeof(tbuf), &tlen, &malformed);
        if (e.type == COVE_ENT_SYMLINK) {
                if (!jtg || malformed || tlen == 0)
                        return bad(err, i, "symlink target");
                e.target = (char *)jtg;
        } else if (jtg) {
                return bad(err, i, "target on a non-symlink");
        }
        /* Parent: an earlier directory entry (so a restore never follows a symlink). */
        if (!root) {
                char parent[COVE_PATH_MAX + 1];
                const char *slash = strrchr(path, '/');
                if (slash)
                        snprintf(parent, sizeof(parent), "%.*s", (int)(slash - path), path);
                else
                        strcpy(parent, ".");
                json_t *pt = json_object_get(seen, parent);
                if (!pt || json_integer_value(pt) != COVE_ENT_DIR)
                        return bad(err, i, "parent is not an earlier directory");
                if (json_object_get(seen, path))
                        return bad(err, i, "duplicate path");
        }
        const char *jl = get_name(o, "link", lbuf, sizeof(lbuf), &llen, &malformed);
        if (jl) {
                if (e.type != COVE_ENT_FILE || malformed || !path_ok(jl, llen))
                        return bad(err, i, "link");
                json_t *lt = json_object_get(seen, jl);
                /* 100 + type marks a file that is itself a link: links point at data. */
                if (!lt || json_integer_value(lt) != COVE_ENT_FILE)
                        return bad(err, i, "link target is not an earlier file with data");
                e.link = (char *)jl;
        }
        /* nocheck: keys are paths, which may be any bytes but NUL */
        if (json_object_set_new_nocheck(seen, path, json_integer(e.link ? 100 + e.type : e.type)))
                return cove_err_set(err, ENOMEM, "parse manifest");
        if (e.type == COVE_ENT_FILE && !e.link) {
                if (get_uint(o, "size", INT64_MAX, &e.size) < 0)
                        return bad(err, i, "size");
        }
        struct cove_mentry *ne = cove_manifest_add(m, &e);
        if (!ne)
                return cove_err_set(err, ENOMEM, "parse manifest");
        json_t *xs = json_object_get(o, "xattrs");
        if (xs) {
                if (!json_is_array(xs) || json_array_size(xs) > COVE_XATTRS_MAX)
                        return bad(err, i, "xattrs");
                for (size_t j = 0; j < json_array_size(xs); j++) {
                        json_t *x = json_array_get(xs, j);
                        json_t *xn = json_array_get(x, 0), *xv = json_array_get(x, 1);
                        char nbuf[COVE_XATTR_NAME_MAX + 1];
                        if (json_is_array(x) && json_array_size(x) == 3 && json_is_null(xn)) {
                                /* a name that is not UTF-8, in hex */
                                json_t *xh = json_array_get(x, 2);
                                size_t nl = json_is_string(xh) ? json_string_length(xh) / 2 : 0;
                                if (!json_is_string(xh) || json_string_length(xh) % 2 || nl == 0 ||
                                    nl > COVE_XATTR_NAME_MAX ||
                                    unhex(json_string_value(xh), nl, (uint8_t *)nbuf) < 0)
                                        return bad(err, i, "xattr");
                                nbuf[nl] = '\0';
                                if (strlen(nbuf) != nl)
                                        return bad(err, i, "xattr");
                        } else if (!json_is_array(x) || json_array_size(x) != 2 ||
                                   !json_is_string(xn) || json_string_length(xn) == 0 ||
                                   json_string_length(xn) > COVE_XATTR_NAME_MAX ||
                                   strlen(json_string_value(xn)) != json_string_length(xn)) {
                                return bad(err, i, "xattr");
                        } else {
                                strcpy(nbuf, json_string_value(xn));
                        }
                        if (!json_is_string(xv) || json_string_length(xv) % 2 ||
                            json_string_length(xv) / 2 > COVE_XATTR_VALUE_MAX)
                                return bad(err, i, "xattr");
                        size_t vl = json_string_length(xv) / 2;
                        uint8_t *val = malloc(vl ? vl : 1);
                        if (!val)
                                return cove_err_set(err, ENOMEM, "parse manifest");
                        if (unhex(json_string_value(xv), vl, val) < 0) {
                                free(val);
                                return bad(err, i, "xattr value is not hex");
                        }
                        int rc = cove_mentry_add_xattr(ne, nbuf, val, vl);
                        free(val);
                        if (rc < 0)
                                return cove_err_set(err, ENOMEM, "parse manifest");
                }
        }
        json_t *cs = json_object_get(o, "chunks");
        if (e.type != COVE_ENT_FILE || e.link) {
                if (cs)
                        return bad(err, i, "chunks on an entry without data");
                return 0;
        }
        if (!json_is_array(cs))
                return bad(err, i, "chunks");
        if (json_array_size(cs) > COVE_MANIFEST_MAX_CHUNKS - m->nchunks)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "manifest: too many chunks");
        uint64_t total = 0;
        for (size_t j = 0; j < json_array_size(cs); j++) {
                json_t *c = json_array_get(cs, j);
                json_t *cid = json_array_get(c, 0), *cl = json_array_get(c, 1);
                if (!json_is_array(c) || json_array_size(c) != 2 || !json_is_integer(cl) ||
                    json_integer_value(cl) <= 0)
                        return bad(err, i, "chunk");
                uint64_t len = (uint64_t)json_integer_value(cl);
                uint8_t id[32];
                int hole = json_is_null(cid);
                if (!hole) {
                        if (!json_is_string(cid) || json_string_length(cid) != 64 ||
                            unhex(json_string_value(cid), 32, id) < 0)
                                return bad(err, i, "chunk id");
                        if (len > COVE_CHUNK_MAX_LEN)
                                return bad(err, i, "chunk longer than any chunker makes");
                }
                if (len > e.size - total)
                        return bad(err, i, "chunks exceed the file size");
                total += len;
                if (cove_manifest_add_chunk(m, hole ? NULL : id, len, hole) < 0)
                        return cove_err_set(err, ENOMEM, "parse manifest");
        }
        if (total != e.size)
                return bad(err, i, "chunks do not add up to the file size");
        return 0;
}

int cove_manifest_parse(const void *buf, size_t len, struct cove_manifest *m, struct cove_err *err)
{
        cove_manifest_init(m);
        if (len > COVE_MANIFEST_MAX_BYTES)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "manifest larger than %u bytes",
                                     COVE_MANIFEST_MAX_BYTES);
        json_error_t jerr;
        json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!root)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "manifest: invalid JSON: %s",
                                     jerr.text);
        json_t *seen = json_object();
        int rc = -1;
        json_t *fmt = json_object_get(root, "format"), *ents = json_object_get(root, "entries");
        json_t *kind = json_object_get(root, "kind"), *ca = json_object_get(root, "created_at");
        if (!json_is_object(root) || !json_is_integer(fmt) ||
            json_integer_value(fmt) != COVE_MANIFEST_FORMAT) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "manifest: unsupported format");
                goto out;
        }
        if (get_id(root, "snapshot", 0, m->id) < 0 || get_id(root, "tenant", 0, m->tenant) < 0 ||
            get_id(root, "parent", 1, m->parent) < 0 || !json_is_string(kind) ||
            (strcmp(json_string_value(kind), "files") &&
             strcmp(json_string_value(kind), "memory")) ||
            !json_is_integer(ca) || get_uint(root, "size_bytes", INT64_MAX, &m->size_bytes) < 0 ||
            get_uint(root, "new_bytes", INT64_MAX, &m->new_bytes) < 0 || !json_is_array(ents)) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "manifest: bad header fields");
                goto out;
        }
        strcpy(m->kind, json_string_value(kind));
        m->created_at = json_integer_value(ca);
        size_t n = json_array_size(ents);
        if (n == 0 || n > COVE_MANIFEST_MAX_ENTRIES || (!strcmp(m->kind, "memory") && n != 1)) {
                cove_err_setk(err, COVE_E_LIMIT, 0, "manifest: %zu entries", n);
                goto out;
        }
        if (!seen) {
                cove_err_set(err, ENOMEM, "parse manifest");
                goto out;
        }
        for (size_t i = 0; i < n; i++)
                if (parse_entry(m, json_array_get(ents, i), i, seen, err) < 0)
                        goto out;
        rc = 0;
out:
        json_decref(seen);
        json_decref(root);
        return rc;
}
