/* Exposed ports: control-plane glue between the API, the catalog and the node's port
 * listener; see ports.h. */
#include "control/ports.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "cluster/nodeauth.h"
#include "control/audit.h"
#include "control/coved.h"
#include "control/placement.h"
#include "control/egress.h"
#include "control/snapshot.h"
#include "net/ports.h"
#include "util/util.h"

#define DOC_KIND "port"
#define NS_LOOPBACK 0x7f000001u

struct coved_ports {
        struct cove_ports *p;
        char domain[254];
        char url_host[80]; /* path routes: "HOST:PORT" */
        unsigned listen_port;
        pthread_mutex_t mu; /* resumes running */
        pthread_cond_t cv;
        int resuming;
        int closing;
};

static void audit_sink(void *arg, const char *tenant, const char *sandbox, const char *action,
                       const char *verdict, json_t *detail)
{
        struct coved *d = arg;
        cove_audit_log(d->audit, tenant, sandbox, "port", action, verdict, detail);
}

static void locate(void *arg, const char *sandbox, struct cove_ports_where *w)
{
        struct coved *d = arg;
        pid_t pid = d->node ? cove_node_pid(d->node, sandbox) : 0;
        if (pid > 0) {
                w->state = COVE_PORTS_RUNNING;
                w->pid = pid;
                return;
        }
        struct cove_sandbox_row row;
        struct cove_err e;
        memset(&row, 0, sizeof(row));
        int r = d->cat_ops->sandbox_get(d->cat, NULL, sandbox, &row, &e);
        if (r != 0) {
                w->state = COVE_PORTS_GONE;
                snprintf(w->why, sizeof(w->why), "sandbox %s does not exist", sandbox);
                return;
        }
        if (!strcmp(row.state, "paused") || !strcmp(row.state, "pausing") ||
            !strcmp(row.state, "resuming")) {
                w->state = COVE_PORTS_PAUSED;
        } else {
                w->state = COVE_PORTS_GONE;
                snprintf(w->why, sizeof(w->why), "sandbox %s is %s, not running", sandbox,
                         row.state);
        }
        cove_sandbox_row_clear(&row);
}

static void tenant_of(void *arg, const char *sandbox, char *out, size_t cap)
{
        struct coved *d = arg;
        struct cove_sandbox_row row;
        struct cove_err e;
        memset(&row, 0, sizeof(row));
        out[0] = '\0';
        if (d->cat_ops->sandbox_get(d->cat, NULL, sandbox, &row, &e) == 0) {
                snprintf(out, cap, "%s", row.tenant);
                cove_sandbox_row_clear(&row);
        }
}

struct resume_job {
        struct coved *d;
        char tenant[64], id[64];
};

static void *resume_main(void *arg)
{
        struct resume_job *j = arg;
        struct coved *d = j->d;
        struct coved_ports *cp = d->ports;
        json_t *out = NULL;
        struct cove_err e;
        int r = cove_sandbox_resume(d, j->tenant, j->id, NULL, &out, &e);
        json_decref(out);
        if (r < 0 && e.kind != COVE_E_CONFLICT) /* CONFLICT: running or resuming already */
                cove_ports_resume_failed(cp->p, j->id, e.msg);
        else
                cove_ports_kick(cp->p);
        free(j);
        pthread_mutex_lock(&cp->mu);
        cp->resuming--;
        pthread_cond_broadcast(&cp->cv);
        pthread_mutex_unlock(&cp->mu);
        return NULL;
}

static void resume(void *arg, const char *tenant, const char *sandbox)
{
        struct coved *d = arg;
        struct coved_ports *cp = d->ports;
        struct resume_job *j = calloc(1, sizeof(*j));
        if (!j) {
                cove_ports_resume_failed(cp->p, sandbox, "out of memory");
                return;
        }
        j->d = d;
        snprintf(j->tenant, sizeof(j->tenant), "%s", tenant);
        snprintf(j->id, sizeof(j->id), "%s", sandbox);
        pthread_mutex_lock(&cp->mu);
        int closing = cp->closing;
        if (!closing)
                cp->resuming++;
        pthread_mutex_unlock(&cp->mu);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (closing || pthread_create(&t, &at, resume_main, j) != 0) {
                free(j);
                if (!closing) {
                        pthread_mutex_lock(&cp->mu);
                        cp->resuming--;
                        pthread_mutex_unlock(&cp->mu);
                }
                cove_ports_resume_failed(cp->p, sandbox, "no resume thread");
        }
        pthread_attr_destroy(&at);
}

