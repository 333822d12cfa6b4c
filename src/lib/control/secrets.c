/* Egress secrets and credential leases; see secrets.h. Stored as catalog documents
 * (kind "secret": key = name; kind "lease": key = lease id, owner = sandbox id). */
#include "control/secrets.h"

#include <errno.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/audit.h"
#include "control/coved.h"
#include "control/egress.h"
#include "crypto/keys.h"
#include "node/egress.h"
#include "util/util.h"

#define GCM_NONCE 12
#define GCM_TAG 16

static int secret_key(struct coved *d, const char *tenant, uint8_t key[COVE_KEY_LEN],
                      struct cove_err *err)
{
        char keys[PATH_MAX];
        snprintf(keys, sizeof(keys), "%s/keys", d->data_dir);
        uint8_t dek[COVE_KEY_LEN];
        int r = cove_dek_load(keys, tenant, 1, dek, err);
        if (r == 0)
                r = cove_hkdf_sha256(dek, sizeof(dek), COVE_KEY_INFO_SECRETS, key, COVE_KEY_LEN,
                                     err);
        OPENSSL_cleanse(dek, sizeof(dek));
        return r < 0 ? cove_err_wrap(err, "secret key of tenant %s", tenant) : 0;
}

static void aad_of(const char *tenant, const char *name, char *out, size_t cap, int *len)
{
        *len = snprintf(out, cap, "cove/v1/secret%c%s%c%s", 0, tenant, 0, name);
}

/* value → hex(nonce | ciphertext | tag) */
static char *seal(struct coved *d, const char *tenant, const char *name, const char *value,
                  struct cove_err *err)
{
        uint8_t key[COVE_KEY_LEN], nonce[GCM_NONCE];
        if (secret_key(d, tenant, key, err) < 0 || cove_random(nonce, sizeof(nonce), err) < 0) {
                OPENSSL_cleanse(key, sizeof(key));
                return NULL;
        }
        size_t n = strlen(value);
        uint8_t *buf = malloc(GCM_NONCE + n + GCM_TAG);
        char *hex = malloc(2 * (GCM_NONCE + n + GCM_TAG) + 1);
        char aad[256];
        int al, ol = 0, fl = 0;
        aad_of(tenant, name, aad, sizeof(aad), &al);
        EVP_CIPHER_CTX *cx = EVP_CIPHER_CTX_new();
        int ok = buf && hex && cx &&
                 EVP_EncryptInit_ex(cx, EVP_aes_256_gcm(), NULL, key, nonce) == 1 &&
                 EVP_EncryptUpdate(cx, NULL, &ol, (const uint8_t *)aad, al) == 1 &&
                 EVP_EncryptUpdate(cx, buf + GCM_NONCE, &ol, (const uint8_t *)value, (int)n) == 1 &&
                 EVP_EncryptFinal_ex(cx, buf + GCM_NONCE + ol, &fl) == 1 &&
                 EVP_CIPHER_CTX_ctrl(cx, EVP_CTRL_GCM_GET_TAG, GCM_TAG, buf + GCM_NONCE + n) == 1;
        EVP_CIPHER_CTX_free(cx);
        OPENSSL_cleanse(key, sizeof(key));
        if (ok) {
                memcpy(buf, nonce, GCM_NONCE);
                cove_hex(buf, GCM_NONCE + n + GCM_TAG, hex);
        }
        free(buf);
        if (!ok) {
                free(hex);
                cove_err_set(err, 0, "secret %s: encryption failed", name);
                return NULL;
        }
        return hex;
}

static int unhex(const char *h, uint8_t *out, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                unsigned v;
                if (sscanf(h + 2 * i, "%2x", &v) != 1)
                        return -1;
                out[i] = (uint8_t)v;
        }
        return 0;
}

