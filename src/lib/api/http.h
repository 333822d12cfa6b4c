/* HTTP front end over libmicrohttpd: thread per connection (handlers may block on a
 * sandbox), a route table with {param} segments, bounded request bodies, streaming
 * uploads and streaming (chunked) responses, and the error shape of docs/api.md.
 * Generic: it knows nothing of sandboxes; api/routes.c supplies the table. */
#ifndef COVE_API_HTTP_H
#define COVE_API_HTTP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"
#include "util/log.h"

#define COVE_HTTP_MAX_PARAMS 4
#define COVE_HTTP_JSON_MAX (1u << 20) /* request bodies that are buffered (JSON) */

struct cove_http;
struct cove_req;

typedef int (*cove_handler_fn)(void *app, struct cove_req *r);
/* Upload routes get the body in pieces as it arrives (len 0 never passed). A non-zero
 * return stops the upload; the handler is still called at the end to answer. */
typedef int (*cove_upload_fn)(void *app, struct cove_req *r, const char *data, size_t len);
/* Called once when the request is finished or the client went away. */
typedef void (*cove_req_cleanup_fn)(void *app, struct cove_req *r);

enum {
        COVE_ROUTE_PUBLIC = 1, /* no API key needed */
        /* sandbox traffic (exec, processes, files, fs, egress, ports of one sandbox, named by
         * the first {param}): served by the node that runs the sandbox; a control replica
         * forwards it there (api/forward.h) */
        COVE_ROUTE_SANDBOX = 2,
        /* the E2B envd surface on a node's API: the sandbox is named by E2b-Sandbox-Id */
        COVE_ROUTE_E2B = 4,
};

struct cove_route {
        const char *method;
        const char *pattern; /* "/v1/sandboxes/{id}/exec" */
        cove_handler_fn handler;
        cove_upload_fn upload; /* NULL: body buffered up to COVE_HTTP_JSON_MAX */
        int flags;
};

/* Authentication hook: fill r's principal from the Authorization header value (may be
 * NULL). Returns 0, or -1 with err (answered 401). */
typedef int (*cove_auth_fn)(void *app, struct cove_req *r, const char *authorization,
                            struct cove_err *err);

struct cove_req {
        void *conn; /* struct MHD_Connection * */
        const char *method;
        const char *url; /* path, without the query */
        const struct cove_route *route;
        char *params[COVE_HTTP_MAX_PARAMS]; /* {param} values, in pattern order */
        int nparams;
        char *body; /* buffered body (NUL-terminated), non-upload routes */
        size_t body_len;
        int too_big; /* body exceeded the bound */
        int upload_failed;
        int started; /* handler has run */
        int answered;
        /* an answer given while the body was still arriving (MHD refuses to queue one
         * then): held here and queued once the body is consumed */
        void *late; /* struct MHD_Response * */
        unsigned late_status;
        int in_body;     /* inside an upload callback */
        int flat_errors; /* the listener's cove_http_config.flat_errors */
        /* principal, filled by the auth hook */
        char tenant[64];
        char key_id[64];
        int admin;
        void *state;                 /* handler-owned */
        cove_req_cleanup_fn cleanup; /* called with state at the end */
        int64_t t0_ns;
        /* a header every answer to this request carries (the node API's Cove-Node-Answer),
         * set by the auth hook; NULL for none */
        const char *answer_hdr_name;
        char answer_hdr_value[80];
        void *http;                  /* struct cove_http * */
        struct cove_stream_hup *hup; /* cove_req_hup's, the request's reference */
};

struct cove_http_config {
        const struct cove_route *routes;
        size_t nroutes;
        cove_auth_fn auth;
        void *app;
        const struct cove_log *log;
        int *quitting; /* streams end when *quitting becomes non-zero */
        /* Runs for a request no route matches (NULL: 404/405 in cove's error shape); its
         * flags apply (COVE_ROUTE_PUBLIC: no auth). */
        const struct cove_route *fallback;
        /* Every error of this listener, the front end's own too (bad query, body too large,
         * no answer), as {"code": <status>, "message"} (E2B's shape) instead of cove's. */
        int flat_errors;
};

/* Listen on tcp "HOST:PORT" (may be NULL) and on a unix socket path (may be NULL; created
 * mode 0600, replacing a stale socket). */
struct cove_http *cove_http_start(const struct cove_http_config *cfg, const char *tcp_addr,
                                  const char *unix_path, struct cove_err *err);
void cove_http_stop(struct cove_http *h);
/* Requests finished so far (for /metrics). */
uint64_t cove_http_requests(struct cove_http *h);

