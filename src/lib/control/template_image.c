/* Tenant templates from OCI images (template.h): skopeo copies the image (a registry, an
 * oci-archive or a docker-archive) into an OCI layout inside the build directory, for
 * linux/amd64; everything after that is ours: index, manifest and config parsed and their
 * digests checked (oci.c), each layer unpacked once into <templates>/layers/sha256-<hex>/
 * (tarx.c, digest and diff_id checked), and the rootfs made of hard links to the layers.
 * The build directory is renamed into place only when complete, as for the built-ins. */
#include "control/template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "control/oci.h"
#include "control/tarx.h"
#include "control/template_internal.h"
#include "util/cleanup.h"
#include "util/util.h"

#define IMG_PATH_MAX 4096
#define REF_MAX 512

static int tenant_ok(const char *t)
{
        size_t n = t ? strlen(t) : 0;
        if (n == 0 || n > 63)
                return 0;
        for (size_t i = 0; i < n; i++) {
                char c = t[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-'))
                        return 0;
        }
        return 1;
}

static int tenant_dir(const char *tdir, const char *tenant, char *out, size_t cap,
                      struct cove_err *err)
{
        if (!tenant_ok(tenant))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid tenant");
        int n = snprintf(out, cap, "%s/tenants/%s", tdir, tenant);
        if (n < 0 || (size_t)n >= cap)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, ENAMETOOLONG, "path too long");
        return 0;
}

static void emit(const struct cove_image_spec *s, json_t *ev)
{
        if (s->event && ev)
                s->event(s->event_arg, ev);
        json_decref(ev);
}

/* ---- references --------------------------------------------------------------------- */

/* REGISTRY/REPO[:TAG][@sha256:…] with the registry named (no short names: no registries.conf
 * search list decides where an image comes from). host receives the registry. */
static int image_ref_ok(const char *ref, char *host, size_t cap, struct cove_err *err)
{
        size_t n = ref ? strlen(ref) : 0;
        if (n == 0 || n > REF_MAX || ref[0] == '-')
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "from.image must be 1..%d characters", REF_MAX);
        for (size_t i = 0; i < n; i++) {
                char c = ref[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      strchr("._-/:@", c)))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "from.image holds a character not allowed in an "
                                             "image reference");
        }
        const char *slash = strchr(ref, '/');
        size_t hl = slash ? (size_t)(slash - ref) : 0;
        if (!slash || hl == 0 || hl >= cap ||
            !(memchr(ref, '.', hl) || memchr(ref, ':', hl) ||
              (hl == 9 && !strncmp(ref, "localhost", 9))))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "from.image must name its registry, e.g. "
                                     "registry.example.com/team/image:tag");
        memcpy(host, ref, hl);
        host[hl] = '\0';
        return 0;
}

static int archive_path_ok(const char *p, struct cove_err *err)
{
        size_t n = p ? strlen(p) : 0;
        if (n == 0 || n > 1024 || p[0] != '/' || strstr(p, "/../") || strchr(p, ':'))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "the archive must be an absolute path without \"..\" or "
                                     "\":\"");
        for (size_t i = 0; i < n; i++)
                if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "the archive path holds a control character");
        struct stat st;
        if (stat(p, &st) < 0 || !S_ISREG(st.st_mode))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, errno,
                                     "archive %s: not a regular file on this node", p);
        return 0;
}

/* ---- the pull ----------------------------------------------------------------------- */

struct pull_watch {
        const struct cove_image_spec *s;
        char dir[IMG_PATH_MAX]; /* the build dir: what skopeo writes (layout and tmp) */
        uint64_t last;
};

static uint64_t du_fd(int fd, int depth)
{
        if (depth > 32) {
                close(fd);
                return 0;
        }
        DIR *d = fdopendir(fd);
        if (!d) {
                close(fd);
                return 0;
        }
        uint64_t sum = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (S_ISDIR(st.st_mode)) {
                        int sub = openat(dirfd(d), de->d_name,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub >= 0)
                                sum += du_fd(sub, depth + 1);
                } else {
                        sum += (uint64_t)st.st_blocks * 512;
                }
        }
        closedir(d);
        return sum;
}

/* Once a second during the pull: cancelled? over the size limit (an endless blob)? */
static int pull_tick(void *arg, struct cove_err *err)
{
        struct pull_watch *w = arg;
        if (w->s->cancel && *w->s->cancel)
                return cove_err_setk(err, COVE_E_CONFLICT, ECANCELED, "build cancelled"), 1;
        int fd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        uint64_t used = fd >= 0 ? du_fd(fd, 0) : 0;
        if (used > w->s->max_bytes)
                return cove_err_setk(err, COVE_E_LIMIT, EFBIG,
                                     "pull: the image is larger than the size limit (%llu MB "
                                     "downloaded, limit %llu MB)",
                                     (unsigned long long)(used >> 20),
                                     (unsigned long long)(w->s->max_bytes >> 20)),
                       1;
        if (used != w->last) {
                w->last = used;
                emit(w->s, json_pack("{s:s, s:I}", "type", "pull", "bytes", (json_int_t)used));
        }
        return 0;
}

static int write_authfile(const char *path, const char *host, const char *auth,
                          struct cove_err *err)
{
        size_t al = strlen(auth);
        cleanup_free unsigned char *b64 = malloc(4 * ((al + 2) / 3) + 1);
        if (!b64)
                return cove_err_set(err, ENOMEM, "auth");
        EVP_EncodeBlock(b64, (const unsigned char *)auth, (int)al);
        json_t *j = json_pack("{s:{s:{s:s}}}", "auths", host, "auth", (char *)b64);
        char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!text)
                return cove_err_set(err, ENOMEM, "auth");
        int rc = -1;
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
                size_t l = strlen(text);
                rc = write(fd, text, l) == (ssize_t)l ? 0 : -1;
                close(fd);
        }
        OPENSSL_cleanse(text, strlen(text));
        OPENSSL_cleanse(b64, strlen((char *)b64));
        free(text);
        if (rc < 0)
                return cove_err_set(err, errno, "write the registry credential file");
        return 0;
}

