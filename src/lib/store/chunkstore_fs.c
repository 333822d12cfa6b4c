/* Local-directory chunk store backend (store/chunkstore.h): one file per object under
 * root, written to a temp name in the same directory, made durable, renamed, directory
 * made durable. Batched puts write temps at once and make them durable in groups with one
 * syncfs(2) before and one after the renames, because an fsync per 64 KiB object (and per
 * directory) costs a journal commit + cache flush each, ~4 ms on the disks we run on. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/chunkstore.h"
#include "util/cleanup.h"
#include "util/util.h"

#define FS_BATCH_FILES 256         /* flush a batch after this many pending objects */
#define FS_BATCH_BYTES (64u << 20) /* … or this many bytes */
#define FS_PATH_MAX 4096
#define FS_SYNCFS_MIN 8 /* groups this large use two syncfs instead of fsync per file/dir */

struct fs_store {
        struct cove_chunkstore base;
        const struct cove_sysio *io;
        char root[FS_PATH_MAX];
};

struct pending {
        int fd;
        char *tmp;
        char *dst;
};

struct cove_cs_batch {
        pthread_mutex_t lock;
        struct pending *p;
        size_t n, cap;
        size_t bytes;
        int flushing;      /* groups being flushed outside the lock by put() */
        pthread_cond_t cv; /* signalled when flushing drops */
        int failed;        /* sticky errno of a failed flush: commit fails */
        char failmsg[COVE_ERR_MSG_MAX];
};

int cove_cs_name_valid(const char *name)
{
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > 255)
                return 0;
        const char *comp = name;
        for (size_t i = 0; i <= n; i++) {
                char c = name[i];
                if (c == '/' || c == '\0') {
                        size_t cl = (size_t)(name + i - comp);
                        if (cl == 0 || comp[0] == '.')
                                return 0;
                        comp = name + i + 1;
                        continue;
                }
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-' || c == '.'))
                        return 0;
        }
        return 1;
}

