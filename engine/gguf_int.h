/* gguf_int.h - what the GGUF reader (gguf.c) and writer (gguf_write.c)
 * share: the format's fixed sizes and little-endian scalars. */
#ifndef QI_GGUF_INT_H
#define QI_GGUF_INT_H

#include <stdint.h>

#include "qinfer/gguf.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_HEADER_BYTES 24u
#define GGUF_N_VTYPES 13u /* value types 0..12 */

static inline unsigned vtype_size(uint32_t t) {
    static const unsigned k_sizes[GGUF_N_VTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < GGUF_N_VTYPES ? k_sizes[t] : 0;
}

static inline uint64_t load_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline void store_le(uint8_t *p, uint64_t v, unsigned n) {
    for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif
