/* Bounded sequence-numbered event log; see replay.h. */
#include "node/replay.h"

#include <stdlib.h>
#include <string.h>

void cove_replay_init(struct cove_replay *r, size_t max_bytes, size_t max_events)
{
        memset(r, 0, sizeof(*r));
        r->next_seq = 1;
        r->first_seq = 1;
        r->max_bytes = max_bytes;
        r->max_events = max_events < 2 ? 2 : max_events;
}

void cove_replay_free(struct cove_replay *r)
{
        for (size_t i = 0; i < r->count; i++) {
                struct cove_ev *ev = r->ring[(r->start + i) % r->cap];
                free(ev->line);
                free(ev);
        }
        free(r->ring);
        r->ring = NULL;
        r->count = r->cap = r->start = 0;
        r->bytes = 0;
}

static void drop_oldest(struct cove_replay *r)
{
        struct cove_ev *ev = r->ring[r->start];
        r->bytes -= ev->len;
        r->dropped_bytes += ev->len;
        r->dropped_events++;
        free(ev->line);
        free(ev);
        r->ring[r->start] = NULL;
        r->start = (r->start + 1) % r->cap;
        r->count--;
        r->first_seq++;
}

static int grow(struct cove_replay *r)
{
        size_t ncap = r->cap ? r->cap * 2 : 16;
        if (ncap > r->max_events)
                ncap = r->max_events;
        struct cove_ev **n = calloc(ncap, sizeof(*n));
        if (!n)
                return -1;
        for (size_t i = 0; i < r->count; i++)
                n[i] = r->ring[(r->start + i) % r->cap];
        free(r->ring);
        r->ring = n;
        r->cap = ncap;
        r->start = 0;
        return 0;
}

uint64_t cove_replay_append(struct cove_replay *r, uint8_t type, const void *data, uint32_t len)
{
        uint64_t seq = r->next_seq++;
        struct cove_ev *ev = malloc(sizeof(*ev) + len);
        if (!ev || (len > r->max_bytes && type != COVE_EV_EXIT)) {
                /* cannot hold it: everything before and this one count as lost */
                free(ev);
                while (r->count > 0)
                        drop_oldest(r);
                r->dropped_bytes += len;
                r->dropped_events++;
                r->first_seq = r->next_seq;
                return 0;
        }
        ev->seq = seq;
        ev->type = type;
        ev->len = len;
        ev->line = NULL;
        ev->line_len = 0;
        if (len)
                memcpy(ev->data, data, len);
        while (r->count > 0 && (r->bytes + len > r->max_bytes || r->count >= r->max_events))
                drop_oldest(r);
        if (r->count == r->cap && grow(r) < 0) {
                free(ev);
                r->dropped_bytes += len;
                r->dropped_events++;
                return 0;
        }
        if (r->count == 0)
                r->first_seq = seq;
        r->ring[(r->start + r->count) % r->cap] = ev;
        r->count++;
        r->bytes += len;
        return seq;
}

int cove_replay_next(const struct cove_replay *r, uint64_t after, const struct cove_ev **ev,
                     uint64_t *lost_through)
{
        uint64_t want = after + 1;
        if (want >= r->next_seq)
                return 0;
        if (r->count == 0 || want < r->first_seq) {
                /* the wanted event existed but is gone */
                *lost_through = (r->count == 0 ? r->next_seq : r->first_seq) - 1;
                return 2;
        }
        *ev = r->ring[(r->start + (size_t)(want - r->first_seq)) % r->cap];
        return 1;
}

const char *cove_replay_line(struct cove_ev *ev, cove_ev_encode_fn enc, const void *arg,
                             size_t *len)
{
        if (!ev->line) {
                ev->line_len = 0;
                ev->line = enc(ev, arg, &ev->line_len);
                if (!ev->line)
                        return NULL;
        }
        *len = ev->line_len;
        return ev->line;
}
