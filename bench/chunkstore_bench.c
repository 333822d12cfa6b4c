/* Chunk store benchmark (docs/storage.md): capture throughput of changed data with time per stage,
 * the dedup path (same data again), restore throughput, and bytes stored per snapshot of
 * an unchanged tree. Prints a markdown table.
 * usage: chunkstore_bench [--dir DIR] [--mb N (1024)] [--idle-mb N (200)] [--threads N]
 *                         [--rand-mb N (512): the goal row's incompressible tree, next to dd]
 *                         [--compare-loose: the same tree also into a store of loose files]
 *                         [--json: the goal row's figures to $COVE_BENCH_JSON (else stderr)]
 *                         [--store s3://BUCKET[/PREFIX] --s3-endpoint URL [--cache]]
 * With --store the objects go to that S3 bucket (credentials from AWS_*; bench/s3_bench.sh
 * starts a radosgw and runs this against both stores); --cache puts the node's local chunk
 * cache in front (restore then reads what capture cached). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/snapshot.h"
#include "util/util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t xr(void)
{
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

/* mb MiB in 8 MiB files, alternating random and compressible (text-like) content (all
 * random when incompressible). */
static void gen_tree2(const char *dir, size_t mb, uint64_t seed, int incompressible)
{
        mkdir(dir, 0755);
        rng = seed | 1;
        size_t fsz = 8u << 20;
        uint8_t *b = malloc(fsz);
        for (size_t i = 0; i * 8 < mb; i++) {
                int text = incompressible ? 0 : i % 2;
                for (size_t k = 0; k < fsz; k += 8) {
                        uint64_t v = xr();
                        if (text)
                                v = 0x6161616161616161ULL | (v & 0x0707070707070707ULL);
                        memcpy(b + k, &v, 8);
                }
                char p[512];
                snprintf(p, sizeof(p), "%s/f%04zu.%s", dir, i, text ? "txt" : "bin");
                int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd < 0 || write(fd, b, fsz) != (ssize_t)fsz) {
                        perror(p);
                        exit(1);
                }
                close(fd);
        }
        free(b);
        sync(); /* measure with the source data on disk, not in writeback */
}

static void gen_tree(const char *dir, size_t mb, uint64_t seed)
{
        gen_tree2(dir, mb, seed, 0);
}

/* The anchor: this disk's write rate with one fdatasync at the end, `dd if=/dev/zero
 * of=OUT bs=1M count=MB conv=fdatasync` (ext4 stores zeros as it stores anything else), as
 * MB/s of the whole command, or 0 when dd failed. */
static double dd_rate(const char *out, size_t mb)
{
        char cmd[1024];
        snprintf(cmd, sizeof(cmd),
                 "dd if=/dev/zero of=%s bs=1M count=%zu conv=fdatasync status=none", out, mb);
        int64_t t0 = cove_mono_ns();
        int rc = system(cmd);
        int64_t ns = cove_mono_ns() - t0;
        unlink(out);
        return rc == 0 && ns > 0 ? (double)mb * 1048576 / 1e6 / ((double)ns / 1e9) : 0;
}