/* hex → value (malloc'd, NUL-terminated) */
static char *unseal(struct coved *d, const char *tenant, const char *name, const char *hex,
                    struct cove_err *err)
{
        size_t hl = strlen(hex);
        if (hl % 2 || hl / 2 < GCM_NONCE + GCM_TAG) {
                cove_err_set(err, 0, "secret %s: stored value is malformed", name);
                return NULL;
        }
        size_t n = hl / 2 - GCM_NONCE - GCM_TAG;
        uint8_t *buf = malloc(hl / 2);
        char *out = malloc(n + 1);
        uint8_t key[COVE_KEY_LEN];
        if (!buf || !out || unhex(hex, buf, hl / 2) < 0 || secret_key(d, tenant, key, err) < 0) {
                free(buf);
                free(out);
                cove_err_set(err, 0, "secret %s: cannot decrypt", name);
                return NULL;
        }
        char aad[256];
        int al, ol = 0, fl = 0;
        aad_of(tenant, name, aad, sizeof(aad), &al);
        EVP_CIPHER_CTX *cx = EVP_CIPHER_CTX_new();
        int ok = cx && EVP_DecryptInit_ex(cx, EVP_aes_256_gcm(), NULL, key, buf) == 1 &&
                 EVP_DecryptUpdate(cx, NULL, &ol, (const uint8_t *)aad, al) == 1 &&
                 EVP_DecryptUpdate(cx, (uint8_t *)out, &ol, buf + GCM_NONCE, (int)n) == 1 &&
                 EVP_CIPHER_CTX_ctrl(cx, EVP_CTRL_GCM_SET_TAG, GCM_TAG, buf + GCM_NONCE + n) == 1 &&
                 EVP_DecryptFinal_ex(cx, (uint8_t *)out + ol, &fl) == 1;
        EVP_CIPHER_CTX_free(cx);
        OPENSSL_cleanse(key, sizeof(key));
        free(buf);
        if (!ok) {
                OPENSSL_cleanse(out, n + 1);
                free(out);
                cove_err_set(err, 0, "secret %s: authentication failed (wrong key or tampered)",
                             name);
                return NULL;
        }
        out[n] = '\0';
        return out;
}

static int header_name_ok(const char *h)
{
        static const char *const framing[] = {"host",       "content-length", "transfer-encoding",
                                              "connection", "upgrade",        "te",
                                              "trailer",    "keep-alive",     "proxy-connection"};
        size_t n = strlen(h);
        if (n == 0 || n > 64)
                return 0;
        for (size_t i = 0; i < n; i++)
                if (!(h[i] >= 'a' && h[i] <= 'z') && !(h[i] >= 'A' && h[i] <= 'Z') &&
                    !(h[i] >= '0' && h[i] <= '9') && !strchr("!#$%&'*+-.^_`|~", h[i]))
                        return 0;
        for (size_t i = 0; i < sizeof(framing) / sizeof(framing[0]); i++)
                if (!strcasecmp(h, framing[i]))
                        return 0;
        return 1;
}

static int text_ok(const char *s, size_t max)
{
        size_t n = strlen(s);
        if (n == 0 || n > max)
                return 0;
        for (size_t i = 0; i < n; i++)
                if (((unsigned char)s[i] < 0x20 && s[i] != '\t') || s[i] == 0x7f)
                        return 0;
        return 1;
}

/* the public form of a stored document (no value) */
static json_t *secret_public(const char *name, json_t *doc)
{
        return json_pack("{s:s, s:O, s:O, s:O, s:O}", "name", name, "hosts",
                         json_object_get(doc, "hosts"), "inject", json_object_get(doc, "inject"),
                         "created_at", json_object_get(doc, "created_at"), "updated_at",
                         json_object_get(doc, "updated_at"));
}

static int load_doc(struct coved *d, const char *kind, const char *tenant, const char *key,
                    json_t **doc, struct cove_err *err)
{
        char *text = NULL;
        int r = d->cat_ops->doc_get(d->cat, kind, tenant, key, &text, err);
        if (r < 0)
                return -1;
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "%s %.64s not found", kind, key);
        json_error_t je;
        *doc = json_loads(text, 0, &je);
        free(text);
        if (!json_is_object(*doc)) {
                json_decref(*doc);
                return cove_err_set(err, 0, "%s %s: stored document is malformed", kind, key);
        }
        return 0;
}

