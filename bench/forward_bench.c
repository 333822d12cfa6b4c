/* What forwarding through a control replica costs (api/forward.c): a small request's round
 * trip and a 1 GiB download, straight to a node's API (signed by the bench, as a replica
 * signs) and through a control replica's forwarder, in the same run and process, over
 * loopback. The node's handlers are stand-ins (a small JSON answer; a generated body), so
 * the figures are the forwarder's own cost, not a sandbox's. Also the process's RSS growth
 * during the forwarded download (the forwarder holds one 64 KiB buffer per request).
 * Figures only, never a verdict. Usage: forward_bench [--n ROUNDTRIPS] [--mb DOWNLOAD_MB] */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/forward.h"
#include "api/http.h"
#include "cluster/nodeauth.h"
#include "store/catalog.h"
#include "util/cleanup.h"
#include "util/util.h"

static const struct cove_catalog_ops *ops = &cove_catalog_sqlite;

static int h_small(void *app, struct cove_req *r)
{
        return cove_reply_json(r, 200, json_pack("{s:i, s:i}", "pid", 1, "exit_code", 0));
}

static ssize_t big_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        uint64_t n = *(uint64_t *)ctx;
        if (pos >= n)
                return -1;
        size_t k = n - pos < max ? (size_t)(n - pos) : max;
        memset(buf, 'x', k);
        return (ssize_t)k;
}

static int h_big(void *app, struct cove_req *r)
{
        uint64_t *n = malloc(sizeof(*n));
        *n = strtoull(cove_req_query(r, "n"), NULL, 10);
        return cove_reply_stream(r, 200, "application/octet-stream", (int64_t)*n, big_read, free,
                                 n);
}

static const struct cove_route routes[] = {
    {"POST", "/v1/sandboxes/{id}/exec", h_small, NULL, COVE_ROUTE_SANDBOX},
    {"GET", "/v1/sandboxes/{id}/files", h_big, NULL, COVE_ROUTE_SANDBOX},
};

static int ctl_auth(void *app, struct cove_req *r, const char *a, struct cove_err *err)
{
        snprintf(r->tenant, sizeof(r->tenant), "t1");
        return 0;
}

static int free_port(void)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        bind(fd, (struct sockaddr *)&sa, sizeof(sa));
        socklen_t l = sizeof(sa);
        getsockname(fd, (struct sockaddr *)&sa, &l);
        close(fd);
        return ntohs(sa.sin_port);
}

/* One request on a new connection; returns the body bytes read (the answer discarded), or
 * -1. hdrs: extra header lines. */
static int64_t one(int port, const char *method, const char *target, const char *hdrs,
                   const char *body)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int one_ = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one_, sizeof(one_));
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                close(fd);
                return -1;
        }
        char head[2048];
        int n = snprintf(head, sizeof(head),
                         "%s %s HTTP/1.1\r\nHost: b\r\nConnection: close\r\n%s"
                         "Content-Length: %zu\r\n\r\n%s",
                         method, target, hdrs, strlen(body), body);
        if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n) {
                close(fd);
                return -1;
        }
        static __thread char buf[1 << 16];
        int64_t total = 0;
        ssize_t k;
        while ((k = recv(fd, buf, sizeof(buf), 0)) > 0)
                total += k;
        close(fd);
        return total;
}

