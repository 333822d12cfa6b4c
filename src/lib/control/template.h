/* Templates: a read-only root filesystem plus metadata, the lower layer every sandbox
 * starts from. Built once into a templates directory by running host tools (a copy of
 * busybox-static, debootstrap), then reused by every sandbox and every restart.
 *
 * Layout under templates_dir:
 *   <name>/rootfs/            the root filesystem (never written after the build)
 *   <name>/meta.json          {"name","built_at","size_bytes","source"}
 *   .build-<name>-XXXXXX/     a build in progress; renamed to <name>/ only when complete,
 *                             so a crash mid-build leaves no half template. Stale ones are
 *                             removed by the next build of that name.
 *   .lock-<name>              flock(2) lock file: one builder per name across processes.
 */
#ifndef COVE_CONTROL_TEMPLATE_H
#define COVE_CONTROL_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_TEMPLATE_NAME_MAX 64

/* Build progress: stage is a short word ("download", "extract", "configure", "user",
 * "copy", "applets", "finish"); percent is 0..100 within the stage, or -1 when unknown.
 * Called on the building thread; must not call back into the template module. */
typedef void (*cove_progress_fn)(void *arg, const char *stage, int percent);

struct cove_template_info {
        char name[COVE_TEMPLATE_NAME_MAX]; /* e.g. "busybox" */
        int built;                         /* 1 when <name>/meta.json and rootfs exist */
        int known;                         /* 1 when this module knows how to build it */
        char built_at[40];                 /* RFC 3339 UTC; "" when not built */
        uint64_t size_bytes;               /* sum of file sizes in rootfs; 0 when not built */
        char source[256];                  /* where the rootfs came from; "" when not built */
};

/* 1 if name is a template this module can build ("busybox", "base"), else 0. */
int cove_template_known(const char *name);

/* Find a built template. On 0, rootfs_out holds "<templates_dir>/<name>/rootfs".
 * Returns 0 when built, 1 when the name is unknown, invalid or not built yet,
 * -1 with err filled when the path does not fit in cap or the directory is unreadable. */
int cove_template_lookup(const char *templates_dir, const char *name, char *rootfs_out, size_t cap,
                         struct cove_err *err);

/* Build a known template into templates_dir (created if missing). Idempotent: returns 0
 * at once if already built. Serialised per name by an flock on .lock-<name>: a second
 * caller (any process) waits and then finds the template built. progress may be NULL.
 * Needs root (chroot, ownership of /home/user). busybox takes well under a second; base
 * runs debootstrap against the host's Debian mirror and takes minutes (bounded at 60 min).
 * On failure returns -1 with err holding the step and the tail of the tool's output
 * (COVE_E_NOT_FOUND for an unknown name, COVE_E_UNAVAILABLE when a host tool is missing);
 * nothing is left under <name>/. */
int cove_template_build(const char *templates_dir, const char *name, cove_progress_fn progress,
                        void *arg, struct cove_err *err);

/* Calls fn once per template: every known one (built or not), then every other built
 * directory holding a meta.json, sorted by name within each group. A non-zero return from
 * fn stops the walk and is returned. -1 with err on an unreadable directory; a missing
 * templates_dir lists the known templates as not built. */
typedef int (*cove_template_list_fn)(void *arg, const struct cove_template_info *info);
int cove_template_list(const char *templates_dir, cove_template_list_fn fn, void *arg,
                       struct cove_err *err);

/* Read one template's metadata (info->built 0 and fields empty when not built).
 * Returns 0, or -1 with err on an invalid name or a malformed meta.json. */
int cove_template_info(const char *templates_dir, const char *name, struct cove_template_info *info,
                       struct cove_err *err);

#endif
