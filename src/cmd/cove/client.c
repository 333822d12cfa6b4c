/* HTTP client for the cove REST API over libcurl: endpoint/key resolution, requests with the
 * bearer key, a multi-handle poll loop (spinner, extra fds for streaming verbs), JSON calls
 * and the server's `{"error":{code,message}}` shape turned into "code: message". */
#include "client.h"

#include <errno.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/cleanup.h"
#include "util/util.h"

#ifndef COVE_VERSION
#define COVE_VERSION "dev"
#endif

static const char *nonempty_env(const char *name)
{
        const char *v = getenv(name);
        return v && *v ? v : NULL;
}

static char *xstrdup(const char *s)
{
        char *d = strdup(s);
        if (!d) {
                fputs("cove: out of memory\n", stderr);
                exit(CLI_FAIL);
        }
        return d;
}

char *cli_fmt(const char *fmt, ...)
{
        char *s = NULL;
        va_list ap;
        va_start(ap, fmt);
        int n = vasprintf(&s, fmt, ap);
        va_end(ap);
        if (n < 0) {
                fputs("cove: out of memory\n", stderr);
                exit(CLI_FAIL);
        }
        return s;
}

/* Read the admin key next to the socket; the key file is written by coved (mode 0600), so
 * only root (or the coved user) gets here without COVE_API_KEY. */
static void load_admin_key(struct cli *c)
{
        cleanup_free char *dir = xstrdup(c->sock);
        cleanup_free char *path = cli_fmt("%s/admin.key", dirname(dir));
        struct cove_err err = {0};
        char *data = NULL;
        size_t len = 0;
        if (cove_read_file(path, 4096, &data, &len, &err) < 0) {
                snprintf(c->key_note, sizeof(c->key_note),
                         "no API key: set COVE_API_KEY or --api-key (%s)", err.msg);
                return;
        }
        while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r' || data[len - 1] == ' ' ||
                           data[len - 1] == '\t'))
                data[--len] = '\0';
        if (len == 0) {
                free(data);
                snprintf(c->key_note, sizeof(c->key_note), "no API key: %s is empty", path);
                return;
        }
        c->key = data;
}

int cli_connect(struct cli *c, struct cove_err *err)
{
        if (c->base)
                return 0;
        const char *url = c->url_opt && *c->url_opt ? c->url_opt : nonempty_env("COVE_URL");
        const char *data_dir = nonempty_env("COVE_DATA_DIR");
        if (!data_dir)
                data_dir = CLI_DEFAULT_DATA_DIR;

        if (url && strncmp(url, "unix:", 5) == 0) {
                const char *p = url + 5;
                while (p[0] == '/' && p[1] == '/')
                        p++; /* unix:///run/x.sock and unix:/run/x.sock alike */
                if (!*p)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "bad url '%s': expected unix:/path/to/socket", url);
                c->sock = xstrdup(p);
                c->base = xstrdup("http://localhost");
        } else if (url) {
                if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "bad url '%s': expected http://HOST:PORT, "
                                             "https://HOST:PORT or unix:/path",
                                             url);
                c->base = xstrdup(url);
                size_t n = strlen(c->base);
                while (n > 0 && c->base[n - 1] == '/')
                        c->base[--n] = '\0';
        } else {
                c->sock = cli_fmt("%s/coved.sock", data_dir);
                c->base = xstrdup("http://localhost");
        }

        const char *key = c->key_opt && *c->key_opt ? c->key_opt : nonempty_env("COVE_API_KEY");
        if (key)
                c->key = xstrdup(key);
        else if (c->sock)
                load_admin_key(c);
        else
                snprintf(c->key_note, sizeof(c->key_note),
                         "no API key: set COVE_API_KEY or pass --api-key");
        return 0;
}

void cli_disconnect(struct cli *c)
{
        free(c->base);
        free(c->sock);
        free(c->key);
        c->base = c->sock = c->key = NULL;
}

static const char *where(const struct cli *c)
{
        return c->sock ? c->sock : c->base;
}

size_t cli_collect_cb(char *ptr, size_t size, size_t nmemb, void *arg)
{
        struct cli_req *r = arg;
        size_t n = size * nmemb;
        /* Error and JSON bodies are small; a bound keeps a confused server from eating RAM. */
        if (r->len + n + 1 > (64u << 20))
                return 0;
        if (r->len + n + 1 > r->cap) {
                size_t cap = r->cap ? r->cap : 4096;
                while (cap < r->len + n + 1)
                        cap *= 2;
                char *b = realloc(r->body, cap);
                if (!b)
                        return 0;
                r->body = b;
                r->cap = cap;
        }
        memcpy(r->body + r->len, ptr, n);
        r->len += n;
        r->body[r->len] = '\0';
        return n;
}

