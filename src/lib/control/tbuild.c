/* Tenant template builds on their own threads, their events and outcome (tbuild.h). */
#include "control/tbuild.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "control/coved.h"
#include "control/secrets.h"
#include "control/snapshot.h"
#include "control/dockerfile.h"
#include "control/tbuild_df.h"
#include <openssl/evp.h>
#include "util/cleanup.h"
#include "control/template.h"
#include "node/node.h"
#include "util/util.h"

#define EVENTS_MAX (4u << 20) /* bytes of NDJSON kept per build; later progress is dropped */
#define FINISHED_KEPT 64

enum { B_BUILDING, B_READY, B_FAILED };

struct coved_tbuild {
        struct coved_tbuilds *owner;
        struct coved *d;
        int refs; /* under owner->mu */
        char tenant[64], name[COVE_TEMPLATE_NAME_MAX];
        int state;
        char error[COVE_ERR_MSG_MAX];
        char code[32];
        char *ev; /* NDJSON */
        size_t ev_len, ev_cap;
        int dropped;
        volatile int cancel;
        int64_t created_ms;
        pthread_t th;
        int joinable;
        /* the build's inputs */
        struct cove_image_spec spec;
        char kind[32];
        char *ref, *auth;
        json_t *extra;
        json_t *steps, *egress, *build_args; /* a Dockerfile build */
        unsigned char *context;
        size_t context_len;
        struct coved_tbuild *next;
};

struct coved_tbuilds {
        char tdir[4096];
        pthread_mutex_t mu;
        pthread_cond_t cv;
        struct coved_tbuild *list;
};

struct coved_tbuilds *coved_tbuilds_new(const char *templates_dir)
{
        struct coved_tbuilds *t = calloc(1, sizeof *t);
        if (!t)
                return NULL;
        snprintf(t->tdir, sizeof t->tdir, "%s", templates_dir);
        pthread_mutex_init(&t->mu, NULL);
        pthread_cond_init(&t->cv, NULL);
        cove_template_sweep(templates_dir);
        return t;
}

static void build_free(struct coved_tbuild *b)
{
        if (b->auth) {
                OPENSSL_cleanse(b->auth, strlen(b->auth));
                free(b->auth);
        }
        free(b->ref);
        free(b->ev);
        json_decref(b->extra);
        json_decref(b->steps);
        json_decref(b->egress);
        json_decref(b->build_args);
        free(b->context);
        free(b);
}

void coved_tbuild_unref(struct coved_tbuild *b)
{
        if (!b)
                return;
        struct coved_tbuilds *t = b->owner;
        pthread_mutex_lock(&t->mu);
        int last = --b->refs == 0;
        pthread_mutex_unlock(&t->mu);
        if (last)
                build_free(b);
}

void coved_tbuilds_free(struct coved_tbuilds *t)
{
        if (!t)
                return;
        pthread_mutex_lock(&t->mu);
        for (struct coved_tbuild *b = t->list; b; b = b->next)
                b->cancel = 1;
        pthread_mutex_unlock(&t->mu);
        for (;;) {
                pthread_mutex_lock(&t->mu);
                struct coved_tbuild *b = t->list;
                if (b)
                        t->list = b->next;
                pthread_mutex_unlock(&t->mu);
                if (!b)
                        break;
                if (b->joinable)
                        pthread_join(b->th, NULL);
                coved_tbuild_unref(b);
        }
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
}

/* Append one event line (owner->mu held). */
static void ev_add_locked(struct coved_tbuild *b, json_t *ev)
{
        char *line = json_dumps(ev, JSON_COMPACT);
        if (!line)
                return;
        size_t l = strlen(line);
        int final = json_is_true(json_object_get(ev, "end"));
        if (b->ev_len + l + 1 > EVENTS_MAX && !final) {
                b->dropped++;
                free(line);
                return;
        }
        if (b->ev_len + l + 1 > b->ev_cap) {
                size_t cap = (b->ev_cap ? b->ev_cap * 2 : 4096);
                while (cap < b->ev_len + l + 1)
                        cap *= 2;
                char *n = realloc(b->ev, cap);
                if (!n) {
                        free(line);
                        return;
                }
                b->ev = n;
                b->ev_cap = cap;
        }
        memcpy(b->ev + b->ev_len, line, l);
        b->ev[b->ev_len + l] = '\n';
        b->ev_len += l + 1;
        free(line);
        pthread_cond_broadcast(&b->owner->cv);
}

