/* Node gateway: the running instances of this machine, their guest channels, and the
 * I/O thread that reads every channel (one epoll loop for all sandboxes, bounded work per
 * wake-up so one noisy guest cannot starve the others). Also hands out host uid ranges.
 * Thread-safe. */
#ifndef COVE_NODE_NODE_H
#define COVE_NODE_NODE_H

#include <stdint.h>

#include "node/chan.h"
#include "runtime/runtime.h"
#include "util/err.h"
#include "util/log.h"

#define COVE_UID_RANGE 65536u
#define COVE_UID_FIRST 0x10000000u /* first host uid handed to sandboxes */
/* Ranges handed out host-wide (all coveds of the host together): 16,384 of 65,536 uids, so
 * host uids 0x10000000..0x4fffffff; the last one stays below 2^31 (catalogs keep uid_base in
 * a signed 32-bit column) and inside systemd's container range (0x00080000..0x6fffffff).
 * 4,096 bounded a host to 4,096 live sandboxes. */
#define COVE_UID_SLOTS 16384u
/* Slot s of the uid ranges is held host-wide by the coved holding an OFD write lock on
 * byte s of this file (so several coveds of one host never share a range). */
#define COVE_UID_LOCK_FILE "/run/cove/uid-slots.lock"

struct cove_node;

struct cove_node_config {
        const struct cove_log *log;
        const char *data_dir;                  /* state lives in data_dir/sandboxes/<id> */
        const char *guest_binary;              /* static cove-guest */
        const struct cove_runtime_ops *rt_ops; /* the node's default driver */
        /* A second driver (ns + vm), chosen per instance by spec->runtime; NULL: none. When
         * it cannot run here, instances asking for it fail with its reason. */
        const struct cove_runtime_ops *rt_alt_ops;
        /* Called from the I/O thread when an instance's channel dies on its own (guest
         * exited, protocol violation), not when cove_node_stop() ends it. */
        void (*on_dead)(void *arg, const char *sandbox_id, const char *why);
        /* Called after cove_node_stop() ended an instance (any reason), so node services
         * tied to it (the egress link) go too. May be NULL. */
        void (*on_stop)(void *arg, const char *sandbox_id);
        /* A sandbox program's request relayed by its guest (node/chan.h cove_ask: checked
         * JSON); returns the answer (new reference) sent back. Called on the node's I/O
         * thread, outside its locks. May be NULL (every ask is refused). */
        json_t *(*on_ask)(void *arg, const char *sandbox_id, json_t *ask);
        /* The at-rest key (COVE_RUNTIME_LAYER_KEY_LEN bytes) of sandbox_id's writable layer
         * for owner (a tenant), for the instances of an owner's warm pool; the node wipes it
         * after the start. -1 with the error: KEY_REVOKED or NOT_FOUND drop that pool. Called
         * on the pool thread. May be NULL (no owner pools). */
        int (*layer_key)(void *arg, const char *owner, const char *sandbox_id, uint8_t *key,
                         struct cove_err *err);
        void *arg;
        /* Lock file of the host-wide uid slots; NULL: COVE_UID_LOCK_FILE, "": this process
         * alone (tests that own the host). Opened (its directory made) by cove_node_new,
         * which fails when root cannot open it; a coved that is not root runs without. */
        const char *uid_lock_file;
        /* A pool grown past its size (cove_node_pool_add_max) shrinks back after this long
         * without a take (<= 0: 60 s). */
        int pool_idle_ms;
};

struct cove_node *cove_node_new(const struct cove_node_config *cfg, struct cove_err *err);
/* Stops every instance (purge=0) and the I/O thread. */
void cove_node_free(struct cove_node *n);
const char *cove_node_runtime_name(const struct cove_node *n); /* the default */
/* 0 when runtime (a driver name) can start instances here; else -1 with the reason
 * (UNAVAILABLE for a known driver that cannot run on this host, BAD_REQUEST otherwise). */
int cove_node_runtime_check(const struct cove_node *n, const char *runtime, struct cove_err *err);

/* Reserve a uid range: a free one (base 0) or, after a restart, a given one. Ranges are
 * exclusive across every coved of the host (COVE_UID_LOCK_FILE) and held until released or
 * the process ends. Returns 0 and *base, or -1 (LIMIT when none is free, CONFLICT when
 * taken, here or by another coved). */
int cove_node_uid_reserve(struct cove_node *n, uint32_t *base, struct cove_err *err);
void cove_node_uid_release(struct cove_node *n, uint32_t base);

/* Start an instance (spec->state_dir and guest_binary are filled by the node; spec->runtime
 * NULL = the default driver), shake
 * hands with its guest and start reading its channel. */
