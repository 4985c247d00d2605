/* test_attn_emu.cpp - k_attn.cu's kernels run on the host emulation
 * (run.sh) against the CPU backend's attention (attp_one, restated on the
 * reference kernels of engine/kernels) in its three modes, and the merge
 * against the CPU's merge: outputs within fp32 summation tolerance,
 * statistics equal, the same bits run to run, partial results merged
 * equal to the whole. Exit 0 when every check passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>
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

struct Slot { int32_t pos; std::vector<uint16_t> k, v; };
/* one call's cache: per KV head a list of slots, packed in blocks */
struct Call {
    int Hkv, D, shift;
    std::vector<std::vector<Slot>> heads;
    std::vector<std::vector<uint16_t *>> kblk, vblk; /* host "device" memory */
    std::vector<std::vector<int32_t>> pos;
    std::vector<int> n_slots;
    void build() {
        int B = 1 << shift;
        kblk.assign(Hkv, {}); vblk.assign(Hkv, {}); pos.assign(Hkv, {}); n_slots.assign(Hkv, 0);
        for (int hk = 0; hk < Hkv; hk++) {
            int n = (int)heads[hk].size(); n_slots[hk] = n;
            for (int i = 0; i < n; i++) {
                if ((i & (B - 1)) == 0) { kblk[hk].push_back((uint16_t *)calloc((size_t)B * D, 2)); vblk[hk].push_back((uint16_t *)calloc((size_t)B * D, 2)); }
                memcpy(kblk[hk].back() + (size_t)(i & (B - 1)) * D, heads[hk][i].k.data(), 2 * D);
                memcpy(vblk[hk].back() + (size_t)(i & (B - 1)) * D, heads[hk][i].v.data(), 2 * D);
                pos[hk].push_back(heads[hk][i].pos);
            }
        }
    }
};

struct Args { int T, H, Hkv, D, n_swa, shift; float scale; const int32_t *q_pos; const float *q; float *out; float *stats; int stats_stride; float *part_m, *part_l; const float *tot_m, *tot_l; };

/* the CPU backend's attp_one, on the reference kernels */
static void ref_attn(const Call &c, const Args &a) {
    const qi_kernels *K = qi_kernels_ref();
    std::vector<float> s(100000); std::vector<uint16_t> w16(100000);
    for (int h = 0; h < a.H; h++) for (int t = 0; t < a.T; t++) {
        const int D = a.D, hk = h / (a.H / a.Hkv), B = 1 << a.shift;
        const qi_k_order ord = a.T >= 2 ? QI_K_ORD_GEMM : QI_K_ORD_VEC;
        const int32_t qpos = a.q_pos[t]; const int32_t *pos = c.pos[hk].data(); const long th = (long)t * a.H + h;
        int n = c.n_slots[hk];
        while (n > 0 && pos[n - 1] > qpos) n--;
        uint16_t q16[1024]; K->f32_to_f16(a.q + th * D, q16, D);
        for (int i0 = 0; i0 < n; i0 += B) K->attn_scores(ord, D, q16, c.kblk[hk][i0 >> a.shift], (size_t)D, n - i0 < B ? n - i0 : B, s.data() + i0);
        float mx = -INFINITY;
        for (int i = 0; i < n; i++) { s[i] *= a.scale; if (pos[i] > qpos || (a.n_swa > 0 && qpos - pos[i] >= a.n_swa)) s[i] = -INFINITY; mx = s[i] > mx ? s[i] : mx; }
        const uint16_t *const *vb = (const uint16_t *const *)c.vblk[hk].data();
        if (a.tot_m) {
            const float m = a.tot_m[th]; const double l = a.tot_l[th];
            if (!(l > 0.0)) continue;
            K->exp_sum(n, s.data(), m); const float inv = (float)(1.0 / l);
            for (int i = 0; i < n; i++) s[i] *= inv;
            K->f32_to_f16(s.data(), w16.data(), n);
        } else if (a.part_m) {
            float *out = a.out + th * D; a.part_m[th] = mx;
            if (mx == -INFINITY) { a.part_l[th] = 0.0f; memset(out, 0, 4 * D); continue; }
            const double l = K->exp_sum(n, s.data(), mx); const float inv = (float)(1.0 / l);
            for (int i = 0; i < n; i++) s[i] *= inv;
            K->f32_to_f16(s.data(), w16.data(), n); a.part_l[th] = (float)l;
            K->attn_values_blk(ord, D, w16.data(), vb, a.shift, (size_t)D, n, out);
            continue;
        } else {
            if (mx == -INFINITY) { memset(a.out + th * D, 0, 4 * D); continue; } /* (the CPU: NaN or nothing) */
            K->softmax_f16(n, s.data(), w16.data());
            K->attn_values_blk(ord, D, w16.data(), vb, a.shift, (size_t)D, n, a.out + th * D);
        }
        if (a.stats) { float *st = a.stats + (long)h * a.stats_stride; for (int i = 0; i < n; i++) st[i] += qi_fp16_to_f32(w16[i]); }
    }
}