static void on_event(void *arg, json_t *ev)
{
        struct coved_tbuild *b = arg;
        json_object_set_new(ev, "at_ms", json_integer(cove_now_ms()));
        pthread_mutex_lock(&b->owner->mu);
        ev_add_locked(b, ev);
        pthread_mutex_unlock(&b->owner->mu);
}

static const char *kind_code(enum cove_err_kind k)
{
        switch (k) {
        case COVE_E_BAD_REQUEST:
                return "bad_request";
        case COVE_E_NOT_FOUND:
                return "not_found";
        case COVE_E_CONFLICT:
                return "conflict";
        case COVE_E_LIMIT:
                return "limit_exceeded";
        case COVE_E_UNAVAILABLE:
                return "unavailable";
        default:
                return "internal";
        }
}

struct tree_ctx {
        struct coved_tbuild *b;
        const char *parent;
};

static int tree_cb(void *arg, int tree_fd, struct cove_err *err)
{
        struct tree_ctx *t = arg;
        struct cove_tree_spec ts = {
            .tenant = t->b->tenant,
            .name = t->b->name,
            .parent = t->parent,
            .source_kind = t->b->kind,
            .source_id = t->b->ref,
            .tree_fd = tree_fd,
            .max_bytes = t->b->spec.max_bytes,
            .extra = t->b->extra,
            .event = on_event,
            .event_arg = t->b,
        };
        return cove_template_tree_build(t->b->owner->tdir, &ts, err);
}

/* The template's own warm pool (meta.json "pool" > 0): plain instances of its rootfs in the
 * default shape on the node's default runtime, refilled by the node like --pool's. */
static void pool_start(struct coved *d, const char *tenant, const char *name)
{
        json_t *m = NULL;
        char rootfs[4096];
        if (cove_template_meta(d->templates_dir, tenant, name, &m, NULL) != 0)
                return;
        json_int_t n = json_integer_value(json_object_get(m, "pool"));
        json_decref(m);
        if (n <= 0 || n > COVE_TEMPLATE_POOL_MAX ||
            cove_template_lookup_for(d->templates_dir, tenant, name, rootfs, sizeof rootfs, NULL) !=
                0)
                return;
        struct cove_err e;
        if (cove_node_pool_add(d->node, cove_node_runtime_name(d->node), rootfs, COVE_DEFAULT_CPUS,
                               COVE_DEFAULT_MEMORY_MB, COVE_DEFAULT_DISK_MB, (int)n, NULL, &e) < 0)
                cove_warn(&d->log, "pool", "template %s of %s: %s", name, tenant, e.msg);
        else
                cove_info(&d->log, "pool", "keeping %d warm sandboxes of template %s of %s", (int)n,
                          name, tenant);
}

static int pool_restore_one(void *arg, json_t *meta)
{
        struct coved *d = ((void **)arg)[0];
        const char *tenant = ((void **)arg)[1];
        const char *name = json_string_value(json_object_get(meta, "name"));
        if (name && strncmp(name, "cache..", 7) &&
            json_integer_value(json_object_get(meta, "pool")) > 0)
                pool_start(d, tenant, name);
        return 0;
}

void coved_template_pools_restore(struct coved *d)
{
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tenants", d->templates_dir);
        DIR *dh = opendir(dir);
        struct dirent *de;
        while (dh && (de = readdir(dh))) {
                if (de->d_name[0] == '.')
                        continue;
                void *arg[2] = {d, de->d_name};
                cove_template_list_for(d->templates_dir, de->d_name, pool_restore_one, arg, NULL);
        }
        if (dh)
                closedir(dh);
}

