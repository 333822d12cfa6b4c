/* cove-guest: PID 1 inside a sandbox. Usage: cove-guest [--channel-fd N] (default 3).
 * As /init of a vm sandbox's initramfs (PID 1, named init, no arguments) it first brings the
 * VM up (vminit.c) and talks over the virtio-serial port; when the node closes the channel
 * the VM powers off.
 * Everything is in src/lib/guest; this only parses arguments and maps the result to an
 * exit code (0: the node closed the channel, 1: failure, 2: usage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guest/guest.h"

static int usage(void)
{
        fprintf(stderr, "usage: cove-guest [--channel-fd N]\n");
        return 2;
}

static int vm_main(void)
{
        struct cove_log log = {.fd = 2, .level = COVE_LOG_INFO};
        struct cove_err err = {0};
        int fd = -1;
        if (cove_guest_vm_init(&fd, &err) < 0) {
                cove_error(&log, "guest.init", "%s", err.msg);
                cove_guest_vm_poweroff();
        }
        /* the template snapshot is taken while the guest waits here (vm_qemu.c) */
        static const char mark[] = "cove-guest: waiting for the node\n";
        ssize_t w = write(2, mark, sizeof(mark) - 1);
        (void)w;
        if (cove_guest_vm_wait_node(fd) < 0)
                cove_guest_vm_poweroff();
        struct cove_guest_opts opts = {.channel_fd = fd, .log = &log, .vm = 1};
        if (cove_guest_run(&opts, &err) < 0)
                cove_error(&log, "guest.exit", "%s", err.msg);
        cove_guest_vm_poweroff();
}

int main(int argc, char **argv)
{
        const char *base = strrchr(argv[0], '/');
        base = base ? base + 1 : argv[0];
        if (argc == 1 && getpid() == 1 && strcmp(base, "init") == 0)
                return vm_main();
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
