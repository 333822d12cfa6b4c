/* The port listener (net/ports.c) against a real upstream: a keep-alive HTTP server on
 * loopback, reached through the listener's path route. What is checked is what the
 * exposure calls do to an open connection: the same exposure given again (a node adopting
 * a sandbox that a relayed head made it load a moment before) keeps the connection and its
 * next request answered; a changed one, or one no longer kept, ends it. Needs root (the
 * listener enters the "sandbox's" network namespace, here this process's own). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "net/ports.h"

#include <arpa/inet.h>
#include <openssl/evp.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SBX "sbx_listenertest"

static void locate(void *arg, const char *sandbox, struct cove_ports_where *w)
{
        (void)arg;
        (void)sandbox;
        w->state = COVE_PORTS_RUNNING;
        w->pid = getpid();
}

/* the upstream: answers every request head on a connection "200 ok" (keep-alive) */
struct upstream {
        int lfd;
        uint16_t port;
        pthread_t th;
};

static void *serve_conn(void *arg)
{
        int fd = (int)(intptr_t)arg;
        char buf[8192];
        size_t have = 0;
        for (;;) {
                ssize_t n = recv(fd, buf + have, sizeof(buf) - 1 - have, 0);
                if (n <= 0)
                        break;
                have += (size_t)n;
                buf[have] = '\0';
                char *end;
                while ((end = strstr(buf, "\r\n\r\n")) != NULL) {
                        static const char ans[] =
                            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: "
                            "text/plain\r\n\r\nok";
                        if (send(fd, ans, sizeof(ans) - 1, MSG_NOSIGNAL) < 0)
                                goto out;
                        size_t used = (size_t)(end + 4 - buf);
                        memmove(buf, buf + used, have - used);
                        have -= used;
                        buf[have] = '\0';
                }
        }
out:
        close(fd);
        return NULL;
}

static void *serve(void *arg)
{
        struct upstream *u = arg;
        for (;;) {
                int fd = accept(u->lfd, NULL, NULL);
                if (fd < 0)
                        return NULL;
                pthread_t t;
                if (pthread_create(&t, NULL, serve_conn, (void *)(intptr_t)fd) == 0)
                        pthread_detach(t);
                else
                        close(fd);
        }
}

static uint16_t bound_port(int fd)
{
        struct sockaddr_in a;
        socklen_t al = sizeof(a);
        assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
        return ntohs(a.sin_port);
}

static void upstream_start(struct upstream *u)
{
        u->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(u->lfd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(bind(u->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
        assert_int_equal(listen(u->lfd, 16), 0);
        u->port = bound_port(u->lfd);
        assert_int_equal(pthread_create(&u->th, NULL, serve, u), 0);
}

static int dial(const char *bound)
{
        const char *colon = strrchr(bound, ':');
        assert_non_null(colon);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)atoi(colon + 1)),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        return fd;
}

/* One request on fd; 1 with a 200 answer read whole, 0 when the listener closed the
 * connection without an answer. */
static int ask(int fd, uint16_t port, const char *token)
{
        char req[256];
        int n = snprintf(req, sizeof(req), "GET /p/%s/%u/ HTTP/1.1\r\nHost: t\r\n%s%s%s\r\n", SBX,
                         (unsigned)port, token ? "X-Cove-Port-Token: " : "", token ? token : "",
                         token ? "\r\n" : "");
        if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
                return 0;
        char buf[4096];
        size_t have = 0;
        while (have < sizeof(buf) - 1) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                assert_int_equal(poll(&pfd, 1, 20000), 1); /* an answer or a close, never none */
                ssize_t r = recv(fd, buf + have, sizeof(buf) - 1 - have, 0);
                if (r <= 0)
                        return 0;
                have += (size_t)r;
                buf[have] = '\0';
                char *body = strstr(buf, "\r\n\r\n");
                if (body && strlen(body + 4) >= 2) {
                        assert_non_null(strstr(buf, "HTTP/1.1 200"));
                        return 1;
                }
        }
        fail_msg("answer too long: %s", buf);
        return 0;
}

