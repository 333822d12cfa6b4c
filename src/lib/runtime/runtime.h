/* Runtime drivers: how a sandbox instance is started, frozen and stopped.
 * One struct cove_runtime_ops per driver (ns now, vm later), chosen per sandbox.
 * A driver gives the node a running cove-guest and the node end of its guest channel;
 * everything after the handshake is the node's business (node/). */
#ifndef COVE_RUNTIME_RUNTIME_H
#define COVE_RUNTIME_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

/* Bytes of a writable layer's at-rest key (spec->layer_key, layer_open()). */
#define COVE_RUNTIME_LAYER_KEY_LEN 64

/* A writable layer opened outside any instance, to read it (capture) or fill it (restore). */
struct cove_layer_handle;
/* layer_open()'s create: 0 read-only, 1 a new empty image; COVE_LAYER_OPEN_CLONE an image
 * file the caller has just made (a reflink clone of a clean layer_snapshot() image, that no
 * mount uses), opened read-write as it is, for a start to run on that mount. */
#define COVE_LAYER_OPEN_CLONE 2

/* What a driver needs to start one instance. All strings are borrowed for the call. */
struct cove_instance_spec {
        const char *sandbox_id;   /* sbx_…; also the hostname */
        const char *runtime;      /* driver name for the node to pick ("ns", "vm"); NULL: default */
        const char *rootfs;       /* template rootfs directory (read-only lower layer) */
        const char *state_dir;    /* per-sandbox directory the driver owns (upper, work, …) */
        const char *guest_binary; /* absolute path of the static cove-guest binary */
        unsigned cpus;            /* CPU limit in whole CPUs (0 = no limit) */
        unsigned memory_mb;       /* memory limit (0 = no limit) */
        unsigned disk_mb;         /* writable layer size limit (0 = no limit) */
        unsigned pids_max;        /* process limit (0 = driver default) */
        uint32_t uid_base;        /* first host uid/gid of this sandbox's private range */
        uint32_t uid_count;       /* size of the range (65536) */
        /* Restore (resume, rewind, fork): a layer image made by layer_snapshot() or
         * layer_open(create = 1); start() uses it as the writable layer (taking it over: the
         * file is renamed, or copied and removed when outside layer_dir(); the caller must not
         * use the path afterwards, also when start() fails: the image is then deleted). It
         * replaces any layer this sandbox id had; the image's size is the disk limit (disk_mb
         * is ignored); the warm pool is not used. Refused (COVE_E_CONFLICT) while the image
         * is still open (close tree_fd and layer_close() first), unless its handle is given
         * as layer_handle. NULL: empty layer. */
        const char *layer_image;
        /* With layer_image: the handle layer_open(create = 1) returned for it, still open (its
         * tree fd closed). start() takes it over, also when it fails (the node releases it
         * when the driver is not the one that opened it), and runs the instance on that very
         * mount: no unmount and second mount of the image. NULL: start() mounts the image. */
        struct cove_layer_handle *layer_handle;
        /* Full restore (ns with CRIU): the checkpoint directory made by full_dump() together
         * with layer_image; start() restores the processes from it instead of booting
         * cove-guest, and takes the directory over like layer_image (removed afterwards, also
         * on failure). The instance comes back with inst->rechannel set. NULL: cold start. */
        const char *mem_image;
        /* 64 bytes: encrypt the writable layer at rest with this key (ns: fscrypt v2 on the
         * layer's upper and work dirs, set while they are still empty on a new layer, warm
         * or built; a restored image has its policy already). The same key
         * must be given to layer_open() for images of this layer. NULL: not encrypted. */
        const uint8_t *layer_key;
        /* vm: the disk overlay is encrypted at rest (a LUKS qcow2). The driver asks disk_key
         * for the 32-byte key of a disk by the id its key is derived for: the sandbox id
         * for a new disk, for a restored one the id recorded in the full snapshot image
         * (the sandbox that created the disk's lineage: a fork keeps its source's disk key).
         * disk_key fills key (the driver wipes it) or fails with err (e.g. KEY_REVOKED).
         * A full image whose disk is (not) encrypted is refused unless this says the same. */
        int disk_encrypted;
        int (*disk_key)(void *ctx, const char *disk_id, uint8_t key[32], struct cove_err *err);
        void *disk_key_ctx;
        /* Restore from a full snapshot (live memory + disk, see full_snapshot): with full set,
         * full_fd is a readable image written by full_snapshot() (borrowed: the caller closes
         * it after start()). Only drivers with full_snapshot take it. */
        int full;
        int full_fd;
};

