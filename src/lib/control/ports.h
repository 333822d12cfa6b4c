/* Exposed ports in the control plane: the node's port listener (net/ports.h) started with
 * coved (--ports-listen, --ports-domain), exposures validated, stored in the catalog
 * (documents of kind "port", key "{sandbox}/{port}", owner the sandbox; only the SHA-256
 * of a token is kept) and loaded again at start, so they survive a restart, a pause and a
 * resume. A fork or rewind gets none of its source's. docs/ports.md. */
#ifndef COVE_CONTROL_PORTS_H
#define COVE_CONTROL_PORTS_H

#include <jansson.h>
#include <stdint.h>

#include "util/err.h"

struct coved;

struct coved_ports_options {
        const char *listen; /* "HOST:PORT"; NULL: no port listener */
        const char *domain; /* host routes "{port}-{id}.{domain}"; NULL: path routes only */
        int max_conns;      /* per sandbox (0: default) */
        int idle_s;         /* 0: default */
};

int coved_ports_open(struct coved *d, const struct coved_ports_options *o, struct cove_err *err);
void coved_ports_close(struct coved *d);

/* POST …/ports {port, public?, auto_resume?} → {port, url, token|null, public, auto_resume}.
 * Exposing a port again replaces it (a new token; connections made with the old end). */
int coved_port_add(struct coved *d, const char *tenant, const char *id, json_t *body,
                   const char *via, json_t **out, struct cove_err *err);
/* via: the preview address (HOST:PORT) of the control replica a call came through, for the
 * URLs (NULL: this listener's own). */
int coved_port_list(struct coved *d, const char *tenant, const char *id, const char *via,
                    json_t **out, struct cove_err *err);
/* -1 NOT_FOUND when the port is not exposed. */
int coved_port_delete(struct coved *d, const char *tenant, const char *id, unsigned port,
                      struct cove_err *err);
/* Every port of the sandbox behind one token (E2B's traffic access token; public: none
 * needed). token may be NULL for public. */
int coved_ports_expose_all(struct coved *d, const char *tenant, const char *id, int public_,
                           const char *token, struct cove_err *err);
/* The sandbox is deleted: forget its ports. */
void coved_ports_forget(struct coved *d, const char *tenant, const char *id);
/* Role node: the sandbox id came to this node (started or resumed here): its exposures
 * are loaded from the catalog, replacing what this node held of it. */
void coved_ports_adopt(struct coved *d, const char *id);
/* Role control: this replica's preview address (HOST:PORT) for the nodes' URLs, "" when it
 * has no port listener. */
const char *coved_ports_via(struct coved *d);
/* The domain of host routes ("" when none), for E2B's create answer. */
const char *coved_ports_domain(struct coved *d);

#endif