static int store_doc(struct coved *d, const char *kind, const char *tenant, const char *key,
                     const char *owner, json_t *doc, struct cove_err *err)
{
        char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
        if (!text)
                return cove_err_set(err, ENOMEM, "%s", kind);
        int r = d->cat_ops->doc_put(d->cat, kind, tenant, key, owner, text, err);
        free(text);
        return r;
}

struct refresh_ctx {
        struct coved *d;
};

static int refresh_one(const struct cove_sandbox_row *row, void *arg)
{
        struct refresh_ctx *rc = arg;
        if (cove_node_egress_attached(rc->d->gw, row->id, NULL))
                coved_egress_refresh(rc->d, row->tenant, row->id);
        return 0;
}

/* A secret changed or went: running sandboxes of the tenant get fresh injection tables. */
static void refresh_tenant(struct coved *d, const char *tenant)
{
        struct refresh_ctx rc = {d};
        struct cove_err e;
        d->cat_ops->sandbox_list(d->cat, tenant, "running", refresh_one, &rc, &e);
}

int coved_secret_put(struct coved *d, const char *tenant, const char *name, json_t *body,
                     json_t **out, struct cove_err *err)
{
        if (!cove_secret_name_valid(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "secret names are [A-Za-z_][A-Za-z0-9_]*, at most %d "
                                     "characters (the sandbox sees one as an env variable)",
                                     COVE_SECRET_NAME_MAX);
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v)
        {
                if (strcmp(k, "value") && strcmp(k, "hosts") && strcmp(k, "inject"))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "secret: unknown field \"%.64s\" (value, hosts, "
                                             "inject)",
                                             k);
        }
        json_t *val = json_object_get(body, "value");
        if (!json_is_string(val) || json_string_length(val) != strlen(json_string_value(val)) ||
            !text_ok(json_string_value(val), COVE_SECRET_VALUE_MAX))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "secret value must be a string of 1 to %d bytes without "
                                     "control characters",
                                     COVE_SECRET_VALUE_MAX);
        json_t *hosts = json_object_get(body, "hosts");
        size_t nh = json_array_size(hosts);
        if (!json_is_array(hosts) || nh == 0 || nh > COVE_SECRET_HOSTS_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "secret hosts must be an array of 1 to %d name patterns",
                                     COVE_SECRET_HOSTS_MAX);
        json_t *norm_hosts = json_array();
        for (size_t i = 0; i < nh; i++) {
                struct cove_rule r;
                const char *h = json_string_value(json_array_get(hosts, i));
                if (!h || cove_rule_parse(h, &r, err) < 0 || r.type == COVE_RULE_CIDR) {
                        json_decref(norm_hosts);
                        if (h && r.type == COVE_RULE_CIDR)
                                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                              "secret hosts[%zu]: a secret binds to names, not "
                                              "addresses",
                                              i);
                        else if (!h)
                                cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                              "secret hosts[%zu] must be a string", i);
                        return cove_err_wrap(err, "secret hosts[%zu]", i);
                }
                json_array_append_new(norm_hosts, json_string(r.text));
        }
        json_t *inj = json_object_get(body, "inject");
        json_t *norm_inj = NULL;
        if (json_is_object(inj) && json_is_true(json_object_get(inj, "placeholder")) &&
            json_object_size(inj) == 1) {
                norm_inj = json_pack("{s:b}", "placeholder", 1);
        } else if (json_is_object(inj) && json_is_string(json_object_get(inj, "header"))) {
                const char *h = json_string_value(json_object_get(inj, "header"));
                json_t *fj = json_object_get(inj, "format");
                const char *f = fj ? json_string_value(fj) : "{value}";
                const char *at = f ? strstr(f, "{value}") : NULL;
                if (!header_name_ok(h) || !f || !text_ok(f, 512) || !at ||
                    strstr(at + 1, "{value}") || json_object_size(inj) > 2 ||
                    (json_object_size(inj) == 2 && !fj)) {
                        json_decref(norm_hosts);
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "secret inject: want {\"header\": NAME (not a "
                                             "framing header), \"format\": \"… {value} …\"} "
                                             "with {value} once");
                }
                norm_inj = json_pack("{s:s, s:s}", "header", h, "format", f);
        } else {
                json_decref(norm_hosts);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "secret inject must be {\"header\":…, \"format\":…} or "
                                     "{\"placeholder\": true}");
        }
        char *sealed = seal(d, tenant, name, json_string_value(val), err);
        if (!sealed) {
                json_decref(norm_hosts);
                json_decref(norm_inj);
                return -1;
        }
        char now[40];
        cove_rfc3339(cove_now_ms(), now, sizeof(now));
        json_t *old = NULL;
        struct cove_err e2;
        const char *created = now;
        if (load_doc(d, "secret", tenant, name, &old, &e2) == 0 &&
            json_string_value(json_object_get(old, "created_at")))
                created = json_string_value(json_object_get(old, "created_at"));
        json_t *doc =
            json_pack("{s:o, s:o, s:s, s:s, s:s}", "hosts", norm_hosts, "inject", norm_inj,
                      "sealed", sealed, "created_at", created, "updated_at", now);
        OPENSSL_cleanse(sealed, strlen(sealed));
        free(sealed);
        json_decref(old);
        int r = store_doc(d, "secret", tenant, name, "", doc, err);
        if (r == 0) {
                *out = secret_public(name, doc);
                cove_audit_log(d->audit, tenant, "", "control", "secret.put", "",
                               json_pack("{s:s}", "secret", name));
                refresh_tenant(d, tenant);
        }
        json_decref(doc);
        return r;
}