/* A running instance. The driver fills it in start() and owns priv. */
struct cove_instance {
        pid_t pid;   /* host pid of the instance's init (cove-guest, or QEMU for vm) */
        int chan_fd; /* node end of the guest channel; the node takes it (sets -1) */
        /* restored from a checkpoint: chan_fd is a temporary channel; the node moves the
         * guest to a new one (cove_frame_rechannel) before the handshake */
        int rechannel;
        void *priv; /* driver state */
};

struct cove_runtime;

struct cove_runtime_ops {
        const char *name; /* "ns", "vm" */
        /* Set up driver-wide state under data_dir (e.g. the quota filesystem). Returns NULL
         * with err when the driver cannot run on this host (err says why). */
        struct cove_runtime *(*open)(const char *data_dir, struct cove_err *err);
        void (*close)(struct cove_runtime *rt);
        /* Start an instance; on success *inst is filled and cove-guest is running with the
         * channel's other end as fd 3 (handshake not done yet). On failure nothing is left
         * behind (no process, mount, cgroup). */
        int (*start)(struct cove_runtime *rt, const struct cove_instance_spec *spec,
                     struct cove_instance *inst, struct cove_err *err);
        /* Freeze/thaw every process of the instance. */
        int (*freeze)(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err);
        int (*thaw)(struct cove_runtime *rt, struct cove_instance *inst, struct cove_err *err);
        /* Kill every process, reap, remove mounts, cgroups and quota; with purge also the
         * state dir. Safe to call twice. Frees inst->priv. */
        int (*stop)(struct cove_runtime *rt, struct cove_instance *inst, const char *sandbox_id,
                    const char *state_dir, int purge, struct cove_err *err);
        /* Optional: SIGKILL every process of the instance now (none runs user code after
         * this returns) without waiting for them to exit, leaving the wait, reaping, mounts,
         * cgroups and quota to a stop() that must follow (with the same arguments; a crash
         * in between is a cleanup_stale() case). Without it a caller
         * that wants a fast answer calls stop() instead. */
        int (*kill)(struct cove_runtime *rt, struct cove_instance *inst, const char *sandbox_id,
                    struct cove_err *err);
        /* After a crash of coved: remove whatever an instance of sandbox_id may have left
         * (processes in its cgroup, mounts, cgroups, quota) without an instance struct. */
        int (*cleanup_stale)(struct cove_runtime *rt, const char *sandbox_id, const char *state_dir,
                             int purge, struct cove_err *err);
        /* Usage read from the host side (cgroup): memory bytes, cpu usec. Optional. */
        int (*usage)(struct cove_runtime *rt, struct cove_instance *inst, uint64_t *mem_bytes,
                     uint64_t *cpu_usec, struct cove_err *err);

