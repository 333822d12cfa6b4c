/* cove-guest files: path rules, read (streamed), atomic write (streamed, temp + fsync +
 * rename), stat, list, mkdir -p, move and remove. Every path is normalised lexically
 * (".." never climbs above "/") and opened with openat2(RESOLVE_IN_ROOT |
 * RESOLVE_NO_MAGICLINKS) from "/": a second wall after pivot_root, so neither ".." nor
 * symlinks nor /proc magic links lead anywhere else. Operations on a final component use
 * the *at() calls on its resolved parent and never follow a final symlink, except read,
 * which reads what a symlink points at (still inside the root). */
#include "guest/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/cleanup.h"
#include "util/util.h"

#define LIST_MAX_DEPTH 64

int g_resolve_path(struct cove_guest *g, const char *in, const char *user, char *out,
                   struct cove_err *e)
{
        (void)g;
        size_t len = strlen(in);
        if (len == 0)
                return cove_err_setk(e, COVE_E_BAD_REQUEST, EINVAL, "path is empty");
        if (len > G_PATH_MAX)
                return cove_err_setk(e, COVE_E_BAD_REQUEST, ENAMETOOLONG,
                                     "path of %zu bytes (at most %d)", len, G_PATH_MAX);
        char full[2 * G_PATH_MAX + 2];
        if (in[0] == '/') {
                snprintf(full, sizeof(full), "%s", in);
        } else {
                struct guser u;
                if (g_user_lookup(user, &u, e) < 0)
                        return -1;
                snprintf(full, sizeof(full), "%s/%s", u.home, in);
        }
        /* lexical normalisation: components, "." dropped, ".." pops (not above /) */
        size_t o = 0;
        char *save = NULL;
        for (char *c = strtok_r(full, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
                if (strcmp(c, ".") == 0)
                        continue;
                if (strcmp(c, "..") == 0) {
                        while (o > 0 && out[o - 1] != '/')
                                o--;
                        if (o > 0)
                                o--;
                        continue;
                }
                size_t cl = strlen(c);
                if (cl > 255)
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, ENAMETOOLONG, "path %.200s",
                                             in);
                if (o + 1 + cl >= G_PATH_MAX)
                        return cove_err_setk(e, COVE_E_BAD_REQUEST, ENAMETOOLONG, "path %.200s",
                                             in);
                out[o++] = '/';
                memcpy(out + o, c, cl);
                o += cl;
        }
        if (o == 0)
                out[o++] = '/';
        out[o] = 0;
        return 0;
}

