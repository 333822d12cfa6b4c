/* Static stand-in for cove-guest in the ns runtime tests: runs as PID 1 of a sandbox, reads
 * one command per line from the channel (fd 3) and answers one line, so test_ns can check
 * the isolation from inside. Answers are numbers (errno values, ids) or short strings. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

static int try_write(const char *path)
{
        int fd = open(path, O_WRONLY);
        if (fd < 0)
                return errno;
        int e = write(fd, "1\n", 2) < 0 ? errno : 0;
        close(fd);
        return e;
}

static int rc_errno(long rc)
{
        return rc < 0 ? errno : 0;
}

static int fill(long mb, const char *path)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
                return errno;
        static char buf[1 << 20];
        memset(buf, 'x', sizeof(buf));
        int e = 0;
        /* a write that ends at the disk limit is short; the next one says why (ENOSPC) */
        for (long i = 0; i < mb && !e; i++) {
                size_t off = 0;
                while (off < sizeof(buf) && !e) {
                        ssize_t w = write(fd, buf + off, sizeof(buf) - off);
                        if (w < 0)
                                e = errno;
                        else if (w == 0)
                                e = EIO;
                        else
                                off += (size_t)w;
                }
        }
        if (!e && fsync(fd) < 0)
                e = errno;
        close(fd);
        return e;
}

/* Children stay killable by the OOM killer while init is shielded, as cove-guest does. */
static void unshield(void)
{
        int fd = open("/proc/self/oom_score_adj", O_WRONLY);
        if (fd >= 0) {
                if (write(fd, "0\n", 2) < 0)
                        _exit(126);
                close(fd);
        }
}

/* errno of writing value v to /proc/self/oom_score_adj (0 on success), as exit status */
static void set_oom(long v)
{
        char buf[32];
        int n = snprintf(buf, sizeof(buf), "%ld\n", v);
        int fd = open("/proc/self/oom_score_adj", O_WRONLY);
        if (fd < 0)
                _exit(errno);
        _exit(write(fd, buf, (size_t)n) == n ? 0 : errno);
}

/* Status of a child that runs fn: "exit N" or "sig N". */
static void in_child(char *out, size_t cap, void (*fn)(long), long arg)
{
        pid_t p = fork();
        if (p == 0) {
                unshield();
                fn(arg);
                _exit(0);
        }
        int st = 0;
        waitpid(p, &st, 0);
        if (WIFSIGNALED(st))
                snprintf(out, cap, "sig %d", WTERMSIG(st));
        else
                snprintf(out, cap, "exit %d", WEXITSTATUS(st));
}

static void hog(long mb)
{
        for (long i = 0; i < mb; i++) {
                char *p =
                    mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p == MAP_FAILED)
                        _exit(2);
                memset(p, 1, 1 << 20);
        }
}

static void int80(long unused)
{
        (void)unused;
        long ret;
        __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory"); /* i386 getpid */
        _exit(ret > 0 ? 0 : 3);
}

static void forkbomb(long n)
{
        int fails = 0;
        for (long i = 0; i < n; i++) {
                pid_t p = fork();
                if (p == 0) {
                        pause();
                        _exit(0);
                }
                if (p < 0)
                        fails++;
        }
        _exit(fails ? 0 : 1); /* children are killed with the sandbox */
}

