/* Placement transactions per second: one cycle is what the control plane and a node do for
 * one lifecycle change (placement_write with a job, job_claim, job_finish: three
 * transactions), on SQLite (the --role all default) and PostgreSQL (the cluster) in the same
 * run, by 1 and by C concurrent clients (each its own handle, as separate processes would
 * be). Also the idle cost of a node's lease renew. Figures only, never a verdict.
 * Usage: cluster_bench --pg URL [--sqlite PATH] [--n CYCLES] [--clients C] */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/catalog.h"
#include "util/util.h"

struct worker {
        const struct cove_catalog_ops *ops;
        struct cove_catalog *c;
        int id, n, errors;
        int64_t epoch;
        pthread_barrier_t *go;
};

static void *cycle_loop(void *arg)
{
        struct worker *w = arg;
        struct cove_err err = {0};
        char node[32], sbx[64];
        snprintf(node, sizeof(node), "bench-%d", w->id);
        pthread_barrier_wait(w->go);
        for (int i = 0; i < w->n; i++) {
                snprintf(sbx, sizeof(sbx), "sbx_b%d_%d", w->id, i);
                int64_t gen = 0, job = 0;
                struct cove_job_row j;
                if (w->ops->placement_write(w->c, sbx, node, "running", "start", NULL, 0, &gen,
                                            &job, &err) < 0 ||
                    w->ops->job_claim(w->c, node, w->epoch, &j, &err) != 0) {
                        w->errors++;
                        continue;
                }
                if (w->ops->job_finish(w->c, j.id, node, w->epoch, j.generation, 1, NULL, &err) < 0)
                        w->errors++;
                cove_job_row_clear(&j);
        }
        if (w->errors)
                fprintf(stderr, "worker %d: %d errors, last: %s\n", w->id, w->errors, err.msg);
        return NULL;
}

/* cycles/s with `clients` handles on dsn (node names offset by base, so runs never meet) */
static double run(const struct cove_catalog_ops *ops, const char *dsn, int clients, int n, int base,
                  int *errors)
{
        struct worker w[16];
        pthread_t t[16];
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, (unsigned)clients + 1);
        struct cove_err err = {0};
        for (int i = 0; i < clients; i++) {
                w[i] = (struct worker){.ops = ops, .id = base + i, .n = n, .go = &go};
                w[i].c = ops->open(dsn, &err);
                if (!w[i].c) {
                        fprintf(stderr, "open %s: %s\n", ops->name, err.msg);
                        exit(1);
                }
                struct cove_node_row nr = {.cpus = 8, .memory_mb = 16384, .disk_mb = 100000};
                snprintf(nr.name, sizeof(nr.name), "bench-%d", base + i);
                if (ops->node_lease_acquire(w[i].c, &nr, 600000, &w[i].epoch, NULL, &err) < 0) {
                        fprintf(stderr, "lease: %s\n", err.msg);
                        exit(1);
                }
                pthread_create(&t[i], NULL, cycle_loop, &w[i]);
        }
        pthread_barrier_wait(&go);
        int64_t t0 = cove_mono_ns();
        for (int i = 0; i < clients; i++)
                pthread_join(t[i], NULL);
        double s = (double)(cove_mono_ns() - t0) / 1e9;
        *errors = 0;
        for (int i = 0; i < clients; i++) {
                *errors += w[i].errors;
                ops->close(w[i].c);
        }
        pthread_barrier_destroy(&go);
        return (double)clients * n / s;
}

static double renew_us(const struct cove_catalog_ops *ops, const char *dsn, int n)
{
        struct cove_err err = {0};
        struct cove_catalog *c = ops->open(dsn, &err);
        struct cove_node_row nr = {.name = "bench-renew"};
        int64_t epoch = 0, exp = 0;
        if (!c || ops->node_lease_acquire(c, &nr, 600000, &epoch, &exp, &err) < 0) {
                fprintf(stderr, "renew setup: %s\n", err.msg);
                exit(1);
        }
        int64_t t0 = cove_mono_ns();
        for (int i = 0; i < n; i++)
                if (ops->node_lease_renew(c, "bench-renew", epoch, 600000, &exp, &err) < 0)
                        fprintf(stderr, "renew: %s\n", err.msg);
        double us = (double)(cove_mono_ns() - t0) / 1e3 / n;
        ops->close(c);
        return us;
}

int main(int argc, char **argv)
{
        const char *pg = NULL, *sqlite = NULL;
        int n = 300, clients = 4;
        static const struct option opts[] = {{"pg", required_argument, 0, 'p'},
                                             {"sqlite", required_argument, 0, 's'},
                                             {"n", required_argument, 0, 'n'},
                                             {"clients", required_argument, 0, 'c'},
                                             {0, 0, 0, 0}};
        int o;
        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                if (o == 'p')
                        pg = optarg;
                else if (o == 's')
                        sqlite = optarg;
                else if (o == 'n')
                        n = atoi(optarg);
                else if (o == 'c')
                        clients = atoi(optarg);
                else
                        return 2;
        }
        if (!pg || n < 1 || clients < 1 || clients > 16) {
                fprintf(stderr, "usage: cluster_bench --pg URL [--sqlite PATH] [--n CYCLES] "
                                "[--clients 1..16]\n");
                return 2;
        }
        char tmpdir[] = "/tmp/cove-cluster-bench-XXXXXX", path[128];
        if (!sqlite) {
                if (!mkdtemp(tmpdir))
                        return 1;
                snprintf(path, sizeof(path), "%s/catalog.db", tmpdir);
                sqlite = path;
        }
        double load[3] = {0};
        getloadavg(load, 3);
        printf("cluster_bench: %d cycles per client (placement_write + job_claim + job_finish "
               "= 3 transactions each); load %.2f %.2f %.2f\n",
               n, load[0], load[1], load[2]);
        struct {
                const struct cove_catalog_ops *ops;
                const char *dsn;
        } be[] = {{&cove_catalog_sqlite, sqlite}, {&cove_catalog_pg, pg}};
        double res[2][2];
        int errs = 0, e;
        for (int b = 0; b < 2; b++) {
                res[b][0] = run(be[b].ops, be[b].dsn, 1, n, 100 * b, &e);
                errs += e;
                res[b][1] = run(be[b].ops, be[b].dsn, clients, n, 100 * b + 10, &e);
                errs += e;
                printf("  %-8s 1 client: %7.0f cycles/s (%6.0f tx/s)   %d clients: %7.0f "
                       "cycles/s (%6.0f tx/s)   lease renew %.0f us\n",
                       be[b].ops->name, res[b][0], 3 * res[b][0], clients, res[b][1], 3 * res[b][1],
                       renew_us(be[b].ops, be[b].dsn, n));
        }
        printf("  ratio postgres/sqlite: %.2f (1 client), %.2f (%d clients)\n",
               res[1][0] / res[0][0], res[1][1] / res[0][1], clients);
        getloadavg(load, 3);
        printf("  load after: %.2f %.2f %.2f; errors: %d\n", load[0], load[1], load[2], errs);
        if (sqlite == path)
                cove_rm_rf(tmpdir, NULL);
        return errs ? 1 : 0;
}
