/* The node's port listener; see ports.h. One thread, level-triggered epoll. A client
 * connection goes HEAD (a request head is being read) → CONNECTING (to the sandbox, from
 * inside its netns) or RESUME (waiting for an auto-resume) → OPEN (the head forwarded;
 * bodies follow; the next head is routed again) and ends with CLOSING (our own answer
 * flushed, then closed) or both directions shut. */
#include "net/ports.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "net/ports_route.h"

#define IN_CAP (64 * 1024) /* client bytes read, not yet handled (grows from IN_MIN) */
#define IN_MIN 4096
#define PENDING_MAX 4096      /* connections not yet into a sandbox; over it new ones are closed */
#define OUT_CAP (128 * 1024)  /* bytes for the sandbox, not yet written */
#define UHEAD_MAX (64 * 1024) /* an answer head that gets the cookie */
#define PIPE_SZ (256 * 1024)  /* answers: pipe per connection */
#define LINGER_MS 2000        /* after our own answer: wait this long for the client's EOF */
#define CONNECT_MS 10000

enum pc_state { S_HEAD, S_RESUME, S_CONNECTING, S_OPEN, S_CLOSING };
enum body_state { B_HEAD, B_BODY, B_CHUNK_LINE, B_CHUNK_DATA, B_CHUNK_CRLF, B_TRAILER, B_RAW };

struct ev {
        int kind; /* 0 listener, 1 wake, 2 client, 3 upstream */
        void *obj;
};

struct expo {
        char tenant[64], sandbox[64];
        uint16_t port; /* 0 = every port */
        int pub, auto_resume;
        uint32_t addr; /* host order */
        uint8_t hash[COVE_PORTS_TOKEN_HASH];
        uint64_t gen; /* a new one each expose: connections bound to another end */
};

struct done_note {
        char sandbox[64];
        char why[160];
};

struct pc {
        struct ev cev, uev;
        int cfd, ufd;
        enum pc_state st;
        enum body_state bst;
        char ip[INET_ADDRSTRLEN];
        /* the route this connection is bound to (its upstream), when bound */
        int bound;
        char tenant[64], sandbox[64];
        uint16_t port;
        int pub;
        uint64_t egen; /* the exposure's gen when bound */
        int e2b;       /* answers in E2B's error shape */
        char node[64]; /* relay: the node the upstream goes to */
        /* client → sandbox */
        uint8_t *in;
        size_t ioff, ilen, icap;
        int pending; /* counted in npending (not yet connected into a sandbox) */
        uint8_t *out;
        size_t ooff, olen;
        uint64_t left;
        char line[128];
        size_t llen;
        int c_eof, u_shut;
        /* sandbox → client */
        int pp[2];
        size_t inpipe;
        int u_eof, c_shut;
        int cookie; /* the next answer head gets the token cookie */
        char cookie_path[96];
        char cookie_tok[COVE_PORTS_TOKEN_MAX + 1];
        struct cove_bytes uhead; /* answer head being read (cookie) */
        struct cove_bytes toc;   /* our own bytes for the client (answer, rewritten head) */
        uint32_t cmask, umask;
        int64_t head_at;      /* first byte of the head being read (0: none yet) */
        int64_t active;       /* last byte either way */
        int64_t deadline;     /* CONNECTING, RESUME, CLOSING */
        int64_t resume_until; /* a relayed head routed again: RESUME's deadline so far */
        int64_t opened_at;
        uint64_t nin, nout;
        int dead;
        struct pc *next, *prev;
};

struct cove_ports {
        struct cove_ports_config cfg;
        char domain[254];
        char bound_addr[64];
        int lfd, epfd, wake_fd, host_ns;
        struct ev ev_l, ev_w;
        pthread_t thread;
        int started, quit;
        pthread_mutex_t mu; /* expos, notes, stats, epoch */
        struct expo *expos;
        int nexpo, capexpo;
        uint64_t epoch, seen_epoch, gen;
        struct done_note notes[64];
        int nnotes;
        struct pc *conns, *dead;
        int npending;
        struct cove_ports_stats st;
        uint8_t scratch[COVE_PORTS_HEAD_MAX + 1];
};

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void stat_add(struct cove_ports *p, uint64_t *f, uint64_t v)
{
        __atomic_fetch_add(f, v, __ATOMIC_RELAXED);
        (void)p;
}

static void audit(struct cove_ports *p, const struct pc *c, const char *tenant, const char *sandbox,
                  uint16_t port, const char *action, const char *verdict, const char *reason)
{
        /* a refusal that names no known sandbox (no route, junk, a slow first head) is
         * counted, not audited: anyone who can reach the listener could fill the log */
        if (!p->cfg.audit || !sandbox || !*sandbox)
                return;
        json_t *d = json_pack("{s:i, s:s}", "port", (int)port, "client", c->ip);
        if (reason)
                json_object_set_new(d, "reason", json_string(reason));
        if (!strcmp(action, "close")) {
                json_object_set_new(d, "bytes_in", json_integer((json_int_t)c->nin));
                json_object_set_new(d, "bytes_out", json_integer((json_int_t)c->nout));
                json_object_set_new(d, "ms", json_integer(now_ms() - c->opened_at));
        }
        p->cfg.audit(p->cfg.arg, tenant ? tenant : "", sandbox ? sandbox : "", action, verdict, d);
}

static void ep(struct cove_ports *p, int op, int fd, uint32_t events, struct ev *e)
{
        struct epoll_event x = {.events = events, .data.ptr = e};
        epoll_ctl(p->epfd, op, fd, &x);
}

static void set_mask(struct cove_ports *p, int fd, struct ev *e, uint32_t *have, uint32_t want)
{
        if (fd >= 0 && *have != want) {
                ep(p, EPOLL_CTL_MOD, fd, want, e);
                *have = want;
        }
}

static void pipe_close(int pp[2])
{
        if (pp[0] >= 0) {
                close(pp[0]);
                close(pp[1]);
        }
        pp[0] = pp[1] = -1;
}

/* The upstream connection ends (the client's may go on to another route). */
static void up_close(struct cove_ports *p, struct pc *c, const char *reason)
{
        if (c->ufd >= 0) {
                epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->ufd, NULL);
                close(c->ufd);
                c->ufd = -1;
        }
        c->umask = 0;
        if (c->bound) {
                audit(p, c, c->tenant, c->sandbox, c->port, "close", "", reason);
                stat_add(p, &p->st.closed, 1);
        }
        c->bound = 0;
        c->u_eof = c->u_shut = 0;
        c->inpipe = 0;
        pipe_close(c->pp);
        c->cookie = 0;
        cove_bytes_free(&c->uhead);
}

static void pc_free(struct cove_ports *p, struct pc *c, const char *reason)
{
        if (c->dead)
                return;
        up_close(p, c, reason);
        if (c->pending)
                p->npending--;
        c->pending = 0;
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->cfd, NULL);
        close(c->cfd);
        free(c->in);
        free(c->out);
        c->in = c->out = NULL;
        cove_bytes_free(&c->toc);
        if (c->prev)
                c->prev->next = c->next;
        else
                p->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        c->dead = 1;
        c->next = p->dead;
        p->dead = c;
        __atomic_fetch_sub(&p->st.open_now, 1, __ATOMIC_RELAXED);
}