int cove_node_start(struct cove_node *n, struct cove_instance_spec *spec, struct cove_err *err);
/* The channel of a running instance, referenced (cove_chan_unref when done), or NULL. */
struct cove_chan *cove_node_chan(struct cove_node *n, const char *sandbox_id);
int cove_node_freeze(struct cove_node *n, const char *sandbox_id, int freeze, struct cove_err *err);

/* Guest self-freeze (docs/cluster.md, "Leases and fencing"): every guest is told ttl_ms and
 * the node sends each a heartbeat every heartbeat_ms (<= 0: ttl_ms / 4); a guest that heard
 * none for ttl_ms freezes every process of its sandbox but itself until a thaw. ttl_ms 0:
 * off (the default, and role all: no heartbeats, no guest thread). Instances started after
 * the call and pooled ones taken after it are told (before they run anything). */
void cove_node_fence_config(struct cove_node *n, int ttl_ms, int heartbeat_ms);
/* paused: stop sending heartbeats (the cluster agent cannot confirm its lease); 0: resume.
 * Heartbeats run (once the fence is on) until the first pause. */
void cove_node_heartbeat_pause(struct cove_node *n, int paused);
/* Lift the self-freeze of sandbox_id's guest (NULL: of every instance; tests) after the
 * node re-confirmed its lease and the sandbox is still its own. 0 once the guest says it
 * is no longer frozen (also when it was not), -1 with err (CONFLICT: no instance). */
int cove_node_thaw_fenced(struct cove_node *n, const char *sandbox_id, struct cove_err *err);
/* Stop the instance if any (wakes every stream of it); with purge remove its state dir.
 * Then, also without an instance, clear what a crashed coved may have left. */
int cove_node_stop(struct cove_node *n, const char *sandbox_id, int purge, struct cove_err *err);
/* The fast stop of a DELETE: when this returns 0 the instance's channel is closed and each
 * of its processes has SIGKILL pending (the driver's kill op; drivers without one get
 * cove_node_stop()); the rest (waiting for them, reaping, unmounts, loop devices, cgroups,
 * the uid range, with purge the state dir)
 * runs on the node's background reaper. A cove_node_stop() of the id meanwhile waits for
 * the reaper; after a crash in between, the state dir left behind is what coved_reconcile
 * cleans at start. */
int cove_node_kill(struct cove_node *n, const char *sandbox_id, int purge, struct cove_err *err);
int cove_node_count(struct cove_node *n);
/* Host pid of a running instance's init (to reach its namespaces), or 0 when none. */
pid_t cove_node_pid(struct cove_node *n, const char *sandbox_id);
/* held 1: the instance is kept frozen for a hot pause (control/snapshot.h): cove_node_pid
 * says 0, cove_node_chan NULL and cove_node_usage CONFLICT, so nothing (ports, egress,
 * exec, usage) takes it for running, and the host side of its streams ends as at a stop
 * (cove_chan_cut); 0: it runs again. 0, or -1 when there is no instance (holding again
 * is how a caller asks whether the frozen instance still exists). */
int cove_node_hold(struct cove_node *n, const char *sandbox_id, int held);

/* Warm pools (docs/architecture.md §3): keep `size` instances of this template and shape started
 * and shaken hands with, refilled by a background thread, so a create takes one instead of starting
 * one. Pooled instances are ordinary instances with their final id and uid range but belong to no
 * sandbox until taken; a crash leaves them as orphan state dirs, which the restart's reconciliation
 * removes. */
/* owner NULL or "": plain instances. Else an owner's pool (at most
 * COVE_NODE_OWNER_POOLS_MAX, LIMIT beyond): its instances' writable layers are encrypted
 * under cfg.layer_key(owner, id), so only a create for that owner can take them. Adding a
 * pool that exists (also a dropped one) sets its size again. */
#define COVE_NODE_OWNER_POOLS_MAX 32
int cove_node_pool_add(struct cove_node *n, const char *runtime, const char *rootfs, unsigned cpus,
                       unsigned memory_mb, unsigned disk_mb, int size, const char *owner,
                       struct cove_err *err);
/* The same, a pool that grows past size up to max (< size: size) when a burst of creates
 * takes more than it holds (its target becomes the burst's size: the takes and misses since
 * it was last full), and shrinks back to size after cfg.pool_idle_ms without a take (the
 * extra idle instances are stopped). Its refill, while it still holds at least size
 * instances, waits for a short gap in creates (bounded at 1 s); below that (so also empty),
 * it refills at once. */
int cove_node_pool_add_max(struct cove_node *n, const char *runtime, const char *rootfs,
                           unsigned cpus, unsigned memory_mb, unsigned disk_mb, int size, int max,
                           const char *owner, struct cove_err *err);
