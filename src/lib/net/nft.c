/* nftables table of the sandbox links; see nft.h. Per-sandbox changes only add or delete
 * set elements, so the rules themselves are written once, at open. The base chains see
 * every packet of the host (the proxy's upstream traffic included): each tests the link
 * set once and jumps, so other traffic pays one set lookup per hook. */
#include "net/nft.h"

#include <arpa/inet.h>
#include <errno.h>
#include <nftables/libnftables.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cove_nft {
        struct nft_ctx *ctx;
        pthread_mutex_t mu; /* a libnftables context is not thread-safe */
        char table[64];
};

static int run(struct cove_nft *n, const char *cmd, struct cove_err *err)
{
        pthread_mutex_lock(&n->mu);
        int r = nft_run_cmd_from_buffer(n->ctx, cmd);
        if (r != 0) {
                const char *e = nft_ctx_get_error_buffer(n->ctx);
                char msg[300];
                snprintf(msg, sizeof(msg), "%s", e ? e : "");
                for (char *p = msg; *p; p++)
                        if (*p == '\n')
                                *p = ' ';
                pthread_mutex_unlock(&n->mu);
                return cove_err_set(err, 0, "nftables: %s", msg);
        }
        pthread_mutex_unlock(&n->mu);
        return 0;
}

struct cove_nft *cove_nft_open(const char *table, uint16_t dns_port, uint16_t proxy_port,
                               struct cove_err *err)
{
        struct cove_nft *n = calloc(1, sizeof(*n));
        if (!n) {
                cove_err_set(err, ENOMEM, "nftables");
                return NULL;
        }
        pthread_mutex_init(&n->mu, NULL);
        snprintf(n->table, sizeof(n->table), "%s", table);
        n->ctx = nft_ctx_new(NFT_CTX_DEFAULT);
        if (!n->ctx) {
                free(n);
                cove_err_set(err, ENOMEM, "nftables context");
                return NULL;
        }
        nft_ctx_buffer_output(n->ctx);
        nft_ctx_buffer_error(n->ctx);
        char cmd[4096];
        /* "table {}" first so the delete never fails: create-or-replace in one transaction.
         * (cppcheck does not follow positional arguments like %1$s.) */
        // cppcheck-suppress invalidPrintfArgType_s
        snprintf(
            cmd, sizeof(cmd),
            "table inet %1$s {}\n"
            "delete table inet %1$s\n"
            "table inet %1$s {\n"
            "  set links { type ifname; }\n"
            "  set sources { type ifname . ipv4_addr; }\n"
            "  chain sbx_pre {\n"
            "    type nat hook prerouting priority dstnat; policy accept;\n"
            "    iifname @links meta nfproto ipv4 iifname . ip saddr @sources udp dport 53 "
            "redirect to :%2$u\n"
            "    iifname @links meta nfproto ipv4 iifname . ip saddr @sources tcp dport 53 "
            "redirect to :%2$u\n"
            "    iifname @links meta nfproto ipv4 iifname . ip saddr @sources meta l4proto tcp "
            "redirect to :%3$u\n"
            "  }\n"
            "  chain sbx_in {\n"
            "    type filter hook input priority filter; policy accept;\n"
            "    iifname @links jump from_sandbox\n"
            "  }\n"
            "  chain from_sandbox {\n"
            "    meta nfproto != ipv4 counter drop\n"
            "    iifname . ip saddr != @sources counter drop\n"
            "    udp dport %2$u ct status dnat accept\n"
            "    tcp dport %2$u ct status dnat accept\n"
            "    tcp dport %3$u ct status dnat accept\n"
            "    counter drop\n"
            "  }\n"
            "  chain sbx_fwd {\n"
            "    type filter hook forward priority filter; policy accept;\n"
            "    iifname @links counter drop\n"
            "    oifname @links counter drop\n"
            "  }\n"
            "  chain sbx_out {\n"
            "    type filter hook output priority filter; policy accept;\n"
            "    oifname @links jump to_sandbox\n"
            "  }\n"
            "  chain to_sandbox {\n"
            "    ct state established,related accept\n"
            "    counter drop\n"
            "  }\n"
            "}\n",
            n->table, dns_port, proxy_port);
        if (run(n, cmd, err) < 0) {
                nft_ctx_free(n->ctx);
                free(n);
                return NULL;
        }
        return n;
}

void cove_nft_close(struct cove_nft *n)
{
        if (!n)
                return;
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "delete table inet %s\n", n->table);
        struct cove_err e;
        run(n, cmd, &e);
        nft_ctx_free(n->ctx);
        pthread_mutex_destroy(&n->mu);
        free(n);
}

static int elems(struct cove_nft *n, const char *op, const char *ifname, uint32_t ip,
                 struct cove_err *err)
{
        char a[INET_ADDRSTRLEN];
        struct in_addr ia = {.s_addr = htonl(ip)};
        inet_ntop(AF_INET, &ia, a, sizeof(a));
        char cmd[512];
        snprintf(cmd, sizeof(cmd),
                 "%1$s element inet %2$s sources { \"%3$s\" . %4$s }\n"
                 "%1$s element inet %2$s links { \"%3$s\" }\n",
                 op, n->table, ifname, a);
        if (run(n, cmd, err) < 0)
                return cove_err_wrap(err, "%s link %s", op, ifname);
        return 0;
}

int cove_nft_add(struct cove_nft *n, const char *ifname, uint32_t src_ip, struct cove_err *err)
{
        return elems(n, "add", ifname, src_ip, err);
}

int cove_nft_del(struct cove_nft *n, const char *ifname, uint32_t src_ip, struct cove_err *err)
{
        return elems(n, "delete", ifname, src_ip, err);
}
