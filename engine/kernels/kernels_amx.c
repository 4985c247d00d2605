/* kernels_amx.c - the K-quant matmuls of T >= 8 tokens (gemm_wide) on AMX
 * tiles, bit-identical to the tiled references.
 *
 * The tiled order (qi_k_dot_q4_K_tiled_ref, qi_k_dot_q6_K_tiled_ref) adds
 * floats only once per (row, token, super-block), on exact integers: q4_K's
 * s1 = sum over sub-blocks of scale * (the sub-block's integer dot) and s2 =
 * sum of mins * activation sums, q6_K's s1 = sum of scale * (dot - 32 *
 * activation sum). Any instructions that give those integers exactly give
 * the same floats, and TDPBSSD gives a whole super-block's worth for 16
 * tokens x 16 weight rows at once if the scales are inside the weight
 * bytes. They are, in parts that keep every byte within int8:
 *   q4_K: a scale sc < 64 is lo + 8 hi with lo, hi < 8; code * lo and
 *         code * hi are at most 105; s1 = P_lo + 8 P_hi.
 *   q6_K: a scale sc in [-128, 127] is d0 + 8 d1 + 64 d2 with digits in
 *         [-3, 4]; (code - 32) * d is in [-128, 124]; s1 = P0 + 8 P1 + 64 P2,
 *         the -32 terms included.
 * where P is the tile product of those bytes with the activation quants
 * over the super-block's 256 elements (four 64-element K steps into one
 * int32 tile). s2 comes from the activations' 16-element sums as in
 * kernels_avx512.c, and the float epilogue is the reference's operations,
 * one lane per weight row.
 *
 * Tile A is 16 tokens' quants, read in place (row stride a_stride); tile B
 * a part of 16 weight rows in the VNNI layout (row k: dword k of each of
 * the 16 rows), made once per (16-row group, super-block) and used for all
 * the call's tokens, so a call should carry every token of the matmul
 * (the table's wide_block says so to the backend): the weights are then
 * read from memory once. C's row t is token t's 16 rows; their running
 * sums stay in a buffer of TB tokens until the group's last super-block
 * (a float's round trip through memory is exact).
 *
 * At a decode step's 16 tokens that unpacking costs more than the tile
 * products it feeds, so the weights can also be held unpacked: the packed
 * form (qi_k_amx_pack_group, the CPU backend's repack) is each (16-row
 * group, super-block)'s parts and per-row scales exactly as unpack_rows
 * makes them, and gemm_wide_packed reads them in place, prefetching the
 * next super-block. Same integers, same floats: bit-identical to
 * gemm_wide. It is 2.1 bytes a weight for q4_K, 3.1 for q6_K, against
 * 0.56 and 0.82, so it pays only where tokens share the read; the backend
 * keeps the rows for calls of fewer than QI_K_WIDE_MIN tokens.
 *
 * AMX needs the kernel's permission for the tile data state
 * (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), Linux 5.16+),
 * asked once per process; without AMX, or without the permission, the
 * table is absent and the AVX-512 one is used.
 */
#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels_avx512_k.h"

#define AT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))

#define TR 16     /* weight rows per tile (B's columns) */
#define NP_MAX 3  /* parts per super-block (q6_K) */
#define TB 512    /* tokens whose running sums a row group keeps (32 KiB) */
#ifndef ACT_BYTES
#define ACT_BYTES (1024 * 1024) /* activation quants per pass: about the L2 cache */
#endif

/* The tile configuration (palette 1): every tile 16 rows of 64 bytes;
 * tile 0 the tokens' quants, 1..np the weight parts, 4..3+np their dots. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

AT static void tiles_on(void) {
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* out[j] lane i = in[i] lane j: a 16x16 dword transpose. */
T5 static void transpose16(const __m512i in[16], __m512i out[16]) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    /* b[4i + k], 128-bit lane L: rows 4i..4i+3 of column 4L + k */
    for (int k = 0; k < 4; k++) {
        const __m512i d0 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x44), d1 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xee);
        const __m512i e0 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x44), e1 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xee);
        out[k] = _mm512_shuffle_i32x4(d0, e0, 0x88);
        out[4 + k] = _mm512_shuffle_i32x4(d0, e0, 0xdd);
        out[8 + k] = _mm512_shuffle_i32x4(d1, e1, 0x88);
        out[12 + k] = _mm512_shuffle_i32x4(d1, e1, 0xdd);
    }
}

/* The weight side of one super-block of a 16-row group: each part in the
 * VNNI layout (bq[p][k][r]: dword k of row r's part bytes, k < 64; 4 KiB a
 * part), then the tail: per row (one lane each) q4_K's mins as int16
 * pairs, d and -dmin. The packed form (qi_k_amx_pack_group) is these
 * blocks as they are, np parts each, one after another. */
