/* Requests a sandbox's own programs send to the node through cove-guest (docs/
 * guest-protocol.md, "Asks"): `cove-guest request-credential NAME --reason …` connects to
 * the abstract unix socket COVE_ASK_SOCKET (per network namespace: only this sandbox can
 * reach it), writes one JSON line (at most COVE_ASK_MAX bytes, read with a short timeout),
 * and gets one JSON line back: the node's ANSWER to the ASK frame the guest sent for it.
 * At most G_MAX_ASKS are outstanding; each waits at most G_ASK_WAIT_MS. */
#include "guest/guest.h"
#include "guest/internal.h"

#include <stdio.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static socklen_t ask_addr(struct sockaddr_un *a)
{
        memset(a, 0, sizeof(*a));
        a->sun_family = AF_UNIX;
        size_t n = strlen(COVE_ASK_SOCKET);
        memcpy(a->sun_path + 1, COVE_ASK_SOCKET, n); /* abstract: sun_path[0] = 0 */
        return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int g_ask_open(struct cove_guest *g)
{
        g->askfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        struct sockaddr_un a;
        socklen_t al = ask_addr(&a);
        if (g->askfd < 0 || bind(g->askfd, (struct sockaddr *)&a, al) < 0 ||
            listen(g->askfd, 8) < 0) {
                if (g->askfd >= 0)
                        close(g->askfd);
                g->askfd = -1;
                return -1; /* not fatal: the sandbox just cannot ask */
        }
        g->s_ask = (struct gsrc){GS_ASK, g};
        /* `cove-guest request-credential` on PATH (through /proc/1/exe: the binary itself is
         * not in the sandbox's tree; root inside may run it); best effort */
        if (g->pid1)
                if (symlink("/proc/1/exe", "/usr/local/bin/cove-guest") < 0 && errno != EEXIST)
                        errno = 0;
        return g_epoll_add(g, g->askfd, EPOLLIN, &g->s_ask);
}

static void say(int fd, const char *line)
{
        ssize_t w = write(fd, line, strlen(line));
        (void)w;
}

int g_ask_accept(struct cove_guest *g, struct cove_err *err)
{
        int fd = accept4(g->askfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
                return 0;
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        char buf[COVE_ASK_MAX + 1] = {0};
        size_t len = 0;
        while (len < sizeof(buf) && !memchr(buf, '\n', len)) {
                ssize_t n = read(fd, buf + len, sizeof(buf) - len);
                if (n <= 0)
                        break;
                len += (size_t)n;
        }
        char *nl = memchr(buf, '\n', len);
        int slot = -1;
        for (int i = 0; i < G_MAX_ASKS && slot < 0; i++)
                if (g->asks[i].fd < 0)
                        slot = i;
        if (!nl || nl == buf) {
                say(fd, "{\"ok\":false,\"message\":\"want one JSON line of at most 4096 "
                        "bytes\"}\n");
                close(fd);
                return 0;
        }
        if (slot < 0) {
                say(fd, "{\"ok\":false,\"message\":\"too many requests in flight\"}\n");
                close(fd);
                return 0;
        }
        uint32_t id = ++g->ask_seq ? g->ask_seq : ++g->ask_seq;
        g->asks[slot].fd = fd;
        g->asks[slot].id = id;
        g->asks[slot].deadline = g_now_ms() + G_ASK_WAIT_MS;
        /* the node validates the bytes; the guest only bounds them */
        return g_send(g, COVE_F_ASK, 0, id, buf, (size_t)(nl - buf), err);
}

void g_ask_answer(struct cove_guest *g, uint32_t id, const uint8_t *p, size_t len)
{
        for (int i = 0; i < G_MAX_ASKS; i++) {
                if (g->asks[i].fd < 0 || g->asks[i].id != id)
                        continue;
                if (len && !memchr(p, '\n', len)) {
                        ssize_t w = write(g->asks[i].fd, p, len);
                        (void)w;
                }
                say(g->asks[i].fd, "\n");
                close(g->asks[i].fd);
                g->asks[i].fd = -1;
        }
}

void g_ask_timers(struct cove_guest *g, int64_t now, int64_t *next)
{
        for (int i = 0; i < G_MAX_ASKS; i++) {
                if (g->asks[i].fd < 0)
                        continue;
                if (g->asks[i].deadline <= now) {
                        say(g->asks[i].fd, "{\"ok\":false,\"message\":\"no answer from the "
                                           "node\"}\n");
                        close(g->asks[i].fd);
                        g->asks[i].fd = -1;
                } else if (*next < 0 || g->asks[i].deadline < *next) {
                        *next = g->asks[i].deadline;
                }
        }
}

void g_ask_close(struct cove_guest *g)
{
        for (int i = 0; i < G_MAX_ASKS; i++)
                if (g->asks[i].fd >= 0)
                        close(g->asks[i].fd);
        if (g->askfd >= 0)
                close(g->askfd);
}

int cove_guest_ask(const char *line, char *out, size_t cap, int timeout_ms)
{
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a;
        socklen_t al = ask_addr(&a);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, al) < 0) {
                if (fd >= 0)
                        close(fd);
                snprintf(out, cap, "cannot reach cove-guest (not inside a cove sandbox?)");
                return -1;
        }
        struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        size_t n = strlen(line), len = 0;
        if (write(fd, line, n) != (ssize_t)n || write(fd, "\n", 1) != 1) {
                close(fd);
                snprintf(out, cap, "cannot write to cove-guest");
                return -1;
        }
        while (len + 1 < cap) {
                ssize_t k = read(fd, out + len, cap - 1 - len);
                if (k <= 0)
                        break;
                len += (size_t)k;
                if (memchr(out, '\n', len))
                        break;
        }
        close(fd);
        out[len] = '\0';
        char *nl = strchr(out, '\n');
        if (nl)
                *nl = '\0';
        return len ? 0 : -1;
}
