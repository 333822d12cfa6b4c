/* Writable layers of ns sandboxes with a size limit. This kernel family may lack every disk
 * quota (the 6.18 host has neither CONFIG_QUOTA nor CONFIG_XFS_QUOTA), so the limit is a
 * filesystem of its own: per sandbox a sparse ext4 image of disk_mb, copied (holes kept,
 * ~1 MB of metadata) from a golden image formatted once per size, loop-mounted by the host at
 * <ns_dir>/layers/<id>. A full sandbox gets ENOSPC from its own filesystem (blocks and
 * inodes); the host sees at most disk_mb written. disk_mb == 0 keeps a plain directory.
 *
 * Warm pool: copying the image, LOOP_CONFIGURE and mounting ext4 cost most of a start, so a
 * thread keeps pool_n layers per size ready (image in <ns_dir>/pool/, loop device attached,
 * ext4 mounted as a *detached* mount held only by an fd, upper/work/mnt made). A new layer takes
 * one: rename of the image into layers/, move_mount() of the mount onto layers/<id>, chown of
 * three dirs. The first layer of a size is built inline and starts the refill of that size. */
#ifndef COVE_RUNTIME_QUOTA_H
#define COVE_RUNTIME_QUOTA_H

#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

struct cove_layers;

/* Set up <ns_dir>/layers, <ns_dir>/golden and <ns_dir>/pool; reclaim what a crashed owner
 * left in pool/ (loop devices on its images, the images); with pool_n > 0 start the refill
 * thread keeping pool_n warm layers per size in use (at most 8 sizes). Caller frees with
 * cove_layers_close(). */
struct cove_layers *cove_layers_open(const char *ns_dir, unsigned pool_n, struct cove_err *err);
/* Stop and join the refill thread, drop every warm layer (mount, loop device, image). Layers
 * taken by sandboxes are left alone. */
void cove_layers_close(struct cove_layers *l);
/* Directory holding the layers; layer <id> is mounted at <path>/<id>. */
const char *cove_layers_path(const struct cove_layers *l);

/* Make layers/<id> ready with upper/, work/ and mnt/ owned by owner:group: create the image
 * (first start) or reuse it (after a stop without purge or a crash), and mount it. Forks
 * mkfs.ext4 only the first time a size is used. Returns 1 when the layer was created, 0 when
 * an existing one was reused, -1 on failure (a newly created layer is removed again, a reused
 * one unmounted). A new layer with a limit comes from the warm pool when one is ready. */
int cove_layer_prepare(struct cove_layers *l, const char *id, uint64_t limit_mb, uid_t owner,
                       gid_t group, struct cove_err *err);
/* Unmount layers/<id> (lazily: a still-running sandbox keeps its view); keeps the data. */
int cove_layer_release(struct cove_layers *l, const char *id, struct cove_err *err);
/* Unmount and delete layers/<id> and its image; a missing layer is not an error. */
int cove_layer_remove(struct cove_layers *l, const char *id, struct cove_err *err);

#endif