int coved_secret_get(struct coved *d, const char *tenant, const char *name, json_t **out,
                     struct cove_err *err)
{
        json_t *doc;
        if (load_doc(d, "secret", tenant, name, &doc, err) < 0)
                return -1;
        *out = secret_public(name, doc);
        json_decref(doc);
        return 0;
}

static int list_secret(const char *tenant, const char *key, const char *owner, const char *json,
                       void *arg)
{
        json_error_t je;
        json_t *doc = json_loads(json, 0, &je);
        if (doc)
                json_array_append_new(arg, secret_public(key, doc));
        json_decref(doc);
        return 0;
}

int coved_secret_list(struct coved *d, const char *tenant, json_t **out, struct cove_err *err)
{
        json_t *arr = json_array();
        if (d->cat_ops->doc_list(d->cat, "secret", tenant, NULL, list_secret, arr, err) < 0) {
                json_decref(arr);
                return -1;
        }
        *out = json_pack("{s:o}", "secrets", arr);
        return 0;
}

int coved_secret_delete(struct coved *d, const char *tenant, const char *name, struct cove_err *err)
{
        int r = d->cat_ops->doc_delete(d->cat, "secret", tenant, name, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "secret %.64s not found", name);
        if (r == 0) {
                cove_audit_log(d->audit, tenant, "", "control", "secret.delete", "",
                               json_pack("{s:s}", "secret", name));
                refresh_tenant(d, tenant);
        }
        return r;
}

int coved_secrets_check(struct coved *d, const char *tenant, const struct cove_policy *p,
                        struct cove_err *err)
{
        for (int i = 0; i < p->nsecrets; i++) {
                char *text = NULL;
                int r = d->cat_ops->doc_get(d->cat, "secret", tenant, p->secrets[i], &text, err);
                free(text);
                if (r < 0)
                        return -1;
                if (r == 1)
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "egress.secrets: no secret named \"%s\" (PUT "
                                             "/v1/secrets/%s first)",
                                             p->secrets[i], p->secrets[i]);
        }
        return 0;
}