static uint32_t target_addr(const char *runtime)
{
        return !strcmp(runtime, "vm") ? COVE_NODE_VM_GUEST_ADDR : NS_LOOPBACK;
}

static int hash_hex(const char *hex, uint8_t out[32])
{
        if (!hex || strlen(hex) != 64)
                return -1;
        for (int i = 0; i < 32; i++) {
                unsigned v;
                if (sscanf(hex + 2 * i, "%2x", &v) != 1)
                        return -1;
                out[i] = (uint8_t)v;
        }
        return 0;
}

/* Hand one stored exposure to the listener. */
static int load_one(const char *tenant, const char *key, const char *owner, const char *json,
                    void *arg)
{
        struct coved *d = arg;
        (void)key;
        json_error_t je;
        json_t *o = json_loads(json, 0, &je);
        struct cove_sandbox_row row;
        struct cove_err e;
        memset(&row, 0, sizeof(row));
        if (o && d->cat_ops->sandbox_get(d->cat, tenant, owner, &row, &e) == 0) {
                uint8_t h[32] = {0};
                int pub = json_is_true(json_object_get(o, "public"));
                if (pub || hash_hex(json_string_value(json_object_get(o, "token_sha256")), h) == 0)
                        cove_ports_expose(d->ports->p, tenant, owner,
                                          (uint16_t)json_integer_value(json_object_get(o, "port")),
                                          pub, json_is_true(json_object_get(o, "auto_resume")),
                                          target_addr(row.runtime), pub ? NULL : h, &e);
                cove_sandbox_row_clear(&row);
        }
        json_decref(o);
        return 0;
}

/* ---- in a cluster (docs/cluster.md "Exposed ports") ---- */

/* Role control: the port listener of the node the sandbox is placed on (its row's
 * features "ports", HOST:PORT). */
static void doc_key(char *key, size_t cap, const char *id, unsigned port)
{
        if (port)
                snprintf(key, cap, "%s/%u", id, port);
        else
                snprintf(key, cap, "%s/*", id);
}

/* Role control: a head for a sandbox whose desired state is paused. 0 with hop->paused when
 * its port has auto_resume and the head's token is right (the resume is then the control's,
 * a lifecycle job like the user's), else -1 with the answer the node would give. */
static int relay_paused(struct coved *d, const char *sandbox, uint16_t port, const char *token,
                        struct cove_ports_hop *hop)
{
        struct cove_sandbox_row row;
        struct cove_err e;
        memset(&row, 0, sizeof(row));
        if (d->cat_ops->sandbox_get(d->cat, NULL, sandbox, &row, &e) != 0) {
                hop->status = 404;
                snprintf(hop->why, sizeof(hop->why), "sandbox %s does not exist", sandbox);
                return -1;
        }
        snprintf(hop->tenant, sizeof(hop->tenant), "%s", row.tenant);
        cove_sandbox_row_clear(&row);
        char key[96], *text = NULL;
        json_t *o = NULL;
        for (int i = 0; i < 2 && !o; i++) { /* the port's own exposure, else the "*" one */
                doc_key(key, sizeof(key), sandbox, i ? 0 : port);
                json_error_t je;
                if (d->cat_ops->doc_get(d->cat, DOC_KIND, hop->tenant, key, &text, &e) == 0)
                        o = json_loads(text, 0, &je);
                free(text);
                text = NULL;
        }
        int ar = json_is_true(json_object_get(o, "auto_resume"));
        int pub = json_is_true(json_object_get(o, "public"));
        uint8_t h[32];
        int hashed = hash_hex(json_string_value(json_object_get(o, "token_sha256")), h) == 0;
        int found = o != NULL;
        json_decref(o);
        hop->status = cove_ports_judge(sandbox, port, found, pub, ar, hashed ? h : NULL, token, 1,
                                       hop->why, sizeof(hop->why));
        if (hop->status)
                return -1;
        hop->paused = 1;
        return 0;
}

