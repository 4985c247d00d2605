/* kv.h - the paged KV cache of the batched engine (private to engine/).
 *
 * Every (sequence, layer, KV head) has a stream: its working tier (what
 * attention reads) in slots 0..n_work-1, and its offload tier (host memory,
 * read only to probe for recall). Each tier's rows live in fixed-size
 * blocks of QI_KV_BLOCK tokens x D fp16 values for K and for V, taken from
 * a pool that counts every block, so bytes in use are exact per tier and per
 * sequence. Positions and the policy's per-token scores travel with the
 * rows.
 *
 * Slot order is append order until a policy evicts: then the hole is filled
 * with the last working token (constant work per eviction; order matters
 * only for the full cache, which never evicts). Sliding-window layers keep
 * llama.cpp's ring: position p goes to slot p % ring once the ring is full,
 * so the slots' order, and with it the summation order, is that of the
 * single-sequence engine.
 */
#ifndef QI_KV_H
#define QI_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "qinfer/status.h"

#define QI_KV_BLOCK_SHIFT 6
#define QI_KV_BLOCK (1 << QI_KV_BLOCK_SHIFT) /* tokens per block */

typedef struct qi_kv_pool qi_kv_pool;

/* One tier of one stream. */
typedef struct {
    int n;                /* tokens */
    int n_blocks, cap_blocks;
    uint16_t **k_blk;     /* [n_blocks] -> [QI_KV_BLOCK][D], addresses of the pool's device */
    uint16_t **v_blk;
    qi_buf **blk;         /* [n_blocks] the blocks' buffers */
    int32_t *pos;         /* [cap] */
    float *score;         /* [cap] */
    int cap;
} qi_kv_tier;

typedef struct {
    qi_kv_tier work, off;
    int ring;             /* > 0: sliding-window ring of this many slots */
} qi_kv_stream;

typedef struct {
    long blocks[2];       /* in use, per tier (0 working, 1 offload) */
    long peak_blocks[2];
    long max_blocks;      /* the cap over both tiers (0: none) */
    size_t block_bytes;   /* K and V of one block */
} qi_kv_usage;

/* A pool of blocks for rows of D fp16 values on device dev (its buffers,
 * counted against its capacity); max_bytes caps the blocks in use over
 * both tiers (0: no cap). Freed blocks are kept for reuse. Only a pool on
 * a host-visible device (the CPU) may hold offload tiers or have its rows
 * moved by qi_kv_stream_apply; a device's pool holds working tiers that
 * its ops alone read and write. */
qi_status qi_kv_pool_create(qi_backend *dev, int D, size_t max_bytes, qi_kv_pool **out, qi_err *err);
void qi_kv_pool_free(qi_kv_pool *p);
const qi_kv_usage *qi_kv_pool_usage(const qi_kv_pool *p);
qi_backend *qi_kv_pool_device(const qi_kv_pool *p);

/* Streams: init empty; release returns every block, the working tier's
 * to wp and the offload tier's to op. */
void qi_kv_stream_init(qi_kv_stream *s, int ring);
void qi_kv_stream_release(qi_kv_pool *wp, qi_kv_pool *op, qi_kv_stream *s);

/* A slot in the working tier for one token at pos: appended, or slot pos %
 * ring of a full ring; *k_row and *v_row receive its rows' addresses on
 * the pool's device, for the device's kv_write op to fill. Fails (pool
 * cap reached, out of memory) without changing the stream. */
qi_status qi_kv_stream_slot(qi_kv_pool *p, qi_kv_stream *s, int32_t pos, uint16_t **k_row, uint16_t **v_row,
                            qi_err *err);

/* Apply fates (QI_KV_KEEP/OFFLOAD/DROP from kv_policy.h) to the tokens as
 * a policy saw them: the working tier's n tokens, then the offload tier's.
 * Kept working tokens stay, recalled ones are appended to the working tier,
 * offloaded ones move to the end of the offload tier, dropped ones go.
 * Both pools must be host-visible (the rows are moved by the host). */
qi_status qi_kv_stream_apply(qi_kv_pool *wp, qi_kv_pool *op, qi_kv_stream *s, const uint8_t *fate, qi_err *err);

/* Rows of a tier's slot i. */
static inline uint16_t *qi_kv_k_row(const qi_kv_tier *t, int i, int D) {
    return t->k_blk[i >> QI_KV_BLOCK_SHIFT] + (size_t)(i & (QI_KV_BLOCK - 1)) * D;
}
static inline uint16_t *qi_kv_v_row(const qi_kv_tier *t, int i, int D) {
    return t->v_blk[i >> QI_KV_BLOCK_SHIFT] + (size_t)(i & (QI_KV_BLOCK - 1)) * D;
}

#endif