static void reap(struct cove_ports *p)
{
        while (p->dead) {
                struct pc *c = p->dead;
                p->dead = c->next;
                free(c);
        }
}

static const char *reason_phrase(int st)
{
        switch (st) {
        case 400:
                return "Bad Request";
        case 401:
                return "Unauthorized";
        case 403:
                return "Forbidden";
        case 404:
                return "Not Found";
        case 405:
                return "Method Not Allowed";
        case 408:
                return "Request Timeout";
        case 429:
                return "Too Many Requests";
        case 431:
                return "Request Header Fields Too Large";
        case 501:
                return "Not Implemented";
        case 502:
                return "Bad Gateway";
        case 503:
                return "Service Unavailable";
        case 504:
                return "Gateway Timeout";
        default:
                return "Error";
        }
}

static const char *code_of(int st)
{
        switch (st) {
        case 400:
        case 405:
        case 431:
        case 501:
                return "bad_request";
        case 401:
                return "unauthorized";
        case 403:
                return "forbidden";
        case 404:
                return "not_found";
        case 408:
                return "timeout";
        case 429:
                return "limit";
        case 503:
                return "sandbox_paused";
        default:
                return "unavailable";
        }
}

/* Answer the client ourselves and close (the upstream, if any, goes first). Audited as a
 * refusal when sandbox is known. */
static void refuse(struct cove_ports *p, struct pc *c, int status, const char *why,
                   const char *tenant, const char *sandbox, uint16_t port)
{
        audit(p, c, tenant, sandbox, port, "refuse", "deny", why);
        stat_add(p, &p->st.refused, 1);
        if (c->ufd >= 0)
                up_close(p, c, "the client's next request was refused");
        json_t *b =
            c->e2b ? json_pack("{s:i, s:s}", "code", status, "message", why)
                   : json_pack("{s:{s:s, s:s}}", "error", "code", code_of(status), "message", why);
        if (c->e2b && sandbox && *sandbox) {
                json_object_set_new(b, "sandboxId", json_string(sandbox));
                json_object_set_new(b, "port", json_integer(port));
        }
        char *body = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        char head[256];
        int hn = snprintf(head, sizeof(head),
                          "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\nConnection: close\r\nCache-Control: no-store\r\n"
                          "%s\r\n",
                          status, reason_phrase(status), body ? strlen(body) + 1 : 0,
                          status == 503 ? "Retry-After: 5\r\n" : "");
        c->toc.len = 0;
        cove_bytes_add(&c->toc, head, (size_t)hn);
        if (body) {
                cove_bytes_add(&c->toc, body, strlen(body));
                cove_bytes_add(&c->toc, "\n", 1);
        }
        free(body);
        c->st = S_CLOSING;
        c->deadline = now_ms() + LINGER_MS;
        c->ilen = c->ioff = 0;
}

/* ---- exposures (under mu) ---- */

static struct expo *expo_find(struct cove_ports *p, const char *sandbox, uint16_t port)
{
        struct expo *any = NULL;
        for (int i = 0; i < p->nexpo; i++) {
                struct expo *e = &p->expos[i];
                if (strcmp(e->sandbox, sandbox) != 0)
                        continue;
                if (e->port == port)
                        return e;
                if (e->port == 0)
                        any = e;
        }
        return any;
}

int cove_ports_expose(struct cove_ports *p, const char *tenant, const char *sandbox, uint16_t port,
                      int public_, int auto_resume, uint32_t addr,
                      const uint8_t hash[COVE_PORTS_TOKEN_HASH], struct cove_err *err)
{
        pthread_mutex_lock(&p->mu);
        struct expo *e = NULL;
        for (int i = 0; i < p->nexpo; i++)
                if (!strcmp(p->expos[i].sandbox, sandbox) && p->expos[i].port == port)
                        e = &p->expos[i];
        if (e && !strcmp(e->tenant, tenant) && e->pub == public_ && e->auto_resume == auto_resume &&
            e->addr == addr &&
            (public_ || (hash && !memcmp(e->hash, hash, COVE_PORTS_TOKEN_HASH)))) {
                pthread_mutex_unlock(&p->mu); /* the same again: its connections stay */
                return 0;
        }
        if (!e) {
                if (p->nexpo == p->capexpo) {
                        int nc = p->capexpo ? p->capexpo * 2 : 64;
                        struct expo *n = realloc(p->expos, (size_t)nc * sizeof(*n));
                        if (!n) {
                                pthread_mutex_unlock(&p->mu);
                                return cove_err_set(err, ENOMEM, "ports");
                        }
                        p->expos = n;
                        p->capexpo = nc;
                }
                e = &p->expos[p->nexpo++];
        }
        memset(e, 0, sizeof(*e));
        snprintf(e->tenant, sizeof(e->tenant), "%s", tenant);
        snprintf(e->sandbox, sizeof(e->sandbox), "%s", sandbox);
        e->port = port;
        e->pub = public_;
        e->auto_resume = auto_resume;
        e->addr = addr;
        if (hash)
                memcpy(e->hash, hash, COVE_PORTS_TOKEN_HASH);
        e->gen = ++p->gen;
        p->epoch++; /* a replaced token ends connections made with the old one */
        pthread_mutex_unlock(&p->mu);
        uint64_t one = 1;
        ssize_t w = write(p->wake_fd, &one, sizeof(one));
        (void)w;
        return 0;
}

int cove_ports_has(struct cove_ports *p, const char *sandbox, uint16_t port)
{
        pthread_mutex_lock(&p->mu);
        int has = 0;
        for (int i = 0; i < p->nexpo; i++)
                has |= !strcmp(p->expos[i].sandbox, sandbox) && p->expos[i].port == port;
        pthread_mutex_unlock(&p->mu);
        return has;
}

static int kept(uint16_t port, const uint16_t *keep, int n)
{
        for (int i = 0; i < n; i++)
                if (keep[i] == port)
                        return 1;
        return 0;
}

static void unexpose_where(struct cove_ports *p, const char *sandbox, int port,
                           const uint16_t *keep, int nkeep)
{
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->nexpo;) {
                struct expo *e = &p->expos[i];
                if (!strcmp(e->sandbox, sandbox) && (port < 0 || e->port == port) &&
                    !(keep && kept(e->port, keep, nkeep)))
                        p->expos[i] = p->expos[--p->nexpo];
                else
                        i++;
        }
        p->epoch++;
        pthread_mutex_unlock(&p->mu);
        uint64_t one = 1;
        ssize_t w = write(p->wake_fd, &one, sizeof(one));
        (void)w;
}

void cove_ports_unexpose(struct cove_ports *p, const char *sandbox, int port)
{
        unexpose_where(p, sandbox, port, NULL, 0);
}

void cove_ports_unexpose_others(struct cove_ports *p, const char *sandbox, const uint16_t *keep,
                                int n)
{
        unexpose_where(p, sandbox, -1, keep, n);
}

