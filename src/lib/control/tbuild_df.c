/* Dockerfile builds without Docker (tbuild.h, docs/templates.md): each RUN runs in a cove
 * sandbox of the template made so far, with the build's egress policy; COPY takes files from
 * the uploaded context; every step that changes files becomes a cached template
 * "cache..<key>" (key: the parent's digest and the step), so a rebuild with the same steps
 * runs nothing. The named template is the last one plus the config (ENV, USER, WORKDIR,
 * CMD, ENTRYPOINT). */
#include "control/tbuild_df.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "control/coved.h"
#include "control/snapshot.h"
#include "control/tarx.h"
#include "control/template.h"
#include "node/chan.h"
#include "util/util.h"

#define RUN_TIMEOUT_S 3600
#define OUT_TAIL 2048

struct df {
        const struct coved_df_build *in;
        struct coved *d;
        char cur[COVE_TEMPLATE_NAME_MAX]; /* the template made so far */
        char key[65];                     /* its cache key (hex) */
        json_t *config;                   /* {user, workdir, env, entrypoint, cmd} */
        json_t *argv;                     /* ARG values: {NAME: value} */
        int ctx_fd;                       /* the unpacked context, -1 none */
        char ctx_dir[4096];
};

static void ev(struct df *f, json_t *e)
{
        if (f->in->event)
                f->in->event(f->in->event_arg, e);
        json_decref(e);
}

static void chain(struct df *f, json_t *step, const char *extra)
{
        json_t *s = json_deep_copy(step);
        json_object_del(s, "line");
        char *t = json_dumps(s, JSON_COMPACT | JSON_SORT_KEYS);
        char *c = json_dumps(f->config, JSON_COMPACT | JSON_SORT_KEYS);
        char *a = json_dumps(f->argv, JSON_COMPACT | JSON_SORT_KEYS);
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        EVP_DigestInit_ex(md, EVP_sha256(), NULL);
        EVP_DigestUpdate(md, f->key, strlen(f->key));
        EVP_DigestUpdate(md, "\n", 1);
        if (t)
                EVP_DigestUpdate(md, t, strlen(t));
        if (c)
                EVP_DigestUpdate(md, c, strlen(c));
        if (a)
                EVP_DigestUpdate(md, a, strlen(a));
        if (extra)
                EVP_DigestUpdate(md, extra, strlen(extra));
        unsigned char h[32];
        unsigned int hl;
        EVP_DigestFinal_ex(md, h, &hl);
        EVP_MD_CTX_free(md);
        cove_hex(h, 32, f->key);
        free(t);
        free(c);
        free(a);
        json_decref(s);
}

/* The template after a file-changing step: cached, or made by make(). */
struct tree_arg {
        struct df *f;
        const char *name;
        const char *parent;
        const char *kind, *id;
        json_t *config;
};

static int tree_cb(void *arg, int tree_fd, struct cove_err *err)
{
        struct tree_arg *t = arg;
        struct cove_tree_spec ts = {
            .tenant = t->f->in->tenant,
            .name = t->name,
            .parent = t->parent,
            .source_kind = t->kind,
            .source_id = t->id,
            .tree_fd = tree_fd,
            .max_bytes = t->f->in->max_bytes,
            .config = t->config,
        };
        int rc = cove_template_tree_build(t->f->in->tdir, &ts, err);
        if (rc < 0 && err->kind == COVE_E_CONFLICT)
                return 0; /* made meanwhile by another build of the same steps */
        return rc;
}

static int cached(struct df *f, const char *name)
{
        char rootfs[4096];
        return cove_template_lookup_for(f->in->tdir, f->in->tenant, name, rootfs, sizeof rootfs,
                                        NULL) == 0;
}

/* A temporary directory for an upper tree, under layers/ (swept as .tmp-). */
static int tmp_dir(struct df *f, char *out, size_t cap, struct cove_err *err)
{
        snprintf(out, cap, "%s/layers", f->in->tdir);
        if (cove_mkdir_p(out, 0700, err) < 0)
                return -1;
        snprintf(out, cap, "%s/layers/.tmp-df-XXXXXX", f->in->tdir);
        if (!mkdtemp(out))
                return cove_err_set(err, errno, "create %s", out);
        return 0;
}

