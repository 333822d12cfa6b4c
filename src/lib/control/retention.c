/* Rolling-snapshot retention (control/retention.h): parsing the per-sandbox policy and the
 * pure thinning decision that the background thinner applies. */
#include "control/retention.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WITHIN_S (10LL * 365 * 24 * 3600)

void cove_retention_default(struct cove_retention *p)
{
        memset(p, 0, sizeof(*p));
        p->t[0] = (struct cove_retention_tier){3600, 0};
        p->t[1] = (struct cove_retention_tier){24 * 3600, 600};
        p->t[2] = (struct cove_retention_tier){7 * 24 * 3600, 3600};
        p->n = 3;
}

int cove_retention_parse(const char *json, struct cove_retention *p, struct cove_err *err)
{
        cove_retention_default(p);
        if (!json)
                return 0;
        json_error_t je;
        json_t *a = json_loads(json, JSON_DECODE_ANY, &je);
        if (!a)
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "retention: not JSON: %s",
                                     je.text);
        int r = 0;
        if (json_is_null(a))
                goto out;
        if (!json_is_array(a) || json_array_size(a) == 0 ||
            json_array_size(a) > COVE_RETENTION_MAX_TIERS) {
                r = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                  "retention must be an array of 1 to %d tiers "
                                  "{\"within_s\":N,\"every_s\":M}",
                                  COVE_RETENTION_MAX_TIERS);
                goto out;
        }
        struct cove_retention q = {0};
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v)
        {
                json_t *w = json_object_get(v, "within_s"), *e = json_object_get(v, "every_s");
                if (!json_is_object(v) || !json_is_integer(w) || (e && !json_is_integer(e)) ||
                    json_object_size(v) != (e ? 2u : 1u)) {
                        r = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                          "retention[%zu] must be {\"within_s\":N,\"every_s\":M}",
                                          i);
                        goto out;
                }
                int64_t ws = json_integer_value(w), es = e ? json_integer_value(e) : 0;
                int64_t prev = i ? q.t[i - 1].within_s : 0;
                if (ws <= prev || ws > MAX_WITHIN_S || es < 0 || es > ws) {
                        r = cove_err_setk(err, COVE_E_BAD_REQUEST, 0,
                                          "retention[%zu]: within_s must grow (1 s to 10 years) "
                                          "and every_s be between 0 and within_s",
                                          i);
                        goto out;
                }
                q.t[i] = (struct cove_retention_tier){ws, es};
                q.n = (int)i + 1;
        }
        *p = q;
out:
        json_decref(a);
        return r;
}

char *cove_retention_dump(const struct cove_retention *p)
{
        json_t *a = json_array();
        for (int i = 0; a && i < p->n; i++)
                json_array_append_new(a, json_pack("{s:I, s:I}", "within_s",
                                                   (json_int_t)p->t[i].within_s, "every_s",
                                                   (json_int_t)p->t[i].every_s));
        char *s = a ? json_dumps(a, JSON_COMPACT) : NULL;
        json_decref(a);
        return s;
}

struct item {
        int64_t t;
        size_t i;
};

static int by_time(const void *a, const void *b)
{
        const struct item *x = a, *y = b;
        if (x->t != y->t)
                return x->t < y->t ? -1 : 1;
        return x->i < y->i ? -1 : x->i > y->i;
}

void cove_retention_thin(const struct cove_retention *p, int64_t now_ms, const int64_t *created_ms,
                         size_t n, int *keep)
{
        struct item *it = calloc(n ? n : 1, sizeof(*it));
        if (!it) { /* keeping everything is always safe */
                for (size_t i = 0; i < n; i++)
                        keep[i] = 1;
                return;
        }
        for (size_t i = 0; i < n; i++)
                it[i] = (struct item){created_ms[i], i};
        qsort(it, n, sizeof(*it), by_time);
        /* oldest first: the first member seen in a (tier, bucket) is that bucket's keeper */
        int last_tier = -1;
        int64_t last_bucket = 0;
        for (size_t k = 0; k < n; k++) {
                int64_t age_ms = now_ms - it[k].t;
                size_t i = it[k].i;
                if (age_ms < 0) {
                        keep[i] = 1;
                        continue;
                }
                int tier = -1;
                for (int j = 0; j < p->n; j++)
                        if (age_ms < p->t[j].within_s * 1000) {
                                tier = j;
                                break;
                        }
                if (tier < 0) {
                        keep[i] = 0;
                        continue;
                }
                int64_t every_ms = p->t[tier].every_s * 1000;
                if (every_ms == 0) {
                        keep[i] = 1;
                        continue;
                }
                int64_t bucket = it[k].t / every_ms;
                keep[i] = !(tier == last_tier && bucket == last_bucket);
                last_tier = tier;
                last_bucket = bucket;
        }
        free(it);
}
