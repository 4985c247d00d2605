/* kv.c - blocks, pool and streams of the paged KV cache (see kv.h).
 *
 * Why blocks rather than one array per stream: streams grow and shrink
 * independently (eviction, recall, sequences joining and leaving) and a
 * block pool makes every byte accountable per tier and per sequence, and
 * lets a later device backend mirror the working tier block by block. Why
 * 64 tokens: large enough that the block table costs nothing against the
 * rows, small enough that a sequence wastes under one block per stream.
 *
 * A block is one allocation holding its K rows then its V rows. Freed
 * blocks go to a free list and are reused before anything new is
 * allocated, so a steady-state decode allocates nothing.
 */
#include "kv.h"

#include <math.h>
#include <string.h>

#include "kv/kv_policy.h"
#include "qinfer/quant.h"

struct qi_kv_pool {
    qi_backend *dev;
    int D;
    qi_kv_usage u;
    qi_buf **free_list;
    long n_free, cap_free;
};

qi_status qi_kv_pool_create(qi_backend *dev, int D, size_t max_bytes, qi_kv_pool **out, qi_err *err) {
    *out = NULL;
    if (D < 1 || D > 4096) return QI_ERR(err, QI_ERR_INVALID, "KV head size %d out of range", D);
    qi_kv_pool *p = qi_calloc(1, sizeof *p);
    if (!p) return QI_ERR(err, QI_ERR_NOMEM, "out of memory creating the KV pool");
    p->dev = dev;
    p->D = D;
    p->u.block_bytes = (size_t)2 * QI_KV_BLOCK * (size_t)D * sizeof(uint16_t);
    p->u.max_blocks = max_bytes ? (long)(max_bytes / p->u.block_bytes) : 0;
    if (max_bytes && p->u.max_blocks < 1) {
        qi_free(p);
        return QI_ERR(err, QI_ERR_INVALID, "KV memory cap of %zu bytes is below one block (%zu bytes)", max_bytes,
                      (size_t)2 * QI_KV_BLOCK * (size_t)D * sizeof(uint16_t));
    }
    *out = p;
    return QI_OK;
}

void qi_kv_pool_free(qi_kv_pool *p) {
    if (!p) return;
    for (long i = 0; i < p->n_free; i++) qi_buf_free(p->free_list[i]);
    qi_free(p->free_list);
    qi_free(p);
}

const qi_kv_usage *qi_kv_pool_usage(const qi_kv_pool *p) { return &p->u; }
qi_backend *qi_kv_pool_device(const qi_kv_pool *p) { return p->dev; }

static qi_status block_get(qi_kv_pool *p, int tier, qi_buf **out, qi_err *err) {
    if (p->u.max_blocks && p->u.blocks[0] + p->u.blocks[1] >= p->u.max_blocks)
        return QI_ERR(err, QI_ERR_NOMEM, "KV cache full: %ld blocks of %zu KiB in use, the cap", p->u.max_blocks,
                      p->u.block_bytes / 1024);
    qi_buf *b = NULL;
    if (p->n_free)
        b = p->free_list[--p->n_free];
    else {
        qi_status st = qi_buf_alloc(p->dev, p->u.block_bytes, "a KV block", &b, err);
        if (st) return st;
    }
    p->u.blocks[tier]++;
    if (p->u.blocks[tier] > p->u.peak_blocks[tier]) p->u.peak_blocks[tier] = p->u.blocks[tier];
    *out = b;
    return QI_OK;
}

static void block_put(qi_kv_pool *p, int tier, qi_buf *b) {
    p->u.blocks[tier]--;
    if (p->n_free == p->cap_free) {
        long cap = p->cap_free ? 2 * p->cap_free : 64;
        qi_buf **fl = qi_realloc(p->free_list, sizeof *fl * (size_t)cap);
        if (!fl) { /* keep the accounting right; just do not cache the block */
            qi_buf_free(b);
            return;
        }
        p->free_list = fl;
        p->cap_free = cap;
    }
    p->free_list[p->n_free++] = b;
}

size_t qi_kv_block_bytes(const qi_kv_pool *p) { return p->u.block_bytes; }

