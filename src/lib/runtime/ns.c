/* The ns runtime: sandboxes as namespaces + overlayfs + seccomp + cgroups on the host kernel.
 *
 * Root filesystem (option (a) of the design notes; measured to work on 6.18):
 *   - coved (host root) clones the child into new user/mnt/pid/net/ipc/uts namespaces and
 *     writes its uid/gid map (0..count-1 -> uid_base..), then makes a detached, read-only,
 *     idmapped clone of the template rootfs (open_tree(OPEN_TREE_CLONE) + mount_setattr(
 *     MOUNT_ATTR_IDMAP, the child's userns)) and passes its fd over a socketpair (SCM_RIGHTS).
 *     Host-root-owned template files then appear owned by the sandbox's root, without a copy.
 *   - The child (root of its userns, host uid uid_base) move_mount()s that tree into its own
 *     mount namespace and mounts overlayfs (userxattr) itself: lower = the idmapped tree,
 *     upper/work = a private directory on the sandbox's own layer filesystem (quota.h),
 *     owned by uid_base. Copy-up and new files are created with the mounter's credentials, so on
 *     the host they belong to the sandbox's range, never to host root.
 *   - (b), overlayfs mounted by host root and idmapped as a whole, is impossible: overlayfs
 *     does not support idmapped mounts of itself.
 * Layer size: a per-sandbox sparse ext4 image of disk_mb, copied from a golden image and
 * loop-mounted by coved (quota.h; this kernel has no disk quotas at all, so XFS project
 * quota was not an option): writes past disk_mb fail with ENOSPC, the host sees <= disk_mb.
 * Warm layer pool: copy + LOOP_CONFIGURE + ext4 mount cost 6-10 ms of a start, so a driver
 * thread (started in open(), joined in close()) keeps COVE_NS_LAYER_POOL (env, default 4,
 * 0 = off) layers per disk size ready; start() only renames the image and attaches the mount.
 * A warm layer's ext4 is a detached mount (fsmount() fd), not a mount under pool/<size>/<slot>:
 *   - rename(2) of a mount point fails with EBUSY, and MS_MOVE/move_mount() of an *attached*
 *     mount fails with EINVAL when its parent is shared (systemd makes / shared), so an
 *     attached pool mount could not be moved to layers/<id>; a detached one can be attached
 *     there by move_mount() whatever the propagation, in one cheap syscall;
 *   - crash safety comes from the kernel: when coved dies its fds close, the detached mounts
 *     dissolve and their autoclear loop devices detach; open() only deletes the images
 *     (and detaches any loop device still bound to one). Nothing of the pool is visible in
 *     mountinfo or copied into the sandboxes' mount namespaces.
 * A taken layer is an ordinary layer from then on: stop() and cleanup_stale() as before.
 * PID 1 (cove-guest) survives the sandbox's OOMs: the workload runs in a child group of the
 * sandbox's (cove/<id>/work: memory_mb less NS_GUEST_RESERVE_MB; cove/<id>: memory_mb),
 * so the OOM killer of work picks among the workload only. Every process the guest starts
 * moves itself there before it execs, through the sandbox's memory cgroup bound at
 * COVE_GUEST_CGROUP_DIR (views(); work/cgroup.procs is chowned to the sandbox's root).
 * oom_score_adj alone was not enough: lowering it below the floor (0) needs CAP_SYS_RESOURCE,
 * which coved lacks in many containers (this project's CI host among them), and even at -1000
 * memory no kill gives back (tmpfs, memfds written with write()) left the guest the only
 * victim. coved still writes oom_score_adj 0 and oom_adj -17 where it can, and /dev/shm is
 * sized at half of memory_mb, so a full /dev/shm leaves the processes room.
 * /tmp is the template's /tmp on the overlay (counts against disk_mb, survives a snapshot of
 * the upper layer like a VM's disk would). /sys is sysfs read-only (absent if the kernel
 * refuses it), /proc/sys is a read-only bind. Per-sandbox work forks nothing (no mkfs, ip,
 * mount binaries): syscalls and ioctls only.
 *
 * coved is multi-threaded, so the child of clone() only uses async-signal-safe calls and
 * memory prepared before the clone; the seccomp program is compiled once at open(). */
#include <dirent.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/close_range.h>

#include <pthread.h>

#include "guest/guest.h"
#include "proto/frame.h"
#include "runtime/cgroup.h"
#include "runtime/criu.h"
#include "runtime/quota.h"
#include "runtime/runtime.h"
#include "runtime/seccomp_filter.h"
#include "util/cleanup.h"
#include "util/util.h"

#define NS_PIDS_DEFAULT 1024
#define NS_ID_MAX 128
#define NS_CHAN_FD 3
/* where the sandbox sees cove-guest (a read-only bind mount of the host's binary) */
#define NS_GUEST_REL "dev/.cove-guest" /* relative to the new root before pivot_root */
#define COVE_NS_GUEST_PATH "/" NS_GUEST_REL
#define NS_POOL_DEFAULT 4 /* warm layers per disk size */
#define NS_POOL_MAX 64
/* the part of memory_mb kept for PID 1: the workload gets the rest, in a child group of its
 * own (runtime/cgroup.h); an eighth, 8 to 32 MiB (the guest itself needs a few) */
#define NS_GUEST_RESERVE_MB(mb) ((mb) / 8 < 8 ? 8 : (mb) / 8 > 32 ? 32 : (mb) / 8)

/* lxcfs (a FUSE daemon serving /proc/meminfo, cpuinfo, stat, uptime, loadavg, swaps and
 * /sys/devices/system/cpu as seen from the reader's cgroups): one instance per coved (its pid
 * file in <data>/ns), mounted at NS_LXCFS_ROOT/<hash of the data dir>, started at open, started
 * again by a start that finds it gone (at most every NS_LXCFS_RETRY_S), stopped at close. Its files
 * are bound over the sandbox's. Without it sandboxes work as before and see the host's figures (why
 * says so). */
#define NS_LXCFS_RETRY_S 10
#define NS_LXCFS_ROOT "/run/cove-lxcfs" /* mount points: <root>/<hash of the data dir> */
struct ns_lxcfs {
        pthread_mutex_t mu;
        char bin[PATH_MAX]; /* empty: not installed or turned off */
        char dir[PATH_MAX]; /* mount point */
        char pidfile[PATH_MAX];
        pid_t pid;
        int64_t tried_ns; /* last start attempt */
        int up;
        char why[256];
};

/* what the sandbox sees through lxcfs: its path under the lxcfs mount = the sandbox's path */
static const char *const lxcfs_views[] = {
    "proc/meminfo", "proc/cpuinfo",           "proc/stat", "proc/uptime", "proc/loadavg",
    "proc/swaps",   "sys/devices/system/cpu",
};
#define NS_LXCFS_VIEWS 7

struct cove_runtime {
        char ns_dir[PATH_MAX];      /* <data_dir>/ns */
        struct cove_layers *layers; /* per-sandbox layer images */
        struct cove_cgroups *cg;    /* cgroup layout */
        struct sock_fprog filter;   /* compiled seccomp policy */
        struct cove_criu criu;      /* full snapshots: what was found */
        pthread_mutex_t full_mu;    /* full_state, full_why */
        int full_state;             /* 1 available, 0 not, -1 self-check running */
        char full_why[320];
        /* the self-check's instance: one per data dir (cgroups are host-wide; two coveds
         * never share a data dir), so a restart after a crash mid-check cleans its leftovers */
        char check_id[48];
        struct ns_lxcfs lx; /* the host's size as the sandbox's own: /proc/meminfo, ... */
};

struct ns_inst {
        char id[NS_ID_MAX + 1]; /* sandbox id (cgroup and layer names) */
        uint64_t mounts;        /* its mount table as set up (cove_criu_mounts) */
};

/* Everything the child needs, prepared before clone (the child must not allocate). */
struct child_args {
        const struct cove_runtime *rt;
        const char *id;
        char layer[PATH_MAX]; /* <layers>/<id> */
        int sync_fd;          /* child end of the sync socketpair */
        int guest_fd;         /* O_PATH fd of the guest binary (host) */
        int cg_view;          /* make COVE_GUEST_CGROUP_DIR (coved binds the group there) */
        int cg_sync;          /* v2: report the cgroup namespace, wait for the split */
        char shm_opts[64];    /* /dev/shm's mount options (its size: half of memory_mb) */
};

/* What the child reports when a step fails (EOF on the sync socket means exec succeeded). */
struct child_msg {
        int errnum;
        char what[120];
};

static _Noreturn void child_fail(int fd, int errnum, const char *what)
{
        struct child_msg m;
        memset(&m, 0, sizeof(m));
        m.errnum = errnum;
        size_t n = strlen(what);
        if (n >= sizeof(m.what))
                n = sizeof(m.what) - 1;
        memcpy(m.what, what, n);
        if (write(fd, &m, sizeof(m)) < 0) {
                /* nothing left to report to */
        }
        _exit(127);
}

/* "/proc/self/fd/<fd>" without stdio (async-signal-safe). */
static void fd_path(char *out, int fd)
{
        char tmp[16];
        int n = 0;
        do {
                tmp[n++] = (char)('0' + fd % 10);
                fd /= 10;
        } while (fd && n < 15);
        strcpy(out, "/proc/self/fd/");
        size_t l = strlen(out);
        while (n)
                out[l++] = tmp[--n];
        out[l] = 0;
}

/* mount, creating the mount point (as a directory) on the overlay when the template lacks it */
static int mount_at(const char *src, const char *dst, const char *type, unsigned long flags,
                    const char *data)
{
        if (mount(src, dst, type, flags, data) == 0)
                return 0;
        if (errno != ENOENT || mkdir(dst, 0755) < 0)
                return -1;
        return mount(src, dst, type, flags, data);
}

#define NS_BOOT_ID_REL "dev/.cove-boot-id"

/* A random version 4 UUID and a newline (37 bytes) in out[40]. Async-signal-safe. */
static int boot_id(char out[40])
{
        unsigned char u[16];
        if (syscall(SYS_getrandom, u, sizeof(u), 0) != (long)sizeof(u))
                return -1;
        u[6] = (unsigned char)((u[6] & 0x0f) | 0x40);
        u[8] = (unsigned char)((u[8] & 0x3f) | 0x80);
        static const char hex[] = "0123456789abcdef";
        size_t o = 0;
        for (int i = 0; i < 16; i++) {
                if (i == 4 || i == 6 || i == 8 || i == 10)
                        out[o++] = '-';
                out[o++] = hex[u[i] >> 4];
                out[o++] = hex[u[i] & 15];
        }
        out[o++] = '\n';
        out[o] = 0;
        return 0;
}