static void *build_main(void *arg)
{
        struct coved_tbuild *b = arg;
        struct cove_err err;
        memset(&err, 0, sizeof err);
        int rc;
        if (!strcmp(b->kind, "dockerfile")) {
                struct coved_df_build in = {
                    .tdir = b->owner->tdir,
                    .tenant = b->tenant,
                    .name = b->name,
                    .steps = b->steps,
                    .digest = b->ref,
                    .context = b->context,
                    .context_len = b->context_len,
                    .egress = b->egress,
                    .build_args = b->build_args,
                    .extra = b->extra,
                    .insecure = b->spec.insecure,
                    .pull_timeout_s = b->spec.timeout_s,
                    .max_bytes = b->spec.max_bytes,
                    .event = on_event,
                    .event_arg = b,
                    .cancel = &b->cancel,
                };
                rc = coved_dockerfile_build(b->d, &in, &err);
        } else if (!strcmp(b->kind, "sandbox") || !strcmp(b->kind, "snapshot")) {
                char parent[64] = "";
                struct tree_ctx t = {.b = b, .parent = parent};
                int is_sb = !strcmp(b->kind, "sandbox");
                rc = coved_sandbox_files(b->d, b->tenant, is_sb ? b->ref : NULL,
                                         is_sb ? NULL : b->ref, parent, tree_cb, &t, &err);
        } else {
                rc = cove_template_image_build(b->owner->tdir, &b->spec, &err);
        }
        if (rc < 0) /* layers unpacked whole for nothing: not kept */
                cove_template_gc(b->owner->tdir, NULL);
        else
                pool_start(b->d, b->tenant, b->name);
        /* the credential is not needed any more */
        if (b->auth) {
                OPENSSL_cleanse(b->auth, strlen(b->auth));
                free(b->auth);
                b->auth = NULL;
                b->spec.auth = NULL;
        }
        pthread_mutex_lock(&b->owner->mu);
        b->state = rc == 0 ? B_READY : B_FAILED;
        if (rc < 0) {
                snprintf(b->error, sizeof b->error, "%s", err.msg);
                snprintf(b->code, sizeof b->code, "%s", kind_code(err.kind));
        }
        json_t *end =
            rc == 0 ? json_pack("{s:s, s:b, s:s}", "type", "end", "end", 1, "state", "ready")
                    : json_pack("{s:s, s:b, s:s, s:{s:s, s:s}}", "type", "end", "end", 1, "state",
                                "failed", "error", "code", b->code, "message", b->error);
        json_object_set_new(end, "at_ms", json_integer(cove_now_ms()));
        ev_add_locked(b, end);
        json_decref(end);
        pthread_mutex_unlock(&b->owner->mu);
        return NULL;
}

/* The record of tenant/name (owner->mu held). */
static struct coved_tbuild *find_locked(struct coved_tbuilds *t, const char *tenant,
                                        const char *name)
{
        for (struct coved_tbuild *b = t->list; b; b = b->next)
                if (!strcmp(b->tenant, tenant) && !strcmp(b->name, name))
                        return b;
        return NULL;
}

/* Unlink and drop a finished record (owner->mu held); the thread is joined here. */
static void drop_locked(struct coved_tbuilds *t, struct coved_tbuild *b)
{
        for (struct coved_tbuild **pp = &t->list; *pp; pp = &(*pp)->next)
                if (*pp == b) {
                        *pp = b->next;
                        break;
                }
        if (b->joinable) {
                pthread_join(b->th, NULL); /* finished: returns at once */
                b->joinable = 0;
        }
        if (--b->refs == 0)
                build_free(b);
}

static void trim_finished_locked(struct coved_tbuilds *t)
{
        int n = 0;
        struct coved_tbuild *oldest = NULL;
        for (struct coved_tbuild *b = t->list; b; b = b->next)
                if (b->state != B_BUILDING) {
                        n++;
                        if (!oldest || b->created_ms < oldest->created_ms)
                                oldest = b;
                }
        if (n > FINISHED_KEPT && oldest)
                drop_locked(t, oldest);
}

static void jdecp(json_t **j)
{
        json_decref(*j);
}

static int registry_host(const char *ref, char *out, size_t cap)
{
        const char *s = strchr(ref, '/');
        if (!s || (size_t)(s - ref) >= cap)
                return -1;
        memcpy(out, ref, (size_t)(s - ref));
        out[s - ref] = '\0';
        return 0;
}

/* start_cmd, ready_cmd, ready_timeout_s of a POST: checked, and *extra {those present}
 * (NULL when none) for the template's meta.json. */
