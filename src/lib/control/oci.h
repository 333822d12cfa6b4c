/* OCI image metadata as skopeo leaves it in an OCI layout: index.json, the image manifest
 * and the image config. All three come from a registry or an archive, so they are hostile:
 * parsed with bounds on every count and string, digests checked for their shape
 * (sha256:<64 hex>), and only what a template needs is kept. */
#ifndef COVE_CONTROL_OCI_H
#define COVE_CONTROL_OCI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_OCI_LAYERS_MAX 128
#define COVE_OCI_JSON_MAX (4u << 20) /* index, manifest or config */

struct cove_oci_desc {
        char media_type[128];
        char digest[72]; /* "sha256:<hex>" */
        int64_t size;
};

struct cove_oci_manifest {
        struct cove_oci_desc config;
        struct cove_oci_desc layers[COVE_OCI_LAYERS_MAX];
        int nlayers;
};

struct cove_oci_config {
        char os[32], arch[32];
        char diff_ids[COVE_OCI_LAYERS_MAX][72];
        int ndiff;
        json_t *defaults; /* {user, workdir, env: {K: V}, entrypoint: [..], cmd: [..]}; owned */
};

/* 1 when d is "sha256:" and 64 lowercase hex digits. */
int cove_oci_digest_valid(const char *d);

/* index.json: the one image manifest it lists (an index with several picks the
 * linux/amd64 one). 0 or -1 with err (COVE_E_BAD_REQUEST). */
int cove_oci_index_parse(const char *buf, size_t len, struct cove_oci_desc *manifest,
                         struct cove_err *err);
/* An image manifest (OCI or Docker schema 2 media types): config and layers, in order. */
int cove_oci_manifest_parse(const char *buf, size_t len, struct cove_oci_manifest *m,
                            struct cove_err *err);
/* An image config: platform, diff_ids, and the defaults a sandbox's exec honours. On 0 the
 * caller frees with cove_oci_config_clear(). */
int cove_oci_config_parse(const char *buf, size_t len, struct cove_oci_config *c,
                          struct cove_err *err);
void cove_oci_config_clear(struct cove_oci_config *c);

#endif
