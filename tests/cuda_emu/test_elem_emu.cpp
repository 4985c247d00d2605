/* test_elem_emu.cpp - k_elem.cu's kernels run on the host emulation
 * (run.sh) against the CPU reference: RMSNorm, RoPE (both layouts, part
 * of the head rotated, q and k), SwiGLU, kv_write, add, scale, softcap,
 * add_bias and gather_rows bit for bit, GeGLU within its fp16 table's tolerance.
 * Exit 0 when every check passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "cuda_runtime.h"
#include "backend/cuda/k_internal.h"
extern "C" {
#include "kernels/kernels.h"
#include "qinfer/quant.h"
}
float emu_h2f(uint16_t h) { return qi_fp16_to_f32(h); }
static long nfail, nchk;
#define CHK(c, ...) do { nchk++; if (!(c)) { if (nfail++ < 30) { printf("FAIL %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); } } } while (0)
static uint64_t rs = 88172645463325252ull;
static double rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (double)(rs >> 11) * 0x1p-53; }
static float rf(float a, float b) { return (float)(a + (b - a) * rnd()); }
static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static long nbits(const float *a, const float *b, long n) { long k = 0; for (long i = 0; i < n; i++) k += bits(a[i]) != bits(b[i]); return k; }
static double worst(const float *a, const float *b, long n) { double w = 0; for (long i = 0; i < n; i++) { double d = fabs((double)a[i] - b[i]) / (1e-6 + fabs(b[i])); if (d > w) w = d; } return w; }
int main() {
    qi_cuk_ctx c = {NULL, NULL, NULL, 0}; const char *what = NULL;
    /* rmsnorm, in place and not */
    { int T = 3, n = 700; std::vector<float> x(T * n), w(n), y(T * n), r(T * n);
      for (auto &v : x) v = rf(-30, 30);
      for (auto &v : w) v = rf(-2, 2);
      for (int t = 0; t < T; t++) { double s = 0; for (int i = 0; i < n; i++) s += (double)(x[t*n+i] * x[t*n+i]); const float sc = 1.0f / sqrtf((float)(s / n) + 1e-6f); for (int i = 0; i < n; i++) r[t*n+i] = (x[t*n+i] * sc) * w[i]; }
      CHK(qi_cuk_rmsnorm(&c, x.data(), w.data(), T, n, 1e-6f, y.data(), &what) == 0, "rmsnorm");
      printf("rmsnorm: %ld of %d bits differ, worst rel %.3g\n", nbits(y.data(), r.data(), T*n), T*n, worst(y.data(), r.data(), T*n));
      CHK(worst(y.data(), r.data(), T*n) < 1e-6, "rmsnorm values");
      qi_cuk_rmsnorm(&c, x.data(), w.data(), T, n, 1e-6f, x.data(), &what);
      CHK(nbits(x.data(), y.data(), T*n) == 0, "rmsnorm in place"); }
    /* rope: both modes, partial rotation, q and k, against qi_k_rope_ref with the CPU's angles */
    for (int neox = 0; neox < 2; neox++) for (int nr = 0; nr < 2; nr++) {
      int T = 3, Hq = 4, Hk = 2, D = 64, n_rot = nr ? (neox ? 40 : 22) : 64; /* 22: NORM's unfused tail */
      std::vector<float> q(T*Hq*D), k(T*Hk*D); for (auto &v : q) v = rf(-3,3); for (auto &v : k) v = rf(-3,3);
      std::vector<float> rq = q, rk = k; std::vector<int32_t> pos = {0, 17, 40000};
      float base = 10000.0f, fs = 0.5f, ts = powf(base, -2.0f / (float)n_rot); int np = n_rot / 2;
      for (int t = 0; t < T; t++) { float cs[512], sn[512], th = (float)pos[t]; for (int i = 0; i < np; i++) { float a = th * fs; cs[i] = cosf(a); sn[i] = sinf(a); th *= ts; }
        qi_k_rope_ref(rq.data() + t*Hq*D, Hq, D, np, neox, cs, sn); qi_k_rope_ref(rk.data() + t*Hk*D, Hk, D, np, neox, cs, sn); }
      CHK(qi_cuk_rope(&c, q.data(), Hq, k.data(), Hk, T, D, n_rot, pos.data(), base, fs, neox, &what) == 0, "rope");
      printf("rope neox=%d n_rot=%d: q %ld bits differ, k %ld\n", neox, n_rot, nbits(q.data(), rq.data(), q.size()), nbits(k.data(), rk.data(), k.size()));
      CHK(nbits(q.data(), rq.data(), q.size()) == 0 && nbits(k.data(), rk.data(), k.size()) == 0, "rope bits");
      /* k NULL: q alone, rotated once more */
      std::vector<float> kk = k;
      for (int t = 0; t < T; t++) { float cs[512], sn[512], th = (float)pos[t]; for (int i = 0; i < np; i++) { float a = th * fs; cs[i] = cosf(a); sn[i] = sinf(a); th *= ts; }
        qi_k_rope_ref(rq.data() + t*Hq*D, Hq, D, np, neox, cs, sn); }
      qi_cuk_rope(&c, q.data(), Hq, NULL, Hk, T, D, n_rot, pos.data(), base, fs, neox, &what);
      CHK(nbits(q.data(), rq.data(), q.size()) == 0 && nbits(k.data(), kk.data(), k.size()) == 0, "rope without k"); }
    /* glu */
    { int T = 2, n = 300 + 5; std::vector<float> g(T*n), u(T*n); for (auto &v : g) v = rf(-12, 12); for (auto &v : u) v = rf(-3, 3);
      std::vector<float> rg = g, gg = g, rgg = g; for (int t = 0; t < T; t++) qi_k_swiglu_ref(n, rg.data() + t*n, u.data() + t*n);
      qi_cuk_glu(&c, 0, g.data(), u.data(), T, n, &what); printf("swiglu: %ld bits differ\n", nbits(g.data(), rg.data(), T*n)); CHK(nbits(g.data(), rg.data(), T*n) == 0, "swiglu");
      qi_k_geglu_ref(T*n, rgg.data(), u.data()); qi_cuk_glu(&c, 1, gg.data(), u.data(), T, n, &what);
      double w = 0; for (int i = 0; i < T*n; i++) { double d = fabs(gg[i] - rgg[i]) / (fabs(u[i]) * (1e-3 + fabs(gg[i] / u[i]))); if (d > w) w = d; }
      printf("geglu: worst %.3g (relative to |g|)\n", w); CHK(w < 3e-3, "geglu"); }
    /* kv_write */
    { int n = 3, D = 70; std::vector<float> s(n*D); for (auto &v : s) v = rf(-70000, 70000) * (rnd() < 0.5 ? 1e-4f : 1.0f);
      std::vector<uint16_t> d(n*D), r(n*D); const float *src[3]; uint16_t *dst[3]; for (int i = 0; i < n; i++) { src[i] = s.data() + (2 - i) * D; dst[i] = d.data() + i * D; }
      qi_cuk_kv_write(&c, src, dst, n, D, &what); for (int i = 0; i < n; i++) qi_k_f32_to_f16_ref(src[i], r.data() + i*D, D);
      CHK(memcmp(d.data(), r.data(), 2*n*D) == 0, "kv_write"); printf("kv_write ok\n"); }
    /* add / scale / softcap */
    { long n = 1000; std::vector<float> x(n), y(n); for (auto &v : x) v = rf(-50, 50); for (auto &v : y) v = rf(-50, 50);
      std::vector<float> r = x;
      for (long i = 0; i < n; i++) r[i] += y[i];
      qi_cuk_add(&c, x.data(), y.data(), n, &what); CHK(nbits(x.data(), r.data(), n) == 0, "add");
      for (long i = 0; i < n; i++) r[i] *= 0.37f;
      qi_cuk_scale(&c, x.data(), n, 0.37f, &what); CHK(nbits(x.data(), r.data(), n) == 0, "scale");
      const float inv = 1.0f / 30.0f;
      for (long i = 0; i < n; i++) r[i] = tanhf(r[i] * inv) * 30.0f;
      qi_cuk_softcap(&c, x.data(), n, 30.0f, &what); CHK(nbits(x.data(), r.data(), n) == 0, "softcap"); printf("add/scale/softcap ok\n"); }
    /* add_bias: 7 rows of 143 */
    { int T = 7, n = 143; std::vector<float> x(T*n), bias(n); for (auto &v : x) v = rf(-50, 50); for (auto &v : bias) v = rf(-5, 5);
      std::vector<float> r = x; for (int t = 0; t < T; t++) for (int i = 0; i < n; i++) r[t*n + i] += bias[i];
      qi_cuk_add_bias(&c, x.data(), bias.data(), T, n, &what); CHK(nbits(x.data(), r.data(), T*n) == 0, "add_bias"); printf("add_bias ok\n"); }
    /* gather_rows */
    { int width = 33, N = 12; std::vector<float> x(N*width); for (auto &v : x) v = rf(-1, 1); std::vector<float> r = x;
      std::vector<int32_t> rows = {1, 2, 5, 6, 7, 11}; int n = (int)rows.size();
      for (int i = 0; i < n; i++) if (rows[i] != i) memmove(r.data() + i*width, r.data() + rows[i]*width, 4*width);
      std::vector<char> scr(qi_cuk_gather_scratch(n, width)); qi_cuk_ctx c2 = {NULL, NULL, scr.data(), scr.size()};
      CHK(qi_cuk_gather_rows(&c2, x.data(), rows.data(), n, width, &what) == 0, "gather");
      CHK(nbits(x.data(), r.data(), N*width) == 0, "gather_rows"); qi_cuk_ctx c3 = {NULL, NULL, scr.data(), scr.size() - 4}; what = NULL;
      CHK(qi_cuk_gather_rows(&c3, x.data(), rows.data(), n, width, &what) != 0 && what, "gather small scratch refused"); printf("gather_rows ok\n"); }
    printf("emulated elementwise: %ld checks, %ld failed\n", nchk, nfail);
    return nfail != 0;
}