static int fs_path(struct fs_store *fs, const char *name, char *out, struct cove_err *err)
{
        if (!cove_cs_name_valid(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid object name");
        if ((size_t)snprintf(out, FS_PATH_MAX, "%s/%s", fs->root, name) >= FS_PATH_MAX)
                return cove_err_set(err, ENAMETOOLONG, "object %s", name);
        return 0;
}

static int fsync_dir(const struct cove_sysio *io, const char *dir, struct cove_err *err)
{
        int fd = io->open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        if (fd < 0)
                return cove_err_set(err, errno, "open directory %s", dir);
        int rc = io->fsync(fd);
        int e = errno;
        close(fd);
        if (rc < 0)
                return cove_err_set(err, e, "fsync directory %s", dir);
        return 0;
}

/* Create the directories of path's parents below root; a new directory's parent is
 * fsynced so the directory itself survives a crash before its first object does. */
static int ensure_parents(struct fs_store *fs, const char *path, struct cove_err *err)
{
        char tmp[FS_PATH_MAX];
        snprintf(tmp, sizeof(tmp), "%s", path);
        char *last = strrchr(tmp, '/');
        if (!last)
                return 0;
        *last = '\0';
        struct stat st;
        if (stat(tmp, &st) == 0 && S_ISDIR(st.st_mode))
                return 0;
        size_t rl = strlen(fs->root);
        for (char *p = tmp + rl + 1;; p++) {
                if (*p != '/' && *p != '\0')
                        continue;
                char saved = *p;
                *p = '\0';
                if (fs->io->mkdir(tmp, 0700) == 0) {
                        char *slash = strrchr(tmp, '/');
                        *slash = '\0';
                        int rc = fsync_dir(fs->io, tmp, err);
                        *slash = '/';
                        if (rc < 0)
                                return -1;
                } else if (errno != EEXIST) {
                        return cove_err_set(err, errno, "mkdir %s", tmp);
                }
                *p = saved;
                if (saved == '\0')
                        break;
        }
        return 0;
}

/* Write data to a fresh temp file next to dst; returns its fd (caller syncs, renames). */
static int write_temp(struct fs_store *fs, const char *dst, const void *data, size_t len, char *tmp,
                      struct cove_err *err)
{
        uint8_t r[8];
        char rh[17];
        if (cove_random(r, sizeof(r), err) < 0)
                return -1;
        cove_hex(r, sizeof(r), rh);
        const char *slash = strrchr(dst, '/');
        snprintf(tmp, FS_PATH_MAX, "%.*s/.tmp.%s.%s", (int)(slash - dst), dst, rh, slash + 1);
        int fd = fs->io->open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno == ENOENT) {
                if (ensure_parents(fs, dst, err) < 0)
                        return -1;
                fd = fs->io->open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        }
        if (fd < 0)
                return cove_err_set(err, errno, "create %s", tmp);
        if (cove_sysio_write_all(fs->io, fd, data, len) < 0) {
                int e = errno;
                close(fd);
                fs->io->unlink(tmp);
                return cove_err_set(err, e, "write %s", tmp);
        }
        return fd;
}

static int fs_put(struct cove_chunkstore *cs, struct cove_cs_batch *b, const char *name,
                  const void *data, size_t len, struct cove_err *err);

static void dir_of(const char *path, char *out)
{
        snprintf(out, FS_PATH_MAX, "%s", path);
        char *s = strrchr(out, '/');
        if (s)
                *s = '\0';
}

/* Make p[0..n) durable: sync the temps, rename them into place, sync the directories.
 * Small groups fdatasync each temp and fsync each directory once; larger ones use one
 * syncfs for all temps (writeback of every dirty inode + one journal commit and flush)
 * and one more after the renames. Either way a name becomes visible only once its content
 * is durable. On failure every temp not yet renamed is removed. Frees the entries. */
static int flush_pending(struct fs_store *fs, struct pending *p, size_t n, int undo,
                         struct cove_err *err)
{
        int rc = 0;
        int whole_fs = n >= FS_SYNCFS_MIN;
        size_t i = 0;
        if (whole_fs) {
                if (fs->io->syncfs(p[0].fd) < 0)
                        rc = cove_err_set(err, errno, "sync %zu objects (%s…)", n, p[0].tmp);
                else
                        i = n;
        }
        for (; !whole_fs && i < n; i++) {
                if (fs->io->fdatasync(p[i].fd) < 0) {
                        rc = cove_err_set(err, errno, "fsync %s", p[i].tmp);
                        break;
                }
        }
        size_t synced = i;
        for (i = 0; rc == 0 && i < synced; i++) {
                if (fs->io->rename(p[i].tmp, p[i].dst) < 0) {
                        rc = cove_err_set(err, errno, "rename %s", p[i].dst);
                        break;
                }
                free(p[i].tmp);
                p[i].tmp = NULL;
        }
        if (rc == 0 && whole_fs && fs->io->syncfs(p[0].fd) < 0)
                rc = cove_err_set(err, errno, "sync directories of %zu objects", n);
        /* Directories: the set is small (objects of a batch share a few hundred dirs). */
        char last[FS_PATH_MAX] = "", d[FS_PATH_MAX];
        for (size_t j = 0; rc == 0 && !whole_fs && j < n; j++) {
                dir_of(p[j].dst, d);
                if (!strcmp(d, last))
                        continue;
                int seen = 0;
                for (size_t k = 0; k < j && !seen; k++) {
                        char dk[FS_PATH_MAX];
                        dir_of(p[k].dst, dk);
                        seen = !strcmp(dk, d);
                }
                if (!seen && fsync_dir(fs->io, d, err) < 0)
                        rc = -1;
                strcpy(last, d);
        }
        /* A single object that is visible but maybe not durable: take it back, so the
         * caller's error means "not written" (a manifest must not outlive its report). */
        for (size_t j = 0; rc < 0 && undo && j < n; j++)
                if (!p[j].tmp)
                        fs->io->unlink(p[j].dst);
        for (size_t j = 0; j < n; j++) {
                close(p[j].fd);
                if (p[j].tmp) {
                        fs->io->unlink(p[j].tmp);
                        free(p[j].tmp);
                }
                free(p[j].dst);
        }
        return rc;
}

static struct cove_cs_batch *fs_batch_new(struct cove_chunkstore *cs, struct cove_err *err)
{
        struct cove_cs_batch *b = calloc(1, sizeof(*b));
        if (!b) {
                cove_err_set(err, ENOMEM, "batch");
                return NULL;
        }
        pthread_mutex_init(&b->lock, NULL);
        pthread_cond_init(&b->cv, NULL);
        return b;
}

/* Flush the batch's pending group. Called with b->lock held; the lock is dropped while
 * the group syncs, so other writers keep writing temps meanwhile. */
static int batch_flush_locked(struct fs_store *fs, struct cove_cs_batch *b, struct cove_err *err)
{
        if (b->failed)
                return cove_err_set(err, b->failed, "%s", b->failmsg);
        struct pending *p = b->p;
        size_t n = b->n;
        b->p = NULL;
        b->n = b->cap = 0;
        b->bytes = 0;
        b->flushing++;
        pthread_mutex_unlock(&b->lock);
        struct cove_err e2 = {0};
        int rc = n ? flush_pending(fs, p, n, 0, &e2) : 0;
        free(p);
        pthread_mutex_lock(&b->lock);
        b->flushing--;
        pthread_cond_broadcast(&b->cv);
        if (rc < 0) {
                if (!b->failed) {
                        b->failed = e2.errnum ? e2.errnum : EIO;
                        snprintf(b->failmsg, sizeof(b->failmsg), "%s", e2.msg);
                }
                if (err)
                        *err = e2;
        }
        return rc;
}

static int fs_batch_commit(struct cove_chunkstore *cs, struct cove_cs_batch *b,
                           struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        pthread_mutex_lock(&b->lock);
        int rc = batch_flush_locked(fs, b, err);
        while (b->flushing)
                pthread_cond_wait(&b->cv, &b->lock);
        if (rc == 0 && b->failed)
                rc = cove_err_set(err, b->failed, "%s", b->failmsg);
        pthread_mutex_unlock(&b->lock);
        return rc;
}

static void fs_batch_free(struct cove_chunkstore *cs, struct cove_cs_batch *b)
{
        struct fs_store *fs = (struct fs_store *)cs;
        if (!b)
                return;
        for (size_t i = 0; i < b->n; i++) {
                close(b->p[i].fd);
                fs->io->unlink(b->p[i].tmp);
                free(b->p[i].tmp);
                free(b->p[i].dst);
        }
        free(b->p);
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->lock);
        free(b);
}

