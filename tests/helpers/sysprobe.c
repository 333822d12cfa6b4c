/* Static probe uploaded into a sandbox by tests/security: tries privileged syscalls that
 * busybox cannot issue and prints one line per attempt, "name=RESULT", where RESULT is
 * OK (the call succeeded: an escape hatch), an errno name (EPERM, ENOSYS, …), or for the
 * probes run in a child KILLED:<sig>. The arguments are chosen so that success would be
 * harmless but visible (a tmpfs mount on /mnt, a key in the process keyring, …).
 *
 *   sysprobe [MARKER_PATH]   MARKER_PATH: a host path the chroot escape looks for
 *   sysprobe --write-fd PID FD HEX   take a copy of fd FD of process PID (pidfd_getfd, as a
 *                                    root that may ptrace it) and write the bytes HEX to it:
 *                                    a vm guest's root forging frames on cove-guest's channel */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void report(const char *name, long rc, int err)
{
        if (rc >= 0)
                printf("%s=OK\n", name);
        else
                printf("%s=%s\n", name, strerrorname_np(err) ? strerrorname_np(err) : "E?");
        fflush(stdout);
}

#define PROBE(name, call)                                                                          \
        do {                                                                                       \
                errno = 0;                                                                         \
                long rc_ = (long)(call);                                                           \
                report(name, rc_, errno);                                                          \
        } while (0)

/* Run fn in a child (for calls that may kill the caller, or succeed in a child context). */
static void in_child(const char *name, long (*fn)(void))
{
        pid_t p = fork();
        if (p == 0) {
                errno = 0;
                long rc = fn();
                _exit(rc >= 0 ? 0 : (errno & 0x7f) + 1);
        }
        int st = 0;
        if (p < 0 || waitpid(p, &st, 0) < 0) {
                printf("%s=EFORK\n", name);
        } else if (WIFSIGNALED(st)) {
                printf("%s=KILLED:%d\n", name, WTERMSIG(st));
        } else if (WEXITSTATUS(st) == 0) {
                printf("%s=OK\n", name);
        } else {
                const char *e = strerrorname_np(WEXITSTATUS(st) - 1);
                printf("%s=%s\n", name, e ? e : "E?");
        }
        fflush(stdout);
}

static long clone_newuser(void)
{
        long r = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
        if (r == 0)
                _exit(0);
        if (r > 0)
                waitpid((pid_t)r, NULL, 0);
        return r;
}

static long clone_newns(void)
{
        long r = syscall(SYS_clone, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0);
        if (r == 0)
                _exit(0);
        if (r > 0)
                waitpid((pid_t)r, NULL, 0);
        return r;
}

static long clone3_newuser(void)
{
        uint64_t args[11] = {0};
        args[0] = CLONE_NEWUSER; /* flags */
        args[4] = SIGCHLD;       /* exit_signal */
        long r = syscall(435 /* clone3 */, args, 88);
        if (r == 0)
                _exit(0);
        if (r > 0)
                waitpid((pid_t)r, NULL, 0);
        return r;
}

#if defined(__x86_64__)
/* x32 ABI: the same syscall numbers with bit 30 set must not bypass the filter */
static long x32_unshare(void)
{
        return syscall(0x40000000 | SYS_unshare, CLONE_NEWUSER);
}

/* i386 ABI through int 0x80 (unshare is 310 there): must be killed, not allowed */
static long i386_unshare(void)
{
        long ret;
        __asm__ volatile("int $0x80" : "=a"(ret) : "a"(310L), "b"((long)CLONE_NEWUSER) : "memory");
        if (ret < 0 && ret > -4096) {
                errno = (int)-ret;
                return -1;
        }
        return ret;
}
#endif

/* Classic chroot escape: chroot into a subdirectory while keeping cwd outside, climb, and
 * chroot to what is reached. Inside a pivot_root'ed mount namespace the climb stops at the
 * sandbox root; succeeding here means the marker (a host path) became visible. */