/* open(2) of an absolute, normalised path inside the root. Returns an fd or -1 (errno). */
int g_open_in_root(struct cove_guest *g, const char *abs, int flags, mode_t mode)
{
        struct open_how how = {.flags = (uint64_t)flags,
                               .mode = (flags & O_CREAT) ? mode : 0,
                               .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
        int fd = (int)syscall(SYS_openat2, g->rootfd, abs, &how, sizeof(how));
        if (fd < 0 && errno == ENOSYS) /* kernels before 5.6: rely on pivot_root alone */
                fd = openat(AT_FDCWD, abs, flags, mode);
        return fd;
}

/* Open the parent of abs (a directory, O_RDONLY so it can be fsynced) and copy the final
 * component to name. "/" has no parent: EINVAL. */
static int open_parent(struct cove_guest *g, const char *abs, char name[256])
{
        const char *slash = strrchr(abs, '/');
        if (!slash || !slash[1]) {
                errno = EINVAL;
                return -1;
        }
        snprintf(name, 256, "%s", slash + 1);
        char parent[G_PATH_MAX];
        size_t pl = (size_t)(slash - abs);
        if (pl == 0)
                pl = 1;
        memcpy(parent, abs, pl);
        parent[pl] = 0;
        return g_open_in_root(g, parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
}

static const char *type_name(mode_t m)
{
        return S_ISREG(m) ? "file" : S_ISDIR(m) ? "dir" : S_ISLNK(m) ? "symlink" : "other";
}

/* Names of the last uid and gid seen (a listing is mostly one owner). */
struct idcache {
        bool hu, hg;
        uid_t uid;
        gid_t gid;
        char user[64], group[64];
};

#define META_PREFIX "user.e2b." /* file metadata (E2B's X-Metadata-*) lives in these xattrs */
#define META_MAX 32             /* keys on a file */
#define META_VAL_MAX 1024

/* The user.e2b.* xattrs of dfd/name as {key: value}, NULL when none (or unreadable). */
static json_t *meta_json(int dfd, const char *name)
{
        char at[G_PATH_MAX + 64], names[8192];
        snprintf(at, sizeof(at), "/proc/self/fd/%d/%s", dfd, name);
        ssize_t n = llistxattr(at, names, sizeof(names));
        if (n <= 0)
                return NULL;
        json_t *o = NULL;
        for (char *k = names; k < names + n && json_object_size(o) < META_MAX; k += strlen(k) + 1) {
                if (strncmp(k, META_PREFIX, strlen(META_PREFIX)) != 0 || !k[strlen(META_PREFIX)])
                        continue;
                char v[META_VAL_MAX + 1];
                ssize_t vl = lgetxattr(at, k, v, META_VAL_MAX);
                if (vl < 0)
                        continue;
                v[vl] = 0;
                if (strlen(v) != (size_t)vl)
                        continue; /* not text */
                if (!o)
                        o = json_object();
                json_object_set_new(o, k + strlen(META_PREFIX), json_string(v));
        }
        return o;
}

/* An entry; with dfd >= 0 (the directory holding name) also a symlink's target and the
 * file's metadata. */
static json_t *entry_json_at(int dfd, const char *name, const char *path, const struct stat *st,
                             struct idcache *ic)
{
        char ts[40];
        cove_rfc3339((int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000, ts,
                     sizeof(ts));
        struct idcache local = {0};
        if (!ic)
                ic = &local;
        if (!ic->hu || ic->uid != st->st_uid) {
                g_id_name(false, st->st_uid, ic->user, sizeof(ic->user));
                ic->uid = st->st_uid;
                ic->hu = true;
        }
        if (!ic->hg || ic->gid != st->st_gid) {
                g_id_name(true, st->st_gid, ic->group, sizeof(ic->group));
                ic->gid = st->st_gid;
                ic->hg = true;
        }
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:i, s:s, s:s, s:s}", "name", name, "path",
                              path, "type", type_name(st->st_mode), "size", (json_int_t)st->st_size,
                              "mode", (int)(st->st_mode & 07777), "mtime", ts, "owner", ic->user,
                              "group", ic->group);
        if (dfd >= 0 && S_ISLNK(st->st_mode)) {
                char t[G_PATH_MAX];
                ssize_t n = readlinkat(dfd, name, t, sizeof(t) - 1);
                if (n >= 0) {
                        t[n] = 0;
                        json_object_set_new(o, "link", json_string(t));
                }
        } else if (dfd >= 0 && (S_ISREG(st->st_mode) || S_ISDIR(st->st_mode))) {
                json_t *m = meta_json(dfd, name);
                if (m)
                        json_object_set_new(o, "metadata", m);
        }
        return o;
}

static json_t *entry_json(const char *name, const char *path, const struct stat *st)
{
        return entry_json_at(-1, name, path, st, NULL);
}

static const char *base_name(const char *abs)
{
        const char *s = strrchr(abs, '/');
        return s && s[1] ? s + 1 : "/";
}

/* Read a path field: a string without NUL, resolved into out. */
static int get_path(struct cove_guest *g, json_t *req, const char *key, char *out,
                    struct cove_err *e)
{
        json_t *v = json_object_get(req, key);
        if (!json_is_string(v))
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "field \"%s\" must be a string",
                                     key);
        if (json_string_length(v) != strlen(json_string_value(v)))
                return cove_err_setk(e, COVE_E_BAD_REQUEST, 0, "field \"%s\" contains NUL", key);
        const char *user = NULL;
        json_t *u = json_object_get(req, "user");
        if (json_is_string(u))
                user = json_string_value(u);
        return g_resolve_path(g, json_string_value(v), user, out, e);
}

/* Optional "user" of a file op: who owns what write/mkdir create. */
static int get_owner(json_t *req, bool *chown_it, uid_t *uid, gid_t *gid, struct cove_err *e)
{
        const char *spec;
        *chown_it = false;
        if (g_get_str(req, "user", false, &spec, e) < 0)
                return -1;
        if (!spec)
                return 0;
        struct guser u;
        if (g_user_lookup(spec, &u, e) < 0)
                return -1;
        *chown_it = u.uid != getuid() || u.gid != getgid();
        *uid = u.uid;
        *gid = u.gid;
        return 0;
}