/* mkdir -p rel (absolute path inside the image) below root; returns the last dir's fd. */
static int mkdirs(int root, const char *path, struct cove_err *err)
{
        int cur = dup(root);
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", path);
        char *save = NULL;
        for (char *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
                if (!strcmp(c, "."))
                        continue;
                if (!strcmp(c, "..")) {
                        close(cur);
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "\"..\" in the path %.200s", path);
                }
                if (mkdirat(cur, c, 0755) < 0 && errno != EEXIST) {
                        close(cur);
                        return cove_err_set(err, errno, "mkdir %s", c);
                }
                int n = openat(cur, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                close(cur);
                if (n < 0)
                        return cove_err_set(err, errno, "open %s", c);
                cur = n;
        }
        return cur;
}

static int step_workdir(struct df *f, const char *dir, const char *name, struct cove_err *err)
{
        char up[4096];
        if (tmp_dir(f, up, sizeof up, err) < 0)
                return -1;
        int ufd = open(up, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int rc = -1;
        if (ufd >= 0) {
                int w = mkdirs(ufd, dir, err);
                if (w >= 0) {
                        close(w);
                        struct tree_arg t = {f, name, f->cur, "dockerfile", "WORKDIR", NULL};
                        rc = tree_cb(&t, ufd, err);
                }
                close(ufd);
        } else {
                cove_err_set(err, errno, "open %s", up);
        }
        cove_rm_rf(up, NULL);
        return rc;
}

/* The parent directory of rel below root, every component opened with O_NOFOLLOW: the
 * context is the caller's, a symlink in it must not lead out. */
static int parent_beneath(int root, const char *rel, const char **leaf)
{
        int cur = dup(root);
        const char *p = rel;
        for (;;) {
                const char *sl = strchr(p, '/');
                if (!sl) {
                        *leaf = p;
                        return cur;
                }
                char comp[256];
                size_t l = (size_t)(sl - p);
                if (l == 0 || l >= sizeof comp) {
                        close(cur);
                        errno = EINVAL;
                        return -1;
                }
                memcpy(comp, p, l);
                comp[l] = '\0';
                int n = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                close(cur);
                if (n < 0)
                        return -1;
                cur = n;
                p = sl + 1;
        }
}

static const char *base_of(const char *p)
{
        const char *s = strrchr(p, '/');
        return s ? s + 1 : p;
}

#define ADD_ENTRIES_MAX (1u << 20)

/* Whether the file at fd (a regular file of the context) is a tar archive ADD unpacks:
 * gzip or zstd magic, or a ustar header. The offset is left at 0. */
static int is_archive(int fd)
{
        unsigned char b[512];
        ssize_t n = pread(fd, b, sizeof b, 0);
        if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b)
                return 1;
        if (n >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd)
                return 1;
        return n == 512 && !memcmp(b + 257, "ustar", 5);
}

/* ADD of a local archive: unpacked as an image layer is (tarx.c: the same refusals of
 * "..", absolute paths, links out, device nodes; the build's size bound), then copied into
 * the destination directory dfd. */
