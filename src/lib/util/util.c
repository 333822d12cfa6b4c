/* Randomness, ids, clocks, hex and crash-safe file helpers. */
#include "util/util.h"
#include "util/cleanup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int cove_random(void *buf, size_t len, struct cove_err *err)
{
        uint8_t *p = buf;
        while (len > 0) {
                ssize_t n = getrandom(p, len, 0);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return cove_err_set(err, errno, "getrandom");
                }
                p += n;
                len -= (size_t)n;
        }
        return 0;
}

int cove_id_new(const char *prefix, char *out, size_t cap, struct cove_err *err)
{
        static const char b32[] = "abcdefghijklmnopqrstuvwxyz234567";
        uint8_t r[20];
        size_t pl = strlen(prefix);
        if (cap < pl + 21)
                return cove_err_set(err, ENAMETOOLONG, "id buffer too small");
        if (cove_random(r, sizeof(r), err) < 0)
                return -1;
        memcpy(out, prefix, pl);
        for (int i = 0; i < 20; i++)
                out[pl + (size_t)i] = b32[r[i] & 31];
        out[pl + 20] = '\0';
        return 0;
}

void cove_hex(const void *buf, size_t len, char *out)
{
        static const char hx[] = "0123456789abcdef";
        const uint8_t *p = buf;
        for (size_t i = 0; i < len; i++) {
                out[2 * i] = hx[p[i] >> 4];
                out[2 * i + 1] = hx[p[i] & 15];
        }
        out[2 * len] = '\0';
}

int64_t cove_now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t cove_mono_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void cove_rfc3339(int64_t unix_ms, char *out, size_t cap)
{
        time_t s = (time_t)(unix_ms / 1000);
        struct tm tm;
        gmtime_r(&s, &tm);
        snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(unix_ms % 1000));
}

int64_t cove_rfc3339_parse(const char *s)
{
        struct tm tm = {0};
        int n = 0;
        if (!s ||
            sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6 ||
            n != 19 || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 ||
            tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
                return -1;
        const char *p = s + n;
        int64_t ms = 0;
        if (*p == '.') {
                int digits = 0;
                for (p++; *p >= '0' && *p <= '9'; p++, digits++)
                        if (digits < 3)
                                ms = ms * 10 + (*p - '0');
                if (!digits)
                        return -1;
                for (; digits < 3; digits++)
                        ms *= 10;
        }
        int64_t off = 0;
        if (*p == 'Z' || *p == 'z') {
                p++;
        } else if (*p == '+' || *p == '-') {
                int oh, om, k = 0;
                if (sscanf(p + 1, "%2d:%2d%n", &oh, &om, &k) != 2 || k != 5 || oh > 23 || om > 59)
                        return -1;
                off = (int64_t)(oh * 60 + om) * 60000 * (*p == '+' ? 1 : -1);
                p += 6;
        } else {
                return -1;
        }
        if (*p)
                return -1;
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        time_t t = timegm(&tm);
        if (t == (time_t)-1)
                return -1;
        return (int64_t)t * 1000 + ms - off;
}

int cove_write_file_atomic(const char *dir, const char *name, const void *data, size_t len,
                           mode_t mode, struct cove_err *err)
{
        char tmp[4096], dst[4096];
        uint8_t r[4];
        char rh[9];
        if (cove_random(r, sizeof(r), err) < 0)
                return -1;
        cove_hex(r, sizeof(r), rh);
        if ((size_t)snprintf(tmp, sizeof(tmp), "%s/.%s.tmp.%s", dir, name, rh) >= sizeof(tmp) ||
            (size_t)snprintf(dst, sizeof(dst), "%s/%s", dir, name) >= sizeof(dst))
                return cove_err_set(err, ENAMETOOLONG, "write %s/%s", dir, name);
        cleanup_close int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd < 0)
                return cove_err_set(err, errno, "create %s", tmp);
        const uint8_t *p = data;
        size_t left = len;
        while (left > 0) {
                ssize_t w = write(fd, p, left);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        int e = errno;
                        unlink(tmp);
                        return cove_err_set(err, e, "write %s", tmp);
                }
                p += w;
                left -= (size_t)w;
        }
        if (fchmod(fd, mode) < 0 || fsync(fd) < 0) {
                int e = errno;
                unlink(tmp);
                return cove_err_set(err, e, "fsync %s", tmp);
        }
        if (rename(tmp, dst) < 0) {
                int e = errno;
                unlink(tmp);
                return cove_err_set(err, e, "rename %s", dst);
        }
        cleanup_close int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0)
                return cove_err_set(err, errno, "fsync directory %s", dir);
        return 0;
}

