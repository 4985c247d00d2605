/* kernels_amx.c - the K-quant matmuls of T >= 8 tokens (gemm_wide) on AMX
 * tiles, bit-identical to the tiled references.
 *
 * The tiled order (qi_k_dot_q4_K_tiled_ref, qi_k_dot_q6_K_tiled_ref) adds
 * floats only once per (row, token, super-block), on exact integers: s1 =
 * sum over sub-blocks of scale * (the sub-block's integer dot), for q4_K
 * also s2 = sum of mins * activation sums. So any instructions that give
 * the sub-blocks' integer dots exactly give the same floats. Here one
 * TDPBUSD makes the integer dots of one sub-block (32 elements for q4_K, 16
 * for q6_K) for 16 weight rows x 16 tokens at once: the tile A holds the
 * 16 rows' codes (unsigned, q6_K's with its +32 kept, as kernels_avx512.c
 * does), the tile B the 16 tokens' quants, four consecutive elements of a
 * token per dword. The scales then multiply the 16x16 int32 results
 * (vpmulld, token lanes), and the epilogue is the AVX-512 tiled path's:
 * the min (q4_K) or -32 (q6_K) terms from the activation sums in token
 * lanes (kacts), then the reference's float operations once per lane.
 *
 * Per call the activations are laid out for B once per chunk of KC
 * super-blocks (a transpose of each token's dwords), and each 16-row group
 * of weights is unpacked once per super-block for all the call's tokens
 * (up to 32, two B tiles). Rows past n_w and tokens past n_a are zero
 * codes and quants and are not stored. The running float sums stay in
 * registers within a chunk and in y between chunks (a float's round trip
 * through memory is exact), so every lane sums its super-blocks in order.
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

#define KC 12    /* super-blocks per chunk: the activations' B layout of a chunk is 96 KiB */
#define TPC 2    /* token tiles per call pass (32 tokens) */
#define TR 16    /* weight rows per tile */

/* The tile configuration (palette 1): tile 0 the weights' codes (16 rows
 * of sub bytes), tiles 1-2 two token tiles' quants (sub / 4 rows of 16
 * dwords), tiles 3-4 their 16x16 int32 dots. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

AT static void tiles_on(int sub) {
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = TR, c.colsb[0] = (uint16_t)sub;
    for (int t = 1; t <= 2; t++) c.rows[t] = (uint8_t)(sub / 4), c.colsb[t] = 64;
    for (int t = 3; t <= 4; t++) c.rows[t] = TR, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* One token tile's quants of a chunk as B: dword g of super-block kb of
 * token j at bq[(kb * 64 + g) * 16 + j]; the rows of sub-block s's tile
 * are dwords s * sub / 4 .. (s + 1) * sub / 4 - 1 of each token. */
static void b_layout(uint32_t *bq, const qi_block_q8_K *const *ya, int nt, int64_t b0, int kc) {
    for (int kb = 0; kb < kc; kb++)
        for (int g = 0; g < 64; g++) {
            uint32_t *o = bq + ((size_t)kb * 64 + (size_t)g) * 16;
            for (int j = 0; j < nt; j++) memcpy(&o[j], ya[j][b0 + kb].qs + 4 * g, 4);
            for (int j = nt; j < 16; j++) o[j] = 0;
        }
}

/* The weight side of one super-block of a 16-row group: codes[r][256] in
 * element order, each row's sub-block scales (int32) and, for q4_K, its
 * mins (int16), d and dmin. Rows from nr on are zero codes. */
typedef struct {
    uint8_t codes[TR][256];
    int32_t sc[TR][16];
    int16_t sc16[TR][16]; /* q6_K's scales as int16, for the -32 term */
    int16_t mn[TR][8];
    float d[TR], dmin[TR];
} wside;

T5 static void unpack_rows(wside *ws, const char *w, size_t w_stride, int nr, int64_t b, int q4) {
    for (int r = 0; r < nr; r++) {
        const char *xr = w + (size_t)r * w_stride;
        kprep p;
        if (q4) {
            const qi_block_q4_K *x = (const qi_block_q4_K *)(const void *)xr + b;
            uint32_t u[4];
            q4_K_scales(x->scales, u);
            prep_q4_K(x, u, &p);
            for (int s = 0; s < 8; s++) {
                ws->sc[r][s] = (int32_t)((u[s / 4] >> (8 * (s % 4))) & 0xff);
                ws->mn[r][s] = (int16_t)((u[2 + s / 4] >> (8 * (s % 4))) & 0xff);
            }
            ws->d[r] = h2f(x->d);
            ws->dmin[r] = h2f(x->dmin);
        } else {
            const qi_block_q6_K *x = (const qi_block_q6_K *)(const void *)xr + b;
            prep_q6_K(x, &p);
            for (int s = 0; s < 16; s++) ws->sc[r][s] = ws->sc16[r][s] = x->scales[s];
            ws->d[r] = h2f(x->d);
        }
        for (int j = 0; j < 4; j++) _mm512_storeu_si512(ws->codes[r] + 64 * j, p.q[j]);
    }
    if (nr < TR) memset(ws->codes[nr], 0, (size_t)(TR - nr) * 256);
}

