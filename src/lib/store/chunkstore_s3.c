/* S3-compatible chunk store backend (store/chunkstore.h): one object per name under
 * s3://BUCKET/PREFIX, path-style requests signed by libcurl (CURLOPT_AWS_SIGV4) with the
 * body's real SHA-256, so the server verifies what it stores. Every answer is untrusted:
 * sizes are bounded before and while reading, XML goes through store/s3xml.c, listed
 * names are validated. Every request has a deadline; transient failures (connection
 * errors, timeouts, 5xx, 429) are retried with exponential backoff and full jitter inside
 * a bounded total time. The secret key is held only in the handle and curl's copy of it;
 * it never enters a message. */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/chunkstore.h"
#include "store/s3xml.h"
#include "util/util.h"

#define S3_IDLE_MAX 16           /* idle curl handles (and their connections) kept */
#define S3_SMALL_MAX (1u << 20)  /* bound of a non-object answer (error, copy result) */
#define S3_LIST_MAX (8u << 20)   /* bound of one listing page */
#define S3_LIST_KEYS 1000        /* max-keys per page */
#define S3_LIST_PAGES (1u << 20) /* a server that never stops paging is an error */
#define S3_BACKOFF_BASE_MS 100
#define S3_BACKOFF_CAP_MS 2000
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* A curl handle and the socket of its current connection (recorded when curl opens it,
 * forgotten when curl closes it). */
struct s3_conn {
        CURL *c;
        curl_socket_t fd;
};

struct s3_store {
        struct cove_chunkstore base;
        char endpoint[512]; /* scheme://host[:port], no trailing '/' */
        char bucket[64];
        char prefix[192]; /* "" or "a/b/" */
        char sigv4[128];  /* "aws:amz:REGION:s3" */
        char *userpwd;    /* "AK:SK": secret; wiped at close */
        long timeout_ms, connect_ms, budget_ms;
        int attempts;
        int page_keys;
        void (*before_delete)(const char *name, void *arg);
        void *hook_arg;
        pthread_mutex_t mu; /* idle, cond_del, rng */
        struct s3_conn *idle[S3_IDLE_MAX];
        int nidle;
        int cond_del; /* 0 not probed, 1 the server honours conditional deletes, -1 not */
        uint64_t rng;
};

struct cove_cs_batch {
        pthread_mutex_t lock;
        int failed; /* first put error, reported by commit */
        struct cove_err err;
};

struct s3_resp {
        long status;
        uint8_t *body;
        size_t len, cap, max;
        size_t obj_max;       /* bound of a 2xx answer's body */
        struct s3_conn *conn; /* the handle answering (for its socket) */
        int too_big;          /* Content-Length or body above max */
        int64_t clen;         /* Content-Length, -1 if none */
        int64_t lm_ms;        /* Last-Modified, -1 if none */
        char etag[72];        /* without quotes */
};

static void resp_reset(struct s3_resp *r)
{
        free(r->body);
        r->body = NULL;
        r->len = r->cap = 0;
        r->status = 0;
        r->too_big = 0;
        r->clen = -1;
        r->lm_ms = -1;
        r->etag[0] = '\0';
}

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
        struct s3_resp *r = arg;
        size_t k = sz * n;
        if (r->too_big || k > r->max - r->len) {
                r->too_big = 1;
                return 0; /* abort: CURLE_WRITE_ERROR */
        }
        if (r->len + k > r->cap) {
                size_t nc = r->cap ? r->cap : 16384;
                while (nc < r->len + k)
                        nc *= 2;
                if (nc > r->max)
                        nc = r->max;
                uint8_t *nb = realloc(r->body, nc ? nc : 1);
                if (!nb)
                        return 0;
                r->body = nb;
                r->cap = nc;
        }
        memcpy(r->body + r->len, p, k);
        r->len += k;
        return k;
}

static void quickack(struct s3_resp *r);