static int pull(const struct cove_image_spec *s, const char *build, char *src_text, size_t cap,
                struct cove_err *err)
{
        char skopeo[256];
        if (cove__tpl_find_tool("skopeo", skopeo, sizeof skopeo) < 0)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "skopeo not found: install the skopeo package "
                                     "(scripts/install-deps)");
        char host[256] = "", src[REF_MAX + 64], dst[IMG_PATH_MAX + 16], tmp[IMG_PATH_MAX],
             home[IMG_PATH_MAX], auth[IMG_PATH_MAX];
        int is_reg = !strcmp(s->source_kind, "image");
        if (is_reg) {
                if (image_ref_ok(s->ref, host, sizeof host, err) < 0)
                        return -1;
                snprintf(src, sizeof src, "docker://%s", s->ref);
        } else {
                if (archive_path_ok(s->ref, err) < 0)
                        return -1;
                snprintf(src, sizeof src, "%s:%s",
                         !strcmp(s->source_kind, "oci_archive") ? "oci-archive" : "docker-archive",
                         s->ref);
        }
        snprintf(src_text, cap, "%s", src);
        snprintf(dst, sizeof dst, "oci:%s/oci:img", build);
        snprintf(tmp, sizeof tmp, "%s/tmp", build);
        snprintf(home, sizeof home, "%s/home", build);
        snprintf(auth, sizeof auth, "%s/auth.json", build);
        if (mkdir(tmp, 0700) < 0 || mkdir(home, 0700) < 0)
                return cove_err_set(err, errno, "create %s", tmp);
        int have_auth = is_reg && s->auth && s->auth[0];
        if (have_auth && write_authfile(auth, host, s->auth, err) < 0)
                return -1;
        char tmpdir_env[IMG_PATH_MAX + 8], home_env[IMG_PATH_MAX + 8], xdg_env[IMG_PATH_MAX + 24];
        snprintf(tmpdir_env, sizeof tmpdir_env, "TMPDIR=%s", tmp);
        snprintf(home_env, sizeof home_env, "HOME=%s", home);
        snprintf(xdg_env, sizeof xdg_env, "XDG_RUNTIME_DIR=%s", home);
        /* no ambient credentials or configuration of the host: HOME and XDG_RUNTIME_DIR are
         * the build's own empty directory */
        char *envp[] = {
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", tmpdir_env, home_env, xdg_env, NULL};
        char authopt[IMG_PATH_MAX + 20];
        snprintf(authopt, sizeof authopt, "--src-authfile=%s", auth);
        char timeout[32];
        snprintf(timeout, sizeof timeout, "--command-timeout=%ds", s->timeout_s);
        char tmpopt[IMG_PATH_MAX + 16];
        snprintf(tmpopt, sizeof tmpopt, "--tmpdir=%s", tmp);
        char *argv[24];
        int a = 0;
        argv[a++] = skopeo;
        argv[a++] = "--insecure-policy"; /* no signature policy: digests are checked here */
        argv[a++] = tmpopt;
        argv[a++] = timeout;
        argv[a++] = "--override-os=linux";
        argv[a++] = "--override-arch=amd64";
        argv[a++] = "copy";
        argv[a++] = "--retry-times=0";
        if (is_reg) {
                argv[a++] = s->insecure ? "--src-tls-verify=false" : "--src-tls-verify=true";
                argv[a++] = have_auth ? authopt : "--src-no-creds";
        }
        argv[a++] = "--";
        argv[a++] = src;
        argv[a++] = dst;
        argv[a] = NULL;
        struct pull_watch w = {.s = s};
        snprintf(w.dir, sizeof w.dir, "%s", build);
        emit(s, json_pack("{s:s, s:s}", "type", "stage", "stage", "pull"));
        /* the deadline of skopeo's own, and ours a little later in case it hangs anyway */
        int rc = cove__tpl_run(argv, envp, s->timeout_s + 10, NULL, NULL, pull_tick, &w, err);
        if (have_auth)
                unlink(auth);
        if (rc < 0)
                return cove_err_wrap(err, "pull %s", is_reg ? s->ref : s->ref);
        return 0;
}

/* ---- the layout --------------------------------------------------------------------- */

static int sha256_file_ok(const char *buf, size_t len, const char *digest)
{
        unsigned char md[32];
        unsigned int l = 0;
        EVP_Digest(buf, len, md, &l, EVP_sha256(), NULL);
        char hex[65];
        cove_hex(md, 32, hex);
        return !strcmp(digest + 7, hex);
}

static int read_blob(const char *build, const struct cove_oci_desc *d, const char *what, char **out,
                     size_t *len, struct cove_err *err)
{
        char p[IMG_PATH_MAX];
        snprintf(p, sizeof p, "%s/oci/blobs/sha256/%s", build, d->digest + 7);
        if (d->size > (int64_t)COVE_OCI_JSON_MAX)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "%s larger than %u bytes", what,
                                     COVE_OCI_JSON_MAX);
        if (cove_read_file(p, COVE_OCI_JSON_MAX, out, len, err) < 0)
                return cove_err_wrap(err, "%s", what);
        if ((int64_t)*len != d->size || !sha256_file_ok(*out, *len, d->digest)) {
                free(*out);
                *out = NULL;
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "%s: content does not match its digest %s", what, d->digest);
        }
        return 0;
}

struct layer_tick {
        const struct cove_image_spec *s;
        int index;
        const char *digest;
};

static int unpack_tick(void *arg, uint64_t bytes)
{
        struct layer_tick *t = arg;
        emit(t->s,
             json_pack("{s:s, s:i, s:s, s:s, s:I}", "type", "layer", "index", t->index, "digest",
                       t->digest, "state", "unpacking", "bytes", (json_int_t)bytes));
        return t->s->cancel && *t->s->cancel;
}

/* layers/sha256-<hex>/ ({tree/, diff_id}) exists complete (renamed whole), or is made from
 * the blob. A layer made before is used when its diff_id is the one this config promises. */