static int reply_errno(struct cove_guest *g, uint32_t id, int en, const char *what,
                       const char *path, struct cove_err *err)
{
        struct cove_err e;
        cove_err_setk(&e, g_errno_kind(en), en, "%s %s", what, path);
        return g_reply_err(g, id, &e, err);
}

/* ---- read ---- */

/* A download in progress. Reads are pumped from the event loop one chunk at a time (never
 * in one go), so requests, process output and other transfers keep flowing while a large
 * or slow one runs; with a window (the node's "window" field and WINDOW frames) a read
 * sends no more than the node said it takes, and CANCEL ends it. */
struct gread {
        uint32_t id;
        int fd;
        uint64_t left;   /* bytes still to send at most (size bound) */
        uint64_t credit; /* bytes the node accepts now; UINT64_MAX without a window */
        bool sized;      /* left is the file's size: its last chunk carries END */
};

/* Filesystems whose st_size says nothing about what a read returns (sysfs reports 4096,
 * procfs 0): such files are read to end of file, at most G_READ_UNSIZED_MAX bytes. */
static bool size_unreliable(int fd, const struct stat *st)
{
        if (st->st_size == 0)
                return true;
        struct statfs sf;
        if (fstatfs(fd, &sf) < 0)
                return false;
        switch ((unsigned long)sf.f_type) {
        case 0x9fa0:     /* proc */
        case 0x62656572: /* sysfs */
        case 0x64626720: /* debugfs */
        case 0x74726163: /* tracefs */
        case 0x73636673: /* securityfs */
        case 0x27e0eb:   /* cgroup */
        case 0x63677270: /* cgroup2 */
        case 0x62656570: /* configfs */
        case 0xcafe4a11: /* bpf */
        case 0x6e736673: /* nsfs */
                return true;
        default:
                return false;
        }
}

static const char *kind_name(mode_t m)
{
        return S_ISCHR(m)    ? "a character device"
               : S_ISBLK(m)  ? "a block device"
               : S_ISFIFO(m) ? "a FIFO"
               : S_ISSOCK(m) ? "a socket"
                             : "not a regular file";
}

static void read_free(struct gread *r)
{
        if (r->fd >= 0)
                close(r->fd);
        free(r);
}