int cove_read_file(const char *path, size_t max, char **out, size_t *len, struct cove_err *err)
{
        cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return cove_err_set(err, errno, "open %s", path);
        size_t cap = 4096, n = 0;
        cleanup_free char *buf = malloc(cap + 1);
        if (!buf)
                return cove_err_set(err, ENOMEM, "read %s", path);
        for (;;) {
                if (n == cap) {
                        if (cap >= max)
                                return cove_err_setk(err, COVE_E_LIMIT, EFBIG, "read %s", path);
                        cap = cap * 2 > max ? max : cap * 2;
                        char *nb = realloc(buf, cap + 1);
                        if (!nb)
                                return cove_err_set(err, ENOMEM, "read %s", path);
                        buf = nb;
                }
                ssize_t r = read(fd, buf + n, cap - n);
                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return cove_err_set(err, errno, "read %s", path);
                }
                if (r == 0)
                        break;
                n += (size_t)r;
        }
        buf[n] = '\0';
        *out = buf;
        buf = NULL;
        if (len)
                *len = n;
        return 0;
}

int cove_mkdir_p(const char *path, mode_t mode, struct cove_err *err)
{
        char tmp[4096];
        if (strlen(path) >= sizeof(tmp))
                return cove_err_set(err, ENAMETOOLONG, "mkdir %s", path);
        strcpy(tmp, path);
        for (char *p = tmp + 1; *p; p++) {
                if (*p != '/')
                        continue;
                *p = '\0';
                if (mkdir(tmp, mode) < 0 && errno != EEXIST)
                        return cove_err_set(err, errno, "mkdir %s", tmp);
                *p = '/';
        }
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
                return cove_err_set(err, errno, "mkdir %s", tmp);
        return 0;
}

/* Remove everything below dirfd, never following symlinks and never descending into
 * another mount (STATX_ATTR_MOUNT_ROOT; comparing st_dev is wrong on overlayfs, where
 * files report their layer's device). depth bounds the recursion. */
static int rm_children(int dirfd, int depth)
{
        if (depth > 256)
                return -ELOOP;
        DIR *d = fdopendir(dirfd);
        if (!d) {
                close(dirfd);
                return -errno;
        }
        int rc = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                const char *n = de->d_name;
                if (!strcmp(n, ".") || !strcmp(n, ".."))
                        continue;
                struct statx stx;
                if (statx(dirfd, n, AT_SYMLINK_NOFOLLOW, STATX_TYPE, &stx) < 0) {
                        if (errno != ENOENT && !rc)
                                rc = -errno;
                        continue;
                }
                if (S_ISDIR(stx.stx_mode)) {
                        if (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) {
                                if (!rc)
                                        rc = -EBUSY;
                                continue;
                        }
                        int sub = openat(dirfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub < 0) {
                                if (!rc)
                                        rc = -errno;
                                continue;
                        }
                        int r = rm_children(sub, depth + 1);
                        if (r < 0 && !rc)
                                rc = r;
                        if (unlinkat(dirfd, n, AT_REMOVEDIR) < 0 && errno != ENOENT && !rc)
                                rc = -errno;
                } else if (unlinkat(dirfd, n, 0) < 0 && errno != ENOENT && !rc) {
                        rc = -errno;
                }
        }
        closedir(d);
        return rc;
}

int cove_rm_rf(const char *path, struct cove_err *err)
{
        struct stat st;
        if (lstat(path, &st) < 0)
                return errno == ENOENT ? 0 : cove_err_set(err, errno, "remove %s", path);
        if (!S_ISDIR(st.st_mode)) {
                if (unlink(path) < 0 && errno != ENOENT)
                        return cove_err_set(err, errno, "remove %s", path);
                return 0;
        }
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return cove_err_set(err, errno, "remove %s", path);
        int r = rm_children(fd, 0);
        if (r < 0)
                return cove_err_set(err, -r, "remove %s", path);
        if (rmdir(path) < 0 && errno != ENOENT)
                return cove_err_set(err, errno, "remove %s", path);
        return 0;
}

ssize_t cove_send_with_fd(int sock, const void *buf, size_t len, int fd)
{
        struct iovec iov = {(void *)buf, len};
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (fd >= 0) {
                memset(&u, 0, sizeof(u));
                msg.msg_control = u.buf;
                msg.msg_controllen = sizeof(u.buf);
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        ssize_t n;
        do
                n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        return n;
}

int cove_send_fd(int sock, int fd, char byte)
{
        return cove_send_with_fd(sock, &byte, 1, fd) == 1 ? 0 : -1;
}

int cove_recv_fd(int sock)
{
        char byte;
        struct iovec iov = {&byte, 1};
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = u.buf,
                             .msg_controllen = sizeof(u.buf)};
        ssize_t n;
        do
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
                return -1;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                return -1;
        int fd;
        memcpy(&fd, CMSG_DATA(c), sizeof(fd));
        return fd;
}