static int layer_get(const char *tdir, const char *build, const struct cove_image_spec *s,
                     int index, const struct cove_oci_desc *d, const char *diff_id,
                     struct cove_tarx_budget *budget, struct cove_err *err)
{
        char final[IMG_PATH_MAX], tmp[IMG_PATH_MAX], blob[IMG_PATH_MAX], p[IMG_PATH_MAX + 16];
        snprintf(final, sizeof final, "%s/layers/sha256-%s", tdir, d->digest + 7);
        snprintf(blob, sizeof blob, "%s/oci/blobs/sha256/%s", build, d->digest + 7);
        struct stat st;
        if (lstat(final, &st) == 0 && S_ISDIR(st.st_mode)) {
                snprintf(p, sizeof p, "%s/diff_id", final);
                cleanup_free char *have = NULL;
                size_t hl = 0;
                if (cove_read_file(p, 128, &have, &hl, err) < 0)
                        return cove_err_wrap(err, "layer %d (%s)", index, d->digest);
                if (hl != strlen(diff_id) || memcmp(have, diff_id, hl))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "layer %d (%s): uncompressed content does not match "
                                             "the config's diff_id %s (it is %.*s)",
                                             index, d->digest, diff_id, (int)hl, have);
                unlink(blob);
                emit(s, json_pack("{s:s, s:i, s:s, s:s}", "type", "layer", "index", index, "digest",
                                  d->digest, "state", "cached"));
                return 0;
        }
        snprintf(tmp, sizeof tmp, "%s/layers/.tmp-%.16s-XXXXXX", tdir, d->digest + 7);
        if (!mkdtemp(tmp))
                return cove_err_set(err, errno, "create %s", tmp);
        int rc = -1;
        snprintf(p, sizeof p, "%s/tree", tmp);
        cleanup_close int bfd = open(blob, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        cleanup_close int dfd = -1;
        if (mkdir(p, 0755) < 0 || (dfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
            bfd < 0) {
                cove_err_set(err, errno, "open blob %s", d->digest);
                goto out;
        }
        struct layer_tick lt = {.s = s, .index = index, .digest = d->digest};
        struct cove_tarx_result res;
        if (cove_tarx_unpack(bfd, dfd, budget, unpack_tick, &lt, &res, err) < 0)
                goto out;
        if (strcmp(res.blob_digest, d->digest)) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "content does not match its digest (got %s)", res.blob_digest);
                goto out;
        }
        if (strcmp(res.diff_id, diff_id)) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "uncompressed content does not match the config's diff_id %s (got "
                              "%s)",
                              diff_id, res.diff_id);
                goto out;
        }
        if (cove_write_file_atomic(tmp, "diff_id", res.diff_id, strlen(res.diff_id), 0644, err) < 0)
                goto out;
        if (syncfs(dfd) < 0) {
                cove_err_set(err, errno, "sync");
                goto out;
        }
        if (chmod(tmp, 0755) < 0 || rename(tmp, final) < 0) {
                /* another build made the same layer meanwhile: theirs is as good */
                if (errno != EEXIST && errno != ENOTEMPTY) {
                        cove_err_set(err, errno, "rename %s", tmp);
                        goto out;
                }
                cove_rm_rf(tmp, NULL);
        }
        unlink(blob);
        emit(s, json_pack("{s:s, s:i, s:s, s:s, s:I, s:I}", "type", "layer", "index", index,
                          "digest", d->digest, "state", "unpacked", "bytes", (json_int_t)res.bytes,
                          "entries", (json_int_t)res.entries));
        rc = 0;
out:
        if (rc < 0) {
                cove_rm_rf(tmp, NULL);
                return cove_err_wrap(err, "layer %d (%s)", index, d->digest);
        }
        return 0;
}

/* Mount points and the small files every sandbox needs, made fresh (never written through
 * a link: a file here may be a hard link into a shared layer). */