void qi_kv_stream_init(qi_kv_stream *s, int ring, qi_kv_pool *wp, qi_kv_pool *sp, qi_kv_pool *op) {
    memset(s, 0, sizeof *s);
    s->ring = ring;
    s->wp = wp;
    s->sp = sp;
    s->op = op;
}

/* The pool of block b of the working tier (tier 0) or the offload tier. */
static qi_kv_pool *pool_of(const qi_kv_stream *s, int tier, int b) {
    if (tier == 1) return s->op;
    return s->sp && b >= s->lo_blocks ? s->sp : s->wp;
}

static void tier_release(const qi_kv_stream *s, int tier, qi_kv_tier *t) {
    for (int b = 0; b < t->n_blocks; b++) block_put(pool_of(s, tier, b), tier, t->blk[b]);
    qi_free(t->k_blk);
    qi_free(t->v_blk);
    qi_free(t->blk);
    qi_free(t->pos);
    qi_free(t->score);
    qi_free(t->bound);
    qi_free(t->kcol);
    qi_free(t->vsum);
    memset(t, 0, sizeof *t);
}

void qi_kv_stream_release(qi_kv_stream *s) {
    tier_release(s, 0, &s->work);
    tier_release(s, 1, &s->off);
    s->lo_blocks = 0;
}

/* Room for n tokens in a tier of s: arrays, block table (for at least
 * n_tab blocks) and blocks, each from its pool. */
static qi_status tier_reserve(qi_kv_stream *s, int tier, int n, int n_tab, qi_err *err) {
    qi_kv_tier *t = tier ? &s->off : &s->work;
    if (n > t->cap) {
        int cap = t->cap ? t->cap : QI_KV_BLOCK;
        while (cap < n) cap *= 2;
        int32_t *pos = qi_realloc(t->pos, sizeof *pos * (size_t)cap);
        if (pos) t->pos = pos;
        float *score = pos ? qi_realloc(t->score, sizeof *score * (size_t)cap) : NULL;
        if (score) t->score = score;
        if (!pos || !score) return QI_ERR(err, QI_ERR_NOMEM, "out of memory growing a KV stream");
        t->cap = cap;
    }
    const int need = (n + QI_KV_BLOCK - 1) / QI_KV_BLOCK, tab = need > n_tab ? need : n_tab;
    if (tab > t->cap_blocks) {
        int cap = t->cap_blocks ? 2 * t->cap_blocks : 4;
        while (cap < tab) cap *= 2;
        uint16_t **kb = qi_realloc(t->k_blk, sizeof *kb * (size_t)cap);
        if (kb) t->k_blk = kb;
        uint16_t **vb = kb ? qi_realloc(t->v_blk, sizeof *vb * (size_t)cap) : NULL;
        if (vb) t->v_blk = vb;
        qi_buf **bb = vb ? qi_realloc(t->blk, sizeof *bb * (size_t)cap) : NULL;
        if (bb) t->blk = bb;
        const bool bounds = tier == 0 && s->bounds;
        float *bd = bb && bounds ? qi_realloc(t->bound, sizeof *bd * 2 * (size_t)cap * QI_KV_PAGES_PER_BLOCK *
                                                            (size_t)s->wp->D)
                                 : NULL;
        if (bd) t->bound = bd;
        const bool kcols = tier == 0 ? s->kcols : s->off_kcols;
        uint16_t *kc = bb && kcols ? qi_realloc(t->kcol, sizeof *kc * (size_t)cap * QI_KV_BLOCK * (size_t)s->wp->D)
                                   : NULL;
        if (kc) t->kcol = kc;
        if (kc && tier == 0 && !t->vsum) t->vsum = qi_calloc((size_t)s->wp->D, sizeof *t->vsum);
        if (kcols && tier == 0 && !t->vsum) kc = NULL;
        if (!kb || !vb || !bb || (bounds && !bd) || (kcols && !kc))
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory growing a KV block table");
        t->cap_blocks = cap;
    }
    while (t->n_blocks < need) {
        qi_kv_pool *p = pool_of(s, tier, t->n_blocks);
        qi_buf *b = NULL;
        qi_status st = block_get(p, tier, &b, err);
        if (st) return st;
        uint16_t *k = qi_buf_ptr(p->dev, qi_view_of(b, 0), p->u.block_bytes, err);
        QI_ASSERT(k); /* the pool's own buffer */
        t->blk[t->n_blocks] = b;
        t->k_blk[t->n_blocks] = k;
        t->v_blk[t->n_blocks] = k + (size_t)QI_KV_BLOCK * p->D;
        t->n_blocks++;
    }
    return QI_OK;
}