static int add_archive(struct df *f, int sfd, int dfd, const char *src, struct cove_err *err)
{
        char one[4096];
        if (tmp_dir(f, one, sizeof one, err) < 0)
                return -1;
        int tmp = open(one, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = -1;
        struct cove_tarx_budget budget = {.bytes_left = f->in->max_bytes,
                                          .entries_left = ADD_ENTRIES_MAX};
        struct cove_tarx_result res;
        if (tmp < 0)
                cove_err_set(err, errno, "open %s", one);
        else if (lseek(sfd, 0, SEEK_SET) < 0)
                cove_err_set(err, errno, "ADD %.200s", src);
        else if (cove_tarx_unpack(sfd, tmp, &budget, NULL, NULL, &res, err) < 0)
                cove_err_wrap(err, "archive %.200s", src);
        else
                rc = cove_template_copy_tree(tmp, dfd, f->in->max_bytes, err);
        if (tmp >= 0)
                close(tmp);
        cove_rm_rf(one, NULL);
        return rc;
}

static int step_copy(struct df *f, json_t *args, int add, const char *name, struct cove_err *err)
{
        if (f->ctx_fd < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "COPY needs a build context (context_b64, a tar)");
        size_t n = json_array_size(args);
        const char *dest = json_string_value(json_array_get(args, n - 1));
        const char *wd = json_string_value(json_object_get(f->config, "workdir"));
        char abs[4096];
        snprintf(abs, sizeof abs, "%s%s%s", dest[0] == '/' ? "" : (wd ? wd : "/"),
                 dest[0] == '/' ? "" : "/", dest);
        int into_dir = n > 2 || abs[strlen(abs) - 1] == '/';
        char up[4096];
        if (tmp_dir(f, up, sizeof up, err) < 0)
                return -1;
        int rc = -1, ufd = open(up, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (ufd < 0) {
                cove_err_set(err, errno, "open %s", up);
                goto out;
        }
        for (size_t i = 0; i + 1 < n; i++) {
                const char *src = json_string_value(json_array_get(args, i));
                char clean[4096];
                snprintf(clean, sizeof clean, "%s", src);
                while (clean[0] == '/' || !strncmp(clean, "./", 2))
                        memmove(clean, clean + (clean[0] == '/' ? 1 : 2), strlen(clean));
                if (strstr(clean, "..") || strchr(clean, '*') || strchr(clean, '?'))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "COPY %.200s: \"..\" and wildcards are not supported",
                                             src);
                struct stat st;
                int is_root = !clean[0] || !strcmp(clean, ".");
                while (clean[0] && clean[strlen(clean) - 1] == '/')
                        clean[strlen(clean) - 1] = '\0';
                const char *sleaf = clean;
                int spfd = is_root ? -1 : parent_beneath(f->ctx_fd, clean, &sleaf);
                int sfd = is_root    ? dup(f->ctx_fd)
                          : spfd < 0 ? -1
                                     : openat(spfd, sleaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (sfd < 0 || fstat(sfd, &st) < 0) {
                        if (sfd >= 0)
                                close(sfd);
                        if (spfd >= 0)
                                close(spfd);
                        cove_err_setk(err, COVE_E_BAD_REQUEST, errno,
                                      "COPY %.200s: not in the build context", src);
                        goto out;
                }
                if (add && S_ISREG(st.st_mode) && is_archive(sfd)) {
                        int dfd = mkdirs(ufd, abs, err);
                        int r = dfd < 0 ? -1 : add_archive(f, sfd, dfd, src, err);
                        if (dfd >= 0)
                                close(dfd);
                        close(sfd);
                        if (spfd >= 0)
                                close(spfd);
                        if (r < 0)
                                goto out;
                        continue;
                }
                char target[4096];
                if (S_ISDIR(st.st_mode))
                        snprintf(target, sizeof target, "%s", abs);
                else if (into_dir)
                        snprintf(target, sizeof target, "%s/%s", abs, base_of(clean));
                else
                        snprintf(target, sizeof target, "%s", abs);
                /* the parent of the target, then the target itself */
                char parent[4096];
                snprintf(parent, sizeof parent, "%s", target);
                char *slash = strrchr(parent, '/');
                const char *leaf = slash ? slash + 1 : parent;
                if (slash)
                        *slash = '\0';
                int pfd = mkdirs(ufd, S_ISDIR(st.st_mode) ? target : parent, err);
                if (pfd < 0) {
                        close(sfd);
                        if (spfd >= 0)
                                close(spfd);
                        goto out;
                }
                int r;
                if (S_ISDIR(st.st_mode)) {
                        r = cove_template_copy_tree(sfd, pfd, f->in->max_bytes, err);
                } else {
                        /* a one-file tree: copy the file's directory entry alone */
                        int tmp = -1;
                        char one[4096];
                        r = tmp_dir(f, one, sizeof one, err);
                        if (r == 0) {
                                tmp = open(one, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                                r = tmp < 0 || linkat(spfd, sleaf, tmp, leaf, 0) < 0
                                        ? cove_err_set(err, errno, "COPY %.200s", src)
                                        : cove_template_copy_tree(tmp, pfd, f->in->max_bytes, err);
                                if (tmp >= 0)
                                        close(tmp);
                                cove_rm_rf(one, NULL);
                        }
                }
                close(pfd);
                close(sfd);
                if (spfd >= 0)
                        close(spfd);
                if (r < 0)
                        goto out;
        }
        struct tree_arg t = {f, name, f->cur, "dockerfile", "COPY", NULL};
        rc = tree_cb(&t, ufd, err);
out:
        if (ufd >= 0)
                close(ufd);
        cove_rm_rf(up, NULL);
        return rc;
}

/* Run one command in a sandbox of f->cur; then save its files as template name. */
static int step_run(struct df *f, json_t *step, const char *name, struct cove_err *err)
{
        int line = (int)json_integer_value(json_object_get(step, "line"));
        json_t *env = json_deep_copy(json_object_get(f->config, "env"));
        if (!json_is_object(env)) {
                json_decref(env);
                env = json_object();
        }
        json_object_update_missing(env, f->argv);
        json_t *cb = json_pack("{s:s, s:o, s:i}", "template", f->cur, "env", env, "timeout_s",
                               RUN_TIMEOUT_S);
        if (f->in->egress)
                json_object_set(cb, "egress", f->in->egress);
        json_t *out = NULL;
        int rc = cove_sandbox_create(f->d, f->in->tenant, cb, &out, err);
        json_decref(cb);
        if (rc < 0)
                return cove_err_wrap(err, "Dockerfile line %d: RUN: sandbox", line);
        char sid[64];
        snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(out, "id")));
        json_decref(out);
        /* running? */
        int64_t until = cove_mono_ns() + 600LL * 1000000000LL;
        struct cove_sandbox_row row;
        for (;;) {
                if (cove_sandbox_load(f->d, f->in->tenant, sid, &row, err) < 0)
                        goto done;
                int running = !strcmp(row.state, "running"), bad = strcmp(row.state, "starting");
                cove_sandbox_row_clear(&row);
                if (running)
                        break;
                if (bad || cove_mono_ns() > until) {
                        rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                           "Dockerfile line %d: RUN: the sandbox did not start",
                                           line);
                        goto done;
                }
                struct timespec ts = {0, 20 * 1000000L};
                nanosleep(&ts, NULL);
        }
        struct cove_chan *c = NULL;
        if (cove_sandbox_chan(f->d, f->in->tenant, sid, &c, &row, err) < 0) {
                rc = -1;
                goto done;
        }
        json_t *args = json_object_get(step, "args");
        /* the guest's exec request, as routes_exec.c builds it */
        json_t *req = json_is_true(json_object_get(step, "shell"))
                          ? json_pack("{s:s, s:O}", "op", "exec", "shell", json_array_get(args, 0))
                          : json_pack("{s:s, s:O}", "op", "exec", "cmd", args);
        json_t *desc = json_is_true(json_object_get(step, "shell"))
                           ? json_pack("[s, s, O]", "/bin/sh", "-c", json_array_get(args, 0))
                           : json_incref(args);
        const char *wd = json_string_value(json_object_get(f->config, "workdir"));
        const char *us = json_string_value(json_object_get(f->config, "user"));
        json_error_t je0;
        json_t *renv = json_loads(row.env_json ? row.env_json : "{}", 0, &je0);
        json_object_set_new(req, "env", json_is_object(renv) ? renv : json_object());
        if (!json_is_object(renv))
                json_decref(renv);
        if (wd)
                json_object_set_new(req, "cwd", json_string(wd));
        json_object_set_new(req, "user", json_string(us ? us : "root"));
        json_object_set_new(req, "stdin", json_false());
        uint32_t pid = 0;
        rc = cove_chan_exec_ex(c, req, "dockerfile", desc, 1, &pid, err);
        cove_sandbox_row_clear(&row);
        json_decref(req);
        json_decref(desc);
        json_t *exit = NULL;
        char tail[OUT_TAIL] = "";
        uint64_t after = 0;
        while (rc == 0 && !exit) {
                struct cove_ev *e = NULL;
                uint64_t lost;
                int r = cove_chan_proc_next(c, pid, after, &e, &lost, 1000, err);
                if (r == 0) {
                        if (f->in->cancel && *f->in->cancel)
                                rc = cove_err_setk(err, COVE_E_CONFLICT, ECANCELED, "cancelled");
                        continue;
                }
                if (r == 2) {
                        after = lost;
                        continue;
                }
                if (r != 1) {
                        rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                           "Dockerfile line %d: RUN: the command's output ended "
                                           "without an exit",
                                           line);
                        break;
                }
                after = e->seq;
                if (e->type == COVE_EV_STDOUT || e->type == COVE_EV_STDERR) {
                        ev(f, json_pack("{s:s, s:i, s:s, s:s%}", "type", "output", "line", line,
                                        "stream", e->type == COVE_EV_STDOUT ? "stdout" : "stderr",
                                        "data", (const char *)e->data, (size_t)e->len));
                        size_t have = strlen(tail), k = e->len;
                        if (k >= OUT_TAIL - 1) {
                                memcpy(tail, e->data + k - (OUT_TAIL - 1), OUT_TAIL - 1);
                                tail[OUT_TAIL - 1] = '\0';
                        } else {
                                if (have + k >= OUT_TAIL) {
                                        memmove(tail, tail + (have + k - (OUT_TAIL - 1)),
                                                OUT_TAIL - 1 - k);
                                        have = OUT_TAIL - 1 - k;
                                }
                                memcpy(tail + have, e->data, k);
                                tail[have + k] = '\0';
                        }
                } else if (e->type == COVE_EV_EXIT) {
                        json_error_t je;
                        exit = json_loadb((const char *)e->data, e->len, 0, &je);
                        if (!exit)
                                exit = json_object();
                } else if (e->type == COVE_EV_ERROR) {
                        rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                           "Dockerfile line %d: RUN: the sandbox stopped", line);
                }
                free(e);
        }
        if (pid)
                cove_chan_proc_unhold(c, pid);
        cove_chan_unref(c);
        if (rc == 0) {
                json_t *code = json_object_get(exit, "exit_code");
                if (!json_is_integer(code) || json_integer_value(code) != 0) {
                        for (char *p = tail; *p; p++)
                                if (*p == '\n' || (unsigned char)*p < 0x20)
                                        *p = ' ';
                        size_t tl = strlen(tail);
                        rc = cove_err_setk(
                            err, COVE_E_BAD_REQUEST, 0,
                            "Dockerfile line %d: RUN exited with %lld: %s", line,
                            json_is_integer(code) ? (long long)json_integer_value(code) : -1LL,
                            tl > 300 ? tail + tl - 300 : tail);
                }
        }
        json_decref(exit);
        if (rc == 0) {
                char parent[64];
                struct tree_arg t = {f, name, f->cur, "dockerfile", "RUN", NULL};
                rc = coved_sandbox_files(f->d, f->in->tenant, sid, NULL, parent,
                                         (coved_tree_fn)tree_cb, &t, err);
                if (rc < 0)
                        cove_err_wrap(err, "Dockerfile line %d: RUN: save its files", line);
        }