void cove_ports_kick(struct cove_ports *p)
{
        pthread_mutex_lock(&p->mu);
        p->epoch++;
        pthread_mutex_unlock(&p->mu);
        uint64_t one = 1;
        ssize_t w = write(p->wake_fd, &one, sizeof(one));
        (void)w;
}

/* ---- the upstream ---- */

/* A socket created inside the network namespace of pid (this thread enters it for the
 * socket() call only). */
static int sock_in_ns(struct cove_ports *p, pid_t pid)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
        int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0)
                return -1;
        if (setns(ns, CLONE_NEWNET) < 0) {
                close(ns);
                return -1;
        }
        close(ns);
        int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int e = errno;
        if (setns(p->host_ns, CLONE_NEWNET) < 0)
                cove_error(p->cfg.log, "ports", "cannot return to the node's netns: %s",
                           strerror(errno));
        errno = e;
        return s;
}

static void count_sandbox(struct cove_ports *p, const char *sandbox, int *n)
{
        *n = 0;
        for (struct pc *c = p->conns; c; c = c->next)
                if (c->bound && !strcmp(c->sandbox, sandbox))
                        (*n)++;
}

/* c waits for sandbox to resume (auto_resume): the first waiter asks for the resume, every
 * waiter is routed again when it is done (recheck) or refused at the deadline (tick). */
static void wait_resume(struct cove_ports *p, struct pc *c, const char *tenant, const char *sandbox)
{
        int waiting = 0;
        for (struct pc *o = p->conns; o; o = o->next)
                if (o != c && o->st == S_RESUME && !strcmp(o->sandbox, sandbox))
                        waiting = 1;
        c->st = S_RESUME;
        c->deadline = c->resume_until ? c->resume_until : now_ms() + p->cfg.resume_ms;
        if (!waiting && p->cfg.resume)
                p->cfg.resume(p->cfg.arg, tenant, sandbox);
}

/* Connect c (its head names route sandbox:port, already authorized) to the sandbox. */
static void up_open(struct cove_ports *p, struct pc *c, const struct expo *e)
{
        struct cove_ports_where w;
        memset(&w, 0, sizeof(w));
        p->cfg.locate(p->cfg.arg, e->sandbox, &w);
        if (w.state == COVE_PORTS_GONE) {
                refuse(p, c, 502, w.why[0] ? w.why : "the sandbox is not running", e->tenant,
                       e->sandbox, c->port);
                return;
        }
        if (w.state == COVE_PORTS_PAUSED) {
                char why[300];
                int st = cove_ports_judge(e->sandbox, c->port, 1, 1, e->auto_resume, NULL, NULL, 1,
                                          why, sizeof(why));
                if (st) {
                        refuse(p, c, st, why, e->tenant, e->sandbox, c->port);
                        return;
                }
                wait_resume(p, c, e->tenant, e->sandbox);
                return;
        }
        int s = sock_in_ns(p, w.pid);
        /* the instance must still be the one located (a pid is not a sandbox for long) */
        struct cove_ports_where w2;
        memset(&w2, 0, sizeof(w2));
        if (s >= 0)
                p->cfg.locate(p->cfg.arg, e->sandbox, &w2);
        if (s < 0 || w2.state != COVE_PORTS_RUNNING || w2.pid != w.pid) {
                if (s >= 0)
                        close(s);
                refuse(p, c, 502, "the sandbox's network namespace could not be entered", e->tenant,
                       e->sandbox, c->port);
                return;
        }
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct sockaddr_in a = {
            .sin_family = AF_INET, .sin_port = htons(c->port), .sin_addr.s_addr = htonl(e->addr)};
        if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS) {
                close(s);
                char why[200];
                snprintf(why, sizeof(why), "nothing listens on port %u in sandbox %s",
                         (unsigned)c->port, e->sandbox);
                refuse(p, c, 502, why, e->tenant, e->sandbox, c->port);
                return;
        }
        c->ufd = s;
        c->uev = (struct ev){3, c};
        c->umask = EPOLLOUT;
        ep(p, EPOLL_CTL_ADD, s, EPOLLOUT, &c->uev);
        c->st = S_CONNECTING;
        c->deadline = now_ms() + CONNECT_MS;
}

/* Relay: connect c to the port listener of the node hop names (its head was routed). */
static void relay_open(struct cove_ports *p, struct pc *c, const struct cove_ports_hop *hop)
{
        int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons(hop->port),
                                .sin_addr.s_addr = htonl(hop->addr)};
        if (s >= 0) {
                int one = 1;
                setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        if (s < 0 || (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS)) {
                if (s >= 0)
                        close(s);
                char why[200];
                snprintf(why, sizeof(why), "node %s, which runs sandbox %s, is unreachable",
                         hop->node, c->sandbox);
                refuse(p, c, 502, why, NULL, NULL, c->port);
                return;
        }
        c->ufd = s;
        c->uev = (struct ev){3, c};
        c->umask = EPOLLOUT;
        ep(p, EPOLL_CTL_ADD, s, EPOLLOUT, &c->uev);
        c->st = S_CONNECTING;
        c->deadline = now_ms() + CONNECT_MS;
}

/* ---- heads ---- */

int cove_ports_token_matches(const uint8_t hash[COVE_PORTS_TOKEN_HASH], const char *tok)
{
        uint8_t h[32];
        unsigned hl = 0;
        if (!EVP_Digest(tok, strlen(tok), h, &hl, EVP_sha256(), NULL) || hl != 32)
                return 0;
        return CRYPTO_memcmp(h, hash, 32) == 0;
}

int cove_ports_judge(const char *sandbox, uint16_t port, int found, int public_, int auto_resume,
                     const uint8_t *hash, const char *token, int paused, char *why, size_t cap)
{
        if (!found) {
                snprintf(why, cap, "port %u of sandbox %s is not exposed", (unsigned)port, sandbox);
                return 404;
        }
        if (!public_ && !token) {
                snprintf(why, cap,
                         "this port is private: send its token (X-Cove-Port-Token header, or "
                         "?cove_token= once)");
                return 401;
        }
        if (!public_ && (!hash || !cove_ports_token_matches(hash, token))) {
                snprintf(why, cap, "wrong token for this port");
                return 403;
        }
        if (paused && !auto_resume) {
                snprintf(why, cap,
                         "sandbox %s is paused: resume it (POST /v1/sandboxes/%s/resume), or "
                         "expose the port with auto_resume",
                         sandbox, sandbox);
                return 503;
        }
        return 0;
}

/* The complete head at c->in[ioff..ioff+hl): 1 handled (forwarded or refused), 0 wait (it
 * stays until the upstream is ready). */