/* Header lines of the final answer; a new status line (100 Continue) starts over. */
static size_t on_header(char *p, size_t sz, size_t n, void *arg)
{
        struct s3_resp *r = arg;
        size_t k = sz * n;
        char line[256];
        if (k >= 5 && !memcmp(p, "HTTP/", 5)) {
                /* an error answer is bounded by S3_SMALL_MAX, not by the object's bound */
                const char *sp = memchr(p, ' ', k);
                long st = sp && (size_t)(sp - p) + 4 <= k ? strtol(sp + 1, NULL, 10) : 0;
                r->max = st >= 200 && st < 300 ? r->obj_max : S3_SMALL_MAX;
                r->clen = -1;
                r->lm_ms = -1;
                r->etag[0] = '\0';
                return k;
        }
        if (k <= 2) { /* the blank line: headers done */
                quickack(r);
                return k;
        }
        if (k >= sizeof(line))
                return k; /* no header we read is that long */
        memcpy(line, p, k);
        line[k] = '\0';
        while (k && (line[k - 1] == '\r' || line[k - 1] == '\n'))
                line[--k] = '\0';
        char *colon = strchr(line, ':');
        if (!colon)
                return k ? sz * n : sz * n;
        *colon = '\0';
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
                v++;
        if (!strcasecmp(line, "Content-Length")) {
                uint64_t x = 0;
                int ok = *v != '\0' && strlen(v) <= 18;
                for (const char *q = v; ok && *q; q++) {
                        ok = *q >= '0' && *q <= '9';
                        x = x * 10 + (uint64_t)(*q - '0');
                }
                if (!ok)
                        return 0; /* a length we cannot read: refuse the answer */
                r->clen = (int64_t)x;
                if (x > r->max)
                        r->too_big = 1; /* told now; the body is refused when it comes */
        } else if (!strcasecmp(line, "Last-Modified")) {
                r->lm_ms = cove_s3_parse_http_date(v);
        } else if (!strcasecmp(line, "ETag")) {
                size_t l = strlen(v);
                if (l >= 2 && v[0] == '"' && v[l - 1] == '"') {
                        v++;
                        l -= 2;
                }
                if (l < sizeof(r->etag)) {
                        memcpy(r->etag, v, l);
                        r->etag[l] = '\0';
                }
        }
        return sz * n;
}

/* radosgw writes an error or copy answer as two segments (headers, body), the second held
 * back by Nagle until the first is ACKed; on a kept-alive connection the kernel delays that
 * ACK (~40 ms per request, the bulk of a touch or a 412). So once the headers are in, a
 * pending ACK is sent at once (TCP_QUICKACK set also flushes it). */
