/* CRIU for full snapshots of ns sandboxes (docs/storage.md "Full snapshots").
 *
 * CRIU is optional: coved finds a criu binary (COVE_CRIU=/path, or "off" to hide it; else
 * /usr/local/sbin/criu, /usr/sbin/criu), wants version >= 4 and `criu check` to pass, and the
 * ns driver then runs a real dump and restore of a sandbox-shaped instance (runtime/ns.c)
 * before it reports full snapshots as available. Every criu run is bounded (SIGKILL of its
 * process group at the deadline: a hung restore ignores SIGTERM) and runs with
 * CRIU_FAULT=130 (this host's nested virtualisation never fires CRIU's hardware breakpoint;
 * the fault switch makes it step through syscalls instead). The images of one dump are a
 * directory; the time machine stores it as a tree (content-defined chunks: a page that
 * changed costs its ~64 KiB chunk, not a 2 MiB one). */
#ifndef COVE_RUNTIME_CRIU_H
#define COVE_RUNTIME_CRIU_H

#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

#define COVE_CRIU_TIMEOUT_MS 60000

struct cove_criu {
        char path[4096];   /* the criu binary; "" when none */
        char version[32];  /* "4.1.1" */
        int found;         /* a criu >= 4 whose `criu check` passed */
        char why[256];     /* why not, when !found */
        char action[4096]; /* restore's action script (cove_criu_setup) */
};

/* Detect criu (does not run the sandbox self-check; ns.c does). Never fails: c->found says. */
void cove_criu_detect(struct cove_criu *c);

/* Write the restore's action script into dir (root-only): criu restores a sandbox's network
 * namespace empty (--empty-ns net: the node plumbs the egress link itself, and a dumped veth
 * whose peer is on the host cannot be restored), so the script brings its loopback up before
 * any restored process runs. On failure c->found is cleared with the reason. */
void cove_criu_setup(struct cove_criu *c, const char *dir);

/* Called in the forked child's parent before the child execs criu (e.g. to put it into the
 * sandbox's cgroup); non-zero aborts. */
typedef int (*cove_criu_prep_fn)(void *arg, pid_t child, struct cove_err *err);

/* criu dump of the process tree rooted at pid into dir (exists, empty), leaving it running.
 * freezer_dir: the tree's freezer cgroup (CRIU freezes through it and leaves it as it found
 * it: frozen stays frozen). chan_ino: inode of the guest channel socket (external). The
 * network namespace's configuration is not dumped (--empty-ns net) and established TCP
 * connections are restored closed (--tcp-close): their peer, the node's proxy, did not
 * wait. */
int cove_criu_dump(const struct cove_criu *c, pid_t pid, const char *dir, const char *freezer_dir,
                   uint64_t chan_ino, struct cove_err *err);
/* criu restore of dir as a sibling of the caller (the restored root becomes the calling
 * thread's child), detached, with root as its / and chan_fd as the guest channel (the dump's
 * chan_ino). *pid: host pid of the restored root. */
int cove_criu_restore(const struct cove_criu *c, const char *dir, const char *root, int chan_fd,
                      uint64_t chan_ino, cove_criu_prep_fn prep, void *prep_arg, pid_t *pid,
                      struct cove_err *err);

/* What a restore would re-create by a path the sandbox can redirect. CRIU restores on the
 * host: a path it resolves there (a deleted file re-created as a "ghost" at its old name, a
 * link remap, a unix socket bound again by its name) that goes through a symlink the
 * sandbox planted lands outside the sandbox. Before a dump of the frozen tree in cgroup
 * cgroup_dir (root init), refuse (COVE_E_UNAVAILABLE, the reason in err) when a process:
 * holds open or maps a deleted file (memfd, shared anonymous and SysV memory excepted: they
 * have no path), has a deleted cwd or root, has a unix socket bound to a name that does not
 * lead to it inside its root without a symlink, runs in a mount namespace other than init's,
 * or when init's mount table is not the one of `mounts` (cove_criu_mounts at start: CRIU
 * re-creates every mount point by path). Paths of open files that are not deleted are their
 * real names in the same instant's file system, so they resolve the same way at restore. */
int cove_criu_restorable(const char *cgroup_dir, pid_t init, uint64_t mounts, struct cove_err *err);
/* Refuse to restore images in dir that re-create files by path: ghost files or link remaps
 * (ghost-file-*.img, remap-fpath.img), which a dump refused since cove_criu_restorable but
 * an older snapshot may hold. */
int cove_criu_images_safe(const char *dir, struct cove_err *err);
/* A digest of pid's mount table (/proc/<pid>/mountinfo); 0 when unreadable. */
uint64_t cove_criu_mounts(pid_t pid);

/* Rewrite the user namespace map of the dump in dir from host uid base `from` to `to` (a
 * restore into another uid range: fork). 0 when nothing had to change. */
int cove_criu_userns_rebase(const char *dir, uint32_t from, uint32_t to, struct cove_err *err);

#endif
