/* The node's port listener: HTTP/1.1 (keep-alive, chunked bodies, SSE, WebSocket) from
 * the outside to ports a sandbox's owner exposed, on one event thread (epoll,
 * non-blocking, like the egress proxy).
 *   - Each request head is read whole (32 KiB, within head_ms of its first byte: a slow
 *     client holds only its own connection) and routed (net/ports_route.h) to an exposed
 *     (sandbox, port); a private port needs its token (compared as SHA-256 digests in
 *     constant time; each exposure has its own). A token given in the URL gets an HttpOnly
 *     cookie scoped to that host (and route path) in the answer.
 *   - The connection to the sandbox is made from inside its network namespace (the socket
 *     is created there: ns connects to the sandbox's loopback, vm to the guest's address
 *     behind QEMU's tap), so inbound never passes the sandbox's egress link or rules.
 *   - Request heads are rewritten (route prefix and token removed, X-Forwarded-* set),
 *     request bodies copied with their framing followed (so each keep-alive request is
 *     routed and checked); answers are spliced (splice(2)) without being read, except the
 *     head of one that gets the token cookie. After an Upgrade request both directions are
 *     opaque. Nothing buffers a whole body.
 *   - Caps: connections per sandbox, idle time; a paused sandbox answers 503 (or is resumed
 *     first, when its exposure says auto_resume).
 *   - Every open, refusal and close goes to the audit callback. */
#ifndef COVE_NET_PORTS_H
#define COVE_NET_PORTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/err.h"
#include "util/log.h"

#define COVE_PORTS_TOKEN_HASH 32

struct cove_ports;

enum cove_ports_state { COVE_PORTS_RUNNING, COVE_PORTS_PAUSED, COVE_PORTS_GONE };

/* Where a sandbox can be reached now (filled by the locate callback). */
struct cove_ports_where {
        enum cove_ports_state state;
        pid_t pid;     /* running: a process in the sandbox's network namespace */
        char why[160]; /* not running: said to the client */
};

/* Role control (docs/cluster.md "Exposed ports"): where the node that runs a sandbox serves
 * its port listener, filled by the relay callback. */
struct cove_ports_hop {
        uint32_t addr; /* IPv4, host order */
        uint16_t port;
        char node[64]; /* its name (what the proof is signed for) */
        int status;    /* when there is none: the answer (404, 502) */
        char why[160];
        /* 0 with paused set: the sandbox is paused and the port has auto_resume (its token
         * checked by relay()): the listener asks resume(tenant, sandbox), holds the head
         * and routes it once more after cove_ports_kick() */
        int paused;
        char tenant[64];
};

struct cove_ports_config {
        const struct cove_log *log;
        const char *listen; /* "HOST:PORT" */
        const char *domain; /* host routes "{port}-{id}.{domain}"; NULL: none */
        int max_conns;      /* per sandbox (default 2048) */
        int idle_ms;        /* an open connection with no byte either way (default 600 s) */
        int head_ms;        /* a request head, from its first byte (default 10 s) */
        int resume_ms;      /* auto_resume: wait at most this long (default 120 s) */
        /* Called on the ports thread; must not block for long. */
        void (*locate)(void *arg, const char *sandbox, struct cove_ports_where *w);
        /* The tenant of sandbox into out ("" when it does not exist), for auditing a refusal
         * of a port that is not exposed. Called on the ports thread. */
        void (*tenant_of)(void *arg, const char *sandbox, char *out, size_t cap);
        /* auto_resume: start resuming sandbox (in the background) and then call
         * cove_ports_kick(). Called on the ports thread. */
        void (*resume)(void *arg, const char *tenant, const char *sandbox);
        /* kind "port", action "open" / "close" / "refuse"; detail handed over. Must not block. */
        void (*audit)(void *arg, const char *tenant, const char *sandbox, const char *action,
                      const char *verdict, json_t *detail);
        /* Role control: a relay. Each head is routed and checked as above, but no exposure
         * or token is checked here: relay() says where the sandbox's node serves its port
         * listener (0, or -1 with hop->status and why), and the head goes there unchanged
         * but for the lines relay_sign() writes into out ("Name: value\r\n"…, the proof
         * that a control replica sent it and the client's address; 0 or -1). The node then
         * applies every rule itself. token: the one the head carries, NULL when none (for
         * the auto_resume check of a paused sandbox's port, see hop). Called on the ports
         * thread. */
        int (*relay)(void *arg, const char *sandbox, uint16_t port, const char *token,
                     struct cove_ports_hop *hop);
        int (*relay_sign)(void *arg, const char *node, const char *sandbox, uint16_t port,
                          const char *client_ip, char *out, size_t cap);
        /* Role node: every head must carry a control replica's proof (X-Cove-Relay, for
         * X-Cove-Client's address): 0 when relay_verify accepts it; refused 403 otherwise.
         * The client's address for X-Forwarded-For is then X-Cove-Client. */
        int (*relay_verify)(void *arg, const char *sandbox, uint16_t port, const char *proof,
                            const char *client_ip);
        /* Role node: a head for a sandbox with no exposure here: load its exposures (it
         * may have come to this node since), then the route is looked up once more. */
        void (*reload)(void *arg, const char *sandbox);
        void *arg;
};

