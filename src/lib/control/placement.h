/* Where a sandbox goes in a cluster (role control): a node chosen for a create, a resume or
 * a move. docs/cluster.md "Placement". */
#ifndef COVE_CONTROL_PLACEMENT_H
#define COVE_CONTROL_PLACEMENT_H

#include <stddef.h>

#include "control/coved.h"
#include "util/err.h"

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
 * unavailable with why; -1 on error. */
int coved_place(struct coved *d, const struct coved_place_want *w, char node[64], char *why,
                size_t why_cap, struct cove_err *err);

#endif
