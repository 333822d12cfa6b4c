/* A memory bomb that stays small: it writes into a memfd (unmapped, so its pages count in no
 * process's size) until the write fails or the OOM killer ends it. The OOM killer picks by
 * size, so against it a bigger process (the sandbox's PID 1) used to be the one killed.
 * Static, so it runs in any template. Exit: 0 never (it writes up to 64 GiB), 1 on a failed
 * write (ENOMEM/ENOSPC), 2 when no memfd. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void)
{
        static char buf[16384];
        memset(buf, 'x', sizeof(buf));
        int fd = memfd_create("bomb", MFD_CLOEXEC);
        if (fd < 0)
                return 2;
        for (long i = 0; i < (64L << 30) / (long)sizeof(buf); i++)
                if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
                        perror("write");
                        return 1;
                }
        return 0;
}