static int mint_placeholder(char out[COVE_PLACEHOLDER_LEN + 1], struct cove_err *err)
{
        uint8_t b[16];
        if (cove_random(b, sizeof(b), err) < 0)
                return -1;
        memcpy(out, "cove_ph_", 8);
        cove_hex(b, sizeof(b), out + 8);
        return 0;
}

/* fill one injection from the stored secret; 1 when the secret is gone */
static int build_one(struct coved *d, const char *tenant, const char *name, json_t *placeholders,
                     int *changed, struct cove_inject *in, struct cove_err *err)
{
        json_t *doc;
        if (load_doc(d, "secret", tenant, name, &doc, err) < 0)
                return err->kind == COVE_E_NOT_FOUND ? 1 : -1;
        memset(in, 0, sizeof(*in));
        snprintf(in->name, sizeof(in->name), "%s", name);
        json_t *hosts = json_object_get(doc, "hosts");
        for (size_t i = 0; i < json_array_size(hosts) && in->nhosts < COVE_SECRET_HOSTS_MAX; i++)
                if (cove_rule_parse(json_string_value(json_array_get(hosts, i)),
                                    &in->hosts[in->nhosts], err) == 0)
                        in->nhosts++;
        json_t *inj = json_object_get(doc, "inject");
        in->placeholder = json_is_true(json_object_get(inj, "placeholder"));
        if (!in->placeholder) {
                snprintf(in->header, sizeof(in->header), "%s",
                         json_string_value(json_object_get(inj, "header")));
                in->format = strdup(json_string_value(json_object_get(inj, "format")));
        }
        const char *ph = json_string_value(json_object_get(placeholders, name));
        if (!ph || strlen(ph) != COVE_PLACEHOLDER_LEN) {
                if (mint_placeholder(in->ph, err) < 0) {
                        json_decref(doc);
                        return -1;
                }
                json_object_set_new(placeholders, name, json_string(in->ph));
                *changed = 1;
        } else {
                snprintf(in->ph, sizeof(in->ph), "%s", ph);
        }
        in->value = unseal(d, tenant, name, json_string_value(json_object_get(doc, "sealed")), err);
        json_decref(doc);
        if (!in->value || (!in->placeholder && !in->format)) {
                free(in->format);
                in->format = NULL;
                return -1;
        }
        return 0;
}

struct lease_acc {
        json_t *arr;
        int64_t now;
};

static const char *lease_state(json_t *doc, int64_t now)
{
        const char *st = json_string_value(json_object_get(doc, "state"));
        if (st && !strcmp(st, "active") &&
            json_integer_value(json_object_get(doc, "expires_ms")) <= now)
                return "expired";
        return st ? st : "unknown";
}

static int collect(const char *tenant, const char *key, const char *owner, const char *json,
                   void *arg)
{
        json_error_t je;
        json_t *doc = json_loads(json, 0, &je);
        if (doc) {
                json_object_set_new(doc, "id", json_string(key));
                json_object_set_new(doc, "sandbox", json_string(owner));
                json_array_append_new(arg, doc);
        }
        return 0;
}

