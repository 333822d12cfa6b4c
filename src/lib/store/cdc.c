/* FastCDC content-defined chunking and the zero test for fixed-size chunks (store/cdc.h). */
#include <string.h>

#include "store/cdc.h"

static uint64_t splitmix64(uint64_t *s)
{
        uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

/* `bits` one-bits at the top of the word: the gear hash shifts left, so high bits depend on
 * the last 64 bytes while low bits depend only on the last few. */
static uint64_t top_mask(unsigned bits)
{
        return bits >= 64 ? ~0ULL : ~0ULL << (64 - bits);
}

int cove_cdc_init(struct cove_cdc *c, size_t min, size_t avg, size_t max, uint64_t seed)
{
        if (min == 0 || min >= avg || avg >= max || (avg & (avg - 1)))
                return -1;
        unsigned bits = 0;
        while ((1ULL << bits) < avg)
                bits++;
        c->min = min;
        c->avg = avg;
        c->max = max;
        /* Normalisation level 2 (FastCDC paper): avg±2 bits. */
        c->mask_s = top_mask(bits + 2);
        c->mask_l = top_mask(bits > 2 ? bits - 2 : 1);
        uint64_t s = seed ^ 0x636f76652d636463ULL; /* "cove-cdc" */
        for (int i = 0; i < 256; i++)
                c->gear[i] = splitmix64(&s);
        return 0;
}

size_t cove_cdc_cut(const struct cove_cdc *c, const uint8_t *p, size_t n)
{
        if (n <= c->min)
                return n;
        size_t end = n < c->max ? n : c->max;
        size_t norm = c->avg < end ? c->avg : end;
        uint64_t fp = 0;
        size_t i = c->min;
        for (; i < norm; i++) {
                fp = (fp << 1) + c->gear[p[i]];
                if (!(fp & c->mask_s))
                        return i + 1;
        }
        for (; i < end; i++) {
                fp = (fp << 1) + c->gear[p[i]];
                if (!(fp & c->mask_l))
                        return i + 1;
        }
        return end;
}

int cove_is_zero(const void *p, size_t n)
{
        const uint8_t *b = p;
        while (n && ((uintptr_t)b & 7)) {
                if (*b++)
                        return 0;
                n--;
        }
        const uint64_t *w = (const uint64_t *)(const void *)b;
        size_t words = n / 8;
        for (size_t i = 0; i < words; i++)
                if (w[i])
                        return 0;
        b += words * 8;
        for (size_t i = 0; i < n % 8; i++)
                if (b[i])
                        return 0;
        return 1;
}
