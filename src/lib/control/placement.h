/* Placement (docs/cluster.md "Placement"): which node a sandbox starts, resumes or recovers
 * on. Role control only. Best of K ready nodes with a live lease, by free capacity (cpus,
 * memory, disk: what a node announced minus what is placed on it), filtered by what the
 * sandbox needs (runtime, template, a full snapshot's compatibility), preferring the node
 * that holds the sandbox's chunks, never the one to avoid, and with a cap on the starts in
 * flight per node. */
#ifndef COVE_CONTROL_PLACEMENT_H
#define COVE_CONTROL_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "store/catalog.h"
#include "util/err.h"

struct coved;

struct coved_place_want {
        const char *runtime; /* "ns"/"vm"; NULL = any */
        const char *template_name;
        int cpus, memory_mb, disk_mb;
        int need_full;         /* restoring a full snapshot: a compatible node */
        const char *full_from; /* the features JSON of the node that took it (NULL: none) */
        const char *prefer;    /* a node to prefer (holds the chunks), NULL */
        const char *avoid;     /* a node not to use (draining/lost one), NULL */
};

/* 0 with node (the chosen one's name), 1 with *why when none fits: the caller answers 503
 * unavailable with why; -1 on error (the catalog). Reads the nodes and the starts in flight
 * (open start, resume and recover jobs per node: job_counts) from the catalog; K, the cap
 * and the cpu overcommit (a node takes cpu_overcommit × its cpus) are in d->nodes_opt. */
/* Every node row of the catalog (node_list), copied: free(x->v) when done. 0, or -1 with
 * err (x->v NULL). */
struct coved_node_rows {
        struct cove_node_row *v;
        size_t n, cap;
};
int coved_nodes_read(struct coved *d, struct coved_node_rows *x, struct cove_err *err);
/* The catalog's row of node name into *out: 0, 1 when there is none, -1 with err. */
int coved_node_get(struct coved *d, const char *name, struct cove_node_row *out,
                   struct cove_err *err);

int coved_place(struct coved *d, const struct coved_place_want *w, char node[64], char *why,
                size_t why_cap, struct cove_err *err);

/* The decision itself, on rows (exported for the unit tests): rows by name, starts[i] the
 * starts in flight on rows[i] (NULL: none), now_ms the clock leases are compared with,
 * k >= 1 the sample size (the best of k eligible nodes drawn with seed; every eligible node
 * when there are at most k), max_starts 0 = no cap. Ties go to the smaller name. Same
 * answers as coved_place (never -1). */
int coved_place_rows(const struct cove_node_row *rows, size_t n, const int *starts, int64_t now_ms,
                     int k, int max_starts, uint64_t seed, const struct coved_place_want *w,
                     char node[64], char *why, size_t why_cap);

#endif
