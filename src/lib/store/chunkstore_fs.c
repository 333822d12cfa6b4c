/* Local-directory chunk store backend (store/chunkstore.h).
 *
 * Unbatched puts (manifests) and every object of the loose format are one file per object
 * under root, written to a temp name in the same directory, made durable, renamed,
 * directory made durable.
 *
 * Batched puts (a capture's chunks) go into packs: root/.packs/<first name component>/
 * <16 hex>.pack, many objects appended to one temp file, then an index and a trailer,
 * one fdatasync, a rename and one directory fsync per pack (an fsync per 64 KiB object
 * costs a journal commit + cache flush each; syncfs would also flush every other writer
 * of the filesystem). A pack only ever holds objects of one first component (a tenant),
 * so one tenant's objects never share a file with another's. Objects of a pack are found
 * through an in-memory index loaded at open (and re-read when another process adds a
 * pack). An object's mtime is its pack's mtime: touch() sets the pack's, so a touch
 * keeps all of the pack young (GC only waits longer). del() of a packed object appends
 * "-name" to the pack's <id>.dead sidecar (fdatasync'ed), re-checks the pack's mtime
 * (a touch that raced it appends "+name": kept), and unlinks the pack when every object
 * in it is dead; a pack more than half dead is rewritten with its live objects first.
 * Both formats are read; an upgraded data dir keeps its loose files. */
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
#include <zlib.h>

#include "store/chunkstore.h"
#include "util/cleanup.h"
#include "util/util.h"

#define FS_BATCH_FILES 256         /* flush a batch after this many pending objects */
#define FS_BATCH_BYTES (64u << 20) /* … or this many bytes */
#define FS_PATH_MAX 4096
#define FS_SYNCFS_MIN 8 /* groups this large use two syncfs instead of fsync per file/dir */

#define PACK_DIR ".packs"
#define PACK_MAX_BYTES (64u << 20) /* a pack is sealed once it holds this much */
#define PACK_MAGIC "CVPACK01"
#define PACK_TRAILER 24           /* index_off u64, nents u32, crc32 u32, magic[8] */
#define PACK_MAX_OBJS (1u << 20)  /* bound of a pack index read from disk */
#define PACK_DEAD_MAX (64u << 20) /* bound of a .dead sidecar read from disk */

struct pack {
        struct pack *next;
        char tenant[256];
        char id[17];
        uint32_t nobj, ndead;
        uint64_t bytes, dead_bytes;
        int64_t dead_size; /* bytes of the sidecar applied */
        struct pent *ents; /* every object of the pack, live or dead */
};

struct pent {               /* one packed object in the index */
        struct pent *next;  /* hash chain (live objects only) */
        struct pent *pnext; /* the pack's objects */
        struct pack *pk;
        uint64_t off;
        uint32_t len;
        int dead;
        char name[]; /* NUL-terminated */
};

struct scanned { /* a tenant's pack directory as last read */
        struct scanned *next;
        char tenant[256];
        struct timespec mtime;
};

struct fs_store {
        struct cove_chunkstore base;
        const struct cove_sysio *io;
        int loose;          /* write batches as loose files (the format before packs) */
        pthread_mutex_t mu; /* packs, the index, scanned */
        struct pack *packs;
        struct pent **tab;
        size_t tcap, tn;
        struct scanned *scanned;
        char root[FS_PATH_MAX];
};

struct pending {
        int fd;
        char *tmp;
        char *dst;
};

struct wobj {
        char *name;
        uint64_t off;
        uint32_t len;
};

struct wpack { /* a pack being written by a batch */
        struct wpack *next;
        char tenant[256];
        char id[17];
        char tmp[FS_PATH_MAX];
        int fd;
        uint64_t off;
        struct wobj *o;
        size_t n, cap;
        uint64_t started; /* bytes handed to writeback so far */
        pthread_t owner;  /* the thread that appends to it */
        int busy;         /* the owner is appending (outside the batch lock) */
};

