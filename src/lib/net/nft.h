/* nftables rules of the node's sandbox links (libnftables; each change is one atomic
 * transaction). One table per coved (named from its data dir, so a restart after a crash
 * replaces what the crashed process left): from a sandbox's host-side veth only DNS
 * (UDP/TCP 53, any destination) redirected to the node resolver and TCP (any port)
 * redirected to the egress proxy get in; the source address must be the one the sandbox
 * was given (no spoofing another sandbox); everything else from it — ICMP, other UDP,
 * other protocols, IPv6, forwarding — is dropped, and the host opens nothing towards it. */
#ifndef COVE_NET_NFT_H
#define COVE_NET_NFT_H

#include <stdint.h>

#include "util/err.h"

struct cove_nft;

/* (Re)create the table with the resolver and proxy ports (host order). */
struct cove_nft *cove_nft_open(const char *table, uint16_t dns_port, uint16_t proxy_port,
                               struct cove_err *err);
/* Delete the table. */
void cove_nft_close(struct cove_nft *n);
/* Admit (add) or forget (del) one sandbox link with its only valid source address. */
int cove_nft_add(struct cove_nft *n, const char *ifname, uint32_t src_ip, struct cove_err *err);
int cove_nft_del(struct cove_nft *n, const char *ifname, uint32_t src_ip, struct cove_err *err);

#endif
