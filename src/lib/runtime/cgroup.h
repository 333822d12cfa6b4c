/* Per-sandbox cgroups for the ns runtime: memory, CPU, pids and freezer limits under
 * `cove/<sandbox_id>` (and a cpuset where the host has one), on cgroup v1, v2 or hybrid hosts
 * (hybrid: the v1 controllers are used and the empty v2 mount is ignored). The layout is probed
 * once by cove_cgroups_open(). */
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
        /* > 0: the workload gets a child group cove/<id>/work of its own with memory_mb less
         * this much (at most half of memory_mb), while cove/<id> (where the sandbox's PID 1
         * stays) has memory_mb: an OOM of the workload then ends inside work, never with PID
         * 1 (see cove_cgroup_work_*) */
        unsigned guest_reserve_mb;
        /* 1: pin the group to `cpus` of the host's CPUs (cpuset), so that what runs there
         * counts that many (nproc, sysconf, /proc/cpuinfo through lxcfs); the CPUs are picked
         * by the id, spreading sandboxes over the host */
        int cpu_view;
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
/* Give an attach a head start, best effort: every move of a task between cgroups takes the
 * kernel's global cgroup_threadgroup_rwsem for writing, and the first writer after a quiet
 * spell waits for an RCU grace period (~10 ms here) before it gets it; a writer within about a
 * grace period of the previous one passes at once. cove_cgroup_prime() starts that wait now,
 * from a thread that "moves" coved into the cgroup it is in already (a no-op the kernel locks
 * all the same) and repeats it every few ms, so the attach of a sandbox cloned meanwhile finds
 * the lock ready; cove_cgroup_prime_end() stops it (call it right after the attach; the
 * thread also gives up after 2 s). The kernel holds cgroup_mutex through that wait, as for
 * any attach: create the group first, then prime. NULL when not possible (the hierarchy's mount
 * does not show the whole tree, so coved's own group cannot be named safely): no head start. Each
 * repeat holds the lock for microseconds (forks on the host wait that long). */
struct cove_cgroup_primer;
struct cove_cgroup_primer *cove_cgroup_prime(const struct cove_cgroups *cg);
void cove_cgroup_prime_end(struct cove_cgroup_primer *p);
/* Freeze (frozen=1) or thaw every task of cove/<id>; returns once the state is reached. */
int cove_cgroup_freeze(const struct cove_cgroups *cg, const char *id, int frozen,
                       struct cove_err *err);
/* SIGKILL every task of cove/<id> (thawing it first) until the group is empty (bounded wait
 * of ~5 s; fails with EBUSY if tasks remain). A missing group is not an error. */
int cove_cgroup_kill(const struct cove_cgroups *cg, const char *id, struct cove_err *err);
/* One pass of the above without the wait: SIGKILL every task of cove/<id> listed now
 * (cgroup.kill on v2) and thaw it, then return. A missing group is not an error. */
int cove_cgroup_signal_kill(const struct cove_cgroups *cg, const char *id, struct cove_err *err);
/* rmdir cove/<id> everywhere; a missing group is not an error. */
int cove_cgroup_remove(const struct cove_cgroups *cg, const char *id, struct cove_err *err);
/* Memory in use (bytes) and CPU time consumed (usec). */
int cove_cgroup_usage(const struct cove_cgroups *cg, const char *id, uint64_t *mem_bytes,
                      uint64_t *cpu_usec, struct cove_err *err);
/* Whether cove/<id> exists in any hierarchy (for tests and reconciliation). */
int cove_cgroup_exists(const struct cove_cgroups *cg, const char *id);

/* The workload's group (limits.guest_reserve_mb). The sandbox sees its group of the memory
 * hierarchy (cove/<id>) as a bind mount at COVE_GUEST_CGROUP_DIR (guest/guest.h); each process
 * PID 1 starts writes "0" to work/tasks there (v1; work/cgroup.procs on v2) before it execs.
 * cove_cgroup_work_dir(): the host path of that group, -1 when there is no memory controller (no
 * work group). */
int cove_cgroup_work_dir(const struct cove_cgroups *cg, const char *id, char *out, size_t cap);
/* Let uid (the sandbox's root on the host) move its processes into work: chown of
 * work/cgroup.procs (v1: also of work/tasks; v2: also of cove/<id>/cgroup.procs, the common
 * ancestor's, which the kernel checks; the no-internal-process rule keeps them out of cove/<id>
 * itself; and of work/cgroup.freeze, for the guest's self-freeze). */
int cove_cgroup_work_delegate(const struct cove_cgroups *cg, const char *id, uid_t uid,
                              struct cove_err *err);
/* v2 only (a no-op on v1): move pid (the sandbox's PID 1, in cove/<id> while it set up its
 * cgroup namespace) into cove/<id>/guest and turn the memory controller on for cove/<id>'s
 * children, which applies work's limit. */
int cove_cgroup_work_split(const struct cove_cgroups *cg, const char *id, pid_t pid,
                           const struct cove_cgroup_limits *lim, struct cove_err *err);
/* After a restore (every restored task is in cove/<id>): move every task but pid (PID 1)
 * into work (v2: pid into guest first, then the split). */
int cove_cgroup_work_settle(const struct cove_cgroups *cg, const char *id, pid_t pid,
                            const struct cove_cgroup_limits *lim, struct cove_err *err);

/* The directory of cove/<id> in the freezer hierarchy (for CRIU's --freeze-cgroup). */
int cove_cgroup_freezer_dir(const struct cove_cgroups *cg, const char *id, char *out, size_t cap);

#endif
