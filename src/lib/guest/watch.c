/* cove-guest watches: one inotify instance per watch request, so unwatch is a close() and
 * two watches of the same directory never share a descriptor. Recursive watches add every
 * subdirectory, including ones created or moved in later. Bounded: G_MAX_WATCHES requests,
 * G_MAX_WATCH_DIRS directories in all. Events (paths under the path the node asked for):
 *   create  IN_CREATE, IN_MOVED_TO (the new name)
 *   write   IN_MODIFY (consecutive repeats for one path in one read are sent once)
 *   remove  IN_DELETE, or the watched path itself deleted
 *   rename  IN_MOVED_FROM (the old name)
 * A write through the files op (a temporary name renamed over the final one) is reported
 * by the writer itself (g_watch_notify: "create" when new, then "write", for the final
 * name); the temporary name's own events are never sent. */
#include "guest/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define WATCH_MAX_DEPTH 64
#define DIR_MASK                                                                                   \
        (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF |        \
         IN_EXCL_UNLINK)

struct wdir {
        int wd;
        char *path;
};

struct gwatch {
        uint32_t id; /* the watch request id: EVENT frames carry it */
        int fd;      /* inotify */
        bool recursive;
        bool dead; /* unwatched; freed after the current epoll batch */
        char root[G_PATH_MAX];
        int root_wd;
        uint32_t tmp_cookie; /* of a temporary name moved away (its IN_MOVED_TO is hidden) */
        struct wdir *dirs;
        size_t ndirs, cap;
        struct gsrc src;
};

static int add_dir(struct cove_guest *g, struct gwatch *w, const char *watch_at, const char *path,
                   uint32_t extra)
{
        if (g->watch_dirs >= G_MAX_WATCH_DIRS) {
                errno = ENOSPC;
                return -1;
        }
        int wd = inotify_add_watch(w->fd, watch_at, DIR_MASK | extra);
        if (wd < 0)
                return -1;
        for (size_t i = 0; i < w->ndirs; i++) { /* already known (a race with a rescan) */
                if (w->dirs[i].wd == wd)
                        return wd;
        }
        if (w->ndirs == w->cap) {
                size_t nc = w->cap ? w->cap * 2 : 16;
                struct wdir *nd = realloc(w->dirs, nc * sizeof(*nd));
                if (!nd) {
                        inotify_rm_watch(w->fd, wd);
                        errno = ENOMEM;
                        return -1;
                }
                w->dirs = nd;
                w->cap = nc;
        }
        char *p = strdup(path);
        if (!p) {
                inotify_rm_watch(w->fd, wd);
                errno = ENOMEM;
                return -1;
        }
        w->dirs[w->ndirs++] = (struct wdir){wd, p};
        g->watch_dirs++;
        return wd;
}

static void drop_dir(struct cove_guest *g, struct gwatch *w, size_t i)
{
        free(w->dirs[i].path);
        w->dirs[i] = w->dirs[--w->ndirs];
        g->watch_dirs--;
}

static int send_event(struct cove_guest *g, struct gwatch *w, const char *type, const char *path,
                      struct cove_err *err)
{
        return g_send_json(g, COVE_F_EVENT, w->id,
                           json_pack("{s:s, s:s}", "type", type, "path", path), err);
}

/* Add watches for every directory below path (takes dfd). With emit, entries found are
 * reported as created (a directory that appeared after the watch started). Returns -1 with
 * errno only when the G_MAX_WATCH_DIRS bound is hit; -2 on a channel failure. */
