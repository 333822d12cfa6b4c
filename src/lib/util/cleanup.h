/* Scoped cleanup helpers (gnu11 __attribute__((cleanup))), after crun's utils.h.
 * Hand ownership out explicitly: `int fd = f; f = -1; return fd;`. */
#ifndef COVE_UTIL_CLEANUP_H
#define COVE_UTIL_CLEANUP_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <dirent.h>

static inline void cove__freep(void *p)
{
        free(*(void **)p);
}
static inline void cove__closep(int *fd)
{
        if (*fd >= 0) {
                int saved = errno;
                close(*fd);
                errno = saved;
        }
}
static inline void cove__fclosep(FILE **f)
{
        if (*f)
                fclose(*f);
}
static inline void cove__closedirp(DIR **d)
{
        if (*d)
                closedir(*d);
}

#define cleanup_free __attribute__((cleanup(cove__freep)))
#define cleanup_close __attribute__((cleanup(cove__closep)))
#define cleanup_fclose __attribute__((cleanup(cove__fclosep)))
#define cleanup_dir __attribute__((cleanup(cove__closedirp)))

#define COVE_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#endif