/* Request helpers */
const char *cove_req_query(struct cove_req *r, const char *key); /* decoded or NULL */
const char *cove_req_header(struct cove_req *r, const char *name);
/* The client's socket (-1 if unknown), and whether the client closed it (EOF or error; never
 * blocks). A streaming answer that has nothing to send uses them to notice a client that went
 * away: libmicrohttpd only notices when a write fails. */
int cove_req_sockfd(struct cove_req *r);
int cove_sock_closed(int fd);
/* Parse the buffered body as a JSON object; on failure answers 400 and returns NULL.
 * An empty body gives an empty object when allow_empty. */
json_t *cove_req_json(struct cove_req *r, int allow_empty);

/* Answers: each returns 0. The JSON ones steal obj. */
int cove_reply_json(struct cove_req *r, unsigned status, json_t *obj);
int cove_reply_error(struct cove_req *r, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Status and code from err->kind. */
int cove_reply_err(struct cove_req *r, const struct cove_err *err);
int cove_reply_empty(struct cove_req *r, unsigned status);
/* The answer of a call that returned rc: err when rc < 0, else status with out (stolen), or
 * an empty body when out is NULL. */
int cove_reply_result(struct cove_req *r, int rc, unsigned status, json_t *out,
                      const struct cove_err *err);
int cove_reply_text(struct cove_req *r, unsigned status, const char *ctype, const char *text);
/* An answer of len bytes from data (malloc'd; taken, freed when sent): one buffer written as
 * it is, with its Content-Length. */
int cove_reply_buffer(struct cove_req *r, unsigned status, const char *ctype, char *data,
                      size_t len);

/* Streaming body. read() fills buf (at most max bytes) and returns the count, 0 for "nothing
 * yet, call again" (after blocking on its source: libmicrohttpd calls it again at once; see
 * cove_req_hup below), -1 at the end, -2 to abort.
 * size is the total length or -1 for chunked. free() runs when the response is done. */
typedef ssize_t (*cove_stream_read_fn)(void *ctx, uint64_t pos, char *buf, size_t max);
typedef void (*cove_stream_free_fn)(void *ctx);
int cove_reply_stream(struct cove_req *r, unsigned status, const char *ctype, int64_t size,
                      cove_stream_read_fn read, cove_stream_free_fn free_fn, void *ctx);
/* The same with the answer's headers given as name/value pairs (hdrs[2i], hdrs[2i+1]),
 * nhdrs pairs; Content-Type is one of them or absent. */
int cove_reply_stream_hdrs(struct cove_req *r, unsigned status, const char *const *hdrs,
                           size_t nhdrs, int64_t size, cove_stream_read_fn read,
                           cove_stream_free_fn free_fn, void *ctx);

/* Idle streams. A streaming reader with nothing to send waits on its source for up to
 * COVE_STREAM_IDLE_MS, never in a loop (a read() that returns 0 at once is called again at
 * once by libmicrohttpd: a spinning thread). To be told when to stop waiting, a handler
 * registers the stream: the front end watches the client's socket (one epoll thread for all
 * streams) and, when the client goes away or the server stops, sets *cove_stream_hup_flag()
 * and calls wake(arg), which must make the reader's wait return (e.g. cove_chan_wake; wake
 * may be NULL for a reader that polls the socket itself). Returns NULL when out of memory
 * (the reader then notices a departed client at its next bounded wake-up only). The stream's
 * free function releases it; wake is never called after that. */
#define COVE_STREAM_IDLE_MS 30000
struct cove_stream_hup;
struct cove_stream_hup *cove_req_hup(struct cove_req *r, void (*wake)(void *), void *arg);
/* Non-zero once the client went away or the server stops (read it atomically). */
const int *cove_stream_hup_flag(const struct cove_stream_hup *h);
int cove_stream_hup_gone(const struct cove_stream_hup *h);
void cove_stream_hup_release(struct cove_stream_hup *h);

/* The request's target in one canonical form: the path and the query parameters (in the
 * order sent) percent-encoded again from their decoded values ("/v1/x?path=%2Ftmp&eof").
 * A forwarder sends this and signs it, and the receiver rebuilds the same string from
 * what it decoded, so both sign the same bytes whatever escaping the client used.
 * -1 when it does not fit cap. */
int cove_req_target(struct cove_req *r, char *out, size_t cap);

/* For fuzzing and tests: match a path against a pattern, filling params (caller frees). */
int cove_route_match(const char *pattern, const char *path, char **params, int *nparams);

#endif