/* Give back blocks past what t->n tokens need. */
static void tier_trim(const qi_kv_stream *s, int tier, qi_kv_tier *t) {
    const int need = (t->n + QI_KV_BLOCK - 1) / QI_KV_BLOCK;
    while (t->n_blocks > need) {
        t->n_blocks--;
        block_put(pool_of(s, tier, t->n_blocks), tier, t->blk[t->n_blocks]);
    }
}

qi_status qi_kv_stream_slot(qi_kv_stream *s, int32_t pos, int *slot, uint16_t **k_row, uint16_t **v_row,
                            qi_err *err) {
    qi_kv_tier *t = &s->work;
    const int D = s->wp->D;
    int i = t->n;
    if (s->ring > 0 && t->n == s->ring) {
        i = pos % s->ring;
    } else {
        qi_status st = tier_reserve(s, 0, t->n + 1, 0, err);
        if (st) return st;
        t->n++;
    }
    *slot = i;
    *k_row = qi_kv_k_row(t, i, D);
    *v_row = qi_kv_v_row(t, i, D);
    t->pos[i] = pos;
    t->score[i] = 0.0f;
    return QI_OK;
}

void qi_kv_stream_keep_bounds(qi_kv_stream *s) {
    QI_ASSERT(s->work.n == 0 && s->work.cap_blocks == 0 && !s->sp && qi_dev_info_get(s->wp->dev)->host_visible);
    s->bounds = true;
}

void qi_kv_stream_keep_kcols(qi_kv_stream *s) {
    QI_ASSERT(s->work.n == 0 && s->work.cap_blocks == 0 && !s->sp && qi_dev_info_get(s->wp->dev)->host_visible);
    s->kcols = true;
}

/* The key columns of t's slots i0..end-1 from their rows (a block's columns
 * zeroed when its first slot is written). */
static void tier_kcols(const qi_kv_tier *t, int D, int i0, int end) {
    for (int i = i0 < 0 ? 0 : i0; i < end; i++) {
        uint16_t *c = t->kcol + (size_t)(i >> QI_KV_BLOCK_SHIFT) * D * QI_KV_BLOCK;
        if ((i & (QI_KV_BLOCK - 1)) == 0) memset(c, 0, sizeof *c * (size_t)D * QI_KV_BLOCK);
        const uint16_t *k = qi_kv_k_row(t, i, D);
        c += i & (QI_KV_BLOCK - 1);
        for (int d = 0; d < D; d++) c[(size_t)d * QI_KV_BLOCK] = k[d];
    }
}

/* The working tier's key columns of slots i0..n-1, and their values added
 * to the sum (restarted when i0 <= 0). */
static void kcols_from(qi_kv_stream *s, int i0) {
    const qi_kv_tier *t = &s->work;
    const int D = s->wp->D;
    if (i0 <= 0 && t->vsum) memset(t->vsum, 0, sizeof *t->vsum * (size_t)D);
    for (int i = i0 < 0 ? 0 : i0; i < t->n; i++) {
        const uint16_t *v = qi_kv_v_row(t, i, D);
        for (int d = 0; d < D; d++) t->vsum[d] += qi_fp16_to_f32(v[d]);
    }
    tier_kcols(t, D, i0, t->n);
}

void qi_kv_stream_keep_off_kcols(qi_kv_stream *s) {
    QI_ASSERT(s->off.n == 0 && s->off.cap_blocks == 0 && qi_dev_info_get(s->op->dev)->host_visible);
    s->off_kcols = true;
}

const uint16_t *qi_kv_stream_off_kcols(qi_kv_stream *s, int *n_cols) {
    qi_kv_tier *t = &s->off;
    QI_ASSERT(s->off_kcols);
    const int full = t->n & ~(QI_KV_BLOCK - 1);
    if (t->kcol_n < full) tier_kcols(t, s->op->D, t->kcol_n, full); /* rows moved in from kcol_n on */
    t->kcol_n = full;
    *n_cols = full;
    return t->kcol;
}