int coved_secrets_injects(struct coved *d, const char *tenant, const char *sandbox,
                          struct cove_policy *p, json_t *placeholders, int *changed,
                          struct cove_err *err)
{
        json_t *leases = json_array();
        if (d->cat_ops->doc_list(d->cat, "lease", tenant, sandbox, collect, leases, err) < 0) {
                json_decref(leases);
                return -1;
        }
        int64_t now = cove_now_ms();
        size_t cap = (size_t)p->nsecrets + json_array_size(leases);
        struct cove_inject *inj = cap ? calloc(cap, sizeof(*inj)) : NULL;
        int n = 0;
        if (cap && !inj) {
                json_decref(leases);
                return cove_err_set(err, ENOMEM, "injections");
        }
        int r = 0;
        for (int i = 0; r == 0 && i < p->nsecrets; i++) {
                int b = build_one(d, tenant, p->secrets[i], placeholders, changed, &inj[n], err);
                if (b == 0)
                        n++;
                else if (b == 1)
                        cove_warn(&d->log, "egress", "sandbox %s: secret %s is gone: not injected",
                                  sandbox, p->secrets[i]);
                else
                        r = -1;
        }
        size_t i;
        json_t *l;
        json_array_foreach(leases, i, l)
        {
                if (r < 0 || strcmp(lease_state(l, now), "active"))
                        continue;
                const char *sec = json_string_value(json_object_get(l, "secret"));
                int b = sec ? build_one(d, tenant, sec, placeholders, changed, &inj[n], err) : 1;
                if (b < 0) {
                        r = -1;
                } else if (b == 0) {
                        inj[n].expires_ms = json_integer_value(json_object_get(l, "expires_ms"));
                        snprintf(inj[n].lease, sizeof(inj[n].lease), "%s",
                                 json_string_value(json_object_get(l, "id")));
                        n++;
                }
        }
        json_decref(leases);
        if (r < 0) {
                cove_injects_free(inj, n);
                return -1;
        }
        cove_policy_set_injects(p, inj, n);
        return 0;
}

/* ---- leases ---- */

static json_t *lease_public(json_t *doc, int64_t now)
{
        json_t *o = json_deep_copy(doc);
        json_object_set_new(o, "state", json_string(lease_state(doc, now)));
        int64_t exp = json_integer_value(json_object_get(doc, "expires_ms"));
        char t[40];
        if (exp) {
                cove_rfc3339(exp, t, sizeof(t));
                json_object_set_new(o, "expires_at", json_string(t));
        } else {
                json_object_set_new(o, "expires_at", json_null());
        }
        json_object_del(o, "expires_ms");
        return o;
}

static int ttl_of(json_t *body, int dflt, int *ttl, struct cove_err *err)
{
        json_t *t = json_object_get(body, "ttl_s");
        if (!t) {
                *ttl = dflt;
                return 0;
        }
        if (!json_is_integer(t) || json_integer_value(t) < 1 ||
            json_integer_value(t) > COVE_LEASE_TTL_MAX)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "ttl_s must be an integer from 1 to %d", COVE_LEASE_TTL_MAX);
        *ttl = (int)json_integer_value(t);
        return 0;
}

static int lease_new(struct coved *d, const char *tenant, const char *sandbox, const char *secret,
                     const char *reason, int ttl, int active, json_t **out, struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, sandbox, &row, err) < 0)
                return -1;
        cove_sandbox_row_clear(&row);
        if (!secret || !cove_secret_name_valid(secret))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "secret must be a secret name");
        json_t *sdoc;
        if (load_doc(d, "secret", tenant, secret, &sdoc, err) < 0) {
                if (err->kind == COVE_E_NOT_FOUND)
                        err->kind = COVE_E_BAD_REQUEST;
                return -1;
        }
        json_decref(sdoc);
        char id[64];
        if (cove_id_new("lease_", id, sizeof(id), err) < 0)
                return -1;
        int64_t now = cove_now_ms();
        char created[40];
        cove_rfc3339(now, created, sizeof(created));
        json_t *doc =
            json_pack("{s:s, s:s, s:s, s:i, s:s, s:I, s:s}", "id", id, "sandbox", sandbox, "secret",
                      secret, "ttl_s", ttl, "state", active ? "active" : "pending", "expires_ms",
                      (json_int_t)(active ? now + (int64_t)ttl * 1000 : 0), "created_at", created);
        if (reason)
                json_object_set_new(doc, "reason", json_string(reason));
        int r = store_doc(d, "lease", tenant, id, sandbox, doc, err);
        if (r == 0) {
                cove_audit_log(
                    d->audit, tenant, sandbox, "lease", active ? "grant" : "request", "",
                    json_pack("{s:s, s:s, s:i}", "lease", id, "secret", secret, "ttl_s", ttl));
                if (active)
                        coved_egress_refresh(d, tenant, sandbox);
                *out = lease_public(doc, now);
        }
        json_decref(doc);
        return r;
}