static void setup_dev(int sfd, int gtree, const struct child_args *a)
{
        static const char *const devs[] = {"null", "zero", "full", "random", "urandom", "tty"};
        if (mount_at("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC,
                     "mode=755,size=64k,nr_inodes=64") < 0)
                child_fail(sfd, errno, "mount tmpfs on /dev");
        for (size_t i = 0; i < COVE_ARRAY_SIZE(devs); i++) {
                char src[32] = "/dev/", dst[32] = "dev/";
                strcat(src, devs[i]);
                strcat(dst, devs[i]);
                int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
                if (fd < 0)
                        child_fail(sfd, errno, "create /dev node");
                close(fd);
                /* read-only: the host's inode takes no metadata writes (touch, chmod,
                 * chown); reads and writes of the device itself work on a read-only mount */
                if (mount(src, dst, NULL, MS_BIND, NULL) < 0 ||
                    mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
                          NULL) < 0)
                        child_fail(sfd, errno, "bind /dev node");
        }
        /* cove-guest itself: a read-only bind of the host's binary, so that the sandbox's
         * PID 1 runs a file of its own mount namespace (a checkpoint (CRIU) must find the
         * executable there; an exec through an fd of the host's namespace it cannot dump) */
        int gfd = open(NS_GUEST_REL, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0555);
        if (gfd < 0)
                child_fail(sfd, errno, "create the guest mount point");
        close(gfd);
        if (move_mount(gtree, "", AT_FDCWD, NS_GUEST_REL, MOVE_MOUNT_F_EMPTY_PATH) < 0)
                child_fail(sfd, errno, "attach the guest binary");
        close(gtree);
        if (mkdir("dev/pts", 0755) < 0 ||
            mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                  "newinstance,ptmxmode=0666,mode=0620,gid=5") < 0)
                child_fail(sfd, errno, "mount devpts");
        /* a size: files there are memory no OOM kill gives back; half the limit leaves the
         * rest to the processes when it is full */
        if (mkdir("dev/shm", 01777) < 0 ||
            mount("tmpfs", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, a->shm_opts) < 0)
                child_fail(sfd, errno, "mount /dev/shm");
        /* where coved binds the sandbox's memory cgroup (views()), for the guest's children
         * to move into work/ */
        if (a->cg_view && mkdir("dev/.cove-cgroup", 0555) < 0)
                child_fail(sfd, errno, "cgroup mount point");
        /* this instance's own boot id (the kernel's is the host's, the same in every sandbox
         * and across a sandbox's restarts): bound over /proc's below */
        int bfd = open(NS_BOOT_ID_REL, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444);
        char bid[40];
        if (bfd < 0 || boot_id(bid) < 0 || write(bfd, bid, 37) != 37)
                child_fail(sfd, errno, "boot id");
        close(bfd);
        if (symlink("pts/ptmx", "dev/ptmx") < 0 || symlink("/proc/self/fd", "dev/fd") < 0 ||
            symlink("/proc/self/fd/0", "dev/stdin") < 0 ||
            symlink("/proc/self/fd/1", "dev/stdout") < 0 ||
            symlink("/proc/self/fd/2", "dev/stderr") < 0)
                child_fail(sfd, errno, "/dev symlinks");
        if (mount(NULL, "dev", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
                  NULL) < 0)
                child_fail(sfd, errno, "remount /dev read-only");
}

/* An empty read-only tmpfs over dir (a mask); errno when it fails. */
static int mask_dir(const char *dir)
{
        return mount("tmpfs", dir, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                     "size=4k,nr_inodes=1,mode=555");
}

#define NS_MASK_MAX 16

struct ns_dirent64 {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[];
};

/* Hide the block devices in the sandbox's sysfs (at ./sys): a loop device's backing_file names
 * the node's data dir and every sandbox id on the node, and each device's stat shows the disk
 * activity of the host and of the other sandboxes. Every directory holding block devices gets
 * an empty read-only tmpfs over it: the parents of what /sys/block links to (e.g.
 * devices/virtual/block, devices/pci.../virtio1/block), then /sys/block, /sys/class/block and
 * /sys/dev/block. Async-signal-safe (getdents64 into a stack buffer). Best effort when there
 * is no sysfs. */
static void mask_sys_block(int sfd)
{
        char masked[NS_MASK_MAX][256];
        int nm = 0;
        int d = open("sys/block", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d < 0)
                return; /* no sysfs in this sandbox */
        char buf[4096];
        long n;
        while ((n = syscall(SYS_getdents64, d, buf, sizeof(buf))) > 0) {
                for (long off = 0; off < n;) {
                        struct ns_dirent64 *e = (struct ns_dirent64 *)(buf + off);
                        off += e->reclen;
                        /* loop<n>: the loop driver's devices have no parent, they are all in
                         * devices/virtual/block, masked below anyway; not resolved one by
                         * one (a long-lived host has thousands: most of a start's time) */
                        if (!strncmp(e->name, "loop", 4) && e->name[4] >= '0' && e->name[4] <= '9')
                                continue;
                        char link[240];
                        ssize_t l = readlinkat(d, e->name, link, sizeof(link) - 1);
                        if (l <= 0)
                                continue;
                        link[l] = 0;
                        /* "../devices/.../block/<dev>": the directory is <link> minus the
                         * "../" and the last component, under sys/ */
                        char *rel = link;
                        while (!strncmp(rel, "../", 3))
                                rel += 3;
                        char *slash = strrchr(rel, '/');
                        if (!slash || strstr(rel, "/../") || strncmp(rel, "devices/", 8))
                                continue;
                        *slash = 0;
                        char dir[256] = "sys/";
                        if (strlen(rel) >= sizeof(dir) - 5)
                                continue;
                        strcat(dir, rel);
                        int seen = 0;
                        for (int i = 0; i < nm; i++)
                                if (!strcmp(masked[i], dir))
                                        seen = 1;
                        if (seen)
                                continue;
                        if (nm == NS_MASK_MAX)
                                child_fail(sfd, E2BIG,
                                           "mask block devices in /sys: too many "
                                           "directories");
                        if (mask_dir(dir) < 0)
                                child_fail(sfd, errno, "mask block devices in /sys");
                        strcpy(masked[nm++], dir);
                }
        }
        close(d);
        static const char *const always[] = {"sys/devices/virtual/block", "sys/block",
                                             "sys/class/block", "sys/dev/block"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(always); i++) {
                int seen = 0;
                for (int j = 0; j < nm; j++)
                        if (!strcmp(masked[j], always[i]))
                                seen = 1;
                if (!seen && mask_dir(always[i]) < 0 && errno != ENOENT)
                        child_fail(sfd, errno, "mask block devices in /sys");
        }
}

/* /proc files that show the host and the other sandboxes: /dev/null over them (read-only).
 * locks: device and inode of every lock on the node (host files; a covert channel between
 * sandboxes); diskstats and partitions: the block devices again (see mask_sys_block). */
/* The sandbox's hostname (its id) resolves, as on any Linux host: sudo warns on every use
 * otherwise ("unable to resolve host"). Appends "127.0.1.1 <id>" to /etc/hosts if no line
 * names it. Best effort, inside the sandbox's root and user namespace already (a symlink
 * planted there is refused, and could only name the sandbox's own files anyway). */