static int on_head(struct cove_ports *p, struct pc *c, size_t hl)
{
        memcpy(p->scratch, c->in + c->ioff, hl);
        p->scratch[hl] = '\0';
        const char *head = (const char *)p->scratch;
        struct cove_ports_req rq;
        const char *why = NULL;
        int st = cove_ports_parse(head, hl, p->domain[0] ? p->domain : NULL, &rq, &why);
        c->e2b = rq.mode == COVE_PORTS_E2B;
        if (st) {
                refuse(p, c, st, why, c->bound ? c->tenant : NULL, c->bound ? c->sandbox : NULL,
                       c->port);
                return 1;
        }
        if (rq.mode == COVE_PORTS_NONE) {
                refuse(p, c, 404,
                       p->domain[0] ? "no route: want Host {port}-{id}.<domain> or /p/{id}/{port}/"
                                    : "no route: want /p/{id}/{port}/",
                       NULL, NULL, 0);
                return 1;
        }
        if (p->cfg.relay_verify) {
                /* a node's listener: only what a control replica relays, for the client it
                 * names */
                char proof[320], ip[INET_ADDRSTRLEN];
                struct in_addr ia;
                if (cove_ports_req_header(head, &rq, "X-Cove-Relay", proof, sizeof(proof)) != 1 ||
                    cove_ports_req_header(head, &rq, "X-Cove-Client", ip, sizeof(ip)) != 1 ||
                    inet_pton(AF_INET, ip, &ia) != 1 ||
                    p->cfg.relay_verify(p->cfg.arg, rq.sandbox, rq.port, proof, ip) < 0) {
                        refuse(p, c, 403,
                               "this node's port listener answers control replicas only: use "
                               "the preview address of a control replica",
                               NULL, NULL, rq.port);
                        return 1;
                }
                snprintf(c->ip, sizeof(c->ip), "%s", ip);
        }
        int same = c->bound && !strcmp(c->sandbox, rq.sandbox) && c->port == rq.port;
        if (same && c->st == S_OPEN)
                goto forward;
        if (c->st == S_CONNECTING || c->st == S_RESUME)
                return 0;
        if (p->cfg.relay) {
                struct cove_ports_hop hop;
                memset(&hop, 0, sizeof(hop));
                if (p->cfg.relay(p->cfg.arg, rq.sandbox, rq.port,
                                 rq.tsrc == COVE_PORTS_TOK_NONE ? NULL : rq.token, &hop) < 0) {
                        refuse(p, c, hop.status ? hop.status : 502,
                               hop.why[0] ? hop.why : "the sandbox is not placed on a node", NULL,
                               NULL, rq.port);
                        return 1;
                }
                int n;
                count_sandbox(p, rq.sandbox, &n);
                if (n - (c->bound && !strcmp(c->sandbox, rq.sandbox)) >= p->cfg.max_conns) {
                        refuse(p, c, 429, "too many open connections to this sandbox", NULL, NULL,
                               rq.port);
                        return 1;
                }
                if (c->ufd >= 0) {
                        if (c->inpipe || c->toc.len || c->uhead.len)
                                return 0;
                        up_close(p, c, "the client moved to another port");
                }
                c->tenant[0] = '\0';
                snprintf(c->sandbox, sizeof(c->sandbox), "%s", rq.sandbox);
                snprintf(c->node, sizeof(c->node), "%s", hop.node);
                c->port = rq.port;
                if (hop.paused) { /* the head stays until the sandbox is resumed */
                        wait_resume(p, c, hop.tenant, rq.sandbox);
                        return 0;
                }
                relay_open(p, c, &hop);
                return c->st == S_CLOSING ? 1 : 0;
        }
        pthread_mutex_lock(&p->mu);
        struct expo *ep_ = expo_find(p, rq.sandbox, rq.port);
        struct expo e;
        if (ep_)
                e = *ep_;
        pthread_mutex_unlock(&p->mu);
        if (!ep_ && p->cfg.reload) {
                /* it may have come to this node since its exposures were loaded */
                p->cfg.reload(p->cfg.arg, rq.sandbox);
                pthread_mutex_lock(&p->mu);
                ep_ = expo_find(p, rq.sandbox, rq.port);
                if (ep_)
                        e = *ep_;
                pthread_mutex_unlock(&p->mu);
        }
        char no[300];
        int verdict =
            cove_ports_judge(rq.sandbox, rq.port, ep_ != NULL, ep_ && e.pub, 0, ep_ ? e.hash : NULL,
                             rq.tsrc == COVE_PORTS_TOK_NONE ? NULL : rq.token, 0, no, sizeof(no));
        if (verdict && !ep_) {
                char tn[64] = "";
                if (p->cfg.tenant_of)
                        p->cfg.tenant_of(p->cfg.arg, rq.sandbox, tn, sizeof(tn));
                refuse(p, c, verdict, no, tn, tn[0] ? rq.sandbox : NULL, rq.port);
                return 1;
        }
        if (verdict) {
                refuse(p, c, verdict, no, e.tenant, e.sandbox, rq.port);
                return 1;
        }
        int n;
        count_sandbox(p, e.sandbox, &n);
        if (n - (c->bound && !strcmp(c->sandbox, e.sandbox)) >= p->cfg.max_conns) {
                refuse(p, c, 429, "too many open connections to this sandbox", e.tenant, e.sandbox,
                       rq.port);
                return 1;
        }
        if (c->ufd >= 0) {
                /* another route on a kept-alive connection: the previous answer must be
                 * through (clients that do not pipeline have read it already) */
                if (c->inpipe || c->toc.len || c->uhead.len)
                        return 0;
                up_close(p, c, "the client moved to another port");
        }
        snprintf(c->tenant, sizeof(c->tenant), "%s", e.tenant);
        snprintf(c->sandbox, sizeof(c->sandbox), "%s", e.sandbox);
        c->port = rq.port;
        c->pub = e.pub;
        c->egen = e.gen;
        up_open(p, c, &e);
        return c->st == S_CLOSING ? 1 : 0;
forward:;
        if (!c->out && !(c->out = malloc(OUT_CAP))) {
                refuse(p, c, 503, "out of memory", c->tenant, c->sandbox, c->port);
                return 1;
        }
        if (c->olen + c->ooff + hl + 1024 > OUT_CAP)
                return 0; /* room first */
        struct cove_bytes o = {0};
        int bad;
        if (p->cfg.relay) {
                char extra[768];
                bad = p->cfg.relay_sign(p->cfg.arg, c->node, rq.sandbox, rq.port, c->ip, extra,
                                        sizeof(extra)) < 0 ||
                      cove_ports_relay_head(head, &rq, extra, &o) < 0;
        } else {
                bad = cove_ports_rewrite(head, &rq, c->ip, &o) < 0;
        }
        if (bad || c->ooff + c->olen + o.len > OUT_CAP) {
                cove_bytes_free(&o);
                refuse(p, c, 431, "request head too large once rewritten", c->tenant, c->sandbox,
                       c->port);
                return 1;
        }
        memcpy(c->out + c->ooff + c->olen, o.b, o.len);
        c->olen += o.len;
        cove_bytes_free(&o);
        c->ioff += hl;
        c->ilen -= hl;
        c->head_at = 0;
        if (rq.tsrc == COVE_PORTS_TOK_QUERY && !c->pub && !p->cfg.relay) {
                c->cookie = 1;
                snprintf(c->cookie_tok, sizeof(c->cookie_tok), "%s", rq.token);
                if (rq.mode == COVE_PORTS_PATH)
                        snprintf(c->cookie_path, sizeof(c->cookie_path), "/p/%s/%u/", rq.sandbox,
                                 (unsigned)rq.port);
                else
                        snprintf(c->cookie_path, sizeof(c->cookie_path), "/");
        }
        if (rq.upgrade)
                c->bst = B_RAW;
        else if (rq.chunked) {
                c->bst = B_CHUNK_LINE;
                c->llen = 0;
        } else if (rq.clen > 0) {
                c->bst = B_BODY;
                c->left = (uint64_t)rq.clen;
        } else
                c->bst = B_HEAD;
        return 1;
}