void qi_kv_stream_bounds_from(qi_kv_stream *s, int i0) {
    if (s->kcols) kcols_from(s, i0);
    if (!s->bounds) return;
    const qi_kv_tier *t = &s->work;
    const int D = s->wp->D;
    for (int i = i0 < 0 ? 0 : i0; i < t->n; i++) {
        float *mn = t->bound + (size_t)(i >> QI_KV_PAGE_SHIFT) * 2 * D, *mx = mn + D;
        const uint16_t *k = qi_kv_k_row(t, i, D);
        if ((i & (QI_KV_PAGE - 1)) == 0) {
            for (int d = 0; d < D; d++) mn[d] = mx[d] = qi_fp16_to_f32(k[d]);
            continue;
        }
        for (int d = 0; d < D; d++) {
            const float x = qi_fp16_to_f32(k[d]);
            if (x < mn[d]) mn[d] = x;
            if (x > mx[d]) mx[d] = x;
        }
    }
}

qi_backend *qi_kv_split_stream(const qi_kv_stream *s) {
    QI_ASSERT(s->sp);
    return qi_dev_copy_stream(s->wp->dev, s->sp->dev);
}

qi_status qi_kv_stream_split(qi_kv_stream *s, int n_new, float r, int *moved, qi_err *err) {
    QI_ASSERT(s->sp && r >= 0.0f && r <= 1.0f);
    qi_kv_tier *t = &s->work;
    *moved = 0;
    int n = t->n + n_new;
    if (s->ring > 0 && n > s->ring) n = s->ring;
    const int nb = (n + QI_KV_BLOCK - 1) / QI_KV_BLOCK;
    const int lo = (int)floor((1.0 - (double)r) * nb + 0.5);
    if (lo <= s->lo_blocks) return QI_OK;
    /* the table must hold the blocks the new tokens will need */
    qi_status st = tier_reserve(s, 0, t->n, nb, err);
    if (st) return st;
    qi_backend *cs = qi_kv_split_stream(s);
    if (!cs)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "no stream copies KV blocks from %s to %s (neither is host-visible)",
                      qi_dev_info_get(s->sp->dev)->name, qi_dev_info_get(s->wp->dev)->name);
    while (s->lo_blocks < lo) {
        const int b = s->lo_blocks;
        if (b < t->n_blocks) {
            qi_buf *nbuf = NULL;
            if ((st = block_get(s->wp, 0, &nbuf, err))) return st;
            if ((st = qi_dev_copy(cs, qi_view_of(nbuf, 0), qi_view_of(t->blk[b], 0), s->wp->u.block_bytes, err))) {
                block_put(s->wp, 0, nbuf);
                return st;
            }
            block_put(s->sp, 0, t->blk[b]);
            uint16_t *k = qi_buf_ptr(s->wp->dev, qi_view_of(nbuf, 0), s->wp->u.block_bytes, err);
            QI_ASSERT(k);
            t->blk[b] = nbuf;
            t->k_blk[b] = k;
            t->v_blk[b] = k + (size_t)QI_KV_BLOCK * s->wp->D;
            (*moved)++;
        }
        s->lo_blocks++;
    }
    return QI_OK;
}

long qi_kv_pool_n_free(const qi_kv_pool *p) { return p->n_free; }

void qi_kv_pool_trim(qi_kv_pool *p) {
    for (long i = 0; i < p->n_free; i++) qi_buf_free(p->free_list[i]);
    p->n_free = 0;
}

/* Block b's rows into buffer nb of pool `to`, from pool `from`. */
static qi_status block_copy(qi_kv_pool *to, qi_buf *nb, qi_kv_pool *from, qi_buf *ob, qi_err *err) {
    const size_t n = to->u.block_bytes;
    if (qi_dev_info_get(to->dev)->host_visible && qi_dev_info_get(from->dev)->host_visible) {
        void *d = qi_buf_ptr(to->dev, qi_view_of(nb, 0), n, err), *src = qi_buf_ptr(from->dev, qi_view_of(ob, 0), n, err);
        QI_ASSERT(d && src); /* the pools' own buffers */
        memcpy(d, src, n);
        return QI_OK;
    }
    qi_backend *cs = qi_dev_copy_stream(to->dev, from->dev);
    if (!cs)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "no stream copies KV blocks from %s to %s (neither is host-visible)",
                      qi_dev_info_get(from->dev)->name, qi_dev_info_get(to->dev)->name);
    return qi_dev_copy(cs, qi_view_of(nb, 0), qi_view_of(ob, 0), n, err);
}

