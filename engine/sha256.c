/* sha256.c - SHA-256 (FIPS 180-4), used to verify cached model files.
 * Portable C, and on x86 CPUs with the SHA extensions (CPUID says so at
 * run time) the same compression function in their instructions, about
 * ten times faster: hashing a 100 MB model then takes some 50 ms instead
 * of half a second, which is why it can run on every load (the CLI, Lua
 * and serve tests load the cached models by name hundreds of times). */
#include "sha256.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define QI_SHA_NI 1
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(qi_sha256 *s, const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d;
    s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

#ifdef QI_SHA_NI
/* n blocks of 64 bytes through the SHA-NI rounds: the state held as ABEF
 * and CDGH, four rounds per step, the message schedule four words at a
 * time (w[t] = s1(w[t-2]) + w[t-7] + s0(w[t-15]) + w[t-16]). */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_ni(uint32_t st[8], const uint8_t *p, size_t n) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bull, 0x0405060700010203ull);
    __m128i t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&st[0]), 0xB1); /* CDAB */
    __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&st[4]), 0x1B); /* EFGH */
    __m128i s0 = _mm_alignr_epi8(t, s1, 8);                                         /* ABEF */
    s1 = _mm_blend_epi16(s1, t, 0xF0);                                               /* CDGH */
    for (; n > 0; n--, p += 64) {
        const __m128i abef = s0, cdgh = s1;
        __m128i w[4];
        for (int i = 0; i < 16; i++) {
            __m128i m;
            if (i < 4) {
                m = w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
            } else {
                /* w[i & 3] holds group i-4 here; groups i-3, i-2, i-1 are the others */
                __m128i x = _mm_sha256msg1_epu32(w[i & 3], w[(i - 3) & 3]);
                x = _mm_add_epi32(x, _mm_alignr_epi8(w[(i - 1) & 3], w[(i - 2) & 3], 4));
                m = w[i & 3] = _mm_sha256msg2_epu32(x, w[(i - 1) & 3]);
            }
            m = _mm_add_epi32(m, _mm_loadu_si128((const __m128i *)&K[4 * i]));
            s1 = _mm_sha256rnds2_epu32(s1, s0, m);
            s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E));
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    t = _mm_shuffle_epi32(s0, 0x1B);                                            /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);                                           /* DCHG */
    _mm_storeu_si128((__m128i *)&st[0], _mm_blend_epi16(t, s1, 0xF0));          /* DCBA */
    _mm_storeu_si128((__m128i *)&st[4], _mm_alignr_epi8(s1, t, 8));             /* HGFE */
}

static int have_sha_ni(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 29) & 1; /* CPUID.(EAX=7,ECX=0):EBX.SHA */
}
#endif

/* -1: not yet decided; 0: portable; 1: SHA-NI */
static int g_ni = -1;

void qi_sha256_set_portable(int portable) {
#ifdef QI_SHA_NI
    __atomic_store_n(&g_ni, portable ? 0 : have_sha_ni(), __ATOMIC_RELAXED);
#else
    (void)portable;
    __atomic_store_n(&g_ni, 0, __ATOMIC_RELAXED);
#endif
}

int qi_sha256_accelerated(void) {
    int ni = __atomic_load_n(&g_ni, __ATOMIC_RELAXED);
    if (ni < 0) {
        qi_sha256_set_portable(0);
        ni = __atomic_load_n(&g_ni, __ATOMIC_RELAXED);
    }
    return ni;
}

static void blocks(qi_sha256 *s, const uint8_t *p, size_t n) {
#ifdef QI_SHA_NI
    if (qi_sha256_accelerated()) {
        blocks_ni(s->h, p, n);
        return;
    }
#endif
    for (; n > 0; n--, p += 64) block(s, p);
}

void qi_sha256_init(qi_sha256 *s) {
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, H0, sizeof H0);
    s->len = 0;
    s->n = 0;
}

void qi_sha256_update(qi_sha256 *s, const void *data, size_t len) {
    const uint8_t *p = data;
    s->len += len;
    if (s->n) {
        size_t take = 64 - s->n < len ? 64 - s->n : len;
        memcpy(s->buf + s->n, p, take);
        s->n += take;
        p += take;
        len -= take;
        if (s->n < 64) return;
        blocks(s, s->buf, 1);
        s->n = 0;
    }
    blocks(s, p, len / 64);
    p += len / 64 * 64;
    len %= 64;
    memcpy(s->buf, p, len);
    s->n = len;
}

void qi_sha256_final(qi_sha256 *s, char hex[65]) {
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80, zero = 0, lenb[8];
    qi_sha256_update(s, &pad, 1);
    while (s->n != 56) qi_sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    qi_sha256_update(s, lenb, 8);
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", s->h[i]);
}

qi_status qi_sha256_file(const char *path, char hex[65], qi_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return QI_ERR(err, QI_ERR_IO, "%s: cannot open for hashing", path);
    qi_sha256 s;
    qi_sha256_init(&s);
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) qi_sha256_update(&s, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) return QI_ERR(err, QI_ERR_IO, "%s: read error while hashing", path);
    qi_sha256_final(&s, hex);
    return QI_OK;
}
