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
 *
 * A stream may also keep key bounds (qi_kv_stream_keep_bounds): per working
 * page (QI_KV_PAGE slots, a quarter of a block) the element-wise minimum and
 * maximum of its keys, for a policy that picks the pages attention reads
 * (Quest, kv_policy.h). Pages are smaller than blocks so that a policy can
 * read finer pieces than a block (Quest's pages are 16 tokens); a block's
 * bounds are its pages' merged, exactly. They are computed
 * on the host from the fp16 rows, so only a stream whose working tier is
 * host memory keeps them. In the same way a stream may keep its working
 * keys a second time by columns (qi_kv_stream_keep_kcols), for a policy
 * that scores every token on a few of its key's components (SparQ).
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
#define QI_KV_PAGE_SHIFT 4
#define QI_KV_PAGE (1 << QI_KV_PAGE_SHIFT) /* tokens per page of key bounds */
#define QI_KV_PAGES_PER_BLOCK (QI_KV_BLOCK / QI_KV_PAGE)

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
    /* [cap_blocks x QI_KV_PAGES_PER_BLOCK][2][D] with bounds kept (working
     * tier only): page p's (slots p x QI_KV_PAGE on) element-wise key
     * minimum at bound + 2pD, maximum at bound + (2p+1)D */
    float *bound;
    /* [cap_blocks][D][QI_KV_BLOCK] with key columns kept (working tier
     * only): component d of slot i's key at kcol + ((i >> QI_KV_BLOCK_SHIFT)
     * x D + d) x QI_KV_BLOCK + (i mod QI_KV_BLOCK), the slots of a block past
     * the last zero */
    uint16_t *kcol;
    /* [D] with key columns kept: the sum of the working values (their fp16
     * widened), for their mean (SparQ's mean-value term) */
    float *vsum;
    /* The offload tier's key columns (same layout as kcol) are brought up
     * to date on demand, for its whole blocks: slots below kcol_n have
     * theirs (every row moved into a slot lowers it to that slot;
     * qi_kv_stream_off_kcols raises it to n rounded down to a block). */
    int kcol_n;
} qi_kv_tier;

typedef struct qi_kv_pool qi_kv_pool;

/* A stream knows its pools: the working tier's blocks come from wp, or,
 * on a layer whose attention is split across two devices, blocks
 * [0, lo_blocks) from wp and the rest from sp (the slots of the first
 * blocks attended on wp's device, the rest on sp's); the offload tier's
 * from op. */