static void set_block(qi_kv_tier *t, int b, qi_kv_pool *p, qi_buf *buf) {
    uint16_t *k = qi_buf_ptr(p->dev, qi_view_of(buf, 0), p->u.block_bytes, NULL);
    QI_ASSERT(k);
    t->blk[b] = buf;
    t->k_blk[b] = k;
    t->v_blk[b] = k + (size_t)QI_KV_BLOCK * p->D;
}

qi_status qi_kv_stream_rehome(qi_kv_stream *s, qi_kv_pool *wp, qi_kv_pool *sp, float r, qi_kv_rehome *u,
                              int *moved, qi_err *err) {
    QI_ASSERT(r >= 0.0f && r <= 1.0f && wp->D == s->wp->D && (!sp || sp->D == wp->D));
    qi_kv_tier *t = &s->work;
    *u = (qi_kv_rehome){.wp = s->wp, .sp = s->sp, .lo_blocks = s->lo_blocks};
    *moved = 0;
    const int nb = t->n_blocks;
    const int lo = sp ? (int)floor((1.0 - (double)r) * nb + 0.5) : 0;
    if (nb > 0) {
        u->idx = qi_malloc(sizeof *u->idx * (size_t)nb);
        u->old = qi_malloc(sizeof *u->old * (size_t)nb);
        u->old_pool = qi_malloc(sizeof *u->old_pool * (size_t)nb);
        u->new_pool = qi_malloc(sizeof *u->new_pool * (size_t)nb);
        if (!u->idx || !u->old || !u->old_pool || !u->new_pool) {
            qi_kv_rehome_undo(s, u);
            return QI_ERR(err, QI_ERR_NOMEM, "out of memory moving a KV stream of %d blocks", nb);
        }
    }
    for (int b = 0; b < nb; b++) {
        qi_kv_pool *from = pool_of(s, 0, b), *to = sp && b >= lo ? sp : wp;
        if (from == to) continue;
        qi_buf *nbuf = NULL;
        qi_status st = block_get(to, 0, &nbuf, err);
        if (!st && (st = block_copy(to, nbuf, from, t->blk[b], err))) block_put(to, 0, nbuf);
        if (st) {
            qi_kv_rehome_undo(s, u);
            *moved = 0;
            return st;
        }
        u->idx[u->n] = b;
        u->old[u->n] = t->blk[b];
        u->old_pool[u->n] = from;
        u->new_pool[u->n] = to;
        u->n++;
        set_block(t, b, to, nbuf);
    }
    /* pool_of reads the pools and the share: set once every block has
     * been looked up under the old ones */
    s->wp = wp;
    s->sp = sp;
    s->lo_blocks = sp ? lo : 0;
    *moved = u->n;
    return QI_OK;
}

static void rehome_free(qi_kv_rehome *u) {
    qi_free(u->idx);
    qi_free(u->old);
    qi_free(u->old_pool);
    qi_free(u->new_pool);
    memset(u, 0, sizeof *u);
}

void qi_kv_rehome_commit(qi_kv_rehome *u) {
    for (int i = 0; i < u->n; i++) block_put(u->old_pool[i], 0, u->old[i]);
    rehome_free(u);
}

void qi_kv_rehome_undo(qi_kv_stream *s, qi_kv_rehome *u) {
    qi_kv_tier *t = &s->work;
    for (int i = 0; i < u->n; i++) {
        const int b = u->idx[i];
        block_put(u->new_pool[i], 0, t->blk[b]);
        set_block(t, b, u->old_pool[i], u->old[i]);
    }
    if (u->wp) {
        s->wp = u->wp;
        s->sp = u->sp;
        s->lo_blocks = u->lo_blocks;
    }
    rehome_free(u);
}