static void quickack(struct s3_resp *r)
{
        int one = 1;
        if (r->conn && r->conn->fd != CURL_SOCKET_BAD)
                setsockopt(r->conn->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
}

static int on_sockopt(void *arg, curl_socket_t fd, curlsocktype purpose)
{
        (void)purpose;
        ((struct s3_conn *)arg)->fd = fd;
        return CURL_SOCKOPT_OK;
}

static int on_close(void *arg, curl_socket_t fd)
{
        struct s3_conn *k = arg;
        if (k->fd == fd)
                k->fd = CURL_SOCKET_BAD;
        return close(fd);
}

static void conn_free(struct s3_conn *k)
{
        if (!k)
                return;
        curl_easy_cleanup(k->c); /* closes its connections through on_close: k still valid */
        free(k);
}

static struct s3_conn *handle_get(struct s3_store *s)
{
        pthread_mutex_lock(&s->mu);
        struct s3_conn *k = s->nidle ? s->idle[--s->nidle] : NULL;
        pthread_mutex_unlock(&s->mu);
        if (k) {
                curl_easy_reset(k->c); /* keeps the connection cache */
                return k;
        }
        if (!(k = calloc(1, sizeof(*k))))
                return NULL;
        k->fd = CURL_SOCKET_BAD;
        if (!(k->c = curl_easy_init())) {
                free(k);
                return NULL;
        }
        return k;
}

static void handle_put(struct s3_store *s, struct s3_conn *k)
{
        pthread_mutex_lock(&s->mu);
        if (s->nidle < S3_IDLE_MAX) {
                s->idle[s->nidle++] = k;
                k = NULL;
        }
        pthread_mutex_unlock(&s->mu);
        conn_free(k);
}

static uint64_t rand_below(struct s3_store *s, uint64_t n)
{
        pthread_mutex_lock(&s->mu);
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        uint64_t v = s->rng;
        pthread_mutex_unlock(&s->mu);
        return n ? v % n : 0;
}

/* Percent-encode for a canonical SigV4 query value: unreserved characters stay. */
static int pct_encode(const char *in, char *out, size_t cap)
{
        static const char hx[] = "0123456789ABCDEF";
        size_t o = 0;
        for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
                int keep = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                           (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.' ||
                           *p == '~';
                if (o + 4 > cap)
                        return -1;
                if (keep) {
                        out[o++] = (char)*p;
                } else {
                        out[o++] = '%';
                        out[o++] = hx[*p >> 4];
                        out[o++] = hx[*p & 15];
                }
        }
        out[o] = '\0';
        return 0;
}

static void sha256_hex(const void *d, size_t n, char out[65])
{
        unsigned char md[32];
        unsigned ml = 0;
        EVP_Digest(d, n, md, &ml, EVP_sha256(), NULL);
        cove_hex(md, 32, out);
}

static void md5_hex(const void *d, size_t n, char out[33])
{
        unsigned char md[16];
        unsigned ml = 0;
        EVP_Digest(d, n, md, &ml, EVP_md5(), NULL);
        cove_hex(md, 16, out);
}

static int retryable_curl(CURLcode rc)
{
        switch (rc) {
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_OPERATION_TIMEDOUT:
        case CURLE_SEND_ERROR:
        case CURLE_RECV_ERROR:
        case CURLE_GOT_NOTHING:
        case CURLE_PARTIAL_FILE:
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
                return 1;
        default:
                return 0;
        }
}

struct s3_req {
        const char *method; /* GET HEAD PUT DELETE */
        const char *key;    /* full object key (prefix included), NULL: the bucket */
        const char *query;  /* canonical query string, or NULL */
        const void *body;
        size_t body_len;
        int upload; /* PUT: send body (possibly empty) */
        const char *hdr[6];
        int nhdr;
        size_t max;       /* bound of the answer's body */
        const char *what; /* object name for messages */
};

/* One attempt. Returns the curl code; r->status holds the HTTP status. */
static CURLcode attempt(struct s3_store *s, const struct s3_req *q, struct s3_resp *r,
                        long timeout_ms)
{
        struct s3_conn *k = handle_get(s);
        if (!k)
                return CURLE_OUT_OF_MEMORY;
        CURL *c = k->c;
        char url[8192]; /* endpoint + bucket + key + a query with an encoded token */
        snprintf(url, sizeof(url), "%s/%s%s%s%s%s", s->endpoint, s->bucket, q->key ? "/" : "/",
                 q->key ? q->key : "", q->query ? "?" : "", q->query ? q->query : "");
        char sha[65], shahdr[96];
        if (q->upload)
                sha256_hex(q->body ? q->body : "", q->body_len, sha);
        else
                strcpy(sha, EMPTY_SHA256);
        snprintf(shahdr, sizeof(shahdr), "x-amz-content-sha256: %s", sha);
        /* (no "Expect:" to suppress 100-continue: curl 7.88 signs the empty header it
         * then does not send, and the signature fails) */
        struct curl_slist *h = curl_slist_append(NULL, shahdr), *t;
        if (h && q->upload && (t = curl_slist_append(h, "Content-Type: application/octet-stream")))
                h = t;
        for (int i = 0; h && i < q->nhdr; i++)
                if ((t = curl_slist_append(h, q->hdr[i])))
                        h = t;
        resp_reset(r);
        r->max = r->obj_max = q->max;
        r->conn = k;
        curl_easy_setopt(c, CURLOPT_SOCKOPTFUNCTION, on_sockopt);
        curl_easy_setopt(c, CURLOPT_SOCKOPTDATA, k);
        curl_easy_setopt(c, CURLOPT_CLOSESOCKETFUNCTION, on_close);
        curl_easy_setopt(c, CURLOPT_CLOSESOCKETDATA, k);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4);
        curl_easy_setopt(c, CURLOPT_USERPWD, s->userpwd);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                         s->connect_ms < timeout_ms ? s->connect_ms : timeout_ms);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
        curl_easy_setopt(c, CURLOPT_VERBOSE, 0L);
        if (!strcmp(q->method, "HEAD")) {
                curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        } else if (q->upload) {
                /* the body is in memory: sent as "POST fields" under PUT, in one go (an
                 * UPLOAD through a read callback cost ~40 ms per empty-bodied copy here) */
                curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
                curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body ? q->body : "");
        } else if (strcmp(q->method, "GET")) {
                curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
        }
        CURLcode rc = curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
        curl_slist_free_all(h);
        /* a connection that carried a refused or cut answer is not reused */
        r->conn = NULL;
        if (rc != CURLE_OK)
                conn_free(k);
        else
                handle_put(s, k);
        return rc;
}

static const char *curl_why(CURLcode rc)
{
        return curl_easy_strerror(rc); /* static text: never the URL or credentials */
}

/* Run q with retries. Returns the final HTTP status (2xx..4xx the caller interprets), or
 * -1 with err set (transport failure, 5xx after the budget, an answer too large).
 * *tries gets the number of attempts made. */