static int fixups(int root, struct cove_err *err)
{
        static const struct {
                const char *name;
                mode_t mode;
        } dirs[] = {{"proc", 0555}, {"sys", 0555},  {"dev", 0755},
                    {"run", 0755},  {"tmp", 01777}, {"etc", 0755}};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(dirs); i++) {
                struct stat st;
                if (fstatat(root, dirs[i].name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                        if (S_ISDIR(st.st_mode))
                                continue;
                        if (!strcmp(dirs[i].name, "etc"))
                                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                                     "the image's /etc is not a directory");
                        if (cove_tarx_rm_at(root, dirs[i].name) < 0)
                                return cove_err_set(err, errno, "replace /%s", dirs[i].name);
                }
                if (mkdirat(root, dirs[i].name, dirs[i].mode) < 0 ||
                    fchmodat(root, dirs[i].name, dirs[i].mode, 0) < 0)
                        return cove_err_set(err, errno, "create /%s", dirs[i].name);
        }
        cleanup_close int etc =
            openat(root, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (etc < 0)
                return cove_err_set(err, errno, "open /etc");
        static const struct {
                const char *name, *text;
                int always;
        } files[] = {
            {"resolv.conf", "# written by cove when the sandbox starts\n", 1},
            {"hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0},
            {"hostname", "cove\n", 0},
        };
        for (size_t i = 0; i < COVE_ARRAY_SIZE(files); i++) {
                struct stat st;
                int have = fstatat(etc, files[i].name, &st, AT_SYMLINK_NOFOLLOW) == 0;
                if (have && S_ISREG(st.st_mode) && !files[i].always)
                        continue;
                if (have && cove_tarx_rm_at(etc, files[i].name) < 0)
                        return cove_err_set(err, errno, "replace /etc/%s", files[i].name);
                cleanup_close int fd = openat(
                    etc, files[i].name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
                size_t l = strlen(files[i].text);
                if (fd < 0 || write(fd, files[i].text, l) != (ssize_t)l || fchmod(fd, 0644) < 0)
                        return cove_err_set(err, errno, "write /etc/%s", files[i].name);
        }
        return 0;
}

static int write_meta(const char *build, json_t *meta, struct cove_err *err)
{
        char *text = json_dumps(meta, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (!text)
                return cove_err_set(err, ENOMEM, "meta.json");
        int rc = cove_write_file_atomic(build, "meta.json", text, strlen(text), 0644, err);
        free(text);
        return rc;
}

static int ensure_dirs(const char *tdir, const char *tenant_d, struct cove_err *err)
{
        char p[IMG_PATH_MAX];
        snprintf(p, sizeof p, "%s/tenants", tdir);
        /* 0700 from the templates dir down: an image's setuid files must be unreachable for
         * the host's users (they keep their bits for the sandbox's sake) */
        if (cove_mkdir_p(p, 0700, err) < 0 || chmod(p, 0700) < 0 ||
            cove_mkdir_p(tenant_d, 0700, err) < 0)
                return -1;
        snprintf(p, sizeof p, "%s/layers", tdir);
        if (cove_mkdir_p(p, 0700, err) < 0 || chmod(p, 0700) < 0)
                return -1;
        return 0;
}

static int layers_lock(const char *tdir, int op, struct cove_err *err)
{
        char p[IMG_PATH_MAX];
        snprintf(p, sizeof p, "%s/layers/.lock", tdir);
        int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return cove_err_set(err, errno, "open %s", p);
        while (flock(fd, op) < 0) {
                if (errno == EINTR)
                        continue;
                int e = errno;
                close(fd);
                if (e == EWOULDBLOCK)
                        return -2;
                return cove_err_set(err, e, "lock %s", p);
        }
        return fd;
}

static int build_image(const char *tdir, const char *tenant_d, const struct cove_image_spec *s,
                       const char *build, struct cove_err *err)
{
        char src_text[REF_MAX + 64];
        if (pull(s, build, src_text, sizeof src_text, err) < 0)
                return -1;
        emit(s, json_pack("{s:s, s:s}", "type", "stage", "stage", "verify"));
        char p[IMG_PATH_MAX];
        snprintf(p, sizeof p, "%s/oci/index.json", build);
        cleanup_free char *idx = NULL, *man = NULL, *cfg = NULL;
        size_t il = 0, ml = 0, cl = 0;
        struct cove_oci_desc md;
        if (cove_read_file(p, COVE_OCI_JSON_MAX, &idx, &il, err) < 0 ||
            cove_oci_index_parse(idx, il, &md, err) < 0)
                return cove_err_wrap(err, "image index");
        struct cove_oci_manifest *m = calloc(1, sizeof *m);
        struct cove_oci_config *c = calloc(1, sizeof *c);
        json_t *meta = NULL, *layers = NULL;
        cleanup_close int rfd = -1;
        int rc = -1;
        if (!m || !c) {
                cove_err_set(err, ENOMEM, "manifest");
                goto out;
        }
        if (read_blob(build, &md, "manifest", &man, &ml, err) < 0 ||
            cove_oci_manifest_parse(man, ml, m, err) < 0 ||
            read_blob(build, &m->config, "image config", &cfg, &cl, err) < 0 ||
            cove_oci_config_parse(cfg, cl, c, err) < 0)
                goto out;
        if (strcmp(c->os, "linux") || strcmp(c->arch, "amd64")) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "the image is for %.31s/%.31s; cove runs linux/amd64 images", c->os,
                              c->arch);
                goto out;
        }
        if (c->ndiff != m->nlayers) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "the manifest lists %d layers, the config %d diff_ids", m->nlayers,
                              c->ndiff);
                goto out;
        }
        struct cove_tarx_budget budget = {.bytes_left = s->max_bytes, .entries_left = 4000000};
        layers = json_array();
        for (int i = 0; i < m->nlayers; i++) {
                if (layer_get(tdir, build, s, i + 1, &m->layers[i], c->diff_ids[i], &budget, err) <
                    0)
                        goto out;
                json_array_append_new(layers, json_string(m->layers[i].digest));
        }
        emit(s, json_pack("{s:s, s:s}", "type", "stage", "stage", "rootfs"));
        char rootfs[IMG_PATH_MAX];
        snprintf(rootfs, sizeof rootfs, "%s/rootfs", build);
        if (mkdir(rootfs, 0755) < 0 || chmod(rootfs, 0755) < 0) {
                cove_err_set(err, errno, "create %s", rootfs);
                goto out;
        }
        rfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rfd < 0) {
                cove_err_set(err, errno, "open %s", rootfs);
                goto out;
        }
        for (int i = 0; i < m->nlayers; i++) {
                snprintf(p, sizeof p, "%s/layers/sha256-%s/tree", tdir, m->layers[i].digest + 7);
                cleanup_close int lfd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (lfd < 0 || cove_tarx_apply(lfd, rfd, err) < 0) {
                        if (lfd < 0)
                                cove_err_set(err, errno, "open %s", p);
                        cove_err_wrap(err, "layer %d (%s)", i + 1, m->layers[i].digest);
                        goto out;
                }
        }
        if (fixups(rfd, err) < 0)
                goto out;
        /* what skopeo left is not part of the template */
        static const char *const drop[] = {"oci", "tmp", "home"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(drop); i++) {
                snprintf(p, sizeof p, "%s/%s", build, drop[i]);
                if (cove_rm_rf(p, err) < 0)
                        goto out;
        }
        if (syncfs(rfd) < 0) {
                cove_err_set(err, errno, "sync %s", rootfs);
                goto out;
        }
        uint64_t size = cove__tpl_tree_size(dup(rfd));
        char at[40];
        cove_rfc3339(cove_now_ms(), at, sizeof at);
        json_t *source = json_object();
        json_object_set_new(source, s->source_kind, json_string(s->ref));
        meta = json_pack("{s:s, s:s, s:s, s:s, s:I, s:o, s:s, s:s, s:O, s:O}", "name", s->name,
                         "tenant", s->tenant, "built_at", at, "created_at", at, "size_bytes",
                         (json_int_t)size, "source", source, "source_text", src_text, "digest",
                         md.digest, "layers", layers, "config", c->defaults);
        if (!meta) {
                cove_err_set(err, ENOMEM, "meta.json");
                goto out;
        }
        if (s->extra) {
                const char *k;
                json_t *v;
                json_object_foreach(s->extra, k, v) json_object_set(meta, k, v);
        }
        if (write_meta(build, meta, err) < 0)
                goto out;
        rc = 0;
out:
        json_decref(meta);
        json_decref(layers);
        if (c)
                cove_oci_config_clear(c);
        free(c);
        free(m);
        (void)tenant_d;
        return rc;
}