/* Move body bytes from in to out, following the framing: returns bytes moved, -1 malformed. */
static long body_move(struct pc *c)
{
        size_t room = OUT_CAP - c->ooff - c->olen;
        uint8_t *src = c->in + c->ioff;
        size_t n = c->ilen, used = 0;
        uint8_t *dst = c->out + c->ooff + c->olen;
        while (used < n && used < room && c->bst != B_HEAD) {
                size_t avail = n - used;
                if (avail > room - used)
                        avail = room - used;
                if (c->bst == B_RAW) {
                        memcpy(dst + used, src + used, avail);
                        used += avail;
                        break;
                }
                if (c->bst == B_BODY || c->bst == B_CHUNK_DATA) {
                        size_t k = avail < c->left ? avail : (size_t)c->left;
                        memcpy(dst + used, src + used, k);
                        used += k;
                        c->left -= k;
                        if (!c->left)
                                c->bst = c->bst == B_BODY ? B_HEAD : B_CHUNK_CRLF;
                        if (c->bst == B_CHUNK_CRLF)
                                c->llen = 0;
                        continue;
                }
                /* line-based states, a byte at a time */
                uint8_t ch = src[used];
                dst[used++] = ch;
                if (c->llen >= sizeof(c->line) - 1)
                        return -1;
                c->line[c->llen++] = (char)ch;
                if (ch != '\n')
                        continue;
                c->line[c->llen] = '\0';
                size_t ll = c->llen;
                c->llen = 0;
                if (ll < 2 || c->line[ll - 2] != '\r')
                        return -1;
                if (c->bst == B_CHUNK_CRLF) {
                        if (ll != 2)
                                return -1;
                        c->bst = B_CHUNK_LINE;
                } else if (c->bst == B_CHUNK_LINE) {
                        uint64_t v = 0;
                        size_t i = 0;
                        for (; i < ll - 2; i++) {
                                char h = c->line[i];
                                int d = h >= '0' && h <= '9'   ? h - '0'
                                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                               : -1;
                                if (d < 0)
                                        break;
                                if (v >> 56)
                                        return -1;
                                v = v * 16 + (uint64_t)d;
                        }
                        if (!i || (i < ll - 2 && c->line[i] != ';'))
                                return -1;
                        if (v == 0)
                                c->bst = B_TRAILER;
                        else {
                                c->left = v;
                                c->bst = B_CHUNK_DATA;
                        }
                } else if (c->bst == B_TRAILER) {
                        if (ll == 2)
                                c->bst = B_HEAD;
                }
        }
        c->ioff += used;
        c->ilen -= used;
        c->olen += used;
        return (long)used;
}

/* Handle what the client sent, as far as the upstream lets. */
static void c2u(struct cove_ports *p, struct pc *c)
{
        for (int guard = 0; guard < 64 && c->st != S_CLOSING && !c->dead; guard++) {
                if (!c->ilen) {
                        c->ioff = 0;
                        return;
                }
                if (c->bst == B_HEAD) {
                        if (!c->head_at)
                                c->head_at = now_ms();
                        size_t hl = cove_ports_head_len(c->in + c->ioff, c->ilen);
                        if (!hl) {
                                if (c->ilen >= COVE_PORTS_HEAD_MAX)
                                        refuse(p, c, 431, "request head over 32 KiB",
                                               c->bound ? c->tenant : NULL,
                                               c->bound ? c->sandbox : NULL, c->port);
                                else if (c->ioff) { /* keep the partial head at the start */
                                        memmove(c->in, c->in + c->ioff, c->ilen);
                                        c->ioff = 0;
                                }
                                return;
                        }
                        if (!on_head(p, c, hl))
                                return;
                        continue;
                }
                if (c->st != S_OPEN)
                        return;
                long m = body_move(c);
                if (m < 0) {
                        refuse(p, c, 400, "malformed chunked request body", c->tenant, c->sandbox,
                               c->port);
                        return;
                }
                if (m == 0)
                        return;
        }
}

static int blocked(int e)
{
        return e == EAGAIN || e == EWOULDBLOCK || e == EINTR;
}

/* The answer head that gets the token cookie: after its status line. */
static int cookie_head(struct cove_ports *p, struct pc *c)
{
        (void)p;
        size_t hl = cove_ports_head_len(c->uhead.b, c->uhead.len);
        if (!hl) {
                if (c->uhead.len >= UHEAD_MAX || c->u_eof) { /* give up: pass it as it is */
                        cove_bytes_add(&c->toc, c->uhead.b, c->uhead.len);
                        c->uhead.len = 0;
                        c->cookie = 0;
                }
                return 0;
        }
        uint8_t *nl = memchr(c->uhead.b, '\n', hl);
        int interim = hl > 12 && c->uhead.b[9] == '1' && memcmp(c->uhead.b + 9, "101", 3) != 0;
        if (!interim) {
                char sc[400];
                int n = snprintf(sc, sizeof(sc),
                                 "Set-Cookie: " COVE_PORTS_COOKIE
                                 "=%s; Path=%s; HttpOnly; SameSite=Lax\r\n",
                                 c->cookie_tok, c->cookie_path);
                size_t first = (size_t)(nl - c->uhead.b) + 1;
                cove_bytes_add(&c->toc, c->uhead.b, first);
                cove_bytes_add(&c->toc, sc, (size_t)n);
                cove_bytes_add(&c->toc, c->uhead.b + first, c->uhead.len - first);
                c->cookie = 0;
                OPENSSL_cleanse(c->cookie_tok, sizeof(c->cookie_tok));
        } else {
                cove_bytes_add(&c->toc, c->uhead.b, hl);
                cove_bytes_add(&c->toc, c->uhead.b + hl, c->uhead.len - hl);
        }
        c->uhead.len = 0;
        return 1;
}

static void update(struct cove_ports *p, struct pc *c)
{
        uint32_t cm = 0, um = 0;
        if (c->st == S_CLOSING) {
                cm = EPOLLIN | (c->toc.len ? EPOLLOUT : 0);
        } else {
                if (!c->c_eof && c->ilen + c->ioff < IN_CAP)
                        cm |= EPOLLIN;
                if (c->inpipe || c->toc.len)
                        cm |= EPOLLOUT;
                if (c->st == S_CONNECTING)
                        um = EPOLLOUT;
                else if (c->st == S_OPEN && c->ufd >= 0) {
                        if (!c->u_eof && c->inpipe < PIPE_SZ && !c->toc.len)
                                um |= EPOLLIN;
                        if (c->olen)
                                um |= EPOLLOUT;
                }
        }
        set_mask(p, c->cfd, &c->cev, &c->cmask, cm);
        set_mask(p, c->ufd, &c->uev, &c->umask, um);
}