static void hosts_entry(const char *id)
{
        int fd = open("etc/hosts", O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return;
        struct stat st;
        char buf[16384];
        ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < (off_t)sizeof(buf)
                        ? pread(fd, buf, sizeof(buf) - 1, 0)
                        : -1;
        if (n >= 0) {
                buf[n] = 0;
                size_t il = strlen(id);
                int found = 0;
                for (char *p = strstr(buf, id); p && !found; p = strstr(p + 1, id))
                        found = (p == buf || p[-1] == ' ' || p[-1] == '\t') &&
                                (p[il] == 0 || p[il] == ' ' || p[il] == '\t' || p[il] == '\n');
                if (!found) {
                        char line[128];
                        size_t l = 0;
                        if (n > 0 && buf[n - 1] != '\n')
                                line[l++] = '\n';
                        memcpy(line + l, "127.0.1.1\t", 10);
                        l += 10;
                        if (il < sizeof(line) - l - 1) {
                                memcpy(line + l, id, il);
                                l += il;
                                line[l++] = '\n';
                                if (write(fd, line, l) < 0) {
                                        /* best effort */
                                }
                        }
                }
        }
        close(fd);
}

static void mask_proc(int sfd)
{
        static const char *const files[] = {"proc/locks", "proc/diskstats", "proc/partitions"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(files); i++)
                if (mount("dev/null", files[i], NULL, MS_BIND, NULL) < 0 ||
                    mount(NULL, files[i], NULL,
                          MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC, NULL) < 0)
                        child_fail(sfd, errno, "mask /proc file");
}

/* Close every fd >= 3 but the three given (async-signal-safe). */
static void close_all_but(int x, int y, int z)
{
        int k[3] = {x, y, z};
        for (int i = 0; i < 3; i++)
                for (int j = i + 1; j < 3; j++)
                        if (k[j] < k[i]) {
                                int t = k[i];
                                k[i] = k[j];
                                k[j] = t;
                        }
        unsigned lo = 3;
        for (int i = 0; i < 3; i++) {
                if (k[i] < (int)lo)
                        continue;
                if ((unsigned)k[i] > lo)
                        syscall(SYS_close_range, lo, (unsigned)k[i] - 1, 0);
                lo = (unsigned)k[i] + 1;
        }
        syscall(SYS_close_range, lo, ~0U, 0);
}

static _Noreturn void child_main(struct child_args *a)
{
        int sfd = a->sync_fd;
        /* A child whose coved dies while it is set up must go too, or it waits in cove_recv_fd()
         * for ever and pins its copy of coved's mounts — every sandbox's layer then — and
         * their loop devices (the "loop device outlives a kill -9" bug). EOF on the sync
         * socket is not enough alone: every child holds copies of coved's fds, the parent's
         * end of its own socketpair and of any other child's being set up at the same time
         * among them. So: drop every inherited fd now (they close at exec anyway), and die
         * with the parent (the credential change below clears this; it is set again there). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close_all_but(sfd, sfd, sfd); /* the guest channel is made below, the binary is a mount */
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        for (int s = 1; s < NSIG; s++)
                signal(s, SIG_DFL); /* errors for SIGKILL/SIGSTOP and RT signals are harmless */

        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0 ||
            cove_send_fd(sfd, pair[0], 'T') < 0)
                child_fail(sfd, errno, "guest channel");
        close(pair[0]);
        int chan = pair[1];
        /* Opened as host root (owner of data_dir) before the uid changes; later lookups go
         * through /proc/self/fd so the sandbox uid needs no access to data_dir. */
        int lfd = open(a->layer, O_PATH | O_DIRECTORY | O_CLOEXEC);
        int tree = cove_recv_fd(sfd); /* also waits until the uid map and cgroups are in place */
        int ltree = tree < 0 ? -1 : cove_recv_fd(sfd);
        int gtree = ltree < 0 ? -1 : cove_recv_fd(sfd);
        if (tree < 0 || ltree < 0 || gtree < 0)
                _exit(127); /* the parent gave up */
        /* raw syscalls: glibc's wrappers broadcast the change to every thread of coved they
         * know of, threads that do not exist in this child; one caught mid-creation at clone
         * time (setxid_futex -1) makes them wait forever */
        if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, 0, 0, 0) < 0 ||
            syscall(SYS_setresuid, 0, 0, 0) < 0)
                child_fail(sfd, errno, "become root of the user namespace");
        /* after the credential change, which clears it */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
                child_fail(sfd, errno, "PR_SET_PDEATHSIG");
        if (unshare(CLONE_NEWCGROUP) < 0)
                child_fail(sfd, errno, "unshare cgroup namespace");
        if (a->cg_sync) {
                /* v2: the namespace is rooted at cove/<id> now; coved moves this process into
                 * its leaf and turns the memory controller on below cove/<id> */
                struct child_msg m;
                memset(&m, 0, sizeof(m));
                char go = 0;
                if (write(sfd, &m, sizeof(m)) != (ssize_t)sizeof(m) || read(sfd, &go, 1) != 1 ||
                    go != 'G')
                        _exit(127);
        }
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                child_fail(sfd, errno, "make mounts private");
        /* the layer as this sandbox sees it (idmapped when it is an image): over the host's */
        if (move_mount(ltree, "", lfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
                child_fail(sfd, errno, "attach layer");
        int upper = openat(ltree, "upper", O_PATH | O_DIRECTORY | O_CLOEXEC);
        int work = openat(ltree, "work", O_PATH | O_DIRECTORY | O_CLOEXEC);
        int mnt = openat(ltree, "mnt", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (upper < 0 || work < 0 || mnt < 0)
                child_fail(sfd, errno, "open layer");
        if (move_mount(tree, "", mnt, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
                child_fail(sfd, errno, "attach idmapped template");
        char lower_p[32], upper_p[32], work_p[32];
        fd_path(lower_p, tree);
        fd_path(upper_p, upper);
        fd_path(work_p, work);
        int fs = fsopen("overlay", FSOPEN_CLOEXEC);
        if (fs < 0)
                child_fail(sfd, errno, "fsopen overlay");
        if (fsconfig(fs, FSCONFIG_SET_STRING, "lowerdir", lower_p, 0) < 0 ||
            fsconfig(fs, FSCONFIG_SET_STRING, "upperdir", upper_p, 0) < 0 ||
            fsconfig(fs, FSCONFIG_SET_STRING, "workdir", work_p, 0) < 0 ||
            fsconfig(fs, FSCONFIG_SET_FLAG, "userxattr", NULL, 0) < 0)
                child_fail(sfd, errno, "configure overlay");
        if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                child_fail(sfd, errno, "create overlay");
        int root = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV);
        if (root < 0)
                child_fail(sfd, errno, "fsmount overlay");
        if (move_mount(root, "", mnt, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
                child_fail(sfd, errno, "attach overlay");
        if (fchdir(root) < 0)
                child_fail(sfd, errno, "chdir to new root");
        close(fs);
        close(upper);
        close(work);
        close(ltree);
        close(lfd);
        umask(022);

        if (mount_at("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                child_fail(sfd, errno, "mount /proc");
        if (mount("proc/sys", "proc/sys", NULL, MS_BIND | MS_REC, NULL) < 0 ||
            mount(NULL, "proc/sys", NULL,
                  MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                child_fail(sfd, errno, "make /proc/sys read-only");
        setup_dev(sfd, gtree, a);
        if (mount(NS_BOOT_ID_REL, "proc/sys/kernel/random/boot_id", NULL, MS_BIND, NULL) < 0 ||
            mount(NULL, "proc/sys/kernel/random/boot_id", NULL,
                  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                child_fail(sfd, errno, "bind the boot id");
        /* best effort: with a net namespace of its own the kernel allows it; else no /sys */
        if (mount_at("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) ==
            0)
                mask_sys_block(sfd);
        mask_proc(sfd);

        if (syscall(SYS_pivot_root, ".", ".") < 0)
                child_fail(sfd, errno, "pivot_root");
        if (umount2(".", MNT_DETACH) < 0)
                child_fail(sfd, errno, "detach old root");
        if (chdir("/") < 0)
                child_fail(sfd, errno, "chdir /");

        if (sethostname(a->id, strlen(a->id)) < 0)
                child_fail(sfd, errno, "sethostname");
        hosts_entry(a->id);
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct ifreq ifr;
        memset(&ifr, 0, sizeof(ifr));
        strcpy(ifr.ifr_name, "lo");
        if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
                child_fail(sfd, errno, "get lo flags");
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
                child_fail(sfd, errno, "bring lo up");
        close(s);

        int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
                child_fail(sfd, errno, "stdio to /dev/null");
        /* every inherited fd of coved closes at exec; only the channel stays, as fd 3 */
        if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
                child_fail(sfd, errno, "close_range");
        if (dup2(chan, NS_CHAN_FD) < 0)
                child_fail(sfd, errno, "channel fd");

        /* the sandbox's session is its own (a checkpoint needs its session leader inside) */
        if (setsid() < 0)
                child_fail(sfd, errno, "setsid");
        int rc = cove_seccomp_install(&a->rt->filter);
        if (rc < 0)
                child_fail(sfd, -rc, "install seccomp filter");
        char *const argv[] = {COVE_NS_GUEST_PATH, "--channel-fd", "3", NULL};
        char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                              NULL};
        execve(COVE_NS_GUEST_PATH, argv, envp);
        child_fail(sfd, errno, "exec guest");
}

static int write_map(pid_t pid, const char *file, uint32_t base, uint32_t count,
                     struct cove_err *err)
{
        char path[64], line[64];
        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
        int n = snprintf(line, sizeof(line), "0 %u %u\n", base, count);
        cleanup_close int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, line, n) != n)
                return cove_err_set(err, errno, "write %s", path);
        return 0;
}

static int check_spec(const struct cove_instance_spec *s, struct cove_err *err)
{
        const char *id = s->sandbox_id;
        if (!id || !*id || strlen(id) > NS_ID_MAX || id[0] == '.')
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "ns: bad sandbox id");
        for (const char *p = id; *p; p++)
                if (!(*p == '_' || *p == '-' || (*p >= 'a' && *p <= 'z') ||
                      (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                             "ns: bad sandbox id %s", id);
        if (!s->rootfs || s->rootfs[0] != '/' || !s->guest_binary || s->guest_binary[0] != '/')
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                     "ns: rootfs and guest binary must be absolute paths");
        if (s->uid_base == 0 || s->uid_count == 0 ||
            s->uid_base + (uint64_t)s->uid_count > UINT32_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                     "ns: bad uid range %u+%u (host root is never mapped)",
                                     s->uid_base, s->uid_count);
        return 0;
}

static int write_proc(pid_t pid, const char *file, const char *val, struct cove_err *err)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
        cleanup_close int fd = open(path, O_WRONLY | O_CLOEXEC);
        ssize_t n = (ssize_t)strlen(val);
        if (fd < 0 || write(fd, val, (size_t)n) != n)
                return cove_err_set(err, errno, "write %s", path);
        return 0;
}

/* oom_score_adj -1000 for the guest, with the floor its descendants may go down to at 0 (a
 * write of oom_score_adj by a CAP_SYS_RESOURCE writer sets the floor too, one of oom_adj does
 * not). The child waits for the template fd, so this lands before it execs. Without
 * CAP_SYS_RESOURCE (some containers) nothing can go below the floor inherited from coved:
 * EACCES, and the guest keeps coved's score as before; not a reason to refuse the sandbox. */
static int protect_from_oom(pid_t pid, struct cove_err *err)
{
        if (write_proc(pid, "oom_score_adj", "0\n", err) < 0)
                return -1;
        struct cove_err e;
        if (write_proc(pid, "oom_adj", "-17\n", &e) < 0 && e.errnum != EACCES) {
                if (err)
                        *err = e;
                return -1;
        }
        return 0;
}

static void criu_mounts_release(const char *state_dir);

static void reap(pid_t pid)
{
        while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
                ;
}

static int ns_restore(struct cove_runtime *rt, const struct cove_instance_spec *spec,
                      struct cove_instance *inst, struct cove_err *err);

struct cove_layer_handle {
        int mfd; /* detached mount of the image */
};

/* The mount of spec->layer_handle (the handle is freed: start() takes it over), or -1. */
static int take_layer_mount(const struct cove_instance_spec *spec)
{
        struct cove_layer_handle *h = spec->layer_handle;
        if (!h)
                return -1;
        int m = h->mfd;
        free(h);
        return m;
}

#define NS_FUSE_MAGIC 0x65735546

static int lxcfs_mounted(const struct ns_lxcfs *lx)
{
        struct statfs sf;
        char p[PATH_MAX + 16];
        snprintf(p, sizeof(p), "%s/proc/meminfo", lx->dir);
        return statfs(lx->dir, &sf) == 0 && sf.f_type == NS_FUSE_MAGIC && access(p, R_OK) == 0;
}

/* an lxcfs of an earlier coved on this data dir (killed -9: its daemon and mount stay) */
static void lxcfs_reap_stale(struct ns_lxcfs *lx)
{
        char buf[32] = "";
        cleanup_close int fd = open(lx->pidfile, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
        if (n > 0) {
                buf[n] = 0;
                long pid = strtol(buf, NULL, 10);
                char exe[PATH_MAX], lp[64];
                snprintf(lp, sizeof(lp), "/proc/%ld/exe", pid);
                ssize_t l = pid > 1 ? readlink(lp, exe, sizeof(exe) - 1) : -1;
                if (l > 0) {
                        exe[l] = 0;
                        if (!strcmp(exe, lx->bin))
                                kill((pid_t)pid, SIGKILL);
                }
        }
        unlink(lx->pidfile);
        while (umount2(lx->dir, MNT_DETACH) == 0)
                ;
}

/* start lxcfs and wait (bounded) for its mount; lx->mu held */
static void lxcfs_start(struct ns_lxcfs *lx)
{
        lx->tried_ns = cove_mono_ns();
        if (lx->pid > 0) { /* a daemon that lost its mount */
                kill(lx->pid, SIGKILL);
                reap(lx->pid);
                lx->pid = 0;
        }
        lxcfs_reap_stale(lx);
        if (mkdir(lx->dir, 0755) < 0 && errno != EEXIST) {
                snprintf(lx->why, sizeof(lx->why), "lxcfs: mkdir %s: %s", lx->dir, strerror(errno));
                return;
        }
        char *const argv[] = {lx->bin,     "--foreground", "--enable-cfs", "--enable-loadavg",
                              "--pidfile", lx->pidfile,    lx->dir,        NULL};
        char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
        int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
        pid_t pid = devnull < 0 ? -1 : fork();
        if (pid == 0) {
                /* async-signal-safe only: coved is multi-threaded. It goes with coved (a
                 * SIGTERM makes it unmount itself), or with the thread that started it, in
                 * which case the next start finds it gone and starts it again */
                setsid();
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                if (dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
                        _exit(126);
                syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
                execve(lx->bin, argv, envp);
                _exit(127);
        }
        if (devnull >= 0)
                close(devnull);
        if (pid < 0) {
                snprintf(lx->why, sizeof(lx->why), "lxcfs: fork: %s", strerror(errno));
                return;
        }
        lx->pid = pid;
        for (int t = 0; t < 500; t++) { /* up to 5 s */
                if (lxcfs_mounted(lx)) {
                        lx->up = 1;
                        snprintf(lx->why, sizeof(lx->why),
                                 "lxcfs at %s serves /proc/meminfo, cpuinfo, stat, uptime, "
                                 "loadavg, swaps and /sys/devices/system/cpu per sandbox",
                                 lx->bin);
                        return;
                }
                int st;
                if (waitpid(pid, &st, WNOHANG) == pid) {
                        lx->pid = 0;
                        snprintf(lx->why, sizeof(lx->why),
                                 "lxcfs %s exited (%s %d) before its mount was up: sandboxes "
                                 "see the host's memory and CPUs",
                                 lx->bin, WIFEXITED(st) ? "status" : "signal",
                                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                        return;
                }
                struct timespec ts = {0, 10000000L};
                nanosleep(&ts, NULL);
        }
        snprintf(lx->why, sizeof(lx->why),
                 "lxcfs %s: no mount at %s after 5 s: sandboxes see the host's memory and CPUs",
                 lx->bin, lx->dir);
}

/* Mount points under NS_LXCFS_ROOT whose daemon is gone (a coved killed with SIGKILL whose
 * data dir was then deleted, so no start on it reaps them): a dead FUSE mount answers
 * ENOTCONN for good. Each stays in the host's mount table, which every new mount namespace
 * (each sandbox start) copies; a live one, another coved's, is left alone. */
static void lxcfs_sweep_dead(void)
{
        DIR *d = opendir(NS_LXCFS_ROOT);
        if (!d)
                return;
        struct dirent *e;
        while ((e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                char p[PATH_MAX];
                snprintf(p, sizeof(p), NS_LXCFS_ROOT "/%s", e->d_name);
                struct statfs sf;
                if (statfs(p, &sf) == 0 || errno != ENOTCONN)
                        continue;
                while (umount2(p, MNT_DETACH) == 0)
                        ;
                rmdir(p);
        }
        closedir(d);
}

static void lxcfs_init(struct ns_lxcfs *lx, const char *ns_dir)
{
        pthread_mutex_init(&lx->mu, NULL);
        /* the mount is not under the data dir: it shows the host's whole cgroup tree, which
         * nothing that walks the data dir (backups, scans) should descend into */
        uint64_t h = 1469598103934665603ULL; /* FNV-1a of the ns dir: one per data dir */
        for (const char *c = ns_dir; *c; c++)
                h = (h ^ (uint8_t)*c) * 1099511628211ULL;
        mkdir(NS_LXCFS_ROOT, 0755);
        lxcfs_sweep_dead();
        snprintf(lx->dir, sizeof(lx->dir), NS_LXCFS_ROOT "/%016llx", (unsigned long long)h);
        snprintf(lx->pidfile, sizeof(lx->pidfile), "%s/lxcfs.pid", ns_dir);
        const char *env = getenv("COVE_LXCFS");
        if (env && (!*env || !strcmp(env, "off"))) {
                snprintf(lx->why, sizeof(lx->why),
                         "lxcfs turned off (COVE_LXCFS=off): sandboxes see the host's memory and "
                         "CPUs");
                return;
        }
        static const char *const cands[] = {"/usr/bin/lxcfs", "/usr/local/bin/lxcfs",
                                            "/usr/sbin/lxcfs"};
        if (env) {
                if (env[0] == '/' && access(env, X_OK) == 0)
                        snprintf(lx->bin, sizeof(lx->bin), "%s", env);
        } else {
                for (size_t i = 0; i < COVE_ARRAY_SIZE(cands) && !lx->bin[0]; i++)
                        if (access(cands[i], X_OK) == 0)
                                snprintf(lx->bin, sizeof(lx->bin), "%s", cands[i]);
        }
        if (!lx->bin[0]) {
                snprintf(lx->why, sizeof(lx->why),
                         "%s%s: sandboxes see the host's memory and CPUs (install lxcfs and "
                         "fuse3)",
                         env ? "COVE_LXCFS is not an executable path: " : "lxcfs not installed",
                         env ? env : "");
                return;
        }
        pthread_mutex_lock(&lx->mu);
        lxcfs_start(lx);
        pthread_mutex_unlock(&lx->mu);
}

/* Whether the views can be bound now; a daemon found gone is started again (rate-limited). */
static int lxcfs_ready(struct ns_lxcfs *lx)
{
        if (!lx->bin[0])
                return 0;
        pthread_mutex_lock(&lx->mu);
        int ok = lx->up && lxcfs_mounted(lx);
        if (!ok && cove_mono_ns() - lx->tried_ns > (int64_t)NS_LXCFS_RETRY_S * 1000000000) {
                lx->up = 0;
                lxcfs_start(lx);
                ok = lx->up;
        }
        pthread_mutex_unlock(&lx->mu);
        return ok;
}

static void lxcfs_stop(struct ns_lxcfs *lx)
{
        if (lx->pid > 0) {
                kill(lx->pid, SIGTERM);
                int st;
                for (int t = 0; t < 200 && waitpid(lx->pid, &st, WNOHANG) == 0; t++) {
                        struct timespec ts = {0, 10000000L};
                        nanosleep(&ts, NULL);
                }
                kill(lx->pid, SIGKILL);
                reap(lx->pid);
                lx->pid = 0;
        }
        if (lx->bin[0]) {
                while (umount2(lx->dir, MNT_DETACH) == 0)
                        ;
                rmdir(lx->dir);
                unlink(lx->pidfile);
        }
}

static int ns_host_view(struct cove_runtime *rt, char *why, size_t cap)
{
        pthread_mutex_lock(&rt->lx.mu);
        int up = rt->lx.up;
        snprintf(why, cap, "%s", rt->lx.why);
        pthread_mutex_unlock(&rt->lx.mu);
        return up;
}

/* The host's views bound into the sandbox of pid: its memory cgroup directory (cgdir, or
 * NULL) at COVE_GUEST_CGROUP_DIR and, when lxcfs is up, lxcfs's files over /proc/meminfo, ...
 * (attach = 1); or all of them taken away (attach = 0). coved binds them after each start and
 * restore and takes them away for a checkpoint: a bind of a host path in the dump would be
 * bound from that same path at restore (the source's cgroup for a fork; lxcfs's files in a
 * directory the restore cannot reach), and a sandbox must restore without lxcfs too. A
 * process holding one of them open then keeps the checkpoint from being taken (the caller
 * falls back to a files snapshot). From a forked helper (setns(CLONE_NEWNS) needs a process of
 * its own). */
static int views(struct cove_runtime *rt, pid_t pid, const char *cgdir, int attach,
                 struct cove_err *err)
{
        const char *to[1 + NS_LXCFS_VIEWS];
        int tree[1 + NS_LXCFS_VIEWS], n = 0, rc = -1;
        char nsp[64];
        snprintf(nsp, sizeof(nsp), "/proc/%d/ns/mnt", (int)pid);
        int nsfd = open(nsp, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0)
                return cove_err_set(err, errno, "ns: open %s", nsp);
        int lx = attach ? lxcfs_ready(&rt->lx) : rt->lx.bin[0] != 0;
        for (int i = -1; i < NS_LXCFS_VIEWS; i++) {
                char from[PATH_MAX + 64];
                if (i < 0 && !cgdir)
                        continue;
                if (i >= 0 && !lx)
                        break;
                if (i < 0)
                        snprintf(from, sizeof(from), "%s", cgdir);
                else
                        snprintf(from, sizeof(from), "%s/%s", rt->lx.dir, lxcfs_views[i]);
                to[n] = i < 0 ? COVE_GUEST_CGROUP_DIR : lxcfs_views[i];
                tree[n] = -1;
                if (attach) {
                        tree[n] = open_tree(AT_FDCWD, from, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
                        struct mount_attr attr;
                        memset(&attr, 0, sizeof(attr));
                        attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC |
                                        (i < 0 ? 0 : MOUNT_ATTR_RDONLY);
                        if (tree[n] < 0 ||
                            mount_setattr(tree[n], "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                                cove_err_set(err, errno, "ns: bind %s", from);
                                n++;
                                goto out;
                        }
                }
                n++;
        }
        pid_t c = fork();
        if (c < 0) {
                cove_err_set(err, errno, "ns: fork");
                goto out;
        }
        if (c == 0) {
                /* async-signal-safe only: coved is multi-threaded. Paths relative to the
                 * sandbox's root (setns moves there); a target the sandbox lacks (no /sys) is
                 * skipped */
                if (setns(nsfd, CLONE_NEWNS) < 0 || chdir("/") < 0)
                        _exit(errno & 0xff ? errno & 0xff : 1);
                for (int i = 0; i < n; i++) {
                        const char *t = to[i][0] == '/' ? to[i] + 1 : to[i];
                        if (tree[i] >= 0) {
                                if (move_mount(tree[i], "", AT_FDCWD, t, MOVE_MOUNT_F_EMPTY_PATH) <
                                        0 &&
                                    errno != ENOENT)
                                        _exit(errno & 0xff ? errno & 0xff : 1);
                        } else {
                                while (umount2(t, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
                                        ; /* until EINVAL: nothing (more) mounted there */
                        }
                }
                _exit(0);
        }
        int st = 0;
        while (waitpid(c, &st, 0) < 0 && errno == EINTR)
                ;
        if (!WIFEXITED(st) || WEXITSTATUS(st))
                cove_err_set(err, WIFEXITED(st) ? WEXITSTATUS(st) : EINTR,
                             "ns: %s the host's views in %d", attach ? "bind" : "take away",
                             (int)pid);
        else
                rc = 0;
out:
        for (int i = 0; i < n; i++)
                if (tree[i] >= 0)
                        close(tree[i]);
        close(nsfd);
        return rc;
}

static void shm_options(char *out, size_t cap, unsigned memory_mb)
{
        if (memory_mb)
                snprintf(out, cap, "mode=1777,size=%um", memory_mb / 2 ? memory_mb / 2 : 1);
        else
                snprintf(out, cap, "mode=1777");
}

static int ns_start(struct cove_runtime *rt, const struct cove_instance_spec *spec,
                    struct cove_instance *inst, struct cove_err *err)
{
        if (check_spec(spec, err) < 0) {
                struct cove_err e2;
                if (spec->mem_image)
                        cove_rm_rf(spec->mem_image, &e2);
                int lm = take_layer_mount(spec);
                if (lm >= 0)
                        close(lm);
                return -1;
        }
        if (spec->mem_image)
                return ns_restore(rt, spec, inst, err);
        const char *id = spec->sandbox_id;
        int layer_mfd = take_layer_mount(spec); /* -1, or given to cove_layer_prepare */
        struct ns_inst *priv = calloc(1, sizeof(*priv));
        if (!priv) {
                if (layer_mfd >= 0)
                        close(layer_mfd);
                return cove_err_set(err, ENOMEM, "ns: start %s", id);
        }
        strcpy(priv->id, id);
        struct child_args a;
        memset(&a, 0, sizeof(a));
        a.rt = rt;
        a.id = priv->id;
        a.sync_fd = a.guest_fd = -1;
        int chan[2] = {-1, -1}, sync[2] = {-1, -1}, tree = -1, ltree = -1, gtree = -1, userns = -1;
        int layer_created = 0, layer_mounted = 0, cg_created = 0;
        pid_t pid = -1;

        struct cove_cgroup_primer *primer = NULL;
        struct cove_cgroup_limits lim = {spec->cpus, spec->memory_mb,
                                         spec->pids_max ? spec->pids_max : NS_PIDS_DEFAULT,
                                         NS_GUEST_RESERVE_MB(spec->memory_mb), 1};
        if (cove_cgroup_create(rt->cg, id, &lim, err) < 0)
                goto fail;
        cg_created = 1;
        char cgdir[PATH_MAX];
        a.cg_view = cove_cgroup_work_dir(rt->cg, id, cgdir, sizeof(cgdir)) == 0;
        a.cg_sync = a.cg_view && !strcmp(cove_cgroups_mode(rt->cg), "v2");
        shm_options(a.shm_opts, sizeof(a.shm_opts), spec->memory_mb);
        /* the attach below waits for an RCU grace period unless one just passed: start that
         * wait now, alongside the layer and the clone (after the cgroup's mkdirs: the prime
         * holds cgroup_mutex while it waits, as any attach does) */
        primer = cove_cgroup_prime(rt->cg);
        int lc = cove_layer_prepare(rt->layers, id, spec->disk_mb, spec->uid_base, spec->uid_base,
                                    spec->layer_image, layer_mfd, spec->layer_key, err);
        layer_mfd = -1;
        if (lc < 0)
                goto fail;
        layer_created = lc;
        layer_mounted = 1;
        snprintf(a.layer, sizeof(a.layer), "%s/%s", cove_layers_path(rt->layers), id);
        a.guest_fd = open(spec->guest_binary, O_PATH | O_CLOEXEC);
        struct stat st;
        if (a.guest_fd < 0 || fstat(a.guest_fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                cove_err_set(err, a.guest_fd < 0 ? errno : ENOEXEC, "open guest binary %s",
                             spec->guest_binary);
                goto fail;
        }
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sync) < 0) {
                cove_err_set(err, errno, "socketpair");
                goto fail;
        }
        a.sync_fd = sync[1];

        pid = (pid_t)syscall(SYS_clone,
                             CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET |
                                 CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD,
                             NULL, NULL, NULL, NULL);
        if (pid < 0) {
                cove_err_set(err, errno, "clone");
                goto fail;
        }
        if (pid == 0)
                child_main(&a);
        close(sync[1]);
        sync[1] = -1;
        /* the guest channel is made by the child, in the sandbox's network namespace, so
         * that a checkpoint (CRIU) finds the guest's end there (unix sockets belong to the
         * netns they were made in); its first message is the node's end */
        chan[0] = cove_recv_fd(sync[0]);
        if (chan[0] < 0) {
                cove_err_set(err, EPROTO, "sandbox setup: no guest channel");
                goto fail;
        }

        if (write_map(pid, "uid_map", spec->uid_base, spec->uid_count, err) < 0 ||
            write_map(pid, "gid_map", spec->uid_base, spec->uid_count, err) < 0)
                goto fail;
        int attached = cove_cgroup_attach(rt->cg, id, pid, err);
        cove_cgroup_prime_end(primer);
        primer = NULL;
        if (attached < 0 ||
            (a.cg_view && cove_cgroup_work_delegate(rt->cg, id, spec->uid_base, err) < 0))
                goto fail;
        if (protect_from_oom(pid, err) < 0)
                goto fail;
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/ns/user", (int)pid);
        userns = open(p, O_RDONLY | O_CLOEXEC);
        if (userns < 0) {
                cove_err_set(err, errno, "open %s", p);
                goto fail;
        }
        tree = open_tree(AT_FDCWD, spec->rootfs, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree < 0) {
                cove_err_set(err, errno, "open_tree %s", spec->rootfs);
                goto fail;
        }
        struct mount_attr attr;
        memset(&attr, 0, sizeof(attr));
        attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV;
        attr.userns_fd = (uint64_t)userns;
        if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                cove_err_set(err, errno, "idmap %s", spec->rootfs);
                goto fail;
        }
        /* the layer: an image stores sandbox ids, so the sandbox gets it idmapped like the
         * template (disk k <-> host uid_base + k); a plain directory holds host ids already */
        ltree = open_tree(AT_FDCWD, a.layer, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (ltree < 0) {
                cove_err_set(err, errno, "open_tree %s", a.layer);
                goto fail;
        }
        if (cove_layer_has_image(rt->layers, id)) {
                attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
                if (mount_setattr(ltree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                        cove_err_set(err, errno, "idmap layer %s", a.layer);
                        goto fail;
                }
        }
        gtree = open_tree(a.guest_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        memset(&attr, 0, sizeof(attr));
        attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        if (gtree < 0 || mount_setattr(gtree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                cove_err_set(err, errno, "bind %s", spec->guest_binary);
                goto fail;
        }
        if (cove_send_fd(sync[0], tree, 'T') < 0 || cove_send_fd(sync[0], ltree, 'T') < 0 ||
            cove_send_fd(sync[0], gtree, 'T') < 0) {
                cove_err_set(err, errno, "pass template and layer to the sandbox");
                goto fail;
        }
        close(tree);
        tree = -1;
        close(ltree);
        ltree = -1;
        close(gtree);
        gtree = -1;
        close(userns);
        userns = -1;
        struct child_msg m;
        ssize_t n;
        do
                n = read(sync[0], &m, sizeof(m));
        while (n < 0 && errno == EINTR);
        if (a.cg_sync && n == (ssize_t)sizeof(m) && m.errnum == 0) {
                /* the child's cgroup namespace exists (v2): now its leaf and work's limit */
                if (cove_cgroup_work_split(rt->cg, id, pid, &lim, err) < 0)
                        goto fail;
                if (write(sync[0], "G", 1) != 1) {
                        cove_err_set(err, errno, "sandbox setup: sync");
                        goto fail;
                }
                do
                        n = read(sync[0], &m, sizeof(m));
                while (n < 0 && errno == EINTR);
        }
        if (n != 0) {
                if (n == (ssize_t)sizeof(m)) {
                        m.what[sizeof(m.what) - 1] = 0;
                        cove_err_set(err, m.errnum, "sandbox setup: %s", m.what);
                } else {
                        cove_err_set(err, n < 0 ? errno : EPROTO, "sandbox setup: sync");
                }
                goto fail;
        }
        if (views(rt, pid, a.cg_view ? cgdir : NULL, 1, err) < 0)
                goto fail;
        close(sync[0]);
        close(a.guest_fd);
        priv->mounts = cove_criu_mounts(pid);
        inst->pid = pid;
        inst->chan_fd = chan[0];
        inst->priv = priv;
        return 0;
fail:
        if (pid > 0) {
                kill(pid, SIGKILL);
                reap(pid);
        }
        for (int i = 0; i < 2; i++) {
                if (chan[i] >= 0)
                        close(chan[i]);
                if (sync[i] >= 0)
                        close(sync[i]);
        }
        if (tree >= 0)
                close(tree);
        if (ltree >= 0)
                close(ltree);
        if (gtree >= 0)
                close(gtree);
        if (userns >= 0)
                close(userns);
        if (a.guest_fd >= 0)
                close(a.guest_fd);
        if (layer_mfd >= 0)
                close(layer_mfd);
        cove_cgroup_prime_end(primer);
        if (cg_created) {
                cove_cgroup_kill(rt->cg, id, NULL);
                cove_cgroup_remove(rt->cg, id, NULL);
        }
        if (layer_created)
                cove_layer_remove(rt->layers, id, NULL);
        else if (layer_mounted)
                cove_layer_release(rt->layers, id, NULL); /* a kept layer stays, unmounted */
        free(priv);
        return cove_err_wrap(err, "ns: start %s", id);
}

static int ns_freeze(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err)
{
        struct ns_inst *priv = inst->priv;
        if (!priv)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "ns: instance not running");
        if (cove_cgroup_freeze(rt->cg, priv->id, 1, err) < 0)
                return cove_err_wrap(err, "ns: freeze %s", priv->id);
        return 0;
}

static int ns_thaw(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err)
{
        struct ns_inst *priv = inst->priv;
        if (!priv)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "ns: instance not running");
        if (cove_cgroup_freeze(rt->cg, priv->id, 0, err) < 0)
                return cove_err_wrap(err, "ns: thaw %s", priv->id);
        return 0;
}

static int teardown(struct cove_runtime *rt, const char *id, const char *state_dir, int purge,
                    struct cove_err *err)
{
        /* every step runs even when an earlier one failed (the first error is reported): a
         * cgroup kept busy by a zombie nobody has reaped yet must not keep the layer mounted
         * and its loop device attached */
        int rc = 0;
        struct cove_err e2;
        struct cove_err *e = err;
        if (state_dir)
                criu_mounts_release(state_dir); /* a restore interrupted by a crash */
        if (cove_cgroup_kill(rt->cg, id, e) < 0) {
                rc = -1;
                e = &e2;
        }
        if (cove_cgroup_remove(rt->cg, id, e) < 0) {
                rc = -1;
                e = &e2;
        }
        if (!purge) {
                if (cove_layer_release(rt->layers, id, e) < 0)
                        rc = -1;
        } else {
                if (cove_layer_remove(rt->layers, id, e) < 0) {
                        rc = -1;
                        e = &e2;
                }
                if (state_dir && cove_rm_rf(state_dir, e) < 0)
                        rc = -1;
        }
        return rc;
}

static int ns_stop(struct cove_runtime *rt, struct cove_instance *inst, const char *sandbox_id,
                   const char *state_dir, int purge, struct cove_err *err)
{
        struct ns_inst *priv = inst->priv;
        const char *id = priv ? priv->id : sandbox_id;
        if (!id)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "ns: stop without id");
        if (inst->pid > 0) {
                /* killing the pid namespace's init takes every process of the sandbox along;
                 * the cgroup sweep in teardown() thaws a frozen sandbox so they can die */
                kill(inst->pid, SIGKILL);
                cove_cgroup_kill(rt->cg, id, NULL);
                reap(inst->pid);
                inst->pid = 0;
        }
        if (inst->chan_fd >= 0) {
                close(inst->chan_fd);
                inst->chan_fd = -1;
        }
        int rc = teardown(rt, id, state_dir, purge, err);
        free(priv);
        inst->priv = NULL;
        if (rc < 0)
                return cove_err_wrap(err, "ns: stop %s", sandbox_id ? sandbox_id : id);
        return 0;
}

static int ns_kill(struct cove_runtime *rt, struct cove_instance *inst, const char *sandbox_id,
                   struct cove_err *err)
{
        struct ns_inst *priv = inst->priv;
        const char *id = priv ? priv->id : sandbox_id;
        if (!id)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "ns: kill without id");
        /* SIGKILL of the pid namespace's init takes every task of the namespace along (and
         * no new one can be forked into it); one pass over the cgroup reaches a task outside
         * it, if any, and thaws a frozen sandbox so that its tasks can die. No wait: a task
         * with SIGKILL pending never runs user code again, and its exit (the mount
         * namespace's teardown waits for RCU grace periods: tens of ms under load) is the
         * reaper's to wait for, in stop(). */
        if (inst->pid > 0)
                kill(inst->pid, SIGKILL);
        if (cove_cgroup_signal_kill(rt->cg, id, err) < 0)
                return cove_err_wrap(err, "ns: kill %s", id);
        return 0;
}

static int ns_cleanup_stale(struct cove_runtime *rt, const char *sandbox_id, const char *state_dir,
                            int purge, struct cove_err *err)
{
        if (!sandbox_id || !*sandbox_id || strchr(sandbox_id, '/'))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL, "ns: cleanup: bad id");
        /* the processes are not our children any more: whoever adopted them reaps them;
         * the mounts lived only in the sandbox's mount namespace and die with it */
        if (teardown(rt, sandbox_id, state_dir, purge, err) < 0)
                return cove_err_wrap(err, "ns: cleanup %s", sandbox_id);
        return 0;
}

static int ns_usage(struct cove_runtime *rt, struct cove_instance *inst, uint64_t *mem_bytes,
                    uint64_t *cpu_usec, struct cove_err *err)
{
        struct ns_inst *priv = inst->priv;
        if (!priv)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "ns: instance not running");
        if (cove_cgroup_usage(rt->cg, priv->id, mem_bytes, cpu_usec, err) < 0)
                return cove_err_wrap(err, "ns: usage %s", priv->id);
        return 0;
}

/* ---- time machine ---- */

static int ns_layer_snapshot(struct cove_runtime *rt, struct cove_instance *inst,
                             const char *sandbox_id, const char *dest_image, uint64_t *pause_ns,
                             struct cove_err *err)
{
        struct ns_inst *priv = inst->priv;
        const char *id = priv ? priv->id : sandbox_id;
        if (!priv || !id)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "ns: snapshot: instance not running");
        if (cove_layer_snapshot(rt->layers, id, dest_image, pause_ns, err) < 0 ||
            cove_layer_recover(dest_image, err) < 0)
                return cove_err_wrap(err, "ns: snapshot %s", id);
        return 0;
}

static const char *ns_layer_dir(struct cove_runtime *rt)
{
        return cove_layers_image_dir(rt->layers);
}

static int ns_layer_open(struct cove_runtime *rt, const char *image, int create, unsigned disk_mb,
                         const uint8_t *key, int *tree_fd, struct cove_layer_handle **h,
                         struct cove_err *err)
{
        struct cove_layer_handle *lh = calloc(1, sizeof(*lh));
        if (!lh)
                return cove_err_set(err, ENOMEM, "ns: layer open");
        lh->mfd = cove_layer_image_open(rt->layers, image, create, disk_mb, key, tree_fd, err);
        if (lh->mfd < 0) {
                free(lh);
                return cove_err_wrap(err, "ns");
        }
        *h = lh;
        return 0;
}

static void ns_layer_close(struct cove_runtime *rt, struct cove_layer_handle *h)
{
        (void)rt;
        if (!h)
                return;
        /* no sync: the unmount that follows the last close writes a restored tree back before
         * a start() can mount the image again (and it needs no durability: a crash before the
         * sandbox runs from it discards it) */
        close(h->mfd);
        free(h);
}

/* ---- full snapshots (CRIU; runtime/criu.h) ----
 *
 * Dump: freeze the cgroup, `criu dump --leave-running` through that freezer (CRIU leaves it
 * frozen as it found it), clone the layer (cove_layer_snapshot: its syncfs commits every
 * write the frozen processes made), thaw, then replay the clone's journal. Files and
 * processes are from the same instant; the pause is freeze to thaw.
 * Restore: the layer image is prepared as for a cold start; the sandbox's root is built on
 * the host this time (CRIU restores the mount namespace itself and wants the root as a
 * path): the template and the layer idmapped through a throwaway user namespace with the
 * sandbox's map, and an overlayfs (userxattr, same on-disk format as the sandbox's own)
 * over them at <state>/criu-root; `criu restore --root` binds it into the restored mount
 * namespace, and coved detaches its host mounts right after. CRIU restores the user, pid,
 * net, ipc, uts and mount namespaces, seccomp, and every process; the restored tree is put
 * into the sandbox's cgroup (criu runs in it), and its root becomes coved's child
 * (--restore-sibling from the spawner thread, as a cold start). The guest channel comes back
 * as a temporary socket pair from coved (--inherit-fd); the node then moves the guest to a
 * channel made in the sandbox's own netns (cove_frame_rechannel), where the next dump finds
 * it. A fork (another uid range) gets the user namespace map rewritten and its hostname set.
 */

#define CRIU_META "cove.meta"
#define CHECK_UID_BASE (0x10000000u - 0x10000u) /* below the node's ranges */

static void set_full(struct cove_runtime *rt, int state, const char *why)
{
        pthread_mutex_lock(&rt->full_mu);
        rt->full_state = state;
        snprintf(rt->full_why, sizeof(rt->full_why), "%s", why ? why : "");
        pthread_mutex_unlock(&rt->full_mu);
}

static int ns_full_status(struct cove_runtime *rt, char *why, size_t cap)
{
        pthread_mutex_lock(&rt->full_mu);
        int st = rt->full_state;
        if (why && cap)
                snprintf(why, cap, "%s", rt->full_why);
        pthread_mutex_unlock(&rt->full_mu);
        return st;
}

static int read_uid_base(pid_t pid, uint32_t *base)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/uid_map", (int)pid);
        FILE *f = fopen(p, "re");
        unsigned a = 1, b = 0, c = 0;
        int n = f ? fscanf(f, "%u %u %u", &a, &b, &c) : 0;
        if (f)
                fclose(f);
        if (n != 3 || a != 0)
                return -1;
        *base = b;
        return 0;
}

/* A checkpoint leaves the network namespace's configuration behind (criu --empty-ns net): a
 * restore comes up with loopback only, the node attaches a new egress link, and established
 * TCP connections come back closed. A socket bound to an address of the egress link (a
 * listener or UDP socket on the sandbox's own address, a connected UDP socket) could not be
 * bound again, so such a sandbox gets a files snapshot instead (the caller falls back). */
static int local_ok(const char *hex)
{
        size_t n = strlen(hex);
        if (n == 8) { /* IPv4, as the kernel's __be32 printed in host order */
                uint32_t a = ntohl((uint32_t)strtoul(hex, NULL, 16));
                return a == 0 || (a >> 24) == 127;
        }
        if (n != 32)
                return 0;
        static const char *const ok[] = {
            "00000000000000000000000000000000", /* :: */
            "00000000000000000000000001000000", /* ::1 */
        };
        for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
                if (!strcasecmp(hex, ok[i]))
                        return 1;
        /* ::ffff:a.b.c.d */
        return !strncasecmp(hex, "0000000000000000FFFF0000", 24) && local_ok(hex + 24);
}

static int bound_to_link(pid_t pid, struct cove_err *err)
{
        static const struct {
                const char *file;
                int tcp;
        } tabs[] = {{"tcp", 1}, {"tcp6", 1}, {"udp", 0}, {"udp6", 0}};
        for (size_t t = 0; t < sizeof(tabs) / sizeof(tabs[0]); t++) {
                char p[64], line[512];
                snprintf(p, sizeof(p), "/proc/%d/net/%s", (int)pid, tabs[t].file);
                FILE *f = fopen(p, "re");
                if (!f) {
                        if (errno == ENOENT) /* no IPv6 */
                                continue;
                        return cove_err_set(err, errno, "ns: %s", p);
                }
                int bad = 0;
                if (!fgets(line, sizeof(line), f)) /* header */
                        line[0] = 0;
                while (!bad && fgets(line, sizeof(line), f)) {
                        char local[64];
                        unsigned port = 0, st = 0;
                        if (sscanf(line, " %*u: %63[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x", local,
                                   &port, &st) != 3)
                                continue;
                        /* TCP: a listener (0A) or a bound, unconnected socket (07) is bound
                         * again at restore; connections (closed at restore) and TIME_WAIT
                         * leftovers (no process) are not */
                        if (tabs[t].tcp && st != 0x0A && st != 0x07)
                                continue;
                        if (port && !local_ok(local))
                                bad = 1;
                }
                fclose(f);
                if (bad)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "a socket is bound to the sandbox's link address "
                                             "(%s), which a restore cannot take along",
                                             tabs[t].file);
        }
        return 0;
}

static int ns_full_dump(struct cove_runtime *rt, struct cove_instance *inst, const char *sandbox_id,
                        const char *dest_image, const char *dest_mem, int leave_frozen,
                        uint64_t *pause_ns, struct cove_err *err)
{
        struct ns_inst *priv = inst->priv;
        const char *id = priv ? priv->id : sandbox_id;
        if (!priv || inst->pid <= 0)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "ns: full snapshot: not running");
        if (ns_full_status(rt, NULL, 0) != 1 && strcmp(id, rt->check_id))
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "ns: full snapshots unavailable on this node");
        char fz[PATH_MAX], chp[64];
        const char *dir = dest_mem;
        snprintf(chp, sizeof(chp), "/proc/%d/fd/%d", (int)inst->pid, NS_CHAN_FD);
        struct stat cst;
        uint32_t base = 0;
        if (stat(chp, &cst) < 0 || !S_ISSOCK(cst.st_mode) || read_uid_base(inst->pid, &base) < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, errno,
                                     "ns: full snapshot %s: no guest channel", id);
        if (cove_cgroup_freezer_dir(rt->cg, id, fz, sizeof(fz)) < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "ns: no freezer cgroup");
        if (bound_to_link(inst->pid, err) < 0)
                return -1;
        struct cove_err e2;
        if (mkdir(dir, 0700) < 0)
                return cove_err_set(err, errno, "ns: full snapshot: mkdir %s", dir);
        int64_t t0 = cove_mono_ns();
        char cgdir[PATH_MAX];
        int view = cove_cgroup_work_dir(rt->cg, id, cgdir, sizeof(cgdir)) == 0;
        int rc = cove_cgroup_freeze(rt->cg, id, 1, err);
        if (rc == 0) /* frozen: what it holds cannot change until the thaw (the mount table
                      * is checked as set up, views included) */
                rc = cove_criu_restorable(fz, inst->pid, priv->mounts, err);
        /* the cgroup view stays out of the dump (views()); frozen, nothing misses it */
        if (rc == 0)
                rc = views(rt, inst->pid, view ? cgdir : NULL, 0, err);
        if (rc == 0)
                rc = cove_criu_dump(&rt->criu, inst->pid, dir, fz, (uint64_t)cst.st_ino, err);
        if (views(rt, inst->pid, view ? cgdir : NULL, 1, rc == 0 ? err : &e2) < 0 && rc == 0)
                rc = -1;
        /* the views are bound again (new mount ids), still frozen: nothing of the
         * sandbox's own changed since the check, so this is the table as set up */
        if (rc == 0)
                priv->mounts = cove_criu_mounts(inst->pid);
        uint64_t lpause = 0;
        if (rc == 0)
                rc = cove_layer_snapshot(rt->layers, id, dest_image, &lpause, err);
        *pause_ns = (uint64_t)(cove_mono_ns() - t0);
        if ((rc < 0 || !leave_frozen) &&
            cove_cgroup_freeze(rt->cg, id, 0, rc == 0 ? err : &e2) < 0 && rc == 0) {
                unlink(dest_image);
                rc = -1;
        }
        if (!leave_frozen)
                *pause_ns = (uint64_t)(cove_mono_ns() - t0);
        if (rc == 0 && cove_layer_recover(dest_image, err) < 0) {
                rc = -1;
                if (leave_frozen)
                        cove_cgroup_freeze(rt->cg, id, 0, &e2);
        }
        if (rc == 0) {
                /* what the restore needs besides criu's images; criu's log is not kept */
                char meta[192], mp[PATH_MAX + 16];
                int n = snprintf(meta, sizeof(meta), "chan_ino=%llu\nuid_base=%u\nid=%s\n",
                                 (unsigned long long)cst.st_ino, base, id);
                snprintf(mp, sizeof(mp), "%s/" CRIU_META, dir);
                cleanup_close int mfd = open(mp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
                if (mfd < 0 || write(mfd, meta, (size_t)n) != n || fsync(mfd) < 0) {
                        cove_err_set(err, errno, "ns: full snapshot: write %s", mp);
                        unlink(dest_image);
                        rc = -1;
                        if (leave_frozen)
                                cove_cgroup_freeze(rt->cg, id, 0, &e2);
                }
                snprintf(mp, sizeof(mp), "%s/dump.log", dir);
                unlink(mp);
        }
        if (rc < 0) {
                cove_rm_rf(dir, &e2);
                return cove_err_wrap(err, "ns: full snapshot %s", id);
        }
        return 0;
}

/* src_id[64]: the sandbox the checkpoint was taken of ("" in checkpoints from before it was
 * recorded). */
static int read_meta(const char *dir, uint64_t *ino, uint32_t *base, char *src_id,
                     struct cove_err *err)
{
        char p[PATH_MAX + 16];
        snprintf(p, sizeof(p), "%s/" CRIU_META, dir);
        FILE *f = fopen(p, "re");
        unsigned long long i = 0;
        unsigned b = 0;
        int n = f ? fscanf(f, "chan_ino=%llu uid_base=%u", &i, &b) : 0;
        src_id[0] = 0;
        if (f && n == 2 && fscanf(f, " id=%63[A-Za-z0-9_-]", src_id) != 1)
                src_id[0] = 0;
        if (f)
                fclose(f);
        if (n != 2 || !i || !b)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, EBADMSG,
                                     "ns: checkpoint without its metadata");
        *ino = i;
        *base = b;
        return 0;
}

/* A user namespace with the sandbox's map, only to idmap mounts with; fd or -1. */
static int userns_with_map(uint32_t base, uint32_t count, struct cove_err *err)
{
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return cove_err_set(err, errno, "ns: pipe");
        pid_t c = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
        if (c < 0) {
                close(p[0]);
                close(p[1]);
                return cove_err_set(err, errno, "ns: clone user namespace");
        }
        if (c == 0) {
                /* only the read end stays: a write end of another thread's pipe, copied into
                 * this child by a fork at the same moment (two starts at once), would keep that
                 * thread's child waiting for its EOF as long as this one waits for its own */
                char b;
                if (p[0] > 0)
                        syscall(SYS_close_range, 0, (unsigned)p[0] - 1, 0);
                syscall(SYS_close_range, (unsigned)p[0] + 1, ~0U, 0);
                while (read(p[0], &b, 1) < 0 && errno == EINTR)
                        ;
                _exit(0);
        }
        close(p[0]);
        int fd = -1;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)c);
        if (write_map(c, "uid_map", base, count, err) == 0 &&
            write_map(c, "gid_map", base, count, err) == 0) {
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        cove_err_set(err, errno, "ns: open %s", path);
        }
        close(p[1]);
        reap(c);
        return fd;
}

static void criu_mounts_release(const char *state_dir)
{
        static const char *const m[] = {"criu-root", "criu-layer", "criu-lower"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(m); i++) {
                char p[PATH_MAX];
                snprintf(p, sizeof(p), "%s/%s", state_dir, m[i]);
                while (umount2(p, MNT_DETACH) == 0)
                        ;
                rmdir(p);
        }
}

static int attach_at(int tree, const char *state_dir, const char *name, char *out, size_t cap,
                     struct cove_err *err)
{
        snprintf(out, cap, "%s/%s", state_dir, name);
        if (mkdir(out, 0700) < 0 && errno != EEXIST)
                return cove_err_set(err, errno, "ns: mkdir %s", out);
        if (move_mount(tree, "", AT_FDCWD, out, MOVE_MOUNT_F_EMPTY_PATH) < 0)
                return cove_err_set(err, errno, "ns: attach %s", out);
        return 0;
}

struct ovl_job {
        const char *lower, *upper, *work;
        uint32_t base;
        int fd, errnum;
};

/* Mount the overlay with the credentials the sandbox's own mount would have: overlayfs
 * works in its upper/work dirs as its mounter, and host uid 0 has no mapping through the
 * idmapped layer (EOVERFLOW, then a read-only overlay); fsuid/fsgid = the sandbox's root
 * (disk id 0) with every capability effective does. Per-thread credentials, on a thread of
 * its own that ends right after. */
static void *ovl_main(void *arg)
{
        struct ovl_job *j = arg;
        struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
        struct __user_cap_data_struct cap[2];
        syscall(SYS_setfsgid, j->base);
        syscall(SYS_setfsuid, j->base);
        if (syscall(SYS_capget, &hdr, cap) == 0) {
                cap[0].effective = cap[0].permitted;
                cap[1].effective = cap[1].permitted;
                syscall(SYS_capset, &hdr, cap);
        }
        int fs = fsopen("overlay", FSOPEN_CLOEXEC);
        if (fs < 0 || fsconfig(fs, FSCONFIG_SET_STRING, "lowerdir", j->lower, 0) < 0 ||
            fsconfig(fs, FSCONFIG_SET_STRING, "upperdir", j->upper, 0) < 0 ||
            fsconfig(fs, FSCONFIG_SET_STRING, "workdir", j->work, 0) < 0 ||
            fsconfig(fs, FSCONFIG_SET_FLAG, "userxattr", NULL, 0) < 0 ||
            fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                j->errnum = errno;
        else if ((j->fd = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV)) < 0)
                j->errnum = errno;
        if (fs >= 0)
                close(fs);
        return NULL;
}

/* The sandbox's root as it will see it, built on the host at <state>/criu-root. */
static int host_root(struct cove_runtime *rt, const struct cove_instance_spec *spec, uint32_t base,
                     char *root, size_t rcap, struct cove_err *err)
{
        int userns = userns_with_map(base, spec->uid_count ? spec->uid_count : 65536, err);
        if (userns < 0)
                return -1;
        int rc = -1, tree = -1, ltree = -1, mfd = -1;
        char lower[PATH_MAX], layer[PATH_MAX], lp[PATH_MAX], upper[PATH_MAX + 8],
            work[PATH_MAX + 8];
        struct mount_attr attr;
        memset(&attr, 0, sizeof(attr));
        attr.userns_fd = (uint64_t)userns;
        attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV;
        tree = open_tree(AT_FDCWD, spec->rootfs, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree < 0 || mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                cove_err_set(err, errno, "ns: idmap %s", spec->rootfs);
                goto out;
        }
        if (attach_at(tree, spec->state_dir, "criu-lower", lower, sizeof(lower), err) < 0)
                goto out;
        snprintf(lp, sizeof(lp), "%s/%s", cove_layers_path(rt->layers), spec->sandbox_id);
        attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        ltree = open_tree(AT_FDCWD, lp, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (ltree < 0 || mount_setattr(ltree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                cove_err_set(err, errno, "ns: idmap layer %s", lp);
                goto out;
        }
        if (attach_at(ltree, spec->state_dir, "criu-layer", layer, sizeof(layer), err) < 0)
                goto out;
        snprintf(upper, sizeof(upper), "%s/upper", layer);
        snprintf(work, sizeof(work), "%s/work", layer);
        struct ovl_job j = {lower, upper, work, base, -1, 0};
        pthread_t t;
        if (pthread_create(&t, NULL, ovl_main, &j) != 0) {
                cove_err_set(err, EAGAIN, "ns: overlay thread");
                goto out;
        }
        pthread_join(t, NULL);
        mfd = j.fd;
        if (mfd < 0) {
                cove_err_set(err, j.errnum, "ns: overlay for the restore");
                goto out;
        }
        if (attach_at(mfd, spec->state_dir, "criu-root", root, rcap, err) < 0)
                goto out;
        /* overlayfs falls back to read-only when it cannot use its work dir: refuse that */
        struct statvfs sv;
        if (statvfs(root, &sv) < 0 || (sv.f_flag & ST_RDONLY)) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, EROFS, "ns: the restored root is read-only");
                goto out;
        }
        rc = 0;
out:
        for (int *f = (int[]){tree, ltree, mfd, userns}, i = 0; i < 4; i++)
                if (f[i] >= 0)
                        close(f[i]);
        if (rc < 0)
                criu_mounts_release(spec->state_dir);
        return rc;
}

/* CRIU reads some images from inside the restored user namespace, some of them before the
 * task's credentials are set up there (no capability over any file yet): the images are
 * readable by anyone who can reach them, which is nobody but host root and the restore
 * (they sit in the 0700 state dir, criu opens them through its own directory fd, and they
 * are deleted right after the restore); owned by the sandbox's root. */
static int own_tree(const char *dir, uint32_t uid, struct cove_err *err)
{
        cleanup_dir DIR *d = opendir(dir);
        if (!d)
                return cove_err_set(err, errno, "ns: %s", dir);
        struct dirent *de;
        while ((de = readdir(d)))
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
                    (fchownat(dirfd(d), de->d_name, uid, uid, AT_SYMLINK_NOFOLLOW) < 0 ||
                     fchmodat(dirfd(d), de->d_name, 0644, 0) < 0))
                        return cove_err_set(err, errno, "ns: chown %s", de->d_name);
        if (chown(dir, uid, uid) < 0 || chmod(dir, 0755) < 0)
                return cove_err_set(err, errno, "ns: chown %s", dir);
        return 0;
}

struct cg_prep {
        struct cove_runtime *rt;
        const char *id;
        struct cove_cgroup_primer *primer; /* ended right after the attach */
};

static int prep_cgroup(void *arg, pid_t child, struct cove_err *err)
{
        struct cg_prep *p = arg;
        int r = cove_cgroup_attach(p->rt->cg, p->id, child, err);
        cove_cgroup_prime_end(p->primer);
        p->primer = NULL;
        return r;
}

struct uts_job {
        pid_t pid;
        const char *name;
        int rc;
};

static void *uts_main(void *arg)
{
        struct uts_job *j = arg;
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/ns/uts", (int)j->pid);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        j->rc =
            fd >= 0 && setns(fd, CLONE_NEWUTS) == 0 && sethostname(j->name, strlen(j->name)) == 0
                ? 0
                : -errno;
        if (fd >= 0)
                close(fd);
        return NULL;
}

/* sethostname in the restored sandbox's uts namespace, from a thread that ends right after
 * (setns changes only the calling thread) */
static int set_hostname(pid_t pid, const char *name, struct cove_err *err)
{
        struct uts_job j = {pid, name, 0};
        pthread_t t;
        if (pthread_create(&t, NULL, uts_main, &j) != 0)
                return cove_err_set(err, EAGAIN, "ns: hostname thread");
        pthread_join(t, NULL);
        if (j.rc < 0)
                return cove_err_set(err, -j.rc, "ns: set hostname %s", name);
        return 0;
}

/* A fresh boot id in a restored fork: rewrite the file bound over its boot_id (on its /dev
 * tmpfs, read-only again afterwards), from a forked helper in its mount namespace. */
static int renew_boot_id(pid_t pid, struct cove_err *err)
{
        char nsp[64], bid[40];
        snprintf(nsp, sizeof(nsp), "/proc/%d/ns/mnt", (int)pid);
        if (boot_id(bid) < 0)
                return cove_err_set(err, errno, "ns: boot id");
        int nsfd = open(nsp, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0)
                return cove_err_set(err, errno, "ns: open %s", nsp);
        pid_t c = fork();
        if (c == 0) {
                /* async-signal-safe only */
                if (setns(nsfd, CLONE_NEWNS) < 0 || chdir("/") < 0 ||
                    mount(NULL, "dev", NULL, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC, NULL) <
                        0)
                        _exit(1);
                int fd = open(NS_BOOT_ID_REL, O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
                int ok = fd >= 0 && write(fd, bid, 37) == 37;
                if (fd >= 0)
                        close(fd);
                int ro = mount(NULL, "dev", NULL,
                               MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC, NULL) == 0;
                _exit(ok && ro ? 0 : 2);
        }
        close(nsfd);
        if (c < 0)
                return cove_err_set(err, errno, "ns: fork");
        int st = 0;
        while (waitpid(c, &st, 0) < 0 && errno == EINTR)
                ;
        if (!WIFEXITED(st) || WEXITSTATUS(st))
                return cove_err_set(err, EIO, "ns: new boot id in %d", (int)pid);
        return 0;
}

static void copy_file(const char *from, const char *to)
{
        cleanup_close int in = open(from, O_RDONLY | O_CLOEXEC);
        cleanup_close int out =
            in < 0 ? -1 : open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        char buf[8192];
        ssize_t n;
        while (out >= 0 && (n = read(in, buf, sizeof(buf))) > 0)
                if (write(out, buf, (size_t)n) != n)
                        break;
}

static int ns_restore(struct cove_runtime *rt, const struct cove_instance_spec *spec,
                      struct cove_instance *inst, struct cove_err *err)
{
        const char *id = spec->sandbox_id;
        struct ns_inst *priv = calloc(1, sizeof(*priv));
        char dir[PATH_MAX], root[PATH_MAX];
        int chan[2] = {-1, -1}, cg_created = 0, layer_created = 0, layer_mounted = 0;
        int layer_mfd = take_layer_mount(spec); /* -1, or given to cove_layer_prepare */
        struct cg_prep prep = {rt, id, NULL};
        pid_t pid = -1;
        struct cove_err e2;
        if (!priv) {
                if (layer_mfd >= 0)
                        close(layer_mfd);
                cove_rm_rf(spec->mem_image, &e2);
                if (spec->layer_image)
                        unlink(spec->layer_image);
                return cove_err_set(err, ENOMEM, "ns: restore %s", id);
        }
        strcpy(priv->id, id);
        snprintf(dir, sizeof(dir), "%s", spec->mem_image);
        criu_mounts_release(spec->state_dir);
        uint64_t ino = 0;
        uint32_t old_base = 0;
        char src_id[64];
        if (read_meta(dir, &ino, &old_base, src_id, err) < 0 ||
            cove_criu_images_safe(dir, err) < 0 ||
            cove_criu_userns_rebase(dir, old_base, spec->uid_base, err) < 0 ||
            own_tree(dir, spec->uid_base, err) < 0)
                goto fail_early;
        struct cove_cgroup_limits lim = {spec->cpus, spec->memory_mb,
                                         spec->pids_max ? spec->pids_max : NS_PIDS_DEFAULT,
                                         NS_GUEST_RESERVE_MB(spec->memory_mb), 1};
        if (cove_cgroup_create(rt->cg, id, &lim, err) < 0)
                goto fail;
        cg_created = 1;
        if (cove_cgroup_work_delegate(rt->cg, id, spec->uid_base, err) < 0)
                goto fail;
        /* as in ns_start: the attach (criu's, in prep_cgroup) finds the lock ready */
        prep.primer = cove_cgroup_prime(rt->cg);
        int lc = cove_layer_prepare(rt->layers, id, spec->disk_mb, spec->uid_base, spec->uid_base,
                                    spec->layer_image, layer_mfd, spec->layer_key, err);
        layer_mfd = -1;
        if (lc < 0)
                goto fail;
        layer_created = lc;
        layer_mounted = 1;
        if (!cove_layer_has_image(rt->layers, id)) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, 0, "ns: a full restore needs a layer image");
                goto fail;
        }
        if (host_root(rt, spec, spec->uid_base, root, sizeof(root), err) < 0)
                goto fail;
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) < 0) {
                cove_err_set(err, errno, "ns: socketpair");
                goto fail;
        }
        int rc =
            cove_criu_restore(&rt->criu, dir, root, chan[1], ino, prep_cgroup, &prep, &pid, err);
        cove_cgroup_prime_end(prep.primer); /* when criu failed before the attach */
        prep.primer = NULL;
        criu_mounts_release(spec->state_dir); /* the sandbox has its own copy now */
        close(chan[1]);
        chan[1] = -1;
        if (rc < 0) {
                pid = -1;
                goto fail;
        }
        /* a fork is another sandbox: its own hostname (the dump carries the source's) */
        if (set_hostname(pid, id, err) < 0)
                goto fail;
        /* and its own boot id (a resume of the same sandbox keeps its boot's); best effort:
         * a fork with its source's boot id still works */
        struct cove_err e3;
        if (src_id[0] && strcmp(src_id, id) != 0)
                renew_boot_id(pid, &e3);
        /* criu put every restored task into cove/<id>: the workload goes back into work */
        char cgdir[PATH_MAX];
        int has_work = cove_cgroup_work_dir(rt->cg, id, cgdir, sizeof(cgdir)) == 0;
        if ((has_work && cove_cgroup_work_settle(rt->cg, id, pid, &lim, err) < 0) ||
            views(rt, pid, has_work ? cgdir : NULL, 1, err) < 0)
                goto fail;
        cove_rm_rf(dir, &e2);
        priv->mounts = cove_criu_mounts(pid);
        inst->pid = pid;
        inst->chan_fd = chan[0];
        inst->rechannel = 1;
        inst->priv = priv;
        return 0;
fail_early:
        if (spec->layer_image)
                unlink(spec->layer_image);
fail:
        if (layer_mfd >= 0)
                close(layer_mfd);
        cove_cgroup_prime_end(prep.primer);
        if (pid > 0) {
                kill(pid, SIGKILL);
                reap(pid);
        }
        for (int i = 0; i < 2; i++)
                if (chan[i] >= 0)
                        close(chan[i]);
        criu_mounts_release(spec->state_dir);
        if (cg_created) {
                cove_cgroup_kill(rt->cg, id, NULL);
                cove_cgroup_remove(rt->cg, id, NULL);
        }
        if (layer_created)
                cove_layer_remove(rt->layers, id, NULL);
        else if (layer_mounted)
                cove_layer_release(rt->layers, id, NULL);
        {
                /* criu's log of the failed restore stays next to the sandbox's state */
                char from[PATH_MAX + 16], to[PATH_MAX + 32];
                snprintf(from, sizeof(from), "%s/restore.log", dir);
                snprintf(to, sizeof(to), "%s/criu-restore.log", spec->state_dir);
                copy_file(from, to);
        }
        cove_rm_rf(dir, &e2);
        free(priv);
        return cove_err_wrap(err, "ns: restore %s", id);
}

/* handshake on a channel fd (the self-check's stand-in for the node) */
static int check_hello(int fd, struct cove_err *err)
{
        static const char h[] = "{\"version\":1,\"token\":\"0\",\"hostname\":\"check\"}";
        if (cove_frame_write_timeout(fd, COVE_F_HELLO, 0, 0, h, sizeof(h) - 1, 5000, err) < 0)
                return -1;
        uint8_t hdr[COVE_FRAME_HDR];
        size_t got = 0;
        while (got < sizeof(hdr)) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                if (poll(&p, 1, 5000) <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, ETIMEDOUT, "no HELLO");
                ssize_t n = read(fd, hdr + got, sizeof(hdr) - got);
                if (n <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, EPIPE, "channel closed");
                got += (size_t)n;
        }
        struct cove_frame f;
        if (cove_frame_hdr_decode(hdr, COVE_FRAME_MAX, &f, err) < 0 || f.type != COVE_F_HELLO)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, EPROTO, "bad HELLO");
        char body[256];
        if (f.len >= sizeof(body))
                return cove_err_setk(err, COVE_E_UNAVAILABLE, EPROTO, "bad HELLO");
        got = 0;
        while (got < f.len) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                ssize_t n = poll(&p, 1, 5000) > 0 ? read(fd, body + got, f.len - got) : -1;
                if (n <= 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, EPIPE, "short HELLO");
                got += (size_t)n;
        }
        body[got] = 0;
        if (!strstr(body, "\"ok\":true") && !strstr(body, "\"ok\": true"))
                return cove_err_setk(err, COVE_E_UNAVAILABLE, EPROTO, "guest refused the HELLO");
        return 0;
}

