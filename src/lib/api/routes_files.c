/* File routes: raw read/write (streamed both ways), listing, mkdir/move/remove, watch.
 * Paths are only checked for shape here; the guest resolves them inside the sandbox root,
 * where no path can name a host file (see docs/guest-protocol.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/routes.h"
#include "util/cleanup.h"

#define PATH_MAX_LEN 4096

static const char *check_path(const char *p)
{
        if (!p || !*p)
                return "path is required";
        if (strlen(p) > PATH_MAX_LEN)
                return "path is longer than 4096 bytes";
        return NULL;
}

static const char *query_path(struct cove_req *r, const char *key)
{
        const char *p = cove_req_query(r, key);
        const char *why = check_path(p);
        if (why) {
                cove_reply_error(r, 400, "bad_request", "%s", why);
                return NULL;
        }
        return p;
}

/* Keep only the documented fields of a guest entry, with checked types. */
static json_t *clean_entry(json_t *e)
{
        if (!json_is_object(e))
                return NULL;
        json_t *o = json_object();
        static const char *strs[] = {"name", "path", "type", "mtime"};
        for (size_t i = 0; i < 4; i++) {
                json_t *v = json_object_get(e, strs[i]);
                if (json_is_string(v) && json_string_length(v) <= PATH_MAX_LEN)
                        json_object_set(o, strs[i], v);
        }
        json_t *sz = json_object_get(e, "size"), *md = json_object_get(e, "mode");
        if (json_is_integer(sz) && json_integer_value(sz) >= 0)
                json_object_set(o, "size", sz);
        if (json_is_integer(md) && json_integer_value(md) >= 0)
                json_object_set_new(o, "mode", json_integer(json_integer_value(md) & 07777));
        return o;
}

struct getctx {
        struct cove_chan *c;
        struct cove_xfer *x;
};

static ssize_t get_read(void *ctx, uint64_t pos, char *buf, size_t max)
{
        struct getctx *g = ctx;
        struct cove_err err;
        long n = cove_chan_xfer_read(g->x, buf, max, 60000, &err);
        if (n > 0)
                return n;
        return n == 0 ? -1 : -2;
}

static void get_free(void *ctx)
{
        struct getctx *g = ctx;
        cove_chan_xfer_free(g->x);
        cove_chan_unref(g->c);
        free(g);
}

int cove_h_file_get(void *app, struct cove_req *r)
{
        struct coved *d = app;
        const char *path = query_path(r, "path");
        if (!path)
                return 0;
        struct cove_chan *c = cove_req_chan(d, r, NULL);
        if (!c)
                return 0;
        struct cove_xfer *x = NULL;
        uint64_t size;
        uint32_t mode;
        struct cove_err err;
        if (cove_chan_read_begin(c, path, &x, &size, &mode, &err) < 0) {
                cove_chan_unref(c);
                return cove_reply_err(r, &err);
        }
        struct getctx *g = calloc(1, sizeof(*g));
        if (!g) {
                cove_chan_xfer_free(x);
                cove_chan_unref(c);
                return cove_reply_error(r, 500, "internal", "out of memory");
        }
        g->c = c;
        g->x = x;
        /* a Content-Length only when the whole body is known before the first byte: a
         * file that changes while it streams, or a pseudo-file whose size says nothing,
         * then never breaks the answer (a longer one streams without a length) */
        uint64_t len;
        int whole = cove_chan_xfer_prefetch(x, 60000, &len, &err);
        if (whole < 0) {
                get_free(g);
                return cove_reply_err(r, &err);
        }
        return cove_reply_stream(r, 200, "application/octet-stream", whole ? (int64_t)len : -1,
                                 get_read, get_free, g);
}

struct putctx {
        struct cove_chan *c;
        struct cove_xfer *x;
        struct cove_err err;
        int failed;
        int answered; /* an error reply is due */
};

static void put_cleanup(void *app, struct cove_req *r)
{
        struct putctx *p = r->state;
        if (!p)
                return;
        cove_chan_xfer_free(p->x); /* aborts an unfinished upload: the old file stays */
        if (p->c)
                cove_chan_unref(p->c);
        free(p);
        r->state = NULL;
}

static int parse_mode(const char *m, unsigned *mode)
{
        if (!m) {
                *mode = 0644;
                return 0;
        }
        char *end;
        errno = 0;
        unsigned long v = strtoul(m, &end, 8);
        if (!*m || *end || errno || v > 07777)
                return -1;
        *mode = (unsigned)v;
        return 0;
}

/* First piece of the upload (or the end of an empty one): open the transfer. */
static int put_begin(struct coved *d, struct cove_req *r)
{
        struct putctx *p = calloc(1, sizeof(*p));
        if (!p)
                return -1;
        r->state = p;
        r->cleanup = put_cleanup;
        const char *path = cove_req_query(r, "path");
        const char *why = check_path(path);
        unsigned mode;
        if (why) {
                cove_err_setk(&p->err, COVE_E_BAD_REQUEST, 0, "%s", why);
                p->failed = 1;
                return -1;
        }
        if (parse_mode(cove_req_query(r, "mode"), &mode) < 0) {
                cove_err_setk(&p->err, COVE_E_BAD_REQUEST, 0,
                              "mode must be octal permission bits, e.g. 0644");
                p->failed = 1;
                return -1;
        }
        struct cove_sandbox_row row;
        if (cove_sandbox_chan(d, r->tenant, r->params[0], &p->c, &row, &p->err) < 0) {
                p->failed = 1;
                return -1;
        }
        cove_sandbox_row_clear(&row);
        if (cove_chan_write_begin(p->c, path, mode, NULL, &p->x, &p->err) < 0) {
                p->failed = 1;
                return -1;
        }
        return 0;
}