static int relay_hop(void *arg, const char *sandbox, uint16_t port, const char *token,
                     struct cove_ports_hop *hop)
{
        struct coved *d = arg;
        struct cove_placement_row pl;
        struct cove_err e;
        int rc = d->cat_ops->placement_get(d->cat, sandbox, &pl, &e);
        if (rc == 0 && !strcmp(pl.desired_state, "paused"))
                return relay_paused(d, sandbox, port, token, hop);
        if (rc != 0 || !pl.node[0] || !strcmp(pl.desired_state, "stopped")) {
                hop->status = rc < 0 ? 502 : 404;
                snprintf(hop->why, sizeof(hop->why), "%s",
                         rc < 0 ? "the catalog did not answer: retry"
                                : "no exposed port of that sandbox (it does not exist or is not "
                                  "placed on a node)");
                return -1;
        }
        snprintf(hop->node, sizeof(hop->node), "%s", pl.node);
        struct cove_node_row nrow;
        if (coved_node_get(d, pl.node, &nrow, &e) != 0) {
                hop->status = 502;
                snprintf(hop->why, sizeof(hop->why), "node %s of sandbox %s is unknown", pl.node,
                         sandbox);
                return -1;
        }
        if (!strcmp(nrow.state, "lost")) {
                hop->status = 502;
                snprintf(hop->why, sizeof(hop->why),
                         "sandbox %s: its node %s is lost (it will be recovered elsewhere)",
                         sandbox, pl.node);
                return -1;
        }
        json_error_t je;
        json_t *f = json_loads(nrow.features[0] ? nrow.features : "{}", 0, &je);
        const char *a = json_string_value(json_object_get(f, "ports"));
        char host[64] = "";
        const char *colon = a ? strrchr(a, ':') : NULL;
        long lport = colon ? strtol(colon + 1, NULL, 10) : 0;
        struct in_addr ia;
        if (colon && (size_t)(colon - a) < sizeof(host)) {
                memcpy(host, a, (size_t)(colon - a));
                host[colon - a] = '\0';
        }
        json_decref(f);
        if (!host[0] || lport < 1 || lport > 65535 || inet_pton(AF_INET, host, &ia) != 1) {
                hop->status = 502;
                snprintf(hop->why, sizeof(hop->why),
                         "node %s serves no exposed ports (start it with --ports-listen "
                         "HOST:PORT)",
                         pl.node);
                return -1;
        }
        hop->addr = ntohl(ia.s_addr);
        hop->port = (uint16_t)lport;
        return 0;
}

static void relay_req(struct cove_nodeauth_req *q, char *path, size_t cap, const char *sandbox,
                      uint16_t port, const char *client_ip)
{
        snprintf(path, cap, "/%s/%u/%s", sandbox, (unsigned)port, client_ip);
        *q = (struct cove_nodeauth_req){.method = "PORT", .path_query = path, .tenant = ""};
}

/* Role control: the proof for one relayed head (signed with the node's token). */
static int relay_sign(void *arg, const char *node, const char *sandbox, uint16_t port,
                      const char *client_ip, char *out, size_t cap)
{
        struct coved *d = arg;
        char tok[COVE_NODEAUTH_TOKEN_HEX], path[160], authz[COVE_NODEAUTH_HDR_MAX];
        struct cove_nodeauth_req q;
        struct cove_err e;
        relay_req(&q, path, sizeof(path), sandbox, port, client_ip);
        int rc = !d->has_cluster_key || cove_nodeauth_token(d->cluster_key, node, tok, &e) < 0 ||
                         cove_nodeauth_sign(tok, node, &q, cove_now_ms(), authz, sizeof(authz),
                                            NULL, &e) < 0
                     ? -1
                     : 0;
        OPENSSL_cleanse(tok, sizeof(tok));
        if (rc == 0 && (size_t)snprintf(out, cap, "X-Cove-Relay: %s\r\nX-Cove-Client: %s\r\n",
                                        authz, client_ip) >= cap)
                rc = -1;
        return rc;
}