int cove_template_image_build(const char *tdir, const struct cove_image_spec *s,
                              struct cove_err *err)
{
        char td[IMG_PATH_MAX], build[IMG_PATH_MAX], final[IMG_PATH_MAX];
        if (tenant_dir(tdir, s->tenant, td, sizeof td, err) < 0)
                return -1;
        if (!cove__tpl_valid_name(s->name) || cove_template_known(s->name))
                return cove_err_setk(
                    err, COVE_E_BAD_REQUEST, 0,
                    "template name must be 1..63 of [a-z0-9._-], starting with a "
                    "letter or digit, and not a built-in (busybox, base, code-interpreter)");
        if (ensure_dirs(tdir, td, err) < 0)
                return cove_err_wrap(err, "template %s", s->name);
        cleanup_close int ll = layers_lock(tdir, LOCK_SH, err);
        if (ll < 0)
                return cove_err_wrap(err, "template %s", s->name);
        cleanup_close int lock = cove__tpl_lock(td, s->name, err);
        if (lock < 0)
                return cove_err_wrap(err, "template %s", s->name);
        snprintf(final, sizeof final, "%s/%s", td, s->name);
        struct stat st;
        snprintf(build, sizeof build, "%s/meta.json", final);
        if (stat(build, &st) == 0)
                return cove_err_setk(err, COVE_E_CONFLICT, 0, "template %s exists", s->name);
        if (cove__tpl_remove_stale(td, s->name, err) < 0)
                return cove_err_wrap(err, "template %s", s->name);
        snprintf(build, sizeof build, "%s/.build-%s-XXXXXX", td, s->name);
        if (!mkdtemp(build))
                return cove_err_set(err, errno, "create %s", build);
        if (build_image(tdir, td, s, build, err) < 0)
                goto fail;
        if (lstat(final, &st) == 0 && cove_rm_rf(final, err) < 0)
                goto fail;
        if (chmod(build, 0755) < 0 || rename(build, final) < 0) {
                cove_err_set(err, errno, "rename %s", build);
                goto fail;
        }
        if (cove__tpl_fsync_dir(td, err) < 0)
                return -1;
        emit(s, json_pack("{s:s, s:s}", "type", "stage", "stage", "ready"));
        return 0;
fail:
        cove_rm_rf(build, NULL);
        return -1;
}

/* ---- lookups, listing, removal ------------------------------------------------------ */

int cove_template_lookup_for(const char *tdir, const char *tenant, const char *name, char *rootfs,
                             size_t cap, struct cove_err *err)
{
        if (cove_template_known(name) || !tenant)
                return cove_template_lookup(tdir, name, rootfs, cap, err);
        char td[IMG_PATH_MAX];
        if (!cove__tpl_valid_name(name) || tenant_dir(tdir, tenant, td, sizeof td, NULL) < 0)
                return 1;
        return cove_template_lookup(td, name, rootfs, cap, err);
}

int cove_template_meta(const char *tdir, const char *tenant, const char *name, json_t **meta,
                       struct cove_err *err)
{
        *meta = NULL;
        char td[IMG_PATH_MAX], p[IMG_PATH_MAX + 80];
        if (!cove__tpl_valid_name(name) || cove_template_known(name) ||
            tenant_dir(tdir, tenant, td, sizeof td, NULL) < 0)
                return 1;
        snprintf(p, sizeof p, "%s/%s/meta.json", td, name);
        cleanup_free char *text = NULL;
        size_t len = 0;
        struct cove_err e2;
        if (cove_read_file(p, 1 << 20, &text, &len, &e2) < 0) {
                if (e2.errnum == ENOENT)
                        return 1;
                if (err)
                        *err = e2;
                return -1;
        }
        json_error_t je;
        *meta = json_loadb(text, len, 0, &je);
        if (!json_is_object(*meta)) {
                json_decref(*meta);
                *meta = NULL;
                return cove_err_set(err, 0, "template %s: meta.json: %s", name, je.text);
        }
        return 0;
}

int cove_template_list_for(const char *tdir, const char *tenant, cove_template_meta_fn fn,
                           void *arg, struct cove_err *err)
{
        char td[IMG_PATH_MAX];
        if (tenant_dir(tdir, tenant, td, sizeof td, err) < 0)
                return -1;
        struct dirent **ents = NULL;
        int n = scandir(td, &ents, NULL, alphasort);
        if (n < 0)
                return errno == ENOENT ? 0 : cove_err_set(err, errno, "list %s", td);
        int rc = 0;
        for (int i = 0; i < n; i++) {
                json_t *meta = NULL;
                if (rc == 0 && cove__tpl_valid_name(ents[i]->d_name) &&
                    cove_template_meta(tdir, tenant, ents[i]->d_name, &meta, NULL) == 0) {
                        rc = fn(arg, meta);
                        json_decref(meta);
                }
                free(ents[i]);
        }
        free(ents);
        return rc;
}

/* Every layer digest some template's meta.json lists, as "sha256-<hex>" names. */
static json_t *layers_in_use(const char *tdir)
{
        json_t *used = json_object();
        char p[IMG_PATH_MAX];
        snprintf(p, sizeof p, "%s/tenants", tdir);
        cleanup_dir DIR *d = opendir(p);
        struct dirent *de;
        while (d && (de = readdir(d))) {
                if (!tenant_ok(de->d_name))
                        continue;
                char td[IMG_PATH_MAX + 300];
                snprintf(td, sizeof td, "%s/%s", p, de->d_name);
                cleanup_dir DIR *t = opendir(td);
                struct dirent *te;
                while (t && (te = readdir(t))) {
                        json_t *meta = NULL;
                        if (!cove__tpl_valid_name(te->d_name) ||
                            cove_template_meta(tdir, de->d_name, te->d_name, &meta, NULL) != 0)
                                continue;
                        size_t i;
                        json_t *v;
                        json_array_foreach(json_object_get(meta, "layers"), i, v)
                        {
                                const char *dg = json_string_value(v);
                                if (cove_oci_digest_valid(dg)) {
                                        char k[80];
                                        snprintf(k, sizeof k, "sha256-%s", dg + 7);
                                        json_object_set_new(used, k, json_true());
                                }
                        }
                        json_decref(meta);
                }
        }
        return used;
}

int cove_template_gc(const char *tdir, struct cove_err *err)
{
        char p[IMG_PATH_MAX];
        snprintf(p, sizeof p, "%s/layers", tdir);
        struct stat st;
        if (stat(p, &st) < 0)
                return 0;
        /* builds hold the lock shared from their first layer to their rename: a layer that
         * nothing lists yet may be theirs */
        int ll = layers_lock(tdir, LOCK_EX | LOCK_NB, err);
        if (ll == -2)
                return 0;
        if (ll < 0)
                return -1;
        json_t *used = layers_in_use(tdir);
        cleanup_dir DIR *d = opendir(p);
        struct dirent *de;
        int rc = 0;
        while (d && (de = readdir(d))) {
                const char *n = de->d_name;
                int stale = !strncmp(n, ".tmp-", 5) ||
                            (!strncmp(n, "sha256-", 7) && !json_object_get(used, n));
                if (!stale)
                        continue;
                char lp[IMG_PATH_MAX + 300];
                snprintf(lp, sizeof lp, "%s/%s", p, n);
                if (cove_rm_rf(lp, err) < 0)
                        rc = -1;
        }
        json_decref(used);
        close(ll);
        return rc;
}

