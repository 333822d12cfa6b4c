/* A small QMP client (QEMU Machine Protocol, JSON lines over a unix socket), enough for the vm
 * runtime: capabilities negotiation, commands with an optional fd passed alongside
 * (SCM_RIGHTS, for getfd), and waiting for events. Not thread-safe: one caller at a time
 * (the vm driver serialises per instance). QEMU is less trusted than coved (it runs the
 * guest), so replies are bounded (line length, queued events) and checked. */
#ifndef COVE_RUNTIME_QMP_H
#define COVE_RUNTIME_QMP_H

#include <jansson.h>

#include "util/err.h"

#define COVE_QMP_LINE_MAX (256 * 1024)
#define COVE_QMP_EVENTS_MAX 64

struct cove_qmp {
        int fd;
        char *buf; /* COVE_QMP_LINE_MAX */
        size_t len;
        json_t *events; /* queued events (array), oldest first */
};

/* Take fd (a connected stream to QEMU's QMP monitor), read the greeting and enter command
 * mode. On failure fd is closed. */
int cove_qmp_open(struct cove_qmp *q, int fd, int timeout_ms, struct cove_err *err);
void cove_qmp_close(struct cove_qmp *q);
/* Run cmd with args (stolen; NULL: none). With pass_fd >= 0 the fd travels with the command
 * (getfd, add-fd). On {"return":…} *ret (may be NULL) gets it; on {"error":…} -1 with the
 * error's class and description in err. Events read meanwhile are queued. */
int cove_qmp_cmd(struct cove_qmp *q, const char *cmd, json_t *args, int pass_fd, json_t **ret,
                 int timeout_ms, struct cove_err *err);
/* Wait for an event named ev (queued or new); *data (may be NULL) gets its "data". */
int cove_qmp_wait_event(struct cove_qmp *q, const char *ev, json_t **data, int timeout_ms,
                        struct cove_err *err);
/* Wait for the MIGRATION event whose status is completed (0) or failed/cancelled (-1).
 * Needs the "events" migration capability. */
int cove_qmp_wait_migration(struct cove_qmp *q, int timeout_ms, struct cove_err *err);
/* The same for the status given (e.g. "pre-switchover"); a timeout is COVE_E_UNAVAILABLE with
 * errno ETIMEDOUT. */
int cove_qmp_wait_migration_to(struct cove_qmp *q, const char *status, int timeout_ms,
                               struct cove_err *err);

#endif