#define PART_BYTES (64 * TR * 4)
typedef struct {
    __m512i mn[4];
    __m512 d, negdmin;
} wtail;
typedef struct {
    uint32_t bq[NP_MAX][64][TR];
    wtail t;
} wside;

/* Bytes of one packed super-block of a 16-row group: np parts and the tail. */
static size_t packed_block_bytes(int q4) { return (size_t)(q4 ? 2 : 3) * PART_BYTES + sizeof(wtail); }

/* q6_K's scale digit i in [-3, 4] (see the file comment). */
static inline int q6_digit(int sc, int i) {
    for (int k = 0; k < i; k++) sc = (sc - (((sc + 3) & 7) - 3)) / 8;
    return ((sc + 3) & 7) - 3;
}

/* The parts go to bq (part i at i * PART_BYTES), the tail to *tl. */
T5 static void unpack_rows(uint8_t *bq, wtail *tl, const char *w, size_t w_stride, int nr, int64_t b, int q4) {
    const int np = q4 ? 2 : 3;
    uint8_t part[NP_MAX][TR][256];
    float d[TR] = {0}, dmin[TR] = {0};
    uint32_t mn[4][TR] = {{0}};
    for (int r = 0; r < nr; r++) {
        const char *xr = w + (size_t)r * w_stride;
        kprep p;
        int16_t dg[NP_MAX][16]; /* digit of part i for 16-element group g (q4_K: 32-element halves repeat) */
        if (q4) {
            const qi_block_q4_K *x = (const qi_block_q4_K *)(const void *)xr + b;
            uint32_t u[4];
            q4_K_scales(x->scales, u);
            prep_q4_K(x, u, &p);
            for (int s = 0; s < 8; s++) {
                const int sc = (int)((u[s / 4] >> (8 * (s % 4))) & 0xff);
                dg[0][2 * s] = dg[0][2 * s + 1] = (int16_t)(sc & 7);
                dg[1][2 * s] = dg[1][2 * s + 1] = (int16_t)(sc >> 3);
            }
            for (int q = 0; q < 4; q++) {
                const uint32_t lo = (u[2 + (2 * q) / 4] >> (8 * ((2 * q) % 4))) & 0xff;
                const uint32_t hi = (u[2 + (2 * q + 1) / 4] >> (8 * ((2 * q + 1) % 4))) & 0xff;
                mn[q][r] = lo | hi << 16;
            }
            d[r] = h2f(x->d);
            dmin[r] = h2f(x->dmin);
        } else {
            const qi_block_q6_K *x = (const qi_block_q6_K *)(const void *)xr + b;
            prep_q6_K(x, &p);
            for (int g = 0; g < 16; g++)
                for (int i = 0; i < 3; i++) dg[i][g] = (int16_t)q6_digit(x->scales[g], i);
            d[r] = h2f(x->d);
        }
        uint8_t codes[256];
        for (int j = 0; j < 4; j++) _mm512_storeu_si512(codes + 64 * j, p.q[j]);
        const __m512i off = _mm512_set1_epi16(q4 ? 0 : 32);
        for (int g = 0; g < 8; g++) { /* 32 elements: 16-element groups 2g, 2g + 1 */
            const __m512i c = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(codes + 32 * g))), off);
            for (int i = 0; i < np; i++) {
                const __m512i dv = _mm512_inserti64x4(_mm512_set1_epi16(dg[i][2 * g]), _mm256_set1_epi16(dg[i][2 * g + 1]), 1);
                _mm256_storeu_si256((__m256i *)(part[i][r] + 32 * g), _mm512_cvtepi16_epi8(_mm512_mullo_epi16(c, dv)));
            }
        }
    }
    for (int i = 0; i < np; i++) {
        if (nr < TR) memset(part[i][nr], 0, (size_t)(TR - nr) * 256);
        for (int k0 = 0; k0 < 64; k0 += 16) {
            __m512i in[16], out[16];
            for (int r = 0; r < TR; r++) in[r] = _mm512_loadu_si512(part[i][r] + 4 * k0);
            transpose16(in, out);
            for (int k = 0; k < 16; k++) _mm512_storeu_si512(bq + (size_t)i * PART_BYTES + 64 * (k0 + k), out[k]);
        }
    }
    tl->d = _mm512_loadu_ps(d);
    tl->negdmin = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(dmin));
    for (int q = 0; q < 4; q++) tl->mn[q] = _mm512_loadu_si512(mn[q]);
}

/* q4_K's s2 for one token against the 16 rows: sum over sub-blocks s of
 * mn[s] * (bsums[2s] + bsums[2s + 1]), one row per lane. */