struct cove_cs_batch {
        pthread_mutex_t lock;
        struct pending *p;
        size_t n, cap;
        size_t bytes;
        struct wpack *packs; /* open packs, one per tenant */
        int flushing;        /* groups being flushed outside the lock by put() */
        pthread_cond_t cv;   /* signalled when flushing drops */
        int failed;          /* sticky errno of a failed flush: commit fails */
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

/* ---- packs ---- */

static uint64_t name_hash(const char *s)
{
        uint64_t h = 1469598103934665603ULL; /* FNV-1a */
        for (; *s; s++)
                h = (h ^ (uint8_t)*s) * 1099511628211ULL;
        return h;
}

/* The first component of a valid name (at most 255 bytes). */
static void tenant_of(const char *name, char out[256])
{
        const char *sl = strchr(name, '/');
        size_t n = sl ? (size_t)(sl - name) : strlen(name);
        if (n > 255)
                n = 255;
        memcpy(out, name, n);
        out[n] = '\0';
}

static void pack_file(const struct fs_store *fs, const char *tenant, const char *id,
                      const char *ext, char *out)
{
        snprintf(out, FS_PATH_MAX, "%s/" PACK_DIR "/%s/%s.%s", fs->root, tenant, id, ext);
}

/* The index: live packed objects by name. All idx_* and pack_* below need fs->mu. */
static struct pent *idx_find(const struct fs_store *fs, const char *name)
{
        if (!fs->tcap)
                return NULL;
        for (struct pent *e = fs->tab[name_hash(name) & (fs->tcap - 1)]; e; e = e->next)
                if (!strcmp(e->name, name))
                        return e;
        return NULL;
}

static void idx_remove(struct fs_store *fs, struct pent *e)
{
        struct pent **pp = &fs->tab[name_hash(e->name) & (fs->tcap - 1)];
        while (*pp && *pp != e)
                pp = &(*pp)->next;
        if (*pp) {
                *pp = e->next;
                fs->tn--;
        }
        e->next = NULL;
}

static int idx_grow(struct fs_store *fs)
{
        if (fs->tn < fs->tcap)
                return 0;
        size_t nc = fs->tcap ? fs->tcap * 2 : 4096;
        struct pent **nt = calloc(nc, sizeof(*nt));
        if (!nt)
                return -1;
        for (size_t i = 0; i < fs->tcap; i++)
                for (struct pent *e = fs->tab[i], *nx; e; e = nx) {
                        nx = e->next;
                        size_t j = name_hash(e->name) & (nc - 1);
                        e->next = nt[j];
                        nt[j] = e;
                }
        free(fs->tab);
        fs->tab = nt;
        fs->tcap = nc;
        return 0;
}

static struct pack *pack_find(const struct fs_store *fs, const char *tenant, const char *id)
{
        for (struct pack *p = fs->packs; p; p = p->next)
                if (!strcmp(p->id, id) && !strcmp(p->tenant, tenant))
                        return p;
        return NULL;
}

/* Forget pk and its objects (the files are the caller's business). */
static void pack_drop(struct fs_store *fs, struct pack *pk)
{
        for (struct pent *e = pk->ents, *nx; e; e = nx) {
                nx = e->pnext;
                if (!e->dead)
                        idx_remove(fs, e);
                free(e);
        }
        for (struct pack **pp = &fs->packs; *pp; pp = &(*pp)->next)
                if (*pp == pk) {
                        *pp = pk->next;
                        break;
                }
        free(pk);
}

/* Add an object of pk; dead: dead in pk's sidecar. A name already live in another pack
 * keeps that copy: this one counts as dead (both hold the same immutable bytes). */
static int pack_add_obj(struct fs_store *fs, struct pack *pk, const char *name, uint64_t off,
                        uint32_t len, int dead)
{
        size_t nl = strlen(name);
        struct pent *e = calloc(1, sizeof(*e) + nl + 1);
        if (!e || idx_grow(fs) < 0) {
                free(e);
                return -1;
        }
        memcpy(e->name, name, nl + 1);
        e->pk = pk;
        e->off = off;
        e->len = len;
        e->pnext = pk->ents;
        pk->ents = e;
        pk->nobj++;
        pk->bytes += len;
        if (!dead && idx_find(fs, name))
                dead = 1;
        e->dead = dead;
        if (dead) {
                pk->ndead++;
                pk->dead_bytes += len;
                return 0;
        }
        size_t j = name_hash(name) & (fs->tcap - 1);
        e->next = fs->tab[j];
        fs->tab[j] = e;
        fs->tn++;
        return 0;
}

static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
        size_t got = 0;
        while (got < len) {
                ssize_t r = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0) {
                        if (r == 0)
                                errno = EIO;
                        return -1;
                }
                got += (size_t)r;
        }
        return 0;
}

static uint64_t get_le(const uint8_t *p, int n)
{
        uint64_t v = 0;
        for (int i = n - 1; i >= 0; i--)
                v = (v << 8) | p[i];
        return v;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
        for (int i = 0; i < n; i++, v >>= 8)
                p[i] = (uint8_t)v;
}

/* The last record of name in a sidecar's bytes: 1 dead ("-"), 0 live ("+" or none). Only
 * whole lines count (a crash may cut the last one). */
static int sidecar_dead(const char *buf, size_t len, const char *name)
{
        int dead = 0;
        size_t nl = strlen(name);
        for (size_t i = 0; i < len;) {
                const char *eol = memchr(buf + i, '\n', len - i);
                if (!eol)
                        break;
                size_t ll = (size_t)(eol - (buf + i));
                if (ll == nl + 1 && (buf[i] == '-' || buf[i] == '+') &&
                    !memcmp(buf + i + 1, name, nl))
                        dead = buf[i] == '-';
                i += ll + 1;
        }
        return dead;
}

static int read_sidecar(const char *path, char **buf, size_t *len)
{
        *buf = NULL;
        *len = 0;
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return errno == ENOENT ? 0 : -1;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -1;
        if ((uint64_t)st.st_size > PACK_DEAD_MAX) {
                errno = EFBIG;
                return -1;
        }
        *len = (size_t)st.st_size;
        *buf = malloc(*len + 1);
        if (!*buf)
                return -1;
        if (read_at(fd, *buf, *len, 0) < 0) {
                free(*buf);
                *buf = NULL;
                return -1;
        }
        return 0;
}

/* Read pack <tenant>/<id> from disk into the index. A pack whose trailer, index or
 * sidecar does not check out is left out (its objects read as missing). */