static int fs_put(struct cove_chunkstore *cs, struct cove_cs_batch *b, const char *name,
                  const void *data, size_t len, struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char dst[FS_PATH_MAX], tmp[FS_PATH_MAX];
        if (fs_path(fs, name, dst, err) < 0)
                return -1;
        struct stat st;
        if (stat(dst, &st) == 0)
                return 1;
        int fd = write_temp(fs, dst, data, len, tmp, err);
        if (fd < 0)
                return -1;
        if (!b) {
                struct pending one = {fd, strdup(tmp), strdup(dst)};
                if (!one.tmp || !one.dst) {
                        close(fd);
                        fs->io->unlink(tmp);
                        free(one.tmp);
                        free(one.dst);
                        return cove_err_set(err, ENOMEM, "put %s", name);
                }
                return flush_pending(fs, &one, 1, 1, err);
        }
        /* Start writeback now so the later fdatasync finds little left to do. */
        sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
        pthread_mutex_lock(&b->lock);
        int rc = 0;
        if (b->n == b->cap) {
                size_t nc = b->cap ? b->cap * 2 : 64;
                struct pending *np = realloc(b->p, nc * sizeof(*np));
                if (!np) {
                        rc = cove_err_set(err, ENOMEM, "put %s", name);
                        goto out;
                }
                b->p = np;
                b->cap = nc;
        }
        struct pending *pp = &b->p[b->n];
        pp->tmp = strdup(tmp);
        pp->dst = strdup(dst);
        if (!pp->tmp || !pp->dst) {
                free(pp->tmp);
                free(pp->dst);
                rc = cove_err_set(err, ENOMEM, "put %s", name);
                goto out;
        }
        pp->fd = fd;
        fd = -1;
        b->n++;
        b->bytes += len;
        if (b->n >= FS_BATCH_FILES || b->bytes >= FS_BATCH_BYTES)
                rc = batch_flush_locked(fs, b, err);
out:
        pthread_mutex_unlock(&b->lock);
        if (fd >= 0) {
                close(fd);
                fs->io->unlink(tmp);
        }
        return rc < 0 ? -1 : 0;
}

