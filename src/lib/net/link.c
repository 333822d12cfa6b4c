/* veth pairs over rtnetlink; see link.h. */
#include "net/link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/cleanup.h"

/* Send one request and wait for its ACK; returns 0 or -errno. */
static int nl_talk(struct mnl_socket *nl, struct nlmsghdr *nlh)
{
        static __thread unsigned seq_ctr;
        char buf[MNL_SOCKET_BUFFER_SIZE];
        nlh->nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
        nlh->nlmsg_seq = ++seq_ctr + (unsigned)time(NULL);
        unsigned seq = nlh->nlmsg_seq;
        if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
                return -errno;
        unsigned portid = mnl_socket_get_portid(nl);
        for (;;) {
                ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof(buf));
                if (n < 0)
                        return -errno;
                int r = mnl_cb_run(buf, (size_t)n, seq, portid, NULL, NULL);
                if (r < 0)
                        return -errno;
                if (r == MNL_CB_STOP)
                        return 0;
        }
}

static struct nlmsghdr *link_msg(char *buf, int type, int flags, int index, const char *name,
                                 unsigned up)
{
        struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
        nlh->nlmsg_type = (uint16_t)type;
        nlh->nlmsg_flags = (uint16_t)flags;
        struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
        ifm->ifi_family = AF_UNSPEC;
        ifm->ifi_index = index;
        if (up) {
                ifm->ifi_flags = IFF_UP;
                ifm->ifi_change = IFF_UP;
        }
        if (name)
                mnl_attr_put_strz(nlh, IFLA_IFNAME, name);
        return nlh;
}

static int add_addr(struct mnl_socket *nl, int index, uint32_t ip, int prefix)
{
        char buf[MNL_SOCKET_BUFFER_SIZE];
        struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
        nlh->nlmsg_type = RTM_NEWADDR;
        nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_REPLACE;
        struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifa));
        ifa->ifa_family = AF_INET;
        ifa->ifa_prefixlen = (unsigned char)prefix;
        ifa->ifa_scope = RT_SCOPE_UNIVERSE;
        ifa->ifa_index = (unsigned)index;
        uint32_t a = htonl(ip);
        mnl_attr_put_u32(nlh, IFA_LOCAL, a);
        mnl_attr_put_u32(nlh, IFA_ADDRESS, a);
        return nl_talk(nl, nlh);
}

static void write_sysctl(const char *path, const char *v)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return; /* no IPv6 in this kernel: nothing to disable */
        ssize_t w = write(fd, v, strlen(v));
        (void)w;
        close(fd);
}

struct inside_job {
        int nsfd;
        uint32_t host_ip, sb_ip;
        int prefix;
        int rc;        /* 0 or -errno */
        char what[64]; /* the step that failed */
};

/* Runs in its own thread: setns() changes only this thread's namespace, and the thread
 * ends right after, so no other code ever runs in the sandbox's netns. */
static void *inside_main(void *arg)
{
        struct inside_job *j = arg;
        struct mnl_socket *nl = NULL;
        char buf[MNL_SOCKET_BUFFER_SIZE];
        if (setns(j->nsfd, CLONE_NEWNET) < 0) {
                j->rc = -errno;
                snprintf(j->what, sizeof(j->what), "setns");
                return NULL;
        }
        /* IPv6 off inside: the nftables rules drop it anyway, this keeps the stack quiet */
        write_sysctl("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1");
        write_sysctl("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
        write_sysctl("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", "1");
        int idx = (int)if_nametoindex("eth0");
        if (!idx) {
                j->rc = -errno;
                snprintf(j->what, sizeof(j->what), "find eth0");
                return NULL;
        }
        nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
        if (!nl || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
                j->rc = -errno;
                snprintf(j->what, sizeof(j->what), "netlink socket");
                goto out;
        }
        if ((j->rc = add_addr(nl, idx, j->sb_ip, j->prefix)) < 0) {
                snprintf(j->what, sizeof(j->what), "address eth0");
                goto out;
        }
        if ((j->rc = nl_talk(nl, link_msg(buf, RTM_NEWLINK, 0, idx, NULL, 1))) < 0) {
                snprintf(j->what, sizeof(j->what), "eth0 up");
                goto out;
        }
        struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
        nlh->nlmsg_type = RTM_NEWROUTE;
        nlh->nlmsg_flags = NLM_F_CREATE | NLM_F_EXCL;
        struct rtmsg *rt = mnl_nlmsg_put_extra_header(nlh, sizeof(*rt));
        rt->rtm_family = AF_INET;
        rt->rtm_table = RT_TABLE_MAIN;
        rt->rtm_protocol = RTPROT_BOOT;
        rt->rtm_scope = RT_SCOPE_UNIVERSE;
        rt->rtm_type = RTN_UNICAST;
        mnl_attr_put_u32(nlh, RTA_GATEWAY, htonl(j->host_ip));
        mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)idx);
        if ((j->rc = nl_talk(nl, nlh)) < 0)
                snprintf(j->what, sizeof(j->what), "default route");