int coved_lease_create(struct coved *d, const char *tenant, const char *sandbox, json_t *body,
                       json_t **out, struct cove_err *err)
{
        /* another tenant's (or no) sandbox is 404 whatever the body says */
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, sandbox, &row, err) < 0)
                return -1;
        cove_sandbox_row_clear(&row);
        int ttl;
        if (ttl_of(body, 0, &ttl, err) < 0)
                return -1;
        if (!ttl)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "ttl_s is required");
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v)
        {
                if (strcmp(k, "secret") && strcmp(k, "ttl_s"))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                             "lease: unknown field \"%.64s\" (secret, ttl_s)", k);
        }
        return lease_new(d, tenant, sandbox, json_string_value(json_object_get(body, "secret")),
                         NULL, ttl, 1, out, err);
}

int coved_lease_request(struct coved *d, const char *tenant, const char *sandbox,
                        const char *secret, const char *reason, int ttl_s, json_t **out,
                        struct cove_err *err)
{
        return lease_new(d, tenant, sandbox, secret, reason, ttl_s, 0, out, err);
}

int coved_lease_list(struct coved *d, const char *tenant, const char *sandbox, json_t **out,
                     struct cove_err *err)
{
        if (sandbox) {
                struct cove_sandbox_row row;
                if (cove_sandbox_load(d, tenant, sandbox, &row, err) < 0)
                        return -1;
                cove_sandbox_row_clear(&row);
        }
        json_t *arr = json_array(), *res = json_array();
        if (d->cat_ops->doc_list(d->cat, "lease", tenant, sandbox, collect, arr, err) < 0) {
                json_decref(arr);
                json_decref(res);
                return -1;
        }
        int64_t now = cove_now_ms();
        size_t i;
        json_t *l;
        json_array_foreach(arr, i, l) json_array_append_new(res, lease_public(l, now));
        json_decref(arr);
        *out = json_pack("{s:o}", "leases", res);
        return 0;
}

int coved_lease_answer(struct coved *d, const char *tenant, const char *id, int approve,
                       json_t *body, json_t **out, struct cove_err *err)
{
        json_t *doc;
        if (load_doc(d, "lease", tenant, id, &doc, err) < 0)
                return -1;
        const char *st = json_string_value(json_object_get(doc, "state"));
        if (!st || strcmp(st, "pending")) {
                cove_err_setk(err, COVE_E_CONFLICT, 0, "lease %s is %s, not pending", id,
                              st ? st : "unknown");
                json_decref(doc);
                return -1;
        }
        int ttl = (int)json_integer_value(json_object_get(doc, "ttl_s"));
        if (approve && body && ttl_of(body, ttl, &ttl, err) < 0) {
                json_decref(doc);
                return -1;
        }
        int64_t now = cove_now_ms();
        json_object_set_new(doc, "state", json_string(approve ? "active" : "denied"));
        json_object_set_new(doc, "ttl_s", json_integer(ttl));
        json_object_set_new(doc, "expires_ms",
                            json_integer(approve ? now + (int64_t)ttl * 1000 : 0));
        char sbx[64];
        snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(doc, "sandbox")));
        int r = store_doc(d, "lease", tenant, id, sbx, doc, err);
        if (r == 0) {
                cove_audit_log(
                    d->audit, tenant, sbx, "lease", approve ? "approve" : "deny", "",
                    json_pack("{s:s, s:O}", "lease", id, "secret", json_object_get(doc, "secret")));
                if (approve)
                        coved_egress_refresh(d, tenant, sbx);
                *out = lease_public(doc, now);
        }
        json_decref(doc);
        return r;
}