static int pack_load(struct fs_store *fs, const char *tenant, const char *id)
{
        char path[FS_PATH_MAX], dpath[FS_PATH_MAX];
        pack_file(fs, tenant, id, "pack", path);
        pack_file(fs, tenant, id, "dead", dpath);
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        uint8_t tr[PACK_TRAILER];
        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < PACK_TRAILER ||
            read_at(fd, tr, sizeof(tr), (uint64_t)st.st_size - PACK_TRAILER) < 0 ||
            memcmp(tr + 16, PACK_MAGIC, 8))
                return -1;
        uint64_t ioff = get_le(tr, 8), size = (uint64_t)st.st_size;
        uint32_t nents = (uint32_t)get_le(tr + 8, 4), crc = (uint32_t)get_le(tr + 12, 4);
        if (ioff > size - PACK_TRAILER || nents > PACK_MAX_OBJS ||
            size - PACK_TRAILER - ioff > (uint64_t)nents * (2 + 255 + 12))
                return -1;
        size_t ilen = (size_t)(size - PACK_TRAILER - ioff);
        uint8_t *ix = malloc(ilen ? ilen : 1);
        char *side = NULL;
        size_t slen = 0;
        if (!ix || read_at(fd, ix, ilen, ioff) < 0 || (uint32_t)crc32(0, ix, (uInt)ilen) != crc ||
            read_sidecar(dpath, &side, &slen) < 0) {
                free(ix);
                return -1;
        }
        struct pack *pk = calloc(1, sizeof(*pk));
        if (!pk) {
                free(ix);
                free(side);
                return -1;
        }
        snprintf(pk->tenant, sizeof(pk->tenant), "%s", tenant);
        snprintf(pk->id, sizeof(pk->id), "%s", id);
        pk->dead_size = (int64_t)slen;
        pk->next = fs->packs;
        fs->packs = pk;
        int rc = 0;
        size_t at = 0;
        for (uint32_t i = 0; rc == 0 && i < nents; i++) {
                char name[256], t[256];
                size_t nl = at + 2 <= ilen ? (size_t)get_le(ix + at, 2) : 256;
                if (nl > 255 || at + 2 + nl + 12 > ilen) {
                        rc = -1;
                        break;
                }
                memcpy(name, ix + at + 2, nl);
                name[nl] = '\0';
                uint64_t off = get_le(ix + at + 2 + nl, 8);
                uint32_t len = (uint32_t)get_le(ix + at + 2 + nl + 8, 4);
                at += 2 + nl + 12;
                tenant_of(name, t);
                if (!cove_cs_name_valid(name) || strcmp(t, tenant) || off > ioff ||
                    len > ioff - off) {
                        rc = -1;
                        break;
                }
                rc = pack_add_obj(fs, pk, name, off, len, side && sidecar_dead(side, slen, name));
        }
        if (rc == 0 && at != ilen)
                rc = -1;
        free(ix);
        free(side);
        if (rc < 0)
                pack_drop(fs, pk);
        return rc;
}

static int is_pack_name(const char *n, char id[17])
{
        if (strlen(n) != 21 || strcmp(n + 16, ".pack"))
                return 0;
        for (int i = 0; i < 16; i++)
                if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f')))
                        return 0;
        memcpy(id, n, 16);
        id[16] = '\0';
        return 1;
}

/* Load the packs of tenant not in the index yet (another process's, or all of them at
 * open), unless its pack directory did not change since the last look. */