done:;
        struct cove_err e2;
        cove_sandbox_delete(f->d, f->in->tenant, sid, 1, &e2);
        return rc;
}

static int set_cmd(json_t *config, const char *k, json_t *step)
{
        json_t *args = json_object_get(step, "args");
        if (json_is_true(json_object_get(step, "shell")))
                json_object_set_new(
                    config, k, json_pack("[s, s, O]", "/bin/sh", "-c", json_array_get(args, 0)));
        else
                json_object_set(config, k, args);
        return 0;
}

static int open_context(struct df *f, struct cove_err *err)
{
        f->ctx_fd = -1;
        if (!f->in->context || !f->in->context_len)
                return 0;
        if (tmp_dir(f, f->ctx_dir, sizeof f->ctx_dir, err) < 0)
                return -1;
        f->ctx_fd = open(f->ctx_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int mfd = memfd_create("cove-context", MFD_CLOEXEC);
        if (f->ctx_fd < 0 || mfd < 0 ||
            write(mfd, f->in->context, f->in->context_len) != (ssize_t)f->in->context_len ||
            lseek(mfd, 0, SEEK_SET) != 0) {
                if (mfd >= 0)
                        close(mfd);
                return cove_err_set(err, errno, "build context");
        }
        struct cove_tarx_budget b = {.bytes_left = f->in->max_bytes, .entries_left = 100000};
        struct cove_tarx_result res;
        int rc = cove_tarx_unpack(mfd, f->ctx_fd, &b, NULL, NULL, &res, err);
        close(mfd);
        if (rc < 0)
                return cove_err_wrap(err, "build context");
        return 0;
}

/* FROM an image reference: the tenant's template cache..<sha256 of "image\n" REF>, pulled
 * as from: {image} does (same checks, bounds and events) unless it exists. A tag is
 * resolved once: the cache stays until deleted by name (pin a digest to be exact). */
static int from_image(struct df *f, const char *ref, char *name, struct cove_err *err)
{
        int line =
            (int)json_integer_value(json_object_get(json_array_get(f->in->steps, 0), "line"));
        unsigned char h[32];
        unsigned int hl;
        char hex[65], k[4200];
        snprintf(k, sizeof k, "image\n%s", ref);
        EVP_Digest(k, strlen(k), h, &hl, EVP_sha256(), NULL);
        cove_hex(h, 32, hex);
        snprintf(name, COVE_TEMPLATE_NAME_MAX, "cache..%.40s", hex);
        if (cached(f, name)) {
                ev(f, json_pack("{s:s, s:i, s:s, s:s}", "type", "step", "line", line, "op", "FROM",
                                "state", "cached"));
                return 0;
        }
        ev(f, json_pack("{s:s, s:i, s:s, s:s}", "type", "step", "line", line, "op", "FROM", "state",
                        "running"));
        struct cove_image_spec s = {
            .tenant = f->in->tenant,
            .name = name,
            .source_kind = "image",
            .ref = ref,
            .insecure = f->in->insecure,
            .max_bytes = f->in->max_bytes,
            .timeout_s =
                f->in->pull_timeout_s > 0 ? f->in->pull_timeout_s : COVE_TEMPLATE_PULL_TIMEOUT_S,
            .event = f->in->event,
            .event_arg = f->in->event_arg,
            .cancel = f->in->cancel,
        };
        if (cove_template_image_build(f->in->tdir, &s, err) < 0 && err->kind != COVE_E_CONFLICT)
                return cove_err_wrap(err, "Dockerfile line %d: FROM %.200s", line, ref);
        ev(f, json_pack("{s:s, s:i, s:s, s:s}", "type", "step", "line", line, "op", "FROM", "state",
                        "done"));
        return 0;
}

int coved_dockerfile_build(struct coved *d, const struct coved_df_build *in, struct cove_err *err)
{
        struct df f = {.in = in, .d = d, .ctx_fd = -1};
        f.argv = json_object();
        int rc = -1;
        json_t *steps = in->steps;
        json_t *from = json_array_get(json_object_get(json_array_get(steps, 0), "args"), 0);
        const char *parent = json_string_value(from);
        char rootfs[4096], iname[COVE_TEMPLATE_NAME_MAX];
        if (strchr(parent, '/')) { /* REGISTRY/REPO[:TAG][@DIGEST]: pulled once, kept as a cache */
                if (from_image(&f, parent, iname, err) < 0)
                        goto out;
                parent = iname;
        }
        if (cove_template_lookup_for(in->tdir, in->tenant, parent, rootfs, sizeof rootfs, NULL)) {
                cove_err_setk(
                    err, COVE_E_BAD_REQUEST, 0,
                    "Dockerfile line %d: FROM %.64s: no such template (an image: "
                    "build it as a template first)",
                    (int)json_integer_value(json_object_get(json_array_get(steps, 0), "line")),
                    parent);
                goto out;
        }
        snprintf(f.cur, sizeof f.cur, "%s", parent);
        json_t *pmeta = NULL;
        if (cove_template_meta(in->tdir, in->tenant, parent, &pmeta, NULL) == 0) {
                f.config = json_deep_copy(json_object_get(pmeta, "config"));
                snprintf(f.key, sizeof f.key, "%.64s",
                         json_string_value(json_object_get(pmeta, "digest")) ?: parent);
                json_decref(pmeta);
        } else {
                struct cove_template_info ti;
                cove_template_info(in->tdir, parent, &ti, NULL);
                char k[200];
                snprintf(k, sizeof k, "%s@%s", parent, ti.built_at);
                unsigned char h[32];
                unsigned int hl;
                EVP_Digest(k, strlen(k), h, &hl, EVP_sha256(), NULL);
                cove_hex(h, 32, f.key);
        }
        if (!json_is_object(f.config)) {
                json_decref(f.config);
                f.config = json_pack("{s:n, s:n, s:{}, s:[], s:[]}", "user", "workdir", "env",
                                     "entrypoint", "cmd");
        }
        if (open_context(&f, err) < 0)
                goto out;
        char ctx_hash[65] = "";
        if (in->context && in->context_len) {
                unsigned char h[32];
                unsigned int hl;
                EVP_Digest(in->context, in->context_len, h, &hl, EVP_sha256(), NULL);
                cove_hex(h, 32, ctx_hash);
        }
        size_t i;
        json_t *st;
        json_array_foreach(steps, i, st)
        {
                if (i == 0)
                        continue;
                const char *op = json_string_value(json_object_get(st, "op"));
                int line = (int)json_integer_value(json_object_get(st, "line"));
                json_t *args = json_object_get(st, "args");
                if (in->cancel && *in->cancel) {
                        cove_err_setk(err, COVE_E_CONFLICT, ECANCELED, "build cancelled");
                        goto out;
                }
                int changes = !strcmp(op, "RUN") || !strcmp(op, "COPY") || !strcmp(op, "WORKDIR");
                if (!strcmp(op, "ENV")) {
                        json_t *env = json_object_get(f.config, "env");
                        for (size_t k = 0; k + 1 < json_array_size(args); k += 2)
                                json_object_set(env, json_string_value(json_array_get(args, k)),
                                                json_array_get(args, k + 1));
                } else if (!strcmp(op, "ARG")) {
                        const char *a = json_string_value(json_array_get(args, 0));
                        const char *eq = strchr(a, '=');
                        json_t *given = json_object_get(in->build_args, eq ? "" : a);
                        char nm[256];
                        snprintf(nm, sizeof nm, "%.*s", (int)(eq ? eq - a : (long)strlen(a)), a);
                        given = json_object_get(in->build_args, nm);
                        json_object_set_new(f.argv, nm,
                                            json_is_string(given) ? json_incref(given)
                                                                  : json_string(eq ? eq + 1 : ""));
                } else if (!strcmp(op, "USER")) {
                        json_object_set(f.config, "user", json_array_get(args, 0));
                } else if (!strcmp(op, "CMD") || !strcmp(op, "ENTRYPOINT")) {
                        set_cmd(f.config, !strcmp(op, "CMD") ? "cmd" : "entrypoint", st);
                } else if (!strcmp(op, "EXPOSE")) {
                        json_t *ex = json_object_get(f.config, "expose");
                        if (!ex)
                                json_object_set_new(f.config, "expose", ex = json_array());
                        json_array_extend(ex, args);
                }
                chain(&f, st, !strcmp(op, "COPY") ? ctx_hash : NULL);
                if (!strcmp(op, "WORKDIR"))
                        json_object_set(f.config, "workdir", json_array_get(args, 0));
                if (!changes)
                        continue;
                char cname[COVE_TEMPLATE_NAME_MAX];
                snprintf(cname, sizeof cname, "cache..%.40s", f.key);
                if (cached(&f, cname)) {
                        ev(&f, json_pack("{s:s, s:i, s:s, s:s}", "type", "step", "line", line, "op",
                                         op, "state", "cached"));
                } else {
                        ev(&f, json_pack("{s:s, s:i, s:s, s:s}", "type", "step", "line", line, "op",
                                         op, "state", "running"));
                        int r = !strcmp(op, "RUN") ? step_run(&f, st, cname, err)
                                : !strcmp(op, "COPY")
                                    ? step_copy(&f, args, json_is_true(json_object_get(st, "add")),
                                                cname, err)
                                    : step_workdir(&f, json_string_value(json_array_get(args, 0)),
                                                   cname, err);
                        if (r < 0) {
                                if (strncmp(err->msg, "Dockerfile line", 15))
                                        cove_err_wrap(
                                            err, "Dockerfile line %d: %s", line,
                                            json_is_true(json_object_get(st, "add")) ? "ADD" : op);
                                goto out;
                        }
                        ev(&f, json_pack("{s:s, s:i, s:s, s:s}", "type", "step", "line", line, "op",
                                         op, "state", "done"));
                }
                snprintf(f.cur, sizeof f.cur, "%s", cname);
        }
        /* the named template: the last state with the config, and no files of its own */
        char up[4096];
        if (tmp_dir(&f, up, sizeof up, err) < 0)
                goto out;
        int ufd = open(up, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct tree_arg t = {&f, in->name, f.cur, "dockerfile", "Dockerfile", f.config};
        struct cove_tree_spec ts = {
            .tenant = in->tenant,
            .name = in->name,
            .parent = f.cur,
            .source_kind = "dockerfile",
            .source_id = in->digest,
            .tree_fd = ufd,
            .max_bytes = in->max_bytes,
            .config = f.config,
            .extra = in->extra,
        };
        (void)t;
        rc = ufd < 0 ? cove_err_set(err, errno, "open %s", up)
                     : cove_template_tree_build(in->tdir, &ts, err);
        if (ufd >= 0)
                close(ufd);
        cove_rm_rf(up, NULL);
out:
        if (f.ctx_fd >= 0) {
                close(f.ctx_fd);
                cove_rm_rf(f.ctx_dir, NULL);
        }
        json_decref(f.config);
        json_decref(f.argv);
        return rc;
}