struct cli_req *cli_req_new(struct cli *c, const char *method, const char *path,
                            const char *content_type)
{
        struct cli_req *r = calloc(1, sizeof(*r));
        if (!r)
                return NULL;
        r->h = curl_easy_init();
        if (!r->h) {
                free(r);
                return NULL;
        }
        cleanup_free char *url = cli_fmt("%s%s", c->base, path);
        curl_easy_setopt(r->h, CURLOPT_URL, url);
        if (c->sock)
                curl_easy_setopt(r->h, CURLOPT_UNIX_SOCKET_PATH, c->sock);
        if (strcmp(method, "POST") == 0) {
                curl_easy_setopt(r->h, CURLOPT_POST, 1L);
                curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, 0L);
                curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, "");
        } else if (strcmp(method, "GET") != 0) {
                curl_easy_setopt(r->h, CURLOPT_CUSTOMREQUEST, method);
        }
        if (c->key) {
                cleanup_free char *auth = cli_fmt("Authorization: Bearer %s", c->key);
                r->hdrs = curl_slist_append(r->hdrs, auth);
        }
        if (content_type) {
                cleanup_free char *ct = cli_fmt("Content-Type: %s", content_type);
                r->hdrs = curl_slist_append(r->hdrs, ct);
        }
        /* No "Expect: 100-continue" round trip before uploads. */
        r->hdrs = curl_slist_append(r->hdrs, "Expect:");
        curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hdrs);
        curl_easy_setopt(r->h, CURLOPT_USERAGENT, "cove/" COVE_VERSION);
        curl_easy_setopt(r->h, CURLOPT_CONNECTTIMEOUT, 10L);
        curl_easy_setopt(r->h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(r->h, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(r->h, CURLOPT_ERRORBUFFER, r->errbuf);
        curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, cli_collect_cb);
        curl_easy_setopt(r->h, CURLOPT_WRITEDATA, r);
        return r;
}

void cli_req_free(struct cli_req *r)
{
        if (!r)
                return;
        curl_easy_cleanup(r->h);
        curl_slist_free_all(r->hdrs);
        free(r->body);
        free(r);
}

long cli_req_status(struct cli_req *r)
{
        long status = 0;
        curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
        return status;
}

int cli_perform(struct cli *c, struct cli_req *r, struct cli_loop *loop, struct cove_err *err)
{
        CURLM *m = curl_multi_init();
        if (!m)
                return cove_err_set(err, ENOMEM, "curl_multi_init");
        curl_multi_add_handle(m, r->h);
        r->errbuf[0] = '\0';

        struct cli_progress prog;
        cli_progress_start(&prog, c, loop ? loop->progress : NULL);
        int ret = 0;
        CURLMcode mc = CURLM_OK;
        for (;;) {
                int running = 0;
                mc = curl_multi_perform(m, &running);
                if (mc != CURLM_OK || !running)
                        break;
                /* 100 ms bounds spinner latency; extra fds wake us at once. */
                mc = curl_multi_poll(m, loop ? loop->fds : NULL, loop ? loop->nfds : 0, 100, NULL);
                if (mc != CURLM_OK)
                        break;
                cli_progress_tick(&prog);
                if (loop && loop->on_ready && loop->on_ready(loop->arg, loop->fds, loop->nfds)) {
                        ret = -2;
                        break;
                }
        }
        cli_progress_end(&prog);

        CURLcode res = CURLE_OK;
        bool done = false;
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
                if (msg->msg == CURLMSG_DONE && msg->easy_handle == r->h) {
                        res = msg->data.result;
                        done = true;
                }
        }
        curl_multi_remove_handle(m, r->h);
        curl_multi_cleanup(m);
        r->status = cli_req_status(r);
        if (ret)
                return ret;
        if (mc != CURLM_OK)
                return cove_err_set(err, 0, "talking to coved at %s: %s", where(c),
                                    curl_multi_strerror(mc));
        if (!done || res != CURLE_OK) {
                /* For a socket, curl's own text names "localhost port 80": not helpful. */
                const char *why = r->errbuf[0] && !c->sock ? r->errbuf : curl_easy_strerror(res);
                if (r->status == 0)
                        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                             "cannot reach coved at %s: %s (is it running? "
                                             "start it with 'cove up')",
                                             where(c), why);
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "connection to coved at %s broken: %s", where(c), why);
        }
        return 0;
}

