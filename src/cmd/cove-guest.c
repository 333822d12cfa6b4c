/* cove-guest: PID 1 inside a sandbox. Usage: cove-guest [--channel-fd N] (default 3).
 * Everything is in src/lib/guest; this only parses arguments and maps the result to an
 * exit code (0: the node closed the channel, 1: failure, 2: usage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guest/guest.h"

static int usage(void)
{
        fprintf(stderr, "usage: cove-guest [--channel-fd N]\n");
        return 2;
}

int main(int argc, char **argv)
{
        int fd = 3;
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--channel-fd") == 0 && i + 1 < argc) {
                        char *end;
                        long v = strtol(argv[++i], &end, 10);
                        if (*end || v < 0 || v > 65535)
                                return usage();
                        fd = (int)v;
                } else {
                        return usage();
                }
        }
        struct cove_log log = {.fd = 2, .level = COVE_LOG_INFO};
        struct cove_guest_opts opts = {.channel_fd = fd, .log = &log};
        struct cove_err err = {0};
        if (cove_guest_run(&opts, &err) < 0) {
                cove_error(&log, "guest.exit", "%s", err.msg);
                return 1;
        }
        return 0;
}
