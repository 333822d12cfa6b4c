/* The syscalls that make stored data durable, behind a table (SQLite's aSyscall idea), so
 * tests can fail the Nth write, fsync or rename with ENOSPC/EIO and check that nothing is
 * lost. Library code that writes durable state takes a `const struct cove_sysio *` in its
 * context (never a global); NULL means cove_sysio_default. */
#ifndef COVE_UTIL_SYSIO_H
#define COVE_UTIL_SYSIO_H

#include <stddef.h>
#include <sys/types.h>

/* Each member has the libc signature and contract: -1 with errno set on failure. */
struct cove_sysio {
        int (*open)(const char *path, int flags, mode_t mode);
        ssize_t (*write)(int fd, const void *buf, size_t len);
        ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
        int (*fsync)(int fd);
        int (*fdatasync)(int fd);
        int (*syncfs)(int fd); /* the whole filesystem of fd: data, metadata, journal */
        int (*rename)(const char *from, const char *to);
        int (*mkdir)(const char *path, mode_t mode);
        int (*unlink)(const char *path);
};

extern const struct cove_sysio cove_sysio_default; /* the real syscalls */

/* io or the default table when io is NULL. */
static inline const struct cove_sysio *cove_sysio_get(const struct cove_sysio *io)
{
        return io ? io : &cove_sysio_default;
}

/* write() all of buf through io, retrying short writes and EINTR; -1 with errno on failure
 * (a zero-length write from the kernel is reported as EIO). */
int cove_sysio_write_all(const struct cove_sysio *io, int fd, const void *buf, size_t len);

#endif
