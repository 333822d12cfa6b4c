/* A minimal placement (control/placement.h): the preferred node when it fits, else the
 * ready node with a live lease and room (capacity minus what is placed on it) that has
 * the most free memory. Best-of-K, compatibility of full snapshots and start caps come
 * with the real placement. */
#include "control/placement.h"

#include <stdio.h>
#include <string.h>

#include "util/util.h"

struct pick {
        const struct coved_place_want *w;
        int64_t now;
        char best[64];
        int64_t best_free;
        int preferred;
        int seen, live;
};

static int consider(const struct cove_node_row *n, void *arg)
{
        struct pick *p = arg;
        p->seen++;
        if (strcmp(n->state, "ready") != 0 || n->lease_expires_at <= p->now)
                return 0;
        p->live++;
        if (p->w->avoid && !strcmp(p->w->avoid, n->name))
                return 0;
        if (p->w->runtime && n->features[0] && !strstr(n->features, p->w->runtime))
                return 0;
        int64_t fc = n->cpus - n->alloc_cpus, fm = n->memory_mb - n->alloc_memory_mb,
                fd = n->disk_mb - n->alloc_disk_mb;
        if (fc < p->w->cpus || fm < p->w->memory_mb || fd < p->w->disk_mb)
                return 0;
        int pref = p->w->prefer && !strcmp(p->w->prefer, n->name);
        if (p->preferred)
                return 0;
        if (pref || !p->best[0] || fm > p->best_free) {
                snprintf(p->best, sizeof(p->best), "%s", n->name);
                p->best_free = fm;
                p->preferred = pref;
        }
        return 0;
}

int coved_place(struct coved *d, const struct coved_place_want *w, char node[64], char *why,
                size_t why_cap, struct cove_err *err)
{
        struct pick p = {.w = w, .now = cove_now_ms()};
        if (d->cat_ops->node_list(d->cat, consider, &p, err) < 0)
                return -1;
        if (p.best[0]) {
                snprintf(node, 64, "%s", p.best);
                return 0;
        }
        if (!p.live)
                snprintf(why, why_cap, "no node is ready with a live lease (%d known)", p.seen);
        else
                snprintf(why, why_cap,
                         "no ready node has room for %d cpus, %d MB memory, %d MB disk%s%s (%d "
                         "ready)",
                         w->cpus, w->memory_mb, w->disk_mb, w->runtime ? " on runtime " : "",
                         w->runtime ? w->runtime : "", p.live);
        return 1;
}