static int add_tree(struct cove_guest *g, struct gwatch *w, int dfd, const char *path, int depth,
                    bool emit, struct cove_err *err)
{
        DIR *d = fdopendir(dfd);
        if (!d) {
                close(dfd);
                return 0;
        }
        int r = 0;
        struct dirent *de;
        while (r == 0 && (de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                char sub[G_PATH_MAX + 260];
                snprintf(sub, sizeof(sub), "%s%s%s", path, strcmp(path, "/") ? "/" : "",
                         de->d_name);
                if (strlen(sub) >= G_PATH_MAX)
                        continue;
                if (emit && send_event(g, w, "create", sub, err) < 0) {
                        r = -2;
                        break;
                }
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                    !S_ISDIR(st.st_mode) || depth <= 1)
                        continue;
                int sfd =
                    openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sfd < 0)
                        continue;
                /* watch first, then list: what appears in between is seen by one or both */
                char at[64];
                snprintf(at, sizeof(at), "/proc/self/fd/%d", sfd);
                if (add_dir(g, w, at, sub, IN_ONLYDIR) < 0 &&
                    add_dir(g, w, sub, sub, IN_ONLYDIR | IN_DONT_FOLLOW) < 0) {
                        if (errno == ENOSPC) {
                                close(sfd);
                                r = -1;
                                break;
                        }
                }
                r = add_tree(g, w, sfd, sub, depth - 1, emit, err);
        }
        int en = errno;
        closedir(d);
        errno = en;
        return r;
}

static void watch_release(struct cove_guest *g, struct gwatch *w)
{
        while (w->ndirs)
                drop_dir(g, w, w->ndirs - 1);
        if (w->fd >= 0)
                close(w->fd);
        w->fd = -1;
        w->dead = true;
}