static int pack_scan(struct fs_store *fs, const char *tenant)
{
        char dir[FS_PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/" PACK_DIR "/%s", fs->root, tenant);
        struct stat st;
        if (stat(dir, &st) < 0)
                return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
        struct scanned *sc = fs->scanned;
        while (sc && strcmp(sc->tenant, tenant))
                sc = sc->next;
        if (sc && sc->mtime.tv_sec == st.st_mtim.tv_sec && sc->mtime.tv_nsec == st.st_mtim.tv_nsec)
                return 0;
        if (!sc) {
                if (!(sc = calloc(1, sizeof(*sc))))
                        return -1;
                snprintf(sc->tenant, sizeof(sc->tenant), "%s", tenant);
                sc->next = fs->scanned;
                fs->scanned = sc;
        }
        sc->mtime = st.st_mtim;
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return -1;
        struct dirent *de;
        char id[17];
        while ((de = readdir(d)))
                if (is_pack_name(de->d_name, id) && !pack_find(fs, tenant, id))
                        pack_load(fs, tenant, id);
        return 0;
}

static int pack_scan_all(struct fs_store *fs)
{
        char dir[FS_PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/" PACK_DIR, fs->root);
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return errno == ENOENT ? 0 : -1;
        struct dirent *de;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.' && cove_cs_name_valid(de->d_name) &&
                    strlen(de->d_name) < 256)
                        pack_scan(fs, de->d_name);
        return 0;
}

/* Where a live packed object is: 1 (path, off, len filled), 0 not packed. A miss looks for
 * packs another process added. Takes fs->mu. */
static int packed(struct fs_store *fs, const char *name, char *path, uint64_t *off, uint32_t *len,
                  int rescan)
{
        pthread_mutex_lock(&fs->mu);
        struct pent *e = idx_find(fs, name);
        if (!e && rescan) {
                char t[256];
                tenant_of(name, t);
                pack_scan(fs, t);
                e = idx_find(fs, name);
        }
        if (e) {
                pack_file(fs, e->pk->tenant, e->pk->id, "pack", path);
                *off = e->off;
                *len = e->len;
        }
        pthread_mutex_unlock(&fs->mu);
        return e != NULL;
}

static void wpack_free(struct fs_store *fs, struct wpack *w, int unlink_tmp)
{
        if (w->fd >= 0)
                close(w->fd);
        if (unlink_tmp && w->tmp[0])
                fs->io->unlink(w->tmp);
        for (size_t i = 0; i < w->n; i++)
                free(w->o[i].name);
        free(w->o);
        free(w);
}

static struct wpack *wpack_new(struct fs_store *fs, const char *tenant, struct cove_err *err)
{
        struct wpack *w = calloc(1, sizeof(*w));
        uint8_t r[8];
        if (!w) {
                cove_err_set(err, ENOMEM, "pack");
                return NULL;
        }
        w->fd = -1;
        if (cove_random(r, sizeof(r), err) < 0) {
                free(w);
                return NULL;
        }
        cove_hex(r, sizeof(r), w->id);
        snprintf(w->tenant, sizeof(w->tenant), "%s", tenant);
        snprintf(w->tmp, sizeof(w->tmp), "%s/" PACK_DIR "/%s/.tmp.%s.pack", fs->root, tenant,
                 w->id);
        w->fd = fs->io->open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (w->fd < 0 && errno == ENOENT) {
                if (ensure_parents(fs, w->tmp, err) < 0) {
                        w->tmp[0] = '\0';
                        wpack_free(fs, w, 0);
                        return NULL;
                }
                w->fd = fs->io->open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        }
        if (w->fd < 0) {
                cove_err_set(err, errno, "create pack %s", w->tmp);
                w->tmp[0] = '\0';
                wpack_free(fs, w, 0);
                return NULL;
        }
        return w;
}

/* Append one object to w; on failure w is broken (the caller drops it). */
static int wpack_append(struct fs_store *fs, struct wpack *w, const char *name, const void *data,
                        size_t len, struct cove_err *err)
{
        if (w->n == w->cap) {
                size_t nc = w->cap ? w->cap * 2 : 256;
                struct wobj *no = realloc(w->o, nc * sizeof(*no));
                if (!no)
                        return cove_err_set(err, ENOMEM, "pack");
                w->o = no;
                w->cap = nc;
        }
        char *nm = strdup(name);
        if (!nm)
                return cove_err_set(err, ENOMEM, "pack");
        if (cove_sysio_write_all(fs->io, w->fd, data, len) < 0) {
                free(nm);
                return cove_err_set(err, errno, "write pack %s", w->tmp);
        }
        /* start writeback every 8 MiB so the seal's fdatasync finds little left to do */
        if (w->off + len - w->started >= (8u << 20)) {
                sync_file_range(w->fd, (off_t)w->started, (off_t)(w->off + len - w->started),
                                SYNC_FILE_RANGE_WRITE);
                w->started = w->off + len;
        }
        struct wobj *o = &w->o[w->n++];
        o->name = nm;
        o->off = w->off;
        o->len = (uint32_t)len;
        w->off += len;
        return 0;
}

/* Make w durable and visible: index + trailer, fdatasync, rename, directory fsync, then
 * into the index. Frees w (its temp file is removed on failure). */
static int wpack_seal(struct fs_store *fs, struct wpack *w, struct cove_err *err)
{
        size_t ilen = 0;
        for (size_t i = 0; i < w->n; i++)
                ilen += 2 + strlen(w->o[i].name) + 12;
        uint8_t *ix = malloc(ilen + PACK_TRAILER);
        if (!ix) {
                wpack_free(fs, w, 1);
                return cove_err_set(err, ENOMEM, "pack index");
        }
        size_t at = 0;
        for (size_t i = 0; i < w->n; i++) {
                size_t nl = strlen(w->o[i].name);
                put_le(ix + at, nl, 2);
                memcpy(ix + at + 2, w->o[i].name, nl);
                put_le(ix + at + 2 + nl, w->o[i].off, 8);
                put_le(ix + at + 2 + nl + 8, w->o[i].len, 4);
                at += 2 + nl + 12;
        }
        put_le(ix + at, w->off, 8);
        put_le(ix + at + 8, w->n, 4);
        put_le(ix + at + 12, (uint32_t)crc32(0, ix, (uInt)ilen), 4);
        memcpy(ix + at + 16, PACK_MAGIC, 8);
        char dst[FS_PATH_MAX], dir[FS_PATH_MAX];
        pack_file(fs, w->tenant, w->id, "pack", dst);
        dir_of(dst, dir);
        int rc = 0;
        if (cove_sysio_write_all(fs->io, w->fd, ix, ilen + PACK_TRAILER) < 0)
                rc = cove_err_set(err, errno, "write pack %s", w->tmp);
        else if (fs->io->fdatasync(w->fd) < 0)
                rc = cove_err_set(err, errno, "sync pack %s (%zu objects)", dst, w->n);
        else if (fs->io->rename(w->tmp, dst) < 0)
                rc = cove_err_set(err, errno, "rename pack %s", dst);
        free(ix);
        if (rc < 0) {
                wpack_free(fs, w, 1);
                return -1;
        }
        w->tmp[0] = '\0';
        if (fsync_dir(fs->io, dir, err) < 0) {
                /* visible but maybe not durable: take it back, nobody may dedup against it */
                pthread_mutex_lock(&fs->mu);
                struct pack *pk = pack_find(fs, w->tenant, w->id);
                if (pk)
                        pack_drop(fs, pk);
                fs->io->unlink(dst);
                pthread_mutex_unlock(&fs->mu);
                wpack_free(fs, w, 0);
                return -1;
        }
        pthread_mutex_lock(&fs->mu);
        if (!pack_find(fs, w->tenant, w->id)) { /* a rescan may have loaded it already */
                struct pack *pk = calloc(1, sizeof(*pk));
                if (!pk) {
                        rc = cove_err_set(err, ENOMEM, "pack");
                } else {
                        snprintf(pk->tenant, sizeof(pk->tenant), "%s", w->tenant);
                        memcpy(pk->id, w->id, sizeof(pk->id));
                        pk->next = fs->packs;
                        fs->packs = pk;
                        for (size_t i = 0; rc == 0 && i < w->n; i++)
                                if (pack_add_obj(fs, pk, w->o[i].name, w->o[i].off, w->o[i].len,
                                                 0) < 0)
                                        rc = cove_err_set(err, ENOMEM, "pack index");
                        if (rc < 0)
                                pack_drop(fs, pk);
                }
        }
        pthread_mutex_unlock(&fs->mu);
        wpack_free(fs, w, 0);
        return rc;
}

/* Append one record to pk's sidecar, durably. */
static int sidecar_append(struct fs_store *fs, struct pack *pk, char op, const char *name,
                          struct cove_err *err)
{
        char path[FS_PATH_MAX], line[260];
        pack_file(fs, pk->tenant, pk->id, "dead", path);
        int n = snprintf(line, sizeof(line), "%c%s\n", op, name);
        struct stat st;
        int fresh = stat(path, &st) < 0;
        int fd = fs->io->open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd < 0)
                return cove_err_set(err, errno, "delete object %s (pack %s)", name, pk->id);
        int rc = 0;
        if (cove_sysio_write_all(fs->io, fd, line, (size_t)n) < 0 || fs->io->fdatasync(fd) < 0)
                rc = cove_err_set(err, errno, "delete object %s (pack %s)", name, pk->id);
        else if (fstat(fd, &st) == 0)
                pk->dead_size = st.st_size;
        close(fd);
        if (rc == 0 && fresh) {
                char dir[FS_PATH_MAX];
                dir_of(path, dir);
                rc = fsync_dir(fs->io, dir, err);
        }
        return rc;
}

