/* Per-sandbox cgroups for the ns runtime: memory, CPU, pids and freezer limits under
 * `cove/<sandbox_id>`, on cgroup v1, v2 or hybrid hosts (hybrid: the v1 controllers are used
 * and the empty v2 mount is ignored). The layout is probed once by cove_cgroups_open(). */
#ifndef COVE_RUNTIME_CGROUP_H
#define COVE_RUNTIME_CGROUP_H

#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

struct cove_cgroups;

struct cove_cgroup_limits {
        unsigned cpus;      /* whole CPUs, 0 = no limit */
        unsigned memory_mb; /* 0 = no limit */
        unsigned pids_max;  /* 0 = no limit */
};

/* Probe the host layout. Caller frees with cove_cgroups_free(). NULL + err when no usable
 * memory/pids/freezer controllers are found. */
struct cove_cgroups *cove_cgroups_open(struct cove_err *err);
void cove_cgroups_free(struct cove_cgroups *cg);
/* "v1" or "v2". */
const char *cove_cgroups_mode(const struct cove_cgroups *cg);

/* Create cove/<id> in every hierarchy and apply the limits. On failure nothing is left. */
int cove_cgroup_create(const struct cove_cgroups *cg, const char *id,
                       const struct cove_cgroup_limits *lim, struct cove_err *err);
/* Move pid into cove/<id> in every hierarchy. */
int cove_cgroup_attach(const struct cove_cgroups *cg, const char *id, pid_t pid,
                       struct cove_err *err);
/* Freeze (frozen=1) or thaw every task of cove/<id>; returns once the state is reached. */
int cove_cgroup_freeze(const struct cove_cgroups *cg, const char *id, int frozen,
                       struct cove_err *err);
/* SIGKILL every task of cove/<id> (thawing it first) until the group is empty (bounded wait
 * of ~5 s; fails with EBUSY if tasks remain). A missing group is not an error. */
int cove_cgroup_kill(const struct cove_cgroups *cg, const char *id, struct cove_err *err);
/* rmdir cove/<id> everywhere; a missing group is not an error. */
int cove_cgroup_remove(const struct cove_cgroups *cg, const char *id, struct cove_err *err);
/* Memory in use (bytes) and CPU time consumed (usec). */
int cove_cgroup_usage(const struct cove_cgroups *cg, const char *id, uint64_t *mem_bytes,
                      uint64_t *cpu_usec, struct cove_err *err);
/* Whether cove/<id> exists in any hierarchy (for tests and reconciliation). */
int cove_cgroup_exists(const struct cove_cgroups *cg, const char *id);

/* The directory of cove/<id> in the freezer hierarchy (for CRIU's --freeze-cgroup). */
int cove_cgroup_freezer_dir(const struct cove_cgroups *cg, const char *id, char *out, size_t cap);

#endif