static int run_fields(json_t *body, json_t **extra, struct cove_err *err)
{
        static const char *const cmds[] = {"start_cmd", "ready_cmd"};
        json_t *x = json_object();
        for (size_t i = 0; i < 2; i++) {
                json_t *v = json_object_get(body, cmds[i]);
                if (!v || json_is_null(v))
                        continue;
                if (!json_is_string(v) || json_string_length(v) == 0 ||
                    json_string_length(v) > COVE_TEMPLATE_CMD_MAX ||
                    strlen(json_string_value(v)) != json_string_length(v)) {
                        json_decref(x);
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "%s must be a shell command of 1..%d bytes", cmds[i],
                                             COVE_TEMPLATE_CMD_MAX);
                }
                json_object_set(x, cmds[i], v);
        }
        json_t *rt = json_object_get(body, "ready_timeout_s");
        if (rt && !json_is_null(rt)) {
                if (!json_is_integer(rt) || json_integer_value(rt) < 1 ||
                    json_integer_value(rt) > 3600 || !json_object_get(x, "ready_cmd")) {
                        json_decref(x);
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "ready_timeout_s must be 1..3600, with ready_cmd");
                }
                json_object_set(x, "ready_timeout_s", rt);
        }
        json_t *pl = json_object_get(body, "pool");
        if (pl && !json_is_null(pl)) {
                if (!json_is_integer(pl) || json_integer_value(pl) < 0 ||
                    json_integer_value(pl) > COVE_TEMPLATE_POOL_MAX) {
                        json_decref(x);
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "pool must be an integer 0..%d (warm sandboxes "
                                             "of the template)",
                                             COVE_TEMPLATE_POOL_MAX);
                }
                json_object_set(x, "pool", pl);
        }
        if (!json_object_size(x)) {
                json_decref(x);
                x = NULL;
        }
        *extra = x;
        return 0;
}

