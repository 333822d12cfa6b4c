/* OCI index, manifest and config parsing (oci.h): bounded, shape-checked, nothing trusted. */
#include "control/oci.h"

#include <errno.h>
#include <string.h>

#define STR_MAX 32768
#define ENV_MAX 1024
#define ARGV_MAX 256

int cove_oci_digest_valid(const char *d)
{
        if (!d || strncmp(d, "sha256:", 7) != 0 || strlen(d) != 7 + 64)
                return 0;
        for (const char *p = d + 7; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return 0;
        return 1;
}

static json_t *load(const char *buf, size_t len, const char *what, struct cove_err *err)
{
        if (len > COVE_OCI_JSON_MAX) {
                cove_err_setk(err, COVE_E_LIMIT, 0, "%s larger than %u bytes", what,
                              COVE_OCI_JSON_MAX);
                return NULL;
        }
        json_error_t je;
        json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
        if (!j || !json_is_object(j)) {
                json_decref(j);
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s is not a JSON object", what);
                return NULL;
        }
        return j;
}

static int desc_parse(json_t *o, struct cove_oci_desc *d, const char *what, struct cove_err *err)
{
        memset(d, 0, sizeof *d);
        const char *mt = json_string_value(json_object_get(o, "mediaType"));
        const char *dg = json_string_value(json_object_get(o, "digest"));
        json_t *sz = json_object_get(o, "size");
        if (!json_is_object(o) || !cove_oci_digest_valid(dg))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "%s: missing or unsupported digest (sha256 only)", what);
        if (!json_is_integer(sz) || json_integer_value(sz) < 0)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s: bad size", what);
        if (mt && strlen(mt) >= sizeof d->media_type)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "%s: media type too long", what);
        snprintf(d->media_type, sizeof d->media_type, "%s", mt ? mt : "");
        snprintf(d->digest, sizeof d->digest, "%s", dg);
        d->size = json_integer_value(sz);
        return 0;
}

int cove_oci_index_parse(const char *buf, size_t len, struct cove_oci_desc *manifest,
                         struct cove_err *err)
{
        json_t *j = load(buf, len, "index.json", err);
        if (!j)
                return -1;
        json_t *ms = json_object_get(j, "manifests");
        int rc = -1;
        size_t n = json_array_size(ms);
        if (!json_is_array(ms) || n == 0 || n > 64) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "index.json lists no manifest");
                goto out;
        }
        json_t *pick = NULL;
        for (size_t i = 0; i < n && !pick; i++) {
                json_t *p = json_object_get(json_array_get(ms, i), "platform");
                const char *a = json_string_value(json_object_get(p, "architecture"));
                const char *o = json_string_value(json_object_get(p, "os"));
                if (n == 1 || (a && o && !strcmp(a, "amd64") && !strcmp(o, "linux")))
                        pick = json_array_get(ms, i);
        }
        if (!pick) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "no linux/amd64 image in the index");
                goto out;
        }
        rc = desc_parse(pick, manifest, "index.json manifest", err);
out:
        json_decref(j);
        return rc;
}

static int layer_type_ok(const char *mt)
{
        static const char *const ok[] = {
            "application/vnd.oci.image.layer.v1.tar",
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.oci.image.layer.v1.tar+zstd",
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
        };
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
                if (!strcmp(mt, ok[i]))
                        return 1;
        return 0;
}

int cove_oci_manifest_parse(const char *buf, size_t len, struct cove_oci_manifest *m,
                            struct cove_err *err)
{
        memset(m, 0, sizeof *m);
        json_t *j = load(buf, len, "manifest", err);
        if (!j)
                return -1;
        int rc = -1;
        json_t *sv = json_object_get(j, "schemaVersion");
        const char *mt = json_string_value(json_object_get(j, "mediaType"));
        json_t *layers = json_object_get(j, "layers");
        if (!json_is_integer(sv) || json_integer_value(sv) != 2) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "manifest: schemaVersion is not 2");
                goto out;
        }
        if (mt && strcmp(mt, "application/vnd.oci.image.manifest.v1+json") &&
            strcmp(mt, "application/vnd.docker.distribution.manifest.v2+json")) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "manifest: media type %.100s is not an image manifest", mt);
                goto out;
        }
        if (desc_parse(json_object_get(j, "config"), &m->config, "manifest config", err) < 0)
                goto out;
        size_t n = json_array_size(layers);
        if (!json_is_array(layers) || n > COVE_OCI_LAYERS_MAX) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                              "manifest: layers must be an array of at most %d",
                              COVE_OCI_LAYERS_MAX);
                goto out;
        }
        for (size_t i = 0; i < n; i++) {
                char what[32];
                snprintf(what, sizeof what, "layer %zu", i + 1);
                if (desc_parse(json_array_get(layers, i), &m->layers[i], what, err) < 0)
                        goto out;
                if (!layer_type_ok(m->layers[i].media_type)) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                      "layer %zu (%s): media type \"%.100s\" is not supported",
                                      i + 1, m->layers[i].digest, m->layers[i].media_type);
                        goto out;
                }
        }
        m->nlayers = (int)n;
        rc = 0;
