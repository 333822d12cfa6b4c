/* Dockerfile builds (tbuild_df.c), run on a template build's thread (tbuild.c). */
#ifndef COVE_CONTROL_TBUILD_DF_H
#define COVE_CONTROL_TBUILD_DF_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "control/template.h"
#include "util/err.h"

struct coved;

struct coved_df_build {
        const char *tdir, *tenant, *name;
        json_t *steps;       /* cove_dockerfile_parse()'s */
        const char *digest;  /* "sha256:…" of the Dockerfile text (the template's source id) */
        const void *context; /* the context tar, or NULL */
        size_t context_len;
        json_t *egress;     /* the RUN sandboxes' egress policy, NULL: none (deny all) */
        json_t *build_args; /* {NAME: value} for ARG, may be NULL */
        json_t *extra;      /* keys for the named template's meta.json (start_cmd…), or NULL */
        int insecure;       /* FROM an image: plain HTTP or unverified TLS to its registry */
        int pull_timeout_s; /* FROM an image: the pull's deadline */
        uint64_t max_bytes;
        cove_template_event_fn event;
        void *event_arg;
        const volatile int *cancel;
};

/* Build in->name from the Dockerfile's steps. 0, or -1 with err naming the line. */
int coved_dockerfile_build(struct coved *d, const struct coved_df_build *in, struct cove_err *err);

#endif
