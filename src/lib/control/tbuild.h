/* Tenant template builds run by coved (docs/templates.md): POST /v1/templates starts one on
 * its own thread and answers 202; its progress is kept in memory as NDJSON lines for
 * GET /v1/templates/{name}/build/events, and its outcome (ready, or failed with the error)
 * until the name is built again or deleted. What is on disk is template.h's: a template
 * exists whole or not at all, whatever happens to coved. */
#ifndef COVE_CONTROL_TBUILD_H
#define COVE_CONTROL_TBUILD_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"

struct coved;
struct coved_tbuilds;
struct coved_tbuild;

/* Sweep debris of killed builds; then the build table. NULL on ENOMEM. */
struct coved_tbuilds *coved_tbuilds_new(const char *templates_dir);
/* Cancel running builds, wait for them, free everything. */
void coved_tbuilds_free(struct coved_tbuilds *t);

/* body {name, from: {image | oci_archive | docker_archive}, insecure?, registry_auth?:
 * {secret}, max_size_mb?, timeout_s?}: validates, answers {name, state: "building"}. The
 * archive forms read a path on this node: admin only. */
int coved_template_create(struct coved *d, const char *tenant, int admin, json_t *body,
                          json_t **out, struct cove_err *err);
/* {name, state, built, digest, size_bytes, source, created_at, config, error?} for a
 * built-in or the tenant's template (or its build). NOT_FOUND when neither. */
int coved_template_get(struct coved *d, const char *tenant, const char *name, json_t **out,
                       struct cove_err *err);
/* {"templates": [...]}: the built-ins, then the tenant's (built or building or failed). */
int coved_template_list(struct coved *d, const char *tenant, json_t **out, struct cove_err *err);
/* CONFLICT while a sandbox of the tenant (any state: stopped ones can be restored from their
 * snapshots) or a build uses it. */
int coved_template_delete(struct coved *d, const char *tenant, const char *name,
                          struct cove_err *err);

/* The build's events, for streaming: a reference, or NULL with NOT_FOUND. read copies the
 * NDJSON text from pos: >0 bytes, 0 nothing yet (waited up to wait_ms), -1 the end. */
struct coved_tbuild *coved_template_events(struct coved *d, const char *tenant, const char *name,
                                           struct cove_err *err);
ssize_t coved_tbuild_read(struct coved_tbuild *b, uint64_t pos, char *buf, size_t max, int wait_ms);
void coved_tbuild_unref(struct coved_tbuild *b);

/* Template defaults for a sandbox's exec ({user, workdir, env, entrypoint, cmd}) or NULL
 * (built-ins, none). New reference. */
json_t *coved_template_config(struct coved *d, const char *tenant, const char *name);

#define COVE_TEMPLATE_CMD_MAX 4096
#define COVE_TEMPLATE_POOL_MAX 16
/* At start: the warm pools of the tenant templates that ask for one ("pool" > 0). */
void coved_template_pools_restore(struct coved *d);
#define COVE_TEMPLATE_READY_TIMEOUT_S 60
/* The template's start and ready commands: {start_cmd?, ready_cmd?, ready_timeout_s,
 * config?} or NULL when it has neither (built-ins never). New reference. */
json_t *coved_template_run(struct coved *d, const char *tenant, const char *name);

struct cove_sandbox_row;
/* For a new sandbox of a template with run (coved_template_run's): start start_cmd as a
 * process tagged "start" (not awaited), then run ready_cmd every 200 ms until it exits 0,
 * for at most run.ready_timeout_s. 0 when ready; -1 with err (COVE_E_UNAVAILABLE, the
 * last attempt's exit code and output tail) otherwise. The caller removes the sandbox. */
int coved_template_start(struct coved *d, const struct cove_sandbox_row *s, json_t *run,
                         struct cove_err *err);

#endif
