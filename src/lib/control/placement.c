/* Placement: the best of K eligible nodes (control/placement.h). */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/coved.h"
#include "control/placement.h"
#include "util/cleanup.h"
#include "util/util.h"

#define WHY_EACH 160 /* the reason one node was passed over, at most */

/* End buf (cap bytes) with "…", on a character boundary so the text stays UTF-8. */
static void end_with_ellipsis(char *buf, size_t cap)
{
        if (cap < 4)
                return;
        size_t at = cap - 4;
        while (at > 0 && ((unsigned char)buf[at] & 0xC0) == 0x80)
                at--;
        memcpy(buf + at, "…", 4);
}

/* s with anything but printable ASCII replaced by '?', at most cap - 1 bytes: what a node
 * announced goes into error messages and JSON strings */
static const char *ascii(const char *s, char *out, size_t cap)
{
        size_t i = 0;
        for (; s && s[i] && i + 1 < cap; i++)
                out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
        out[i] = '\0';
        return out;
}

/* Append "name: reason" to why (bounded; "…" once it is full). */
static void why_add(char *why, size_t cap, const char *name, const char *fmt, ...)
{
        if (!why || !cap)
                return;
        size_t len = strlen(why);
        if (len + 8 >= cap) { /* full: end it with "…" once */
                if (len < 3 || strcmp(why + len - 3, "…") != 0)
                        end_with_ellipsis(why, len + 4 <= cap ? len + 4 : cap);
                return;
        }
        char one[WHY_EACH];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(one, sizeof(one), fmt, ap);
        va_end(ap);
        snprintf(why + len, cap - len, "%s%s: %s", len ? "; " : "", name, one);
}

/* 1 if the JSON array arr holds the string s. */
static int has_string(json_t *arr, const char *s)
{
        size_t i;
        json_t *v;
        json_array_foreach(arr, i,
                           v) if (json_is_string(v) && !strcmp(json_string_value(v), s)) return 1;
        return 0;
}

/* A full snapshot taken on a node with features from restores on one with features to when
 * both report the same CRIU, kernel and CPU model (a key from does not report is not
 * compared). 1 compatible, 0 not (why says what differs). */
static int full_compatible(json_t *from, json_t *to, char *why, size_t cap)
{
        static const char *const keys[] = {"criu", "kernel", "cpu"};
        for (size_t i = 0; i < COVE_ARRAY_SIZE(keys); i++) {
                const char *a = json_string_value(json_object_get(from, keys[i]));
                if (!a)
                        continue;
                const char *b = json_string_value(json_object_get(to, keys[i]));
                if (!b || strcmp(a, b) != 0) {
                        char sa[48], sb[48];
                        snprintf(why, cap, "full snapshot needs %s \"%s\", node has \"%s\"",
                                 keys[i], ascii(a, sa, sizeof(sa)), ascii(b, sb, sizeof(sb)));
                        return 0;
                }
        }
        return 1;
}

/* Free fraction left of the tightest resource after placing w (higher is better). */
static double score(const struct cove_node_row *r, const struct coved_place_want *w)
{
        double fc = (double)(r->cpus - r->alloc_cpus - w->cpus) / (double)(r->cpus ? r->cpus : 1);
        double fm = (double)(r->memory_mb - r->alloc_memory_mb - w->memory_mb) /
                    (double)(r->memory_mb ? r->memory_mb : 1);
        double fd = (double)(r->disk_mb - r->alloc_disk_mb - w->disk_mb) /
                    (double)(r->disk_mb ? r->disk_mb : 1);
        double s = fc < fm ? fc : fm;
        return s < fd ? s : fd;
}