int coved_lease_delete(struct coved *d, const char *tenant, const char *id, struct cove_err *err)
{
        json_t *doc;
        if (load_doc(d, "lease", tenant, id, &doc, err) < 0)
                return -1;
        char sbx[64];
        snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(doc, "sandbox")));
        json_decref(doc);
        int r = d->cat_ops->doc_delete(d->cat, "lease", tenant, id, err);
        if (r == 1)
                return cove_err_setk(err, COVE_E_NOT_FOUND, 0, "lease %.64s not found", id);
        if (r == 0) {
                cove_audit_log(d->audit, tenant, sbx, "lease", "revoke", "",
                               json_pack("{s:s}", "lease", id));
                coved_egress_refresh(d, tenant, sbx);
        }
        return r;
}

json_t *coved_on_ask(void *arg, const char *sandbox_id, json_t *ask)
{
        struct coved *d = arg;
        const char *bad = json_string_value(json_object_get(ask, "error"));
        if (bad)
                return json_pack("{s:b, s:s}", "ok", 0, "message", bad);
        struct cove_sandbox_row row;
        struct cove_err err;
        memset(&row, 0, sizeof(row));
        int r = d->cat_ops->sandbox_get(d->cat, NULL, sandbox_id, &row, &err);
        if (r != 0) {
                cove_sandbox_row_clear(&row);
                return json_pack("{s:b, s:s}", "ok", 0, "message", "unknown sandbox");
        }
        json_t *out = NULL;
        r = coved_lease_request(d, row.tenant, sandbox_id,
                                json_string_value(json_object_get(ask, "secret")),
                                json_string_value(json_object_get(ask, "reason")),
                                (int)json_integer_value(json_object_get(ask, "ttl_s")), &out, &err);
        cove_sandbox_row_clear(&row);
        if (r < 0) /* names of secrets are not secret; messages carry no value */
                return json_pack("{s:b, s:s}", "ok", 0, "message", err.msg);
        json_t *ans = json_pack("{s:b, s:O, s:O}", "ok", 1, "lease", json_object_get(out, "id"),
                                "state", json_object_get(out, "state"));
        json_decref(out);
        return ans;
}

static int del_lease(const char *tenant, const char *key, const char *owner, const char *json,
                     void *arg)
{
        struct coved *d = arg;
        struct cove_err e;
        d->cat_ops->doc_delete(d->cat, "lease", tenant, key, &e);
        return 0;
}

void coved_leases_forget(struct coved *d, const char *tenant, const char *sandbox)
{
        struct cove_err e;
        d->cat_ops->doc_list(d->cat, "lease", tenant, sandbox, del_lease, d, &e);
}

int coved_secret_value_for_host(struct coved *d, const char *tenant, const char *name,
                                const char *host, char **value, struct cove_err *err)
{
        *value = NULL;
        if (!cove_secret_name_valid(name))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "invalid secret name");
        json_t *doc = NULL;
        if (load_doc(d, "secret", tenant, name, &doc, err) < 0)
                return -1;
        /* a secret goes only where it is bound: a registry it does not name gets nothing */
        char h[256];
        snprintf(h, sizeof(h), "%s", host);
        char *colon = strrchr(h, ':');
        if (colon && !strchr(h, ']'))
                *colon = '\0';
        json_t *pol = json_pack("{s:O}", "allow", json_object_get(doc, "hosts"));
        struct cove_policy *p = cove_policy_parse(pol, NULL);
        json_decref(pol);
        int ok = p && cove_policy_check_dns(p, h, NULL) == COVE_ALLOW;
        if (p)
                cove_policy_unref(p);
        if (!ok) {
                json_decref(doc);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "secret %s is not bound to the registry host %.200s (its "
                                     "hosts must list it)",
                                     name, h);
        }
        *value = unseal(d, tenant, name, json_string_value(json_object_get(doc, "sealed")), err);
        json_decref(doc);
        return *value ? 0 : -1;
}
