/* Writable layers of ns sandboxes with a size limit. This kernel family may lack every disk
 * quota (the 6.18 host has neither CONFIG_QUOTA nor CONFIG_XFS_QUOTA), so the limit is a
 * filesystem of its own: per sandbox a sparse ext4 image of disk_mb, cloned from a golden image
 * formatted once per size, loop-mounted by the host at <ns_dir>/layers/<id>. A full sandbox gets
 * ENOSPC from its own filesystem (blocks and inodes); the host sees at most disk_mb written.
 * disk_mb == 0 keeps a plain directory (no image, no snapshots).
 *
 * Layer filesystem: every image (golden, per-sandbox, warm, snapshots, restores) lives on one
 * sparse XFS with reflinks, <ns_dir>/layerfs.img loop-mounted at <ns_dir>/lfs (golden/,
 * layers/<id>.img, pool/, snap/ = layer_dir). A new layer and a snapshot are FICLONE
 * clones: instant, sharing blocks until written. Without mkfs.xfs lfs is a plain directory and
 * clones fall back to copying allocated extents.
 *
 * Ownership: an image stores *sandbox* ids (0..65535), not host ids: the layer's directories
 * are root-owned on disk and the sandbox reaches its layer only through an idmapped clone of
 * the mount (ns.c; disk id k <-> host id uid_base + k), so an image moves between sandboxes
 * with different uid ranges (fork, resume) without a chown. The host-side mount is nosuid,
 * nodev and its root is 0700. A plain directory layer (disk_mb 0) keeps host ids.
 *
 * Warm pool: cloning the image, LOOP_CONFIGURE and mounting ext4 cost most of a start, so a
 * thread keeps pool_n layers per size ready (image in <lfs>/pool/, loop device attached,
 * ext4 mounted as a *detached* mount held only by an fd, upper/work/mnt made). A new layer takes
 * one: rename of the image into layers/, move_mount() of the mount onto layers/<id>. The first
 * layer of a size is built inline and starts the refill of that size.
 *
 * Loop devices: an image that may still be mounted (a layer reused after a crash, a restore
 * image) is looked up among every loop device first, so it is never mounted twice; a file made
 * just now (pool, new layer, clone) skips that scan, which costs milliseconds per thousand loop
 * devices (a long-lived host has thousands: the kernel does not remove freed ones). */
#ifndef COVE_RUNTIME_QUOTA_H
#define COVE_RUNTIME_QUOTA_H

#include <stdint.h>
#include <sys/types.h>

#include "runtime/runtime.h"
#include "util/err.h"

struct cove_layers;

/* fscrypt (policy v2) key of a layer: with a key, a new layer's upper/ and work/ are
 * encrypted (AES-256-XTS/CTS) and every mount of its image gets the key added; a keyed new
 * layer takes a warm one like any other (its upper/ and work/ are still empty there: the
 * policy is set at the take, with the key added to that filesystem). NULL: unencrypted. */
#define COVE_LAYER_KEY_LEN COVE_RUNTIME_LAYER_KEY_LEN

/* Set up <ns_dir>/layers and the layer filesystem (formatted on first use, mounted, or reused
 * when a crashed owner left it mounted); reclaim what a crashed owner left in pool/ (loop
 * devices on its images, the images); with pool_n > 0 start the refill thread keeping pool_n
 * warm layers per size in use (at most 8 sizes). Caller frees with cove_layers_close(). */
struct cove_layers *cove_layers_open(const char *ns_dir, unsigned pool_n, struct cove_err *err);
/* Stop and join the refill thread, drop every warm layer (mount, loop device, image), unmount
 * the layer filesystem unless layers still use it. Layers taken by sandboxes are left alone. */
void cove_layers_close(struct cove_layers *l);
/* Directory holding the layers; layer <id> is mounted at <path>/<id>. */
const char *cove_layers_path(const struct cove_layers *l);
/* Directory for the caller's images (snapshots, restores): on the layer filesystem, so a
 * snapshot there is a clone and an image from there is adopted by a rename. */
const char *cove_layers_image_dir(const struct cove_layers *l);

/* Make layers/<id> ready with upper/, work/ and mnt/: create the image (first start), reuse it
 * (after a stop without purge or a crash), or adopt from_image (restore: the file is renamed
 * into layers/, replacing this id's old image; refused with COVE_E_CONFLICT while a mount of
 * it is alive), and mount it. Image layers keep their dirs root-owned (sandbox ids, see
 * above); a plain directory layer (limit_mb 0, no from_image) gets them owned by owner:group.
 * Forks mkfs.ext4 only the first time a size is used. Returns 1 when the layer was created, 0
 * when an existing one was reused, -1 on failure (a newly created layer is removed again, a
 * reused one unmounted). A new layer with a limit comes from the warm pool when one is ready.
 * from_mfd: -1, or the detached mount of from_image that cove_layer_image_open(create = 1)
 * returned (taken over and closed in every case): that mount becomes layers/<id> as it is (no
 * second mount, no wait for the first one's loop device to let go). */
int cove_layer_prepare(struct cove_layers *l, const char *id, uint64_t limit_mb, uid_t owner,
                       gid_t group, const char *from_image, int from_mfd, const uint8_t *key,
                       struct cove_err *err);
/* 1 when layers/<id> is a mounted image (stores sandbox ids), 0 for a plain directory. */
int cove_layer_has_image(struct cove_layers *l, const char *id);
/* Thaw (a crash mid-copy leaves it frozen, see cove_layer_snapshot) and unmount layers/<id>
 * (lazily: a still-running sandbox keeps its view); keeps the data. */
int cove_layer_release(struct cove_layers *l, const char *id, struct cove_err *err);
/* Unmount and delete layers/<id> and its image; a missing layer is not an error. */
int cove_layer_remove(struct cove_layers *l, const char *id, struct cove_err *err);

/* Point-in-time copy of layer <id>'s image at dest (created, must not exist): syncfs,
 * journal checkpoint and writeback while the sandbox runs, then one FICLONE of the image
 * (without reflinks: FIFREEZE, copy, FITHAW). dest is crash-consistent, not clean: its
 * journal needs a replay, cove_layer_recover(), before a read-only mount. *pause_ns: the
 * clone (the layer's I/O to its image waits at most that long). COVE_E_CONFLICT when the
 * layer has no image. On failure dest is removed. */
int cove_layer_snapshot(struct cove_layers *l, const char *id, const char *dest, uint64_t *pause_ns,
                        struct cove_err *err);
/* Replay the journal of image (a cove_layer_snapshot() copy nobody uses): e2fsck -E
 * journal_only. On failure the image is removed. */
int cove_layer_recover(const char *image, struct cove_err *err);
/* Mount an image outside any sandbox as a detached mount (nothing in mountinfo; the kernel
 * drops it with the last fd, also when coved dies) and open its upper tree as *tree_fd.
 * create = 0: read-only. create = 1: a new empty layer of disk_mb at image (must not exist),
 * read-write: a warm layer of that size when the pool has one ready (renamed to image), else
 * a clone of the golden image. create = COVE_LAYER_OPEN_CLONE: image is a file the caller
 * has just made (a clone of a clean image, no mount of it anywhere), mounted read-write as it
 * is (no search for a loop device already bound to it). Returns the mount fd (close it, and
 * *tree_fd and every fd under it, to release the mount and its loop device) or -1 (a created image
 * is removed again). */
int cove_layer_image_open(struct cove_layers *l, const char *image, int create, unsigned disk_mb,
                          const uint8_t *key, int *tree_fd, struct cove_err *err);

#endif