/* 1 if rows[i] can take w, else 0 with the reason added to why. */
static int eligible(const struct cove_node_row *r, int starts, int64_t now_ms, int max_starts,
                    const struct coved_place_want *w, json_t *from, char *why, size_t cap)
{
        if (w->avoid && !strcmp(r->name, w->avoid)) {
                why_add(why, cap, r->name, "the node being left");
                return 0;
        }
        if (strcmp(r->state, "ready") != 0) {
                why_add(why, cap, r->name, "%s", r->state);
                return 0;
        }
        if (r->lease_expires_at <= now_ms) {
                why_add(why, cap, r->name, "lease expired %lld ms ago",
                        (long long)(now_ms - r->lease_expires_at));
                return 0;
        }
        if (max_starts > 0 && starts >= max_starts) {
                why_add(why, cap, r->name, "%d starts in flight (cap %d)", starts, max_starts);
                return 0;
        }
        int64_t fc = r->cpus - r->alloc_cpus, fm = r->memory_mb - r->alloc_memory_mb,
                fd = r->disk_mb - r->alloc_disk_mb;
        if (fc < w->cpus || fm < w->memory_mb || fd < w->disk_mb) {
                why_add(why, cap, r->name,
                        "free %lld cpus, %lld MB memory, %lld MB disk; needs %d, %d, %d",
                        (long long)fc, (long long)fm, (long long)fd, w->cpus, w->memory_mb,
                        w->disk_mb);
                return 0;
        }
        json_error_t je;
        json_t *f = json_loads(r->features, 0, &je);
        int ok = 1;
        if (!json_is_object(f)) {
                why_add(why, cap, r->name, "announced no features");
                ok = 0;
        } else if (w->runtime && w->runtime[0] &&
                   !has_string(json_object_get(f, "runtimes"), w->runtime)) {
                why_add(why, cap, r->name, "no runtime %s", w->runtime);
                ok = 0;
        } else if (w->template_name && w->template_name[0] &&
                   !has_string(json_object_get(f, "templates"), w->template_name)) {
                why_add(why, cap, r->name, "template %s not built there", w->template_name);
                ok = 0;
        } else if (w->need_full) {
                const char *full = json_string_value(json_object_get(f, "full"));
                char one[WHY_EACH];
                if (!full || strcmp(full, "ok") != 0) {
                        char sf[88];
                        why_add(why, cap, r->name, "no full snapshots (%s)",
                                full ? ascii(full, sf, sizeof(sf)) : "not reported");
                        ok = 0;
                } else if (from && !full_compatible(from, f, one, sizeof(one))) {
                        why_add(why, cap, r->name, "%s", one);
                        ok = 0;
                }
        }
        json_decref(f);
        return ok;
}