/* Moving tokens' rows between tiers or within one: a memcpy between host
 * blocks, else a copy queued on the stream that orders it (the device's:
 * a device's working tier and the host's offload tier). The first failure
 * sticks in st; positions and scores are the host's. */
typedef struct {
    int D;
    qi_backend *cs; /* NULL: both sides host memory */
    qi_status st;
    qi_err *err;
} mover;

static mover mover_of(const qi_kv_pool *from, const qi_kv_pool *to, qi_err *err) {
    const bool host = qi_dev_info_get(from->dev)->host_visible && qi_dev_info_get(to->dev)->host_visible;
    return (mover){.D = from->D, .cs = host ? NULL : qi_dev_copy_stream(to->dev, from->dev), .err = err};
}

static void copy_token(mover *mv, const qi_kv_tier *from, int i, qi_kv_tier *to, int j) {
    const int D = mv->D;
    if (j < to->kcol_n) to->kcol_n = j; /* columns kept on demand (the offload tier's) are stale from j */
    to->pos[j] = from->pos[i];
    to->score[j] = from->score[i];
    if (!mv->cs) {
        memcpy(qi_kv_k_row(to, j, D), qi_kv_k_row(from, i, D), sizeof(uint16_t) * (size_t)D);
        memcpy(qi_kv_v_row(to, j, D), qi_kv_v_row(from, i, D), sizeof(uint16_t) * (size_t)D);
        return;
    }
    const size_t row = sizeof(uint16_t) * (size_t)D, half = row * QI_KV_BLOCK;
    const size_t oi = (size_t)(i & (QI_KV_BLOCK - 1)) * row, oj = (size_t)(j & (QI_KV_BLOCK - 1)) * row;
    qi_buf *bi = from->blk[i >> QI_KV_BLOCK_SHIFT], *bj = to->blk[j >> QI_KV_BLOCK_SHIFT];
    if (!mv->st) mv->st = qi_dev_copy(mv->cs, qi_view_of(bj, oj), qi_view_of(bi, oi), row, mv->err);
    if (!mv->st) mv->st = qi_dev_copy(mv->cs, qi_view_of(bj, half + oj), qi_view_of(bi, half + oi), row, mv->err);
}

/* Remove the tokens i < n0 for which fate[i] != want by moving the last
 * survivors into the holes; tokens from n0 on always stay. */
static void tier_compact(mover *mv, qi_kv_tier *t, int n0, const uint8_t *fate, uint8_t want) {
    int lo = 0, hi = t->n - 1;
#define HOLE(i) ((i) < n0 && fate[i] != want)
    for (;;) {
        while (lo <= hi && !HOLE(lo)) lo++;
        while (hi >= lo && HOLE(hi)) hi--;
        if (lo > hi) break;
        copy_token(mv, t, hi, t, lo);
        lo++;
        hi--;
    }
#undef HOLE
    t->n = lo;
}

qi_status qi_kv_stream_apply(qi_kv_stream *s, const uint8_t *fate, qi_err *err) {
    QI_ASSERT(!s->sp && qi_dev_info_get(s->op->dev)->host_visible);
    const int nw = s->work.n, no = s->off.n;
    int n_off = 0, n_rec = 0;
    for (int i = 0; i < nw; i++) n_off += fate[i] == QI_KV_OFFLOAD;
    for (int j = 0; j < no; j++) n_rec += fate[nw + j] == QI_KV_KEEP;
    /* Reserve first, so a failure leaves the stream as it was. */
    qi_status st;
    if ((st = tier_reserve(s, 1, no + n_off, 0, err))) return st;
    if ((st = tier_reserve(s, 0, nw + n_rec, 0, err))) return st;
    mover out = mover_of(s->wp, s->op, err), back = mover_of(s->op, s->wp, err), work = mover_of(s->wp, s->wp, err),
          off = mover_of(s->op, s->op, err);
    for (int i = 0; i < nw; i++)
        if (fate[i] == QI_KV_OFFLOAD) copy_token(&out, &s->work, i, &s->off, s->off.n++);
    for (int j = 0; j < no; j++)
        if (fate[nw + j] == QI_KV_KEEP) copy_token(&back, &s->off, j, &s->work, s->work.n++);
    tier_compact(&work, &s->work, nw, fate, QI_KV_KEEP);
    /* The offload tier is compacted by the host: the device's copies from
     * and into it must have run first. */
    if (out.cs && (n_off > 0 || n_rec > 0)) {
        qi_event *ev = NULL;
        if ((st = qi_event_record(out.cs, &ev, err))) return st;
        qi_event_sync(ev);
        qi_event_free(ev);
    }
    tier_compact(&off, &s->off, no, fate + nw, QI_KV_OFFLOAD);
    if ((st = out.st ? out.st : back.st ? back.st : work.st ? work.st : off.st)) return st;
    tier_trim(s, 0, &s->work);
    tier_trim(s, 1, &s->off);
    qi_kv_stream_bounds_from(s, 0); /* rows moved into holes and recalled ones appended */
    return QI_OK;
}