int coved_template_create(struct coved *d, const char *tenant, int admin, json_t *body,
                          json_t **out, struct cove_err *err)
{
        if (d->role == COVED_ROLE_CONTROL)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "templates are built on nodes: a control replica does not "
                                     "build them yet (start each node with --templates)");
        static const char *const keys[] = {
            "name",   "from",       "insecure",  "registry_auth", "max_size_mb",     "timeout_s",
            "egress", "build_args", "start_cmd", "ready_cmd",     "ready_timeout_s", "pool"};
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v)
        {
                size_t i = 0;
                while (i < sizeof keys / sizeof keys[0] && strcmp(k, keys[i]))
                        i++;
                if (i == sizeof keys / sizeof keys[0])
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "unknown or unsupported field \"%.64s\" (name, from, "
                                             "insecure, registry_auth, max_size_mb, timeout_s, "
                                             "egress, build_args, start_cmd, ready_cmd, "
                                             "ready_timeout_s, pool)",
                                             k);
        }
        const char *name = json_string_value(json_object_get(body, "name"));
        json_t *from = json_object_get(body, "from");
        if (!name)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "name is required");
        json_t *dft = json_object_get(from, "dockerfile");
        if (!json_is_object(from) ||
            json_object_size(from) != (dft && json_object_get(from, "context_b64") ? 2u : 1u))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "from must be an object with one of image, oci_archive, "
                                     "docker_archive, sandbox, snapshot, dockerfile (with "
                                     "context_b64)");
        const char *kind = dft ? "dockerfile" : json_object_iter_key(json_object_iter(from));
        __attribute__((cleanup(jdecp))) json_t *steps = NULL;
        cleanup_free unsigned char *ctx = NULL;
        size_t ctx_len = 0;
        char df_digest[80] = "";
        if (dft) {
                if (!json_is_string(dft))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "from.dockerfile must be the Dockerfile's text");
                if (cove_dockerfile_parse(json_string_value(dft), json_string_length(dft), &steps,
                                          err) < 0)
                        return -1;
                unsigned char h[32];
                unsigned int hl;
                EVP_Digest(json_string_value(dft), json_string_length(dft), h, &hl, EVP_sha256(),
                           NULL);
                char hex[65];
                cove_hex(h, 32, hex);
                snprintf(df_digest, sizeof df_digest, "sha256:%s", hex);
                json_t *cb = json_object_get(from, "context_b64");
                if (cb) {
                        const char *t = json_string_value(cb);
                        size_t tl = t ? strlen(t) : 0;
                        ctx = malloc(tl / 4 * 3 + 4);
                        int n =
                            ctx && t ? EVP_DecodeBlock(ctx, (const unsigned char *)t, (int)tl) : -1;
                        if (n < 0 || tl % 4)
                                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                     "from.context_b64 must be base64 of a tar");
                        while (tl && t[tl - 1] == '=') { /* EVP counts padding as bytes */
                                tl--;
                                n--;
                        }
                        ctx_len = (size_t)n;
                }
        }
        json_t *egress = json_object_get(body, "egress");
        json_t *bargs = json_object_get(body, "build_args");
        if ((egress || bargs) && !dft)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "egress and build_args are for Dockerfile builds");
        if (bargs && !json_is_object(bargs))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "build_args must be an object of strings");
        const char *ref = dft ? df_digest : json_string_value(json_object_get(from, kind));
        int from_files = !strcmp(kind, "sandbox") || !strcmp(kind, "snapshot");
        if (strcmp(kind, "image") && strcmp(kind, "oci_archive") &&
            strcmp(kind, "docker_archive") && !from_files && !dft)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "from.%.32s is not supported by this coved (image, "
                                     "oci_archive, docker_archive, sandbox, snapshot)",
                                     kind);
        if (from_files && ref && strlen(ref) > 63)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "from.%s: no such id", kind);
        if (strstr(name, ".."))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "template names hold no \"..\" (kept for build caches)");
        if (!ref)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "from.%s must be a string", kind);
        if (strcmp(kind, "image") && !from_files && !dft && !admin)
                return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                     "importing an archive from this node's filesystem is admin "
                                     "only");
        if (cove_template_known(name))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "%s is a built-in template (POST {\"name\":\"%s\"} builds it)",
                                     name, name);
        json_t *ins = json_object_get(body, "insecure");
        if (ins && !json_is_boolean(ins))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "insecure must be a boolean");
        json_t *ms = json_object_get(body, "max_size_mb"), *ts = json_object_get(body, "timeout_s");
        if (ms && (!json_is_integer(ms) || json_integer_value(ms) < 1 ||
                   json_integer_value(ms) > (1 << 20)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "max_size_mb must be 1..1048576");
        if (ts && (!json_is_integer(ts) || json_integer_value(ts) < 1 ||
                   json_integer_value(ts) > 6 * 3600))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "timeout_s must be 1..21600");
        __attribute__((cleanup(jdecp))) json_t *extra = NULL;
        if (run_fields(body, &extra, err) < 0)
                return -1;
        char *auth = NULL;
        json_t *ra = json_object_get(body, "registry_auth");
        if (ra) {
                const char *sec = json_string_value(json_object_get(ra, "secret"));
                char host[256];
                if (!json_is_object(ra) || !sec || json_object_size(ra) != 1)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "registry_auth must be {\"secret\": NAME}");
                if (strcmp(kind, "image") || registry_host(ref, host, sizeof host) < 0)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "registry_auth needs from.image naming its registry");
                if (coved_secret_value_for_host(d, tenant, sec, host, &auth, err) < 0)
                        return cove_err_wrap(err, "registry_auth");
        }
        struct coved_tbuilds *t = d->tb;
        /* exists already? (built, or a build of this name running) */
        char rootfs[4096];
        int r =
            cove_template_lookup_for(d->templates_dir, tenant, name, rootfs, sizeof rootfs, NULL);
        pthread_mutex_lock(&t->mu);
        struct coved_tbuild *old = find_locked(t, tenant, name);
        if (r == 0 || (old && old->state == B_BUILDING)) {
                pthread_mutex_unlock(&t->mu);
                if (auth) {
                        OPENSSL_cleanse(auth, strlen(auth));
                        free(auth);
                }
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "template %s %s (DELETE it first)",
                                     name, r == 0 ? "exists" : "is being built");
        }
        if (old)
                drop_locked(t, old);
        struct coved_tbuild *b = calloc(1, sizeof *b);
        if (!b) {
                pthread_mutex_unlock(&t->mu);
                free(auth);
                return cove_err_set(err, ENOMEM, "template build");
        }
        b->owner = t;
        b->d = d;
        b->refs = 1;
        snprintf(b->tenant, sizeof b->tenant, "%s", tenant);
        snprintf(b->name, sizeof b->name, "%s", name);
        snprintf(b->kind, sizeof b->kind, "%s", kind);
        b->ref = strdup(ref);
        b->auth = auth;
        b->steps = steps;
        steps = NULL;
        b->context = ctx;
        ctx = NULL;
        b->context_len = ctx_len;
        b->egress = json_incref(egress);
        b->build_args = json_incref(bargs);
        b->extra = extra;
        extra = NULL;
        b->created_ms = cove_now_ms();
        b->spec = (struct cove_image_spec){
            .tenant = b->tenant,
            .name = b->name,
            .source_kind = b->kind,
            .ref = b->ref,
            .insecure = json_is_true(ins),
            .auth = b->auth,
            .max_bytes =
                ms ? (uint64_t)json_integer_value(ms) << 20 : COVE_TEMPLATE_MAX_BYTES_DEFAULT,
            .timeout_s = ts ? (int)json_integer_value(ts) : COVE_TEMPLATE_PULL_TIMEOUT_S,
            .extra = b->extra,
            .event = on_event,
            .event_arg = b,
            .cancel = &b->cancel,
        };
        json_t *start =
            json_pack("{s:s, s:s, s:{s:s}}", "type", "start", "name", name, "source", kind, ref);
        ev_add_locked(b, start);
        json_decref(start);
        b->next = t->list;
        t->list = b;
        b->refs++; /* the list's */
        if (pthread_create(&b->th, NULL, build_main, b) != 0) {
                t->list = b->next;
                b->refs -= 2;
                pthread_mutex_unlock(&t->mu);
                build_free(b);
                return cove_err_set(err, EAGAIN, "template build thread");
        }
        b->joinable = 1;
        b->refs--; /* ours: the list keeps one */
        trim_finished_locked(t);
        pthread_mutex_unlock(&t->mu);
        *out = json_pack("{s:s, s:s}", "name", name, "state", "building");
        return 0;
}