/* The instances the pools keep now (their targets, grown or not). */
int cove_node_pool_target(struct cove_node *n);
/* Take a ready instance of that shape and owner (NULL/"": a plain one): 0 with its id and
 * uid range (now the caller's, as if cove_node_start had made it), 1 when none is ready
 * (start one cold). */
int cove_node_pool_take(struct cove_node *n, const char *runtime, const char *rootfs, unsigned cpus,
                        unsigned memory_mb, unsigned disk_mb, const char *owner, char *id,
                        size_t cap, uint32_t *uid_base);
/* Drop every pool of owner (its key was revoked): their idle instances are stopped and
 * purged now, nothing is refilled or taken until a cove_node_pool_add() of it. Returns how
 * many instances were stopped. */
int cove_node_pool_drop(struct cove_node *n, const char *owner);
/* The same for every pool of a template rootfs (any owner, runtime and shape): before the
 * template is removed. */
int cove_node_pool_drop_rootfs(struct cove_node *n, const char *rootfs);
/* Time machine passthroughs to the runtime (runtime.h documents them). snapshot: -1 with
 * UNAVAILABLE when the runtime cannot, CONFLICT when the sandbox has no instance. */
int cove_node_layer_snapshot(struct cove_node *n, const char *sandbox_id, const char *dest_image,
                             uint64_t *pause_ns, struct cove_err *err);
const char *cove_node_layer_dir(struct cove_node *n); /* NULL when unsupported */
int cove_node_layer_open(struct cove_node *n, const char *image, int create, unsigned disk_mb,
                         const uint8_t *key, int *tree_fd, struct cove_layer_handle **h,
                         struct cove_err *err);
void cove_node_layer_close(struct cove_node *n, struct cove_layer_handle *h);

/* Full snapshots (runtime.h full_*): 1 available, 0 not (why says), -1 self-check running. */
int cove_node_full_status(struct cove_node *n, char *why, size_t cap);
/* The same, after waiting (at most timeout_ms) for the start-up self-check to finish. */
int cove_node_full_wait(struct cove_node *n, int timeout_ms, char *why, size_t cap);
/* A full snapshot of a running instance: layer image at dest_image and checkpoint directory
 * at dest_mem; leave_frozen: the instance stays frozen (the caller stops it or thaws it with
 * cove_node_freeze). UNAVAILABLE when the runtime cannot, CONFLICT without an instance. */
int cove_node_full_dump(struct cove_node *n, const char *sandbox_id, const char *dest_image,
                        const char *dest_mem, int leave_frozen, uint64_t *pause_ns,
                        struct cove_err *err);
/* Full snapshot passthrough (runtime.h): -1 with UNAVAILABLE when the instance's runtime
 * has none, CONFLICT when the sandbox has no instance. cove_node_has_full: 1 when the
 * sandbox's running instance can take one. */
int cove_node_full_snapshot(struct cove_node *n, const char *sandbox_id, int out_fd,
                            uint64_t *pause_ns, struct cove_err *err);
int cove_node_has_full(struct cove_node *n, const char *sandbox_id);

/* A TCP connection to port inside sandbox_id's running instance (its network namespace:
 * ns to its loopback, vm to COVE_NODE_VM_GUEST_ADDR), made within timeout_ms; *fd is
 * blocking. runtime: the sandbox's ("ns"/"vm"). -1 with CONFLICT (not running here),
 * NOT_FOUND (nothing listens there) or UNAVAILABLE. */
#define COVE_NODE_VM_GUEST_ADDR 0xa9fe6402u /* 169.254.100.2: the guest's eth0 behind QEMU */
int cove_node_port_connect(struct cove_node *n, const char *sandbox_id, const char *runtime,
                           uint16_t port, int timeout_ms, int *fd, struct cove_err *err);

/* Abort every TCP connection of sandbox_id's running instance that leaves it (not both ends
 * on loopback), through sock_diag's SOCK_DESTROY in its network namespace: its processes
 * get ECONNABORTED at the next use, as after a restore (runtime/criu.h --tcp-close). For a
 * hot pause (control/snapshot.h), whose frozen instance keeps its sockets. *count: how many.
 * -1 with CONFLICT (no instance) or UNAVAILABLE (the kernel refused: no
 * CONFIG_INET_DIAG_DESTROY). */
int cove_node_tcp_abort(struct cove_node *n, const char *sandbox_id, unsigned *count,
                        struct cove_err *err);

void cove_node_pool_stats(struct cove_node *n, int *ready, uint64_t *taken, uint64_t *missed);
int cove_node_usage(struct cove_node *n, const char *sandbox_id, uint64_t *mem, uint64_t *cpu,
                    struct cove_err *err);

#endif
