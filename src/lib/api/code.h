/* The code interpreter relay (api/routes_code.c, docs/code-interpreter.md): runs and
 * contexts of cove's interpreter server inside a sandbox, for cove's API and for the E2B
 * code interpreter surface (api/e2b_envd.c, port 49999). The server is started on first
 * use; everything it answers is checked and bounded here. */
#ifndef COVE_API_CODE_H
#define COVE_API_CODE_H

#include <jansson.h>

#include "api/http.h"
#include "control/coved.h"

enum cove_code_op {
        COVE_CODE_CREATE,
        COVE_CODE_LIST,
        COVE_CODE_DELETE,
        COVE_CODE_RESTART,
        COVE_CODE_INTERRUPT
};

/* Run body's code (cove's body: code, language|context_id, env, timeout_s; e2b: the SDK's
 * body with env_vars) and answer r with the NDJSON stream of the run. -1 with err when it
 * cannot start (the caller answers it). */
int cove_code_run(struct coved *d, struct cove_req *r, struct cove_chan *c,
                  const struct cove_sandbox_row *row, json_t *body, int e2b, struct cove_err *err);
/* Contexts: CREATE (body {language?, cwd?}) and LIST fill *out (a context {id, language,
 * cwd} / an array of them); DELETE, RESTART and INTERRUPT (of the running cell) need cid. */
int cove_code_context(struct coved *d, struct cove_chan *c, const struct cove_sandbox_row *row,
                      enum cove_code_op op, const char *cid, json_t *body, json_t **out,
                      struct cove_err *err);

/* For fuzzing and tests (both read bytes from the sandbox). One line of a run: checked
 * (a JSON object of a known type with its fields) and written out again, malloc'd with its
 * '\n', or NULL; *end is 1 for the end line. An answer head in buf[0..len): 1 with the
 * status and where the body starts, 0 when more bytes are needed, -1 when it is not HTTP
 * (or longer than 16 KiB). */
char *cove_code_line(const char *p, size_t n, int *end);
int cove_code_head(const char *buf, size_t len, int *status, size_t *body_off);

int cove_h_code_run(void *app, struct cove_req *r);
int cove_h_code_ctx_create(void *app, struct cove_req *r);
int cove_h_code_ctx_list(void *app, struct cove_req *r);
int cove_h_code_ctx_delete(void *app, struct cove_req *r);
int cove_h_code_ctx_restart(void *app, struct cove_req *r);
int cove_h_code_ctx_interrupt(void *app, struct cove_req *r);

#endif