int g_op_read(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        char path[G_PATH_MAX];
        int64_t window = 0;
        if (get_path(g, req, "path", path, &e) < 0 ||
            g_get_int(req, "window", false, 1, UINT32_MAX, &window, &e) < 0)
                return g_reply_err(g, id, &e, err);
        size_t slot = G_MAX_READS;
        for (size_t i = 0; i < G_MAX_READS; i++) {
                if (g->reads[i] && g->reads[i]->id == id) {
                        cove_err_setk(&e, COVE_E_CONFLICT, 0, "read: request id %u in use", id);
                        return g_reply_err(g, id, &e, err);
                }
                if (!g->reads[i] && slot == G_MAX_READS)
                        slot = i;
        }
        if (slot == G_MAX_READS) {
                cove_err_setk(&e, COVE_E_LIMIT, 0, "read: %d downloads already in progress",
                              G_MAX_READS);
                return g_reply_err(g, id, &e, err);
        }
        /* look before opening: opening a device or a FIFO can block or act (a tape rewinds,
         * /dev/tty without a terminal fails), so only what O_PATH shows as a regular file is
         * opened, through the very inode O_PATH found */
        cleanup_close int pfd = g_open_in_root(g, path, O_PATH | O_CLOEXEC, 0);
        struct stat st;
        if (pfd < 0 || fstat(pfd, &st) < 0)
                return reply_errno(g, id, errno, "read", path, err);
        if (S_ISDIR(st.st_mode))
                return reply_errno(g, id, EISDIR, "read", path, err);
        if (!S_ISREG(st.st_mode)) {
                cove_err_setk(&e, COVE_E_BAD_REQUEST, 0,
                              "read %s: %s; only regular files can be read", path,
                              kind_name(st.st_mode));
                return g_reply_err(g, id, &e, err);
        }
        char self[64];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", pfd);
        int fd = open(self, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        struct stat st2;
        if (fd < 0 && errno == ENOENT) /* no /proc: open the path again, same inode or no */
                fd = g_open_in_root(g, path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0);
        if (fd < 0 || fstat(fd, &st2) < 0) {
                int en = errno;
                if (fd >= 0)
                        close(fd);
                return reply_errno(g, id, en, "read", path, err);
        }
        if (st2.st_dev != st.st_dev || st2.st_ino != st.st_ino || !S_ISREG(st2.st_mode)) {
                close(fd);
                cove_err_setk(&e, COVE_E_CONFLICT, 0, "read %s: replaced while opened", path);
                return g_reply_err(g, id, &e, err);
        }
        struct gread *r = calloc(1, sizeof(*r));
        if (!r) {
                close(fd);
                return cove_err_set(err, ENOMEM, "read");
        }
        r->id = id;
        r->fd = fd;
        r->sized = !size_unreliable(fd, &st2);
        r->left = r->sized ? (uint64_t)st2.st_size : G_READ_UNSIZED_MAX;
        r->credit = window > 0 ? (uint64_t)window : UINT64_MAX;
        /* "size" is what the node gets at most: a regular file is cut at the size it had
         * when opened (one that shrinks ends early with an empty END); a pseudo-file is read
         * to its end, at most G_READ_UNSIZED_MAX bytes */
        if (g_reply_ok(g, id,
                       json_pack("{s:I, s:i, s:b}", "size", (json_int_t)r->left, "mode",
                                 (int)(st2.st_mode & 07777), "sized", r->sized),
                       err) < 0) {
                read_free(r);
                return -1;
        }
        g->reads[slot] = r;
        return 0;
}

int g_read_window(struct cove_guest *g, uint32_t id, const uint8_t *p, size_t n,
                  struct cove_err *err)
{
        if (n != 4)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "channel: WINDOW frame of %zu bytes (4 expected)", n);
        uint32_t more =
            ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
        if (more == 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "channel: WINDOW of 0 bytes");
        for (size_t i = 0; i < G_MAX_READS; i++) {
                struct gread *r = g->reads[i];
                if (r && r->id == id && r->credit != UINT64_MAX)
                        r->credit = r->credit + more > G_READ_CREDIT_MAX ? G_READ_CREDIT_MAX
                                                                         : r->credit + more;
        }
        return 0; /* an unknown id: the read ended already (races with END) */
}

int g_read_cancel(struct cove_guest *g, uint32_t id, size_t n, struct cove_err *err)
{
        if (n != 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "channel: CANCEL frame with a payload");
        for (size_t i = 0; i < G_MAX_READS; i++)
                if (g->reads[i] && g->reads[i]->id == id) {
                        read_free(g->reads[i]);
                        g->reads[i] = NULL;
                }
        return 0;
}

/* One chunk of every read that may send. Returns 1 when a read can send more right away,
 * 0 when all wait (for a WINDOW, or none is left), -1 with err when the channel failed. */
int g_reads_pump(struct cove_guest *g, struct cove_err *err)
{
        int more = 0;
        for (size_t i = 0; i < G_MAX_READS; i++) {
                struct gread *r = g->reads[i];
                if (!r || r->credit == 0)
                        continue;
                uint64_t want = r->left < COVE_FRAME_CHUNK ? r->left : COVE_FRAME_CHUNK;
                if (want > r->credit)
                        want = r->credit;
                size_t have = 0;
                while (have < want) {
                        ssize_t k = read(r->fd, g->chunk + have, (size_t)want - have);
                        if (k < 0 && errno == EINTR)
                                continue;
                        if (k <= 0)
                                break;
                        have += (size_t)k;
                }
                r->left -= have;
                if (r->credit != UINT64_MAX)
                        r->credit -= have;
                /* the end: the size bound reached, end of file, or a read error */
                bool end = r->left == 0 || have < want;
                if ((have || end) &&
                    g_send(g, COVE_F_DATA, end ? COVE_FF_END : 0, r->id, g->chunk, have, err) < 0)
                        return -1;
                if (end) {
                        read_free(r);
                        g->reads[i] = NULL;
                } else if (r->credit > 0) {
                        more = 1;
                }
        }
        return more;
}

void g_reads_abort(struct cove_guest *g)
{
        for (size_t i = 0; i < G_MAX_READS; i++) {
                if (g->reads[i])
                        read_free(g->reads[i]);
                g->reads[i] = NULL;
        }
}