/* Role node: a relayed head's proof, signed for this node within the time window. */
static int relay_verify(void *arg, const char *sandbox, uint16_t port, const char *proof,
                        const char *client_ip)
{
        struct coved *d = arg;
        struct cove_nodeauth_hdr h;
        struct cove_nodeauth_req q;
        char path[160];
        struct cove_err e;
        relay_req(&q, path, sizeof(path), sandbox, port, client_ip);
        if (cove_nodeauth_parse(proof, &h, &e) < 0 || strcmp(h.name, d->node_name) != 0)
                return -1;
        return cove_nodeauth_verify(d->node_token, &h, &q, cove_now_ms(), &e);
}

static int load_one(const char *tenant, const char *key, const char *owner, const char *json,
                    void *arg);

static int load_missing(const char *tenant, const char *key, const char *owner, const char *json,
                        void *arg)
{
        struct coved *d = arg;
        json_error_t je;
        json_t *o = json_loads(json, 0, &je);
        int has = o && cove_ports_has(d->ports->p, owner,
                                      (uint16_t)json_integer_value(json_object_get(o, "port")));
        json_decref(o);
        return has ? 0 : load_one(tenant, key, owner, json, arg);
}

/* Role node: a route with no exposure here, of a sandbox running here. */
static void reload(void *arg, const char *sandbox)
{
        struct coved *d = arg;
        struct cove_err e;
        if (!d->node || cove_node_pid(d->node, sandbox) <= 0)
                return;
        if (d->cat_ops->doc_list(d->cat, DOC_KIND, NULL, sandbox, load_missing, d, &e) < 0)
                cove_warn(&d->log, "ports", "load the exposed ports of %s: %s", sandbox, e.msg);
}

struct adopting {
        struct coved *d;
        uint16_t ports[256]; /* the stored exposures' ports (a sandbox has few) */
        int n, over;
};

static int adopt_one(const char *tenant, const char *key, const char *owner, const char *json,
                     void *arg)
{
        struct adopting *a = arg;
        json_error_t je;
        json_t *o = json_loads(json, 0, &je);
        json_int_t port = json_integer_value(json_object_get(o, "port"));
        json_decref(o);
        if (a->n < (int)(sizeof(a->ports) / sizeof(a->ports[0])))
                a->ports[a->n++] = (uint16_t)port;
        else
                a->over = 1;
        return load_one(tenant, key, owner, json, a->d);
}

/* Role node: sandbox id came to this node (or came back): its exposures become the stored
 * ones. One it holds already, unchanged, keeps its connections (a head relayed as the
 * sandbox arrived may have loaded it first, and is being answered); others are replaced
 * and those no longer stored are removed. */
void coved_ports_adopt(struct coved *d, const char *id)
{
        if (!d->ports || d->role != COVED_ROLE_NODE)
                return;
        struct cove_err e;
        struct adopting a = {.d = d};
        if (d->cat_ops->doc_list(d->cat, DOC_KIND, NULL, id, adopt_one, &a, &e) < 0) {
                cove_warn(&d->log, "ports", "load the exposed ports of %s: %s", id, e.msg);
                cove_ports_unexpose(d->ports->p, id, -1); /* none that may be stale */
                return;
        }
        if (!a.over)
                cove_ports_unexpose_others(d->ports->p, id, a.ports, a.n);
}

const char *coved_ports_via(struct coved *d)
{
        return d->ports && d->role == COVED_ROLE_CONTROL ? d->ports->url_host : "";
}