static int gpu_attn(Call &c, const Args &a, std::vector<char> &scratch) {
    std::vector<int32_t> soff(1, 0), boff(1, 0), pos; std::vector<const uint16_t *> kb, vb; int max_slots = 0;
    for (int hk = 0; hk < c.Hkv; hk++) {
        for (int32_t p : c.pos[hk]) pos.push_back(p);
        for (auto b : c.kblk[hk]) kb.push_back(b);
        for (auto b : c.vblk[hk]) vb.push_back(b);
        soff.push_back(soff.back() + c.n_slots[hk]); boff.push_back(boff.back() + (int)c.kblk[hk].size());
        max_slots = std::max(max_slots, c.n_slots[hk]);
    }
    scratch.assign(qi_cuk_attn_scratch(a.T, a.H, max_slots) + 64, (char)0xff);
    qi_cuk_ctx ctx = {NULL, NULL, scratch.data(), scratch.size()};
    qi_cuk_attn k = {};
    k.T = a.T; k.H = a.H; k.Hkv = a.Hkv; k.D = a.D; k.n_swa = a.n_swa; k.shift = a.shift; k.scale = a.scale; k.max_slots = max_slots;
    k.q_pos = a.q_pos; k.q = a.q; k.out = a.out; k.slot_off = soff.data(); k.pos = pos.data(); k.blk_off = boff.data();
    k.kb = kb.data(); k.vb = vb.data(); k.stats = a.stats; k.stats_stride = a.stats_stride; k.part_m = a.part_m; k.part_l = a.part_l; k.tot_m = a.tot_m; k.tot_l = a.tot_l;
    const char *what = NULL;
    int e = qi_cuk_attention(&ctx, &k, &what);
    if (e) printf("attention failed %d %s\n", e, what);
    return e;
}

static void ref_merge(int rows, int D, int P, const float *const *o, const float *const *m, const float *const *l, float *out, float *tot_m, float *tot_l) {
    for (long r = 0; r < rows; r++) {
        float M = -INFINITY; int seen = 0, only = -1;
        for (int p = 0; p < P; p++) if (l[p][r] > 0.0f) { M = m[p][r] > M ? m[p][r] : M; seen++; only = p; }
        float *ou = out + r * D; double L = 0.0;
        if (seen == 1) { memcpy(ou, o[only] + r * D, 4 * D); L = l[only][r]; }
        else if (seen > 1) {
            double acc[1024] = {0}, w[8];
            for (int p = 0; p < P; p++) { w[p] = l[p][r] > 0.0f ? (double)l[p][r] * exp((double)m[p][r] - (double)M) : 0.0; L += w[p]; }
            for (int p = 0; p < P; p++) { if (w[p] == 0.0) continue; for (int d = 0; d < D; d++) acc[d] += w[p] * (double)o[p][r * D + d]; }
            for (int d = 0; d < D; d++) ou[d] = (float)(acc[d] / L);
        } else memset(ou, 0, 4 * D);
        if (tot_m) tot_m[r] = M;
        if (tot_l) tot_l[r] = (float)L;
    }
}

static Slot mkslot(int32_t p, int D) { Slot s; s.pos = p; s.k.resize(D); s.v.resize(D); for (int d = 0; d < D; d++) { s.k[d] = qi_f32_to_fp16(rf(-1.5f, 1.5f)); s.v[d] = qi_f32_to_fp16(rf(-1, 1)); } return s; }

static void cmp(const char *what, const float *a, const float *b, long n, double atol, double rtol) {
    double worst = 0; long bad = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]); bool ok = d <= atol + rtol * fabs(b[i]) || (isinf(a[i]) && a[i] == b[i]) || (isnan(a[i]) && isnan(b[i]));
        if (!ok) { if (bad++ < 3) printf("  %s[%ld]: %.9g vs ref %.9g\n", what, i, a[i], b[i]); }
        if (d > worst && !isinf(d)) worst = d;
    }
    CHK(bad == 0, "%s: %ld of %ld differ (worst %g)", what, bad, n, worst);
    printf("  %-28s n=%-6ld worst |diff| %.3g\n", what, n, worst);
}