static json_t *builtin_json(const struct cove_template_info *i)
{
        json_t *o = json_object();
        json_t *at = i->built_at[0] ? json_string(i->built_at) : json_null();
        json_object_set_new(o, "name", json_string(i->name));
        json_object_set_new(o, "state", json_string(i->built ? "ready" : "not_built"));
        json_object_set_new(o, "built", json_boolean(i->built));
        json_object_set_new(o, "builtin", json_true());
        json_object_set_new(o, "digest", json_null());
        json_object_set_new(o, "size_bytes", json_integer((json_int_t)i->size_bytes));
        json_object_set_new(o, "source", json_string(i->source));
        json_object_set(o, "created_at", at);
        json_object_set_new(o, "built_at", at);
        json_object_set_new(o, "config", json_null());
        return o;
}

static json_t *meta_json(json_t *m)
{
        json_t *o = json_pack(
            "{s:O, s:s, s:b, s:b, s:O, s:O, s:O, s:O, s:O, s:O}", "name",
            json_object_get(m, "name"), "state", "ready", "built", 1, "builtin", 0, "digest",
            json_object_get(m, "digest"), "size_bytes", json_object_get(m, "size_bytes"), "source",
            json_object_get(m, "source"), "created_at", json_object_get(m, "created_at"),
            "built_at", json_object_get(m, "built_at"), "config", json_object_get(m, "config"));
        if (o)
                json_object_set(o, "layers", json_object_get(m, "layers"));
        static const char *const run[] = {"start_cmd", "ready_cmd", "ready_timeout_s", "pool"};
        for (size_t i = 0; o && i < 4; i++)
                if (json_object_get(m, run[i]))
                        json_object_set(o, run[i], json_object_get(m, run[i]));
        return o;
}