int cli_http_error(struct cli *c, long status, const char *body, size_t len, struct cove_err *err)
{
        json_error_t jerr;
        json_t *j = body && len ? json_loadb(body, len, 0, &jerr) : NULL;
        json_t *e = json_object_get(j, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        if (code) {
                cove_err_set(err, 0, "%s: %s", code, msg ? msg : "(no message)");
        } else {
                /* Not the documented shape (a proxy, or a server bug): show what came back. */
                int n = (int)(len > 200 ? 200 : len);
                cove_err_set(err, 0, "HTTP %ld%s%.*s", status, n ? ": " : "", n, body ? body : "");
        }
        json_decref(j);
        if (status == 401 && c->key_note[0]) {
                size_t l = strlen(err->msg);
                snprintf(err->msg + l, sizeof(err->msg) - l, " (%s)", c->key_note);
        }
        return -1;
}

int cli_call(struct cli *c, const char *method, const char *path, json_t *body, json_t **out,
             const char *progress, struct cove_err *err)
{
        if (out)
                *out = NULL;
        if (cli_connect(c, err) < 0)
                return -1;
        cleanup_free char *payload = body ? json_dumps(body, JSON_COMPACT) : NULL;
        if (body && !payload)
                return cove_err_set(err, ENOMEM, "encode request");
        struct cli_req *r = cli_req_new(c, method, path, payload ? "application/json" : NULL);
        if (!r)
                return cove_err_set(err, ENOMEM, "new request");
        if (payload) {
                curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, (long)strlen(payload));
                curl_easy_setopt(r->h, CURLOPT_COPYPOSTFIELDS, payload);
        }
        struct cli_loop loop = {.progress = progress};
        int ret = cli_perform(c, r, &loop, err);
        if (ret == 0 && (r->status < 200 || r->status >= 300))
                ret = cli_http_error(c, r->status, r->body, r->len, err);
        if (ret == 0 && r->len > 0) {
                json_error_t jerr;
                json_t *j = json_loadb(r->body, r->len, 0, &jerr);
                if (!j)
                        ret = cove_err_set(err, 0, "bad answer from coved to %s %s: %s", method,
                                           path, jerr.text);
                else if (out)
                        *out = j;
                else
                        json_decref(j);
        }
        cli_req_free(r);
        return ret < 0 ? -1 : 0;
}

char *cli_urlenc(const char *s)
{
        static const char hex[] = "0123456789ABCDEF";
        size_t n = strlen(s);
        char *o = malloc(3 * n + 1);
        if (!o) {
                fputs("cove: out of memory\n", stderr);
                exit(CLI_FAIL);
        }
        char *p = o;
        for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
                if ((*q >= 'A' && *q <= 'Z') || (*q >= 'a' && *q <= 'z') ||
                    (*q >= '0' && *q <= '9') || *q == '-' || *q == '_' || *q == '.' || *q == '~') {
                        *p++ = (char)*q;
                } else {
                        *p++ = '%';
                        *p++ = hex[*q >> 4];
                        *p++ = hex[*q & 15];
                }
        }
        *p = '\0';
        return o;
}

static int b64_val(unsigned char ch)
{
        if (ch >= 'A' && ch <= 'Z')
                return ch - 'A';
        if (ch >= 'a' && ch <= 'z')
                return ch - 'a' + 26;
        if (ch >= '0' && ch <= '9')
                return ch - '0' + 52;
        if (ch == '+' || ch == '-')
                return 62;
        if (ch == '/' || ch == '_')
                return 63;
        return -1;
}

long cli_b64_decode(const char *in, size_t len, unsigned char *out)
{
        uint32_t acc = 0;
        int bits = 0;
        long n = 0;
        for (size_t i = 0; i < len; i++) {
                unsigned char ch = (unsigned char)in[i];
                if (ch == '=')
                        break;
                if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t')
                        continue;
                int v = b64_val(ch);
                if (v < 0)
                        return -1;
                acc = (acc << 6) | (uint32_t)v;
                bits += 6;
                if (bits >= 8) {
                        bits -= 8;
                        out[n++] = (unsigned char)(acc >> bits);
                }
        }
        return n;
}

int cli_poll_while(struct cli *c, const char *path, const char *field, const char *value,
                   const char *label, int interval_ms, int deadline_s, const char *what,
                   json_t **obj, struct cove_err *err)
{
        struct cli_progress prog;
        cli_progress_start(&prog, c, label);
        int64_t deadline = cove_mono_ns() + (int64_t)deadline_s * 1000000000LL;
        int ret = 0;
        while (strcmp(json_string_value(json_object_get(*obj, field)) ?: "", value) == 0) {
                if (deadline_s && cove_mono_ns() > deadline) {
                        ret =
                            cove_err_set(err, 0, "%s still %s after %d s", what, value, deadline_s);
                        break;
                }
                for (int waited = 0; waited < interval_ms; waited += 50) {
                        struct timespec ts = {0, 50 * 1000000L};
                        nanosleep(&ts, NULL);
                        cli_progress_tick(&prog);
                }
                json_t *j = NULL;
                if (cli_call(c, "GET", path, NULL, &j, NULL, err) < 0) {
                        ret = -1;
                        break;
                }
                json_decref(*obj);
                *obj = j;
        }
        cli_progress_end(&prog);
        return ret;
}
