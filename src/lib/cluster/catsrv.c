/* The control's catalog endpoint state: nonce cache and wake-up hub (cluster/catsrv.h). */
#include "cluster/catsrv.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/nodeauth.h"
#include "control/coved.h"
#include "util/util.h"

#define SLOTS (1u << 16)
#define PROBES 64

struct slot {
        uint64_t h;     /* hash of name and nonce; 0 = empty */
        int64_t expiry; /* unix ms */
};

struct cove_catsrv {
        pthread_mutex_t mu;
        struct slot *slots;
        /* wake-up hub */
        pthread_cond_t cv;
        uint64_t wakes; /* bumped by cove_catsrv_woken */
};

struct cove_catsrv *cove_catsrv_new(void)
{
        struct cove_catsrv *s = calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        s->slots = calloc(SLOTS, sizeof(*s->slots));
        if (!s->slots) {
                free(s);
                return NULL;
        }
        pthread_mutex_init(&s->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&s->cv, &ca);
        pthread_condattr_destroy(&ca);
        return s;
}

void cove_catsrv_free(struct cove_catsrv *s)
{
        if (!s)
                return;
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s->slots);
        free(s);
}

/* FNV-1a over name NUL nonce; never 0 */
static uint64_t key_hash(const char *name, const char *nonce)
{
        uint64_t h = 1469598103934665603ull;
        for (const char *p = name; *p; p++)
                h = (h ^ (unsigned char)*p) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;
        for (const char *p = nonce; *p; p++)
                h = (h ^ (unsigned char)*p) * 1099511628211ull;
        return h ? h : 1;
}

int cove_catsrv_nonce(struct cove_catsrv *s, const char *name, const char *nonce, int64_t ts,
                      int64_t now_ms, struct cove_err *err)
{
        /* a request is accepted while |now - ts| <= skew: keep its nonce until ts + skew has
         * passed on this clock (plus margin) */
        int64_t expiry = (ts > now_ms ? ts : now_ms) + 2 * COVE_NODEAUTH_SKEW_MS;
        uint64_t h = key_hash(name, nonce);
        pthread_mutex_lock(&s->mu);
        struct slot *free_slot = NULL;
        for (unsigned i = 0; i < PROBES; i++) {
                struct slot *sl = &s->slots[(h + i) & (SLOTS - 1)];
                int live = sl->h && sl->expiry > now_ms;
                if (live && sl->h == h) {
                        pthread_mutex_unlock(&s->mu);
                        return cove_err_setk(err, COVE_E_UNAUTHORIZED, 0,
                                             "Cove-Node request replayed (nonce seen before)");
                }
                if (!live && !free_slot)
                        free_slot = sl;
        }
        if (!free_slot) {
                pthread_mutex_unlock(&s->mu);
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "too many node requests in the last %d s: retry",
                                     2 * COVE_NODEAUTH_SKEW_MS / 1000);
        }
        free_slot->h = h;
        free_slot->expiry = expiry;
        pthread_mutex_unlock(&s->mu);
        return 0;
}

static void deadline_ts(struct timespec *ts, int64_t mono_ns)
{
        ts->tv_sec = mono_ns / 1000000000;
        ts->tv_nsec = mono_ns % 1000000000;
}

int cove_catsrv_wait(struct cove_catsrv *s, int timeout_ms, const int *quitting)
{
        int64_t until = cove_mono_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
        pthread_mutex_lock(&s->mu);
        uint64_t seen = s->wakes;
        while (s->wakes == seen && !(quitting && *quitting)) {
                int64_t now = cove_mono_ns();
                if (now >= until)
                        break;
                struct timespec ts;
                int64_t slice = now + 1000000000ll; /* re-check quitting every second */
                deadline_ts(&ts, slice < until ? slice : until);
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        int rc = s->wakes != seen ? 0 : 1;
        pthread_mutex_unlock(&s->mu);
        return rc;
}

void cove_catsrv_woken(struct cove_catsrv *s)
{
        if (!s)
                return;
        pthread_mutex_lock(&s->mu);
        s->wakes++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
}

struct cove_catsrv *coved_catsrv(struct coved *d)
{
        pthread_mutex_lock(&d->mu);
        if (!d->catsrv)
                d->catsrv = cove_catsrv_new();
        struct cove_catsrv *s = d->catsrv;
        pthread_mutex_unlock(&d->mu);
        return s;
}