static int fs_get(struct cove_chunkstore *cs, const char *name, size_t max, void **out, size_t *len,
                  struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char path[FS_PATH_MAX];
        if (fs_path(fs, name, path, err) < 0)
                return -1;
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return cove_err_setk(err, errno == ENOENT ? COVE_E_NOT_FOUND : COVE_E_INTERNAL,
                                     errno, "open object %s", name);
        struct stat st;
        if (fstat(fd, &st) < 0)
                return cove_err_set(err, errno, "stat object %s", name);
        if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max)
                return cove_err_setk(err, COVE_E_LIMIT, EFBIG, "object %s: %lld bytes, max %zu",
                                     name, (long long)st.st_size, max);
        size_t n = (size_t)st.st_size, got = 0;
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
                return cove_err_set(err, ENOMEM, "read object %s", name);
        while (got < n) {
                ssize_t r = read(fd, buf + got, n - got);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0) {
                        free(buf);
                        return cove_err_set(err, r < 0 ? errno : EIO, "read object %s", name);
                }
                got += (size_t)r;
        }
        *out = buf;
        *len = n;
        return 0;
}

static int fs_has(struct cove_chunkstore *cs, const char *name, struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char path[FS_PATH_MAX];
        if (fs_path(fs, name, path, err) < 0)
                return -1;
        struct stat st;
        if (lstat(path, &st) == 0)
                return 1;
        if (errno == ENOENT)
                return 0;
        return cove_err_set(err, errno, "stat object %s", name);
}

static int fs_touch(struct cove_chunkstore *cs, const char *name, struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char path[FS_PATH_MAX];
        if (fs_path(fs, name, path, err) < 0)
                return -1;
        if (utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW) == 0)
                return 1;
        if (errno == ENOENT)
                return 0;
        return cove_err_set(err, errno, "touch object %s", name);
}

static int64_t mtime_ms(const struct stat *st)
{
        return (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
}

static int fs_del(struct cove_chunkstore *cs, const char *name, int64_t not_after_ms,
                  struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char path[FS_PATH_MAX], aside[FS_PATH_MAX];
        if (fs_path(fs, name, path, err) < 0)
                return -1;
        struct stat st;
        if (lstat(path, &st) < 0)
                return errno == ENOENT ? 0 : cove_err_set(err, errno, "stat object %s", name);
        if (mtime_ms(&st) >= not_after_ms)
                return 0;
        if (not_after_ms == INT64_MAX) {
                if (fs->io->unlink(path) < 0 && errno != ENOENT)
                        return cove_err_set(err, errno, "delete object %s", name);
        } else {
                /* A touch() between our stat and an unlink would be lost: move the object
                 * aside first (touch then fails with ENOENT and the writer re-puts it), and
                 * look at the mtime again once no touch can reach it any more. */
                const char *slash = strrchr(path, '/');
                snprintf(aside, sizeof(aside), "%.*s/.gc.%s", (int)(slash - path), path, slash + 1);
                if (fs->io->rename(path, aside) < 0)
                        return errno == ENOENT ? 0
                                               : cove_err_set(err, errno, "delete object %s", name);
                if (lstat(aside, &st) == 0 && mtime_ms(&st) >= not_after_ms) {
                        if (fs->io->rename(aside, path) < 0)
                                return cove_err_set(err, errno, "restore object %s", name);
                        return 0;
                }
                if (fs->io->unlink(aside) < 0 && errno != ENOENT)
                        return cove_err_set(err, errno, "delete object %s", name);
        }
        char d[FS_PATH_MAX];
        dir_of(path, d);
        if (fsync_dir(fs->io, d, err) < 0)
                return -1;
        return 1;
}

/* Walk dir (path rel = name prefix) calling cb for files; mode 1 = recover instead. */
static int walk(struct fs_store *fs, const char *dir, const char *rel, int depth, int recover,
                cove_cs_list_cb cb, void *arg, struct cove_err *err)
{
        if (depth > 8)
                return 0;
        cleanup_dir DIR *d = opendir(dir);
        if (!d) {
                if (errno == ENOENT)
                        return 0;
                return cove_err_set(err, errno, "list %s", dir);
        }
        struct dirent *de;
        char path[FS_PATH_MAX], name[FS_PATH_MAX];
        while ((de = readdir(d))) {
                const char *n = de->d_name;
                if (!strcmp(n, ".") || !strcmp(n, ".."))
                        continue;
                if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, n) >= sizeof(path))
                        continue;
                snprintf(name, sizeof(name), "%s%s", rel, n);
                struct stat st;
                if (lstat(path, &st) < 0)
                        continue;
                if (S_ISDIR(st.st_mode)) {
                        if (n[0] == '.')
                                continue;
                        size_t l = strlen(name);
                        if (l + 1 < sizeof(name)) {
                                name[l] = '/';
                                name[l + 1] = '\0';
                        }
                        if (walk(fs, path, name, depth + 1, recover, cb, arg, err) < 0)
                                return -1;
                        continue;
                }
                if (recover) {
                        if (!strncmp(n, ".tmp.", 5)) {
                                if (fs->io->unlink(path) < 0 && errno != ENOENT)
                                        return cove_err_set(err, errno, "remove %s", path);
                        } else if (!strncmp(n, ".gc.", 4)) {
                                char orig[FS_PATH_MAX];
                                snprintf(orig, sizeof(orig), "%s/%s", dir, n + 4);
                                struct stat o;
                                int rc = lstat(orig, &o) == 0 ? fs->io->unlink(path)
                                                              : fs->io->rename(path, orig);
                                if (rc < 0 && errno != ENOENT)
                                        return cove_err_set(err, errno, "recover %s", path);
                        }
                        continue;
                }
                if (n[0] == '.' || !S_ISREG(st.st_mode))
                        continue;
                if (cb(name, (uint64_t)st.st_size, mtime_ms(&st), arg) < 0)
                        return 1;
        }
        return 0;
}

