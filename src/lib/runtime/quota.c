/* Per-sandbox ext4 layer images of the ns runtime on a reflink-capable layer filesystem, warm
 * pool, snapshots and images opened outside an instance (see quota.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fscrypt.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>
#include <linux/loop.h>

#include "runtime/quota.h"
#include "util/cleanup.h"
#include "util/util.h"

extern char **environ;

#define POOL_SIZES 8       /* distinct disk sizes kept warm; further sizes pay the full cost */
#define LFS_MAX_GB 1024    /* the layer filesystem's (sparse) size is capped at 1 TiB */
#define LFS_CLOSE_MS 30000 /* close(): longest wait for loop devices to let go */
#define LFS_IDLE_MS 2000   /* close(): and for a busy one without loop devices */
#define LFS_MIN_GB 4
#ifndef EXT4_IOC_CHECKPOINT
#define EXT4_IOC_CHECKPOINT _IOW('f', 43, uint32_t)
#endif

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
        char dir[PATH_MAX];        /* <ns_dir>/layers: mount points <id>/ */
        char lfs[PATH_MAX];        /* <ns_dir>/lfs: mount point of the layer filesystem */
        char images[PATH_MAX];     /* <lfs>/layers: <id>.img */
        char golden[PATH_MAX];     /* <lfs>/golden: <mb>.img, formatted, never mounted */
        char pool[PATH_MAX];       /* <lfs>/pool: images of warm layers */
        char snap[PATH_MAX];       /* <lfs>/snap: the caller's images (layer_dir) */
        int fd;                    /* open on dir */
        int img_fd;                /* open on images */
        int pool_fd;               /* open on pool */
        int reflink;               /* lfs is the XFS with reflinks (else a plain directory) */
        pthread_mutex_t lock;      /* serialises golden image creation */
        unsigned pool_n;           /* warm layers per size (0: no pool, no thread) */
        pthread_mutex_t pool_lock; /* guards everything below */
        pthread_cond_t pool_cond;  /* refill thread waits for demand or stop */
        struct pool_size sizes[POOL_SIZES]; /* [nsizes] */
        unsigned nsizes;
        unsigned seq;     /* names of pool images */
        int stopping;     /* close() asks the refill thread to end */
        int thread_ok;    /* refill thread was started */
        int tainted;      /* the host disk ran (nearly) full since the warm layers were made */
        pthread_t refill; /* the refill thread */
};

const char *cove_layers_path(const struct cove_layers *l)
{
        return l->dir;
}

const char *cove_layers_image_dir(const struct cove_layers *l)
{
        return l->snap;
}

static int check_id(const char *id, struct cove_err *err)
{
        if (!id || !*id || strchr(id, '/') || id[0] == '.' || strlen(id) > 200)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "layer: bad id");
        return 0;
}

/* Run argv (mkfs, e2fsck) with stdout on /dev/null and wait for it; an exit status above
 * ok_max is a failure. */
static int run_prog(char *const argv[], const char *package, int ok_max, struct cove_err *err)
{
        pid_t pid;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, rc,
                                     "run %s (install the Debian package %s)", argv[0], package);
        int st;
        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        return cove_err_set(err, errno, "wait %s", argv[0]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) > ok_max)
                return cove_err_set(err, 0, "%s failed (status %d)", argv[0], st);
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
                        "-O",
                        "encrypt", /* fscrypt (a keyed layer); costs nothing otherwise */
                        (char *)image,
                        NULL};
        if (run_prog(argv, "e2fsprogs", 0, err) < 0)
                return cove_err_wrap(err, "format %s", image);
        return 0;
}