static void ns_full_selfcheck(struct cove_runtime *rt, const char *guest_binary)
{
        if (!rt->criu.found) {
                set_full(rt, 0, rt->criu.why);
                return;
        }
        const char *id = rt->check_id;
        char rootfs[PATH_MAX], state[PATH_MAX], img[PATH_MAX], mem[PATH_MAX];
        snprintf(rootfs, sizeof(rootfs), "%s/criu-check-root", rt->ns_dir);
        snprintf(state, sizeof(state), "%s/criu-check-state", rt->ns_dir);
        snprintf(img, sizeof(img), "%s/%s.img", cove_layers_image_dir(rt->layers), id);
        snprintf(mem, sizeof(mem), "%s/%s.criu", cove_layers_image_dir(rt->layers), id);
        struct cove_err err, e2;
        memset(&err, 0, sizeof(err));
        unlink(img);
        cove_rm_rf(mem, &e2);
        /* an empty root with the directories every template has (criu restore wants /tmp) */
        mkdir(rootfs, 0755);
        for (const char *const *d = (const char *const[]){"tmp", "dev", "proc", "sys", NULL}; *d;
             d++) {
                char p[PATH_MAX + 8];
                snprintf(p, sizeof(p), "%s/%s", rootfs, *d);
                mkdir(p, 0755);
        }
        /* what a check interrupted by a crash left: processes, cgroups, layer, mounts */
        ns_cleanup_stale(rt, id, state, 1, &e2);
        mkdir(state, 0700);
        int64_t t0 = cove_mono_ns();
        struct cove_instance_spec spec = {.sandbox_id = id,
                                          .rootfs = rootfs,
                                          .state_dir = state,
                                          .guest_binary = guest_binary,
                                          .disk_mb = 16,
                                          .memory_mb = 256,
                                          .uid_base = CHECK_UID_BASE,
                                          .uid_count = 65536};
        struct cove_instance inst = {.chan_fd = -1};
        const char *step = "start";
        int ok = 0, nfd = -1;
        uint64_t pause = 0;
        if (ns_start(rt, &spec, &inst, &err) < 0)
                goto out;
        step = "handshake";
        if (check_hello(inst.chan_fd, &err) < 0)
                goto out;
        step = "dump";
        if (ns_full_dump(rt, &inst, id, img, mem, 0, &pause, &err) < 0)
                goto out;
        ns_stop(rt, &inst, id, NULL, 1, &e2);
        inst = (struct cove_instance){.chan_fd = -1};
        step = "restore";
        spec.layer_image = img;
        spec.mem_image = mem;
        if (ns_start(rt, &spec, &inst, &err) < 0)
                goto out;
        step = "rechannel";
        nfd = cove_frame_rechannel(inst.chan_fd, 5000, &err);
        if (nfd < 0 || check_hello(nfd, &err) < 0)
                goto out;
        ok = 1;
out:
        if (nfd >= 0)
                close(nfd);
        if (inst.priv || inst.pid > 0)
                ns_stop(rt, &inst, id, NULL, 1, &e2);
        ns_cleanup_stale(rt, id, NULL, 1, &e2);
        unlink(img);
        cove_rm_rf(mem, &e2);
        if (ok) /* a failed restore left criu's log in <state>/criu-restore.log */
                cove_rm_rf(state, &e2);
        char why[320];
        if (ok)
                snprintf(why, sizeof(why), "criu %s at %s: self-check passed in %.0f ms",
                         rt->criu.version, rt->criu.path, (double)(cove_mono_ns() - t0) / 1e6);
        else
                snprintf(why, sizeof(why), "criu %s self-check failed at %s: %s", rt->criu.version,
                         step, err.msg);
        set_full(rt, ok, why);
}