static void test_attn(int T, int H, int Hkv, int D, int shift, int n_swa, int base_slots, bool shuffle, int q0) {
    printf("attention T=%d H=%d Hkv=%d D=%d shift=%d swa=%d slots~%d shuffle=%d\n", T, H, Hkv, D, shift, n_swa, base_slots, shuffle);
    /* whole cache: per KV head slots at positions 0..n-1 (with a gap), maybe shuffled */
    Call all{Hkv, D, shift, {}, {}, {}, {}, {}}, pa = all, pb = all;
    all.heads.resize(Hkv); pa.heads.resize(Hkv); pb.heads.resize(Hkv);
    int stride = 0;
    for (int hk = 0; hk < Hkv; hk++) {
        int n = base_slots + 3 * hk;
        std::vector<Slot> v; for (int i = 0; i < n; i++) v.push_back(mkslot(i + (i > n / 2 ? 2 : 0), D));
        if (shuffle) for (int i = n - 1; i > 0; i--) std::swap(v[i], v[(int)(rnd() * (i + 1))]);
        all.heads[hk] = v;
        for (int i = 0; i < n; i++) (rnd() < 0.5 ? pa : pb).heads[hk].push_back(v[i]);
        stride = std::max(stride, n);
    }
    all.build(); pa.build(); pb.build();
    std::vector<int32_t> qpos(T); for (int t = 0; t < T; t++) qpos[t] = q0 + t;
    std::vector<float> q((size_t)T * H * D); for (auto &x : q) x = rf(-2, 2);
    const float scale = 1.0f / sqrtf((float)D);
    std::vector<char> scr;
    const long TH = (long)T * H;
    /* whole, with stats starting from random values */
    std::vector<float> out(TH * D, NAN), rout(TH * D, NAN), st((size_t)H * (stride + 5)), rst;
    for (auto &x : st) x = rf(0, 1);
    rst = st;
    Args a = {T, H, Hkv, D, n_swa, shift, scale, qpos.data(), q.data(), out.data(), st.data(), stride + 5, NULL, NULL, NULL, NULL};
    Args r = a; r.out = rout.data(); r.stats = rst.data();
    gpu_attn(all, a, scr); ref_attn(all, r);
    cmp("whole out", out.data(), rout.data(), TH * D, 2e-4, 2e-3);
    cmp("whole stats", st.data(), rst.data(), (long)st.size(), 1e-3 * T, 0);
    /* determinism: the same call again gives the same bits */
    std::vector<float> out2(TH * D);
    { std::vector<float> s3(st.size(), 0.0f), s4(st.size(), 0.0f); Args a2 = a; a2.out = out2.data(); a2.stats = s3.data(); gpu_attn(all, a2, scr); a2.stats = s4.data(); gpu_attn(all, a2, scr);
      CHK(memcmp(s3.data(), s4.data(), 4 * s3.size()) == 0, "stats not deterministic"); CHK(memcmp(out.data(), out2.data(), 4 * out.size()) == 0, "out not deterministic"); }
    /* no stats */
    { std::vector<float> o3(TH * D); Args a3 = a; a3.out = o3.data(); a3.stats = NULL; gpu_attn(all, a3, scr); CHK(memcmp(o3.data(), out.data(), 4 * o3.size()) == 0, "out without stats differs"); }
    /* partials over two disjoint halves, each against the reference, then merged */
    std::vector<float> oa(TH * D), ob(TH * D), ma(TH), la(TH), mb(TH), lb(TH), roa(TH * D), rob(TH * D), rma(TH), rla(TH), rmb(TH), rlb(TH);
    Args A = {T, H, Hkv, D, n_swa, shift, scale, qpos.data(), q.data(), oa.data(), NULL, 0, ma.data(), la.data(), NULL, NULL};
    Args Bq = A; Bq.out = ob.data(); Bq.part_m = mb.data(); Bq.part_l = lb.data();
    gpu_attn(pa, A, scr); gpu_attn(pb, Bq, scr);
    Args RA = A; RA.out = roa.data(); RA.part_m = rma.data(); RA.part_l = rla.data(); ref_attn(pa, RA);
    Args RB = Bq; RB.out = rob.data(); RB.part_m = rmb.data(); RB.part_l = rlb.data(); ref_attn(pb, RB);
    cmp("partial A out", oa.data(), roa.data(), TH * D, 2e-4, 2e-3); cmp("partial A m", ma.data(), rma.data(), TH, 1e-5, 1e-5); cmp("partial A l", la.data(), rla.data(), TH, 1e-5, 1e-5);
    cmp("partial B out", ob.data(), rob.data(), TH * D, 2e-4, 2e-3); cmp("partial B m", mb.data(), rmb.data(), TH, 1e-5, 1e-5); cmp("partial B l", lb.data(), rlb.data(), TH, 1e-5, 1e-5);
    /* merge (the kernel) against the reference merge of the same inputs, and the whole */
    std::vector<float> mo(TH * D), rmo(TH * D), tm(TH), tl(TH), rtm(TH), rtl(TH);
    qi_cuk_merge km = {}; km.rows = (int)TH; km.D = D; km.n_parts = 2; km.o[0] = oa.data(); km.o[1] = ob.data(); km.m[0] = ma.data(); km.m[1] = mb.data(); km.l[0] = la.data(); km.l[1] = lb.data(); km.out = mo.data(); km.tot_m = tm.data(); km.tot_l = tl.data();
    qi_cuk_ctx ctx = {NULL, NULL, NULL, 0}; const char *what = NULL;
    CHK(qi_cuk_attn_merge(&ctx, &km, &what) == 0, "merge launch");
    const float *O[2] = {oa.data(), ob.data()}, *Mm[2] = {ma.data(), mb.data()}, *L[2] = {la.data(), lb.data()};
    ref_merge((int)TH, D, 2, O, Mm, L, rmo.data(), rtm.data(), rtl.data());
    cmp("merge out vs ref merge", mo.data(), rmo.data(), TH * D, 1e-6, 1e-6); cmp("merge tot_m", tm.data(), rtm.data(), TH, 0, 0); cmp("merge tot_l", tl.data(), rtl.data(), TH, 0, 1e-6);
    cmp("merge out vs whole", mo.data(), out.data(), TH * D, 1e-3, 5e-3);
    /* statistics-only over the two parts against the merged totals: their sum is the whole's stats */
    std::vector<float> sp((size_t)H * (stride + 5), 0.0f), rsp = sp;
    Args S = {T, H, Hkv, D, n_swa, shift, scale, qpos.data(), q.data(), NULL, sp.data(), stride + 5, NULL, NULL, tm.data(), tl.data()};
    gpu_attn(pa, S, scr); Args RS = S; RS.stats = rsp.data(); ref_attn(pa, RS);
    cmp("stats-only A", sp.data(), rsp.data(), (long)sp.size(), 1e-3 * T, 0);
    /* the parts' statistics-only sums against the whole's, per head (the
     * parts hold the slots in another order) */
    std::vector<float> spb((size_t)H * (stride + 5), 0.0f), sw((size_t)H * (stride + 5), 0.0f);
    Args SB = S; SB.stats = spb.data(); gpu_attn(pb, SB, scr);
    Args W = a; W.stats = sw.data(); W.out = out2.data(); gpu_attn(all, W, scr);
    for (int h = 0; h < H; h++) { double x = 0, y = 0; for (int i = 0; i < stride + 5; i++) { x += sp[h * (stride + 5) + i] + spb[h * (stride + 5) + i]; y += sw[h * (stride + 5) + i]; }
        CHK(fabs(x - y) <= 2e-3 * T, "head %d stats-only sum %g vs whole %g", h, x, y); }
}