/* Path of the golden image for size mb, formatting it on first use. */
static int golden_for(struct cove_layers *l, uint64_t mb, char *out, size_t cap,
                      struct cove_err *err)
{
        /* "-e": formatted with the encrypt feature (older data dirs keep their <mb>.img) */
        snprintf(out, cap, "%s/%llu-e.img", l->golden, (unsigned long long)mb);
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

/* Copy in to out: a reflink clone when both lie on the layer filesystem (instant, shares
 * every block), else a copy of the allocated extents only (holes kept). */
static int copy_fd(int in, int out, struct cove_err *err)
{
        if (ioctl(out, FICLONE, in) == 0)
                return 0;
        if (errno != EOPNOTSUPP && errno != EXDEV && errno != EINVAL && errno != ENOTTY)
                return cove_err_set(err, errno, "reflink clone");
        struct stat st;
        if (fstat(in, &st) < 0 || ftruncate(out, st.st_size) < 0)
                return cove_err_set(err, errno, "size copy");
        off_t pos = 0;
        while (pos < st.st_size) {
                off_t data = lseek(in, pos, SEEK_DATA);
                if (data < 0) {
                        if (errno == ENXIO)
                                break; /* only holes left */
                        return cove_err_set(err, errno, "seek");
                }
                off_t hole = lseek(in, data, SEEK_HOLE);
                if (hole < 0)
                        return cove_err_set(err, errno, "seek");
                loff_t a = data, b = data;
                size_t left = (size_t)(hole - data);
                while (left > 0) {
                        ssize_t n = copy_file_range(in, &a, out, &b, left, 0);
                        if (n <= 0)
                                return cove_err_set(err, n < 0 ? errno : EIO, "copy");
                        left -= (size_t)n;
                }
                pos = hole;
        }
        return 0;
}

/* New file dst (relative to dfd, must not exist) with the content of src. */
static int sparse_copy(const char *src, int dfd, const char *dst, struct cove_err *err)
{
        cleanup_close int in = open(src, O_RDONLY | O_CLOEXEC);
        if (in < 0)
                return cove_err_set(err, errno, "open %s", src);
        cleanup_close int out = openat(dfd, dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0)
                return cove_err_set(err, errno, "create layer image %s", dst);
        if (copy_fd(in, out, err) < 0)
                return cove_err_wrap(err, "copy %s to %s", src, dst);
        return 0;
}

/* Attach the image file img to a free loop device and mount its filesystem (fstype) without
 * attaching it anywhere: returns the fsmount() fd. The loop device has autoclear, so it goes
 * away as soon as the filesystem is gone: when the detached mount's last fd is closed (also by
 * the kernel when coved dies), or when an attached mount is unmounted. ro: read-only device
 * and mount. */
/* A detached mount of the filesystem (fstype) on loop device dev; -1 with errno. */
static int dev_fsmount(const char *dev, const char *fstype, int ro)
{
        cleanup_close int fs = fsopen(fstype, FSOPEN_CLOEXEC);
        if (fs < 0)
                return -1;
        if (fsconfig(fs, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
            (!strcmp(fstype, "ext4") && !ro &&
             fsconfig(fs, FSCONFIG_SET_FLAG, "noinit_itable", NULL, 0) < 0) ||
            (ro && fsconfig(fs, FSCONFIG_SET_FLAG, "ro", NULL, 0) < 0) ||
            fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                return -1;
        return fsmount(fs, FSMOUNT_CLOEXEC,
                       MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOATIME |
                           (ro ? MOUNT_ATTR_RDONLY : 0));
}

/* A loop device already bound to the file open as img with the same read-only flag (a mount
 * of it outlived the coved that made it: a sandbox's mount namespace still holds it after a
 * kill -9, or after a stop in a private mount namespace): its number, or -1. Mounting that
 * device again gets the kernel's existing superblock; a second loop device on the same file
 * would be a second, independent filesystem on the same bytes (XFS refuses it by its UUID;
 * ext4 would corrupt the image). */
static int loop_bound_to(int img, int ro)
{
        struct stat want;
        if (fstat(img, &want) < 0)
                return -1;
        cleanup_dir DIR *d = opendir("/sys/block");
        struct dirent *de;
        while (d && (de = readdir(d))) {
                int n;
                char extra;
                if (sscanf(de->d_name, "loop%d%c", &n, &extra) != 1)
                        continue;
                char p[300];
                snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
                if (access(p, F_OK) < 0)
                        continue; /* unbound */
                snprintf(p, sizeof(p), "/dev/loop%d", n);
                cleanup_close int lfd = open(p, O_RDONLY | O_CLOEXEC);
                struct loop_info64 li;
                if (lfd < 0 || ioctl(lfd, LOOP_GET_STATUS64, &li) < 0)
                        continue;
                if (li.lo_device == (uint64_t)want.st_dev && li.lo_inode == (uint64_t)want.st_ino &&
                    !(li.lo_flags & LO_FLAGS_READ_ONLY) == !ro)
                        return n;
        }
        return -1;
}

/* fresh: img is a file this process made just now (a copy, a clone), so no loop device can be
 * bound to it (a bound file stays open in the kernel: its inode number is not reused) and the
 * scan of every loop device (thousands on a long-lived host, most of a resume's start) is
 * skipped. */
static int loop_fsmount_fd(int img, const char *name, const char *fstype, int ro, int fresh,
                           struct cove_err *err)
{
        char dev[64];
        int bound = fresh ? -1 : loop_bound_to(img, ro);
        if (bound >= 0) {
                snprintf(dev, sizeof(dev), "/dev/loop%d", bound);
                int m = dev_fsmount(dev, fstype, ro);
                if (m >= 0)
                        return m;
                /* it let go of the file meanwhile (autoclear): bind a free device below */
        }
        cleanup_close int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
        if (ctl < 0)
                return cove_err_set(err, errno, "open /dev/loop-control");
        for (int tries = 0; tries < 50; tries++) {
                int n = ioctl(ctl, LOOP_CTL_GET_FREE);
                if (n < 0)
                        return cove_err_set(err, errno, "LOOP_CTL_GET_FREE");
                snprintf(dev, sizeof(dev), "/dev/loop%d", n);
                cleanup_close int lfd = open(dev, O_RDWR | O_CLOEXEC);
                if (lfd < 0)
                        return cove_err_set(err, errno, "open %s", dev);
                struct loop_config cfg;
                memset(&cfg, 0, sizeof(cfg));
                cfg.fd = (unsigned)img;
                cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (ro ? LO_FLAGS_READ_ONLY : 0);
                if (ioctl(lfd, LOOP_CONFIGURE, &cfg) < 0) {
                        if (errno == EBUSY)
                                continue; /* raced with another user of loop devices */
                        return cove_err_set(err, errno, "LOOP_CONFIGURE %s", dev);
                }
                int m = dev_fsmount(dev, fstype, ro);
                if (m < 0)
                        return cove_err_set(err, errno, "mount %s of %s on %s", fstype, name, dev);
                return m;
        }
        return cove_err_set(err, EBUSY, "no free loop device");
}

/* loop_fsmount_fd() of the ext4 image <image> under dfd, read-write. */
static int loop_fsmount(int dfd, const char *image, int fresh, struct cove_err *err)
{
        cleanup_close int img = openat(dfd, image, O_RDWR | O_CLOEXEC);
        if (img < 0)
                return cove_err_set(err, errno, "open %s", image);
        return loop_fsmount_fd(img, image, "ext4", 0, fresh, err);
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

/* The dirs of a new layer image, in its root (an fd, or -1 when opening it failed):
 * root-owned on disk = owned by the sandbox's root through its idmapped mount. */
static int layer_dirs(int root, const char *what, struct cove_err *err)
{
        if (root < 0 || fchmod(root, 0700) < 0 || mkdirat(root, "upper", 0755) < 0 ||
            mkdirat(root, "work", 0700) < 0 || mkdirat(root, "mnt", 0755) < 0)
                return cove_err_set(err, errno, "make layer dirs in %s", what);
        return 0;
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
        if ((e->mfd = loop_fsmount(l->pool_fd, e->name, 1, err)) < 0)
                goto fail;
        root = openat(e->mfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (layer_dirs(root, e->name, err) < 0)
                goto fail;
        return 0;
fail:
        pool_entry_drop(l, e);
        return cove_err_wrap(err, "warm layer of %llu MB", (unsigned long long)mb);
}

/* The layer images are sparse, on the sparse layer filesystem: when the host disk under them
 * fills up, a write to any of them fails with EIO and ext4 aborts its journal (the layer goes
 * read-only for good), also in warm layers that only had a write pending. So a warm layer made
 * before the host disk ran full is not handed out: the pool is dropped and made again. */
#define POOL_LOW_SPACE_MB 16

static int host_space_low(struct cove_layers *l)
{
        struct statvfs vf;
        return statvfs(l->dir, &vf) == 0 &&
               ((uint64_t)vf.f_bavail * vf.f_frsize >> 20) < POOL_LOW_SPACE_MB;
}

/* pool_lock held: drop every warm layer when the disk ran low since they were made. */
static void pool_check_taint_locked(struct cove_layers *l)
{
        int low = host_space_low(l);
        if (low)
                l->tainted = 1;
        if (!l->tainted)
                return;
        for (unsigned i = 0; i < l->nsizes; i++) {
                while (l->sizes[i].count)
                        pool_entry_drop(l, &l->sizes[i].e[--l->sizes[i].count]);
                l->sizes[i].failed = low; /* no refill while the disk is still full */
        }
        l->tainted = low;
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
                        /* wake each second to watch the host disk (see host_space_low) */
                        struct timespec ts;
                        clock_gettime(CLOCK_REALTIME, &ts);
                        ts.tv_sec += 1;
                        pthread_cond_timedwait(&l->pool_cond, &l->pool_lock, &ts);
                        pool_check_taint_locked(l);
                        continue;
                }
                uint64_t mb = ps->mb;
                unsigned seq = l->seq++;
                pthread_mutex_unlock(&l->pool_lock);
                struct pool_entry e;
                struct cove_err err;
                int rc = pool_make(l, mb, seq, &e, &err);
                pthread_mutex_lock(&l->pool_lock);
                pool_check_taint_locked(l);
                if (rc < 0)
                        ps->failed = 1; /* retried on the next take of this size */
                else if (l->stopping || ps->count >= l->pool_n || l->tainted)
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
        pool_check_taint_locked(l);
        if (ps) {
                while (!got && ps->count) {
                        *e = ps->e[--ps->count];
                        /* a metadata write (same mode) starts a journal handle: a layer whose
                         * journal aborted on a write error says EROFS here, not in the
                         * sandbox */
                        int root = openat(e->mfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                        got = root >= 0 && fchmod(root, 0700) == 0;
                        if (root >= 0)
                                close(root);
                        if (!got)
                                pool_entry_drop(l, e);
                }
                ps->failed = 0;
                pthread_cond_signal(&l->pool_cond);
        }
        pthread_mutex_unlock(&l->pool_lock);
        return got;
}

/* Calls fn(backing_file, arg) for every bound loop device until fn returns non-zero;
 * returns how many calls returned non-zero (0 or 1 when fn stops, else a count). */
static int for_each_loop_backing(int (*fn)(const char *back, void *arg), void *arg, int stop)
{
        int k = 0;
        cleanup_dir DIR *d = opendir("/sys/block");
        struct dirent *de;
        while (d && (de = readdir(d))) {
                if (strncmp(de->d_name, "loop", 4) != 0)
                        continue;
                char p[300], back[PATH_MAX];
                snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
                cleanup_close int bf = open(p, O_RDONLY | O_CLOEXEC);
                ssize_t len = bf < 0 ? -1 : read(bf, back, sizeof(back) - 1);
                if (len <= 0)
                        continue;
                back[len] = 0;
                back[strcspn(back, "\n")] = 0;
                if (fn(back, arg)) {
                        k++;
                        if (stop)
                                break;
                }
        }
        return k;
}

static int backing_under(const char *back, void *arg)
{
        const char *real = arg;
        size_t rl = strlen(real);
        return !strncmp(back, real, rl) && (back[rl] == '/' || back[rl] == 0);
}

/* How many loop devices are bound to the file path or to a file under it. */
static int loops_under(const char *dir)
{
        char real[PATH_MAX];
        if (!realpath(dir, real))
                return 0;
        return for_each_loop_backing(backing_under, real, 0);
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

/* The layer filesystem: one sparse XFS image with reflinks (<ns_dir>/layerfs.img), formatted
 * once and loop-mounted at <ns_dir>/lfs; a mount that outlived a crashed coved is reused as it
 * is, and a loop device still bound to the image (a sandbox's mount namespace holding the
 * filesystem) is mounted again rather than a second one (loop_bound_to). coved.lock keeps a
 * second coved off the same data directory. Its size is the free space of ns_dir's filesystem at
 * creation (capped at 1 TiB): it is sparse, the host only pays for what is written. Without
 * mkfs.xfs lfs stays a plain directory and every clone becomes a copy of allocated extents (slower
 * snapshots, same results). */
static int layerfs_setup(struct cove_layers *l, const char *ns_dir, struct cove_err *err)
{
        char img[PATH_MAX + 32];
        snprintf(img, sizeof(img), "%s/layerfs.img", ns_dir);
        if (mkdir(l->lfs, 0700) < 0 && errno != EEXIST)
                return cove_err_set(err, errno, "mkdir %s", l->lfs);
        struct stat a, b;
        struct statfs sf;
        if (stat(l->lfs, &a) < 0 || stat(ns_dir, &b) < 0)
                return cove_err_set(err, errno, "stat %s", l->lfs);
        if (a.st_dev != b.st_dev) { /* mounted by a previous run */
                /* a coved killed inside a revoke's freeze (control/tenant.c) left it frozen:
                 * every layer's writes would hang; EINVAL when not frozen */
                cleanup_close int lf = open(l->lfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (lf >= 0)
                        ioctl(lf, FITHAW, 0);
                l->reflink = statfs(l->lfs, &sf) == 0 && sf.f_type == 0x58465342; /* XFS */
                return 0;
        }
        if (access(img, F_OK) < 0) {
                struct statvfs vf;
                if (statvfs(ns_dir, &vf) < 0)
                        return cove_err_set(err, errno, "statvfs %s", ns_dir);
                uint64_t gb = (uint64_t)vf.f_bavail * vf.f_frsize / 10 * 9 >> 30;
                if (gb > LFS_MAX_GB)
                        gb = LFS_MAX_GB;
                if (gb < LFS_MIN_GB)
                        gb = LFS_MIN_GB;
                char tmp[PATH_MAX + 48];
                snprintf(tmp, sizeof(tmp), "%s.tmp", img);
                cleanup_close int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
                if (fd < 0 || ftruncate(fd, (off_t)(gb << 30)) < 0)
                        return cove_err_set(err, errno, "create %s", tmp);
                /* -K: no discard of a sparse file; a small log: mkfs allocates it whole */
                char *argv[] = {"mkfs.xfs", "-q", "-f",       "-m", "reflink=1",
                                "-K",       "-l", "size=64m", tmp,  NULL};
                struct cove_err e;
                if (run_prog(argv, "xfsprogs", 0, &e) < 0) {
                        unlink(tmp);
                        if (e.kind == COVE_E_UNAVAILABLE)
                                return 0; /* no xfsprogs: plain directory, copies */
                        if (err)
                                *err = e;
                        return cove_err_wrap(err, "format %s", tmp);
                }
                if (rename(tmp, img) < 0)
                        return cove_err_set(err, errno, "rename %s", tmp);
        }
        cleanup_close int fd = open(img, O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return cove_err_set(err, errno, "open %s", img);
        cleanup_close int m = loop_fsmount_fd(fd, img, "xfs", 0, 0, err);
        if (m < 0)
                return cove_err_wrap(err, "layer filesystem");
        if (move_mount(m, "", AT_FDCWD, l->lfs, MOVE_MOUNT_F_EMPTY_PATH) < 0)
                return cove_err_set(err, errno, "attach layer filesystem at %s", l->lfs);
        l->reflink = 1;
        return 0;
}

struct cove_layers *cove_layers_open(const char *ns_dir, unsigned pool_n, struct cove_err *err)
{
        struct cove_layers *l = calloc(1, sizeof(*l));
        if (!l) {
                cove_err_set(err, ENOMEM, "layers");
                return NULL;
        }
        l->fd = l->img_fd = l->pool_fd = -1;
        pthread_mutex_init(&l->lock, NULL);
        /* an older coved (opt-in COVE_NS_EXPEDITE_FREEZE, gone) killed during a snapshot's
         * freeze left the host's rcu_expedited at 1, and this marker saying so */
        char mk[PATH_MAX + 32];
        snprintf(mk, sizeof(mk), "%s/rcu-expedited-by-coved", ns_dir);
        cleanup_close int rcu =
            unlink(mk) == 0 ? open("/sys/kernel/rcu_expedited", O_WRONLY | O_CLOEXEC) : -1;
        ssize_t rw = rcu >= 0 ? write(rcu, "0", 1) : 0; /* best effort */
        (void)rw;
        pthread_mutex_init(&l->pool_lock, NULL);
        pthread_cond_init(&l->pool_cond, NULL);
        if (snprintf(l->dir, sizeof(l->dir), "%s/layers", ns_dir) >= (int)sizeof(l->dir) ||
            snprintf(l->lfs, sizeof(l->lfs), "%s/lfs", ns_dir) >= (int)sizeof(l->lfs) - 16) {
                cove_err_set(err, ENAMETOOLONG, "layers under %s", ns_dir);
                goto fail;
        }
        snprintf(l->images, sizeof(l->images), "%s/layers", l->lfs);
        snprintf(l->golden, sizeof(l->golden), "%s/golden", l->lfs);
        snprintf(l->pool, sizeof(l->pool), "%s/pool", l->lfs);
        snprintf(l->snap, sizeof(l->snap), "%s/snap", l->lfs);
        if (cove_mkdir_p(l->dir, 0700, err) < 0 || layerfs_setup(l, ns_dir, err) < 0)
                goto fail;
        if (cove_mkdir_p(l->images, 0700, err) < 0 || cove_mkdir_p(l->golden, 0700, err) < 0 ||
            cove_mkdir_p(l->pool, 0700, err) < 0 || cove_mkdir_p(l->snap, 0700, err) < 0)
                goto fail;
        /* sandbox roots (unprivileged host uids) traverse it to reach their own layer */
        if (chmod(l->dir, 0711) < 0) {
                cove_err_set(err, errno, "chmod %s", l->dir);
                goto fail;
        }
        l->fd = open(l->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        l->img_fd = open(l->images, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (l->fd < 0 || l->img_fd < 0) {
                cove_err_set(err, errno, "open %s", l->fd < 0 ? l->dir : l->images);
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
        if (l->img_fd >= 0)
                close(l->img_fd);
        if (l->pool_fd >= 0)
                close(l->pool_fd);
        /* Unmount the layer filesystem unless a layer still uses it (a sandbox left running,
         * an open image): then it stays for the next open(). The loop devices of the layers
         * just unmounted and of the warm layers just closed let go of their images (files on
         * it, so it is busy until then) asynchronously: each after its ext4's last mount is
         * gone, in every mount namespace (a sandbox's child copies the host's mounts until
         * it pivots away), then from a kernel worker. Under load that took over the 200 ms
         * this used to allow, and the layer filesystem stayed mounted after a clean stop.
         * So: retry while a loop device still holds an image on it, bounded (LFS_CLOSE_MS). */
        if (l->reflink) {
                /* a loop device leaves sysfs before its image file is closed (a kernel
                 * worker's delayed fput): give up only after no loop was seen for a while */
                int64_t now = cove_mono_ns(), deadline = now + (int64_t)LFS_CLOSE_MS * 1000000;
                int64_t idle_until = now + (int64_t)LFS_IDLE_MS * 1000000;
                int gone = 0;
                while (!(gone = umount2(l->lfs, 0) == 0) && errno == EBUSY) {
                        now = cove_mono_ns();
                        if (loops_under(l->lfs))
                                idle_until = now + (int64_t)LFS_IDLE_MS * 1000000;
                        if (now > deadline || now > idle_until)
                                break;
                        struct timespec ts = {0, 5000000};
                        nanosleep(&ts, NULL);
                }
                /* and its own (autoclear) loop device, which lets go after the unmount the
                 * same way: a stopped coved leaves none behind */
                char img[PATH_MAX];
                size_t n = strlen(l->lfs);
                if (gone && n > 4 &&
                    (size_t)snprintf(img, sizeof(img), "%.*s/layerfs.img", (int)(n - 4), l->lfs) <
                        sizeof(img))
                        while (loops_under(img) && cove_mono_ns() < deadline) {
                                struct timespec ts = {0, 5000000};
                                nanosleep(&ts, NULL);
                        }
        }
        pthread_cond_destroy(&l->pool_cond);
        pthread_mutex_destroy(&l->pool_lock);
        pthread_mutex_destroy(&l->lock);
        free(l);
}

/* fscrypt v2: add key (COVE_LAYER_KEY_LEN bytes) to the filesystem of fd (any fd on it;
 * the key lives with the superblock and goes with it) and return its identifier. */
static int fscrypt_add(int fd, const uint8_t *key, uint8_t ident[16], struct cove_err *err)
{
        /* the argument ends in a flexible array: the raw key follows it in one buffer */
        _Alignas(struct fscrypt_add_key_arg)
            uint8_t buf[sizeof(struct fscrypt_add_key_arg) + COVE_LAYER_KEY_LEN];
        memset(buf, 0, sizeof(buf));
        struct fscrypt_add_key_arg *a = (struct fscrypt_add_key_arg *)buf;
        a->key_spec.type = FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
        a->raw_size = COVE_LAYER_KEY_LEN;
        memcpy(a->raw, key, COVE_LAYER_KEY_LEN);
        int rc = ioctl(fd, FS_IOC_ADD_ENCRYPTION_KEY, a);
        int e = errno;
        memcpy(ident, a->key_spec.u.identifier, 16);
        explicit_bzero(buf, sizeof(buf));
        if (rc < 0)
                return cove_err_set(err, e, "layer: add encryption key");
        return 0;
}

/* Encrypt the (empty) directory name under dfd with the key ident (AES-256-XTS contents,
 * AES-256-CTS names). */
static int fscrypt_policy(int dfd, const char *name, const uint8_t ident[16], struct cove_err *err)
{
        cleanup_close int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct fscrypt_policy_v2 p;
        memset(&p, 0, sizeof(p));
        p.version = FSCRYPT_POLICY_V2;
        p.contents_encryption_mode = FSCRYPT_MODE_AES_256_XTS;
        p.filenames_encryption_mode = FSCRYPT_MODE_AES_256_CTS;
        p.flags = FSCRYPT_POLICY_FLAGS_PAD_32;
        memcpy(p.master_key_identifier, ident, 16);
        if (fd < 0 || ioctl(fd, FS_IOC_SET_ENCRYPTION_POLICY, &p) < 0)
                return cove_err_set(err, errno, "layer: encrypt %s", name);
        return 0;
}

/* A new image <img> for layer <id>, mounted there: a warm one when ready, else built now.
 * A warm layer has its (empty) upper/, work/ and mnt/ already; a keyed one gets its policy
 * set on them by the caller, which fscrypt allows on an empty directory only. */
static int layer_create_mounted(struct cove_layers *l, const char *id, const char *img, uint64_t mb,
                                struct cove_err *err)
{
        struct pool_entry e;
        if (pool_take(l, mb, &e)) {
                /* an image with a loop device stays attached across a rename */
                int rc = 0;
                if (renameat(l->pool_fd, e.name, l->img_fd, img) < 0)
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
            sparse_copy(golden, l->img_fd, img, err) < 0)
                return -1;
        cleanup_close int m = loop_fsmount(l->img_fd, img, 1, err);
        if (m < 0)
                return -1;
        return attach(m, l->fd, id, err);
}

static int backing_is(const char *back, void *arg)
{
        const struct stat *want = arg;
        struct stat st;
        return stat(back, &st) == 0 && st.st_dev == want->st_dev && st.st_ino == want->st_ino;
}

/* Is a loop device bound to the file open as fd (a mount of it still alive)? */
static int image_in_use(int fd)
{
        struct stat want;
        if (fstat(fd, &want) < 0)
                return 0;
        return for_each_loop_backing(backing_is, &want, 1);
}

/* Make the caller's image file `from` layers/<img> (replacing an old one): a rename on the
 * layer filesystem, a copy (then unlink) from elsewhere. An image some mount still uses
 * (an unclosed layer_open() tree, or its autoclear loop device still letting go) is refused:
 * two ext4 mounts of one image would corrupt it. */
static int layer_adopt(struct cove_layers *l, const char *img, const char *from,
                       struct cove_err *err)
{
        cleanup_close int in = open(from, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (in < 0 || fstat(in, &st) < 0)
                return cove_err_setk(err, errno == ENOENT ? COVE_E_NOT_FOUND : COVE_E_INTERNAL,
                                     errno, "layer image %s", from);
        if (!S_ISREG(st.st_mode))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "layer image %s: not a file",
                                     from);
        for (int i = 0; image_in_use(in); i++) {
                if (i == 500)
                        return cove_err_setk(err, COVE_E_CONFLICT, EBUSY,
                                             "layer image %s is still mounted (close the tree "
                                             "fd and the layer handle first)",
                                             from);
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
        }
        if (renameat(AT_FDCWD, from, l->img_fd, img) == 0)
                return 0;
        if (errno != EXDEV)
                return cove_err_set(err, errno, "move %s to %s/%s", from, l->images, img);
        char tmp[300];
        snprintf(tmp, sizeof(tmp), "%s.in", img);
        unlinkat(l->img_fd, tmp, 0);
        cleanup_close int out =
            openat(l->img_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0)
                return cove_err_set(err, errno, "create %s/%s", l->images, tmp);
        if (copy_fd(in, out, err) < 0) {
                unlinkat(l->img_fd, tmp, 0);
                return cove_err_wrap(err, "copy %s to %s", from, l->images);
        }
        if (renameat(l->img_fd, tmp, l->img_fd, img) < 0) {
                int e = errno;
                unlinkat(l->img_fd, tmp, 0);
                return cove_err_set(err, e, "rename %s/%s", l->images, tmp);
        }
        unlink(from);
        return 0;
}

/* Adopt from_image that is still mounted as the detached mount from_mfd (taken over here,
 * closed in every case): move the file into layers/<img> (a rename on the layer filesystem: the
 * loop device follows the file, as for a warm layer) and attach that same mount at layers/<id>,
 * so a restored layer is mounted once, not unmounted and mounted again. */
static int layer_adopt_mounted(struct cove_layers *l, const char *id, const char *img,
                               const char *from, int from_mfd, struct cove_err *err)
{
        cleanup_close int m = from_mfd;
        if (renameat(AT_FDCWD, from, l->img_fd, img) < 0)
                return cove_err_set(err, errno, "move %s to %s/%s", from, l->images, img);
        return attach(m, l->fd, id, err);
}

int cove_layer_prepare(struct cove_layers *l, const char *id, uint64_t limit_mb, uid_t owner,
                       gid_t group, const char *from_image, int from_mfd, const uint8_t *key,
                       struct cove_err *err)
{
        uint8_t ident[16];
        if (check_id(id, err) < 0) {
                if (from_mfd >= 0)
                        close(from_mfd);
                return -1;
        }
        char img[256];
        snprintf(img, sizeof(img), "%s.img", id);
        int created = 0, fresh = 0; /* fresh: a new image made (or taken warm) by this call */
        cleanup_close int fd = -1;
        if (mkdirat(l->fd, id, 0711) == 0) {
                created = 1;
        } else if (errno != EEXIST) {
                if (from_mfd >= 0)
                        close(from_mfd);
                return cove_err_set(err, errno, "layer: mkdir %s/%s", l->dir, id);
        }
        if (from_image) {
                /* the old layer of this id (a rewind) is replaced; its mount must go first */
                int rc = cove_layer_release(l, id, err);
                if (rc < 0 && from_mfd >= 0)
                        close(from_mfd);
                else if (rc == 0 && from_mfd >= 0)
                        rc = layer_adopt_mounted(l, id, img, from_image, from_mfd, err);
                else if (rc == 0)
                        rc = layer_adopt(l, img, from_image, err);
                if (rc < 0)
                        goto fail;
                limit_mb = 1; /* the image's own size is the limit */
        } else if (from_mfd >= 0) {
                close(from_mfd);
        } else if (limit_mb && limit_mb < 16) {
                limit_mb = 16; /* ext4 needs room for its own metadata */
        }
        if (limit_mb) {
                if (faccessat(l->img_fd, img, F_OK, 0) < 0) {
                        created = 1;
                        if (layer_create_mounted(l, id, img, limit_mb, err) < 0)
                                goto fail;
                        fresh = 1;
                } else if (!is_mountpoint(l->fd, id)) {
                        cleanup_close int m = loop_fsmount(l->img_fd, img, 0, err);
                        if (m < 0 || attach(m, l->fd, id, err) < 0)
                                goto fail;
                }
                /* an image stores sandbox ids (idmapped in the sandbox, see quota.h) */
                owner = 0;
                group = 0;
        }
        fd = openat(l->fd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fchmod(fd, limit_mb ? 0700 : 0711) < 0) {
                cove_err_set(err, errno, "layer: open %s/%s", l->dir, id);
                goto fail;
        }
        if (key && !limit_mb) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "layer: encryption needs a disk limit");
                goto fail;
        }
        if (key && fscrypt_add(fd, key, ident, err) < 0)
                goto fail;
        static const struct {
                const char *name;
                mode_t mode;
        } subs[] = {{"upper", 0755}, {"work", 0700}, {"mnt", 0755}};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(subs); i++) {
                int made = mkdirat(fd, subs[i].name, subs[i].mode) == 0;
                if (!made && errno != EEXIST) {
                        cove_err_set(err, errno, "layer: mkdir %s/%s", id, subs[i].name);
                        goto fail;
                }
                /* a new layer's upper and work are encrypted while still empty (made now,
                 * or by the warm pool, which only mkdirs them: no overlay has used them yet,
                 * and the kernel refuses a policy on a non-empty directory with ENOTEMPTY,
                 * so a warm layer that was not empty fails the start instead of staying
                 * plaintext); an adopted or reused one has its policy and only needed the key */
                if ((made || fresh) && key && strcmp(subs[i].name, "mnt") != 0 &&
                    fscrypt_policy(fd, subs[i].name, ident, err) < 0)
                        goto fail;
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

int cove_layer_has_image(struct cove_layers *l, const char *id)
{
        return check_id(id, NULL) == 0 && is_mountpoint(l->fd, id);
}

int cove_layer_release(struct cove_layers *l, const char *id, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        if (!is_mountpoint(l->fd, id))
                return 0;
        /* a coved killed between FIFREEZE and FITHAW (a snapshot without reflinks, or of an
         * older build) left it frozen: its writers would hang in D state forever, unkillable;
         * EINVAL when not frozen */
        cleanup_close int mfd = openat(l->fd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (mfd >= 0)
                ioctl(mfd, FITHAW, 0);
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
        if (unlinkat(l->img_fd, p, 0) < 0 && errno != ENOENT)
                return cove_err_set(err, errno, "layer: remove %s/%s", l->images, p);
        return 0;
}

int cove_layer_snapshot(struct cove_layers *l, const char *id, const char *dest, uint64_t *pause_ns,
                        struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        if (!is_mountpoint(l->fd, id))
                return cove_err_setk(err, COVE_E_CONFLICT, EOPNOTSUPP,
                                     "layer %s: no layer image (a sandbox without disk_mb) or "
                                     "not running",
                                     id);
        char img[256];
        snprintf(img, sizeof(img), "%s.img", id);
        cleanup_close int mfd = openat(l->fd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        cleanup_close int in = openat(l->img_fd, img, O_RDONLY | O_CLOEXEC);
        if (mfd < 0 || in < 0)
                return cove_err_set(err, errno, "layer %s: open", id);
        cleanup_close int out = open(dest, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0)
                return cove_err_set(err, errno, "layer %s: create %s", id, dest);
        /* While the sandbox runs: write its dirty data and commit (syncfs: everything written
         * before the snapshot is in the clone), checkpoint the journal into place (a short
         * replay afterwards) and push the image's dirty pages on the layer filesystem (the
         * clone has next to nothing left to flush). */
        int rc = 0;
        if (syncfs(mfd) < 0)
                rc = cove_err_set(err, errno, "layer %s: syncfs", id);
        uint32_t ck = 0;
        if (rc == 0)
                ioctl(mfd, EXT4_IOC_CHECKPOINT, &ck); /* best effort (>= 5.13) */
        if (rc == 0)
                sync_file_range(in, 0, 0,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                    SYNC_FILE_RANGE_WAIT_AFTER);
        /* The pause: one FICLONE of the image, no freeze of the ext4 (a freeze costs three
         * RCU grace periods, 30-60 ms here). XFS clones under the image's IOLOCK and MMAPLOCK,
         * after writing back its dirty pages; the loop device's reads and writes of the image
         * wait for those locks meanwhile. So the clone holds every write the loop device
         * completed before it and none after: what a power cut at that instant would leave on
         * a disk that lost none of its completed writes. ext4's journal makes that consistent
         * (a commit block is issued only once its journal blocks, and in ordered mode its
         * data, completed): cove_layer_recover() replays it. Without reflinks (lfs a plain
         * directory) the copy is neither instant nor atomic, so the ext4 is frozen around it. */
        int64_t t0 = cove_mono_ns();
        if (rc == 0 && ioctl(out, FICLONE, in) < 0) {
                if (errno != EOPNOTSUPP && errno != EXDEV && errno != EINVAL && errno != ENOTTY)
                        rc = cove_err_set(err, errno, "layer %s: reflink clone to %s", id, dest);
                else if (ioctl(mfd, FIFREEZE, 0) < 0)
                        rc = cove_err_setk(err, errno == EBUSY ? COVE_E_CONFLICT : COVE_E_INTERNAL,
                                           errno, "layer %s: freeze", id);
                else {
                        if (copy_fd(in, out, err) < 0)
                                rc = cove_err_wrap(err, "layer %s: copy to %s", id, dest);
                        if (ioctl(mfd, FITHAW, 0) < 0 && rc == 0)
                                rc = cove_err_set(err, errno, "layer %s: thaw", id);
                }
        }
        if (pause_ns)
                *pause_ns = (uint64_t)(cove_mono_ns() - t0);
        if (rc < 0)
                unlink(dest);
        return rc;
}

int cove_layer_recover(const char *image, struct cove_err *err)
{
        /* e2fsck, not a kernel mount: no loop device, no ext4 instance, no key needed (the
         * journal holds metadata only). Orphan inodes (files unlinked while open, a truncate
         * in progress) stay listed, as after a power cut, for a read-write mount to finish. */
        char *argv[] = {"e2fsck", "-p", "-E", "journal_only", (char *)image, NULL};
        if (run_prog(argv, "e2fsprogs", 1, err) < 0) {
                unlink(image);
                return cove_err_wrap(err, "layer image %s: journal replay", image);
        }
        return 0;
}

int cove_layer_image_open(struct cove_layers *l, const char *image, int create, unsigned disk_mb,
                          const uint8_t *key, int *tree_fd, struct cove_err *err)
{
        uint8_t ident[16];
        if (!image || image[0] != '/')
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                     "layer image: want an absolute path");
        cleanup_close int img = -1, m = -1, root = -1;
        if (create == 1) {
                if (disk_mb == 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                             "layer image %s: disk_mb 0", image);
                uint64_t mb = disk_mb < 16 ? 16 : disk_mb;
                /* a warm layer when one is ready (a create's layer: the golden image cloned,
                 * mounted, its empty dirs made), moved to the image's name; the mount goes
                 * with the file (the loop device follows it across a rename) */
                struct pool_entry e;
                int warm = 0;
                if (pool_take(l, mb, &e)) {
                        if (renameat2(l->pool_fd, e.name, AT_FDCWD, image, RENAME_NOREPLACE) == 0) {
                                m = e.mfd;
                                warm = 1;
                        } else {
                                pool_entry_drop(l, &e); /* built below instead */
                        }
                }
                if (!warm) {
                        char golden[PATH_MAX + 32];
                        if (golden_for(l, mb, golden, sizeof(golden), err) < 0)
                                return cove_err_wrap(err, "layer image %s", image);
                        cleanup_close int in = open(golden, O_RDONLY | O_CLOEXEC);
                        img = open(image, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
                        if (in < 0 || img < 0)
                                return cove_err_set(err, errno, "layer image: create %s", image);
                        if (copy_fd(in, img, err) < 0 ||
                            (m = loop_fsmount_fd(img, image, "ext4", 0, 1, err)) < 0)
                                goto fail;
                }
                root = openat(m, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (warm && root < 0) {
                        cove_err_set(err, errno, "layer image %s: open root", image);
                        goto fail;
                }
                if (!warm && layer_dirs(root, image, err) < 0)
                        goto fail;
                if (key && (fscrypt_add(root, key, ident, err) < 0 ||
                            fscrypt_policy(root, "upper", ident, err) < 0 ||
                            fscrypt_policy(root, "work", ident, err) < 0))
                        goto fail;
        } else {
                /* COVE_LAYER_OPEN_CLONE: read-write, and fresh (the caller just made the file:
                 * no loop device can be bound to it) */
                int clone = create == COVE_LAYER_OPEN_CLONE;
                img = open(image, (clone ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
                if (img < 0)
                        return cove_err_setk(err,
                                             errno == ENOENT ? COVE_E_NOT_FOUND : COVE_E_INTERNAL,
                                             errno, "layer image %s", image);
                if ((m = loop_fsmount_fd(img, image, "ext4", !clone, clone, err)) < 0)
                        return cove_err_wrap(err, "layer image");
                /* (the fsmount fd is O_PATH: ioctls need a real open of the root) */
                if (key && ((root = openat(m, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
                            fscrypt_add(root, key, ident, err) < 0))
                        return cove_err_wrap(err, "layer image %s%s", image,
                                             root < 0 ? ": open root" : "");
        }
        *tree_fd = openat(m, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (*tree_fd < 0) {
                cove_err_set(err, errno, "layer image %s: open upper", image);
                goto fail;
        }
        int r = m;
        m = -1;
        return r;
fail:
        if (create == 1)
                unlink(image);
        return cove_err_wrap(err, "layer image");
}