static json_t *build_json_locked(struct coved_tbuild *b)
{
        char at[40];
        cove_rfc3339(b->created_ms, at, sizeof at);
        json_t *o = json_pack("{s:s, s:s, s:b, s:b, s:n, s:I, s:{s:s}, s:s, s:n, s:n}", "name",
                              b->name, "state", b->state == B_FAILED ? "failed" : "building",
                              "built", 0, "builtin", 0, "digest", "size_bytes", (json_int_t)0,
                              "source", b->kind, b->ref, "created_at", at, "built_at", "config");
        if (o && b->state == B_FAILED)
                json_object_set_new(o, "error",
                                    json_pack("{s:s, s:s}", "code", b->code, "message", b->error));
        return o;
}

int coved_template_get(struct coved *d, const char *tenant, const char *name, json_t **out,
                       struct cove_err *err)
{
        if (cove_template_known(name)) {
                struct cove_template_info i;
                if (cove_template_info(d->templates_dir, name, &i, err) < 0)
                        return -1;
                *out = builtin_json(&i);
                return 0;
        }
        json_t *m = NULL;
        int r = cove_template_meta(d->templates_dir, tenant, name, &m, err);
        if (r < 0)
                return -1;
        struct coved_tbuilds *t = d->tb;
        pthread_mutex_lock(&t->mu);
        struct coved_tbuild *b = find_locked(t, tenant, name);
        if (r == 1 && b)
                *out = build_json_locked(b);
        pthread_mutex_unlock(&t->mu);
        if (r == 0) {
                *out = meta_json(m);
                json_decref(m);
        } else if (!b) {
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no template %.64s", name);
        }
        return 0;
}

struct list_ctx {
        json_t *arr;
        json_t *seen;
};

static int add_builtin(void *arg, const struct cove_template_info *i)
{
        struct list_ctx *c = arg;
        if (!i->known)
                return 0; /* an old-style top-level directory: not listed per tenant */
        json_array_append_new(c->arr, builtin_json(i));
        return 0;
}

static int add_meta(void *arg, json_t *m)
{
        struct list_ctx *c = arg;
        if (strstr(json_string_value(json_object_get(m, "name")) ?: "", ".."))
                return 0; /* a Dockerfile step's cache ("cache..<key>"): not listed */
        json_t *o = meta_json(m);
        json_object_del(o, "layers");
        json_array_append_new(c->arr, o);
        json_object_set_new(c->seen, json_string_value(json_object_get(m, "name")), json_true());
        return 0;
}

int coved_template_list(struct coved *d, const char *tenant, json_t **out, struct cove_err *err)
{
        struct list_ctx c = {.arr = json_array(), .seen = json_object()};
        if (cove_template_list(d->templates_dir, add_builtin, &c, err) < 0 ||
            cove_template_list_for(d->templates_dir, tenant, add_meta, &c, err) < 0) {
                json_decref(c.arr);
                json_decref(c.seen);
                return -1;
        }
        struct coved_tbuilds *t = d->tb;
        pthread_mutex_lock(&t->mu);
        for (struct coved_tbuild *b = t->list; b; b = b->next)
                if (!strcmp(b->tenant, tenant) && b->state != B_READY &&
                    !json_object_get(c.seen, b->name))
                        json_array_append_new(c.arr, build_json_locked(b));
        pthread_mutex_unlock(&t->mu);
        json_decref(c.seen);
        *out = json_pack("{s:o}", "templates", c.arr);
        return 0;
}

struct use_ctx {
        const char *name;
        char by[64];
};

static int uses(const struct cove_sandbox_row *row, void *arg)
{
        struct use_ctx *u = arg;
        if (!strcmp(row->template_name, u->name)) {
                snprintf(u->by, sizeof u->by, "%s", row->id);
                return -1;
        }
        return 0;
}