int main(void)
{
        FILE *in = fdopen(3, "r");
        if (!in)
                return 1;
        signal(SIGCHLD, SIG_DFL);
        char line[512];
        while (fgets(line, sizeof(line), in)) {
                line[strcspn(line, "\n")] = 0;
                char out[1024] = "?";
                char *arg = strchr(line, ' ');
                if (arg)
                        *arg++ = 0;
                if (!strcmp(line, "uid")) {
                        snprintf(out, sizeof(out), "%d %d", (int)getuid(), (int)getgid());
                } else if (!strcmp(line, "pid")) {
                        snprintf(out, sizeof(out), "%d", (int)getpid());
                } else if (!strcmp(line, "host")) {
                        gethostname(out, sizeof(out) - 1);
                } else if (!strcmp(line, "ifs")) {
                        struct if_nameindex *ni = if_nameindex();
                        out[0] = 0;
                        for (struct if_nameindex *i = ni; i && i->if_index; i++) {
                                strncat(out, i->if_name, sizeof(out) - strlen(out) - 2);
                                strcat(out, ",");
                        }
                        if (ni)
                                if_freenameindex(ni);
                } else if (!strcmp(line, "procs")) {
                        DIR *d = opendir("/proc");
                        int n = 0;
                        struct dirent *e;
                        while (d && (e = readdir(d)))
                                if (e->d_name[0] >= '0' && e->d_name[0] <= '9')
                                        n++;
                        if (d)
                                closedir(d);
                        snprintf(out, sizeof(out), "%d", n);
                } else if (!strcmp(line, "fds")) {
                        DIR *d = opendir("/proc/self/fd");
                        int n = 0;
                        struct dirent *e;
                        while (d && (e = readdir(d)))
                                if (e->d_name[0] != '.')
                                        n++;
                        if (d)
                                closedir(d);
                        snprintf(out, sizeof(out), "%d", n - 1); /* minus the DIR's own fd */
                } else if (!strcmp(line, "wr") && arg) {
                        snprintf(out, sizeof(out), "%d", try_write(arg));
                } else if (!strcmp(line, "create") && arg) {
                        int fd = open(arg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                        snprintf(out, sizeof(out), "%d", fd < 0 ? errno : 0);
                        if (fd >= 0)
                                close(fd);
                } else if (!strcmp(line, "mount")) {
                        snprintf(out, sizeof(out), "%d",
                                 rc_errno(mount("none", "/tmp", "tmpfs", 0, NULL)));
                } else if (!strcmp(line, "keyctl")) {
                        snprintf(out, sizeof(out), "%d",
                                 rc_errno(syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -3, 0)));
                } else if (!strcmp(line, "bpf")) {
                        char attr[128] = {0};
                        snprintf(out, sizeof(out), "%d",
                                 rc_errno(syscall(SYS_bpf, 0 /* MAP_CREATE */, attr, 64)));
                } else if (!strcmp(line, "unshare")) {
                        snprintf(out, sizeof(out), "%d", rc_errno(unshare(CLONE_NEWUSER)));
                } else if (!strcmp(line, "io_uring")) {
                        char params[120] = {0};
                        snprintf(out, sizeof(out), "%d",
                                 rc_errno(syscall(SYS_io_uring_setup, 4, params)));
                } else if (!strcmp(line, "userfaultfd")) {
                        snprintf(out, sizeof(out), "%d", rc_errno(syscall(SYS_userfaultfd, 0)));
                } else if (!strcmp(line, "clone3")) {
                        char args[88] = {0};
                        snprintf(out, sizeof(out), "%d",
                                 rc_errno(syscall(SYS_clone3, args, sizeof(args))));
                } else if (!strcmp(line, "mknod")) {
                        snprintf(out, sizeof(out), "%d",
                                 rc_errno(mknod("/tmp/mem", S_IFCHR | 0600, makedev(1, 1))));
                } else if (!strcmp(line, "fill") && arg) {
                        char *path = strchr(arg, ' ');
                        if (path)
                                *path++ = 0;
                        snprintf(out, sizeof(out), "%d", fill(atol(arg), path ? path : "/fill"));
                } else if (!strcmp(line, "rm") && arg) {
                        snprintf(out, sizeof(out), "%d", rc_errno(unlink(arg)));
                } else if (!strcmp(line, "mem") && arg) {
                        in_child(out, sizeof(out), hog, atol(arg));
                } else if (!strcmp(line, "oom") && arg) {
                        in_child(out, sizeof(out), set_oom, atol(arg));
                } else if (!strcmp(line, "int80")) {
                        in_child(out, sizeof(out), int80, 0);
                } else if (!strcmp(line, "forkbomb") && arg) {
                        in_child(out, sizeof(out), forkbomb, atol(arg));
                } else if (!strcmp(line, "spawn")) {
                        pid_t p = fork(); /* a process that lives until the sandbox dies */
                        if (p == 0) {
                                unshield();
                                setsid();
                                for (;;)
                                        pause();
                        }
                        snprintf(out, sizeof(out), "%d", (int)p);
                } else if (!strcmp(line, "stat") && arg) {
                        struct stat st;
                        if (lstat(arg, &st) < 0)
                                snprintf(out, sizeof(out), "E%d", errno);
                        else
                                snprintf(out, sizeof(out), "%u %u %o %lld", (unsigned)st.st_uid,
                                         (unsigned)st.st_gid, (unsigned)st.st_mode,
                                         (long long)st.st_size);
                } else if (!strcmp(line, "getx") && arg) { /* getx PATH NAME */
                        char *name = strchr(arg, ' ');
                        if (name)
                                *name++ = 0;
                        ssize_t n = name ? getxattr(arg, name, out, sizeof(out) - 2) : -1;
                        if (n < 0)
                                snprintf(out, sizeof(out), "E%d", errno);
                        else
                                out[n] = 0;
                } else if (!strcmp(line, "setx") && arg) { /* setx PATH NAME VALUE */
                        char *name = strchr(arg, ' '), *val = NULL;
                        if (name) {
                                *name++ = 0;
                                if ((val = strchr(name, ' ')))
                                        *val++ = 0;
                        }
                        snprintf(out, sizeof(out), "%d",
                                 val ? rc_errno(setxattr(arg, name, val, strlen(val), 0)) : EINVAL);
                } else if (!strcmp(line, "sh") && arg) { /* sh CMD: exit status of sh -c */
                        pid_t p = fork();
                        if (p == 0) {
                                unshield();
                                execl("/bin/sh", "sh", "-c", arg, (char *)NULL);
                                _exit(127);
                        }
                        int st = 0;
                        waitpid(p, &st, 0);
                        snprintf(out, sizeof(out), "exit %d",
                                 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
                } else if (!strcmp(line, "tick")) {
                        strcpy(out, "tock");
                }
                strcat(out, "\n");
                if (write(3, out, strlen(out)) < 0)
                        return 1;
        }
        return 0;
}
