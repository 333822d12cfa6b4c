/* libFuzzer target: bytes a hostile guest sends on its channel. Exercises the frame
 * decoder, the handshake parser and the node's frame dispatch (chan.c) end to end. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "node/chan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (size > 60000)
                return 0;
        signal(SIGPIPE, SIG_IGN); /* as coved does: a dead guest is an error, not a signal */
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return 0;
        struct cove_log log = {.fd = -1, .level = COVE_LOG_ERROR + 1};
        struct cove_err err;
        struct cove_chan *c = cove_chan_new(sv[0], "sbx_fuzz", &log, &err);
        if (!c) {
                close(sv[1]);
                return 0;
        }
        /* the guest's bytes, then EOF */
        size_t off = 0;
        while (off < size) {
                ssize_t w = write(sv[1], data + off, size - off);
                if (w <= 0)
                        break;
                off += (size_t)w;
        }
        close(sv[1]);
        if (cove_chan_hello(c, "token", "sbx_fuzz", 50, &err) == 0) {
                for (int i = 0; i < 10000 && cove_chan_on_readable(c) == 0; i++)
                        ;
        }
        cove_chan_unref(c);
        return 0;
}