static int cmp(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

static long rss_kb(void)
{
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        long v = -1;
        while (f && fgets(line, sizeof(line), f))
                if (!strncmp(line, "VmRSS:", 6))
                        v = strtol(line + 6, NULL, 10);
        if (f)
                fclose(f);
        return v;
}

/* A signed request straight to the node, as a replica makes it. */
static void sign(const char *token, const char *method, const char *target, char *hdrs, size_t cap)
{
        char authz[COVE_NODEAUTH_HDR_MAX], sig[65];
        struct cove_err err;
        struct cove_nodeauth_req q = {.method = method, .path_query = target, .tenant = "t1"};
        cove_nodeauth_sign(token, "n1", &q, cove_now_ms(), authz, sizeof(authz), sig, &err);
        snprintf(hdrs, cap, "Authorization: %s\r\nX-Cove-Tenant: t1\r\n", authz);
}

int main(int argc, char **argv)
{
        int n = 500;
        long mb = 1024;
        int c;
        static const struct option lo[] = {
            {"n", required_argument, 0, 'n'}, {"mb", required_argument, 0, 'm'}, {0, 0, 0, 0}};
        while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
                if (c == 'n')
                        n = atoi(optarg);
                else if (c == 'm')
                        mb = atol(optarg);
                else
                        return 2;
        }
        if (n < 10 || mb < 1)
                return 2;
        char dir[] = "/tmp/cove-forward-bench-XXXXXX", path[256];
        if (!mkdtemp(dir))
                return 1;
        snprintf(path, sizeof(path), "%s/catalog.db", dir);
        struct cove_err err = {0};
        struct cove_catalog *cat = ops->open(path, &err);
        if (!cat) {
                fprintf(stderr, "catalog: %s\n", err.msg);
                return 1;
        }
        struct cove_tenant_row t = {.created_at = 1};
        strcpy(t.id, "t1");
        strcpy(t.name, "t1");
        ops->tenant_put(cat, &t, &err);
        static struct coved ctl, node;
        struct coved *ds[2] = {&ctl, &node};
        for (int i = 0; i < 2; i++) {
                ds[i]->log.fd = 2;
                ds[i]->log.level = COVE_LOG_ERROR;
                ds[i]->cat_ops = ops;
                ds[i]->cat = cat;
                ds[i]->fwd = cove_fwd_new(NULL, &err);
        }
        ctl.role = COVED_ROLE_CONTROL;
        cove_random(ctl.cluster_key, 32, &err);
        ctl.has_cluster_key = 1;
        node.role = COVED_ROLE_NODE;
        strcpy(node.node_name, "n1");
        cove_nodeauth_token(ctl.cluster_key, "n1", node.node_token, &err);
        int pn = free_port(), pc = free_port();
        char addr[64];
        size_t nr;
        struct cove_http_config hn = {
            .auth = cove_nodeapi_auth, .app = &node, .log = &node.log, .quitting = &node.quitting};
        hn.routes = cove_fwd_routes(node.fwd, COVED_ROLE_NODE, routes, 2, NULL, 0, &nr);
        hn.nroutes = nr;
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", pn);
        struct cove_http *hnode = cove_http_start(&hn, addr, NULL, &err);
        struct cove_http_config hc = {
            .auth = ctl_auth, .app = &ctl, .log = &ctl.log, .quitting = &ctl.quitting};
        hc.routes = cove_fwd_routes(ctl.fwd, COVED_ROLE_CONTROL, routes, 2, NULL, 0, &nr);
        hc.nroutes = nr;
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", pc);
        struct cove_http *hctl = cove_http_start(&hc, addr, NULL, &err);
        if (!hnode || !hctl) {
                fprintf(stderr, "listen: %s\n", err.msg);
                return 1;
        }
        struct cove_node_row nrow = {.cpus = 1, .memory_mb = 1, .disk_mb = 1};
        strcpy(nrow.name, "n1");
        snprintf(nrow.address, sizeof(nrow.address), "http://127.0.0.1:%d", pn);
        int64_t epoch, exp, gen, job;
        ops->node_lease_acquire(cat, &nrow, 600000, &epoch, &exp, &err);
        struct cove_sandbox_row s = {.cpus = 1, .memory_mb = 1, .disk_mb = 1, .timeout_s = 300};
        strcpy(s.id, "sbx_bench");
        strcpy(s.tenant, "t1");
        strcpy(s.state, "running");
        strcpy(s.template_name, "busybox");
        strcpy(s.runtime, "ns");
        strcpy(s.on_timeout, "kill");
        s.created_at = cove_now_ms();
        ops->sandbox_insert(cat, &s, &err);
        ops->placement_write(cat, "sbx_bench", "n1", "running", NULL, NULL, -1, &gen, &job, &err);

        double la[3] = {0};
        getloadavg(la, 3);
        printf("forward_bench: loopback, stand-in node handlers; load average %.2f %.2f %.2f, "
               "%ld cpus\n",
               la[0], la[1], la[2], sysconf(_SC_NPROCESSORS_ONLN));
        const char *tx = "/v1/sandboxes/sbx_bench/exec";
        const char *body = "{\"cmd\":[\"true\"],\"wait\":true}";
        double *ms[2] = {calloc((size_t)n, sizeof(double)), calloc((size_t)n, sizeof(double))};
        int errors = 0;
        for (int i = 0; i < n; i++) { /* interleaved, so load changes hit both alike */
                char hdrs[512];
                sign(node.node_token, "POST", tx, hdrs, sizeof(hdrs));
                int64_t t0 = cove_mono_ns();
                errors += one(pn, "POST", tx, hdrs, body) <= 0;
                int64_t t1 = cove_mono_ns();
                errors += one(pc, "POST", tx, "Authorization: Bearer b\r\n", body) <= 0;
                int64_t t2 = cove_mono_ns();
                ms[0][i] = (double)(t1 - t0) / 1e6;
                ms[1][i] = (double)(t2 - t1) / 1e6;
        }
        for (int k = 0; k < 2; k++)
                qsort(ms[k], (size_t)n, sizeof(double), cmp);
        printf("round trip (small JSON request and answer, %d each, %d errors):\n", n, errors);
        printf("  straight to the node (anchor): p50 %.3f ms  p90 %.3f ms\n", ms[0][n / 2],
               ms[0][n * 9 / 10]);
        printf("  through the control:           p50 %.3f ms  p90 %.3f ms  (+%.3f ms p50)\n",
               ms[1][n / 2], ms[1][n * 9 / 10], ms[1][n / 2] - ms[0][n / 2]);
        char target[128];
        uint64_t bytes = (uint64_t)mb << 20;
        snprintf(target, sizeof(target), "/v1/sandboxes/sbx_bench/files?n=%llu",
                 (unsigned long long)bytes);
        char hdrs[512];
        sign(node.node_token, "GET", target, hdrs, sizeof(hdrs));
        int64_t t0 = cove_mono_ns();
        int64_t got0 = one(pn, "GET", target, hdrs, "");
        int64_t t1 = cove_mono_ns();
        long rss0 = rss_kb();
        int64_t got1 = one(pc, "GET", target, "Authorization: Bearer b\r\n", "");
        int64_t t2 = cove_mono_ns();
        long rss1 = rss_kb();
        printf("download of %ld MiB:\n", mb);
        printf("  straight to the node (anchor): %.0f MB/s%s\n",
               (double)bytes / 1e6 / ((double)(t1 - t0) / 1e9),
               got0 < (int64_t)bytes ? " (SHORT)" : "");
        printf("  through the control:           %.0f MB/s%s; RSS %+ld KiB over it\n",
               (double)bytes / 1e6 / ((double)(t2 - t1) / 1e9),
               got1 < (int64_t)bytes ? " (SHORT)" : "", rss1 - rss0);
        cove_http_stop(hctl);
        cove_http_stop(hnode);
        ops->close(cat);
        cove_fwd_free(ctl.fwd);
        cove_fwd_free(node.fwd);
        free(ms[0]);
        free(ms[1]);
        unlink(path);
        rmdir(dir);
        return 0;
}