out:
        json_decref(j);
        return rc;
}

static int str_ok(json_t *s, size_t max)
{
        return json_is_string(s) && json_string_length(s) <= max &&
               strlen(json_string_value(s)) == json_string_length(s);
}

/* An array of strings (Entrypoint, Cmd): copied when sane, else an error. */
static int argv_copy(json_t *a, json_t **out, const char *what, struct cove_err *err)
{
        *out = json_array();
        if (!a || json_is_null(a))
                return 0;
        if (!json_is_array(a) || json_array_size(a) > ARGV_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "config: %s must be an array of at most %d strings", what,
                                     ARGV_MAX);
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v)
        {
                if (!str_ok(v, STR_MAX))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "config: %s[%zu] is not a string", what, i);
                json_array_append(*out, v);
        }
        return 0;
}

int cove_oci_config_parse(const char *buf, size_t len, struct cove_oci_config *c,
                          struct cove_err *err)
{
        memset(c, 0, sizeof *c);
        json_t *j = load(buf, len, "image config", err);
        if (!j)
                return -1;
        int rc = -1;
        json_t *ep = NULL, *cmd = NULL, *env = NULL;
        const char *os = json_string_value(json_object_get(j, "os"));
        const char *arch = json_string_value(json_object_get(j, "architecture"));
        if (!os || !arch || strlen(os) >= sizeof c->os || strlen(arch) >= sizeof c->arch) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "image config: no os/architecture");
                goto out;
        }
        snprintf(c->os, sizeof c->os, "%s", os);
        snprintf(c->arch, sizeof c->arch, "%s", arch);
        json_t *ids = json_object_get(json_object_get(j, "rootfs"), "diff_ids");
        size_t n = json_array_size(ids);
        if (!json_is_array(ids) || n > COVE_OCI_LAYERS_MAX) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "image config: bad rootfs.diff_ids");
                goto out;
        }
        for (size_t i = 0; i < n; i++) {
                const char *d = json_string_value(json_array_get(ids, i));
                if (!cove_oci_digest_valid(d)) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                      "image config: diff_id %zu is not a sha256 digest", i + 1);
                        goto out;
                }
                snprintf(c->diff_ids[i], sizeof c->diff_ids[i], "%s", d);
        }
        c->ndiff = (int)n;
        json_t *cfg = json_object_get(j, "config");
        if (cfg && !json_is_null(cfg) && !json_is_object(cfg)) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "image config: config is not an object");
                goto out;
        }
        json_t *user = json_object_get(cfg, "User"), *wd = json_object_get(cfg, "WorkingDir");
        if ((user && !json_is_null(user) && !str_ok(user, 256)) ||
            (wd && !json_is_null(wd) && !str_ok(wd, 4096))) {
                cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "image config: bad User or WorkingDir");
                goto out;
        }
        env = json_object();
        json_t *ev = json_object_get(cfg, "Env");
        if (ev && !json_is_null(ev)) {
                if (!json_is_array(ev) || json_array_size(ev) > ENV_MAX) {
                        cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                      "image config: Env must be an array of at most %d", ENV_MAX);
                        goto out;
                }
                size_t i;
                json_t *v;
                json_array_foreach(ev, i, v)
                {
                        const char *s = json_string_value(v);
                        const char *eq = s ? strchr(s, '=') : NULL;
                        if (!str_ok(v, STR_MAX) || !eq || eq == s || (size_t)(eq - s) > 255) {
                                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                              "image config: Env[%zu] is not NAME=VALUE", i);
                                goto out;
                        }
                        char k[256];
                        memcpy(k, s, (size_t)(eq - s));
                        k[eq - s] = '\0';
                        json_object_set_new(env, k, json_string(eq + 1));
                }
        }
        if (argv_copy(json_object_get(cfg, "Entrypoint"), &ep, "Entrypoint", err) < 0 ||
            argv_copy(json_object_get(cfg, "Cmd"), &cmd, "Cmd", err) < 0)
                goto out;
        const char *us = json_string_value(user), *ws = json_string_value(wd);
        c->defaults =
            json_pack("{s:s?, s:s?, s:O, s:O, s:O}", "user", us && *us ? us : NULL, "workdir",
                      ws && *ws ? ws : NULL, "env", env, "entrypoint", ep, "cmd", cmd);
        if (!c->defaults) {
                cove_err_set(err, ENOMEM, "image config");
                goto out;
        }
        rc = 0;
out:
        json_decref(ep);
        json_decref(cmd);
        json_decref(env);
        json_decref(j);
        return rc;
}

void cove_oci_config_clear(struct cove_oci_config *c)
{
        json_decref(c->defaults);
        c->defaults = NULL;
}