static const char *marker;
static long chroot_escape(void)
{
        mkdir("/tmp/.chroot-escape", 0700);
        if (chroot("/tmp/.chroot-escape") < 0)
                return -1;
        for (int i = 0; i < 64; i++)
                if (chdir("..") < 0)
                        return -1;
        if (chroot(".") < 0)
                return -1;
        struct stat st;
        if (marker && stat(marker, &st) == 0)
                return 0; /* host file reached */
        errno = ENOENT;
        return -1;
}

/* sysprobe --connect-abstract NAME: connect to the abstract unix socket "\0NAME" */
static int connect_abstract(const char *name)
{
        struct sockaddr_un a;
        memset(&a, 0, sizeof(a));
        a.sun_family = AF_UNIX;
        size_t n = strlen(name);
        if (n + 1 > sizeof(a.sun_path))
                return 2;
        memcpy(a.sun_path + 1, name, n);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        long rc = connect(s, (struct sockaddr *)&a,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n));
        report("connect", rc, errno);
        return 0;
}

static int write_fd(const char *pid, const char *fd, const char *hex)
{
        unsigned char buf[4096];
        size_t n = 0;
        for (; hex[0] && hex[1] && n < sizeof(buf); hex += 2) {
                char h[3] = {hex[0], hex[1], 0};
                buf[n++] = (unsigned char)strtoul(h, NULL, 16);
        }
        int pfd = (int)syscall(SYS_pidfd_open, atoi(pid), 0);
        report("pidfd_open", pfd, errno);
        if (pfd < 0)
                return 1;
        int t = (int)syscall(SYS_pidfd_getfd, pfd, atoi(fd), 0);
        report("pidfd_getfd", t, errno);
        if (t < 0)
                return 1;
        long rc = write(t, buf, n);
        report("write", rc == (long)n ? 0 : -1, rc < 0 ? errno : EIO);
        return rc == (long)n ? 0 : 1;
}