/* Remove a pack every object of which is dead: the pack, then its sidecar. */
static int pack_unlink(struct fs_store *fs, struct pack *pk, struct cove_err *err)
{
        char path[FS_PATH_MAX], dpath[FS_PATH_MAX], dir[FS_PATH_MAX];
        pack_file(fs, pk->tenant, pk->id, "pack", path);
        pack_file(fs, pk->tenant, pk->id, "dead", dpath);
        dir_of(path, dir);
        if (fs->io->unlink(path) < 0 && errno != ENOENT)
                return cove_err_set(err, errno, "delete pack %s", path);
        pack_drop(fs, pk);
        if (fs->io->unlink(dpath) < 0 && errno != ENOENT)
                return cove_err_set(err, errno, "delete %s", dpath);
        return fsync_dir(fs->io, dir, err);
}

static int64_t mtime_ms(const struct stat *st);

/* del() of a packed object (see the top of the file). 1 deleted, 0 kept, -1 error,
 * 2 not packed. */
static int pack_del(struct fs_store *fs, const char *name, int64_t not_after_ms,
                    struct cove_err *err)
{
        pthread_mutex_lock(&fs->mu);
        struct pent *e = idx_find(fs, name);
        int rc = 2;
        if (!e)
                goto out;
        struct pack *pk = e->pk;
        char path[FS_PATH_MAX];
        pack_file(fs, pk->tenant, pk->id, "pack", path);
        struct stat st;
        rc = 0;
        if (stat(path, &st) < 0) {
                rc = cove_err_set(err, errno, "stat pack of %s", name);
                goto out;
        }
        if (mtime_ms(&st) >= not_after_ms)
                goto out;
        if (sidecar_append(fs, pk, '-', name, err) < 0) {
                rc = -1;
                goto out;
        }
        /* a touch from another process between our stat and the record: keep it */
        if (not_after_ms != INT64_MAX && stat(path, &st) == 0 && mtime_ms(&st) >= not_after_ms) {
                rc = sidecar_append(fs, pk, '+', name, err) < 0 ? -1 : 0;
                goto out;
        }
        idx_remove(fs, e);
        e->dead = 1;
        pk->ndead++;
        pk->dead_bytes += e->len;
        rc = 1;
        if (pk->ndead == pk->nobj && pack_unlink(fs, pk, err) < 0)
                rc = -1;
out:
        pthread_mutex_unlock(&fs->mu);
        return rc;
}

