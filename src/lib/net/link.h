/* Sandbox links: a veth pair per sandbox, one end ("eth0") inside the sandbox's network
 * namespace, the other on the host, each with one address of a /30 (point-to-point: no
 * L2 shared between sandboxes). Netlink (libmnl) only, no `ip` processes. The in-namespace
 * half runs in a short-lived thread that setns()es into the sandbox's netns, since coved is
 * multi-threaded and only the calling thread may change namespace. */
#ifndef COVE_NET_LINK_H
#define COVE_NET_LINK_H

#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

/* Create host_if (host end, host_ip/prefix, up) and its peer eth0 in the netns of pid
 * (sb_ip/prefix, up, default route via host_ip, IPv6 disabled). Addresses in host order.
 * EEXIST (errno in err) when host_if exists already (another coved may own that slot).
 * On failure nothing is left behind. */
int cove_link_attach(const char *host_if, pid_t pid, uint32_t host_ip, uint32_t sb_ip, int prefix,
                     struct cove_err *err);
/* Delete host_if (and so its peer); 0 also when it is gone already. */
int cove_link_detach(const char *host_if, struct cove_err *err);

#endif