int main() {
    test_attn(1, 4, 2, 64, 2, 0, 37, false, 100);
    test_attn(1, 8, 2, 128, 4, 0, 300, false, 1000);
    test_attn(5, 6, 3, 80, 3, 7, 23, true, 18);
    test_attn(3, 2, 1, 5, 1, 0, 9, true, 5);
    test_attn(4, 4, 4, 256, 4, 0, 70, false, 40);
    test_attn(6, 4, 2, 64, 2, 3, 12, true, 2);   /* early queries see few slots */
    test_attn(2, 2, 1, 320, 2, 0, 11, false, 9); /* D > 256 */
    test_attn(2, 2, 2, 64, 2, 0, 10, false, -5); /* queries see nothing: 0 out, -inf part_m */
    /* scratch too small: refused, naming it */
    {
        Call c1{1, 8, 1, {}, {}, {}, {}, {}};
        c1.heads.resize(1);
        for (int i = 0; i < 4; i++) c1.heads[0].push_back(mkslot(i, 8));
        c1.build();
        int32_t qp = 3;
        std::vector<float> q(8, 0.5f), o(8);
        std::vector<int32_t> soff = {0, 4}, boff = {0, 2}, pos = c1.pos[0];
        const uint16_t *kb[2] = {c1.kblk[0][0], c1.kblk[0][1]}, *vb[2] = {c1.vblk[0][0], c1.vblk[0][1]};
        std::vector<char> small(qi_cuk_attn_scratch(1, 1, 4) - 4);
        qi_cuk_ctx ctx = {NULL, NULL, small.data(), small.size()};
        qi_cuk_attn k = {};
        k.T = 1; k.H = 1; k.Hkv = 1; k.D = 8; k.shift = 1; k.scale = 1.0f; k.max_slots = 4; k.q_pos = &qp; k.q = q.data();
        k.out = o.data(); k.slot_off = soff.data(); k.pos = pos.data(); k.blk_off = boff.data(); k.kb = kb; k.vb = vb;
        const char *what = NULL;
        CHK(qi_cuk_attention(&ctx, &k, &what) != 0 && what && strstr(what, "scratch"), "small scratch not refused");
    }
    printf("emulated kernels: %ld checks, %ld failed\n", nchk, nfail);
    return nfail != 0;
}
