/* A TCP connection from the node to a port inside a running sandbox (node/node.h
 * cove_node_port_connect). The socket is created inside the sandbox's network namespace by
 * a short-lived thread (a thread's namespace goes with it, so no caller thread is ever left
 * in a sandbox's namespace), then connected here: ns to its loopback, vm to the guest's
 * address behind QEMU's tap. Inbound never passes the sandbox's egress link or rules. */
#include "node/node.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/util.h"

struct mk {
        pid_t pid;
        int fd;
        int err;
};

static void *make_socket(void *arg)
{
        struct mk *m = arg;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)m->pid);
        int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
                m->err = errno;
                if (ns >= 0)
                        close(ns);
                return NULL;
        }
        close(ns);
        m->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        m->err = m->fd < 0 ? errno : 0;
        return NULL; /* the thread, and its namespace, end here */
}

int cove_node_port_connect(struct cove_node *n, const char *sandbox_id, const char *runtime,
                           uint16_t port, int timeout_ms, int *fd, struct cove_err *err)
{
        *fd = -1;
        pid_t pid = cove_node_pid(n, sandbox_id);
        if (pid <= 0)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is not running here",
                                     sandbox_id);
        struct mk m = {.pid = pid, .fd = -1};
        pthread_t t;
        if (pthread_create(&t, NULL, make_socket, &m) != 0)
                return cove_err_set(err, EAGAIN, "thread for a sandbox socket");
        pthread_join(t, NULL);
        if (m.fd < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, m.err,
                                     "cannot enter the network namespace of sandbox %s",
                                     sandbox_id);
        /* the instance must still be the one located (a pid is not a sandbox for long) */
        if (cove_node_pid(n, sandbox_id) != pid) {
                close(m.fd);
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s stopped while connecting",
                                     sandbox_id);
        }
        int one = 1;
        setsockopt(m.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons(port),
                                .sin_addr.s_addr = htonl(runtime && !strcmp(runtime, "vm")
                                                             ? COVE_NODE_VM_GUEST_ADDR
                                                             : INADDR_LOOPBACK)};
        int r = connect(m.fd, (struct sockaddr *)&a, sizeof(a));
        if (r < 0 && errno == EINPROGRESS) {
                struct pollfd p = {.fd = m.fd, .events = POLLOUT};
                int pr;
                do
                        pr = poll(&p, 1, timeout_ms);
                while (pr < 0 && errno == EINTR);
                int soerr = pr == 0 ? ETIMEDOUT : 0;
                socklen_t sl = sizeof(soerr);
                if (pr > 0)
                        getsockopt(m.fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
                r = soerr ? -1 : 0;
                errno = soerr;
        }
        if (r < 0) {
                int e = errno;
                close(m.fd);
                return cove_err_setk(err, e == ECONNREFUSED ? COVE_E_NOT_FOUND : COVE_E_UNAVAILABLE,
                                     e, "nothing answers on port %u in sandbox %s", (unsigned)port,
                                     sandbox_id);
        }
        /* back to blocking: the callers stream with their own deadlines (poll) */
        int fl = fcntl(m.fd, F_GETFL);
        if (fl >= 0)
                fcntl(m.fd, F_SETFL, fl & ~O_NONBLOCK);
        *fd = m.fd;
        return 0;
}
