/* coved: control plane + node gateway in one process (the embedded default).
 * Usage: coved --data-dir DIR [--listen HOST:PORT] [--templates-dir DIR]
 *              [--templates busybox,base] [--guest-binary PATH] [--log-level debug|info|warn]
 *              [--default-timeout S] [--e2b-api-listen HOST:PORT|none]
 *              [--e2b-sandbox-listen HOST:PORT|none] [--egress-pool CIDR]
 *              [--dns-upstream IP[:PORT]]... [--dns-static NAME=IP]...
 *              [--runtime ns|vm] [--vm-pool N] [--key-cache-ttl S] [--encrypt-layers]
 *              [--egress-ca-file PEM] [--db postgres://…|PATH]
 *              [--store s3://BUCKET[/PREFIX] --s3-endpoint URL]
 *              [--s3-timeout S] [--chunk-cache-mb N]
 *              [--ports-listen HOST:PORT] [--ports-domain DOMAIN]
 *              [--ports-max-conns N] [--ports-idle-timeout S]
 *              [--role all|control|node] [--cluster-key-file F] [--node-name NAME]
 *              [--node-token-file F] [--control URL] [--advertise URL]
 *              [--lease-ttl S] [--lease-renew S]
 *              [--forward-connect-timeout S] [--forward-head-timeout S]
 *              [--placement-k N] [--max-starts-per-node N] [--node-lost-grace S]
 *              [--cpu-overcommit N] [--pause-hot-s S] [--pause-hot-mb N]
 *        coved node-token --cluster-key-file F --node-name NAME  (prints the token) */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <openssl/crypto.h>

#include "cluster/nodeauth.h"
#include "control/migrate.h"
#include "daemon/daemon.h"
#include "util/testhooks.h"

static void usage(FILE *f)
{
        fprintf(f,
                "usage: coved --data-dir DIR [--listen HOST:PORT] [--templates-dir DIR]\n"
                "             [--templates NAME,...] [--guest-binary PATH]\n"
                "             [--log-level debug|info|warn|error] [--default-timeout SECONDS]\n"
                "             [--e2b-api-listen HOST:PORT|none] "
                "[--e2b-sandbox-listen HOST:PORT|none]\n"
                "             [--pool N]   warm sandboxes kept per template (default 4)\n"
                "             [--pool-max N]  a burst of creates grows each pool up to N\n"
                "                                (default: --pool's N, no growth)\n"
                "             [--pool-idle S]  a grown pool shrinks back after S seconds\n"
                "                                without a create (default 60)\n"
                "             [--egress-pool CIDR]  sandbox link addresses (default "
                "10.200.0.0/16)\n"
                "             [--dns-upstream IP[:PORT]]...  resolvers the node resolver asks\n"
                "                                (default: nameservers of /etc/resolv.conf)\n"
                "             [--dns-static NAME=IP]...  fixed answers of the node resolver\n"
                "             [--runtime ns|vm]  default runtime (default: vm where /dev/kvm\n"
                "                                works, else ns; both are available)\n"
                "             [--vm-pool N]  warm vm sandboxes kept per template (default 0)\n"
                "             [--key-cache-ttl S]  unwrapped tenant keys are unwrapped again\n"
                "                                through their provider after S seconds (default\n"
                "                                60; 0 = every use)\n"
                "             [--encrypt-layers]  sandboxes default to storage_encrypted (their\n"
                "                                writable layer under fscrypt; BYOK tenants\n"
                "                                always are)\n"
                "             [--egress-ca-file PEM]  a CA intercepted upstreams may chain to\n"
                "                                (besides the system store; tests)\n"
                "             [--store s3://BUCKET[/PREFIX]]  snapshots in S3 storage (default:\n"
                "                                <data-dir>/store); credentials from\n"
                "                                AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY\n"
                "             [--s3-endpoint URL]  http(s)://HOST[:PORT] of the S3 service\n"
                "             [--s3-timeout S]  deadline of one S3 request (default 30)\n"
                "             [--chunk-cache-mb N]  local cache of S3 chunks (default 1024)\n"
                "             [--db URL|PATH]  catalog: postgres://USER:PW@HOST:PORT/DB (or\n"
                "                                postgresql://) for PostgreSQL, or a SQLite file\n"
                "                                (default DIR/catalog.db)\n"
                "             [--ports-listen HOST:PORT]  serve exposed sandbox ports there\n"
                "             [--ports-domain DOMAIN]  also route Host {port}-{id}.DOMAIN\n"
                "                                (a wildcard name pointing at the listener)\n"
                "             [--ports-max-conns N]  open connections per sandbox (default 2048)\n"
                "             [--ports-idle-timeout S]  close connections idle that long (600)\n"
                "             [--role all|control|node]  what this process is in a cluster\n"
                "                                (default all: everything in one process)\n"
                "             [--cluster-key-file F]  control: the key every replica holds\n"
                "             [--node-name NAME] [--node-token-file F]  node: who it is\n"
                "             [--control URL]  node: a control replica (http://HOST:PORT)\n"
                "             [--advertise URL]  node: where controls reach its node API\n"
                "                                (default http://<--listen>)\n"
                "             [--pause-hot-s S]  a sandbox paused with a full snapshot stays\n"
                "                                frozen in memory S seconds, so an early resume\n"
                "                                is a thaw (default 120; 0: every pause stops it)\n"
                "             [--pause-hot-mb N]  memory hot-paused sandboxes may hold (2048)\n"
                "             [--lease-ttl S] [--lease-renew S]  node lease (default 10, 2)\n"
                "             [--guest-fence-ttl MS] [--guest-fence-heartbeat MS]  for the\n"
                "                                cluster agent and tests: each guest freezes its\n"
                "                                sandbox after MS without a heartbeat (SIGUSR2\n"
                "                                to coved then thaws every sandbox; default off)\n"
                "             [--forward-connect-timeout S] [--forward-head-timeout S]  control: "
                "reaching a node, its answer head (default 5, 60)\n"
                "             [--default-kek-file F]  with --db postgres://: the default key\n"
                "                                of tenants' data keys, the same file on\n"
                "                                every control and node\n"
                "             [--placement-k N]  control: best of N ready nodes (default 3)\n"
                "             [--max-starts-per-node N]  control: starts, resumes and\n"
                "                                recoveries in flight per node (default 4)\n"
                "             [--node-lost-grace S]  control: a node is lost S seconds after\n"
                "                                its lease TTL ran out (default 5)\n"
                "             [--cpu-overcommit N]  control: sandbox cpus placed per cpu a\n"
                "                                node has (default 4)\n"
                "       coved node-token --cluster-key-file F --node-name NAME\n"
                "             print NAME's node token (for its --node-token-file)\n"
                "       coved migrate --data-dir DIR --db postgres://… --store s3://B\n"
                "             --s3-endpoint URL [--default-kek-file F]  copy a stopped\n"
                "             single node's data dir into a cluster (docs/cluster.md)\n");
}

