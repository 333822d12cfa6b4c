/* Default syscall table for util/sysio.h and the write-all helper. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/sysio.h"

static int sys_open(const char *path, int flags, mode_t mode)
{
        return open(path, flags, mode);
}

const struct cove_sysio cove_sysio_default = {
    .open = sys_open,
    .write = write,
    .pwrite = pwrite,
    .fsync = fsync,
    .fdatasync = fdatasync,
    .syncfs = syncfs,
    .rename = rename,
    .mkdir = mkdir,
    .unlink = unlink,
};

int cove_sysio_write_all(const struct cove_sysio *io, int fd, const void *buf, size_t len)
{
        io = cove_sysio_get(io);
        const uint8_t *p = buf;
        while (len > 0) {
                ssize_t w = io->write(fd, p, len);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        return -1;
                }
                if (w == 0) {
                        errno = EIO;
                        return -1;
                }
                p += w;
                len -= (size_t)w;
        }
        return 0;
}