T5 static inline __m512i q4_s2(const wtail *ws, const int16_t *bsums) {
    const __m256i S = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(const void *)bsums), _mm256_set1_epi16(1));
    const __m128i S16 = _mm256_cvtepi32_epi16(S); /* |S| <= 2 * 16 * 127: int16 */
    uint32_t pr[4];
    _mm_storeu_si128((__m128i *)(void *)pr, S16);
    __m512i s2 = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++) s2 = _mm512_dpwssd_epi32(s2, ws->mn[q], _mm512_set1_epi32((int)pr[q]));
    return s2;
}

/* packed: w is the first packed 16-row group (w_stride its bytes), else
 * the rows as the model has them, unpacked here once per call. */
AT static inline __attribute__((always_inline)) void gemm_k_amx(int64_t n, const void *w, size_t w_stride,
                                                                int n_w, const void *a, size_t a_stride,
                                                                int n_a, float *y, size_t y_stride, int q4,
                                                                int packed) {
    const int64_t nb = n / 256;
    const int np = q4 ? 2 : 3;
    const size_t pbb = packed_block_bytes(q4);
    wside ws;
    int32_t cb[NP_MAX][16 * TR]; /* [part][token * 16 + row] */
    uint8_t pad[16 * 256];       /* a partial token tile's quants, zero-padded */
    float acc[TB * TR];          /* the running sums of a row group: [token][row] */
    tiles_on();
    /* tokens per pass over the rows: their quants (tb_n * n bytes), read
     * once per row group, kept within about ACT_BYTES */
    int tb_n = (int)(ACT_BYTES / n) / 16 * 16;
    tb_n = tb_n < 32 ? 32 : tb_n > TB ? TB : tb_n;
    for (int tb = 0; tb < n_a; tb += tb_n)
    for (int r0 = 0; r0 < n_w; r0 += TR) {
        const int nr = n_w - r0 < TR ? n_w - r0 : TR;
        const int na = n_a - tb < tb_n ? n_a - tb : tb_n;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *bq;
            const wtail *tl;
            if (packed) {
                bq = (const uint8_t *)w + (size_t)(r0 / TR) * w_stride + (size_t)b * pbb;
                tl = (const wtail *)(const void *)(bq + (size_t)np * PART_BYTES);
                if (b + 1 < nb)
                    for (size_t o = 0; o < pbb; o += 64) _mm_prefetch((const char *)bq + pbb + o, _MM_HINT_T0);
            } else {
                unpack_rows((uint8_t *)ws.bq, &ws.t, (const char *)w + (size_t)r0 * w_stride, w_stride, nr, b, q4);
                bq = (const uint8_t *)ws.bq;
                tl = &ws.t;
            }
            for (int t0 = tb; t0 < tb + na; t0 += 16) {
                const int nt = tb + na - t0 < 16 ? tb + na - t0 : 16;
                const qi_block_q8_K *y0 = (const qi_block_q8_K *)((const char *)a + (size_t)t0 * a_stride) + b;
                const void *qa = y0->qs;
                size_t qs_stride = a_stride;
                if (nt < 16) {
                    for (int t = 0; t < nt; t++) memcpy(pad + 256 * t, ((const qi_block_q8_K *)((const char *)y0 + (size_t)t * a_stride))->qs, 256);
                    memset(pad + 256 * nt, 0, (size_t)(16 - nt) * 256);
                    qa = pad;
                    qs_stride = 256;
                }
                _tile_zero(4);
                _tile_zero(5);
                if (np > 2) _tile_zero(6);
                for (int kk = 0; kk < 4; kk++) {
                    _tile_loadd(0, (const char *)qa + 64 * kk, qs_stride);
                    _tile_loadd(1, bq + 0 * PART_BYTES + 1024 * kk, 64);
                    _tile_dpbssd(4, 0, 1);
                    _tile_loadd(2, bq + 1 * PART_BYTES + 1024 * kk, 64);
                    _tile_dpbssd(5, 0, 2);
                    if (np > 2) {
                        _tile_loadd(3, bq + 2 * PART_BYTES + 1024 * kk, 64);
                        _tile_dpbssd(6, 0, 3);
                    }
                }
                _tile_stored(4, cb[0], 64);
                _tile_stored(5, cb[1], 64);
                if (np > 2) _tile_stored(6, cb[2], 64);
                for (int t = 0; t < nt; t++) {
                    const qi_block_q8_K *yb = (const qi_block_q8_K *)((const char *)y0 + (size_t)t * a_stride);
                    __m512i s1 = _mm512_add_epi32(_mm512_loadu_si512(cb[0] + 16 * t),
                                                  _mm512_slli_epi32(_mm512_loadu_si512(cb[1] + 16 * t), 3));
                    __m512 rr;
                    if (q4) {
                        rr = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), tl->d);
                        rr = _mm512_fmadd_ps(tl->negdmin, _mm512_cvtepi32_ps(q4_s2(tl, yb->bsums)), rr);
                    } else {
                        s1 = _mm512_add_epi32(s1, _mm512_slli_epi32(_mm512_loadu_si512(cb[2] + 16 * t), 6));
                        rr = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), tl->d);
                    }
                    float *at = acc + (size_t)(t0 - tb + t) * TR;
                    const __m512 sum = b == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(at);
                    _mm512_storeu_ps(at, _mm512_fmadd_ps(rr, _mm512_set1_ps(yb->d), sum));
                }
            }
        }
        for (int t = 0; t < na; t++)
            memcpy(y + (size_t)(tb + t) * y_stride + (size_t)r0, acc + (size_t)t * TR, sizeof(float) * (size_t)nr);
    }
    _tile_release();
}