/* coved node-token --cluster-key-file F --node-name NAME: the token on stdout. */
static int node_token_main(int argc, char **argv)
{
        const char *key_file = NULL, *name = NULL;
        for (int i = 2; i + 1 < argc; i += 2) {
                if (!strcmp(argv[i], "--cluster-key-file"))
                        key_file = argv[i + 1];
                else if (!strcmp(argv[i], "--node-name"))
                        name = argv[i + 1];
                else
                        key_file = name = NULL, i = argc;
        }
        if (!key_file || !name || argc != 6) {
                fprintf(stderr, "usage: coved node-token --cluster-key-file F --node-name NAME\n");
                return 2;
        }
        uint8_t key[COVE_NODEAUTH_KEY_LEN];
        char tok[COVE_NODEAUTH_TOKEN_HEX];
        struct cove_err err = {0};
        int r = cove_nodeauth_read_key(key_file, key, &err) < 0 ||
                cove_nodeauth_token(key, name, tok, &err) < 0;
        OPENSSL_cleanse(key, sizeof(key));
        if (r) {
                fprintf(stderr, "coved: %s\n", err.msg);
                return 1;
        }
        printf("%s\n", tok);
        OPENSSL_cleanse(tok, sizeof(tok));
        return fflush(stdout) == 0 ? 0 : 1;
}

static void migrate_say(void *arg, const char *line)
{
        (void)arg;
        printf("%s\n", line);
        fflush(stdout);
}

/* coved migrate --data-dir OLD --db postgres://… --store s3://B --s3-endpoint URL
 * [--default-kek-file F] [--s3-timeout S]: a stopped single node into a cluster. */