int coved_ports_open(struct coved *d, const struct coved_ports_options *o, struct cove_err *err)
{
        if (!o || !o->listen)
                return 0;
        struct coved_ports *cp = calloc(1, sizeof(*cp));
        if (!cp)
                return cove_err_set(err, ENOMEM, "ports");
        pthread_mutex_init(&cp->mu, NULL);
        pthread_cond_init(&cp->cv, NULL);
        if (o->domain)
                snprintf(cp->domain, sizeof(cp->domain), "%s", o->domain);
        struct cove_ports_config pc = {
            .log = &d->log,
            .listen = o->listen,
            .domain = o->domain,
            .max_conns = o->max_conns,
            .idle_ms = o->idle_s > 0 ? o->idle_s * 1000 : 0,
            .locate = locate,
            .tenant_of = tenant_of,
            .resume = resume,
            .audit = audit_sink,
            .arg = d,
        };
        if (d->role == COVED_ROLE_CONTROL) { /* a relay to the nodes' listeners */
                pc.locate = NULL;
                pc.tenant_of = NULL;
                pc.audit = NULL; /* the node audits */
                pc.relay = relay_hop;
                pc.relay_sign = relay_sign;
        } else if (d->role == COVED_ROLE_NODE) {
                pc.relay_verify = relay_verify;
                pc.reload = reload;
                /* the control resumes (a lifecycle job): a head relayed while it runs waits
                 * here for the sandbox to come (coved_ports_adopt) */
                pc.resume = NULL;
        }
        d->ports = cp;
        cp->p = cove_ports_new(&pc, err);
        if (!cp->p) {
                d->ports = NULL;
                free(cp);
                return cove_err_wrap(err, "port listener");
        }
        const char *b = cove_ports_bound(cp->p);
        const char *colon = strrchr(b, ':');
        cp->listen_port = (unsigned)atoi(colon + 1);
        if (!strncmp(b, "0.0.0.0:", 8))
                snprintf(cp->url_host, sizeof(cp->url_host), "127.0.0.1:%u", cp->listen_port);
        else
                snprintf(cp->url_host, sizeof(cp->url_host), "%s", b);
        /* role all: every stored exposure; a node loads a sandbox's when it comes
         * (coved_ports_adopt, reload); a relay holds none */
        if (d->role == COVED_ROLE_ALL &&
            d->cat_ops->doc_list(d->cat, DOC_KIND, NULL, NULL, load_one, d, err) < 0) {
                coved_ports_close(d);
                return cove_err_wrap(err, "load exposed ports");
        }
        cove_info(&d->log, "ports", "serving exposed ports on %s%s%s", b,
                  cp->domain[0] ? " for *." : "", cp->domain);
        return 0;
}

void coved_ports_close(struct coved *d)
{
        struct coved_ports *cp = d->ports;
        if (!cp)
                return;
        pthread_mutex_lock(&cp->mu);
        cp->closing = 1;
        while (cp->resuming)
                pthread_cond_wait(&cp->cv, &cp->mu);
        pthread_mutex_unlock(&cp->mu);
        cove_ports_free(cp->p);
        pthread_mutex_destroy(&cp->mu);
        pthread_cond_destroy(&cp->cv);
        free(cp);
        d->ports = NULL;
}

const char *coved_ports_domain(struct coved *d)
{
        return d->ports ? d->ports->domain : "";
}

static int need_ports(struct coved *d, struct cove_err *err)
{
        if (!d->ports)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "this node serves no ports (start coved with --ports-listen "
                                     "HOST:PORT)");
        return 0;
}

/* via: the preview address of the control replica the call came through (HOST:PORT), NULL:
 * this listener's own. */
static json_t *url_of(struct coved_ports *cp, const char *id, unsigned port, const char *token,
                      const char *via)
{
        char url[512];
        const char *vc = via ? strrchr(via, ':') : NULL;
        unsigned lport = vc ? (unsigned)atoi(vc + 1) : cp->listen_port;
        if (cp->domain[0]) {
                char pp[16] = "";
                if (lport != 80)
                        snprintf(pp, sizeof(pp), ":%u", lport);
                snprintf(url, sizeof(url), "http://%u-%s.%s%s/", port, id, cp->domain, pp);
        } else {
                snprintf(url, sizeof(url), "http://%s/p/%s/%u/", vc ? via : cp->url_host, id, port);
        }
        if (token) {
                size_t n = strlen(url);
                snprintf(url + n, sizeof(url) - n, "?cove_token=%s", token);
        }
        return json_string(url);
}

