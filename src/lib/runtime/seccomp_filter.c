/* seccomp policy of the ns runtime (see seccomp_filter.h). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>

#include "runtime/seccomp_filter.h"
#include "util/cleanup.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

/* Denied outright with EPERM. */
static const char *const denied[] = {
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "acct",
    "quotactl",
    "quotactl_fd",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "setns",
    "syslog",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "vm86",
    "vm86old",
    "uselib",
    "nfsservctl",
    "fanotify_init",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "_sysctl",
    "stime",
};

/* Address families a sandbox may create sockets of; socket() and socketpair() of any other
 * fail with EAFNOSUPPORT, as on a kernel built without them. AF_VSOCK above all: its port
 * space is the host's (a sandbox could squat ports host agents use, or reach the hypervisor
 * of a host that is a VM); AF_PACKET, AF_XDP, AF_KEY, AF_ALG, AF_TIPC, AF_RDS, AF_CAN,
 * Bluetooth and the rest are kernel attack surface no sandboxed program needs. AF_INET6
 * stays: IPv6 is off inside, but programs create such sockets and handle the failure of
 * what follows. */
static const unsigned allowed_af[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};
#define SECCOMP_AF_LIMIT 64 /* families below this are denied one by one, the rest at once */

/* Netlink protocols allowed: route (ip, glibc's getaddrinfo) and sock_diag (ss). The others
 * (netfilter, xfrm, generic netlink, audit, uevents, ...) fail with EPROTONOSUPPORT. */
static const unsigned allowed_netlink[] = {NETLINK_ROUTE, NETLINK_SOCK_DIAG};
#define SECCOMP_NETLINK_LIMIT 32 /* the kernel's MAX_LINKS */

static int in_list(const unsigned *l, size_t n, unsigned v)
{
        for (size_t i = 0; i < n; i++)
                if (l[i] == v)
                        return 1;
        return 0;
}

/* socket(2)/socketpair(2) rules (arguments are ints: the comparisons look at the low 32 bits,
 * or at all 64 for "too large", so high garbage cannot slip a family past them) */
static int add_socket_rules(scmp_filter_ctx ctx, const char **what)
{
        const uint32_t eaf = SCMP_ACT_ERRNO(EAFNOSUPPORT);
        const int calls[] = {SCMP_SYS(socket), SCMP_SYS(socketpair)};
        int rc;
        for (size_t c = 0; c < COVE_ARRAY_SIZE(calls); c++) {
                *what = c ? "socketpair" : "socket";
                for (unsigned af = 0; af < SECCOMP_AF_LIMIT; af++)
                        if (!in_list(allowed_af, COVE_ARRAY_SIZE(allowed_af), af) &&
                            (rc = seccomp_rule_add(ctx, eaf, calls[c], 1,
                                                   SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffUL, af))) <
                                0)
                                return rc;
                if ((rc = seccomp_rule_add(ctx, eaf, calls[c], 1,
                                           SCMP_A0(SCMP_CMP_GE, SECCOMP_AF_LIMIT, 0))) < 0)
                        return rc;
        }
        *what = "socket(AF_NETLINK)";
        const uint32_t eproto = SCMP_ACT_ERRNO(EPROTONOSUPPORT);
        for (unsigned p = 0; p < SECCOMP_NETLINK_LIMIT; p++)
                if (!in_list(allowed_netlink, COVE_ARRAY_SIZE(allowed_netlink), p) &&
                    (rc = seccomp_rule_add(ctx, eproto, SCMP_SYS(socket), 2,
                                           SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffUL, AF_NETLINK),
                                           SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffUL, p))) < 0)
                        return rc;
        return seccomp_rule_add(ctx, eproto, SCMP_SYS(socket), 2,
                                SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffUL, AF_NETLINK),
                                SCMP_A2(SCMP_CMP_GE, SECCOMP_NETLINK_LIMIT, 0));
}