/* Swapping copies token by token through the movers of apply: a working
 * tier's blocks are not whole blocks of the offload tier once a policy has
 * offloaded tokens there, and the rows keep their slots either way. */

/* The copies queued on a device's stream done before any block they touch
 * goes back to its pool, and a failure met inside the stream reported here,
 * so a swap that lost rows fails instead of the next step. Swaps run
 * between steps, when nothing else is queued there. The first failure wins. */
static qi_status swap_wait(mover *mv, bool any, qi_err *err) {
    if (!mv->cs || !any) return mv->st;
    qi_err e = {0};
    const qi_status st = qi_dev_synchronize(mv->cs, &e);
    if (mv->st) return mv->st;
    if (st && err) *err = e;
    return st;
}

static qi_status swap_check(const qi_kv_stream *s, qi_err *err) {
    if (s->sp) return QI_ERR(err, QI_ERR_UNSUPPORTED, "a stream split across two devices is not swapped");
    const bool host = qi_dev_info_get(s->wp->dev)->host_visible;
    if (!qi_dev_info_get(s->op->dev)->host_visible || (!host && !qi_dev_copy_stream(s->op->dev, s->wp->dev)))
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "no stream copies KV rows from %s to the host",
                      qi_dev_info_get(s->wp->dev)->name);
    return QI_OK;
}

qi_status qi_kv_stream_swap_out(qi_kv_stream *s, qi_err *err) {
    if (s->swapped) return QI_ERR(err, QI_ERR_INVALID, "KV stream swapped out already");
    qi_status st = swap_check(s, err);
    if (st) return st;
    const int nw = s->work.n, no = s->off.n;
    if ((st = tier_reserve(s, 1, no + nw, 0, err))) {
        tier_trim(s, 1, &s->off);
        return st;
    }
    mover out = mover_of(s->wp, s->op, err);
    for (int i = 0; i < nw; i++) copy_token(&out, &s->work, i, &s->off, no + i);
    if ((st = swap_wait(&out, nw > 0, err))) {
        tier_trim(s, 1, &s->off);
        return st;
    }
    s->off.n = no + nw;
    s->work.n = 0;
    tier_trim(s, 0, &s->work);
    s->n_swapped = nw;
    s->swapped = true;
    return QI_OK;
}

qi_status qi_kv_stream_swap_in(qi_kv_stream *s, qi_err *err) {
    if (!s->swapped || s->work.n != 0) return QI_ERR(err, QI_ERR_INVALID, "KV stream not swapped out");
    qi_status st = swap_check(s, err);
    if (st) return st;
    const int n = s->n_swapped, no = s->off.n - n;
    if ((st = tier_reserve(s, 0, n, 0, err))) {
        tier_trim(s, 0, &s->work);
        return st;
    }
    mover back = mover_of(s->op, s->wp, err);
    for (int i = 0; i < n; i++) copy_token(&back, &s->off, no + i, &s->work, i);
    if ((st = swap_wait(&back, n > 0, err))) {
        tier_trim(s, 0, &s->work);
        return st;
    }
    s->work.n = n;
    s->off.n = no;
    tier_trim(s, 1, &s->off);
    qi_kv_stream_bounds_from(s, 0);
    s->n_swapped = 0;
    s->swapped = false;
    return QI_OK;
}
