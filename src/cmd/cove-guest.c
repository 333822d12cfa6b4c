/* cove-guest: PID 1 inside a sandbox. Usage: cove-guest [--channel-fd N] (default 3).
 * Inside a sandbox, programs may also run
 *   cove-guest request-credential NAME [--reason TEXT] [--ttl SECONDS]
 * to ask the operator for a credential lease (docs/egress.md); it prints the node's answer
 * (JSON) and exits 0 when the request was recorded.
 * As /init of a vm sandbox's initramfs (PID 1, named init, no arguments) it first brings the
 * VM up (vminit.c) and talks over the virtio-serial port (or, with cove.chan=vsock:PORT on
 * the kernel command line, over the vsock connection it accepts on PORT); when the node
 * closes the channel the VM powers off (over vsock it waits for the next connection).
 * Everything is in src/lib/guest; this only parses arguments and maps the result to an
 * exit code (0: the node closed the channel, 1: failure, 2: usage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "guest/guest.h"

static int usage(void)
{
        fprintf(stderr, "usage: cove-guest [--channel-fd N]\n"
                        "       cove-guest request-credential NAME [--reason TEXT] "
                        "[--ttl SECONDS]\n");
        return 2;
}

static int request_credential(int argc, char **argv)
{
        if (argc < 3 || argv[2][0] == '-')
                return usage();
        json_t *q = json_pack("{s:s, s:s}", "op", "request-credential", "secret", argv[2]);
        for (int i = 3; i < argc; i++) {
                if (!strcmp(argv[i], "--reason") && i + 1 < argc) {
                        json_object_set_new(q, "reason", json_string(argv[++i]));
                } else if (!strcmp(argv[i], "--ttl") && i + 1 < argc) {
                        char *end;
                        long v = strtol(argv[++i], &end, 10);
                        if (*end || v <= 0) {
                                json_decref(q);
                                return usage();
                        }
                        json_object_set_new(q, "ttl_s", json_integer(v));
                } else {
                        json_decref(q);
                        return usage();
                }
        }
        char *line = json_dumps(q, JSON_COMPACT);
        json_decref(q);
        if (!line || strlen(line) > COVE_ASK_MAX) {
                fprintf(stderr, "cove-guest: request too long (at most %d bytes)\n", COVE_ASK_MAX);
                free(line);
                return 1;
        }
        char out[8192];
        int r = cove_guest_ask(line, out, sizeof(out), 35000);
        free(line);
        if (r < 0) {
                fprintf(stderr, "cove-guest: %s\n", out);
                return 1;
        }
        printf("%s\n", out);
        json_error_t je;
        json_t *a = json_loads(out, 0, &je);
        int ok = json_is_true(json_object_get(a, "ok"));
        if (!ok)
                fprintf(stderr, "cove-guest: %s\n",
                        json_string_value(json_object_get(a, "message"))
                            ? json_string_value(json_object_get(a, "message"))
                            : "refused");
        json_decref(a);
        return ok ? 0 : 1;
}

static int vm_main(void)
{
        struct cove_log log = {.fd = 2, .level = COVE_LOG_INFO};
        struct cove_err err = {0};
        int fd = -1, lfd = -1;
        if (cove_guest_vm_init(&fd, &lfd, &err) < 0) {
                cove_error(&log, "guest.init", "%s", err.msg);
                cove_guest_vm_poweroff();
        }
        /* the template snapshot is taken while the guest waits here (vm_qemu.c) */
        static const char mark[] = "cove-guest: waiting for the node\n";
        ssize_t w = write(2, mark, sizeof(mark) - 1);
        (void)w;
        if (cove_guest_vm_wait_node(&fd, lfd) < 0)
                cove_guest_vm_poweroff();
        struct cove_guest_opts opts = {.channel_fd = fd, .log = &log, .vm = 1, .listen_fd = lfd};
        if (cove_guest_run(&opts, &err) < 0)
                cove_error(&log, "guest.exit", "%s", err.msg);
        cove_guest_vm_poweroff();
}

int main(int argc, char **argv)
{
        if (argc >= 2 && !strcmp(argv[1], "request-credential"))
                return request_credential(argc, argv);
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