static long request(struct s3_store *s, const struct s3_req *q, struct s3_resp *r, int *tries,
                    struct cove_err *err)
{
        int64_t t0 = cove_mono_ns();
        char last[160] = "";
        int n = 0;
        for (;;) {
                int64_t spent = (cove_mono_ns() - t0) / 1000000;
                long left = s->budget_ms - (long)spent;
                long tmo = s->timeout_ms < left ? s->timeout_ms : left;
                if (tmo < 1)
                        tmo = 1;
                CURLcode rc = attempt(s, q, r, tmo);
                n++;
                if (tries)
                        *tries = n;
                if (r->too_big)
                        return cove_err_setk(err, COVE_E_LIMIT, EFBIG,
                                             "s3 %s %s: answer larger than %zu bytes", q->method,
                                             q->what, q->max);
                int retry = 0;
                if (rc != CURLE_OK) {
                        if (rc == CURLE_OUT_OF_MEMORY)
                                return cove_err_set(err, ENOMEM, "s3 %s %s", q->method, q->what);
                        retry = retryable_curl(rc);
                        snprintf(last, sizeof(last), "%s", curl_why(rc));
                        if (!retry)
                                return cove_err_setk(err, COVE_E_UNAVAILABLE, EIO, "s3 %s %s: %s",
                                                     q->method, q->what, last);
                } else if (r->status >= 500 || r->status == 429) {
                        retry = 1;
                        snprintf(last, sizeof(last), "HTTP %ld", r->status);
                } else if (r->clen >= 0 && strcmp(q->method, "HEAD") &&
                           (uint64_t)r->clen != r->len) {
                        /* curl stops at Content-Length; a body cut short is caught above */
                        retry = 1;
                        snprintf(last, sizeof(last), "answer of %zu bytes, Content-Length %" PRId64,
                                 r->len, r->clen);
                } else {
                        return r->status;
                }
                spent = (cove_mono_ns() - t0) / 1000000;
                uint64_t cap = S3_BACKOFF_BASE_MS << (n < 5 ? n : 5);
                if (cap > S3_BACKOFF_CAP_MS)
                        cap = S3_BACKOFF_CAP_MS;
                uint64_t wait = rand_below(s, cap + 1);
                if (n >= s->attempts || spent + (int64_t)wait >= s->budget_ms)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, EIO,
                                             "s3 %s %s: %s (after %d attempts in %.1f s)",
                                             q->method, q->what, last, n, (double)spent / 1000.0);
                struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000};
                nanosleep(&ts, NULL);
        }
}

/* An unexpected status: the message names the object and the server's error code. */
static int status_err(const struct s3_req *q, const struct s3_resp *r, struct cove_err *err)
{
        char code[64] = "";
        if (r->len)
                cove_s3_parse_error((const char *)r->body, r->len, code, NULL);
        enum cove_err_kind k = r->status == 401 || r->status == 403 ? COVE_E_UNAUTHORIZED
                               : r->status == 404                   ? COVE_E_NOT_FOUND
                                                                    : COVE_E_UNAVAILABLE;
        return cove_err_setk(err, k, 0, "s3 %s %s: HTTP %ld%s%s", q->method, q->what, r->status,
                             code[0] ? " " : "", code);
}