int main(int argc, char **argv)
{
        if (argc > 2 && !strcmp(argv[1], "--connect-abstract"))
                return connect_abstract(argv[2]);
        if (argc > 4 && !strcmp(argv[1], "--write-fd"))
                return write_fd(argv[2], argv[3], argv[4]);
        marker = argc > 1 ? argv[1] : NULL;
        /* who the probes run as (a setuid copy: the effective uid it gained) */
        printf("ids=%d,%d\n", (int)getuid(), (int)geteuid());
        char buf[256];
        uint8_t attr[128] = {0};
        uint32_t uring[30] = {0};
        struct perf_event_attr pe;
        memset(&pe, 0, sizeof(pe));
        pe.type = PERF_TYPE_SOFTWARE;
        pe.size = sizeof(pe);
        pe.config = PERF_COUNT_SW_CPU_CLOCK;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        struct timeval tv = {now.tv_sec, 0};

        PROBE("bpf", syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, attr, sizeof(attr)));
        PROBE("keyctl", syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -2 /* process */, 1));
        PROBE("add_key", syscall(SYS_add_key, "user", "cove-probe", "x", 1, -2));
        PROBE("request_key", syscall(SYS_request_key, "user", "cove-probe", NULL, 0));
        PROBE("io_uring_setup", syscall(SYS_io_uring_setup, 1, uring));
        PROBE("userfaultfd", syscall(SYS_userfaultfd, 0));
        PROBE("perf_event_open", syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0));
        PROBE("init_module", syscall(SYS_init_module, "", 0, ""));
        PROBE("finit_module", syscall(SYS_finit_module, 0, "", 0));
        PROBE("delete_module", syscall(SYS_delete_module, "loop", 0));
        PROBE("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
        PROBE("kexec_file_load", syscall(SYS_kexec_file_load, -1, -1, 0, "", 0));
        PROBE("reboot", syscall(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2,
                                LINUX_REBOOT_CMD_CAD_OFF, NULL));
        PROBE("clock_settime", clock_settime(CLOCK_REALTIME, &now));
        PROBE("settimeofday", settimeofday(&tv, NULL));
        PROBE("swapon", syscall(SYS_swapon, "/tmp/.probe-swap", 0));
        PROBE("syslog", syscall(SYS_syslog, 3 /* READ_ALL */, buf, (int)sizeof(buf)));
        PROBE("acct", syscall(SYS_acct, NULL));
        PROBE("unshare_user", unshare(CLONE_NEWUSER));
        PROBE("unshare_mnt", unshare(CLONE_NEWNS));
        PROBE("unshare_net", unshare(CLONE_NEWNET));
        PROBE("unshare_pid", unshare(CLONE_NEWPID));
        PROBE("unshare_cgroup", unshare(CLONE_NEWCGROUP));
        in_child("clone_newuser", clone_newuser);
        in_child("clone_newns", clone_newns);
        in_child("clone3_newuser", clone3_newuser);
        int nsfd = open("/proc/1/ns/mnt", O_RDONLY | O_CLOEXEC);
        PROBE("setns", setns(nsfd, 0));
        if (nsfd >= 0)
                close(nsfd);
        mkdir("/tmp/.probe-mnt", 0755);
        PROBE("mount_tmpfs", mount("none", "/tmp/.probe-mnt", "tmpfs", 0, NULL));
        PROBE("mount_proc", mount("proc", "/tmp/.probe-mnt", "proc", 0, NULL));
        PROBE("mount_bind", mount("/", "/tmp/.probe-mnt", NULL, MS_BIND | MS_REC, NULL));
        PROBE("mount_remount_proc_sys_rw",
              mount(NULL, "/proc/sys", NULL, MS_REMOUNT | MS_BIND, NULL));
        PROBE("umount_proc_sys", umount2("/proc/sys", MNT_DETACH));
        PROBE("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
        PROBE("open_tree", syscall(SYS_open_tree, AT_FDCWD, "/", 1 /* OPEN_TREE_CLONE */));
        PROBE("pivot_root", syscall(SYS_pivot_root, "/tmp", "/tmp/.probe-mnt"));
        unlink("/tmp/.probe-blk");
        PROBE("mknod_block", mknod("/tmp/.probe-blk", S_IFBLK | 0600, makedev(8, 0)));
        unlink("/tmp/.probe-chr");
        PROBE("mknod_char", mknod("/tmp/.probe-chr", S_IFCHR | 0600, makedev(1, 1)));
        PROBE("mknodat_char", mknodat(AT_FDCWD, "/tmp/.probe-chr2", S_IFCHR | 0600, makedev(1, 3)));
        struct {
                unsigned int bytes;
                int type;
                unsigned char h[128];
        } fh = {8, 1, {2, 0, 0, 0, 0, 0, 0, 0}}; /* ext4 root inode 2 */
        PROBE("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, &fh, O_RDONLY));
        int mid;
        PROBE("name_to_handle_at", syscall(SYS_name_to_handle_at, AT_FDCWD, "/", &fh, &mid, 0));
#if defined(__x86_64__)
        PROBE("iopl", syscall(SYS_iopl, 3));
        PROBE("ioperm", syscall(SYS_ioperm, 0x80, 1, 1));
        in_child("x32_unshare", x32_unshare);
        in_child("i386_unshare", i386_unshare);
#endif
        in_child("chroot_escape", chroot_escape);
        /* informational: pid 1 is the sandbox's own (untrusted) guest */
        long pr = ptrace(PTRACE_SEIZE, 1, NULL, NULL); /* SEIZE does not stop the tracee */
        report("ptrace_pid1", pr, errno);
        if (pr == 0)
                ptrace(PTRACE_DETACH, 1, NULL, NULL);
        return 0;
}