#define DEFINE_GEMM_AMX(NAME, Q4, PACKED)                                                                   \
    AT static void NAME(int64_t n, const void *w, size_t w_stride, int n_w, const void *a, size_t a_stride,  \
                        int n_a, float *y, size_t y_stride) {                                                 \
        gemm_k_amx(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, Q4, PACKED);                          \
    }
DEFINE_GEMM_AMX(gemm_q4_K_amx, 1, 0)
DEFINE_GEMM_AMX(gemm_q6_K_amx, 0, 0)
DEFINE_GEMM_AMX(gemm_q4_K_amx_packed, 1, 1)
DEFINE_GEMM_AMX(gemm_q6_K_amx_packed, 0, 1)

/* ---- the packed form ------------------------------------------------------------------ */

uint64_t qi_k_amx_pack_group_bytes(uint32_t type, int64_t n) {
    if (type != QI_TYPE_Q4_K && type != QI_TYPE_Q6_K) return 0;
    return (uint64_t)(n / 256) * packed_block_bytes(type == QI_TYPE_Q4_K);
}

void qi_k_amx_pack_group(uint32_t type, int64_t n, const void *w, size_t w_stride, int n_rows, void *dst) {
    const int q4 = type == QI_TYPE_Q4_K;
    const size_t pbb = packed_block_bytes(q4);
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t *blk = (uint8_t *)dst + (size_t)b * pbb;
        wtail tl;
        unpack_rows(blk, &tl, w, w_stride, n_rows, b, q4);
        memcpy(blk + (size_t)(q4 ? 2 : 3) * PART_BYTES, &tl, sizeof tl);
    }
}

/* ---- the table ------------------------------------------------------------------------ */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static qi_kernels k_amx;
static const char *k_absent;
static pthread_once_t k_once = PTHREAD_ONCE_INIT;

static void build(void) {
    unsigned a, b, c, d;
    if (!qi_kernels_avx512()) {
        k_absent = "no AVX-512 (F, BW, VL, VNNI)";
        return;
    }
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) {
        k_absent = "the CPU lacks AMX-TILE/AMX-INT8 (CPUID.7.0:EDX bits 24, 25)";
        return;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        k_absent = "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM; Linux 5.16+)";
        return;
    }
    k_amx = *qi_kernels_avx512();
    k_amx.name = "amx";
    k_amx.gemm_wide[QI_TYPE_Q4_K] = gemm_q4_K_amx;
    k_amx.gemm_wide[QI_TYPE_Q6_K] = gemm_q6_K_amx;
    k_amx.gemm_wide_packed[QI_TYPE_Q4_K] = gemm_q4_K_amx_packed;
    k_amx.gemm_wide_packed[QI_TYPE_Q6_K] = gemm_q6_K_amx_packed;
    k_amx.wide_block = 512; /* a 512-token prompt's matmuls in one call per thread */
}

const qi_kernels *qi_kernels_amx(void) {
    pthread_once(&k_once, build);
    return k_absent ? NULL : &k_amx;
}

const char *qi_kernels_amx_absent(void) {
    pthread_once(&k_once, build);
    return k_absent;
}

#else

const qi_kernels *qi_kernels_amx(void) { return NULL; }
const char *qi_kernels_amx_absent(void) { return "not an x86-64 Linux build with GCC or clang"; }
uint64_t qi_k_amx_pack_group_bytes(uint32_t type, int64_t n) {
    (void)type;
    (void)n;
    return 0;
}
void qi_k_amx_pack_group(uint32_t type, int64_t n, const void *w, size_t w_stride, int n_rows, void *dst) {
    (void)type, (void)n, (void)w, (void)w_stride, (void)n_rows, (void)dst;
}

#endif