static int key_of(struct s3_store *s, const char *name, char *out, size_t cap, struct cove_err *err)
{
        if (!cove_cs_name_valid(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid object name");
        if ((size_t)snprintf(out, cap, "%s%s", s->prefix, name) >= cap)
                return cove_err_set(err, ENAMETOOLONG, "object %s", name);
        return 0;
}

static int s3_head(struct s3_store *s, const char *key, const char *name, struct s3_resp *r,
                   struct cove_err *err)
{
        struct s3_req q = {.method = "HEAD", .key = key, .max = SIZE_MAX, .what = name};
        long st = request(s, &q, r, NULL, err);
        if (st < 0)
                return -1;
        if (st == 404)
                return 0;
        if (st != 200)
                return status_err(&q, r, err);
        return 1;
}

static int s3_put(struct cove_chunkstore *cs, struct cove_cs_batch *b, const char *name,
                  const void *data, size_t len, struct cove_err *err)
{
        struct s3_store *s = (struct s3_store *)cs;
        char key[512];
        struct cove_err e2 = {0};
        struct cove_err *e = err ? err : &e2;
        int rc = key_of(s, name, key, sizeof(key), e);
        struct s3_resp r = {0};
        if (rc == 0) {
                /* A single PUT: multipart completion overwrites an existing key even with
                 * If-None-Match on radosgw, so objects are never uploaded in parts. */
                struct s3_req q = {.method = "PUT",
                                   .key = key,
                                   .body = data,
                                   .body_len = len,
                                   .upload = 1,
                                   .hdr = {"If-None-Match: *"},
                                   .nhdr = 1,
                                   .max = S3_SMALL_MAX,
                                   .what = name};
                int tries = 0;
                long st = request(s, &q, &r, &tries, e);
                if (st < 0) {
                        rc = -1;
                } else if (st == 200 || st == 201) {
                        rc = 0;
                } else if (st == 412) {
                        rc = 1;
                        /* After a retry the earlier attempt may be the one that landed: the
                         * object is ours if it holds our bytes (single-PUT ETag = MD5). */
                        if (tries > 1) {
                                char md5[33];
                                md5_hex(data, len, md5);
                                int h = s3_head(s, key, name, &r, e);
                                if (h < 0)
                                        rc = -1;
                                else if (h == 1 && !strcmp(r.etag, md5))
                                        rc = 0;
                        }
                } else {
                        rc = status_err(&q, &r, e);
                }
        }
        resp_reset(&r);
        if (rc < 0 && b) {
                pthread_mutex_lock(&b->lock);
                if (!b->failed) {
                        b->failed = 1;
                        b->err = *e;
                }
                pthread_mutex_unlock(&b->lock);
        }
        return rc;
}

static int s3_get(struct cove_chunkstore *cs, const char *name, size_t max, void **out, size_t *len,
                  struct cove_err *err)
{
        struct s3_store *s = (struct s3_store *)cs;
        char key[512];
        if (key_of(s, name, key, sizeof(key), err) < 0)
                return -1;
        struct s3_req q = {.method = "GET", .key = key, .max = max, .what = name};
        struct s3_resp r = {0};
        long st = request(s, &q, &r, NULL, err);
        int rc = 0;
        if (st < 0)
                rc = -1;
        else if (st == 404)
                rc = cove_err_setk(err, COVE_E_NOT_FOUND, ENOENT, "object %s", name);
        else if (st != 200)
                rc = status_err(&q, &r, err);
        else if (r.clen < 0 || (uint64_t)r.clen != r.len)
                /* an object answer without its length cannot be checked for truncation */
                rc = cove_err_setk(err, COVE_E_UNAVAILABLE, EIO,
                                   "s3 GET %s: answer without a matching Content-Length", name);
        if (rc < 0) {
                resp_reset(&r);
                return -1;
        }
        *out = r.body ? r.body : malloc(1);
        if (!*out)
                return cove_err_set(err, ENOMEM, "read object %s", name);
        *len = r.len;
        return 0;
}

static int s3_has(struct cove_chunkstore *cs, const char *name, struct cove_err *err)
{
        struct s3_store *s = (struct s3_store *)cs;
        char key[512];
        if (key_of(s, name, key, sizeof(key), err) < 0)
                return -1;
        struct s3_resp r = {0};
        int rc = s3_head(s, key, name, &r, err);
        resp_reset(&r);
        return rc;
}

/* Copy the object onto itself with fresh metadata: S3's way to set its Last-Modified to now
 * without sending the content again. A 200 can still carry an <Error> (S3 sends the status
 * before the copy finishes), so the body is read too. */
static int s3_touch(struct cove_chunkstore *cs, const char *name, struct cove_err *err)
{
        struct s3_store *s = (struct s3_store *)cs;
        char key[512], src[600], meta[64];
        if (key_of(s, name, key, sizeof(key), err) < 0)
                return -1;
        snprintf(src, sizeof(src), "x-amz-copy-source: /%s/%s", s->bucket, key);
        snprintf(meta, sizeof(meta), "x-amz-meta-cove-touched: %" PRId64, cove_now_ms());
        struct s3_req q = {.method = "PUT",
                           .key = key,
                           .upload = 1,
                           .hdr = {src, "x-amz-metadata-directive: REPLACE", meta},
                           .nhdr = 3,
                           .max = S3_SMALL_MAX,
                           .what = name};
        struct s3_resp r = {0};
        long st = request(s, &q, &r, NULL, err);
        int rc;
        char code[64];
        if (st < 0)
                rc = -1;
        else if (st == 404)
                rc = 0;
        else if (st != 200)
                rc = status_err(&q, &r, err);
        else if (cove_s3_parse_error((const char *)r.body, r.len, code, NULL) != 0)
                rc = cove_err_setk(err, COVE_E_UNAVAILABLE, EIO, "s3 copy %s: %s", name,
                                   code[0] ? code : "malformed answer");
        else
                rc = 1;
        resp_reset(&r);
        return rc;
}

/* Does the server honour x-amz-delete-if-unmodified-since? Without it GC against a shared
 * store would be unsafe, so it is checked once per handle, on a private object (a name
 * component starting with '.' is never a chunk-store name), before the first conditional
 * delete: a delete conditioned on a day ago must be refused (412) and leave the object. */
static int probe_cond_delete(struct s3_store *s, struct cove_err *err)
{
        pthread_mutex_lock(&s->mu);
        int known = s->cond_del;
        pthread_mutex_unlock(&s->mu);
        if (known)
                return known > 0 ? 1 : -2;
        uint8_t rnd[8];
        char hex[17], key[512], cond[96];
        if (cove_random(rnd, sizeof(rnd), err) < 0)
                return -1;
        cove_hex(rnd, sizeof(rnd), hex);
        snprintf(key, sizeof(key), "%s.cove-probe/%s", s->prefix, hex);
        struct s3_resp r = {0};
        struct s3_req put = {.method = "PUT",
                             .key = key,
                             .body = "probe",
                             .body_len = 5,
                             .upload = 1,
                             .max = S3_SMALL_MAX,
                             .what = "conditional-delete probe"};
        long st = request(s, &put, &r, NULL, err);
        if (st != 200) {
                if (st > 0)
                        status_err(&put, &r, err);
                resp_reset(&r);
                return -1;
        }
        snprintf(cond, sizeof(cond), "x-amz-delete-if-unmodified-since: %lld.000000",
                 (long long)(time(NULL) - 86400));
        struct s3_req del = {.method = "DELETE",
                             .key = key,
                             .hdr = {cond},
                             .nhdr = 1,
                             .max = S3_SMALL_MAX,
                             .what = "conditional-delete probe"};
        long cst = request(s, &del, &r, NULL, err);
        int h = cst < 0 ? -1 : s3_head(s, key, "conditional-delete probe", &r, err);
        del.nhdr = 0;
        request(s, &del, &r, NULL, NULL);
        resp_reset(&r);
        if (cst < 0 || h < 0)
                return -1;
        int ok = cst == 412 && h == 1;
        pthread_mutex_lock(&s->mu);
        s->cond_del = ok ? 1 : -1;
        pthread_mutex_unlock(&s->mu);
        return ok ? 1 : -2;
}

/* GC's delete. S3 has no rename to move an object aside, so the check and the delete are
 * made one operation on the server: x-amz-delete-if-unmodified-since (radosgw evaluates it
 * in the same RADOS operation that removes the object, against the mtime a concurrent
 * touch() sets). A HEAD first answers "gone" and "too new" without a write. Precision:
 * the server compares whole seconds (Last-Modified has no more), so the cutoff is rounded
 * down to the previous second; an object is kept rather than deleted in doubt. */
static int s3_del(struct cove_chunkstore *cs, const char *name, int64_t not_after_ms,
                  struct cove_err *err)
{
        struct s3_store *s = (struct s3_store *)cs;
        char key[512], cond[96];
        if (key_of(s, name, key, sizeof(key), err) < 0)
                return -1;
        int conditional = not_after_ms != INT64_MAX;
        if (conditional) {
                int p = probe_cond_delete(s, err);
                if (p == -1)
                        return cove_err_wrap(err, "delete %s", name);
                if (p == -2)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "delete %s: the S3 store does not honour "
                                             "x-amz-delete-if-unmodified-since, so a "
                                             "delete could race a writer's touch; "
                                             "refusing (use radosgw)",
                                             name);
        }
        struct s3_resp r = {0};
        int h = s3_head(s, key, name, &r, err);
        int64_t lm = r.lm_ms;
        resp_reset(&r);
        if (h <= 0)
                return h;
        if (conditional && (lm < 0 || lm >= not_after_ms))
                return 0;
        if (s->before_delete)
                s->before_delete(name, s->hook_arg);
        struct s3_req q = {.method = "DELETE", .key = key, .max = S3_SMALL_MAX, .what = name};
        if (conditional) {
                long long sec = (long long)(not_after_ms / 1000) - 1;
                snprintf(cond, sizeof(cond), "x-amz-delete-if-unmodified-since: %lld.000000",
                         sec < 0 ? 0 : sec);
                q.hdr[0] = cond;
                q.nhdr = 1;
        }
        long st = request(s, &q, &r, NULL, err);
        int rc;
        if (st < 0)
                rc = -1;
        else if (st == 204 || st == 200)
                rc = 1;
        else if (st == 412 || st == 404)
                rc = 0; /* touched meanwhile, or already gone */
        else
                rc = status_err(&q, &r, err);
        resp_reset(&r);
        return rc;
}

struct list_state {
        struct s3_store *s;
        const char *want; /* full key prefix */
        size_t plen;      /* store prefix length */
        cove_cs_list_cb cb;
        void *arg;
        char last[1025]; /* keys must come in ascending order: progress, and no loop */
        int stopped;
};

static int list_entry(const char *key, uint64_t size, int64_t mtime_ms, void *arg,
                      struct cove_err *err)
{
        struct list_state *ls = arg;
        if (ls->stopped)
                return 0;
        if (strncmp(key, ls->want, strlen(ls->want)))
                return cove_err_set(err, 0, "listing: key outside the requested prefix");
        if (ls->last[0] && strcmp(key, ls->last) <= 0)
                return cove_err_set(err, 0, "listing: keys not in ascending order");
        snprintf(ls->last, sizeof(ls->last), "%s", key);
        const char *name = key + ls->plen;
        if (!cove_cs_name_valid(name))
                return 0; /* not a chunk-store object (another tool's, or a probe) */
        if (ls->cb(name, size, mtime_ms, ls->arg) < 0)
                ls->stopped = 1;
        return 0;
}

static int s3_list(struct cove_chunkstore *cs, const char *prefix, cove_cs_list_cb cb, void *arg,
                   struct cove_err *err)
{
        struct s3_store *s = (struct s3_store *)cs;
        size_t pl = strlen(prefix);
        char probe[256], want[512], enc[1600], tok[1025] = "", etok[3200], query[5000];
        if (pl < 2 || prefix[pl - 1] != '/' || pl >= 250)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid list prefix");
        snprintf(probe, sizeof(probe), "%.*s", (int)(pl - 1), prefix);
        if (!cove_cs_name_valid(probe))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid list prefix");
        snprintf(want, sizeof(want), "%s%s", s->prefix, prefix);
        pct_encode(want, enc, sizeof(enc));
        struct list_state ls = {
            .s = s, .want = want, .plen = strlen(s->prefix), .cb = cb, .arg = arg};
        struct s3_resp r = {0};
        int rc = 0;
        for (unsigned page = 0; rc == 0 && !ls.stopped; page++) {
                if (page >= S3_LIST_PAGES) {
                        rc = cove_err_set(err, 0, "s3 list %s: more than %u pages", prefix,
                                          S3_LIST_PAGES);
                        break;
                }
                /* canonical order: names sorted, values percent-encoded */
                if (tok[0]) {
                        if (pct_encode(tok, etok, sizeof(etok)) < 0) {
                                rc = cove_err_set(err, 0, "s3 list %s: token too long", prefix);
                                break;
                        }
                        snprintf(query, sizeof(query),
                                 "continuation-token=%s&list-type=2&max-keys=%d&prefix=%s", etok,
                                 s->page_keys, enc);
                } else {
                        snprintf(query, sizeof(query), "list-type=2&max-keys=%d&prefix=%s",
                                 s->page_keys, enc);
                }
                struct s3_req q = {
                    .method = "GET", .query = query, .max = S3_LIST_MAX, .what = prefix};
                long st = request(s, &q, &r, NULL, err);
                if (st < 0) {
                        rc = -1;
                        break;
                }
                if (st != 200) {
                        rc = status_err(&q, &r, err);
                        break;
                }
                struct cove_s3_list_page pg;
                if (cove_s3_parse_list((const char *)r.body, r.len, &pg, list_entry, &ls, err) <
                    0) {
                        rc = cove_err_wrap(err, "s3 list %s", prefix);
                        break;
                }
                if (!pg.truncated)
                        break;
                if (!strcmp(pg.next_token, tok) || pg.keys == 0) {
                        rc = cove_err_set(err, 0,
                                          "s3 list %s: a truncated page that does not "
                                          "advance",
                                          prefix);
                        break;
                }
                snprintf(tok, sizeof(tok), "%s", pg.next_token);
        }
        resp_reset(&r);
        return rc;
}

static struct cove_cs_batch *s3_batch_new(struct cove_chunkstore *cs, struct cove_err *err)
{
        (void)cs;
        struct cove_cs_batch *b = calloc(1, sizeof(*b));
        if (!b) {
                cove_err_set(err, ENOMEM, "batch");
                return NULL;
        }
        pthread_mutex_init(&b->lock, NULL);
        return b;
}

/* Puts of a batch are made at once (a single PUT is durable when answered): commit only
 * reports the first put that failed. */
static int s3_batch_commit(struct cove_chunkstore *cs, struct cove_cs_batch *b,
                           struct cove_err *err)
{
        (void)cs;
        pthread_mutex_lock(&b->lock);
        int rc = 0;
        if (b->failed) {
                if (err)
                        *err = b->err;
                rc = -1;
        }
        pthread_mutex_unlock(&b->lock);
        return rc;
}

static void s3_batch_free(struct cove_chunkstore *cs, struct cove_cs_batch *b)
{
        (void)cs;
        if (!b)
                return;
        pthread_mutex_destroy(&b->lock);
        free(b);
}

/* Nothing to recover: a single PUT is atomic, and there are no temp names. A probe object
 * left by a crash is a few bytes under a private name. */
static int s3_recover(struct cove_chunkstore *cs, struct cove_err *err)
{
        (void)cs;
        (void)err;
        return 0;
}

static void s3_close(struct cove_chunkstore *cs)
{
        struct s3_store *s = (struct s3_store *)cs;
        if (!s)
                return;
        for (int i = 0; i < s->nidle; i++)
                conn_free(s->idle[i]);
        if (s->userpwd) {
                OPENSSL_cleanse(s->userpwd, strlen(s->userpwd));
                free(s->userpwd);
        }
        pthread_mutex_destroy(&s->mu);
        free(s);
}

static const struct cove_chunkstore_ops s3_ops = {
    .name = "s3",
    .put = s3_put,
    .get = s3_get,
    .has = s3_has,
    .touch = s3_touch,
    .del = s3_del,
    .list = s3_list,
    .batch_new = s3_batch_new,
    .batch_commit = s3_batch_commit,
    .batch_free = s3_batch_free,
    .recover = s3_recover,
    .close = s3_close,
};

int cove_s3_url_parse(const char *url, char *bucket, size_t bcap, char *prefix, size_t pcap,
                      struct cove_err *err)
{
        if (!url || strncmp(url, "s3://", 5))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "store URL must be s3://BUCKET[/PREFIX]");
        const char *b = url + 5, *slash = strchr(b, '/');
        size_t bl = slash ? (size_t)(slash - b) : strlen(b);
        int ok = bl >= 3 && bl <= 63 && bl < bcap;
        for (size_t i = 0; ok && i < bl; i++)
                ok = (b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
                     b[i] == '.';
        if (!ok)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "store URL: bucket must be 3-63 of [a-z0-9.-]");
        memcpy(bucket, b, bl);
        bucket[bl] = '\0';
        prefix[0] = '\0';
        if (slash && slash[1]) {
                char p[256];
                size_t l = strlen(slash + 1);
                if (l >= sizeof(p) - 1 || l + 2 > pcap)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "store URL: prefix too long");
                memcpy(p, slash + 1, l + 1);
                while (l && p[l - 1] == '/')
                        p[--l] = '\0';
                if (l && !cove_cs_name_valid(p))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "store URL: prefix must be '/'-separated "
                                             "[A-Za-z0-9_.-] components");
                if (l)
                        snprintf(prefix, pcap, "%s/", p);
        }
        return 0;
}