int cove_template_remove(const char *tdir, const char *tenant, const char *name,
                         struct cove_err *err)
{
        char td[IMG_PATH_MAX], final[IMG_PATH_MAX], gone[IMG_PATH_MAX];
        if (cove_template_known(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "%s is a built-in template and cannot be deleted", name);
        if (!cove__tpl_valid_name(name) || tenant_dir(tdir, tenant, td, sizeof td, NULL) < 0)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no template %s", name);
        struct stat tst;
        if (stat(td, &tst) < 0)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no template %s", name);
        cleanup_close int lock = cove__tpl_lock(td, name, err);
        if (lock < 0)
                return -1;
        snprintf(final, sizeof final, "%s/%s", td, name);
        snprintf(gone, sizeof gone, "%s/.build-%s-XXXXXX", td, name);
        struct stat st;
        char meta[IMG_PATH_MAX + 16];
        snprintf(meta, sizeof meta, "%s/meta.json", final);
        if (stat(meta, &st) < 0)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "no template %s", name);
        /* out of sight in one rename (a leftover .build- dir is swept like a killed build) */
        if (!mkdtemp(gone) || rename(final, gone) < 0)
                return cove_err_set(err, errno, "remove template %s", name);
        cove__tpl_fsync_dir(td, NULL);
        cove_rm_rf(gone, NULL);
        return cove_template_gc(tdir, err);
}

void cove_template_sweep(const char *tdir)
{
        char p[IMG_PATH_MAX];
        snprintf(p, sizeof p, "%s/tenants", tdir);
        cleanup_dir DIR *d = opendir(p);
        struct dirent *de;
        while (d && (de = readdir(d))) {
                if (!tenant_ok(de->d_name))
                        continue;
                char td[IMG_PATH_MAX + 300];
                snprintf(td, sizeof td, "%s/%s", p, de->d_name);
                cleanup_dir DIR *t = opendir(td);
                struct dirent *te;
                while (t && (te = readdir(t))) {
                        if (strncmp(te->d_name, ".build-", 7))
                                continue;
                        /* .build-<name>-XXXXXX: take the name's lock (a live build holds it) */
                        char name[COVE_TEMPLATE_NAME_MAX + 8];
                        size_t l = strlen(te->d_name);
                        if (l < 7 + 8 || l - 14 >= sizeof name)
                                continue;
                        memcpy(name, te->d_name + 7, l - 14);
                        name[l - 14] = '\0';
                        if (!cove__tpl_valid_name(name))
                                continue;
                        char lk[IMG_PATH_MAX + 400];
                        snprintf(lk, sizeof lk, "%s/.lock-%s", td, name);
                        int fd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
                        if (fd < 0)
                                continue;
                        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                                cove__tpl_remove_stale(td, name, NULL);
                        close(fd);
                }
        }
        cove_template_gc(tdir, NULL);
}

/* ---- templates from a sandbox's files ---------------------------------------------- */

static void emit_tree(const struct cove_tree_spec *s, const char *stage)
{
        if (s->event)
                emit((const struct cove_image_spec *)&(
                         struct cove_image_spec){.event = s->event, .event_arg = s->event_arg},
                     json_pack("{s:s, s:s}", "type", "stage", "stage", stage));
}

/* Copy the overlay upper tree in src (a sandbox's changes: hostile) into a layer tree in
 * dst, overlay whiteouts (0/0 char devices, opaque directories) turned into OCI ones,
 * hashing a canonical form of every entry into md. */