/* Store and apply one exposure; *token (hex) filled when private. */
static int expose(struct coved *d, const struct cove_sandbox_row *row, unsigned port, int pub,
                  int auto_resume, const char *given_token, char *token, size_t tcap,
                  struct cove_err *err)
{
        uint8_t raw[24], h[32];
        if (!pub) {
                if (given_token) {
                        snprintf(token, tcap, "%s", given_token);
                } else {
                        if (cove_random(raw, sizeof(raw), err) < 0)
                                return -1;
                        char hex[49];
                        cove_hex(raw, sizeof(raw), hex);
                        snprintf(token, tcap, "cpt_%s", hex);
                        OPENSSL_cleanse(raw, sizeof(raw));
                }
                unsigned hl;
                EVP_Digest(token, strlen(token), h, &hl, EVP_sha256(), NULL);
        }
        char hhex[65] = "";
        if (!pub)
                cove_hex(h, 32, hhex);
        json_t *doc =
            json_pack("{s:i, s:b, s:b, s:I}", "port", (int)port, "public", pub, "auto_resume",
                      auto_resume, "created_at", (json_int_t)cove_now_ms());
        if (!pub)
                json_object_set_new(doc, "token_sha256", json_string(hhex));
        char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(doc);
        char key[96];
        doc_key(key, sizeof(key), row->id, port);
        int r = text ? d->cat_ops->doc_put(d->cat, DOC_KIND, row->tenant, key, row->id, text, err)
                     : cove_err_set(err, ENOMEM, "port document");
        free(text);
        if (r < 0)
                return -1;
        if (d->role == COVED_ROLE_CONTROL)
                return 0; /* stored: the sandbox's node loads it (a relay holds none) */
        return cove_ports_expose(d->ports->p, row->tenant, row->id, (uint16_t)port, pub,
                                 auto_resume, target_addr(row->runtime), pub ? NULL : h, err);
}

/* The body of POST …/ports: 0 with port and flags, or -1 with BAD_REQUEST. */
static int port_body(json_t *body, unsigned *port, int *pub, int *ar, struct cove_err *err)
{
        json_t *jp = json_object_get(body, "port");
        json_t *jpub = json_object_get(body, "public");
        json_t *jar = json_object_get(body, "auto_resume");
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v)
        {
                if (strcmp(k, "port") && strcmp(k, "public") && strcmp(k, "auto_resume"))
                        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "unknown field \"%s\"", k);
        }
        if (!json_is_integer(jp) || json_integer_value(jp) < 1 || json_integer_value(jp) > 65535)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "\"port\" must be an integer from 1 to 65535");
        if ((jpub && !json_is_boolean(jpub)) || (jar && !json_is_boolean(jar)))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "\"public\" and \"auto_resume\" must be booleans");
        *port = (unsigned)json_integer_value(jp);
        *pub = json_is_true(jpub);
        *ar = json_is_true(jar);
        return 0;
}

int coved_port_add(struct coved *d, const char *tenant, const char *id, json_t *body,
                   const char *via, json_t **out, struct cove_err *err)
{
        /* another tenant's id answers 404 before anything is said about the body or about
         * what this node serves */
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        unsigned port = 0;
        int pub = 0, ar = 0;
        if (port_body(body, &port, &pub, &ar, err) < 0 || need_ports(d, err) < 0) {
                cove_sandbox_row_clear(&row);
                return -1;
        }
        char token[COVE_PORTS_TOKEN_HASH * 2 + 8] = "";
        int r = expose(d, &row, port, pub, ar, NULL, token, sizeof(token), err);
        if (r == 0) {
                *out = json_pack("{s:i, s:o, s:o, s:b, s:b}", "port", (int)port, "url",
                                 url_of(d->ports, id, port, pub ? NULL : token, via), "token",
                                 pub ? json_null() : json_string(token), "public", pub,
                                 "auto_resume", ar);
                coved_audit_control(d, row.tenant, id, "port.add",
                                    json_pack("{s:i, s:b, s:b}", "port", (int)port, "public", pub,
                                              "auto_resume", ar));
        }
        OPENSSL_cleanse(token, sizeof(token));
        cove_sandbox_row_clear(&row);
        return r;
}

struct list_ctx {
        struct coved *d;
        json_t *arr;
        const char *via;
};

static int list_one(const char *tenant, const char *key, const char *owner, const char *json,
                    void *arg)
{
        struct list_ctx *l = arg;
        (void)tenant;
        (void)key;
        json_error_t je;
        json_t *o = json_loads(json, 0, &je);
        if (!o)
                return 0;
        unsigned port = (unsigned)json_integer_value(json_object_get(o, "port"));
        json_t *item = json_pack(
            "{s:i, s:o, s:O, s:O, s:O}", "port", (int)port, "url",
            port ? url_of(l->d->ports, owner, port, NULL, l->via) : json_null(), "public",
            json_object_get(o, "public"), "auto_resume", json_object_get(o, "auto_resume"),
            "created_at", json_object_get(o, "created_at"));
        if (item)
                json_array_append_new(l->arr, item);
        json_decref(o);
        return 0;
}