AT static inline __attribute__((always_inline)) void gemm_k_amx(int64_t n, const void *w, size_t w_stride,
                                                                int n_w, const void *a, size_t a_stride,
                                                                int n_a, float *y, size_t y_stride, int q4) {
    const int64_t nb = n / 256;
    const int sub = q4 ? 32 : 16, ns = 256 / sub;
    uint32_t bq[TPC][KC * 64 * 16];
    kacts ka[TPC];
    wside ws;
    int32_t cb[TPC][16][TR * 16]; /* [tile][sub-block][row * 16 + token] */
    tiles_on(sub);
    for (int t0 = 0; t0 < n_a; t0 += TPC * 16) {
        const int ntok = n_a - t0 < TPC * 16 ? n_a - t0 : TPC * 16;
        const int ntt = (ntok + 15) / 16;
        const qi_block_q8_K *ya[TPC * 16];
        for (int t = 0; t < ntok; t++) ya[t] = (const qi_block_q8_K *)((const char *)a + (size_t)(t0 + t) * a_stride);
        for (int64_t c0 = 0; c0 < nb; c0 += KC) {
            const int kc = nb - c0 < KC ? (int)(nb - c0) : KC;
            int nt[TPC];
            for (int tt = 0; tt < ntt; tt++) {
                nt[tt] = ntok - 16 * tt < 16 ? ntok - 16 * tt : 16;
                const qi_block_q8_K *yc[16];
                for (int j = 0; j < nt[tt]; j++) yc[j] = ya[16 * tt + j] + c0;
                kacts_fill(&ka[tt], kc, yc, nt[tt], q4);
                b_layout(bq[tt], ya + 16 * tt, nt[tt], c0, kc);
            }
            for (int r0 = 0; r0 < n_w; r0 += TR) {
                const int nr = n_w - r0 < TR ? n_w - r0 : TR;
                __m512 acc[TPC][TR];
                for (int tt = 0; tt < ntt; tt++)
                    for (int r = 0; r < TR; r++) {
                        float v[16] = {0};
                        if (c0 > 0 && r < nr)
                            for (int j = 0; j < nt[tt]; j++)
                                v[j] = y[(size_t)(t0 + 16 * tt + j) * y_stride + (size_t)(r0 + r)];
                        acc[tt][r] = _mm512_loadu_ps(v);
                    }
                for (int kb = 0; kb < kc; kb++) {
                    unpack_rows(&ws, (const char *)w + (size_t)r0 * w_stride, w_stride, nr, c0 + kb, q4);
                    for (int s = 0; s < ns; s++) {
                        _tile_loadd(0, ws.codes[0] + sub * s, 256);
                        _tile_loadd(1, bq[0] + ((size_t)kb * 64 + (size_t)(s * sub / 4)) * 16, 64);
                        _tile_zero(3);
                        _tile_dpbusd(3, 0, 1);
                        _tile_stored(3, cb[0][s], 64);
                        if (ntt > 1) {
                            _tile_loadd(2, bq[1] + ((size_t)kb * 64 + (size_t)(s * sub / 4)) * 16, 64);
                            _tile_zero(4);
                            _tile_dpbusd(4, 0, 2);
                            _tile_stored(4, cb[1][s], 64);
                        }
                    }
                    for (int tt = 0; tt < ntt; tt++)
                        for (int r = 0; r < nr; r++) {
                            __m512i s1 = _mm512_setzero_si512();
                            for (int s = 0; s < ns; s++)
                                s1 = _mm512_add_epi32(s1, _mm512_mullo_epi32(_mm512_loadu_si512(cb[tt][s] + 16 * r),
                                                                             _mm512_set1_epi32(ws.sc[r][s])));
                            __m512 rr;
                            if (q4) {
                                const __m512i s2 = kacts_dot(&ka[tt], kb, ws.mn[r], 4);
                                rr = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(ws.d[r]));
                                rr = _mm512_fmadd_ps(_mm512_set1_ps(-ws.dmin[r]), _mm512_cvtepi32_ps(s2), rr);
                            } else {
                                s1 = _mm512_sub_epi32(s1, _mm512_slli_epi32(kacts_dot(&ka[tt], kb, ws.sc16[r], 8), 5));
                                rr = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(ws.d[r]));
                            }
                            acc[tt][r] = _mm512_fmadd_ps(rr, ka[tt].d[kb], acc[tt][r]);
                        }
                }
                for (int tt = 0; tt < ntt; tt++)
                    for (int r = 0; r < nr; r++) {
                        float v[16];
                        _mm512_storeu_ps(v, acc[tt][r]);
                        for (int j = 0; j < nt[tt]; j++) y[(size_t)(t0 + 16 * tt + j) * y_stride + (size_t)(r0 + r)] = v[j];
                    }
            }
        }
    }
    _tile_release();
}

AT static void gemm_q4_K_amx(int64_t n, const void *w, size_t w_stride, int n_w, const void *a, size_t a_stride,
                             int n_a, float *y, size_t y_stride) {
    gemm_k_amx(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, 1);
}

AT static void gemm_q6_K_amx(int64_t n, const void *w, size_t w_stride, int n_w, const void *a, size_t a_stride,
                             int n_a, float *y, size_t y_stride) {
    gemm_k_amx(n, w, w_stride, n_w, a, a_stride, n_a, y, y_stride, 0);
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

#endif