out:
        if (nl)
                mnl_socket_close(nl);
        return NULL;
}

int cove_link_detach(const char *host_if, struct cove_err *err)
{
        struct mnl_socket *nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
        if (!nl || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
                int e = errno;
                if (nl)
                        mnl_socket_close(nl);
                return cove_err_set(err, e, "netlink socket");
        }
        char buf[MNL_SOCKET_BUFFER_SIZE];
        int r = nl_talk(nl, link_msg(buf, RTM_DELLINK, 0, 0, host_if, 0));
        mnl_socket_close(nl);
        if (r < 0 && r != -ENODEV)
                return cove_err_set(err, -r, "delete link %s", host_if);
        return 0;
}

int cove_link_attach(const char *host_if, pid_t pid, uint32_t host_ip, uint32_t sb_ip, int prefix,
                     struct cove_err *err)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
        cleanup_close int nsfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0)
                return cove_err_set(err, errno, "open %s", path);
        struct mnl_socket *nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
        if (!nl || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
                int e = errno;
                if (nl)
                        mnl_socket_close(nl);
                return cove_err_set(err, e, "netlink socket");
        }
        char buf[MNL_SOCKET_BUFFER_SIZE];
        struct nlmsghdr *nlh = link_msg(buf, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0, host_if, 0);
        struct nlattr *li = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
        mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
        struct nlattr *data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
        struct nlattr *peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
        struct ifinfomsg *pifm = mnl_nlmsg_get_payload_tail(nlh);
        memset(pifm, 0, sizeof(*pifm));
        pifm->ifi_family = AF_UNSPEC;
        nlh->nlmsg_len += MNL_ALIGN(sizeof(*pifm));
        mnl_attr_put_strz(nlh, IFLA_IFNAME, "eth0");
        mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, (uint32_t)nsfd);
        mnl_attr_nest_end(nlh, peer);
        mnl_attr_nest_end(nlh, data);
        mnl_attr_nest_end(nlh, li);
        int r = nl_talk(nl, nlh);
        if (r < 0) {
                mnl_socket_close(nl);
                return cove_err_set(err, -r, "create veth %s", host_if);
        }
        const char *what = "find host end";
        int idx = (int)if_nametoindex(host_if);
        if (!idx) {
                r = -errno;
                goto fail;
        }
        what = "address host end";
        if ((r = add_addr(nl, idx, host_ip, prefix)) < 0)
                goto fail;
        what = "host end up";
        if ((r = nl_talk(nl, link_msg(buf, RTM_NEWLINK, 0, idx, NULL, 1))) < 0)
                goto fail;
        struct inside_job j = {.nsfd = nsfd, .host_ip = host_ip, .sb_ip = sb_ip, .prefix = prefix};
        pthread_t t;
        int e = pthread_create(&t, NULL, inside_main, &j);
        if (e) {
                r = -e;
                what = "namespace thread";
                goto fail;
        }
        pthread_join(t, NULL);
        if (j.rc < 0) {
                r = j.rc;
                what = j.what;
                goto fail;
        }
        mnl_socket_close(nl);
        return 0;
fail:
        nl_talk(nl, link_msg(buf, RTM_DELLINK, 0, 0, host_if, 0));
        mnl_socket_close(nl);
        return cove_err_set(err, -r, "veth %s: %s", host_if, what);
}