/* Read until the listener closes fd (it must, within 20 s). */
static void wait_closed(int fd)
{
        char buf[256];
        for (;;) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                assert_int_equal(poll(&pfd, 1, 20000), 1);
                ssize_t r = recv(fd, buf, sizeof(buf), 0);
                if (r <= 0)
                        return;
        }
}

static void reexpose_keeps_connections(void **state)
{
        (void)state;
        if (geteuid() != 0) {
                print_message("skipped: needs root (the listener enters a network namespace)\n");
                skip();
        }
        struct upstream u;
        upstream_start(&u);
        struct cove_log log = {.fd = 2, .level = COVE_LOG_WARN};
        struct cove_ports_config cfg = {
            .log = &log, .listen = "127.0.0.1:0", .locate = locate, .arg = NULL};
        struct cove_err err = {0};
        struct cove_ports *p = cove_ports_new(&cfg, &err);
        assert_non_null(p);
        uint32_t lo = INADDR_LOOPBACK;
        uint8_t h1[COVE_PORTS_TOKEN_HASH], h2[COVE_PORTS_TOKEN_HASH];
        memset(h1, 1, sizeof(h1));
        memset(h2, 2, sizeof(h2));
        assert_int_equal(cove_ports_expose(p, "ten", SBX, u.port, 1, 0, lo, NULL, &err), 0);
        int fd = dial(cove_ports_bound(p));
        assert_int_equal(ask(fd, u.port, NULL), 1);

        /* the same exposure again, and a kick (a sandbox's state changed): the connection
         * stays, its next request is answered */
        assert_int_equal(cove_ports_expose(p, "ten", SBX, u.port, 1, 0, lo, NULL, &err), 0);
        cove_ports_kick(p);
        assert_int_equal(ask(fd, u.port, NULL), 1);
        /* keeping the port keeps it too; another exposure of the sandbox goes */
        assert_int_equal(cove_ports_expose(p, "ten", SBX, 1, 1, 0, lo, NULL, &err), 0);
        uint16_t keep[] = {u.port};
        cove_ports_unexpose_others(p, SBX, keep, 1);
        assert_int_equal(cove_ports_has(p, SBX, 1), 0);
        assert_int_equal(cove_ports_has(p, SBX, u.port), 1);
        assert_int_equal(ask(fd, u.port, NULL), 1);
        /* a changed exposure (now private) ends it */
        assert_int_equal(cove_ports_expose(p, "ten", SBX, u.port, 0, 0, lo, h1, &err), 0);
        wait_closed(fd);
        close(fd);

        /* private: the same token hash again keeps it, another one ends it */
        const char *tok = "cpt_listenertest";
        unsigned hl = 0;
        assert_int_equal(EVP_Digest(tok, strlen(tok), h1, &hl, EVP_sha256(), NULL), 1);
        assert_int_equal(cove_ports_expose(p, "ten", SBX, u.port, 0, 0, lo, h1, &err), 0);
        fd = dial(cove_ports_bound(p));
        assert_int_equal(ask(fd, u.port, tok), 1);
        assert_int_equal(cove_ports_expose(p, "ten", SBX, u.port, 0, 0, lo, h1, &err), 0);
        assert_int_equal(ask(fd, u.port, tok), 1);
        assert_int_equal(cove_ports_expose(p, "ten", SBX, u.port, 0, 0, lo, h2, &err), 0);
        wait_closed(fd);
        close(fd);

        /* no longer kept: ends it */
        assert_int_equal(cove_ports_expose(p, "ten", SBX, u.port, 1, 0, lo, NULL, &err), 0);
        fd = dial(cove_ports_bound(p));
        assert_int_equal(ask(fd, u.port, NULL), 1);
        cove_ports_unexpose_others(p, SBX, NULL, 0);
        assert_int_equal(cove_ports_has(p, SBX, u.port), 0);
        wait_closed(fd);
        close(fd);

        cove_ports_free(p);
        shutdown(u.lfd, SHUT_RDWR);
        close(u.lfd);
        pthread_join(u.th, NULL);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(reexpose_keeps_connections),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
