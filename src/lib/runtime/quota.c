/* Per-sandbox ext4 layer images of the ns runtime (see quota.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/loop.h>

#include "runtime/quota.h"
#include "util/cleanup.h"
#include "util/util.h"

extern char **environ;

#define POOL_SIZES 8 /* distinct disk sizes kept warm; further sizes pay the full cost */

/* A warm layer: an image in pool/ on a loop device, its ext4 mounted but not attached. */
struct pool_entry {
        int mfd;       /* fsmount() fd of the detached ext4 mount */
        char name[48]; /* image file in pool/: <mb>-<seq>.img */
};

struct pool_size {
        uint64_t mb;          /* disk size of this class */
        unsigned count;       /* ready entries in e[] */
        int failed;           /* last refill failed: wait for the next take before retrying */
        struct pool_entry *e; /* [pool_n] */
};

struct cove_layers {
        char dir[PATH_MAX];        /* <ns_dir>/layers: <id>.img and mount points <id>/ */
        char golden[PATH_MAX];     /* <ns_dir>/golden: <mb>.img, formatted, never mounted */
        char pool[PATH_MAX];       /* <ns_dir>/pool: images of warm layers */
        int fd;                    /* open on dir */
        int pool_fd;               /* open on pool */
        pthread_mutex_t lock;      /* serialises golden image creation */
        unsigned pool_n;           /* warm layers per size (0: no pool, no thread) */
        pthread_mutex_t pool_lock; /* guards everything below */
        pthread_cond_t pool_cond;  /* refill thread waits for demand or stop */
        struct pool_size sizes[POOL_SIZES]; /* [nsizes] */
        unsigned nsizes;
        unsigned seq;     /* names of pool images */
        int stopping;     /* close() asks the refill thread to end */
        int thread_ok;    /* refill thread was started */
        pthread_t refill; /* the refill thread */
};

const char *cove_layers_path(const struct cove_layers *l)
{
        return l->dir;
}

static int check_id(const char *id, struct cove_err *err)
{
        if (!id || !*id || strchr(id, '/') || id[0] == '.' || strlen(id) > 200)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "layer: bad id");
        return 0;
}

static int run_mkfs(const char *image, struct cove_err *err)
{
        /* lazy init: inode tables and journal stay holes, so a copy is ~1 MB whatever the size;
         * -m 0: no blocks reserved for a root the sandbox has anyway */
        char *argv[] = {"mkfs.ext4",
                        "-q",
                        "-F",
                        "-m",
                        "0",
                        "-E",
                        "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                        (char *)image,
                        NULL};
        pid_t pid;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        int rc = posix_spawnp(&pid, "mkfs.ext4", &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, rc,
                                     "run mkfs.ext4 (install the Debian package e2fsprogs)");
        int st;
        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        return cove_err_set(err, errno, "wait mkfs.ext4");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                return cove_err_set(err, 0, "mkfs.ext4 %s failed (status %d)", image, st);
        return 0;
}

/* Path of the golden image for size mb, formatting it on first use. */
static int golden_for(struct cove_layers *l, uint64_t mb, char *out, size_t cap,
                      struct cove_err *err)
{
        snprintf(out, cap, "%s/%llu.img", l->golden, (unsigned long long)mb);
        if (access(out, F_OK) == 0)
                return 0;
        pthread_mutex_lock(&l->lock);
        int rc = 0;
        if (access(out, F_OK) < 0) {
                char tmp[PATH_MAX + 16];
                snprintf(tmp, sizeof(tmp), "%s.tmp%d", out, (int)getpid());
                int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
                if (fd < 0) {
                        rc = cove_err_set(err, errno, "create %s", tmp);
                } else if (ftruncate(fd, (off_t)(mb << 20)) < 0) {
                        rc = cove_err_set(err, errno, "size %s", tmp);
                        close(fd);
                } else {
                        close(fd);
                        /* only a fully formatted image gets the real name */
                        if ((rc = run_mkfs(tmp, err)) == 0 && rename(tmp, out) < 0)
                                rc = cove_err_set(err, errno, "rename %s", tmp);
                }
                if (rc < 0)
                        unlink(tmp);
        }
        pthread_mutex_unlock(&l->lock);
        return rc;
}