static void ns_close(struct cove_runtime *rt)
{
        if (!rt)
                return;
        cove_layers_close(rt->layers);
        cove_cgroups_free(rt->cg);
        free(rt->filter.filter);
        pthread_mutex_destroy(&rt->full_mu);
        lxcfs_stop(&rt->lx);
        pthread_mutex_destroy(&rt->lx.mu);
        free(rt);
}

static struct cove_runtime *ns_open(const char *data_dir, struct cove_err *err)
{
        if (geteuid() != 0) {
                cove_err_setk(err, COVE_E_UNAVAILABLE, EPERM, "ns runtime: needs root");
                return NULL;
        }
        struct cove_runtime *rt = calloc(1, sizeof(*rt));
        if (!rt) {
                cove_err_set(err, ENOMEM, "ns runtime");
                return NULL;
        }
        pthread_mutex_init(&rt->full_mu, NULL);
        rt->full_state = -1;
        snprintf(rt->full_why, sizeof(rt->full_why), "self-check not run yet");
        cove_criu_detect(&rt->criu);
        uint64_t h = 1469598103934665603ULL; /* FNV-1a of the data dir */
        for (const char *c = data_dir; *c; c++)
                h = (h ^ (uint8_t)*c) * 1099511628211ULL;
        snprintf(rt->check_id, sizeof(rt->check_id), "cove-criu-check-%016llx",
                 (unsigned long long)h);
        if (snprintf(rt->ns_dir, sizeof(rt->ns_dir), "%s/ns", data_dir) >=
            (int)sizeof(rt->ns_dir)) {
                cove_err_set(err, ENAMETOOLONG, "ns runtime: data dir");
                goto fail;
        }
        if (cove_mkdir_p(rt->ns_dir, 0700, err) < 0)
                goto fail;
        cove_criu_setup(&rt->criu, rt->ns_dir);
        lxcfs_init(&rt->lx, rt->ns_dir);
        if (!(rt->cg = cove_cgroups_open(err)))
                goto fail;
        if (cove_seccomp_build(&rt->filter, err) < 0)
                goto fail;
        unsigned pool_n = NS_POOL_DEFAULT;
        const char *env = getenv("COVE_NS_LAYER_POOL");
        if (env && *env) {
                char *end;
                errno = 0;
                unsigned long v = strtoul(env, &end, 10);
                if (errno || *end || env[0] == '-' || v > NS_POOL_MAX) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, EINVAL,
                                      "COVE_NS_LAYER_POOL=%s: want 0 (off) to %d", env,
                                      NS_POOL_MAX);
                        goto fail;
                }
                pool_n = (unsigned)v;
        }
        if (!(rt->layers = cove_layers_open(rt->ns_dir, pool_n, err)))
                goto fail;
        return rt;
fail:
        cove_err_wrap(err, "ns runtime");
        ns_close(rt);
        return NULL;
}

const struct cove_runtime_ops cove_runtime_ns = {
    .name = "ns",
    .open = ns_open,
    .close = ns_close,
    .start = ns_start,
    .freeze = ns_freeze,
    .thaw = ns_thaw,
    .stop = ns_stop,
    .kill = ns_kill,
    .cleanup_stale = ns_cleanup_stale,
    .usage = ns_usage,
    .layer_snapshot = ns_layer_snapshot,
    .layer_dir = ns_layer_dir,
    .layer_open = ns_layer_open,
    .layer_close = ns_layer_close,
    .full_status = ns_full_status,
    .full_selfcheck = ns_full_selfcheck,
    .full_dump = ns_full_dump,
    .host_view = ns_host_view,
};
