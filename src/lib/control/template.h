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

#include <jansson.h>
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

/* cove's interpreter server and its JavaScript context (src/interp/), embedded at build
 * time (scripts/embed.py): the code-interpreter template gets them from here, and coved
 * writes them again into a sandbox before it starts the server there, so a template built
 * by an older coved never runs an older server (api/routes_code.c). */
#define COVE_INTERP_DIR "/usr/lib/cove/interp"
extern const unsigned char cove_interp_server[], cove_interp_jskernel[];
extern const size_t cove_interp_server_len, cove_interp_jskernel_len;

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

/* ---- tenant templates (template_image.c) ------------------------------------------
 * A tenant's own templates live in <templates_dir>/tenants/<tenant>/<name>/ (rootfs/ and
 * meta.json, renamed into place whole like the built-ins); their layers, unpacked once each,
 * in <templates_dir>/layers/sha256-<hex>/, and a rootfs is hard links to them, so a layer
 * several templates share is stored once. tenants/ and layers/ are 0700: the images' setuid
 * files keep their bits for the sandboxes but no host user can reach them. meta.json holds
 * {name, tenant, built_at, created_at, size_bytes, source: {KIND: REF}, source_text, digest
 * (the manifest's), layers: [digest…], config: {user, workdir, env, entrypoint, cmd}} plus
 * the caller's extra keys. */

#define COVE_TEMPLATE_MAX_BYTES_DEFAULT (8ULL << 30) /* unpacked size limit of an image */
#define COVE_TEMPLATE_PULL_TIMEOUT_S 1800

/* A build progress event (a JSON object, borrowed): {"type":"stage","stage":S} for pull,
 * verify, rootfs, ready; {"type":"pull","bytes":N} while downloading; {"type":"layer",
 * "index":I,"digest":D,"state":"unpacking"|"unpacked"|"cached","bytes":N}. */
typedef void (*cove_template_event_fn)(void *arg, json_t *ev);

struct cove_image_spec {
        const char *tenant;
        const char *name;
        const char *source_kind; /* "image", "oci_archive" or "docker_archive" */
        const char *ref;         /* REGISTRY/REPO[:TAG][@DIGEST], or the archive's path */
        int insecure;            /* plain HTTP or unverified TLS to the registry */
        const char *auth;        /* "user:password" for the registry, or NULL; used for the
                                  * pull only (a 0600 file removed at once), never stored */
        uint64_t max_bytes;      /* bound on what is downloaded and on the unpacked size */
        int timeout_s;           /* the pull's deadline */
        json_t *extra;           /* keys added to meta.json (start_cmd…), borrowed; may be NULL */
        cove_template_event_fn event;
        void *event_arg;
        const volatile int *cancel; /* non-zero stops the build (may be NULL) */
};

/* Build the tenant's template s->name from an image. Serialised per name like the
 * built-ins; COVE_E_CONFLICT when it exists. On failure nothing of it is left (layers that
 * were unpacked whole stay for the next build until cove_template_gc()); errors name the
 * layer ("layer 2 (sha256:…): \"../x\": \"..\" in the path refused"), COVE_E_LIMIT past
 * max_bytes, COVE_E_UNAVAILABLE when skopeo is missing or the registry does not answer in
 * time. */
int cove_template_image_build(const char *templates_dir, const struct cove_image_spec *s,
                              struct cove_err *err);

/* A template from a sandbox's files: the parent template (a built-in or the tenant's) with
 * one layer more, made from tree_fd, the overlay upper tree of the sandbox (its changes,
 * overlay whiteouts included; hostile: copied below fds, never followed). The layer is
 * named by a sha256 of a canonical form of its files. meta.json gets source
 * {source_kind: source_id}, the parent's config, layers and base_builtin. */
struct cove_tree_spec {
        const char *tenant, *name;
        const char *parent;      /* the sandbox's template */
        const char *source_kind; /* "sandbox" or "snapshot" */
        const char *source_id;
        int tree_fd;
        uint64_t max_bytes;
        json_t *config; /* the template's config; NULL: the parent's (borrowed) */
        json_t *extra;  /* keys added to meta.json (start_cmd…), borrowed; may be NULL */
        cove_template_event_fn event;
        void *event_arg;
};
int cove_template_tree_build(const char *templates_dir, const struct cove_tree_spec *s,
                             struct cove_err *err);

/* Copy the tree below src_fd into dst_fd (empty) below fds, never following a link, at
 * most max_bytes of file data (COVE_E_LIMIT). For Dockerfile COPY. */
int cove_template_copy_tree(int src_fd, int dst_fd, uint64_t max_bytes, struct cove_err *err);

/* cove_template_lookup for a tenant: built-in names resolve to the built-ins, others to the
 * tenant's own (tenant NULL: built-ins only). Same returns. */
int cove_template_lookup_for(const char *templates_dir, const char *tenant, const char *name,
                             char *rootfs_out, size_t cap, struct cove_err *err);
/* The tenant template's meta.json: 0 with *meta (caller decrefs), 1 when there is none. */
int cove_template_meta(const char *templates_dir, const char *tenant, const char *name,
                       json_t **meta, struct cove_err *err);
typedef int (*cove_template_meta_fn)(void *arg, json_t *meta);
/* fn once per built template of the tenant, by name; non-zero from fn stops and returns. */
int cove_template_list_for(const char *templates_dir, const char *tenant, cove_template_meta_fn fn,
                           void *arg, struct cove_err *err);
/* Remove the tenant's template (COVE_E_NOT_FOUND if none) and the layers nothing uses any
 * more. The caller checks that no sandbox needs it. */
int cove_template_remove(const char *templates_dir, const char *tenant, const char *name,
                         struct cove_err *err);
/* Remove layers no template lists and unfinished layer unpacks; skipped while a build
 * runs. */
int cove_template_gc(const char *templates_dir, struct cove_err *err);
/* At start-up: remove what killed builds left (their .build- directories, then unused
 * layers). Best effort; live builds of other processes are left alone (their locks). */
void cove_template_sweep(const char *templates_dir);

#endif