static int migrate_main(int argc, char **argv)
{
        struct coved_migrate_options mo = {.say = migrate_say};
        for (int i = 2; i < argc; i += 2) {
                const char *v = i + 1 < argc ? argv[i + 1] : NULL;
                if (!v)
                        i = argc, mo.data_dir = NULL;
                else if (!strcmp(argv[i], "--data-dir"))
                        mo.data_dir = v;
                else if (!strcmp(argv[i], "--db"))
                        mo.db = v;
                else if (!strcmp(argv[i], "--store"))
                        mo.store_url = v;
                else if (!strcmp(argv[i], "--s3-endpoint"))
                        mo.s3_endpoint = v;
                else if (!strcmp(argv[i], "--default-kek-file"))
                        mo.default_kek_file = v;
                else if (!strcmp(argv[i], "--s3-timeout"))
                        mo.s3_timeout_s = atoi(v);
                else
                        i = argc, mo.data_dir = NULL;
        }
        if (!mo.data_dir || !mo.db || !mo.store_url || !mo.s3_endpoint) {
                fprintf(stderr, "usage: coved migrate --data-dir DIR --db postgres://… --store "
                                "s3://BUCKET[/PREFIX] --s3-endpoint URL [--default-kek-file F] "
                                "[--s3-timeout S]\n");
                return 2;
        }
        struct coved_migrate_stats st;
        struct cove_err err = {0};
        if (coved_migrate(&mo, &st, &err) < 0) {
                fprintf(stderr, "coved migrate: %s\n", err.msg);
                return 1;
        }
        const struct {
                const char *what;
                const struct coved_migrate_count *c;
        } rows[] = {{"key records", &st.keys},    {"store objects", &st.objects},
                    {"tenants", &st.tenants},     {"api keys", &st.api_keys},
                    {"sandboxes", &st.sandboxes}, {"egress policies", &st.policies},
                    {"snapshots", &st.snapshots}, {"egress documents", &st.docs},
                    {"audit events", &st.audit}};
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
                printf("%-17s %8llu copied %8llu already there\n", rows[i].what,
                       (unsigned long long)rows[i].c->copied,
                       (unsigned long long)rows[i].c->already);
        printf("uploaded %llu bytes; %llu key records wrapped again under the default key; "
               "%llu running sandboxes paused at their last snapshot, %llu stopped (no "
               "snapshot)\nmigrate: done (the data dir was not changed)\n",
               (unsigned long long)st.bytes_uploaded, (unsigned long long)st.keys_rewrapped,
               (unsigned long long)st.paused, (unsigned long long)st.stopped);
        return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
        if (argc > 1 && !strcmp(argv[1], "node-token"))
                return node_token_main(argc, argv);
        if (argc > 1 && !strcmp(argv[1], "migrate"))
                return migrate_main(argc, argv);
        struct coved_options o = {.listen = "127.0.0.1:7677",
                                  .log_level = COVE_LOG_INFO,
                                  .default_timeout_s = 300,
                                  .pool_size = -1,
                                  .key_cache_ttl_s = -1,
                                  .vm_pool_size = 0};
        static const struct option opts[] = {
            {"data-dir", required_argument, 0, 'd'},
            {"listen", required_argument, 0, 'l'},
            {"templates-dir", required_argument, 0, 't'},
            {"templates", required_argument, 0, 'T'},
            {"guest-binary", required_argument, 0, 'g'},
            {"log-level", required_argument, 0, 'v'},
            {"default-timeout", required_argument, 0, 'o'},
            {"pool", required_argument, 0, 'p'},
            {"pool-max", required_argument, 0, 1310},
            {"pool-idle", required_argument, 0, 1311},
            {"e2b-api-listen", required_argument, 0, 'E'},
            {"e2b-sandbox-listen", required_argument, 0, 'S'},
            {"egress-pool", required_argument, 0, 'P'},
            {"dns-upstream", required_argument, 0, 'U'},
            {"dns-static", required_argument, 0, 'D'},
            {"egress-ca-file", required_argument, 0, 'C'},
            {"key-cache-ttl", required_argument, 0, 'K'},
            {"encrypt-layers", no_argument, 0, 'Y'},
            {"runtime", required_argument, 0, 'R'},
            {"vm-pool", required_argument, 0, 'V'},
            {"store", required_argument, 0, 1001},
            {"s3-endpoint", required_argument, 0, 1002},
            {"s3-timeout", required_argument, 0, 1003},
            {"chunk-cache-mb", required_argument, 0, 1004},
            {"db", required_argument, 0, 'B'},
            {"ports-listen", required_argument, 0, 1101},
            {"ports-domain", required_argument, 0, 1102},
            {"ports-max-conns", required_argument, 0, 1103},
            {"ports-idle-timeout", required_argument, 0, 1104},
            {"role", required_argument, 0, 1200},
            {"cluster-key-file", required_argument, 0, 1201},
            {"node-name", required_argument, 0, 1202},
            {"node-token-file", required_argument, 0, 1203},
            {"control", required_argument, 0, 1204},
            {"advertise", required_argument, 0, 1205},
            {"lease-ttl", required_argument, 0, 1206},
            {"lease-renew", required_argument, 0, 1207},
            {"forward-connect-timeout", required_argument, 0, 1230},
            {"forward-head-timeout", required_argument, 0, 1231},
            {"default-kek-file", required_argument, 0, 1270},
            /* 1210-1299: more cluster flags (node/control helpers) */
            {"guest-fence-ttl", required_argument, 0, 1280},
            {"guest-fence-heartbeat", required_argument, 0, 1281},
            {"placement-k", required_argument, 0, 1240},
            {"max-starts-per-node", required_argument, 0, 1241},
            {"node-lost-grace", required_argument, 0, 1242},
            {"cpu-overcommit", required_argument, 0, 1243},
            {"test-hooks", required_argument, 0, 'X'}, /* tests only: util/testhooks.h */
            {"pause-hot-s", required_argument, 0, 1300},
            {"pause-hot-mb", required_argument, 0, 1301},
            {"help", no_argument, 0, 'h'},
            {0, 0, 0, 0},
        };
        /* the egress proxy holds up to six fds per connection (two sockets, two pipes) */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max < (1u << 20) ? rl.rlim_max : (1u << 20);
                setrlimit(RLIMIT_NOFILE, &rl);
        }
        static const char *upstreams[4], *statics[256];
        static char upstream_buf[4][64];
        int c;
        while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                switch (c) {
                case 'd':
                        o.data_dir = optarg;
                        break;
                case 'l':
                        o.listen = strcmp(optarg, "none") ? optarg : NULL;
                        break;
                case 't':
                        o.templates_dir = optarg;
                        break;
                case 'T':
                        o.templates = optarg;
                        break;
                case 'g':
                        o.guest_binary = optarg;
                        break;
                case 'v':
                        o.log_level = !strcmp(optarg, "debug")   ? COVE_LOG_DEBUG
                                      : !strcmp(optarg, "warn")  ? COVE_LOG_WARN
                                      : !strcmp(optarg, "error") ? COVE_LOG_ERROR
                                                                 : COVE_LOG_INFO;
                        break;
                case 'o':
                        o.default_timeout_s = atoi(optarg);
                        break;
                case 'p':
                        o.pool_size = atoi(optarg);
                        if (o.pool_size < 0 || o.pool_size > 256) {
                                fprintf(stderr, "coved: --pool takes 0 to 256\n");
                                return 2;
                        }
                        break;
                case 'R':
                        if (strcmp(optarg, "ns") && strcmp(optarg, "vm")) {
                                fprintf(stderr, "coved: --runtime takes ns or vm\n");
                                return 2;
                        }
                        o.runtime = optarg;
                        break;
                case 'V':
                        o.vm_pool_size = atoi(optarg);
                        if (o.vm_pool_size < 0 || o.vm_pool_size > 64) {
                                fprintf(stderr, "coved: --vm-pool takes 0 to 64\n");
                                return 2;
                        }
                        break;
                case 'E':
                        o.e2b_api_listen = strcmp(optarg, "none") ? optarg : NULL;
                        break;
                case 'S':
                        o.e2b_sandbox_listen = strcmp(optarg, "none") ? optarg : NULL;
                        break;
                case 'P':
                        o.egress.pool = optarg;
                        break;
                case 'U': {
                        if (o.egress.nupstreams >= 4) {
                                fprintf(stderr, "coved: at most 4 --dns-upstream\n");
                                return 2;
                        }
                        char *b = upstream_buf[o.egress.nupstreams];
                        snprintf(b, 64, "%s", optarg);
                        char *colon = strchr(b, ':');
                        if (colon) { /* IP:PORT (the port applies to every upstream) */
                                *colon = '\0';
                                o.egress.upstream_port = atoi(colon + 1);
                        }
                        upstreams[o.egress.nupstreams++] = b;
                        o.egress.upstreams = upstreams;
                        break;
                }
                case 'D':
                        if (o.egress.nstatics >= 256) {
                                fprintf(stderr, "coved: at most 256 --dns-static\n");
                                return 2;
                        }
                        statics[o.egress.nstatics++] = optarg;
                        o.egress.statics = statics;
                        break;
                case 'C':
                        o.egress.ca_file = optarg;
                        break;
                case 1101:
                        o.ports.listen = strcmp(optarg, "none") ? optarg : NULL;
                        break;
                case 1102:
                        o.ports.domain = optarg;
                        break;
                case 1103:
                        o.ports.max_conns = atoi(optarg);
                        if (o.ports.max_conns < 1 || o.ports.max_conns > 100000) {
                                fprintf(stderr, "coved: --ports-max-conns takes 1 to 100000\n");
                                return 2;
                        }
                        break;
                case 1104:
                        o.ports.idle_s = atoi(optarg);
                        if (o.ports.idle_s < 1 || o.ports.idle_s > 86400) {
                                fprintf(stderr, "coved: --ports-idle-timeout takes 1 to 86400\n");
                                return 2;
                        }
                        break;
                case 'K':
                        o.key_cache_ttl_s = atoi(optarg);
                        if (o.key_cache_ttl_s < 0 || o.key_cache_ttl_s > 86400) {
                                fprintf(stderr, "coved: --key-cache-ttl takes 0 to 86400\n");
                                return 2;
                        }
                        break;
                case 'Y':
                        o.encrypt_layers = 1;
                        break;
                case 'B':
                        if (!*optarg) {
                                fprintf(stderr, "coved: --db takes a postgres:// URL or a path\n");
                                return 2;
                        }
                        o.db = optarg;
                        break;
                case 'X': {
                        /* fault injection and a shifted clock: never in production */
                        const char *allow = getenv("COVE_TEST_HOOKS");
                        if (!allow || strcmp(allow, "1")) {
                                fprintf(stderr, "coved: --test-hooks is for tests only and "
                                                "needs COVE_TEST_HOOKS=1 in the environment\n");
                                return 2;
                        }
                        struct cove_err e = {0};
                        if (cove_testhooks_open(optarg, &e) < 0) {
                                fprintf(stderr, "coved: %s\n", e.msg);
                                return 2;
                        }
                        fprintf(stderr,
                                "coved: TEST HOOKS ON (%s): faults and clock may be "
                                "injected\n",
                                optarg);
                        break;
                }
                case 1001:
                        o.store.url = optarg;
                        break;
                case 1002:
                        o.store.s3_endpoint = optarg;
                        break;
                case 1003:
                        o.store.s3_timeout_s = atoi(optarg);
                        if (o.store.s3_timeout_s < 1 || o.store.s3_timeout_s > 3600) {
                                fprintf(stderr, "coved: --s3-timeout takes 1 to 3600\n");
                                return 2;
                        }
                        break;
                case 1004:
                        o.store.cache_mb = atoi(optarg);
                        if (o.store.cache_mb < 1 || o.store.cache_mb > (1 << 24)) {
                                fprintf(stderr, "coved: --chunk-cache-mb takes 1 to 16777216\n");
                                return 2;
                        }
                        break;
                case 1300:
                        o.pause_hot_s = atoi(optarg);
                        if (o.pause_hot_s < 0 || o.pause_hot_s > 86400) {
                                fprintf(stderr, "coved: --pause-hot-s takes 0 to 86400\n");
                                return 2;
                        }
                        if (o.pause_hot_s == 0)
                                o.pause_hot_s = -1; /* off */
                        break;
                case 1301:
                        o.pause_hot_mb = atoi(optarg);
                        if (o.pause_hot_mb < 1 || o.pause_hot_mb > (1 << 24)) {
                                fprintf(stderr, "coved: --pause-hot-mb takes 1 to 16777216\n");
                                return 2;
                        }
                        break;
                case 1200:
                        if (!strcmp(optarg, "all"))
                                o.cluster.role = COVED_ROLE_ALL;
                        else if (!strcmp(optarg, "control"))
                                o.cluster.role = COVED_ROLE_CONTROL;
                        else if (!strcmp(optarg, "node"))
                                o.cluster.role = COVED_ROLE_NODE;
                        else {
                                fprintf(stderr, "coved: --role takes all, control or node\n");
                                return 2;
                        }
                        break;
                case 1201:
                        o.cluster.cluster_key_file = optarg;
                        break;
                case 1202:
                        o.cluster.node_name = optarg;
                        break;
                case 1203:
                        o.cluster.node_token_file = optarg;
                        break;
                case 1204:
                        o.cluster.control_url = optarg;
                        break;
                case 1205:
                        o.cluster.advertise = optarg;
                        break;
                case 1270:
                        o.default_kek_file = optarg;
                        break;
                case 1206:
                case 1207: {
                        double v = atof(optarg);
                        if (v < 0.1 || v > 3600) {
                                fprintf(stderr, "coved: --lease-ttl and --lease-renew take 0.1 "
                                                "to 3600 seconds\n");
                                return 2;
                        }
                        *(c == 1206 ? &o.cluster.lease_ttl_ms : &o.cluster.lease_renew_ms) =
                            (int)(v * 1000);
                        break;
                }
                case 1280:
                case 1281: {
                        char *end;
                        long v = strtol(optarg, &end, 10);
                        if (*end || end == optarg || v < 10 || v > 3600000) {
                                fprintf(stderr, "coved: --guest-fence-ttl and "
                                                "--guest-fence-heartbeat take 10 to 3600000 ms\n");
                                return 2;
                        }
                        *(c == 1280 ? &o.cluster.guest_fence_ttl_ms
                                    : &o.cluster.guest_fence_beat_ms) = (int)v;
                        break;
                }
                case 1230:
                case 1231: {
                        double v = atof(optarg);
                        if (v < 0.1 || v > 86400) {
                                fprintf(stderr, "coved: --forward-connect-timeout and "
                                                "--forward-head-timeout take 0.1 to 86400 "
                                                "seconds\n");
                                return 2;
                        }
                        *(c == 1230 ? &o.forward.connect_timeout_ms : &o.forward.head_timeout_ms) =
                            (int)(v * 1000);
                        break;
                }
                case 1240:
                case 1241:
                case 1243:
                case 1310:
                case 1311: { /* counts from 1 up to a bound */
                        long long v = 0;
                        char *end = NULL;
                        v = strtoll(optarg, &end, 10);
                        long long max = c == 1241 ? 1024 : c == 1310 ? 256 : c == 1311 ? 86400 : 64;
                        if (!end || *end || v < 1 || v > max) {
                                fprintf(stderr, "coved: --%s takes 1 to %lld\n",
                                        c == 1240   ? "placement-k"
                                        : c == 1241 ? "max-starts-per-node"
                                        : c == 1243 ? "cpu-overcommit"
                                        : c == 1310 ? "pool-max"
                                                    : "pool-idle",
                                        max);
                                return 2;
                        }
                        *(c == 1240   ? &o.nodes.placement_k
                          : c == 1241 ? &o.nodes.max_starts_per_node
                          : c == 1243 ? &o.nodes.cpu_overcommit
                          : c == 1310 ? &o.pool_max
                                      : &o.pool_idle_s) = (int)v;
                        break;
                }
                case 1242: {
                        double v = atof(optarg);
                        if (v < 0.1 || v > 3600) {
                                fprintf(stderr, "coved: --node-lost-grace takes 0.1 to 3600 "
                                                "seconds\n");
                                return 2;
                        }
                        o.nodes.lost_grace_ms = (int)(v * 1000);
                        break;
                }
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (!o.data_dir || optind != argc) {
                usage(stderr);
                return 2;
        }
        int pool_size = o.pool_size < 0 ? 4 : o.pool_size; /* --pool's default */
        if (o.pool_max && o.pool_max < pool_size) {
                fprintf(stderr, "coved: --pool-max %d is below --pool (%d)\n", o.pool_max,
                        pool_size);
                return 2;
        }
        if (!o.store.url != !o.store.s3_endpoint) {
                fprintf(stderr, "coved: --store s3://… and --s3-endpoint go together\n");
                return 2;
        }
        /* every thread inherits this mask; main waits for the signals synchronously */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGHUP);
        if (o.cluster.guest_fence_ttl_ms > 0)
                sigaddset(&set, SIGUSR2); /* tests: thaw every self-frozen sandbox */
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        signal(SIGPIPE, SIG_IGN);

        struct coved d;
        struct cove_err err;
        if (coved_daemon_open(&d, &o, &err) < 0) {
                fprintf(stderr, "coved: %s\n", err.msg);
                return 1;
        }
        int sig = 0;
        while (sigwait(&set, &sig) == 0 && sig == SIGUSR2) {
                struct cove_err e2;
                if (d.node && cove_node_thaw_fenced(d.node, NULL, &e2) < 0)
                        cove_warn(&d.log, "coved.fence", "thaw: %s", e2.msg);
                else
                        cove_info(&d.log, "coved.fence", "thawed every sandbox (SIGUSR2)");
        }
        cove_info(&d.log, "coved.stop", "signal %d: shutting down", sig);
        coved_daemon_close(&d);
        return 0;
}
