/* Abort a sandbox's TCP connections that leave it (node/node.h cove_node_tcp_abort): a hot
 * pause keeps the instance frozen with its kernel sockets, and a resume from it must find
 * them as a restore does (closed: their peer, the node's egress proxy, did not wait). The
 * sockets are listed and destroyed through sock_diag (SOCK_DESTROY) from a short-lived
 * thread inside the sandbox's network namespace, as portconn.c makes its sockets. Loopback
 * connections stay: both of their ends are inside the sandbox. */
#include "node/node.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct abort_job {
        pid_t pid;
        int err;       /* errno of the first failure */
        unsigned done; /* sockets destroyed */
};

/* every state but LISTEN and CLOSE (a listener has no peer) */
#define STATES                                                                                     \
        ((1u << TCP_ESTABLISHED) | (1u << TCP_SYN_SENT) | (1u << TCP_SYN_RECV) |                   \
         (1u << TCP_FIN_WAIT1) | (1u << TCP_FIN_WAIT2) | (1u << TCP_CLOSE_WAIT) |                  \
         (1u << TCP_LAST_ACK) | (1u << TCP_CLOSING))

static int loopback(int family, const __be32 *a)
{
        if (family == AF_INET)
                return (ntohl(a[0]) >> 24) == 127;
        static const __be32 zero[3];
        if (!a[0] && !a[1] && !a[2] && ntohl(a[3]) == 1)
                return 1; /* ::1 */
        /* ::ffff:127.x.x.x */
        return !memcmp(a, zero, 8) && ntohl(a[2]) == 0xffff && (ntohl(a[3]) >> 24) == 127;
}

static int send_req(int fd, uint16_t type, uint16_t flags, const struct inet_diag_req_v2 *r)
{
        struct {
                struct nlmsghdr nh;
                struct inet_diag_req_v2 r;
        } m;
        memset(&m, 0, sizeof(m));
        m.nh.nlmsg_len = sizeof(m);
        m.nh.nlmsg_type = type;
        m.nh.nlmsg_flags = NLM_F_REQUEST | flags;
        m.r = *r;
        struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
        return sendto(fd, &m, sizeof(m), 0, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -1 : 0;
}

/* Dump family's sockets, then destroy the non-loopback ones (after the dump: a destroy
 * in the middle of it would interleave its answer with the dump's). */
static void abort_family(struct abort_job *j, int fd, int family)
{
        struct inet_diag_req_v2 q;
        memset(&q, 0, sizeof(q));
        q.sdiag_family = (uint8_t)family;
        q.sdiag_protocol = IPPROTO_TCP;
        q.idiag_states = STATES;
        if (send_req(fd, SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, &q) < 0) {
                j->err = j->err ? j->err : errno;
                return;
        }
        struct inet_diag_sockid ids[256];
        size_t n = 0;
        char buf[16384];
        for (int end = 0; !end;) {
                ssize_t len = recv(fd, buf, sizeof(buf), 0);
                if (len < 0) {
                        if (errno == EINTR)
                                continue;
                        j->err = j->err ? j->err : errno;
                        return;
                }
                for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)len);
                     h = NLMSG_NEXT(h, len)) {
                        if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
                                end = 1;
                                break;
                        }
                        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
                                continue;
                        const struct inet_diag_msg *m = NLMSG_DATA(h);
                        if (loopback(family, m->id.idiag_dst) && loopback(family, m->id.idiag_src))
                                continue;
                        if (n < sizeof(ids) / sizeof(ids[0]))
                                ids[n++] = m->id;
                }
                if (len == 0)
                        end = 1;
        }
        for (size_t i = 0; i < n; i++) {
                q.idiag_states = STATES;
                q.id = ids[i];
                if (send_req(fd, SOCK_DESTROY, NLM_F_ACK, &q) < 0)
                        continue;
                char ack[512];
                ssize_t len = recv(fd, ack, sizeof(ack), 0);
                struct nlmsghdr *h = (struct nlmsghdr *)ack;
                if (len >= (ssize_t)NLMSG_LENGTH(sizeof(struct nlmsgerr)) &&
                    h->nlmsg_type == NLMSG_ERROR) {
                        int e = -((struct nlmsgerr *)NLMSG_DATA(h))->error;
                        if (e == 0)
                                j->done++;
                        else if (e != ENOENT && !j->err) /* gone meanwhile: fine */
                                j->err = e;
                }
        }
}

static void *abort_main(void *arg)
{
        struct abort_job *j = arg;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)j->pid);
        int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
                j->err = errno;
                if (ns >= 0)
                        close(ns);
                return NULL;
        }
        close(ns);
        int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
        if (fd < 0) {
                j->err = errno;
                return NULL;
        }
        struct timeval tv = {.tv_sec = 2};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        abort_family(j, fd, AF_INET);
        abort_family(j, fd, AF_INET6);
        close(fd);
        return NULL; /* the thread, and its namespace, end here */
}

int cove_node_tcp_abort(struct cove_node *n, const char *sandbox_id, unsigned *count,
                        struct cove_err *err)
{
        *count = 0;
        pid_t pid = cove_node_pid(n, sandbox_id);
        if (pid <= 0)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "sandbox %s is not running here",
                                     sandbox_id);
        struct abort_job j = {.pid = pid};
        pthread_t t;
        if (pthread_create(&t, NULL, abort_main, &j) != 0)
                return cove_err_set(err, EAGAIN, "thread for a sandbox's network namespace");
        pthread_join(t, NULL);
        *count = j.done;
        if (j.err)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, j.err,
                                     "sandbox %s: abort its TCP connections", sandbox_id);
        return 0;
}