static uint64_t next_rand(uint64_t *s)
{
        /* splitmix64: a fixed sequence for a given seed */
        uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

int coved_place_rows(const struct cove_node_row *rows, size_t n, const int *starts, int64_t now_ms,
                     int k, int max_starts, uint64_t seed, const struct coved_place_want *w,
                     char node[64], char *why, size_t why_cap)
{
        char reasons[1024] = "";
        json_error_t je;
        json_t *from = w->full_from && w->full_from[0] ? json_loads(w->full_from, 0, &je) : NULL;
        if (from && !json_is_object(from)) {
                json_decref(from);
                from = NULL;
        }
        size_t *ok = n ? calloc(n, sizeof(*ok)) : NULL;
        size_t nok = 0, pick = SIZE_MAX;
        for (size_t i = 0; i < n; i++) {
                if (!eligible(&rows[i], starts ? starts[i] : 0, now_ms, max_starts, w, from,
                              reasons, sizeof(reasons)))
                        continue;
                if (w->prefer && !strcmp(rows[i].name, w->prefer))
                        pick = i; /* it holds the chunks: no download at all */
                if (ok)
                        ok[nok++] = i;
        }
        json_decref(from);
        if (pick == SIZE_MAX && nok) {
                /* sample min(k, nok) of them (partial Fisher-Yates), keep the best: replicas
                 * placing at the same moment spread out instead of all taking the emptiest */
                size_t take = k < 1 ? 1 : (size_t)k;
                if (take > nok)
                        take = nok;
                uint64_t st = seed;
                for (size_t j = 0; j < take && take < nok; j++) {
                        size_t r = j + (size_t)(next_rand(&st) % (nok - j));
                        size_t t = ok[j];
                        ok[j] = ok[r];
                        ok[r] = t;
                }
                for (size_t j = 0; j < take; j++) {
                        size_t i = ok[j];
                        if (pick == SIZE_MAX)
                                pick = i;
                        else {
                                double a = score(&rows[i], w), b = score(&rows[pick], w);
                                if (a > b || (a == b && strcmp(rows[i].name, rows[pick].name) < 0))
                                        pick = i;
                        }
                }
        }
        free(ok);
        if (pick != SIZE_MAX) {
                snprintf(node, 64, "%s", rows[pick].name);
                return 0;
        }
        if (why && why_cap) {
                if (!n)
                        snprintf(why, why_cap, "no node can take it: no nodes are registered");
                else if ((size_t)snprintf(why, why_cap, "no node can take it: %s", reasons) >=
                             why_cap &&
                         why_cap >= 4)
                        end_with_ellipsis(why, why_cap);
        }
        return 1;
}

static int collect_node(const struct cove_node_row *row, void *arg)
{
        struct coved_node_rows *x = arg;
        if (x->n == x->cap) {
                size_t nc = x->cap ? x->cap * 2 : 16;
                struct cove_node_row *nv = realloc(x->v, nc * sizeof(*nv));
                if (!nv)
                        return -1;
                x->v = nv;
                x->cap = nc;
        }
        x->v[x->n++] = *row;
        return 0;
}

int coved_nodes_read(struct coved *d, struct coved_node_rows *x, struct cove_err *err)
{
        memset(x, 0, sizeof(*x));
        if (d->cat_ops->node_list(d->cat, collect_node, x, err) < 0) {
                free(x->v);
                x->v = NULL;
                return -1;
        }
        return 0;
}

struct node_find {
        const char *name;
        struct cove_node_row *out;
        int found;
};

static int node_one(const struct cove_node_row *row, void *arg)
{
        struct node_find *f = arg;
        if (strcmp(row->name, f->name) != 0)
                return 0;
        *f->out = *row;
        f->found = 1;
        return -1; /* found: stop */
}

int coved_node_get(struct coved *d, const char *name, struct cove_node_row *out,
                   struct cove_err *err)
{
        struct node_find f = {.name = name, .out = out};
        if (d->cat_ops->node_list(d->cat, node_one, &f, err) < 0)
                return -1;
        return f.found ? 0 : 1;
}

struct starts {
        struct coved_node_rows *nodes;
        int *count;
};

static int count_start(const char *node, int64_t n, void *arg)
{
        struct starts *x = arg;
        for (size_t i = 0; i < x->nodes->n; i++)
                if (!strcmp(x->nodes->v[i].name, node))
                        x->count[i] = n > 1 << 20 ? 1 << 20 : (int)n;
        return 0;
}

int coved_place(struct coved *d, const struct coved_place_want *w, char node[64], char *why,
                size_t why_cap, struct cove_err *err)
{
        struct coved_node_rows x;
        if (coved_nodes_read(d, &x, err) < 0)
                return -1;
        int *count = x.n ? calloc(x.n, sizeof(*count)) : NULL;
        if (x.n && !count) {
                free(x.v);
                return cove_err_set(err, ENOMEM, "placement");
        }
        /* the starts in flight: start, resume and recover jobs not finished yet */
        struct starts sx = {&x, count};
        if (x.n &&
            d->cat_ops->job_counts(d->cat, "start,resume,recover", count_start, &sx, err) < 0) {
                free(count);
                free(x.v);
                return -1;
        }
        uint64_t seed = 0;
        if (cove_random(&seed, sizeof(seed), err) < 0) {
                free(count);
                free(x.v);
                return -1;
        }
        /* cpus are shared (agents mostly wait), memory and disk are not */
        int64_t over = d->nodes_opt.cpu_overcommit > 0 ? d->nodes_opt.cpu_overcommit : 4;
        for (size_t i = 0; i < x.n; i++)
                x.v[i].cpus *= over;
        int k = d->nodes_opt.placement_k > 0 ? d->nodes_opt.placement_k : 3;
        int cap = d->nodes_opt.max_starts_per_node > 0 ? d->nodes_opt.max_starts_per_node : 4;
        int r =
            coved_place_rows(x.v, x.n, count, cove_now_ms(), k, cap, seed, w, node, why, why_cap);
        free(count);
        free(x.v);
        return r;
}