        /* ---- time machine (files snapshots; see docs/storage.md) ------------------------
         * Capture the instance's writable layer, consistently, as an image file at dest (on
         * the driver's layer filesystem; ns: a reflink clone of the layer's ext4 image, the
         * state a power cut at that instant would leave, its journal then replayed). The
         * instance's I/O is held only for that moment: *pause_ns says how long. Optional
         * (NULL: the runtime cannot snapshot). ns: dest must not exist (EEXIST) and be under
         * layer_dir() to be a clone; COVE_E_CONFLICT for a sandbox without disk_mb. */
        int (*layer_snapshot)(struct cove_runtime *rt, struct cove_instance *inst,
                              const char *sandbox_id, const char *dest_image, uint64_t *pause_ns,
                              struct cove_err *err);
        /* Where layer images live (dest_image paths must be under it). */
        const char *(*layer_dir)(struct cove_runtime *rt);
        /* Open an image read-only (capture: *tree_fd is a directory fd of the layer's upper
         * tree, the files the sandbox changed, overlay whiteouts included), or create an
         * empty one of disk_mb at path and open it read-write (restore: fill *tree_fd, then
         * close; the image can then be a spec->layer_image, and the handle, instead of
         * layer_close, its spec->layer_handle), or (create = COVE_LAYER_OPEN_CLONE) open a
         * clone the caller just made read-write, its handle for a start the same way. layer_close
         * releases mounts and loop devices (no sync: the unmount writes back); the image file
         * stays. Ownership contract (ns): the tree stores *sandbox* ids, 0..65535 (root is 0, the
         * template's user 1000 is 1000), never host ids: a capture reads them as they are and
         * a restore writes them as they are (as host root: chown, mknod 0/0 whiteouts,
         * user.overlay.* xattrs, modes); the driver maps them to the instance's uid_base
         * through an idmapped mount, so an image is valid for any sandbox (fork, resume on
         * another uid range) without a chown. The mount is detached (no path, root only):
         * it lives until layer_close() and the close of *tree_fd and of every fd opened
         * under it; close those first. Images from layer_snapshot() and full_dump() are
         * clean (their journal replayed). */
        int (*layer_open)(struct cove_runtime *rt, const char *image, int create, unsigned disk_mb,
                          const uint8_t *key, int *tree_fd, struct cove_layer_handle **h,
                          struct cove_err *err); /* key: as spec->layer_key */
        void (*layer_close)(struct cove_runtime *rt, struct cove_layer_handle *h);

        /* ---- full snapshots (files + memory + processes; optional, ns: CRIU) -------------
         * 1 when full snapshots work on this node, 0 when not (why says), -1 while the
         * start-up self-check still runs. */
        int (*full_status)(struct cove_runtime *rt, char *why, size_t cap);
        /* The start-up self-check (a real dump and restore of a sandbox-shaped instance);
         * the node runs it once, on a thread of its own, after open(). */
        void (*full_selfcheck)(struct cove_runtime *rt, const char *guest_binary);
        /* Optional: whether sandboxes see their own size in /proc/meminfo, cpuinfo, ... (1)
         * or the host's (0); why says how or why not (logged once at start). */
        int (*host_view)(struct cove_runtime *rt, char *why, size_t cap);
        /* A consistent full snapshot: the instance is frozen, its processes dumped (a
         * checkpoint directory created at dest_mem: CRIU's images and the driver's metadata)
         * and its layer cloned (dest_image, as layer_snapshot), then thawed; *pause_ns is
         * freeze to thaw. The instance keeps running, or with leave_frozen stays frozen (a
         * pause: nothing may run after the state it resumes from; the caller stops the
         * instance, or thaws it with thaw()). On failure neither exists and it runs on. */
        int (*full_dump)(struct cove_runtime *rt, struct cove_instance *inst,
                         const char *sandbox_id, const char *dest_image, const char *dest_mem,
                         int leave_frozen, uint64_t *pause_ns, struct cove_err *err);
        /* ---- full snapshots (live memory; vm) ------------------------------------------
         * Write the instance's whole state (memory, devices, disk) as one image into out_fd
         * (a regular file, empty, read-write) while the instance is stopped; it then runs on.
         * *pause_ns says how long it was stopped. A sandbox started with spec->full on that
         * image continues exactly there (a counter in RAM goes on). Optional (NULL). */
        int (*full_snapshot)(struct cove_runtime *rt, struct cove_instance *inst, int out_fd,
                             uint64_t *pause_ns, struct cove_err *err);
        /* ---- housekeeping (optional) ----------------------------------------------------
         * Remove what older builds left that nothing can use any more (vm: template
         * snapshots of an older template rootfs, kernel or guest, and their initramfs files),
         * keeping whatever a disk in a state dir under state_root still backs onto. The node
         * calls it once after open(), before any instance starts. Returns the number of items
         * removed (*freed_bytes: their allocated size), or -1 with err. */
        int (*collect)(struct cove_runtime *rt, const char *guest_binary, const char *state_root,
                       uint64_t *freed_bytes, struct cove_err *err);
};

extern const struct cove_runtime_ops cove_runtime_ns;
extern const struct cove_runtime_ops cove_runtime_vm; /* runtime/vm.h */

#endif