/* Move bytes every way that can move now; ends the connection when it is done. */
static void pump(struct cove_ports *p, struct pc *c)
{
        int64_t t = now_ms();
        for (int round = 0; round < 16 && !c->dead; round++) {
                int moved = 0;
                /* client → in */
                if (c->st != S_CLOSING && !c->c_eof && c->ilen + c->ioff < IN_CAP) {
                        if (c->ioff && !c->ilen)
                                c->ioff = 0;
                        if (c->ioff + c->ilen >= c->icap) { /* grow (a head is bounded) */
                                size_t nc = c->icap ? c->icap * 2 : IN_MIN;
                                uint8_t *nb = realloc(c->in, nc > IN_CAP ? IN_CAP : nc);
                                if (!nb) {
                                        pc_free(p, c, "out of memory");
                                        return;
                                }
                                c->in = nb;
                                c->icap = nc > IN_CAP ? IN_CAP : nc;
                        }
                        ssize_t n = recv(c->cfd, c->in + c->ioff + c->ilen,
                                         c->icap - c->ioff - c->ilen, MSG_DONTWAIT);
                        if (n > 0) {
                                c->ilen += (size_t)n;
                                c->nin += (uint64_t)n;
                                stat_add(p, &p->st.bytes_in, (uint64_t)n);
                                c->active = t;
                                moved = 1;
                        } else if (n == 0 || !blocked(errno)) {
                                c->c_eof = 1;
                                moved = 1;
                        }
                } else if (c->st == S_CLOSING) {
                        uint8_t junk[4096];
                        ssize_t n = recv(c->cfd, junk, sizeof(junk), MSG_DONTWAIT);
                        if (n == 0 || (n < 0 && !blocked(errno))) {
                                if (!c->toc.len || n < 0) {
                                        pc_free(p, c, NULL);
                                        return;
                                }
                                c->c_eof = 1;
                        }
                }
                if (c->ilen && c->st != S_CLOSING) {
                        size_t before = c->ilen;
                        enum pc_state sb = c->st;
                        c2u(p, c);
                        if (c->dead)
                                return;
                        if (c->ilen != before || c->st != sb)
                                moved = 1;
                }
                /* out → upstream */
                if (c->st == S_OPEN && c->ufd >= 0 && c->olen) {
                        ssize_t n =
                            send(c->ufd, c->out + c->ooff, c->olen, MSG_DONTWAIT | MSG_NOSIGNAL);
                        if (n > 0) {
                                c->ooff += (size_t)n;
                                c->olen -= (size_t)n;
                                if (!c->olen)
                                        c->ooff = 0;
                                else if (c->ooff > OUT_CAP / 2) {
                                        memmove(c->out, c->out + c->ooff, c->olen);
                                        c->ooff = 0;
                                }
                                moved = 1;
                        } else if (n < 0 && !blocked(errno)) {
                                up_close(p, c, "the sandbox's server reset the connection");
                                pc_free(p, c, NULL);
                                return;
                        }
                }
                if (c->st == S_OPEN && c->ufd >= 0 && c->c_eof && !c->ilen && !c->olen &&
                    !c->u_shut) {
                        shutdown(c->ufd, SHUT_WR);
                        c->u_shut = 1;
                }
                /* upstream → pipe (or the cookie head) */
                if (c->st == S_OPEN && c->ufd >= 0 && !c->u_eof && !c->toc.len) {
                        if (c->cookie && !c->inpipe) {
                                uint8_t buf[16384];
                                ssize_t n = recv(c->ufd, buf, sizeof(buf), MSG_DONTWAIT);
                                if (n > 0) {
                                        cove_bytes_add(&c->uhead, buf, (size_t)n);
                                        c->active = t;
                                        moved = 1;
                                } else if (n == 0 || !blocked(errno))
                                        c->u_eof = 1;
                                if (c->uhead.len)
                                        cookie_head(p, c);
                        } else if (c->inpipe < PIPE_SZ) {
                                if (c->pp[0] < 0) {
                                        if (pipe2(c->pp, O_NONBLOCK | O_CLOEXEC) < 0) {
                                                pc_free(p, c, "no pipe");
                                                return;
                                        }
                                        fcntl(c->pp[1], F_SETPIPE_SZ, PIPE_SZ);
                                }
                                ssize_t n =
                                    splice(c->ufd, NULL, c->pp[1], NULL, PIPE_SZ - c->inpipe,
                                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
                                if (n > 0) {
                                        c->inpipe += (size_t)n;
                                        c->active = t;
                                        moved = 1;
                                } else if (n == 0 || !blocked(errno))
                                        c->u_eof = 1;
                        }
                }
                /* pipe, then our bytes → client */
                if (c->inpipe) {
                        ssize_t n = splice(c->pp[0], NULL, c->cfd, NULL, c->inpipe,
                                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
                        if (n > 0) {
                                c->inpipe -= (size_t)n;
                                c->nout += (uint64_t)n;
                                stat_add(p, &p->st.bytes_out, (uint64_t)n);
                                moved = 1;
                        } else if (n < 0 && !blocked(errno)) {
                                pc_free(p, c, "the client went away");
                                return;
                        }
                }
                if (!c->inpipe && c->toc.len) {
                        ssize_t n = send(c->cfd, c->toc.b, c->toc.len, MSG_DONTWAIT | MSG_NOSIGNAL);
                        if (n > 0) {
                                c->nout += (uint64_t)n;
                                cove_bytes_consume(&c->toc, (size_t)n);
                                moved = 1;
                        } else if (n < 0 && !blocked(errno)) {
                                pc_free(p, c, "the client went away");
                                return;
                        }
                }
                if (c->st == S_CLOSING && !c->toc.len) {
                        if (!c->c_shut) {
                                shutdown(c->cfd, SHUT_WR);
                                c->c_shut = 1;
                        }
                        if (c->c_eof) {
                                pc_free(p, c, NULL);
                                return;
                        }
                }
                /* the sandbox closed: the client's side too, once drained */
                if (c->st == S_OPEN && c->u_eof && !c->inpipe && !c->toc.len && !c->c_shut) {
                        shutdown(c->cfd, SHUT_WR);
                        c->c_shut = 1;
                }
                if (c->c_shut && (c->u_shut || c->ufd < 0 || c->st != S_OPEN) && c->c_eof) {
                        pc_free(p, c, NULL);
                        return;
                }
                if (c->st != S_OPEN && c->st != S_CLOSING && c->c_eof && !c->ilen) {
                        pc_free(p, c, NULL);
                        return;
                }
                if (c->c_shut && c->u_shut) {
                        pc_free(p, c, NULL);
                        return;
                }
                if (!moved)
                        break;
        }
        if (!c->dead)
                update(p, c);
}

static void on_up_event(struct cove_ports *p, struct pc *c, uint32_t events)
{
        if (c->st == S_CONNECTING) {
                int e = 0;
                socklen_t el = sizeof(e);
                getsockopt(c->ufd, SOL_SOCKET, SO_ERROR, &e, &el);
                if (e || (events & (EPOLLERR | EPOLLHUP))) {
                        char why[200];
                        if (p->cfg.relay)
                                snprintf(why, sizeof(why),
                                         "node %s, which runs sandbox %s, is unreachable", c->node,
                                         c->sandbox);
                        else
                                snprintf(why, sizeof(why),
                                         "nothing listens on port %u in sandbox %s",
                                         (unsigned)c->port, c->sandbox);
                        char t[64], s[64];
                        snprintf(t, sizeof(t), "%s", c->tenant);
                        snprintf(s, sizeof(s), "%s", c->sandbox);
                        refuse(p, c, 502, why, t, s, c->port);
                        update(p, c);
                        return;
                }
                c->st = S_OPEN;
                c->bound = 1;
                if (c->pending)
                        p->npending--;
                c->pending = 0;
                c->u_eof = c->u_shut = 0;
                c->opened_at = now_ms();
                stat_add(p, &p->st.opened, 1);
                audit(p, c, c->tenant, c->sandbox, c->port, "open", "allow", NULL);
        }
        pump(p, c);
}

static void on_accept(struct cove_ports *p)
{
        for (int k = 0; k < 64; k++) {
                struct sockaddr_in src;
                socklen_t sl = sizeof(src);
                int fd =
                    accept4(p->lfd, (struct sockaddr *)&src, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                        return;
                if (p->npending >= PENDING_MAX) { /* a flood of idle or slow clients */
                        close(fd);
                        stat_add(p, &p->st.refused, 1);
                        continue;
                }
                struct pc *c = calloc(1, sizeof(*c));
                if (!c) {
                        close(fd);
                        continue;
                }
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                c->cfd = fd;
                c->ufd = -1;
                c->pp[0] = c->pp[1] = -1;
                inet_ntop(AF_INET, &src.sin_addr, c->ip, sizeof(c->ip));
                c->cev = (struct ev){2, c};
                c->uev = (struct ev){3, c};
                c->st = S_HEAD;
                c->bst = B_HEAD;
                c->pending = 1;
                p->npending++;
                c->active = c->opened_at = now_ms();
                c->head_at = c->active; /* the first head is due from the accept on */
                c->next = p->conns;
                if (p->conns)
                        p->conns->prev = c;
                p->conns = c;
                __atomic_fetch_add(&p->st.open_now, 1, __ATOMIC_RELAXED);
                c->cmask = EPOLLIN;
                ep(p, EPOLL_CTL_ADD, fd, EPOLLIN, &c->cev);
        }
}

/* Exposures changed, or a sandbox was paused/resumed: recheck every connection. */
static void recheck(struct cove_ports *p)
{
        struct pc *next;
        if (p->cfg.relay) { /* a relay holds no exposures: the node ends what it unexposes */
                for (struct pc *c = p->conns; c; c = next) {
                        next = c->next;
                        if (c->st != S_RESUME || c->dead)
                                continue;
                        /* route its head once more, by the same deadline */
                        c->resume_until = c->deadline;
                        c->st = S_HEAD;
                        pump(p, c);
                        if (!c->dead) {
                                c->resume_until = 0;
                                update(p, c);
                        }
                }
                return;
        }
        for (struct pc *c = p->conns; c; c = next) {
                next = c->next;
                if (c->st == S_RESUME) {
                        pthread_mutex_lock(&p->mu);
                        struct expo *e = expo_find(p, c->sandbox, c->port);
                        struct expo copy;
                        if (e)
                                copy = *e;
                        pthread_mutex_unlock(&p->mu);
                        if (!e) {
                                refuse(p, c, 404, "the port was unexposed", c->tenant, c->sandbox,
                                       c->port);
                                update(p, c);
                                continue;
                        }
                        struct cove_ports_where w;
                        memset(&w, 0, sizeof(w));
                        p->cfg.locate(p->cfg.arg, c->sandbox, &w);
                        if (w.state == COVE_PORTS_RUNNING) {
                                c->st = S_HEAD;
                                up_open(p, c, &copy);
                                update(p, c);
                        } else if (w.state == COVE_PORTS_GONE) {
                                refuse(p, c, 502, w.why[0] ? w.why : "the sandbox is not running",
                                       c->tenant, c->sandbox, c->port);
                                update(p, c);
                        }
                        continue;
                }
                if (!c->bound && c->st != S_CONNECTING)
                        continue;
                pthread_mutex_lock(&p->mu);
                struct expo *e = expo_find(p, c->sandbox, c->port);
                int gone = !e || e->gen != c->egen;
                pthread_mutex_unlock(&p->mu);
                if (gone) {
                        up_close(p, c, "the port was unexposed");
                        pc_free(p, c, NULL);
                }
        }
}

/* Resumes that failed: their waiting connections get 503 with the reason. */
static void notes(struct cove_ports *p)
{
        struct done_note n[64];
        pthread_mutex_lock(&p->mu);
        int k = p->nnotes;
        memcpy(n, p->notes, (size_t)k * sizeof(n[0]));
        p->nnotes = 0;
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < k; i++) {
                struct pc *next;
                for (struct pc *c = p->conns; c; c = next) {
                        next = c->next;
                        if (c->st != S_RESUME || strcmp(c->sandbox, n[i].sandbox) != 0)
                                continue;
                        char why[300];
                        snprintf(why, sizeof(why),
                                 "sandbox %s is paused and could not be resumed: %s", c->sandbox,
                                 n[i].why);
                        refuse(p, c, 503, why, c->tenant, c->sandbox, c->port);
                        update(p, c);
                }
        }
}

void cove_ports_resume_failed(struct cove_ports *p, const char *sandbox, const char *why)
{
        pthread_mutex_lock(&p->mu);
        if (p->nnotes < (int)(sizeof(p->notes) / sizeof(p->notes[0]))) {
                struct done_note *n = &p->notes[p->nnotes++];
                snprintf(n->sandbox, sizeof(n->sandbox), "%s", sandbox);
                snprintf(n->why, sizeof(n->why), "%s", why ? why : "");
        }
        p->epoch++;
        pthread_mutex_unlock(&p->mu);
        uint64_t one = 1;
        ssize_t w = write(p->wake_fd, &one, sizeof(one));
        (void)w;
}

static void tick(struct cove_ports *p, int64_t t)
{
        struct pc *next;
        for (struct pc *c = p->conns; c; c = next) {
                next = c->next;
                if (c->st == S_CLOSING) {
                        if (c->deadline <= t)
                                pc_free(p, c, NULL);
                } else if (c->st == S_CONNECTING && c->deadline <= t) {
                        char s[64], tn[64];
                        snprintf(s, sizeof(s), "%s", c->sandbox);
                        snprintf(tn, sizeof(tn), "%s", c->tenant);
                        up_close(p, c, NULL);
                        refuse(p, c, 504, "the sandbox did not accept the connection in 10 s", tn,
                               s, c->port);
                        update(p, c);
                } else if (c->st == S_RESUME && c->deadline <= t) {
                        refuse(p, c, 504, "the sandbox did not resume in time", c->tenant,
                               c->sandbox, c->port);
                        update(p, c);
                } else if (c->bst == B_HEAD && c->head_at && c->head_at + p->cfg.head_ms <= t &&
                           c->st != S_RESUME && c->st != S_CONNECTING) {
                        if (c->ilen || !c->bound)
                                refuse(p, c, 408, "the request head did not arrive in time",
                                       c->bound ? c->tenant : NULL, c->bound ? c->sandbox : NULL,
                                       c->port);
                        else
                                pc_free(p, c, NULL);
                        if (!c->dead)
                                update(p, c);
                } else if (c->active + p->cfg.idle_ms <= t) {
                        pc_free(p, c, "idle");
                }
        }
}

static void *ports_main(void *arg)
{
        struct cove_ports *p = arg;
        struct epoll_event evs[128];
        int64_t last_tick = now_ms();
        while (!__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
                int n = epoll_wait(p->epfd, evs, 128, 500);
                for (int i = 0; i < n; i++) {
                        struct ev *e = evs[i].data.ptr;
                        if (e->kind == 0) {
                                on_accept(p);
                        } else if (e->kind == 1) {
                                uint64_t v;
                                ssize_t r = read(p->wake_fd, &v, sizeof(v));
                                (void)r;
                        } else {
                                struct pc *c = e->obj;
                                if (c->dead)
                                        continue;
                                if (e->kind == 3)
                                        on_up_event(p, c, evs[i].events);
                                else
                                        pump(p, c);
                        }
                }
                pthread_mutex_lock(&p->mu);
                int changed = p->epoch != p->seen_epoch;
                p->seen_epoch = p->epoch;
                pthread_mutex_unlock(&p->mu);
                if (changed) {
                        notes(p);
                        recheck(p);
                }
                int64_t t = now_ms();
                if (t - last_tick >= 250) {
                        tick(p, t);
                        last_tick = t;
                }
                /* a head that waited for the upstream (or for room) may go on now */
                for (struct pc *c = p->conns, *nx; c; c = nx) {
                        nx = c->next;
                        if (c->st == S_OPEN && c->ilen && c->bst == B_HEAD && !c->olen)
                                pump(p, c);
                }
                reap(p);
        }
        while (p->conns)
                pc_free(p, p->conns, "the node stopped");
        reap(p);
        return NULL;
}

static int listen_on(const char *addr, char *bound, size_t cap, struct cove_err *err)
{
        char host[64];
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t)(colon - addr) >= sizeof(host))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--ports-listen %s: want HOST:PORT", addr);
        memcpy(host, addr, (size_t)(colon - addr));
        host[colon - addr] = '\0';
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)atoi(colon + 1))};
        if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                     "--ports-listen %s: want an IPv4 address", addr);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        if (fd < 0)
                return cove_err_set(err, errno, "ports: socket");
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4096) < 0) {
                int e = errno;
                close(fd);
                return cove_err_set(err, e, "ports: listen on %s", addr);
        }
        socklen_t sl = sizeof(sa);
        getsockname(fd, (struct sockaddr *)&sa, &sl);
        snprintf(bound, cap, "%s:%u", host, (unsigned)ntohs(sa.sin_port));
        return fd;
}