/* ---- write ---- */

struct gwrite {
        uint32_t id;    /* request id; DATA frames with this id belong here */
        int dirfd;      /* parent directory */
        int fd;         /* temp file; -1 after an error */
        char name[256]; /* final component */
        char tmp[300];  /* temp name in the same directory */
        char path[G_PATH_MAX];
        mode_t mode;
        bool chown_it;
        uid_t uid;
        gid_t gid;
        struct cove_err e; /* first error; answered after END */
        bool failed;
        json_t *meta; /* {key: value} to set as user.e2b.* xattrs, or NULL */
        bool existed; /* the final name was there when the write began */
};

static void write_free(struct gwrite *w, bool unlink_tmp)
{
        if (w->fd >= 0)
                close(w->fd);
        if (unlink_tmp && w->tmp[0] && w->dirfd >= 0)
                unlinkat(w->dirfd, w->tmp, 0);
        if (w->dirfd >= 0)
                close(w->dirfd);
        json_decref(w->meta);
        free(w);
}

static void write_fail(struct gwrite *w, int en, const char *what)
{
        if (w->failed)
                return;
        w->failed = true;
        cove_err_setk(&w->e, g_errno_kind(en), en, "write %s: %s", w->path, what);
        if (w->fd >= 0) {
                close(w->fd);
                w->fd = -1;
        }
}