int coved_template_delete(struct coved *d, const char *tenant, const char *name,
                          struct cove_err *err)
{
        if (cove_template_known(name))
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "%s is a built-in template and cannot be deleted", name);
        struct coved_tbuilds *t = d->tb;
        pthread_mutex_lock(&t->mu);
        struct coved_tbuild *b = find_locked(t, tenant, name);
        if (b && b->state == B_BUILDING) {
                pthread_mutex_unlock(&t->mu);
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "template %s is being built", name);
        }
        int had_record = b != NULL;
        if (b)
                drop_locked(t, b);
        pthread_mutex_unlock(&t->mu);
        struct use_ctx u = {.name = name};
        if (d->cat_ops->sandbox_list(d->cat, tenant, NULL, uses, &u, err) < 0 && !u.by[0])
                return cove_err_wrap(err, "template %s", name);
        if (u.by[0])
                return cove_err_setk(err, COVE_E_CONFLICT, 0,
                                     "template %s is used by sandbox %s (delete it first: its "
                                     "snapshots need the template too)",
                                     name, u.by);
        /* warm instances of the tenant's own pools may sit on this rootfs: they go first (the
         * pools are made again on the next miss) */
        if (d->node) { /* role control: no pools here */
                cove_node_pool_drop(d->node, tenant);
                char rootfs[4096]; /* and its own pool */
                if (cove_template_lookup_for(d->templates_dir, tenant, name, rootfs, sizeof rootfs,
                                             NULL) == 0)
                        cove_node_pool_drop_rootfs(d->node, rootfs);
        }
        if (cove_template_remove(d->templates_dir, tenant, name, err) < 0) {
                if (err->kind == COVE_E_NOT_FOUND && had_record)
                        return 0; /* a failed build: its record was all there was */
                return -1;
        }
        return 0;
}

struct coved_tbuild *coved_template_events(struct coved *d, const char *tenant, const char *name,
                                           struct cove_err *err)
{
        struct coved_tbuilds *t = d->tb;
        pthread_mutex_lock(&t->mu);
        struct coved_tbuild *b = find_locked(t, tenant, name);
        if (b)
                b->refs++;
        pthread_mutex_unlock(&t->mu);
        if (!b)
                cove_err_setk(err, COVE_E_NOT_FOUND, 0,
                              "no build of template %.64s on this coved since it started", name);
        return b;
}

ssize_t coved_tbuild_read(struct coved_tbuild *b, uint64_t pos, char *buf, size_t max, int wait_ms)
{
        struct coved_tbuilds *t = b->owner;
        pthread_mutex_lock(&t->mu);
        if (pos >= b->ev_len && b->state == B_BUILDING && wait_ms > 0) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += wait_ms / 1000;
                ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        }
        ssize_t n;
        if (pos < b->ev_len) {
                size_t k = b->ev_len - pos < max ? b->ev_len - pos : max;
                memcpy(buf, b->ev + pos, k);
                n = (ssize_t)k;
        } else {
                n = b->state == B_BUILDING ? 0 : -1;
        }
        pthread_mutex_unlock(&t->mu);
        return n;
}

json_t *coved_template_config(struct coved *d, const char *tenant, const char *name)
{
        if (cove_template_known(name))
                return NULL;
        json_t *m = NULL;
        if (cove_template_meta(d->templates_dir, tenant, name, &m, NULL) != 0)
                return NULL;
        json_t *c = json_incref(json_object_get(m, "config"));
        json_decref(m);
        if (!json_is_object(c)) {
                json_decref(c);
                return NULL;
        }
        return c;
}

json_t *coved_template_run(struct coved *d, const char *tenant, const char *name)
{
        if (cove_template_known(name))
                return NULL;
        json_t *m = NULL;
        if (cove_template_meta(d->templates_dir, tenant, name, &m, NULL) != 0)
                return NULL;
        json_t *o = json_object();
        static const char *const run[] = {"start_cmd", "ready_cmd", "ready_timeout_s"};
        for (size_t i = 0; i < 3; i++) {
                json_t *v = json_object_get(m, run[i]);
                if (i < 2 ? json_is_string(v) && json_string_length(v) > 0 : json_is_integer(v))
                        json_object_set(o, run[i], v);
        }
        if (json_object_size(o) && !json_object_get(o, "ready_timeout_s"))
                json_object_set_new(o, "ready_timeout_s",
                                    json_integer(COVE_TEMPLATE_READY_TIMEOUT_S));
        json_t *cfg = json_object_get(m, "config");
        if (json_object_size(o) && json_is_object(cfg))
                json_object_set(o, "config", cfg);
        json_decref(m);
        if (!json_object_size(o)) {
                json_decref(o);
                return NULL;
        }
        return o;
}