static int fs_list(struct cove_chunkstore *cs, const char *prefix, cove_cs_list_cb cb, void *arg,
                   struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        size_t pl = strlen(prefix);
        char dir[FS_PATH_MAX], probe[FS_PATH_MAX];
        if (pl < 2 || prefix[pl - 1] != '/' || pl >= 250)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid list prefix");
        snprintf(probe, sizeof(probe), "%.*s", (int)(pl - 1), prefix);
        if (!cove_cs_name_valid(probe))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid list prefix");
        snprintf(dir, sizeof(dir), "%s/%s", fs->root, probe);
        return walk(fs, dir, prefix, 0, 0, cb, arg, err) < 0 ? -1 : 0;
}

static int fs_recover(struct cove_chunkstore *cs, struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        return walk(fs, fs->root, "", 0, 1, NULL, NULL, err);
}

static void fs_close(struct cove_chunkstore *cs)
{
        free(cs);
}

static const struct cove_chunkstore_ops fs_ops = {
    .name = "fs",
    .put = fs_put,
    .get = fs_get,
    .has = fs_has,
    .touch = fs_touch,
    .del = fs_del,
    .list = fs_list,
    .batch_new = fs_batch_new,
    .batch_commit = fs_batch_commit,
    .batch_free = fs_batch_free,
    .recover = fs_recover,
    .close = fs_close,
};

struct cove_chunkstore *cove_chunkstore_fs_open(const char *root, const struct cove_sysio *io,
                                                struct cove_err *err)
{
        if (strlen(root) >= FS_PATH_MAX - 300 || root[0] == '\0') {
                cove_err_set(err, ENAMETOOLONG, "chunk store root");
                return NULL;
        }
        if (cove_mkdir_p(root, 0700, err) < 0) {
                cove_err_wrap(err, "chunk store");
                return NULL;
        }
        struct fs_store *fs = calloc(1, sizeof(*fs));
        if (!fs) {
                cove_err_set(err, ENOMEM, "chunk store");
                return NULL;
        }
        fs->base.ops = &fs_ops;
        fs->io = cove_sysio_get(io);
        snprintf(fs->root, sizeof(fs->root), "%s", root);
        size_t l = strlen(fs->root);
        while (l > 1 && fs->root[l - 1] == '/')
                fs->root[--l] = '\0';
        return &fs->base;
}