int cove_up_file_put(void *app, struct cove_req *r, const char *data, size_t len)
{
        struct coved *d = app;
        if (!r->state && put_begin(d, r) < 0)
                return -1;
        struct putctx *p = r->state;
        if (p->failed)
                return -1;
        if (cove_chan_xfer_write(p->x, data, len, &p->err) < 0) {
                p->failed = 1;
                return -1;
        }
        return 0;
}

int cove_h_file_put(void *app, struct cove_req *r)
{
        struct coved *d = app;
        if (!r->state)
                put_begin(d, r);
        struct putctx *p = r->state;
        if (!p)
                return cove_reply_error(r, 500, "internal", "out of memory");
        if (p->failed)
                return cove_reply_err(r, &p->err);
        json_t *entry = NULL;
        if (cove_chan_write_finish(p->x, &entry, &p->err) < 0)
                return cove_reply_err(r, &p->err);
        json_t *e = clean_entry(entry);
        json_decref(entry);
        coved_audit_control(
            d, r->tenant, r->params[0], "file.write",
            json_pack("{s:s}", "path", cove_req_query(r, "path") ? cove_req_query(r, "path") : ""));
        return cove_reply_json(r, 200, e ? e : json_object());
}

/* Send a request and answer with a checked projection of the reply. */
static int fs_call(struct coved *d, struct cove_req *r, json_t *req, int want_entries)
{
        struct cove_chan *c = cove_req_chan(d, r, NULL);
        if (!c) {
                json_decref(req);
                return 0;
        }
        json_t *resp = NULL;
        struct cove_err err;
        int rc = cove_chan_call(c, req, &resp, 0, &err);
        json_decref(req);
        cove_chan_unref(c);
        if (rc < 0)
                return cove_reply_err(r, &err);
        json_t *out;
        if (want_entries) {
                json_t *arr = json_array(), *src = json_object_get(resp, "entries"), *e;
                size_t i;
                json_array_foreach(src, i, e)
                {
                        json_t *ce = clean_entry(e);
                        if (ce)
                                json_array_append_new(arr, ce);
                }
                out = json_pack("{s:o}", "entries", arr);
        } else {
                json_t *ce = clean_entry(json_object_get(resp, "entry"));
                out = ce ? ce : json_object();
        }
        json_decref(resp);
        return cove_reply_json(r, 200, out);
}

int cove_h_fs_list(void *app, struct cove_req *r)
{
        const char *path = query_path(r, "path");
        if (!path)
                return 0;
        const char *ds = cove_req_query(r, "depth");
        long depth = 1;
        if (ds) {
                char *end;
                depth = strtol(ds, &end, 10);
                if (!*ds || *end || depth < 1 || depth > 32)
                        return cove_reply_error(r, 400, "bad_request",
                                                "depth must be an integer from 1 to 32");
        }
        return fs_call(
            app, r, json_pack("{s:s, s:s, s:i}", "op", "list", "path", path, "depth", (int)depth),
            1);
}

static json_t *body_paths(struct cove_req *r, const char *k1, const char *k2)
{
        json_t *body = cove_req_json(r, 0);
        if (!body)
                return NULL;
        const char *keys[2] = {k1, k2};
        for (int i = 0; i < 2 && keys[i]; i++) {
                json_t *v = json_object_get(body, keys[i]);
                const char *why =
                    json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v)
                        ? check_path(json_string_value(v))
                        : "must be a string path";
                if (why) {
                        cove_reply_error(r, 400, "bad_request", "%s: %s", keys[i], why);
                        json_decref(body);
                        return NULL;
                }
        }
        return body;
}

int cove_h_fs_mkdir(void *app, struct cove_req *r)
{
        json_t *b = body_paths(r, "path", NULL);
        if (!b)
                return 0;
        json_t *req = json_pack("{s:s, s:O}", "op", "mkdir", "path", json_object_get(b, "path"));
        json_decref(b);
        return fs_call(app, r, req, 0);
}

int cove_h_fs_move(void *app, struct cove_req *r)
{
        json_t *b = body_paths(r, "from", "to");
        if (!b)
                return 0;
        json_t *req = json_pack("{s:s, s:O, s:O}", "op", "move", "from", json_object_get(b, "from"),
                                "to", json_object_get(b, "to"));
        json_decref(b);
        return fs_call(app, r, req, 0);
}

int cove_h_fs_remove(void *app, struct cove_req *r)
{
        json_t *b = body_paths(r, "path", NULL);
        if (!b)
                return 0;
        json_t *rec = json_object_get(b, "recursive");
        if (rec && !json_is_boolean(rec) && !json_is_null(rec)) {
                json_decref(b);
                return cove_reply_error(r, 400, "bad_request", "recursive must be a boolean");
        }
        json_t *req = json_pack("{s:s, s:O, s:b}", "op", "remove", "path",
                                json_object_get(b, "path"), "recursive", json_is_true(rec));
        json_decref(b);
        return cove_simple_call(app, r, req);
}

int cove_h_fs_watch(void *app, struct cove_req *r)
{
        struct coved *d = app;
        const char *path = query_path(r, "path");
        if (!path)
                return 0;
        const char *rec = cove_req_query(r, "recursive");
        struct cove_chan *c = cove_req_chan(d, r, NULL);
        if (!c)
                return 0;
        struct cove_watch *w = NULL;
        struct cove_err err;
        if (cove_chan_watch(c, path, rec && !strcmp(rec, "true"), &w, &err) < 0) {
                cove_chan_unref(c);
                return cove_reply_err(r, &err);
        }
        return cove_reply_events(d, r, c, w, 0, 0);
}