typedef struct {
    qi_kv_tier work, off;
    int ring;             /* > 0: sliding-window ring of this many slots */
    qi_kv_pool *wp, *sp, *op;
    int lo_blocks;        /* with sp: working blocks held by wp */
    int n_swapped;        /* swapped out: the last n_swapped tokens of the offload tier are the working tier's */
    bool swapped;
    bool bounds;          /* keeps work.bound (qi_kv_stream_keep_bounds) */
    bool kcols;           /* keeps work.kcol (qi_kv_stream_keep_kcols) */
    bool off_kcols;       /* keeps off.kcol (qi_kv_stream_keep_off_kcols) */
    int attended;         /* tokens its last attention read (set by the engine) */
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

/* Streams: init empty over their pools (sp NULL: no split); release
 * returns every block to the pool it came from. */
void qi_kv_stream_init(qi_kv_stream *s, int ring, qi_kv_pool *wp, qi_kv_pool *sp, qi_kv_pool *op);
void qi_kv_stream_release(qi_kv_stream *s);
/* Keep key bounds for s from now on: called on an empty stream, whose
 * working tier is host memory and not split. */
void qi_kv_stream_keep_bounds(qi_kv_stream *s);
/* Keep key columns for s from now on (a second copy of the working keys,
 * component-major per block, so that a few components of every key are
 * read without the rest: SparQ, kv_policy.h): called on an empty stream,
 * whose working tier is host memory and not split. */
void qi_kv_stream_keep_kcols(qi_kv_stream *s);
/* Keep the offload tier's keys by columns as well, for a policy that scores
 * offloaded tokens on a few components to fetch some of them back for one
 * step (kv_policy.h's fetch()): called on an empty stream. They are not
 * kept up to date as rows move (a stream may offload a token every step
 * and never be read); qi_kv_stream_off_kcols brings those of the tier's
 * whole blocks up to date from the lowest slot that changed, and returns
 * them, *n_cols the slots they cover: n rounded down to a block. The
 * newest block's tokens, the block not yet full, are read by rows: a token
 * written into the columns touches D cache lines, a block transposed
 * whole touches each line once. */
void qi_kv_stream_keep_off_kcols(qi_kv_stream *s);
const uint16_t *qi_kv_stream_off_kcols(qi_kv_stream *s, int *n_cols);
/* The bounds of the pages holding working slots i0..n-1, from the rows
 * as they now are: slots past i0 in i0's page are merged into its bounds
 * (i0 not a page's first slot) and every later page's are recomputed; and
 * the key columns of those slots copied from their rows and their values
 * added to the values' sum (i0 <= 0: the sum restarted). A no-op on a
 * stream with neither. Call it after the rows of new tokens are written
 * (the engine, after kv_write); the moves of kv.c (apply, swap_in) rebuild
 * both themselves. */
void qi_kv_stream_bounds_from(qi_kv_stream *s, int i0);

/* A slot in the working tier for one token at pos: appended, or slot pos %
 * ring of a full ring; *slot receives its index and *k_row and *v_row its
 * rows' addresses on the device of the block's pool, for that device's
 * kv_write op to fill. Fails (pool cap reached, out of memory) without
 * changing the stream. */
qi_status qi_kv_stream_slot(qi_kv_stream *s, int32_t pos, int *slot, uint16_t **k_row, uint16_t **v_row,
                            qi_err *err);

/* Before n_new tokens are added to a split stream: the working blocks the
 * stream will then need, nb, are shared out so that the first
 * round((1 - r) nb) are wp's (the attention device's) and the rest sp's
 * (a block is the unit: below 2 blocks a stream is wholly on one device).
 * The share only grows (a split stream never evicts), so blocks that now
 * belong to wp move there from sp: a block of wp is taken, the rows are
 * copied device to device on the stream of the device that is not
 * host-visible (a queued copy: the caller orders both devices after it
 * with an event), and sp's block goes back to its pool. *moved counts the
 * blocks moved. Fails (a pool's cap, memory, a refused copy) naming the
 * device; a block whose copy was refused is not moved. */
qi_status qi_kv_stream_split(qi_kv_stream *s, int n_new, float r, int *moved, qi_err *err);
/* The device whose stream qi_kv_stream_split's copies from sp to wp go
 * on, and one such move's bytes. */
qi_backend *qi_kv_split_stream(const qi_kv_stream *s);
size_t qi_kv_block_bytes(const qi_kv_pool *p);

/* A new plan for the stream's layer (qi_engine_replan): its working tier
 * moves to pools wp and sp (sp NULL: not split) with a split's share r,
 * block by block: each block whose pool changes is copied into a block of
 * its new pool (a memcpy between host pools, else a copy queued on the
 * stream of the device that is not host-visible), the old kept in *u. The
 * move is undone (qi_kv_rehome_undo: the stream as it was, the new blocks
 * returned) or committed (qi_kv_rehome_commit: the old blocks returned)
 * once the caller has synchronised the devices, so a copy that fails on a
 * device's worker costs nothing. *moved counts the blocks copied; a
 * failure (a pool's cap, memory, no stream between two devices) undoes
 * this stream's move itself. */
typedef struct {
    qi_kv_pool *wp, *sp;  /* the stream's pools before */
    int lo_blocks;
    int n;                /* blocks moved */
    int *idx;             /* [n] their indices */
    qi_buf **old;         /* [n] their old buffers */
    qi_kv_pool **old_pool, **new_pool; /* [n] */
} qi_kv_rehome;
qi_status qi_kv_stream_rehome(qi_kv_stream *s, qi_kv_pool *wp, qi_kv_pool *sp, float r, qi_kv_rehome *u,
                              int *moved, qi_err *err);
void qi_kv_rehome_commit(qi_kv_rehome *u);
void qi_kv_rehome_undo(qi_kv_stream *s, qi_kv_rehome *u);
/* Blocks a pool holds free for reuse: what a move into it takes before it
 * allocates. */
long qi_kv_pool_n_free(const qi_kv_pool *p);
/* Give the blocks kept for reuse back to the device (after a new plan
 * took a layer's KV elsewhere, so its memory serves what came instead). */
void qi_kv_pool_trim(qi_kv_pool *p);

/* Apply fates (QI_KV_KEEP/OFFLOAD/DROP from kv_policy.h) to the tokens as
 * a policy saw them: the working tier's n tokens, then the offload tier's.
 * Kept working tokens stay, recalled ones are appended to the working tier,
 * offloaded ones move to the end of the offload tier, dropped ones go.
 * The stream must not be split; its offload tier is host memory. Rows of
 * a working tier on a device move by copies queued on the device's
 * stream (the host waits for them before it compacts the offload tier),
 * so the device's later work sees them in order. */
qi_status qi_kv_stream_apply(qi_kv_stream *s, const uint8_t *fate, qi_err *err);

/* Swapping (a preempted sequence, qi_engine_seq_swap_out): every working
 * token moves, in slot order, to the end of the offload tier (host
 * memory), after what a policy offloaded there, and the working tier is
 * emptied; swap_in moves them back into the same slots, so the stream
 * reads as it did, ring order included. Rows of a working tier on a
 * device are copied on the device's stream, which is synchronised before
 * any block is returned (so call it between steps): a copy that failed
 * there fails the swap. Fails (a pool's cap, memory, a failed copy, a
 * split stream: unsupported, no stream between the devices) leaving the
 * stream as it was. */
qi_status qi_kv_stream_swap_out(qi_kv_stream *s, qi_err *err);
qi_status qi_kv_stream_swap_in(qi_kv_stream *s, qi_err *err);

/* Rows of a tier's slot i. */
static inline uint16_t *qi_kv_k_row(const qi_kv_tier *t, int i, int D) {
    return t->k_blk[i >> QI_KV_BLOCK_SHIFT] + (size_t)(i & (QI_KV_BLOCK - 1)) * D;
}
static inline uint16_t *qi_kv_v_row(const qi_kv_tier *t, int i, int D) {
    return t->v_blk[i >> QI_KV_BLOCK_SHIFT] + (size_t)(i & (QI_KV_BLOCK - 1)) * D;
}

#endif
