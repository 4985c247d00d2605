/* types.h - tensor element types (numbered as in GGUF files) and their sizes.
 *
 * A "block" is the unit a quantised row is cut into: blck elements stored in
 * size bytes. Plain types have blck = 1. Only types listed here are accepted
 * by the GGUF reader; whether the engine can compute with a type is a separate
 * question answered by qi_type_can_dot() (quant.h).
 */
#ifndef QINFER_TYPES_H
#define QINFER_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    QI_TYPE_F32 = 0,
    QI_TYPE_F16 = 1,
    QI_TYPE_Q4_0 = 2,
    QI_TYPE_Q4_1 = 3,
    QI_TYPE_Q5_0 = 6,
    QI_TYPE_Q5_1 = 7,
    QI_TYPE_Q8_0 = 8,
    QI_TYPE_Q8_1 = 9,
    QI_TYPE_Q2_K = 10,
    QI_TYPE_Q3_K = 11,
    QI_TYPE_Q4_K = 12,
    QI_TYPE_Q5_K = 13,
    QI_TYPE_Q6_K = 14,
    QI_TYPE_Q8_K = 15,
    QI_TYPE_I8 = 24,
    QI_TYPE_I16 = 25,
    QI_TYPE_I32 = 26,
    QI_TYPE_I64 = 27,
    QI_TYPE_F64 = 28,
    QI_TYPE_BF16 = 30,
    QI_TYPE_COUNT = 40 /* upper bound of ids, not a type */
} qi_type;

typedef struct {
    const char *name; /* "q4_1"; NULL for ids that are not types */
    uint32_t blck;    /* elements per block */
    uint32_t size;    /* bytes per block */
} qi_type_info;

/* Info for a type id, or NULL when the id is not a known type. */
const qi_type_info *qi_type_get(uint32_t type);

/* Bytes of a row of n elements; false when n is not a multiple of the block
 * size or the size overflows. */
bool qi_type_row_bytes(uint32_t type, uint64_t n, uint64_t *out);

#endif
