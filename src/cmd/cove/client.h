/* HTTP client for the cove REST API (docs/api.md) over libcurl: endpoint and key
 * resolution (COVE_URL / unix socket), JSON calls that turn the server's error body into a
 * `code: message` error, and a poll loop that streaming verbs extend with their own fds. */
#ifndef COVE_CLI_CLIENT_H
#define COVE_CLI_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include <curl/curl.h>
#include <jansson.h>

#include "cove.h"

/* Resolve where to talk and with which key, in this order:
 *   url: --url, COVE_URL, else the unix socket $COVE_DATA_DIR/coved.sock (default
 *        /var/lib/cove); a url "unix:/path" also selects a socket;
 *   key: --api-key, COVE_API_KEY, else (socket only) $COVE_DATA_DIR/admin.key.
 * Fills c->base, c->sock, c->key. Idempotent. */
int cli_connect(struct cli *c, struct cove_err *err);
/* Free what cli_connect() resolved. */
void cli_disconnect(struct cli *c);

/* One HTTP request. Create with cli_req_new(), free with cli_req_free(). The default write
 * callback collects the body into `body`; streaming users install their own. */
struct cli_req {
        CURL *h;
        struct curl_slist *hdrs;
        char *body; /* collected response body (NUL-terminated), or NULL */
        size_t len; /* bytes in body */
        size_t cap;
        long status; /* HTTP status once the transfer is done (or headers are in) */
        char errbuf[CURL_ERROR_SIZE];
};

/* method: "GET", "POST", "PUT", "DELETE"; path: "/v1/..." already URL-encoded.
 * content_type may be NULL (no body). Returns NULL only on allocation failure. */
struct cli_req *cli_req_new(struct cli *c, const char *method, const char *path,
                            const char *content_type);
void cli_req_free(struct cli_req *r);
/* Default write callback (collects into r->body); exposed so streaming callbacks can fall
 * back to it for error bodies. */
size_t cli_collect_cb(char *ptr, size_t size, size_t nmemb, void *arg);
/* Current HTTP status of the transfer (0 if headers have not arrived). */
long cli_req_status(struct cli_req *r);

/* Extra file descriptors a streaming verb watches while a transfer runs. on_ready is called
 * after every wake-up (fds[i].revents tell which fired; also called on timeouts); returning
 * non-zero aborts the transfer. The callee may change nfds between calls. */
struct cli_loop {
        const char *progress; /* spinner label, NULL for none */
        struct curl_waitfd *fds;
        unsigned nfds;
        int (*on_ready)(void *arg, struct curl_waitfd *fds, unsigned nfds);
        void *arg;
};

/* Run the transfer to completion. Returns 0 if an HTTP answer was received (whatever its
 * status: see r->status), -1 on a transport failure (err: "cannot reach coved at URL: ..."),
 * -2 if on_ready aborted. */
int cli_perform(struct cli *c, struct cli_req *r, struct cli_loop *loop, struct cove_err *err);

/* Turn an error answer (status >= 400) into err: "code: message" from the JSON error body,
 * or "HTTP <status>" with the body text when it is not the documented shape. Returns -1. */
int cli_http_error(struct cli *c, long status, const char *body, size_t len, struct cove_err *err);

/* JSON request/response in one go. body may be NULL (no request body); *out receives the
 * decoded answer (NULL for an empty answer such as 204), caller json_decref()s it. out may be
 * NULL. Returns 0 on a 2xx answer, -1 otherwise (err filled). */
int cli_call(struct cli *c, const char *method, const char *path, json_t *body, json_t **out,
             const char *progress, struct cove_err *err);

/* Percent-encode s for a URL path segment or query value (everything but unreserved
 * characters). Caller frees. */
char *cli_urlenc(const char *s);
/* asprintf that aborts on allocation failure (the CLI cannot go on without memory). */
char *cli_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Decode standard base64 (padding optional, whitespace ignored) into out (capacity
 * >= 3*len/4+3). Returns the decoded length, -1 on bad input. */
long cli_b64_decode(const char *in, size_t len, unsigned char *out);

/* GET path every interval_ms while its answer's string `field` equals `value`, with a
 * spinner labelled label; *obj holds the last answer (an older one is released). Gives up
 * after deadline_s (0: never) with an error naming what. 0, or -1 with err. */
int cli_poll_while(struct cli *c, const char *path, const char *field, const char *value,
                   const char *label, int interval_ms, int deadline_s, const char *what,
                   json_t **obj, struct cove_err *err);

#endif