int g_op_watch(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        const char *in;
        bool recursive = false;
        if (g_get_str(req, "path", true, &in, &e) < 0 ||
            g_get_bool(req, "recursive", &recursive, &e) < 0)
                return g_reply_err(g, id, &e, err);
        size_t slot = G_MAX_WATCHES;
        for (size_t i = 0; i < G_MAX_WATCHES; i++) {
                if (g->watches[i] && !g->watches[i]->dead && g->watches[i]->id == id) {
                        cove_err_setk(&e, COVE_E_CONFLICT, 0, "watch: id %u in use", id);
                        return g_reply_err(g, id, &e, err);
                }
                if (!g->watches[i] && slot == G_MAX_WATCHES)
                        slot = i;
        }
        if (slot == G_MAX_WATCHES) {
                cove_err_setk(&e, COVE_E_LIMIT, 0, "watch: at most %d watches", G_MAX_WATCHES);
                return g_reply_err(g, id, &e, err);
        }
        struct gwatch *w = calloc(1, sizeof(*w));
        if (!w)
                return cove_err_set(err, ENOMEM, "watch");
        w->id = id;
        w->recursive = recursive;
        w->src = (struct gsrc){GS_WATCH, w};
        w->fd = -1;
        g->watches[slot] = w;
        if (g_resolve_path(g, in, NULL, w->root, &e) < 0)
                goto fail;
        /* resolve inside the root (openat2 wall), then watch what that fd names */
        int dfd = g_open_in_root(g, w->root, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
        struct stat st;
        if (dfd < 0 || fstat(dfd, &st) < 0) {
                cove_err_setk(&e, g_errno_kind(errno), errno, "watch %s", w->root);
                if (dfd >= 0)
                        close(dfd);
                goto fail;
        }
        w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (w->fd < 0) {
                cove_err_setk(&e, g_errno_kind(errno), errno, "watch %s: inotify", w->root);
                close(dfd);
                goto fail;
        }
        char at[64];
        snprintf(at, sizeof(at), "/proc/self/fd/%d", dfd);
        uint32_t extra = S_ISDIR(st.st_mode) ? 0 : IN_DELETE_SELF;
        w->root_wd = add_dir(g, w, at, w->root, extra);
        if (w->root_wd < 0)
                w->root_wd = add_dir(g, w, w->root, w->root, extra | IN_DONT_FOLLOW);
        if (w->root_wd < 0) {
                cove_err_setk(&e, g_errno_kind(errno), errno, "watch %s", w->root);
                close(dfd);
                goto fail;
        }
        if (recursive && S_ISDIR(st.st_mode)) {
                int r = add_tree(g, w, dfd, w->root, WATCH_MAX_DEPTH, false, err);
                if (r == -2)
                        return -1;
                if (r < 0) {
                        cove_err_setk(&e, COVE_E_LIMIT, 0,
                                      "watch %s: more than %d directories to watch", w->root,
                                      G_MAX_WATCH_DIRS);
                        goto fail;
                }
        } else {
                close(dfd);
        }
        if (g_epoll_add(g, w->fd, EPOLLIN, &w->src) < 0) {
                cove_err_setk(&e, COVE_E_INTERNAL, errno, "watch %s: epoll", w->root);
                goto fail;
        }
        return g_reply_ok(g, id, NULL, err);
fail:
        watch_release(g, w);
        return g_reply_err(g, id, &e, err);
}

int g_op_unwatch(struct cove_guest *g, uint32_t id, json_t *req, struct cove_err *err)
{
        struct cove_err e = {0};
        int64_t wid;
        if (g_get_int(req, "watch_id", true, 1, UINT32_MAX, &wid, &e) < 0)
                return g_reply_err(g, id, &e, err);
        for (size_t i = 0; i < G_MAX_WATCHES; i++) {
                struct gwatch *w = g->watches[i];
                if (w && !w->dead && w->id == (uint32_t)wid) {
                        watch_release(g, w);
                        return g_reply_ok(g, id, NULL, err);
                }
        }
        cove_err_setk(&e, COVE_E_NOT_FOUND, 0, "unwatch: no watch %lld", (long long)wid);
        return g_reply_err(g, id, &e, err);
}

int g_is_write_tmp(const char *name)
{
        size_t n = strlen(name);
        if (n < 16 || name[0] != '.' || strncmp(name + n - 14, ".cove-", 6) != 0)
                return 0;
        for (size_t i = n - 8; i < n; i++)
                if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
                        return 0;
        return 1;
}

int g_watch_notify(struct cove_guest *g, const char *path, bool created, struct cove_err *err)
{
        const char *slash = strrchr(path, '/');
        if (!slash)
                return 0;
        size_t pl = slash == path ? 1 : (size_t)(slash - path);
        for (size_t i = 0; i < G_MAX_WATCHES; i++) {
                struct gwatch *w = g->watches[i];
                if (!w || w->dead || w->fd < 0)
                        continue;
                bool covered = false;
                for (size_t k = 0; k < w->ndirs && !covered; k++)
                        covered = strlen(w->dirs[k].path) == pl &&
                                  strncmp(w->dirs[k].path, path, pl) == 0;
                if (!covered)
                        continue;
                if (created && send_event(g, w, "create", path, err) < 0)
                        return -1;
                if (send_event(g, w, "write", path, err) < 0)
                        return -1;
        }
        return 0;
}

static struct wdir *find_wd(struct gwatch *w, int wd)
{
        for (size_t i = 0; i < w->ndirs; i++)
                if (w->dirs[i].wd == wd)
                        return &w->dirs[i];
        return NULL;
}

/* A directory moved away: its watches (and those below) now name stale paths. */
static void forget_subtree(struct cove_guest *g, struct gwatch *w, const char *path)
{
        size_t pl = strlen(path);
        for (size_t i = 0; i < w->ndirs;) {
                const char *p = w->dirs[i].path;
                if (w->dirs[i].wd != w->root_wd && strncmp(p, path, pl) == 0 &&
                    (p[pl] == 0 || p[pl] == '/')) {
                        inotify_rm_watch(w->fd, w->dirs[i].wd);
                        drop_dir(g, w, i);
                } else {
                        i++;
                }
        }
}

int g_watch_event(struct cove_guest *g, struct gsrc *s, struct cove_err *err)
{
        struct gwatch *w = s->obj;
        if (w->dead || w->fd < 0)
                return 0;
        /* aligned for struct inotify_event */
        char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
        ssize_t n = read(w->fd, buf, sizeof(buf));
        if (n <= 0)
                return 0;
        char last[G_PATH_MAX + 260] = "";
        const char *last_type = NULL;
        for (char *p = buf; p < buf + n;) {
                struct inotify_event *ev = (struct inotify_event *)p;
                p += sizeof(*ev) + ev->len;
                if (ev->mask & IN_Q_OVERFLOW) {
                        if (g->log)
                                cove_warn(g->log, "guest.watch", "watch %u: events lost", w->id);
                        continue;
                }
                struct wdir *d = find_wd(w, ev->wd);
                if (!d)
                        continue;
                if (ev->mask & IN_IGNORED) {
                        drop_dir(g, w, (size_t)(d - w->dirs));
                        continue;
                }
                if (ev->len && ev->name[0] && g_is_write_tmp(ev->name)) {
                        if (ev->mask & IN_MOVED_FROM)
                                w->tmp_cookie = ev->cookie;
                        continue;
                }
                if ((ev->mask & IN_MOVED_TO) && ev->cookie && ev->cookie == w->tmp_cookie) {
                        w->tmp_cookie = 0;
                        continue; /* the writer reported it (g_watch_notify) */
                }
                char path[G_PATH_MAX + 260];
                if (ev->len && ev->name[0])
                        snprintf(path, sizeof(path), "%s%s%s", d->path,
                                 strcmp(d->path, "/") ? "/" : "", ev->name);
                else
                        snprintf(path, sizeof(path), "%s", d->path);
                const char *type = NULL;
                bool isdir = ev->mask & IN_ISDIR;
                if (ev->mask & (IN_CREATE | IN_MOVED_TO))
                        type = "create";
                else if (ev->mask & IN_MODIFY)
                        type = "write";
                else if (ev->mask & IN_DELETE)
                        type = "remove";
                else if (ev->mask & IN_DELETE_SELF)
                        type = ev->wd == w->root_wd ? "remove" : NULL;
                else if (ev->mask & IN_MOVED_FROM)
                        type = "rename";
                if (!type)
                        continue;
                if (last_type == type && strcmp(last, path) == 0)
                        continue;
                last_type = type;
                snprintf(last, sizeof(last), "%s", path);
                if (send_event(g, w, type, path, err) < 0)
                        return -1;
                if (isdir && (ev->mask & IN_MOVED_FROM))
                        forget_subtree(g, w, path);
                if (isdir && w->recursive && (ev->mask & (IN_CREATE | IN_MOVED_TO)) &&
                    strlen(path) < G_PATH_MAX) {
                        int sfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sfd < 0)
                                continue;
                        char at[64];
                        snprintf(at, sizeof(at), "/proc/self/fd/%d", sfd);
                        if (add_dir(g, w, at, path, IN_ONLYDIR) < 0 &&
                            add_dir(g, w, path, path, IN_ONLYDIR | IN_DONT_FOLLOW) < 0) {
                                close(sfd);
                                continue;
                        }
                        /* what was created inside before the watch existed */
                        if (add_tree(g, w, sfd, path, WATCH_MAX_DEPTH, true, err) == -2)
                                return -1;
                        last_type = NULL;
                }
        }
        return 0;
}

void g_watches_sweep(struct cove_guest *g)
{
        for (size_t i = 0; i < G_MAX_WATCHES; i++) {
                struct gwatch *w = g->watches[i];
                if (w && w->dead) {
                        free(w->dirs);
                        free(w);
                        g->watches[i] = NULL;
                }
        }
}

void g_watches_free(struct cove_guest *g)
{
        for (size_t i = 0; i < G_MAX_WATCHES; i++)
                if (g->watches[i])
                        watch_release(g, g->watches[i]);
        g_watches_sweep(g);
}
