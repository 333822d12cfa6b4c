/* Dockerfile parsing for template builds without Docker. The text comes from the API and
 * is untrusted: bounded, and every instruction cove does not run the way Docker would is
 * refused with its line number and why, rather than half-honoured. */
#ifndef COVE_CONTROL_DOCKERFILE_H
#define COVE_CONTROL_DOCKERFILE_H

#include <jansson.h>
#include <stddef.h>

#include "util/err.h"

#define COVE_DOCKERFILE_MAX (64 * 1024)
#define COVE_DOCKERFILE_STEPS_MAX 256

/* Parse text into *steps, a JSON array (caller decrefs) of {line, op, args: [strings],
 * shell: bool}: op is one of FROM RUN COPY ENV ARG WORKDIR USER EXPOSE CMD ENTRYPOINT (ADD
 * is COPY with "add": true: it unpacks local archives; ENV args are alternating names and values;
 * shell: a RUN/CMD/ENTRYPOINT in shell form, args then holds the one command line). FROM is first
 * and only once, with one name. -1 with COVE_E_BAD_REQUEST "line N: …" otherwise. */
int cove_dockerfile_parse(const char *text, size_t len, json_t **steps, struct cove_err *err);

#endif