int g_op_write(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        size_t slot = G_MAX_WRITES;
        for (size_t i = 0; i < G_MAX_WRITES; i++) {
                if (g->writes[i] && g->writes[i]->id == id) {
                        cove_err_setk(&e, COVE_E_CONFLICT, 0, "write: request id %u in use", id);
                        return g_reply_err(g, id, &e, err);
                }
                if (!g->writes[i] && slot == G_MAX_WRITES)
                        slot = i;
        }
        if (slot == G_MAX_WRITES) {
                cove_err_setk(&e, COVE_E_LIMIT, 0, "write: %d uploads already in progress",
                              G_MAX_WRITES);
                return g_reply_err(g, id, &e, err);
        }
        struct gwrite *w = calloc(1, sizeof(*w));
        if (!w)
                return cove_err_set(err, ENOMEM, "write");
        w->id = id;
        w->dirfd = w->fd = -1;
        g->writes[slot] = w;
        /* from here on, errors are kept and answered once END arrives */
        int64_t mode = 0644;
        if (get_path(g, req, "path", w->path, &e) < 0 ||
            g_get_int(req, "mode", false, 0, 07777, &mode, &e) < 0 ||
            get_owner(req, &w->chown_it, &w->uid, &w->gid, &e) < 0) {
                w->failed = true;
                w->e = e;
                return 0;
        }
        w->mode = (mode_t)mode;
        json_t *meta = json_object_get(req, "metadata");
        if (meta) {
                const char *k;
                json_t *v;
                bool ok = json_is_object(meta) && json_object_size(meta) <= META_MAX;
                json_object_foreach(meta, k, v)
                {
                        ok = ok && *k && strlen(k) <= 200 && json_is_string(v) &&
                             json_string_length(v) <= META_VAL_MAX &&
                             strlen(json_string_value(v)) == json_string_length(v);
                }
                if (!ok) {
                        w->failed = true;
                        cove_err_setk(&w->e, COVE_E_BAD_REQUEST, 0,
                                      "write: metadata must be at most %d text values of at most "
                                      "%d bytes",
                                      META_MAX, META_VAL_MAX);
                        return 0;
                }
                w->meta = json_incref(meta);
        }
        w->dirfd = open_parent(g, w->path, w->name);
        if (w->dirfd < 0) {
                write_fail(w, errno, "open parent directory");
                return 0;
        }
        struct stat ost;
        w->existed = fstatat(w->dirfd, w->name, &ost, AT_SYMLINK_NOFOLLOW) == 0;
        for (int tries = 0; tries < 8; tries++) {
                uint32_t r = 0;
                cove_random(&r, sizeof(r), NULL);
                snprintf(w->tmp, sizeof(w->tmp), ".%.200s.cove-%08x", w->name, r);
                w->fd = openat(w->dirfd, w->tmp,
                               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (w->fd >= 0 || errno != EEXIST)
                        break;
        }
        if (w->fd < 0) {
                int en = errno;
                w->tmp[0] = 0;
                write_fail(w, en, "create temporary file");
        }
        return 0;
}

static int set_meta(struct gwrite *w)
{
        const char *k;
        json_t *v;
        json_object_foreach(w->meta, k, v)
        {
                char xn[256];
                snprintf(xn, sizeof(xn), META_PREFIX "%s", k);
                if (fsetxattr(w->fd, xn, json_string_value(v), json_string_length(v), 0) < 0)
                        return -1;
        }
        return 0;
}

static int write_finish(struct cove_guest *g, struct gwrite *w, struct cove_err *err)
{
        if (!w->failed) {
                if (fchmod(w->fd, w->mode) < 0)
                        write_fail(w, errno, "chmod");
                else if (w->chown_it && fchown(w->fd, w->uid, w->gid) < 0)
                        write_fail(w, errno, "chown");
                else if (set_meta(w) < 0)
                        write_fail(w, errno, "set metadata (user.e2b.* xattrs)");
                else if (fsync(w->fd) < 0)
                        write_fail(w, errno, "fsync");
        }
        if (!w->failed) {
                close(w->fd);
                w->fd = -1;
                if (renameat(w->dirfd, w->tmp, w->dirfd, w->name) < 0)
                        write_fail(w, errno, "rename");
                else
                        w->tmp[0] = 0;
                fsync(w->dirfd);
        }
        struct stat st;
        if (!w->failed && fstatat(w->dirfd, w->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                write_fail(w, errno, "stat");
        if (w->failed)
                return g_reply_err(g, w->id, &w->e, err);
        /* watchers see the write under its final name, never the temporary one */
        if (g_watch_notify(g, w->path, !w->existed, err) < 0)
                return -1;
        json_t *entry = entry_json_at(w->dirfd, w->name, w->path, &st, NULL);
        return g_reply_ok(g, w->id, json_pack("{s:o}", "entry", entry), err);
}

int g_write_data(struct cove_guest *g, uint32_t id, uint8_t flags, const uint8_t *p, size_t n,
                 bool *handled, struct cove_err *err)
{
        size_t i;
        for (i = 0; i < G_MAX_WRITES; i++)
                if (g->writes[i] && g->writes[i]->id == id)
                        break;
        *handled = i < G_MAX_WRITES;
        if (!*handled)
                return 0;
        struct gwrite *w = g->writes[i];
        if ((flags & COVE_FF_END) && (flags & COVE_FF_ABORT) && !w->failed) {
                /* the client went away: drop the temp file, keep the target as it was */
                w->failed = true;
                cove_err_setk(&w->e, COVE_E_CONFLICT, 0, "write %s: aborted", w->path);
                n = 0;
        }
        size_t off = 0;
        while (!w->failed && off < n) {
                ssize_t k = write(w->fd, p + off, n - off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        write_fail(w, errno, "write");
                        break;
                }
                off += (size_t)k;
        }
        if (!(flags & COVE_FF_END))
                return 0;
        g->writes[i] = NULL;
        int r = write_finish(g, w, err);
        write_free(w, true);
        return r;
}

void g_writes_abort(struct cove_guest *g)
{
        for (size_t i = 0; i < G_MAX_WRITES; i++) {
                if (g->writes[i])
                        write_free(g->writes[i], true);
                g->writes[i] = NULL;
        }
}

/* ---- stat, list ---- */

int g_op_stat(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        char path[G_PATH_MAX], name[256];
        if (get_path(g, req, "path", path, &e) < 0)
                return g_reply_err(g, id, &e, err);
        struct stat st;
        cleanup_close int dfd = -1;
        if (strcmp(path, "/") == 0) {
                if (fstat(g->rootfd, &st) < 0)
                        return reply_errno(g, id, errno, "stat", path, err);
                snprintf(name, sizeof(name), "/");
        } else {
                dfd = open_parent(g, path, name);
                if (dfd < 0 || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        return reply_errno(g, id, errno, "stat", path, err);
        }
        return g_reply_ok(
            g, id, json_pack("{s:o}", "entry", entry_json_at(dfd, name, path, &st, NULL)), err);
}

struct list_ctx {
        json_t *arr;
        bool over; /* more than G_LIST_MAX entries */
        struct idcache ic;
};

/* Takes dfd. Unreadable subdirectories are skipped. */
static void list_dir(int dfd, const char *dpath, int depth, struct list_ctx *lc)
{
        DIR *d = fdopendir(dfd);
        if (!d) {
                close(dfd);
                return;
        }
        struct dirent *de;
        while (!lc->over && (de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (json_array_size(lc->arr) >= G_LIST_MAX) {
                        lc->over = true;
                        break;
                }
                char path[G_PATH_MAX + 260];
                snprintf(path, sizeof(path), "%s%s%s", dpath, strcmp(dpath, "/") ? "/" : "",
                         de->d_name);
                json_array_append_new(lc->arr,
                                      entry_json_at(dirfd(d), de->d_name, path, &st, &lc->ic));
                if (S_ISDIR(st.st_mode) && depth > 1 && strlen(path) < G_PATH_MAX) {
                        int sub = openat(dirfd(d), de->d_name,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub >= 0)
                                list_dir(sub, path, depth - 1, lc);
                }
        }
        closedir(d);
}

static int cmp_entry(const void *a, const void *b)
{
        json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
        return strcmp(json_string_value(json_object_get(x, "path")),
                      json_string_value(json_object_get(y, "path")));
}

int g_op_list(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        char path[G_PATH_MAX];
        int64_t depth = 1;
        if (get_path(g, req, "path", path, &e) < 0 ||
            g_get_int(req, "depth", false, 1, LIST_MAX_DEPTH, &depth, &e) < 0)
                return g_reply_err(g, id, &e, err);
        int dfd = g_open_in_root(g, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        if (dfd < 0)
                return reply_errno(g, id, errno, "list", path, err);
        struct list_ctx lc = {.arr = json_array()};
        list_dir(dfd, path, (int)depth, &lc);
        if (lc.over) {
                json_decref(lc.arr);
                cove_err_setk(&e, COVE_E_LIMIT, 0,
                              "list %s: more than %d entries; list with a smaller depth", path,
                              G_LIST_MAX);
                return g_reply_err(g, id, &e, err);
        }
        size_t n = json_array_size(lc.arr);
        json_t **v = malloc((n ? n : 1) * sizeof(*v));
        if (!v) {
                json_decref(lc.arr);
                return cove_err_set(err, ENOMEM, "list");
        }
        for (size_t i = 0; i < n; i++)
                v[i] = json_incref(json_array_get(lc.arr, i));
        qsort(v, n, sizeof(*v), cmp_entry);
        json_array_clear(lc.arr);
        for (size_t i = 0; i < n; i++)
                json_array_append_new(lc.arr, v[i]);
        free(v);
        char *s = json_dumps(json_pack("{s:b, s:o}", "ok", 1, "entries", lc.arr), JSON_COMPACT);
        /* the answer is one frame: a listing too large for it is refused, not cut */
        if (!s || strlen(s) > COVE_FRAME_MAX) {
                free(s);
                cove_err_setk(&e, COVE_E_LIMIT, 0,
                              "list %s: answer exceeds %u bytes; list with a smaller depth", path,
                              COVE_FRAME_MAX);
                return g_reply_err(g, id, &e, err);
        }
        int r = g_send(g, COVE_F_RESP, 0, id, s, strlen(s), err);
        free(s);
        return r;
}

/* ---- mkdir, move, remove ---- */

int g_op_mkdir(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        char path[G_PATH_MAX], prefix[G_PATH_MAX];
        bool chown_it;
        uid_t uid = 0;
        gid_t gid = 0;
        if (get_path(g, req, "path", path, &e) < 0 || get_owner(req, &chown_it, &uid, &gid, &e) < 0)
                return g_reply_err(g, id, &e, err);
        cleanup_close int cur = g_open_in_root(g, "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        if (cur < 0)
                return reply_errno(g, id, errno, "mkdir", path, err);
        /* walk component by component: each prefix is re-resolved in the root, so a symlink
         * planted in the path is followed only within it */
        const char *c = path;
        while (*c) {
                while (*c == '/')
                        c++;
                if (!*c)
                        break;
                const char *end = strchrnul(c, '/');
                size_t pl = (size_t)(end - path);
                memcpy(prefix, path, pl);
                prefix[pl] = 0;
                char comp[256];
                snprintf(comp, sizeof(comp), "%.*s", (int)(end - c), c);
                int next = g_open_in_root(g, prefix, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
                if (next < 0 && errno == ENOENT) {
                        if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST)
                                return reply_errno(g, id, errno, "mkdir", prefix, err);
                        if (chown_it && fchownat(cur, comp, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
                                return reply_errno(g, id, errno, "mkdir: chown", prefix, err);
                        next = g_open_in_root(g, prefix, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
                }
                if (next < 0)
                        return reply_errno(g, id, errno, "mkdir", prefix, err);
                close(cur);
                cur = next;
                c = end;
        }
        struct stat st;
        if (fstat(cur, &st) < 0)
                return reply_errno(g, id, errno, "mkdir", path, err);
        return g_reply_ok(g, id,
                          json_pack("{s:o}", "entry", entry_json(base_name(path), path, &st)), err);
}

int g_op_move(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        char from[G_PATH_MAX], to[G_PATH_MAX], fname[256], tname[256];
        if (get_path(g, req, "from", from, &e) < 0 || get_path(g, req, "to", to, &e) < 0)
                return g_reply_err(g, id, &e, err);
        cleanup_close int fd = open_parent(g, from, fname);
        if (fd < 0)
                return reply_errno(g, id, errno, "move", from, err);
        cleanup_close int td = open_parent(g, to, tname);
        if (td < 0)
                return reply_errno(g, id, errno, "move: to", to, err);
        /* across filesystems rename fails with EXDEV: no copy, the caller decides */
        if (renameat(fd, fname, td, tname) < 0) {
                cove_err_setk(&e, g_errno_kind(errno), errno, "move %s to %s", from, to);
                return g_reply_err(g, id, &e, err);
        }
        struct stat st;
        if (fstatat(td, tname, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return reply_errno(g, id, errno, "move: stat", to, err);
        return g_reply_ok(
            g, id, json_pack("{s:o}", "entry", entry_json_at(td, tname, to, &st, NULL)), err);
}

int g_op_remove(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        char path[G_PATH_MAX], name[256];
        bool recursive = false;
        if (get_path(g, req, "path", path, &e) < 0 ||
            g_get_bool(req, "recursive", &recursive, &e) < 0)
                return g_reply_err(g, id, &e, err);
        if (strcmp(path, "/") == 0) {
                cove_err_setk(&e, COVE_E_BAD_REQUEST, EINVAL, "remove /: refused");
                return g_reply_err(g, id, &e, err);
        }
        cleanup_close int dfd = open_parent(g, path, name);
        struct stat st;
        if (dfd < 0 || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return reply_errno(g, id, errno, "remove", path, err);
        if (!S_ISDIR(st.st_mode)) {
                if (unlinkat(dfd, name, 0) < 0)
                        return reply_errno(g, id, errno, "remove", path, err);
                return g_reply_ok(g, id, NULL, err);
        }
        if (!recursive) {
                if (unlinkat(dfd, name, AT_REMOVEDIR) < 0) {
                        int en = errno;
                        if (en == ENOTEMPTY || en == EEXIST) {
                                cove_err_setk(&e, COVE_E_CONFLICT, en, "remove %s (use recursive)",
                                              path);
                                return g_reply_err(g, id, &e, err);
                        }
                        return reply_errno(g, id, en, "remove", path, err);
                }
                return g_reply_ok(g, id, NULL, err);
        }
        /* nftw works on path strings: name the tree by its parent's resolved location (the
         * kernel's view of the fd), so nothing but the final, lstat'ed component is looked
         * up again; nftw (FTW_PHYS) never follows symlinks below it. */
        char link[64], real[G_PATH_MAX + 260];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", dfd);
        ssize_t n = readlink(link, real, G_PATH_MAX - 1);
        if (n > 0 && real[0] == '/') {
                real[n] = 0;
                size_t rl = (size_t)n;
                snprintf(real + rl, sizeof(real) - rl, "%s%s", rl > 1 ? "/" : "", name);
        } else {
                snprintf(real, sizeof(real), "%s", path);
        }
        if (cove_rm_rf(real, &e) < 0) {
                cove_err_setk(&e, g_errno_kind(e.errnum), e.errnum, "remove %s", path);
                return g_reply_err(g, id, &e, err);
        }
        return g_reply_ok(g, id, NULL, err);
}
