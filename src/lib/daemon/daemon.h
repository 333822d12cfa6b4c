/* The coved process, composed: the control plane and the node (control/coved.h) with the
 * HTTP front end and the E2B-compatible listeners of api/ on top. The one module that
 * includes api/, control/ and node/ together; the program (src/cmd/coved.c) calls only
 * this. */
#ifndef COVE_DAEMON_DAEMON_H
#define COVE_DAEMON_DAEMON_H

#include "control/coved.h"

/* coved_open(), then the HTTP front end (o->listen and <data_dir>/coved.sock) and the E2B
 * listeners. On failure everything is closed again. */
int coved_daemon_open(struct coved *d, const struct coved_options *o, struct cove_err *err);
/* Stop serving (no new request; streams end), then coved_close(). */
void coved_daemon_close(struct coved *d);

#endif
