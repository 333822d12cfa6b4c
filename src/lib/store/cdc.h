/* Chunking: content-defined (FastCDC: gear rolling hash, cut-point skipping below min,
 * normalised chunking with a harder mask before avg and an easier one after) for files, so
 * an insertion moves only nearby boundaries; fixed-size for memory images, where pages do
 * not move and all-zero chunks become holes. Pure functions, no allocation. */
#ifndef COVE_STORE_CDC_H
#define COVE_STORE_CDC_H

#include <stddef.h>
#include <stdint.h>

#define COVE_CDC_MIN (16u << 10)
#define COVE_CDC_AVG (64u << 10)
#define COVE_CDC_MAX (256u << 10)
#define COVE_FIXED_CHUNK (2u << 20) /* memory images */

struct cove_cdc {
        size_t min, avg, max;
        uint64_t mask_s, mask_l; /* bits checked before / after avg */
        uint64_t gear[256];
};

/* min < avg < max, avg a power of two. seed selects the gear table: the snapshot layer
 * derives it from the tenant's chunk-name key so boundaries are not a public function of
 * content. Returns 0, or -1 if the sizes are invalid. */
int cove_cdc_init(struct cove_cdc *c, size_t min, size_t avg, size_t max, uint64_t seed);

/* Length of the next chunk at the start of p[0..n). The caller passes at least c->max
 * bytes unless the input ends within them (then n is all that is left). Returns a value in
 * [1, n] (n if n <= min); 0 only for n == 0. */
size_t cove_cdc_cut(const struct cove_cdc *c, const uint8_t *p, size_t n);

/* 1 if p[0..n) is all zero bytes. */
int cove_is_zero(const void *p, size_t n);

#endif