static int by_port(const void *a, const void *b)
{
        json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "port"));
        json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "port"));
        return x < y ? -1 : x > y;
}

int coved_port_list(struct coved *d, const char *tenant, const char *id, const char *via,
                    json_t **out, struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        struct list_ctx l = {d, json_array(), via};
        int r = d->ports ? d->cat_ops->doc_list(d->cat, DOC_KIND, row.tenant, id, list_one, &l, err)
                         : 0;
        cove_sandbox_row_clear(&row);
        if (r < 0) {
                json_decref(l.arr);
                return -1;
        }
        size_t n = json_array_size(l.arr);
        json_t **v = calloc(n ? n : 1, sizeof(*v));
        json_t *sorted = json_array();
        for (size_t i = 0; v && i < n; i++)
                v[i] = json_array_get(l.arr, i);
        if (v)
                qsort(v, n, sizeof(*v), by_port);
        for (size_t i = 0; v && i < n; i++)
                json_array_append(sorted, v[i]);
        free(v);
        json_decref(l.arr);
        *out = json_pack("{s:o}", "ports", sorted);
        return 0;
}

int coved_port_delete(struct coved *d, const char *tenant, const char *id, unsigned port,
                      struct cove_err *err)
{
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        if (port < 1 || port > 65535) {
                cove_sandbox_row_clear(&row);
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "port must be from 1 to 65535");
        }
        if (need_ports(d, err) < 0) {
                cove_sandbox_row_clear(&row);
                return -1;
        }
        char key[96];
        doc_key(key, sizeof(key), id, port);
        int r = d->cat_ops->doc_delete(d->cat, DOC_KIND, row.tenant, key, err);
        if (r == 1)
                r = cove_err_setk(err, COVE_E_NOT_FOUND, 0, "port %u of sandbox %s is not exposed",
                                  port, id);
        if (r == 0) {
                cove_ports_unexpose(d->ports->p, id, (int)port);
                coved_audit_control(d, row.tenant, id, "port.remove",
                                    json_pack("{s:i}", "port", (int)port));
        }
        cove_sandbox_row_clear(&row);
        return r;
}

int coved_ports_expose_all(struct coved *d, const char *tenant, const char *id, int public_,
                           const char *token, struct cove_err *err)
{
        if (!d->ports)
                return 0; /* no listener: nothing to reach anyway */
        struct cove_sandbox_row row;
        if (cove_sandbox_load(d, tenant, id, &row, err) < 0)
                return -1;
        char tok[128] = "";
        int r = expose(d, &row, 0, public_, 0, token, tok, sizeof(tok), err);
        OPENSSL_cleanse(tok, sizeof(tok));
        cove_sandbox_row_clear(&row);
        return r;
}

struct forget_ctx {
        json_t *keys; /* [[tenant, key], …] */
};

static int forget_one(const char *tenant, const char *key, const char *owner, const char *json,
                      void *arg)
{
        struct forget_ctx *f = arg;
        (void)owner;
        (void)json;
        json_array_append_new(f->keys, json_pack("[s, s]", tenant, key));
        return 0;
}

void coved_ports_forget(struct coved *d, const char *tenant, const char *id)
{
        struct forget_ctx f = {json_array()};
        struct cove_err e;
        if (d->cat_ops->doc_list(d->cat, DOC_KIND, tenant, id, forget_one, &f, &e) < 0)
                cove_warn(&d->log, "ports", "forget ports of %s: %s", id, e.msg);
        size_t i;
        json_t *v;
        json_array_foreach(f.keys, i, v)
        {
                if (d->cat_ops->doc_delete(d->cat, DOC_KIND,
                                           json_string_value(json_array_get(v, 0)),
                                           json_string_value(json_array_get(v, 1)), &e) < 0)
                        cove_warn(&d->log, "ports", "forget a port of %s: %s", id, e.msg);
        }
        json_decref(f.keys);
        if (d->ports)
                cove_ports_unexpose(d->ports->p, id, -1);
}
