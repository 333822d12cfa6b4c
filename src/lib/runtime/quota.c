/* Per-sandbox ext4 layer images of the ns runtime (see quota.h). */
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

struct cove_layers {
        char dir[PATH_MAX];    /* <ns_dir>/layers: <id>.img and mount points <id>/ */
        char golden[PATH_MAX]; /* <ns_dir>/golden: <mb>.img, formatted, never mounted */
        int fd;                /* open on dir */
        pthread_mutex_t lock;  /* serialises golden image creation */
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

static int loop_mount(int dfd, const char *image, const char *dir, struct cove_err *err)
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
                /* autoclear: the loop device goes away with the last unmount */
                cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
                if (ioctl(lfd, LOOP_CONFIGURE, &cfg) < 0) {
                        if (errno == EBUSY)
                                continue; /* raced with another user of loop devices */
                        return cove_err_set(err, errno, "LOOP_CONFIGURE %s", dev);
                }
                if (mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "noinit_itable") < 0)
                        return cove_err_set(err, errno, "mount %s on %s", dev, dir);
                return 0;
        }
        return cove_err_set(err, EBUSY, "no free loop device");
}

static int is_mountpoint(int dfd, const char *name)
{
        struct stat a, b;
        if (fstatat(dfd, name, &a, AT_SYMLINK_NOFOLLOW) < 0 || fstat(dfd, &b) < 0)
                return 0;
        return a.st_dev != b.st_dev;
}

struct cove_layers *cove_layers_open(const char *ns_dir, struct cove_err *err)
{
        struct cove_layers *l = calloc(1, sizeof(*l));
        if (!l) {
                cove_err_set(err, ENOMEM, "layers");
                return NULL;
        }
        l->fd = -1;
        pthread_mutex_init(&l->lock, NULL);
        if (snprintf(l->dir, sizeof(l->dir), "%s/layers", ns_dir) >= (int)sizeof(l->dir) ||
            snprintf(l->golden, sizeof(l->golden), "%s/golden", ns_dir) >= (int)sizeof(l->golden)) {
                cove_err_set(err, ENAMETOOLONG, "layers under %s", ns_dir);
                goto fail;
        }
        if (cove_mkdir_p(l->dir, 0700, err) < 0 || cove_mkdir_p(l->golden, 0700, err) < 0)
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
        if (l->fd >= 0)
                close(l->fd);
        pthread_mutex_destroy(&l->lock);
        free(l);
}

int cove_layer_prepare(struct cove_layers *l, const char *id, uint64_t limit_mb, uid_t owner,
                       gid_t group, struct cove_err *err)
{
        if (check_id(id, err) < 0)
                return -1;
        char img[256], golden[PATH_MAX + 32];
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
                        if (golden_for(l, limit_mb, golden, sizeof(golden), err) < 0 ||
                            sparse_copy(golden, l->fd, img, err) < 0)
                                goto fail;
                }
                if (!is_mountpoint(l->fd, id)) {
                        char mp[PATH_MAX + 256];
                        snprintf(mp, sizeof(mp), "%s/%s", l->dir, id);
                        if (loop_mount(l->fd, img, mp, err) < 0)
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