static void curl_init_once(void)
{
        curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct cove_chunkstore *cove_chunkstore_s3_open(const struct cove_s3_opts *o, struct cove_err *err)
{
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, curl_init_once);
        const char *ak = o->access_key ? o->access_key : getenv("AWS_ACCESS_KEY_ID");
        const char *sk = o->secret_key ? o->secret_key : getenv("AWS_SECRET_ACCESS_KEY");
        const char *region = o->region ? o->region : getenv("AWS_REGION");
        if (!region || !*region)
                region = "us-east-1";
        if (!o->endpoint ||
            (strncmp(o->endpoint, "http://", 7) && strncmp(o->endpoint, "https://", 8)) ||
            strlen(o->endpoint) >= 500) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "S3 store: --s3-endpoint must be an http:// or https:// URL");
                return NULL;
        }
        if (!ak || !*ak || !sk || !*sk || strchr(ak, ':')) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "S3 store: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
                return NULL;
        }
        for (const char *p = region; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-') ||
                    p - region > 40) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "S3 store: bad AWS_REGION");
                        return NULL;
                }
        struct s3_store *s = calloc(1, sizeof(*s));
        if (!s) {
                cove_err_set(err, ENOMEM, "S3 store");
                return NULL;
        }
        s->base.ops = &s3_ops;
        pthread_mutex_init(&s->mu, NULL);
        if (cove_s3_url_parse(o->url, s->bucket, sizeof(s->bucket), s->prefix, sizeof(s->prefix),
                              err) < 0)
                goto fail;
        snprintf(s->endpoint, sizeof(s->endpoint), "%s", o->endpoint);
        size_t el = strlen(s->endpoint);
        while (el > 8 && s->endpoint[el - 1] == '/')
                s->endpoint[--el] = '\0';
        if (strchr(s->endpoint + 8, '/') || strchr(s->endpoint, '?') || strchr(s->endpoint, '@')) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "S3 store: --s3-endpoint is scheme://host[:port] only");
                goto fail;
        }
        snprintf(s->sigv4, sizeof(s->sigv4), "aws:amz:%s:s3", region);
        size_t ul = strlen(ak) + strlen(sk) + 2;
        if (!(s->userpwd = malloc(ul))) {
                cove_err_set(err, ENOMEM, "S3 store");
                goto fail;
        }
        snprintf(s->userpwd, ul, "%s:%s", ak, sk);
        s->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 30000;
        s->connect_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 5000;
        s->budget_ms = o->retry_budget_ms > 0 ? o->retry_budget_ms : 2 * s->timeout_ms;
        s->attempts = o->max_attempts > 0 ? o->max_attempts : 8;
        s->page_keys = o->list_page_keys > 0 && o->list_page_keys <= S3_LIST_KEYS
                           ? o->list_page_keys
                           : S3_LIST_KEYS;
        s->before_delete = o->before_delete;
        s->hook_arg = o->hook_arg;
        if (cove_random(&s->rng, sizeof(s->rng), err) < 0)
                goto fail;
        s->rng |= 1;
        if (!o->no_bucket_check) {
                /* the bucket must answer now (credentials, endpoint): a wrong setting fails
                 * at start-up, not at the first snapshot; a missing bucket is created */
                struct s3_req q = {.method = "HEAD", .max = SIZE_MAX, .what = "bucket"};
                struct s3_resp r = {0};
                long st = request(s, &q, &r, NULL, err);
                if (st == 404) {
                        struct s3_req mk = {
                            .method = "PUT", .upload = 1, .max = S3_SMALL_MAX, .what = "bucket"};
                        st = request(s, &mk, &r, NULL, err);
                        if (st >= 0 && st != 200 && st != 409)
                                st = status_err(&mk, &r, err);
                } else if (st >= 0 && st != 200) {
                        st = status_err(&q, &r, err);
                }
                resp_reset(&r);
                if (st < 0) {
                        cove_err_wrap(err, "S3 store s3://%s at %s", s->bucket, s->endpoint);
                        goto fail;
                }
        }
        return &s->base;
fail:
        s3_close(&s->base);
        return NULL;
}