static const unsigned long ns_flags[] = {
    CLONE_NEWNS,  CLONE_NEWUTS, CLONE_NEWIPC,    CLONE_NEWUSER,
    CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP,
};

int cove_seccomp_build(struct sock_fprog *prog, struct cove_err *err)
{
        memset(prog, 0, sizeof(*prog));
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx)
                return cove_err_set(err, ENOMEM, "seccomp: init");
        int rc = 0;
        const char *what = "attr";
        const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
        /* the filter is installed by hand (cove_seccomp_install), with CAP_SYS_ADMIN in the
         * sandbox's user namespace instead of no_new_privs */
        if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0)) < 0 ||
            (rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) < 0)
                goto out;
        for (size_t i = 0; i < COVE_ARRAY_SIZE(denied); i++) {
                int nr = seccomp_syscall_resolve_name(denied[i]);
                if (nr == __NR_SCMP_ERROR || nr < 0)
                        continue; /* not on this architecture */
                what = denied[i];
                if ((rc = seccomp_rule_add(ctx, eperm, nr, 0)) < 0)
                        goto out;
        }
        what = "clone3";
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) < 0)
                goto out;
        /* new namespaces: unshare with any CLONE_NEW*, clone with any (NEWTIME overlaps the
         * exit-signal byte of clone(2), and clone cannot create a time namespace anyway) */
        for (size_t i = 0; i < COVE_ARRAY_SIZE(ns_flags); i++) {
                what = "clone";
                if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1,
                                           SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]))) <
                    0)
                        goto out;
                what = "unshare";
                if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(unshare), 1,
                                           SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]))) <
                    0)
                        goto out;
        }
        if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(unshare), 1,
                                   SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWTIME, CLONE_NEWTIME))) < 0)
                goto out;
        /* device nodes */
        what = "mknod";
        const unsigned long devtypes[] = {S_IFCHR, S_IFBLK};
        for (size_t i = 0; i < 2; i++) {
                if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(mknod), 1,
                                           SCMP_A1(SCMP_CMP_MASKED_EQ, S_IFMT, devtypes[i]))) < 0 ||
                    (rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(mknodat), 1,
                                           SCMP_A2(SCMP_CMP_MASKED_EQ, S_IFMT, devtypes[i]))) < 0)
                        goto out;
        }
        if ((rc = add_socket_rules(ctx, &what)) < 0)
                goto out;
        /* terminal input injection into a terminal the sandbox shares */
        what = "ioctl";
        const unsigned long bad_ioctls[] = {TIOCSTI, TIOCLINUX};
        for (size_t i = 0; i < 2; i++)
                if ((rc = seccomp_rule_add(
                         ctx, eperm, SCMP_SYS(ioctl), 1,
                         SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, bad_ioctls[i]))) < 0)
                        goto out;

        what = "export";
        int mfd = memfd_create("cove-seccomp", MFD_CLOEXEC);
        if (mfd < 0) {
                rc = -errno;
                goto out;
        }
        if ((rc = seccomp_export_bpf(ctx, mfd)) < 0) {
                close(mfd);
                goto out;
        }
        off_t size = lseek(mfd, 0, SEEK_END);
        if (size <= 0 || size % sizeof(struct sock_filter) != 0 ||
            size / sizeof(struct sock_filter) > BPF_MAXINSNS) {
                close(mfd);
                rc = -EINVAL;
                goto out;
        }
        struct sock_filter *f = malloc(size);
        if (!f || pread(mfd, f, size, 0) != size) {
                free(f);
                close(mfd);
                rc = -EIO;
                goto out;
        }
        close(mfd);
        prog->filter = f;
        prog->len = (unsigned short)(size / sizeof(struct sock_filter));
out:
        seccomp_release(ctx);
        if (rc < 0)
                return cove_err_set(err, -rc, "seccomp: build filter (%s)", what);
        return 0;
}

int cove_seccomp_install(const struct sock_fprog *prog)
{
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) < 0)
                return -errno;
        return 0;
}