struct cove_ports *cove_ports_new(const struct cove_ports_config *cfg, struct cove_err *err)
{
        struct cove_ports *p = calloc(1, sizeof(*p));
        if (!p) {
                cove_err_set(err, ENOMEM, "ports");
                return NULL;
        }
        p->cfg = *cfg;
        if (p->cfg.max_conns <= 0)
                p->cfg.max_conns = 2048;
        if (p->cfg.idle_ms <= 0)
                p->cfg.idle_ms = 600000;
        if (p->cfg.head_ms <= 0)
                p->cfg.head_ms = 10000;
        if (p->cfg.resume_ms <= 0)
                p->cfg.resume_ms = 120000;
        if (cfg->domain) {
                snprintf(p->domain, sizeof(p->domain), "%s", cfg->domain);
                for (char *q = p->domain; *q; q++)
                        if (*q >= 'A' && *q <= 'Z')
                                *q = (char)(*q - 'A' + 'a');
        }
        p->cfg.domain = NULL;
        p->cfg.listen = NULL;
        pthread_mutex_init(&p->mu, NULL);
        p->lfd = p->epfd = p->wake_fd = p->host_ns = -1;
        p->lfd = listen_on(cfg->listen, p->bound_addr, sizeof(p->bound_addr), err);
        if (p->lfd < 0)
                goto fail;
        p->host_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        p->epfd = epoll_create1(EPOLL_CLOEXEC);
        p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (p->host_ns < 0 || p->epfd < 0 || p->wake_fd < 0) {
                cove_err_set(err, errno, "ports: epoll");
                goto fail;
        }
        p->ev_l = (struct ev){0, NULL};
        p->ev_w = (struct ev){1, NULL};
        ep(p, EPOLL_CTL_ADD, p->lfd, EPOLLIN, &p->ev_l);
        ep(p, EPOLL_CTL_ADD, p->wake_fd, EPOLLIN, &p->ev_w);
        int e = pthread_create(&p->thread, NULL, ports_main, p);
        if (e) {
                cove_err_set(err, e, "ports: thread");
                goto fail;
        }
        p->started = 1;
        return p;
fail:
        cove_ports_free(p);
        return NULL;
}