/* touch() of a packed object: 1 touched, 0 not packed (or deleted meanwhile), -1. */
static int pack_touch(struct fs_store *fs, const char *name, struct cove_err *err)
{
        char path[FS_PATH_MAX], dpath[FS_PATH_MAX];
        uint64_t off;
        uint32_t len;
        if (!packed(fs, name, path, &off, &len, 0))
                return 0;
        if (utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : cove_err_set(err, errno, "touch object %s", name);
        /* Another process's GC may have marked it dead before our touch: look at the
         * sidecar when it grew beyond what this process applied. */
        pthread_mutex_lock(&fs->mu);
        struct pent *e = idx_find(fs, name);
        int rc = e != NULL;
        if (e) {
                struct stat st;
                pack_file(fs, e->pk->tenant, e->pk->id, "dead", dpath);
                if (stat(dpath, &st) == 0 && st.st_size != e->pk->dead_size) {
                        char *side = NULL;
                        size_t slen = 0;
                        if (read_sidecar(dpath, &side, &slen) < 0) {
                                rc = cove_err_set(err, errno, "touch object %s", name);
                        } else if (sidecar_dead(side, slen, name)) {
                                idx_remove(fs, e);
                                e->dead = 1;
                                e->pk->ndead++;
                                e->pk->dead_bytes += e->len;
                                rc = 0;
                        }
                        free(side);
                }
        }
        pthread_mutex_unlock(&fs->mu);
        return rc;
}

/* Remove what an interrupted pack writer left (temp packs) and packs left fully dead. */
static int pack_recover(struct fs_store *fs, struct cove_err *err)
{
        char dir[FS_PATH_MAX], p[FS_PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/" PACK_DIR, fs->root);
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return errno == ENOENT ? 0 : cove_err_set(err, errno, "list %s", dir);
        struct dirent *de;
        while ((de = readdir(d))) {
                const char *t = de->d_name;
                if (t[0] == '.' || !cove_cs_name_valid(t) || strlen(t) > 255)
                        continue;
                char td[FS_PATH_MAX];
                snprintf(td, sizeof(td), "%s/%s", dir, t);
                cleanup_dir DIR *d2 = opendir(td);
                if (!d2)
                        continue;
                struct dirent *f;
                while ((f = readdir(d2))) {
                        if (strncmp(f->d_name, ".tmp.", 5))
                                continue;
                        snprintf(p, sizeof(p), "%s/%s", td, f->d_name);
                        if (fs->io->unlink(p) < 0 && errno != ENOENT)
                                return cove_err_set(err, errno, "remove %s", p);
                }
                pthread_mutex_lock(&fs->mu);
                pack_scan(fs, t);
                int rc = 0;
                for (struct pack *pk = fs->packs, *nx; rc == 0 && pk; pk = nx) {
                        nx = pk->next;
                        if (!strcmp(pk->tenant, t) && pk->ndead == pk->nobj)
                                rc = pack_unlink(fs, pk, err);
                }
                pthread_mutex_unlock(&fs->mu);
                if (rc < 0)
                        return -1;
        }
        return 0;
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

/* The batch has failed with e (NULL: unknown): the first failure sticks. b->lock held. */
static void batch_fail_locked(struct cove_cs_batch *b, const struct cove_err *e)
{
        if (!b->failed) {
                b->failed = e && e->errnum ? e->errnum : EIO;
                snprintf(b->failmsg, sizeof(b->failmsg), "%s", e ? e->msg : "");
        }
}

/* Back under b->lock from work done outside it (counted in b->flushing): wakes the waiters;
 * a failure (rc < 0, e2) becomes the batch's and, when err is given, the caller's. */
static int batch_done_locked(struct cove_cs_batch *b, int rc, const struct cove_err *e2,
                             struct cove_err *err)
{
        b->flushing--;
        pthread_cond_broadcast(&b->cv);
        if (rc < 0) {
                batch_fail_locked(b, e2);
                if (err)
                        *err = *e2;
        }
        return rc;
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
        return batch_done_locked(b, rc, &e2, err);
}

/* Seal w outside the batch's lock (other writers go on meanwhile); a failure is sticky. */
static int batch_seal_locked(struct fs_store *fs, struct cove_cs_batch *b, struct wpack *w,
                             struct cove_err *err)
{
        b->flushing++;
        pthread_mutex_unlock(&b->lock);
        struct cove_err e2 = {0};
        int rc = wpack_seal(fs, w, &e2);
        pthread_mutex_lock(&b->lock);
        return batch_done_locked(b, rc, &e2, err);
}

#define PACK_SEALS_MAX 2 /* full packs being sealed in the background per batch */

struct seal_arg {
        struct fs_store *fs;
        struct cove_cs_batch *b;
        struct wpack *w;
};

static void *seal_main(void *a)
{
        struct seal_arg *sa = a;
        struct cove_cs_batch *b = sa->b;
        struct cove_err e2 = {0};
        int rc = wpack_seal(sa->fs, sa->w, &e2);
        pthread_mutex_lock(&b->lock);
        batch_done_locked(b, rc, &e2, NULL);
        pthread_mutex_unlock(&b->lock);
        free(sa);
        return NULL;
}

/* Hand a full pack to a thread of its own: the worker that filled it goes back to hashing
 * and sealing chunks while the pack's fdatasync runs (at most PACK_SEALS_MAX at once:
 * beyond that the writer waits, so a slow disk slows the capture instead of piling up
 * dirty memory). A failure is sticky; commit waits for every seal. */
static int batch_seal_async_locked(struct fs_store *fs, struct cove_cs_batch *b, struct wpack *w,
                                   struct cove_err *err)
{
        while (b->flushing >= PACK_SEALS_MAX)
                pthread_cond_wait(&b->cv, &b->lock);
        struct seal_arg *sa = malloc(sizeof(*sa));
        pthread_t th;
        pthread_attr_t at;
        int e = sa ? pthread_attr_init(&at) : ENOMEM;
        if (e == 0) {
                pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
                *sa = (struct seal_arg){fs, b, w};
                b->flushing++;
                e = pthread_create(&th, &at, seal_main, sa);
                pthread_attr_destroy(&at);
                if (e == 0)
                        return 0;
                b->flushing--;
        }
        free(sa);
        (void)e; /* no thread: seal here */
        return batch_seal_locked(fs, b, w, err);
}

static int fs_batch_commit(struct cove_chunkstore *cs, struct cove_cs_batch *b,
                           struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        pthread_mutex_lock(&b->lock);
        int rc = 0;
        for (int busy = 1; busy;) { /* puts still appending */
                busy = 0;
                for (struct wpack *w = b->packs; w; w = w->next)
                        busy |= w->busy;
                if (busy)
                        pthread_cond_wait(&b->cv, &b->lock);
        }
        while (b->packs && !b->failed) {
                struct wpack *w = b->packs;
                b->packs = w->next;
                if (batch_seal_locked(fs, b, w, err) < 0)
                        rc = -1;
        }
        if (rc == 0)
                rc = batch_flush_locked(fs, b, err);
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
        pthread_mutex_lock(&b->lock); /* background seals still reference the batch */
        while (b->flushing)
                pthread_cond_wait(&b->cv, &b->lock);
        pthread_mutex_unlock(&b->lock);
        for (size_t i = 0; i < b->n; i++) {
                close(b->p[i].fd);
                fs->io->unlink(b->p[i].tmp);
                free(b->p[i].tmp);
                free(b->p[i].dst);
        }
        free(b->p);
        for (struct wpack *w = b->packs, *nx; w; w = nx) {
                nx = w->next;
                wpack_free(fs, w, 1);
        }
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->lock);
        free(b);
}

/* A batched put into the batch's open pack for name's tenant. */
static int pack_put(struct fs_store *fs, struct cove_cs_batch *b, const char *name,
                    const void *data, size_t len, struct cove_err *err)
{
        if (len > UINT32_MAX)
                return cove_err_setk(err, COVE_E_LIMIT, EFBIG, "object %s: too large", name);
        char t[256];
        tenant_of(name, t);
        pthread_t self = pthread_self();
        pthread_mutex_lock(&b->lock);
        int rc = 0;
        if (b->failed) {
                rc = cove_err_set(err, b->failed, "%s", b->failmsg);
                goto out;
        }
        /* Each writing thread appends to a pack of its own: no lock is held while the
         * bytes go to the kernel, and no writer waits for another's write. */
        struct wpack **wp = &b->packs;
        while (*wp && (strcmp((*wp)->tenant, t) || !pthread_equal((*wp)->owner, self)))
                wp = &(*wp)->next;
        if (!*wp) {
                if (!(*wp = wpack_new(fs, t, err))) {
                        rc = -1;
                        goto out;
                }
                (*wp)->owner = self;
        }
        struct wpack *w = *wp;
        w->busy = 1;
        pthread_mutex_unlock(&b->lock);
        rc = wpack_append(fs, w, name, data, len, err);
        pthread_mutex_lock(&b->lock);
        w->busy = 0;
        pthread_cond_broadcast(&b->cv);
        for (wp = &b->packs; *wp != w;) /* the list may have changed meanwhile */
                wp = &(*wp)->next;
        if (rc < 0) {
                *wp = w->next; /* the pack's bytes are unknown now: the batch has failed */
                wpack_free(fs, w, 1);
                batch_fail_locked(b, err);
                goto out;
        }
        if (w->off >= PACK_MAX_BYTES) {
                *wp = w->next;
                rc = batch_seal_async_locked(fs, b, w, err);
        }
out:
        pthread_mutex_unlock(&b->lock);
        return rc < 0 ? -1 : 0;
}

static int fs_put(struct cove_chunkstore *cs, struct cove_cs_batch *b, const char *name,
                  const void *data, size_t len, struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char dst[FS_PATH_MAX], tmp[FS_PATH_MAX];
        if (fs_path(fs, name, dst, err) < 0)
                return -1;
        struct stat st;
        uint64_t poff;
        uint32_t plen;
        if (packed(fs, name, tmp, &poff, &plen, 0) || stat(dst, &st) == 0)
                return 1;
        if (b && !fs->loose)
                return pack_put(fs, b, name, data, len, err);
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

static int pack_get(struct fs_store *fs, const char *name, size_t max, void **out, size_t *len,
                    struct cove_err *err)
{
        char path[FS_PATH_MAX];
        uint64_t off;
        uint32_t n;
        if (!packed(fs, name, path, &off, &n, 1))
                return cove_err_setk(err, COVE_E_NOT_FOUND, ENOENT, "open object %s", name);
        if (n > max)
                return cove_err_setk(err, COVE_E_LIMIT, EFBIG, "object %s: %u bytes, max %zu", name,
                                     n, max);
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) /* GC removed the whole pack meanwhile */
                return cove_err_setk(err, errno == ENOENT ? COVE_E_NOT_FOUND : COVE_E_INTERNAL,
                                     errno, "open object %s", name);
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
                return cove_err_set(err, ENOMEM, "read object %s", name);
        if (read_at(fd, buf, n, off) < 0) {
                int e = errno;
                free(buf);
                return cove_err_set(err, e, "read object %s", name);
        }
        *out = buf;
        *len = n;
        return 0;
}

static int fs_get(struct cove_chunkstore *cs, const char *name, size_t max, void **out, size_t *len,
                  struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char path[FS_PATH_MAX];
        if (fs_path(fs, name, path, err) < 0)
                return -1;
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && errno == ENOENT)
                return pack_get(fs, name, max, out, len, err);
        if (fd < 0)
                return cove_err_setk(err, COVE_E_INTERNAL, errno, "open object %s", name);
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
        uint64_t off;
        uint32_t n;
        if (packed(fs, name, path, &off, &n, 0) || lstat(path, &st) == 0)
                return 1;
        if (errno == ENOENT)
                return packed(fs, name, path, &off, &n, 1);
        return cove_err_set(err, errno, "stat object %s", name);
}

static int fs_touch(struct cove_chunkstore *cs, const char *name, struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        char path[FS_PATH_MAX];
        if (fs_path(fs, name, path, err) < 0)
                return -1;
        int pt = pack_touch(fs, name, err);
        if (pt != 0)
                return pt;
        if (utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW) == 0)
                return 1;
        if (errno != ENOENT)
                return cove_err_set(err, errno, "touch object %s", name);
        uint64_t off; /* in a pack another process wrote? */
        uint32_t n;
        return packed(fs, name, path, &off, &n, 1) ? pack_touch(fs, name, err) : 0;
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
        int pd = pack_del(fs, name, not_after_ms, err);
        if (pd != 2)
                return pd;
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

struct listed {
        char *name;
        uint64_t size;
        int64_t mtime_ms;
};

/* The live packed objects under prefix: collected under the lock, reported after it. */
static int pack_list(struct fs_store *fs, const char *prefix, cove_cs_list_cb cb, void *arg,
                     struct cove_err *err)
{
        char t[256], path[FS_PATH_MAX];
        tenant_of(prefix, t);
        size_t pl = strlen(prefix), n = 0, cap = 0;
        struct listed *v = NULL;
        int rc = 0;
        pthread_mutex_lock(&fs->mu);
        pack_scan(fs, t);
        for (struct pack *pk = fs->packs; rc == 0 && pk; pk = pk->next) {
                if (strcmp(pk->tenant, t) || pk->ndead == pk->nobj)
                        continue;
                struct stat st;
                pack_file(fs, pk->tenant, pk->id, "pack", path);
                int64_t mt = stat(path, &st) == 0 ? mtime_ms(&st) : 0;
                for (struct pent *e = pk->ents; e; e = e->pnext) {
                        if (e->dead || strncmp(e->name, prefix, pl))
                                continue;
                        if (n == cap) {
                                size_t nc = cap ? cap * 2 : 1024;
                                struct listed *nv = realloc(v, nc * sizeof(*nv));
                                if (!nv) {
                                        rc = cove_err_set(err, ENOMEM, "list %s", prefix);
                                        break;
                                }
                                v = nv;
                                cap = nc;
                        }
                        if (!(v[n].name = strdup(e->name))) {
                                rc = cove_err_set(err, ENOMEM, "list %s", prefix);
                                break;
                        }
                        v[n].size = e->len;
                        v[n++].mtime_ms = mt;
                }
        }
        pthread_mutex_unlock(&fs->mu);
        size_t i = 0;
        for (; rc == 0 && i < n; i++)
                if (cb(v[i].name, v[i].size, v[i].mtime_ms, arg) < 0)
                        break;
        for (i = 0; i < n; i++)
                free(v[i].name);
        free(v);
        return rc;
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
        if (walk(fs, dir, prefix, 0, 0, cb, arg, err) < 0)
                return -1;
        return pack_list(fs, prefix, cb, arg, err);
}

static int fs_recover(struct cove_chunkstore *cs, struct cove_err *err)
{
        struct fs_store *fs = (struct fs_store *)cs;
        if (walk(fs, fs->root, "", 0, 1, NULL, NULL, err) < 0)
                return -1;
        return pack_recover(fs, err);
}

static void fs_close(struct cove_chunkstore *cs)
{
        struct fs_store *fs = (struct fs_store *)cs;
        while (fs->packs)
                pack_drop(fs, fs->packs);
        for (struct scanned *sc = fs->scanned, *nx; sc; sc = nx) {
                nx = sc->next;
                free(sc);
        }
        free(fs->tab);
        pthread_mutex_destroy(&fs->mu);
        free(fs);
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
        return cove_chunkstore_fs_open2(root, io, 0, err);
}

struct cove_chunkstore *cove_chunkstore_fs_open2(const char *root, const struct cove_sysio *io,
                                                 int loose, struct cove_err *err)
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
        fs->loose = loose;
        pthread_mutex_init(&fs->mu, NULL);
        if (pack_scan_all(fs) < 0) {
                cove_err_set(err, errno, "chunk store %s: read packs", root);
                fs_close(&fs->base);
                return NULL;
        }
        return &fs->base;
}