struct cove_ports *cove_ports_new(const struct cove_ports_config *cfg, struct cove_err *err);
void cove_ports_free(struct cove_ports *p);
/* The bound address ("127.0.0.1:PORT"), for URLs. */
const char *cove_ports_bound(const struct cove_ports *p);

/* Expose (or replace) port of sandbox. port 0 = every port of it (the E2B form). addr:
 * what to connect to inside the sandbox's netns (host order). Not public: hash is SHA-256
 * of its token. The same exposure given again changes nothing (its connections stay). */
int cove_ports_expose(struct cove_ports *p, const char *tenant, const char *sandbox, uint16_t port,
                      int public_, int auto_resume, uint32_t addr,
                      const uint8_t hash[COVE_PORTS_TOKEN_HASH], struct cove_err *err);
/* 1 when exactly this exposure (sandbox, port) is held. */
int cove_ports_has(struct cove_ports *p, const char *sandbox, uint16_t port);
/* Remove an exposure (port 0: the every-port one; -1: all of the sandbox) and close its
 * open connections (audited). */
void cove_ports_unexpose(struct cove_ports *p, const char *sandbox, int port);
/* Remove every exposure of sandbox whose port is not one of keep[0..n) (their connections
 * end as with unexpose); the others, and their connections, stay. */
void cove_ports_unexpose_others(struct cove_ports *p, const char *sandbox, const uint16_t *keep,
                                int n);
/* The sandbox changed state (paused, resumed, gone): connections waiting for a resume look
 * again; connections to an instance that went away end by themselves. */
void cove_ports_kick(struct cove_ports *p);

/* 1 when tok's SHA-256 is hash (a private port's token), in constant time. */
int cove_ports_token_matches(const uint8_t hash[COVE_PORTS_TOKEN_HASH], const char *tok);

/* What the listener makes of a head for port of sandbox (one judge, for the node's listener
 * and a control replica's check of a paused sandbox's port): 0 when it may go on, else the
 * HTTP status with the reason in why. found: the port (or the sandbox's every-port
 * exposure) is exposed; hash NULL: none stored; token NULL: the head carries none; paused:
 * the sandbox is paused (then only auto_resume lets it go on, to be resumed first). */
int cove_ports_judge(const char *sandbox, uint16_t port, int found, int public_, int auto_resume,
                     const uint8_t *hash, const char *token, int paused, char *why, size_t cap);
/* The auto-resume of sandbox failed: its waiting connections get 503 with why. */
void cove_ports_resume_failed(struct cove_ports *p, const char *sandbox, const char *why);

struct cove_ports_stats {
        uint64_t opened, refused, closed, open_now, bytes_in, bytes_out;
};
void cove_ports_stats(struct cove_ports *p, struct cove_ports_stats *st);

#endif