static int64_t ru_ns(const struct rusage *r)
{
        return ((int64_t)r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1000000000LL +
               ((int64_t)r->ru_utime.tv_usec + r->ru_stime.tv_usec) * 1000;
}

static double mbps(uint64_t bytes, uint64_t ns)
{
        return ns ? (double)bytes / 1e6 / ((double)ns / 1e9) : 0;
}

static void drop_caches(void)
{
        sync();
        int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
        if (fd >= 0) {
                if (write(fd, "3", 1) < 0) {
                }
                close(fd);
        }
}

static void row_capture(const char *what, const struct cove_snapshot_stats *s)
{
        uint64_t b = s->size_bytes;
        printf("| %-26s | %8.0f | %7.0f | %7.0f | %7.0f | %7.0f | %7.0f | %9.1f | %9.1f |\n", what,
               mbps(b, s->ns_total), mbps(b, s->ns_chunk), mbps(b, s->ns_hash),
               mbps(b, s->ns_compress), mbps(b, s->ns_encrypt), mbps(b, s->ns_write),
               (double)s->new_bytes / 1e6, (double)s->stored_bytes / 1e6);
}

int main(int argc, char **argv)
{
        const char *base = "/var/tmp";
        size_t mb = 1024, idle_mb = 200, rand_mb = 512;
        int json = 0, compare_loose = 0;
        int threads = 0, use_cache = 0;
        const char *store_url = NULL, *endpoint = NULL;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "--dir") && i + 1 < argc)
                        base = argv[++i];
                else if (!strcmp(argv[i], "--mb") && i + 1 < argc)
                        mb = (size_t)atol(argv[++i]);
                else if (!strcmp(argv[i], "--rand-mb") && i + 1 < argc)
                        rand_mb = (size_t)atol(argv[++i]);
                else if (!strcmp(argv[i], "--json"))
                        json = 1;
                else if (!strcmp(argv[i], "--compare-loose"))
                        compare_loose = 1;
                else if (!strcmp(argv[i], "--idle-mb") && i + 1 < argc)
                        idle_mb = (size_t)atol(argv[++i]);
                else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
                        threads = atoi(argv[++i]);
                else if (!strcmp(argv[i], "--store") && i + 1 < argc)
                        store_url = argv[++i];
                else if (!strcmp(argv[i], "--s3-endpoint") && i + 1 < argc)
                        endpoint = argv[++i];
                else if (!strcmp(argv[i], "--cache"))
                        use_cache = 1;
                else {
                        fprintf(stderr,
                                "usage: %s [--dir DIR] [--mb N] [--rand-mb N] [--idle-mb N] "
                                "[--threads N] [--json] [--compare-loose] [--store s3://B[/P] "
                                "--s3-endpoint URL "
                                "[--cache]]\n",
                                argv[0]);
                        return 2;
                }
        }
        char dir[512], root[600], keys[600], src[600], dst[600], idle[600];
        snprintf(dir, sizeof(dir), "%s/cove-csbench-XXXXXX", base);
        if (!mkdtemp(dir)) {
                perror("mkdtemp");
                return 1;
        }
        snprintf(root, sizeof(root), "%s/store", dir);
        snprintf(keys, sizeof(keys), "%s/keys", dir);
        snprintf(src, sizeof(src), "%s/src", dir);
        snprintf(dst, sizeof(dst), "%s/dst", dir);
        snprintf(idle, sizeof(idle), "%s/idle", dir);
        fprintf(stderr, "generating %zu MiB in %s …\n", mb, src);
        gen_tree(src, mb, 1);
        char cache[600];
        snprintf(cache, sizeof(cache), "%s/cache", dir);
        struct cove_chunkstore_cfg backend = {
            .url = store_url, .s3_endpoint = endpoint, .cache_dir = use_cache ? cache : NULL};
        struct cove_store_opts o = {
            .root = root, .keys_dir = keys, .threads = threads, .backend = &backend};
        struct cove_store *st;
        struct cove_err err = {0};
        if (cove_store_open(&o, &st, &err) < 0) {
                fprintf(stderr, "open: %s\n", err.msg);
                return 1;
        }
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        double la[3] = {0};
        getloadavg(la, 3);
        printf("chunk store %s%s: %zu MiB (half random, half compressible), %d worker threads, "
               "%ld CPUs, load %.2f %.2f %.2f, %s\n\n",
               store_url ? store_url : "fs", use_cache ? " + local cache" : "", mb,
               threads ? threads : (int)(2 * ncpu > 8 ? 8 : 2 * ncpu), ncpu, la[0], la[1], la[2],
               store_url ? "one PUT per object" : "fdatasync'ed objects");
        printf("| %-26s | %8s | %7s | %7s | %7s | %7s | %7s | %9s | %9s |\n", "capture", "MB/s",
               "chunk", "hash", "zstd", "encrypt", "write", "new MB", "stored MB");
        printf("|%s|\n", "----------------------------|----------|---------|---------|---------|---"
                         "------|---------|-----------|-----------");
        int fd = open(src, O_RDONLY | O_DIRECTORY);
        struct cove_snapshot_stats s1 = {0}, s2 = {0}, r = {0};
        if (cove_snapshot_capture_tree(st, "bench", "s1", NULL, fd, &s1, &err) < 0) {
                fprintf(stderr, "capture: %s\n", err.msg);
                return 1;
        }
        row_capture("changed data", &s1);
        if (cove_snapshot_capture_tree(st, "bench", "s2", "s1", fd, &s2, &err) < 0) {
                fprintf(stderr, "capture: %s\n", err.msg);
                return 1;
        }
        row_capture("unchanged, incremental", &s2);
        struct cove_snapshot_stats s3 = {0};
        if (cove_snapshot_capture_tree(st, "bench", "s3", NULL, fd, &s3, &err) < 0) {
                fprintf(stderr, "capture: %s\n", err.msg);
                return 1;
        }
        row_capture("unchanged, no parent (dedup)", &s3);
        close(fd);
        /* The goal: changed, incompressible data at >= 80% of what dd writes and fdatasyncs
         * on the same disk, in the same run (dd before and after the capture: the mean). */
        char rnd[600], ddout[600];
        snprintf(rnd, sizeof(rnd), "%s/rand", dir);
        snprintf(ddout, sizeof(ddout), "%s/dd.out", dir);
        fprintf(stderr, "generating %zu MiB of random data in %s …\n", rand_mb, rnd);
        gen_tree2(rnd, rand_mb, 3, 1);
        uint64_t rbytes = (uint64_t)((rand_mb + 7) / 8) * (8u << 20);
        double dd1 = dd_rate(ddout, (size_t)(rbytes >> 20));
        struct cove_snapshot_stats sr = {0};
        fd = open(rnd, O_RDONLY | O_DIRECTORY);
        struct rusage ru0, ru1, rc0, rc1;
        getrusage(RUSAGE_SELF, &ru0);
        int64_t w0 = cove_mono_ns();
        if (cove_snapshot_capture_tree(st, "bench", "r1", NULL, fd, &sr, &err) < 0) {
                fprintf(stderr, "capture: %s\n", err.msg);
                return 1;
        }
        int64_t w1 = cove_mono_ns();
        getrusage(RUSAGE_SELF, &ru1);
        close(fd);
        /* for `perf record -k monotonic …; perf report --time A,B`: the goal capture alone */
        fprintf(stderr, "goal capture window (CLOCK_MONOTONIC s): %.6f,%.6f\n", (double)w0 / 1e9,
                (double)w1 / 1e9);
        getrusage(RUSAGE_CHILDREN, &rc0);
        double dd2 = dd_rate(ddout, (size_t)(rbytes >> 20));
        getrusage(RUSAGE_CHILDREN, &rc1);
        /* CPU per MB (user + system, all threads): what the load of a shared host does not
         * change much, unlike MB/s */
        double cap_cpu = (double)(ru_ns(&ru1) - ru_ns(&ru0)) / 1e6 / ((double)sr.size_bytes / 1e6);
        double dd_cpu = (double)(ru_ns(&rc1) - ru_ns(&rc0)) / 1e6 / ((double)rbytes / 1e6);
        row_capture("changed, incompressible", &sr);
        if (compare_loose && !store_url) { /* the same data into the format before packs */
                char root2[620];
                snprintf(root2, sizeof(root2), "%s/store-loose", dir);
                struct cove_store_opts o2 = o;
                o2.root = root2;
                o2.backend = NULL;
                o2.fs_loose = 1;
                struct cove_store *st2;
                struct cove_snapshot_stats sl = {0};
                fd = open(rnd, O_RDONLY | O_DIRECTORY);
                if (cove_store_open(&o2, &st2, &err) < 0 ||
                    cove_snapshot_capture_tree(st2, "bench", "r1", NULL, fd, &sl, &err) < 0) {
                        fprintf(stderr, "loose capture: %s\n", err.msg);
                        return 1;
                }
                close(fd);
                cove_store_close(st2);
                row_capture("same, loose files (no packs)", &sl);
        }
        double cap = mbps(sr.size_bytes, sr.ns_total), dd = (dd1 + dd2) / 2;
        getloadavg(la, 3);
        printf("\n| goal | capture MB/s | dd conv=fdatasync MB/s (before / after) | ratio | result "
               "|\n|---|---|---|---|---|\n");
        printf("| capture of changed, incompressible data ≥ 80%% of dd (%zu MiB, load %.2f) | "
               "%.0f | %.0f (%.0f / %.0f) | %.0f%% | %s |\n\n",
               rand_mb, la[0], cap, dd, dd1, dd2, dd > 0 ? 100 * cap / dd : 0,
               dd > 0 && cap >= 0.8 * dd ? "PASS" : "FAIL");
        printf("CPU time per MB (user + system): capture %.2f ms (all its threads; %.2f cores "
               "busy on average), dd %.2f ms (the run after)\n\n",
               cap_cpu,
               sr.ns_total ? cap_cpu * ((double)sr.size_bytes / 1e6) / ((double)sr.ns_total / 1e6)
                           : 0,
               dd_cpu);
        if (json) {
                FILE *jf = fopen(
                    getenv("COVE_BENCH_JSON") ? getenv("COVE_BENCH_JSON") : "/dev/stderr", "w");
                if (jf) {
                        fprintf(jf,
                                "{\"capture_mbps\": %.1f, \"dd_mbps\": %.1f, \"dd_before\": "
                                "%.1f, \"dd_after\": %.1f, \"mb\": %zu, \"load\": %.2f, "
                                "\"capture_cpu_ms_per_mb\": %.2f, \"dd_cpu_ms_per_mb\": %.2f}\n",
                                cap, dd, dd1, dd2, rand_mb, la[0], cap_cpu, dd_cpu);
                        fclose(jf);
                }
        }
        printf(
            "\n(stage columns: MB/s of one thread while in that stage, summed over workers; "
            "write = append to the pack (+ the seal: index, fdatasync, rename, when the worker "
            "cannot hand it to a seal thread), or for loose files create + write + sync + rename; "
            "incremental = files unchanged since the parent are not read)\n\n");
        drop_caches();
        mkdir(dst, 0700);
        fd = open(dst, O_RDONLY | O_DIRECTORY);
        if (cove_snapshot_restore_tree(st, "bench", "s1", fd, &r, &err) < 0) {
                fprintf(stderr, "restore: %s\n", err.msg);
                return 1;
        }
        close(fd);
        int64_t t0 = cove_mono_ns();
        sync();
        uint64_t sync_ns = (uint64_t)(cove_mono_ns() - t0);
        printf("| restore (cold store cache)  | MB/s | read | verify (HMAC) | decrypt | zstd -d | "
               "write |\n");
        printf("|-----------------------------|------|------|---------------|---------|---------|--"
               "-----|\n");
        printf("| verified, not fsynced       | %4.0f | %4.0f | %13.0f | %7.0f | %7.0f | %5.0f |\n",
               mbps(r.size_bytes, r.ns_total), mbps(r.size_bytes, r.ns_read),
               mbps(r.size_bytes, r.ns_hash), mbps(r.size_bytes, r.ns_encrypt),
               mbps(r.size_bytes, r.ns_compress), mbps(r.size_bytes, r.ns_write));
        printf("| + sync of the restored tree | %4.0f |      |               |         |         | "
               "      |\n\n",
               mbps(r.size_bytes, r.ns_total + sync_ns));
        /* idle sandbox: a footprint, snapshotted twice without changes */
        gen_tree(idle, idle_mb, 7);
        fd = open(idle, O_RDONLY | O_DIRECTORY);
        struct cove_snapshot_stats i1 = {0}, i2 = {0};
        if (cove_snapshot_capture_tree(st, "bench", "i1", NULL, fd, &i1, &err) < 0 ||
            cove_snapshot_capture_tree(st, "bench", "i2", "i1", fd, &i2, &err) < 0) {
                fprintf(stderr, "capture: %s\n", err.msg);
                return 1;
        }
        close(fd);
        printf("| idle tree | footprint MB | 1st snapshot stored MB | next snapshot stored bytes | "
               "%% of footprint | capture ms |\n");
        printf("|-----------|--------------|------------------------|----------------------------|-"
               "---------------|------------|\n");
        printf("| %zu MiB   | %12.1f | %22.1f | %26llu | %13.3f%% | %10.1f |\n", idle_mb,
               (double)i1.size_bytes / 1e6, (double)i1.stored_bytes / 1e6,
               (unsigned long long)i2.stored_bytes,
               100.0 * (double)i2.stored_bytes / (double)i1.size_bytes, (double)i2.ns_total / 1e6);
        cove_store_close(st);
        cove_rm_rf(dir, NULL);
        return 0;
}