/* Copy src to dst keeping holes (the golden image is mostly holes). */
static int sparse_copy(const char *src, int dfd, const char *dst, struct cove_err *err)
{
        cleanup_close int in = open(src, O_RDONLY | O_CLOEXEC);
        cleanup_close int out = openat(dfd, dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        struct stat st;
        if (in < 0 || fstat(in, &st) < 0)
                return cove_err_set(err, errno, "open %s", src);
        if (out < 0)
                return cove_err_set(err, errno, "create layer image %s", dst);
        if (ftruncate(out, st.st_size) < 0)
                return cove_err_set(err, errno, "size layer image %s", dst);
        off_t pos = 0;
        while (pos < st.st_size) {
                off_t data = lseek(in, pos, SEEK_DATA);
                if (data < 0) {
                        if (errno == ENXIO)
                                break; /* only holes left */
                        return cove_err_set(err, errno, "seek %s", src);
                }
                off_t hole = lseek(in, data, SEEK_HOLE);
                if (hole < 0)
                        return cove_err_set(err, errno, "seek %s", src);
                loff_t a = data, b = data;
                size_t left = (size_t)(hole - data);
                while (left > 0) {
                        ssize_t n = copy_file_range(in, &a, out, &b, left, 0);
                        if (n <= 0)
                                return cove_err_set(err, n < 0 ? errno : EIO, "copy %s", src);
                        left -= (size_t)n;
                }
                pos = hole;
        }
        return 0;
}

/* Attach image (relative to dfd) to a free loop device and mount its ext4 without attaching
 * it anywhere: returns the fsmount() fd. The loop device has autoclear, so it goes away as
 * soon as the filesystem is gone: when the detached mount's last fd is closed (also by the
 * kernel when coved dies), or when an attached mount is unmounted. */
static int loop_fsmount(int dfd, const char *image, struct cove_err *err)
{
        cleanup_close int img = openat(dfd, image, O_RDWR | O_CLOEXEC);
        if (img < 0)
                return cove_err_set(err, errno, "open %s", image);
        cleanup_close int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
        if (ctl < 0)
                return cove_err_set(err, errno, "open /dev/loop-control");
        for (int tries = 0; tries < 50; tries++) {
                int n = ioctl(ctl, LOOP_CTL_GET_FREE);
                if (n < 0)
                        return cove_err_set(err, errno, "LOOP_CTL_GET_FREE");
                char dev[64];
                snprintf(dev, sizeof(dev), "/dev/loop%d", n);
                cleanup_close int lfd = open(dev, O_RDWR | O_CLOEXEC);
                if (lfd < 0)
                        return cove_err_set(err, errno, "open %s", dev);
                struct loop_config cfg;
                memset(&cfg, 0, sizeof(cfg));
                cfg.fd = (unsigned)img;
                cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
                if (ioctl(lfd, LOOP_CONFIGURE, &cfg) < 0) {
                        if (errno == EBUSY)
                                continue; /* raced with another user of loop devices */
                        return cove_err_set(err, errno, "LOOP_CONFIGURE %s", dev);
                }
                cleanup_close int fs = fsopen("ext4", FSOPEN_CLOEXEC);
                if (fs < 0)
                        return cove_err_set(err, errno, "fsopen ext4");
                if (fsconfig(fs, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
                    fsconfig(fs, FSCONFIG_SET_FLAG, "noinit_itable", NULL, 0) < 0 ||
                    fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                        return cove_err_set(err, errno, "mount ext4 of %s on %s", image, dev);
                int m = fsmount(fs, FSMOUNT_CLOEXEC,
                                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOATIME);
                if (m < 0)
                        return cove_err_set(err, errno, "fsmount %s", dev);
                return m;
        }
        return cove_err_set(err, EBUSY, "no free loop device");
}

/* Attach a detached mount (fsmount fd) at dir <name> under dfd. */
static int attach(int mfd, int dfd, const char *name, struct cove_err *err)
{
        if (move_mount(mfd, "", dfd, name, MOVE_MOUNT_F_EMPTY_PATH) < 0)
                return cove_err_set(err, errno, "attach layer mount at %s", name);
        return 0;
}

static int is_mountpoint(int dfd, const char *name)
{
        struct stat a, b;
        if (fstatat(dfd, name, &a, AT_SYMLINK_NOFOLLOW) < 0 || fstat(dfd, &b) < 0)
                return 0;
        return a.st_dev != b.st_dev;
}

/* ---- warm pool ----
 * The refill thread keeps pool_n layers per size ready, each as a detached mount (see quota.h).
 * Nothing of a warm layer is reachable by path except its image file, and the kernel drops
 * the mount (and with it the autoclear loop device) when the fd goes, whatever way coved ends. */

static void pool_entry_drop(struct cove_layers *l, struct pool_entry *e)
{
        if (e->mfd >= 0)
                close(e->mfd);
        e->mfd = -1;
        unlinkat(l->pool_fd, e->name, 0);
}

/* Build one warm layer of mb (pool_lock not held). */
static int pool_make(struct cove_layers *l, uint64_t mb, unsigned seq, struct pool_entry *e,
                     struct cove_err *err)
{
        char golden[PATH_MAX + 32];
        cleanup_close int root = -1;
        e->mfd = -1;
        snprintf(e->name, sizeof(e->name), "%llu-%u.img", (unsigned long long)mb, seq);
        if (golden_for(l, mb, golden, sizeof(golden), err) < 0)
                return -1;
        if (sparse_copy(golden, l->pool_fd, e->name, err) < 0)
                goto fail;
        if ((e->mfd = loop_fsmount(l->pool_fd, e->name, err)) < 0)
                goto fail;
        root = openat(e->mfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (root < 0 || fchmod(root, 0711) < 0) {
                cove_err_set(err, errno, "open warm layer %s", e->name);
                goto fail;
        }
        /* owners are set at take time: the uid range is not known yet */
        if (mkdirat(root, "upper", 0755) < 0 || mkdirat(root, "work", 0700) < 0 ||
            mkdirat(root, "mnt", 0755) < 0) {
                cove_err_set(err, errno, "mkdir in warm layer %s", e->name);
                goto fail;
        }
        return 0;
fail:
        pool_entry_drop(l, e);
        return cove_err_wrap(err, "warm layer of %llu MB", (unsigned long long)mb);
}

static struct pool_size *pool_find(struct cove_layers *l, uint64_t mb)
{
        for (unsigned i = 0; i < l->nsizes; i++)
                if (l->sizes[i].mb == mb)
                        return &l->sizes[i];
        return NULL;
}

static void *pool_refill_main(void *arg)
{
        struct cove_layers *l = arg;
        pthread_mutex_lock(&l->pool_lock);
        while (!l->stopping) {
                struct pool_size *ps = NULL;
                for (unsigned i = 0; i < l->nsizes && !ps; i++)
                        if (!l->sizes[i].failed && l->sizes[i].count < l->pool_n)
                                ps = &l->sizes[i];
                if (!ps) {
                        pthread_cond_wait(&l->pool_cond, &l->pool_lock);
                        continue;
                }
                uint64_t mb = ps->mb;
                unsigned seq = l->seq++;
                pthread_mutex_unlock(&l->pool_lock);
                struct pool_entry e;
                struct cove_err err;
                int rc = pool_make(l, mb, seq, &e, &err);
                pthread_mutex_lock(&l->pool_lock);
                if (rc < 0)
                        ps->failed = 1; /* retried on the next take of this size */
                else if (l->stopping || ps->count >= l->pool_n)
                        pool_entry_drop(l, &e);
                else
                        ps->e[ps->count++] = e;
        }
        pthread_mutex_unlock(&l->pool_lock);
        return NULL;
}

/* A warm layer of mb into *e (1), or none ready (0); either way the refill thread is told. */
static int pool_take(struct cove_layers *l, uint64_t mb, struct pool_entry *e)
{
        if (!l->pool_n)
                return 0;
        int got = 0;
        pthread_mutex_lock(&l->pool_lock);
        struct pool_size *ps = pool_find(l, mb);
        if (!ps && l->nsizes < POOL_SIZES) {
                ps = &l->sizes[l->nsizes];
                ps->e = calloc(l->pool_n, sizeof(*ps->e));
                if (ps->e) {
                        ps->mb = mb;
                        l->nsizes++;
                } else {
                        ps = NULL; /* no pool for this size; the caller builds the layer */
                }
        }
        if (ps) {
                if (ps->count) {
                        *e = ps->e[--ps->count];
                        got = 1;
                }
                ps->failed = 0;
                pthread_cond_signal(&l->pool_cond);
        }
        pthread_mutex_unlock(&l->pool_lock);
        return got;
}

/* Warm layers a crashed coved left: their mounts died with it, but an autoclear loop device may
 * still hold an image while its last user goes away; detach those and delete the images. */
static int pool_reclaim(struct cove_layers *l, struct cove_err *err)
{
        char real[PATH_MAX];
        if (!realpath(l->pool, real))
                return cove_err_set(err, errno, "resolve %s", l->pool);
        size_t rl = strlen(real);
        cleanup_dir DIR *d = opendir("/sys/block");
        struct dirent *de;
        while (d && (de = readdir(d))) {
                int n;
                char extra;
                if (sscanf(de->d_name, "loop%d%c", &n, &extra) != 1)
                        continue;
                char p[300], back[PATH_MAX];
                snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
                cleanup_close int bf = open(p, O_RDONLY | O_CLOEXEC);
                ssize_t len = bf < 0 ? -1 : read(bf, back, sizeof(back) - 1);
                if (len <= 0)
                        continue; /* unbound */
                back[len] = 0;
                if (strncmp(back, real, rl) != 0 || back[rl] != '/')
                        continue;
                snprintf(p, sizeof(p), "/dev/loop%d", n);
                cleanup_close int lfd = open(p, O_RDWR | O_CLOEXEC);
                /* a device still in use only gets autoclear (it has it already): harmless */
                if (lfd >= 0)
                        ioctl(lfd, LOOP_CLR_FD, 0);
        }
        if (cove_rm_rf(l->pool, err) < 0 || cove_mkdir_p(l->pool, 0700, err) < 0)
                return cove_err_wrap(err, "reset %s", l->pool);
        return 0;
}

struct cove_layers *cove_layers_open(const char *ns_dir, unsigned pool_n, struct cove_err *err)
{
        struct cove_layers *l = calloc(1, sizeof(*l));
        if (!l) {
                cove_err_set(err, ENOMEM, "layers");
                return NULL;
        }
        l->fd = l->pool_fd = -1;
        pthread_mutex_init(&l->lock, NULL);
        pthread_mutex_init(&l->pool_lock, NULL);
        pthread_cond_init(&l->pool_cond, NULL);
        if (snprintf(l->dir, sizeof(l->dir), "%s/layers", ns_dir) >= (int)sizeof(l->dir) ||
            snprintf(l->golden, sizeof(l->golden), "%s/golden", ns_dir) >= (int)sizeof(l->golden) ||
            snprintf(l->pool, sizeof(l->pool), "%s/pool", ns_dir) >= (int)sizeof(l->pool)) {
                cove_err_set(err, ENAMETOOLONG, "layers under %s", ns_dir);
                goto fail;
        }
        if (cove_mkdir_p(l->dir, 0700, err) < 0 || cove_mkdir_p(l->golden, 0700, err) < 0 ||
            cove_mkdir_p(l->pool, 0700, err) < 0)
                goto fail;
        /* sandbox roots (unprivileged host uids) traverse it to reach their own layer */
        if (chmod(l->dir, 0711) < 0) {
                cove_err_set(err, errno, "chmod %s", l->dir);
                goto fail;
        }
        l->fd = open(l->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (l->fd < 0) {
                cove_err_set(err, errno, "open %s", l->dir);
                goto fail;
        }
        /* also with the pool off: a previous run may have had one */
        if (pool_reclaim(l, err) < 0)
                goto fail;
        l->pool_fd = open(l->pool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (l->pool_fd < 0) {
                cove_err_set(err, errno, "open %s", l->pool);
                goto fail;
        }
        l->pool_n = pool_n;
        if (pool_n) {
                int e = pthread_create(&l->refill, NULL, pool_refill_main, l);
                if (e) {
                        cove_err_set(err, e, "layer pool thread");
                        goto fail;
                }
                l->thread_ok = 1;
        }
        return l;
fail:
        cove_err_wrap(err, "ns layers");
        cove_layers_close(l);
        return NULL;
}

void cove_layers_close(struct cove_layers *l)
{
        if (!l)
                return;
        if (l->thread_ok) {
                pthread_mutex_lock(&l->pool_lock);
                l->stopping = 1;
                pthread_cond_broadcast(&l->pool_cond);
                pthread_mutex_unlock(&l->pool_lock);
                pthread_join(l->refill, NULL);
        }
        for (unsigned i = 0; i < l->nsizes; i++) {
                for (unsigned k = 0; k < l->sizes[i].count; k++)
                        pool_entry_drop(l, &l->sizes[i].e[k]);
                free(l->sizes[i].e);
        }
        if (l->fd >= 0)
                close(l->fd);
        if (l->pool_fd >= 0)
                close(l->pool_fd);
        pthread_cond_destroy(&l->pool_cond);
        pthread_mutex_destroy(&l->pool_lock);
        pthread_mutex_destroy(&l->lock);
        free(l);
}

/* A new image <img> for layer <id>, mounted there: a warm one when ready, else built now. */
static int layer_create_mounted(struct cove_layers *l, const char *id, const char *img, uint64_t mb,
                                struct cove_err *err)
{
        struct pool_entry e;
        if (pool_take(l, mb, &e)) {
                /* an image with a loop device stays attached across a rename */
                int rc = 0;
                if (renameat(l->pool_fd, e.name, l->fd, img) < 0)
                        rc = cove_err_set(err, errno, "move warm layer %s to %s", e.name, img);
                else
                        rc = attach(e.mfd, l->fd, id, err);
                if (rc < 0)
                        pool_entry_drop(l, &e); /* image already moved: the caller removes it */
                else
                        close(e.mfd);
                return rc;
        }
        char golden[PATH_MAX + 32];
        if (golden_for(l, mb, golden, sizeof(golden), err) < 0 ||
            sparse_copy(golden, l->fd, img, err) < 0)
                return -1;
        cleanup_close int m = loop_fsmount(l->fd, img, err);
        if (m < 0)
                return -1;
        return attach(m, l->fd, id, err);
}

int cove_layer_prepare(struct cove_layers *l, const char *id, uint64_t limit_mb, uid_t owner,
                       gid_t group, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        char img[256];
        snprintf(img, sizeof(img), "%s.img", id);
        int created = 0;
        cleanup_close int fd = -1;
        if (mkdirat(l->fd, id, 0711) == 0)
                created = 1;
        else if (errno != EEXIST)
                return cove_err_set(err, errno, "layer: mkdir %s/%s", l->dir, id);
        if (limit_mb) {
                if (limit_mb < 16)
                        limit_mb = 16; /* ext4 needs room for its own metadata */
                if (faccessat(l->fd, img, F_OK, 0) < 0) {
                        created = 1;
                        if (layer_create_mounted(l, id, img, limit_mb, err) < 0)
                                goto fail;
                } else if (!is_mountpoint(l->fd, id)) {
                        cleanup_close int m = loop_fsmount(l->fd, img, err);
                        if (m < 0 || attach(m, l->fd, id, err) < 0)
                                goto fail;
                }
        }
        fd = openat(l->fd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fchmod(fd, 0711) < 0) {
                cove_err_set(err, errno, "layer: open %s/%s", l->dir, id);
                goto fail;
        }
        static const struct {
                const char *name;
                mode_t mode;
        } subs[] = {{"upper", 0755}, {"work", 0700}, {"mnt", 0755}};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(subs); i++) {
                if (mkdirat(fd, subs[i].name, subs[i].mode) < 0 && errno != EEXIST) {
                        cove_err_set(err, errno, "layer: mkdir %s/%s", id, subs[i].name);
                        goto fail;
                }
                if (fchownat(fd, subs[i].name, owner, group, AT_SYMLINK_NOFOLLOW) < 0) {
                        cove_err_set(err, errno, "layer: chown %s/%s", id, subs[i].name);
                        goto fail;
                }
        }
        return created;
fail:
        if (created)
                cove_layer_remove(l, id, NULL);
        else
                cove_layer_release(l, id, NULL);
        return cove_err_wrap(err, "layer %s", id);
}

int cove_layer_release(struct cove_layers *l, const char *id, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        if (!is_mountpoint(l->fd, id))
                return 0;
        char mp[PATH_MAX + 256];
        snprintf(mp, sizeof(mp), "%s/%s", l->dir, id);
        if (umount2(mp, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
                return cove_err_set(err, errno, "layer: unmount %s", mp);
        return 0;
}

int cove_layer_remove(struct cove_layers *l, const char *id, struct cove_err *err)
{
        if (cove_layer_release(l, id, err) < 0)
                return -1;
        char p[PATH_MAX + 256];
        snprintf(p, sizeof(p), "%s/%s", l->dir, id);
        if (cove_rm_rf(p, err) < 0)
                return cove_err_wrap(err, "layer: remove");
        snprintf(p, sizeof(p), "%s.img", id);
        if (unlinkat(l->fd, p, 0) < 0 && errno != ENOENT)
                return cove_err_set(err, errno, "layer: remove %s/%s", l->dir, p);
        return 0;
}