static int copy_upper(int src, int dst, int depth, struct cove_tarx_budget *b, EVP_MD_CTX *md,
                      struct cove_err *err)
{
        if (depth > 256)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "the sandbox's tree is too deep");
        /* a description of our own: a dup would share the caller's directory offset */
        int dfd = openat(src, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
        if (!d) {
                if (dfd >= 0)
                        close(dfd);
                return cove_err_set(err, errno, "read the sandbox's files");
        }
        /* sorted, so that the digest does not depend on the directory's order */
        size_t n = 0, cap = 0;
        char **names = NULL;
        struct dirent *de;
        int rc = 0;
        while ((de = readdir(d))) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                if (n == cap) {
                        cap = cap ? cap * 2 : 64;
                        char **nn = realloc(names, cap * sizeof *nn);
                        if (!nn) {
                                rc = cove_err_set(err, ENOMEM, "copy");
                                break;
                        }
                        names = nn;
                }
                names[n] = strdup(de->d_name);
                if (!names[n]) {
                        rc = cove_err_set(err, ENOMEM, "copy");
                        break;
                }
                n++;
        }
        closedir(d);
        if (rc == 0 && n)
                qsort(names, n, sizeof *names, (int (*)(const void *, const void *))strcmp);
        for (size_t i = 0; rc == 0 && i < n; i++) {
                const char *nm = names[i];
                struct stat st;
                if (b->entries_left == 0) {
                        rc =
                            cove_err_setk(err, COVE_E_LIMIT, 0, "more files than the limit allows");
                        break;
                }
                b->entries_left--;
                if (fstatat(src, nm, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                        rc = cove_err_set(err, errno, "stat %s", nm);
                        break;
                }
                char rec[600];
                int rl = snprintf(rec, sizeof rec, "%o %u %u %s\n", (unsigned)st.st_mode,
                                  (unsigned)st.st_uid, (unsigned)st.st_gid, nm);
                EVP_DigestUpdate(md, rec, (size_t)rl);
                if (!strncmp(nm, ".wh.", 4)) {
                        rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                           "a file named \"%.100s\" cannot be kept in a template",
                                           nm);
                } else if (S_ISCHR(st.st_mode) && st.st_rdev == 0) {
                        char wh[300];
                        if (snprintf(wh, sizeof wh, ".wh.%s", nm) >= 256)
                                rc = cove_err_setk(err, COVE_E_BAD_REQUEST, ENAMETOOLONG,
                                                   "a removed file's name is too long");
                        else {
                                int fd =
                                    openat(dst, wh, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
                                rc = fd < 0 ? cove_err_set(err, errno, "whiteout %s", nm) : 0;
                                if (fd >= 0)
                                        close(fd);
                        }
                } else if (S_ISDIR(st.st_mode)) {
                        int s2 = openat(src, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        int d2 = -1;
                        if (s2 < 0 || mkdirat(dst, nm, 0700) < 0 ||
                            (d2 = openat(dst, nm,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
                                rc = cove_err_set(err, errno, "directory %s", nm);
                        } else {
                                char v[4] = "";
                                if ((fgetxattr(s2, "user.overlay.opaque", v, sizeof v) == 1 ||
                                     fgetxattr(s2, "trusted.overlay.opaque", v, sizeof v) == 1) &&
                                    v[0] == 'y') {
                                        EVP_DigestUpdate(md, "opaque\n", 7);
                                        int fd = openat(d2, ".wh..wh..opq",
                                                        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
                                        if (fd >= 0)
                                                close(fd);
                                        else
                                                rc = cove_err_set(err, errno, "opaque %s", nm);
                                }
                                if (rc == 0)
                                        rc = copy_upper(s2, d2, depth + 1, b, md, err);
                                if (rc == 0 && (fchown(d2, st.st_uid, st.st_gid) < 0 ||
                                                fchmod(d2, st.st_mode & 07777) < 0))
                                        rc = cove_err_set(err, errno, "directory %s", nm);
                        }
                        if (s2 >= 0)
                                close(s2);
                        if (d2 >= 0)
                                close(d2);
                } else if (S_ISREG(st.st_mode)) {
                        if ((uint64_t)st.st_size > b->bytes_left) {
                                rc = cove_err_setk(err, COVE_E_LIMIT, EFBIG,
                                                   "the sandbox's files are larger than the size "
                                                   "limit");
                                break;
                        }
                        int s2 = openat(src, nm, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                        int d2 = openat(dst, nm,
                                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                        char buf[65536];
                        ssize_t r = 0;
                        while (s2 >= 0 && d2 >= 0 && (r = read(s2, buf, sizeof buf)) > 0) {
                                if ((uint64_t)r > b->bytes_left) {
                                        r = -2;
                                        break;
                                }
                                b->bytes_left -= (uint64_t)r;
                                EVP_DigestUpdate(md, buf, (size_t)r);
                                if (write(d2, buf, (size_t)r) != r) {
                                        r = -1;
                                        break;
                                }
                        }
                        if (r == -2)
                                rc = cove_err_setk(err, COVE_E_LIMIT, EFBIG,
                                                   "the sandbox's files are larger than the size "
                                                   "limit");
                        else if (s2 < 0 || d2 < 0 || r < 0 ||
                                 fchown(d2, st.st_uid, st.st_gid) < 0 ||
                                 fchmod(d2, st.st_mode & 07777) < 0)
                                rc = cove_err_set(err, errno, "copy %s", nm);
                        else
                                futimens(d2, (struct timespec[2]){st.st_atim, st.st_mtim});
                        if (s2 >= 0)
                                close(s2);
                        if (d2 >= 0)
                                close(d2);
                } else if (S_ISLNK(st.st_mode)) {
                        char t[4097];
                        ssize_t l = readlinkat(src, nm, t, sizeof t - 1);
                        if (l < 0 || l >= (ssize_t)sizeof t - 1)
                                rc = cove_err_set(err, l < 0 ? errno : ENAMETOOLONG, "link %s", nm);
                        else {
                                t[l] = '\0';
                                EVP_DigestUpdate(md, t, (size_t)l);
                                if (symlinkat(t, dst, nm) < 0 ||
                                    fchownat(dst, nm, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) <
                                        0)
                                        rc = cove_err_set(err, errno, "link %s", nm);
                        }
                } else if (S_ISFIFO(st.st_mode)) {
                        if (mkfifoat(dst, nm, 0600) < 0 ||
                            fchownat(dst, nm, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0 ||
                            fchmodat(dst, nm, st.st_mode & 0777, 0) < 0)
                                rc = cove_err_set(err, errno, "fifo %s", nm);
                } else {
                        rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                           "\"%.100s\": sockets and device files are not kept in "
                                           "a template",
                                           nm);
                }
                if (rc < 0)
                        cove_err_wrap(err, "%.100s", nm);
        }
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        free(names);
        return rc;
}

/* The tree as layers/sha256-<canonical digest>/; digest_out receives "sha256:<hex>". */
static int layer_from_tree(const char *tdir, int tree_fd, uint64_t max_bytes, char digest_out[72],
                           struct cove_err *err)
{
        char tmp[IMG_PATH_MAX], p[IMG_PATH_MAX + 16], final[IMG_PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s/layers/.tmp-sandbox-XXXXXX", tdir);
        if (!mkdtemp(tmp))
                return cove_err_set(err, errno, "create %s", tmp);
        snprintf(p, sizeof p, "%s/tree", tmp);
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        int rc = -1, dfd = -1;
        struct cove_tarx_budget b = {.bytes_left = max_bytes, .entries_left = 4000000};
        if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL) || mkdir(p, 0755) < 0 ||
            (dfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
                cove_err_set(err, errno ? errno : ENOMEM, "create %s", p);
                goto out;
        }
        EVP_DigestUpdate(md, "cove-tree-1\n", 12);
        if (copy_upper(tree_fd, dfd, 0, &b, md, err) < 0)
                goto out;
        unsigned char h[32];
        unsigned int hl = 0;
        EVP_DigestFinal_ex(md, h, &hl);
        char hex[65];
        cove_hex(h, 32, hex);
        snprintf(digest_out, 72, "sha256:%s", hex);
        if (cove_write_file_atomic(tmp, "diff_id", digest_out, strlen(digest_out), 0644, err) < 0)
                goto out;
        if (syncfs(dfd) < 0) {
                cove_err_set(err, errno, "sync");
                goto out;
        }
        snprintf(final, sizeof final, "%s/layers/sha256-%s", tdir, hex);
        if (chmod(tmp, 0755) < 0 || rename(tmp, final) < 0) {
                if (errno != EEXIST && errno != ENOTEMPTY) {
                        cove_err_set(err, errno, "rename %s", tmp);
                        goto out;
                }
                cove_rm_rf(tmp, NULL); /* the same files were saved before */
        }
        rc = 0;
out:
        if (dfd >= 0)
                close(dfd);
        EVP_MD_CTX_free(md);
        if (rc < 0)
                cove_rm_rf(tmp, NULL);
        return rc;
}

int cove_template_tree_build(const char *tdir, const struct cove_tree_spec *s, struct cove_err *err)
{
        char td[IMG_PATH_MAX], build[IMG_PATH_MAX], final[IMG_PATH_MAX], p[IMG_PATH_MAX + 80];
        if (tenant_dir(tdir, s->tenant, td, sizeof td, err) < 0)
                return -1;
        if (!cove__tpl_valid_name(s->name) || cove_template_known(s->name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid template name");
        /* the parent: a built-in's rootfs, or a tenant template's layers */
        json_t *pmeta = NULL, *layers = json_array();
        const char *builtin = NULL;
        if (cove_template_known(s->parent)) {
                builtin = s->parent;
        } else if (cove_template_meta(tdir, s->tenant, s->parent, &pmeta, err) != 0) {
                json_decref(layers);
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "the parent template %s is gone",
                                     s->parent);
        } else {
                builtin = json_string_value(json_object_get(pmeta, "base_builtin"));
                json_array_extend(layers, json_object_get(pmeta, "layers"));
        }
        int rc = -1;
        int ll = -1, lock = -1;
        char *built_from = NULL;
        if (ensure_dirs(tdir, td, err) < 0 || (ll = layers_lock(tdir, LOCK_SH, err)) < 0 ||
            (lock = cove__tpl_lock(td, s->name, err)) < 0)
                goto out;
        snprintf(final, sizeof final, "%s/%s", td, s->name);
        snprintf(p, sizeof p, "%s/meta.json", final);
        struct stat st;
        if (stat(p, &st) == 0) {
                cove_err_setk(err, COVE_E_CONFLICT, 0, "template %s exists", s->name);
                goto out;
        }
        if (cove__tpl_remove_stale(td, s->name, err) < 0)
                goto out;
        emit_tree(s, "capture");
        char digest[72];
        if (layer_from_tree(tdir, s->tree_fd, s->max_bytes, digest, err) < 0) {
                cove_err_wrap(err, "the sandbox's files");
                goto out;
        }
        json_array_append_new(layers, json_string(digest));
        snprintf(build, sizeof build, "%s/.build-%s-XXXXXX", td, s->name);
        if (!mkdtemp(build)) {
                cove_err_set(err, errno, "create %s", build);
                goto out;
        }
        emit_tree(s, "rootfs");
        snprintf(p, sizeof p, "%s/rootfs", build);
        int rfd = -1;
        if (mkdir(p, 0755) < 0 || (rfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
                cove_err_set(err, errno, "create %s", p);
                goto fail;
        }
        if (builtin) {
                char bp[IMG_PATH_MAX + 16];
                snprintf(bp, sizeof bp, "%s/%s/rootfs", tdir, builtin);
                int bfd = open(bp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (bfd < 0 || cove_tarx_apply(bfd, rfd, err) < 0) {
                        if (bfd < 0)
                                cove_err_set(err, errno, "open %s", bp);
                        if (bfd >= 0)
                                close(bfd);
                        close(rfd);
                        cove_err_wrap(err, "the built-in %s", builtin);
                        goto fail;
                }
                close(bfd);
        }
        size_t i;
        json_t *v;
        json_array_foreach(layers, i, v)
        {
                const char *dg = json_string_value(v);
                char lp[IMG_PATH_MAX + 90];
                if (!cove_oci_digest_valid(dg)) {
                        cove_err_setk(err, COVE_E_INTERNAL, 0, "a layer of %s is malformed",
                                      s->parent);
                        close(rfd);
                        goto fail;
                }
                snprintf(lp, sizeof lp, "%s/layers/sha256-%s/tree", tdir, dg + 7);
                int lfd = open(lp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (lfd < 0 || cove_tarx_apply(lfd, rfd, err) < 0) {
                        if (lfd < 0)
                                cove_err_set(err, errno, "open %s", lp);
                        else
                                close(lfd);
                        close(rfd);
                        cove_err_wrap(err, "layer %zu (%s)", i + 1, dg);
                        goto fail;
                }
                close(lfd);
        }
        if (fixups(rfd, err) < 0 || syncfs(rfd) < 0) {
                if (!err->msg[0])
                        cove_err_set(err, errno, "sync");
                close(rfd);
                goto fail;
        }
        uint64_t size = cove__tpl_tree_size(dup(rfd));
        close(rfd);
        char at[40];
        cove_rfc3339(cove_now_ms(), at, sizeof at);
        json_t *cfg = s->config ? s->config : json_object_get(pmeta, "config");
        json_t *meta =
            json_pack("{s:s, s:s, s:s, s:s, s:I, s:{s:s}, s:s, s:O, s:O}", "name", s->name,
                      "tenant", s->tenant, "built_at", at, "created_at", at, "size_bytes",
                      (json_int_t)size, "source", s->source_kind, s->source_id, "digest", digest,
                      "layers", layers, "config", cfg ? cfg : json_null());
        if (meta && builtin)
                json_object_set_new(meta, "base_builtin", json_string(builtin));
        if (meta)
                json_object_set_new(meta, "parent", json_string(s->parent));
        if (meta && s->extra) {
                const char *xk;
                json_t *xv;
                json_object_foreach(s->extra, xk, xv) json_object_set(meta, xk, xv);
        }
        if (!meta || write_meta(build, meta, err) < 0) {
                json_decref(meta);
                goto fail;
        }
        json_decref(meta);
        if (chmod(build, 0755) < 0 || rename(build, final) < 0) {
                cove_err_set(err, errno, "rename %s", build);
                goto fail;
        }
        cove__tpl_fsync_dir(td, NULL);
        emit_tree(s, "ready");
        rc = 0;
        goto out;
fail:
        cove_rm_rf(build, NULL);
out:
        free(built_from);
        if (lock >= 0)
                close(lock);
        if (ll >= 0)
                close(ll);
        json_decref(pmeta);
        json_decref(layers);
        return rc;
}

int cove_template_copy_tree(int src_fd, int dst_fd, uint64_t max_bytes, struct cove_err *err)
{
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        struct cove_tarx_budget b = {.bytes_left = max_bytes, .entries_left = 4000000};
        int rc = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL)
                     ? copy_upper(src_fd, dst_fd, 0, &b, md, err)
                     : cove_err_set(err, ENOMEM, "copy");
        EVP_MD_CTX_free(md);
        return rc;
}