void cove_ports_free(struct cove_ports *p)
{
        if (!p)
                return;
        if (p->started) {
                __atomic_store_n(&p->quit, 1, __ATOMIC_RELEASE);
                uint64_t one = 1;
                ssize_t w = write(p->wake_fd, &one, sizeof(one));
                (void)w;
                pthread_join(p->thread, NULL);
        }
        if (p->lfd >= 0)
                close(p->lfd);
        if (p->epfd >= 0)
                close(p->epfd);
        if (p->wake_fd >= 0)
                close(p->wake_fd);
        if (p->host_ns >= 0)
                close(p->host_ns);
        OPENSSL_cleanse(p->expos, (size_t)p->capexpo * sizeof(*p->expos));
        free(p->expos);
        pthread_mutex_destroy(&p->mu);
        free(p);
}

const char *cove_ports_bound(const struct cove_ports *p)
{
        return p->bound_addr;
}

void cove_ports_stats(struct cove_ports *p, struct cove_ports_stats *st)
{
        st->opened = __atomic_load_n(&p->st.opened, __ATOMIC_RELAXED);
        st->refused = __atomic_load_n(&p->st.refused, __ATOMIC_RELAXED);
        st->closed = __atomic_load_n(&p->st.closed, __ATOMIC_RELAXED);
        st->open_now = __atomic_load_n(&p->st.open_now, __ATOMIC_RELAXED);
        st->bytes_in = __atomic_load_n(&p->st.bytes_in, __ATOMIC_RELAXED);
        st->bytes_out = __atomic_load_n(&p->st.bytes_out, __ATOMIC_RELAXED);
}
