/* test_placement.c - Check suite for the placement slot
 * (policies/placement/): the weight-block sizes a plan is checked with, the
 * registry (names, unknown policies and parameters), the wrapper's memory
 * check refusing a plan that does not fit (naming the device, the block and
 * the bytes short) and one that is not a plan, and the static policy
 * against qi_plan_parse's ngl=N: with room for no layer, some, all, and all
 * with the head, it must pick exactly the ngl=N plan that fits.
 *
 * The model is synthetic (weights with sizes and no contents: the slot reads
 * only row_bytes and n_rows), so the unit case needs no model file. The
 * engine case (test_placement_engine, label model) runs static's plan on
 * an engine with SmolLM2-135M and a testdev of limited memory, through
 * qi_placement_apply, and checks that the engine takes the plan the slot's
 * check passed and refuses the one layer more that it refused.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "placement/placement_policy.h"
#include "qinfer/model.h"
#include "testutil.h"

enum { L = 4 };
static qi_layer layers[L];

/* A tiny llama of shapes (testutil.h). */
static qi_model model(void) {
    qi_model m;
    qi_test_tiny_shapes(&m, layers, L, 1);
    return m;
}

static const qi_placement_workload wl = {.batch = 1, .prompt_len = 100, .gen_len = 28};

static qi_placement_devices devices(size_t capacity) {
    qi_placement_devices d = {.n_devices = 2};
    snprintf(d.dev[0].name, sizeof d.dev[0].name, "cpu");
    d.dev[0].kind = QI_PLACEMENT_DEV_CPU;
    snprintf(d.dev[1].name, sizeof d.dev[1].name, "testdev");
    d.dev[1].kind = QI_PLACEMENT_DEV_ACCEL;
    d.dev[1].capacity = d.dev[1].free = capacity;
    return d;
}

static qi_plan ngl_plan(int n) {
    qi_plan p = {0};
    qi_err e = {0};
    char spec[32];
    ck_assert_int_eq(qi_plan_devices_parse("cpu,testdev", &p, &e), QI_OK);
    snprintf(spec, sizeof spec, "ngl=%d", n);
    ck_assert_msg(qi_plan_parse(spec, L, &p, &e) == QI_OK, "%s", e.msg);
    return p;
}

/* What ngl=n needs on the accelerator. */
static size_t ngl_need(const qi_model *m, int n) {
    qi_plan p = ngl_plan(n);
    const size_t need = qi_placement_need(m, &wl, &p, 1);
    qi_plan_free(&p);
    return need;
}

static void assert_same_plan(const qi_plan *a, const qi_plan *b) {
    char ja[1024], jb[1024];
    qi_plan_json(a, ja, sizeof ja);
    qi_plan_json(b, jb, sizeof jb);
    ck_assert_str_eq(ja, jb);
}

START_TEST(test_block_bytes) {
    const qi_model m = model();
    ck_assert_int_eq(qi_plan_n_blocks(L), 2 * L + 2);
    ck_assert_uint_eq(qi_plan_block_bytes(&m, 0), 512000);
    ck_assert_uint_eq(qi_plan_block_bytes(&m, 1), 1024 + 512 * 768);          /* layer 0's attention */
    ck_assert_uint_eq(qi_plan_block_bytes(&m, 2), 1024 + 512 * 1024 + 1024 * 256); /* layer 0's MLP */
    ck_assert_uint_eq(qi_plan_block_bytes(&m, 2 * L + 1), 1024 + 512000);    /* the output head */
    ck_assert_uint_eq(qi_plan_block_bytes(&m, 2 * L + 2), 0);
    /* rounded to 64 bytes each, as the engine allocates them */
    qi_model odd = m;
    odd.tok_embd.row_bytes = 3;
    odd.tok_embd.n_rows = 7;
    ck_assert_uint_eq(qi_plan_block_bytes(&odd, 0), 64);
    char buf[40];
    ck_assert_str_eq(qi_plan_block_name(L, 0, buf, sizeof buf), "the token embedding");
    ck_assert_str_eq(qi_plan_block_name(L, 5, buf, sizeof buf), "layer 2's attention");
    ck_assert_str_eq(qi_plan_block_name(L, 6, buf, sizeof buf), "layer 2's MLP");
    ck_assert_str_eq(qi_plan_block_name(L, 2 * L + 1, buf, sizeof buf), "the output head");
    /* the KV of 128 tokens: 2 blocks of 64 x 2 KV heads x K and V x 64 x F16 */
    ck_assert_uint_eq(qi_placement_kv_bytes(&m, &wl, 0), 2 * 2 * 2 * 64 * 64 * 2);
    qi_plan p = ngl_plan(L + 1);
    ck_assert_uint_eq(qi_placement_need(&m, &wl, &p, 0), 0); /* the CPU is not counted */
    size_t sum = qi_placement_act_bytes(&m, &wl, 2);
    for (int b = 1; b < qi_plan_n_blocks(L); b++) sum += qi_plan_block_bytes(&m, b);
    for (int l = 0; l < L; l++) sum += qi_placement_kv_bytes(&m, &wl, l);
    ck_assert_uint_eq(qi_placement_need(&m, &wl, &p, 1), sum);
    qi_plan_free(&p);
}
END_TEST

START_TEST(test_registry) {
    ck_assert_ptr_nonnull(qi_placement_policy_find("static"));
    ck_assert_ptr_null(qi_placement_policy_find("nope"));
    int n = 0, found = 0;
    for (const qi_placement_policy_i *const *it = qi_placement_policies; *it; it++, n++) {
        found |= strcmp((*it)->name, "static") == 0;
        ck_assert_msg((*it)->summary && *(*it)->summary && !strchr((*it)->summary, '\n'), "%s", (*it)->name);
        ck_assert_ptr_nonnull((*it)->params);
    }
    ck_assert(n >= 1 && found);
    qi_placement_policy *p = NULL;
    qi_err e = {0};
    ck_assert_int_eq(qi_placement_policy_create("nope", NULL, &p, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(e.msg, "unknown placement policy 'nope'") && strstr(e.msg, "static"), "%s", e.msg);
    qi_params pr;
    qi_params_init(&pr);
    ck_assert_int_eq(qi_params_parse(&pr, "ngl=2,colour=blue", &e), QI_OK);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_placement_policy_create("static", &pr, &p, &e), QI_ERR_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(e.msg, "static") && strstr(e.msg, "colour"), "%s", e.msg);
    qi_params_init(&pr);
    ck_assert_int_eq(qi_params_parse(&pr, "ngl=two", &e), QI_OK);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_placement_policy_create("static", &pr, &p, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "ngl") != NULL, "%s", e.msg);
    ck_assert_int_eq(qi_placement_policy_create("static", NULL, &p, &e), QI_OK);
    ck_assert_str_eq(qi_placement_policy_name(p), "static");
    qi_placement_policy_observe(p, &(qi_placement_times){0}); /* no state: ignored */
    qi_placement_policy_free(p);
    qi_placement_policy_free(NULL);
    /* a policy's plan is made after the engine exists, not parsed as a placement */
    qi_plan pl = {0};
    qi_err_clear(&e);
    ck_assert_int_eq(qi_plan_parse("policy:static", L, &pl, &e), QI_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "policy:static") != NULL, "%s", e.msg);
}
END_TEST

/* static's plan for devices d and params spec. */
static qi_status static_plan(const qi_model *m, const qi_placement_devices *d, const char *spec, qi_plan *out,
                             qi_err *e) {
    qi_params pr;
    qi_params_init(&pr);
    ck_assert_int_eq(qi_params_parse(&pr, spec, e), QI_OK);
    qi_placement_policy *p = NULL;
    ck_assert_msg(qi_placement_policy_create("static", &pr, &p, e) == QI_OK, "%s", e->msg);
    const qi_status st = qi_placement_policy_plan(p, m, d, &wl, out, e);
    qi_placement_policy_free(p);
    return st;
}

START_TEST(test_static_fits) {
    const qi_model m = model();
    qi_err e = {0};
    for (int n = 0; n <= L + 1; n++) {
        /* room for exactly n: ngl=n's need, or one byte short of ngl=1 */
        const size_t cap = n == 0 ? ngl_need(&m, 1) - 1 : ngl_need(&m, n);
        for (int more = 0; more < 2; more++) {
            /* and one byte short of n + 1 */
            const size_t c = more && n <= L ? ngl_need(&m, n + 1) - 1 : cap;
            qi_placement_devices d = devices(c);
            qi_plan got = {0}, want = ngl_plan(n);
            ck_assert_msg(static_plan(&m, &d, "", &got, &e) == QI_OK, "ngl=%d: %s", n, e.msg);
            assert_same_plan(&got, &want);
            qi_plan_free(&got);
            qi_plan_free(&want);
        }
    }
    /* no limit: everything */
    qi_placement_devices d = devices(0);
    qi_plan got = {0}, want = ngl_plan(L + 1);
    ck_assert_int_eq(static_plan(&m, &d, "", &got, &e), QI_OK);
    assert_same_plan(&got, &want);
    qi_plan_free(&got);
    /* reserve= keeps bytes free: room for all but one byte is ngl=L */
    d = devices(ngl_need(&m, L + 1));
    ck_assert_int_eq(static_plan(&m, &d, "reserve=1", &got, &e), QI_OK);
    qi_plan_free(&want);
    want = ngl_plan(L);
    assert_same_plan(&got, &want);
    qi_plan_free(&got);
    qi_plan_free(&want);
    /* bytes in use count against it: free for 2 layers in a bigger device */
    d = devices(ngl_need(&m, L + 1));
    d.dev[1].free = ngl_need(&m, 2);
    ck_assert_int_eq(static_plan(&m, &d, "", &got, &e), QI_OK);
    want = ngl_plan(2);
    assert_same_plan(&got, &want);
    qi_plan_free(&got);
    qi_plan_free(&want);
}
END_TEST

START_TEST(test_static_devices) {
    const qi_model m = model();
    qi_err e = {0};
    /* the CPU alone: all-cpu */
    qi_placement_devices d = devices(0);
    d.n_devices = 1;
    qi_plan got = {0};
    ck_assert_int_eq(static_plan(&m, &d, "", &got, &e), QI_OK);
    char s[256];
    qi_plan_summary(&got, s, sizeof s);
    ck_assert_str_eq(s, "all-cpu");
    qi_plan_free(&got);
    qi_err_clear(&e);
    ck_assert_int_eq(static_plan(&m, &d, "ngl=1", &got, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "accelerator") != NULL, "%s", e.msg);
    /* three devices: the last that is not the CPU is the accelerator */
    d = devices(0);
    d.n_devices = 3;
    d.dev[2] = d.dev[1];
    snprintf(d.dev[2].name, sizeof d.dev[2].name, "acc2");
    ck_assert_int_eq(static_plan(&m, &d, "ngl=2", &got, &e), QI_OK);
    for (int l = 0; l < L; l++) ck_assert_int_eq(got.layers[l].attn_dev, l >= L - 2 ? 2 : 0);
    ck_assert_str_eq(got.devices[2], "acc2");
    qi_plan_free(&got);
}
END_TEST

START_TEST(test_static_forced) {
    const qi_model m = model();
    qi_err e = {0};
    qi_placement_devices d = devices(ngl_need(&m, 2));
    qi_plan got = {0}, want = ngl_plan(2);
    ck_assert_int_eq(static_plan(&m, &d, "ngl=2", &got, &e), QI_OK);
    assert_same_plan(&got, &want);
    qi_plan_free(&got);
    qi_plan_free(&want);
    ck_assert_int_eq(static_plan(&m, &d, "ngl=1", &got, &e), QI_OK);
    qi_plan_free(&got);
    /* ngl=3 does not fit: refused, naming the device and the bytes short */
    ck_assert_int_eq(static_plan(&m, &d, "ngl=3", &got, &e), QI_ERR_NOMEM);
    ck_assert_ptr_null(got.layers);
    char short_by[64];
    snprintf(short_by, sizeof short_by, "%zu short", ngl_need(&m, 3) - ngl_need(&m, 2));
    ck_assert_msg(strstr(e.msg, "device testdev") && strstr(e.msg, short_by) && strstr(e.msg, "up to layer 3's attention"), "%s",
                  e.msg);
    qi_err_clear(&e);
    ck_assert_int_eq(static_plan(&m, &d, "ngl=6", &got, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "ngl=6") != NULL, "%s", e.msg);
    /* the reserve counts for a forced N too */
    qi_err_clear(&e);
    ck_assert_int_eq(static_plan(&m, &d, "ngl=2,reserve=1", &got, &e), QI_ERR_NOMEM);
    ck_assert_msg(strstr(e.msg, "1 short") && strstr(e.msg, "reserve"), "%s", e.msg);
}
END_TEST

/* Hand-made policies: one that puts every block on device 1, one that
 * names a device that is not there. */
static qi_status greedy_plan(qi_placement_policy *p, const qi_model *m, const qi_placement_devices *devs,
                             const qi_placement_workload *w_, qi_plan *out, qi_err *err) {
    (void)p, (void)m, (void)devs, (void)w_, (void)err;
    out->embd_dev = out->head_dev = 1;
    for (int l = 0; l < out->n_layer; l++) out->layers[l].attn_dev = out->layers[l].mlp_dev = 1;
    return QI_OK;
}
static qi_status broken_plan(qi_placement_policy *p, const qi_model *m, const qi_placement_devices *devs,
                             const qi_placement_workload *w_, qi_plan *out, qi_err *err) {
    (void)p, (void)m, (void)devs, (void)w_, (void)err;
    out->layers[1].mlp_dev = 3;
    return QI_OK;
}
static void no_free(qi_placement_policy *p) { (void)p; }

START_TEST(test_wrapper_refuses) {
    const qi_model m = model();
    static const qi_placement_policy_i greedy = {
        .version = QI_PLACEMENT_POLICY_VERSION, .name = "greedy", .summary = "", .params = "",
        .plan = greedy_plan, .free = no_free};
    static const qi_placement_policy_i broken = {
        .version = QI_PLACEMENT_POLICY_VERSION, .name = "broken", .summary = "", .params = "",
        .plan = broken_plan, .free = no_free};
    qi_placement_policy pg = {&greedy}, pb = {&broken};
    qi_err e = {0};
    qi_plan got = {0};
    /* room for everything but the embedding and a little */
    const size_t all = ngl_need(&m, L + 1);
    qi_placement_devices d = devices(all);
    ck_assert_int_eq(qi_placement_policy_plan(&pg, &m, &d, &wl, &got, &e), QI_ERR_NOMEM);
    ck_assert_ptr_null(got.layers);
    char short_by[64];
    snprintf(short_by, sizeof short_by, "%zu short", qi_plan_block_bytes(&m, 0));
    ck_assert_msg(strstr(e.msg, "device testdev") && strstr(e.msg, short_by) && strstr(e.msg, "output head"), "%s",
                  e.msg);
    /* with room it passes */
    d = devices(all + qi_plan_block_bytes(&m, 0));
    ck_assert_msg(qi_placement_policy_plan(&pg, &m, &d, &wl, &got, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(got.embd_dev, 1);
    qi_plan_free(&got);
    /* a plan that is not one */
    qi_err_clear(&e);
    ck_assert_int_eq(qi_placement_policy_plan(&pb, &m, &d, &wl, &got, &e), QI_ERR_BACKEND);
    ck_assert_msg(strstr(e.msg, "'broken' broke its contract") && strstr(e.msg, "layer 1"), "%s", e.msg);
    ck_assert_ptr_null(got.layers);
    /* a bad workload */
    qi_placement_workload bad = wl;
    bad.batch = 0;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_placement_policy_plan(&pg, &m, &d, &bad, &got, &e), QI_ERR_INVALID);
}
END_TEST

/* ---- with the engine: the slot's check and the engine's agree ----------------------- */

#define SMOL_FILE "models/SmolLM2-135M-Instruct.Q4_1.gguf"
static qi_model *g_model;

static qi_engine *engine_on_opt(const char *devices, bool repack, qi_err *e) {
    qi_engine_opts o;
    qi_engine_opts_default(&o);
    o.repack = repack;
    o.n_threads = 1;
    o.max_seqs = 2;
    o.step_tokens = 64;
    o.devices = devices;
    qi_engine *en = NULL;
    ck_assert_msg(qi_engine_create(g_model, &o, &en, e) == QI_OK, "%s", e->msg);
    return en;
}
static qi_engine *engine_on(const char *devices, qi_err *e) { return engine_on_opt(devices, false, e); }

START_TEST(test_engine_agrees) {
    const qi_model *m = g_model;
    const int n = m->hp.n_layer, k = n / 3;
    qi_err e = {0};
    /* what the engine holds on an unlimited testdev before any block: its activations */
    qi_engine *en = engine_on("cpu,testdev", &e);
    qi_engine_dev dv;
    ck_assert(qi_engine_device(en, 1, &dv));
    const size_t act = dv.in_use;
    qi_engine_free(en);
    /* room for the last k layers and half of one more */
    size_t cap = act + qi_plan_block_bytes(m, 2 * (n - k - 1) + 1) / 2;
    for (int l = n - k; l < n; l++) cap += qi_plan_block_bytes(m, 1 + 2 * l) + qi_plan_block_bytes(m, 2 + 2 * l);
    char devs[64];
    snprintf(devs, sizeof devs, "cpu,testdev:%zu", cap);
    en = engine_on(devs, &e);
    qi_placement_policy *p = NULL;
    ck_assert_int_eq(qi_placement_policy_create("static", NULL, &p, &e), QI_OK);
    const qi_placement_workload none = {.batch = 1}; /* weights only: what a fresh engine's check counts */
    ck_assert_msg(qi_placement_apply(p, en, m, &none, NULL, &e) == QI_OK, "%s", e.msg);
    const qi_plan *got = qi_engine_plan(en);
    for (int l = 0; l < n; l++) ck_assert_int_eq(got->layers[l].attn_dev, l >= n - k ? 1 : 0);
    ck_assert_int_eq(got->head_dev, 0);
    /* and the engine refuses one layer more, as the slot's check did */
    char spec[32];
    snprintf(spec, sizeof spec, "ngl=%d", k + 1);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_engine_replan_spec(en, spec, NULL, &e), QI_ERR_NOMEM);
    qi_placement_policy_free(p);
    qi_params pr;
    qi_params_init(&pr);
    ck_assert_int_eq(qi_params_parse(&pr, spec, &e), QI_OK);
    ck_assert_int_eq(qi_placement_policy_create("static", &pr, &p, &e), QI_OK);
    qi_err_clear(&e);
    ck_assert_int_eq(qi_placement_apply(p, en, m, &none, NULL, &e), QI_ERR_NOMEM);
    ck_assert_msg(strstr(e.msg, "device testdev") && strstr(e.msg, "short"), "%s", e.msg);
    qi_placement_policy_free(p);
    qi_engine_free(en);
    /* unlimited: everything, the head included */
    en = engine_on("cpu,testdev", &e);
    ck_assert_int_eq(qi_placement_policy_create("static", NULL, &p, &e), QI_OK);
    const qi_placement_workload wl2 = {.batch = 2, .prompt_len = 64, .gen_len = 64};
    ck_assert_msg(qi_placement_apply(p, en, m, &wl2, NULL, &e) == QI_OK, "%s", e.msg);
    char s[128];
    qi_plan_summary(qi_engine_plan(en), s, sizeof s);
    snprintf(spec, sizeof spec, "ngl=%d (testdev)", n + 1);
    ck_assert_str_eq(s, spec);
    qi_placement_policy_free(p);
    qi_engine_free(en);
}
END_TEST

/* With repack, testdev holds a matrix's rows and its packed groups beside
 * them: the slot's check sizes blocks as the engine's device does, so the
 * plan it passes is one the engine takes (sized by the rows alone, the
 * check would pass a plan the engine then refuses). */
START_TEST(test_engine_repack_sizes) {
    const qi_model *m = g_model;
    const int n = m->hp.n_layer, k = n / 3;
    qi_err e = {0};
    qi_engine *en = engine_on_opt("cpu,testdev", true, &e);
    qi_engine_dev dv;
    ck_assert(qi_engine_device(en, 1, &dv));
    const size_t act = dv.in_use;
    const int mlp = 2 + 2 * (n - 1);
    ck_assert_uint_gt(qi_engine_block_bytes(en, 1, mlp), qi_plan_block_bytes(m, mlp));
    ck_assert_uint_eq(qi_engine_block_bytes(en, 0, mlp) > 0, 1); /* the CPU packs too */
    ck_assert_uint_eq(qi_engine_block_bytes(en, 2, mlp), 0);     /* no device 2 */
    ck_assert_uint_eq(qi_engine_block_bytes(en, 1, 2 * n + 2), 0); /* no such block */
    qi_engine_free(en);
    /* the rows of the last k layers fit; their packed form beside them does not */
    size_t cap = act;
    for (int l = n - k; l < n; l++) cap += qi_plan_block_bytes(m, 1 + 2 * l) + qi_plan_block_bytes(m, 2 + 2 * l);
    char devs[64];
    snprintf(devs, sizeof devs, "cpu,testdev:%zu", cap);
    en = engine_on_opt(devs, true, &e);
    qi_placement_policy *p = NULL;
    ck_assert_int_eq(qi_placement_policy_create("static", NULL, &p, &e), QI_OK);
    const qi_placement_workload none = {.batch = 1};
    ck_assert_msg(qi_placement_apply(p, en, m, &none, NULL, &e) == QI_OK, "%s", e.msg);
    const qi_plan *got = qi_engine_plan(en);
    int on = 0;
    for (int l = 0; l < n; l++) on += got->layers[l].attn_dev == 1;
    ck_assert_int_gt(on, 0);
    ck_assert_int_lt(on, k);
    ck_assert_int_eq(qi_engine_n_packed(en) > 0, 1);
    qi_placement_policy_free(p);
    qi_engine_free(en);
}
END_TEST

/* ---- flexgen: the LP against a grid, the outer search, the plan ---------------------- */

#ifdef QI_HAVE_GLPK
#include <math.h>
#include <unistd.h>

#include "placement/flexgen.h"

/* FlexGen's cost model written again in plain C as the README states it
 * (the step times as maxima, no LP): the block's time for shares wg, cg,
 * hg (wc = 1 - wg and so on), and whether they fit the memory (with a
 * relative slack for the solver's rounding). */
static double fg_eval(const qi_flexgen_inputs *in, int gbs, int nb, double wg, double cg, double hg, bool *fits) {
    const double wc = 1 - wg, cc = 1 - cg, hc = 1 - hg;
    const double nL = in->n_layer, g = gbs, B = (double)gbs * nb, s = in->prompt_len, n = in->gen_len,
                 kt = in->kv_tokens, E = in->n_embd, qw = in->q_width, kw = in->kv_width, F = in->n_ff,
                 H = in->n_head, Wl = in->layer_bytes;
    const double h2d = in->h2d_bw * in->eff_link, d2h = in->d2h_bw * in->eff_link;
    const double gf = in->gpu_flops * in->eff_gpu, gb = in->gpu_bw * in->eff_gpu;
    const double cf = in->cpu_flops * in->eff_cpu, cb = in->cpu_bw * in->eff_cpu;
    const double sk = fmin(s, kt), kr = fmin(s + n / 2, kt);
    const double hid_p = 4 * B * s * E, hid_g = 4 * B * E, kv_layer = 4 * B * kt * kw;
    const double t_pre = fmax(fmax((wc * Wl + hc * hid_p) / h2d, (cc * 4 * B * sk * kw + hc * hid_p) / d2h),
                              (B * s * in->layer_flops + 2 * B * s * s * qw) / gf);
    const double att_g = fmax(4 * B * kr * kw / gb, 4 * B * kr * qw / gf);
    const double att_c = fmax(4 * B * kr * kw / cb, 4 * B * kr * qw / cf);
    const double t_gen = fmax(fmax((wc * Wl + hc * hid_g) / h2d, (cc * 4 * B * kw + hc * hid_g) / d2h),
                              fmax(B * in->layer_flops / gf, Wl / gb) + cg * att_g + cc * att_c);
    const double work = 4 * (2 * E + qw + 2 * kw + 2 * F);
    const double gpu_p = nL * Wl * wg + 2 * Wl * wc + hid_p * hg + 8 * g * s * E * hc + nL * kv_layer * cg +
                         g * s * work + 4 * g * H * s * sk;
    const double gpu_g = nL * Wl * wg + 2 * Wl * wc + hid_g * hg + 8 * g * E * hc + nL * kv_layer * cg + g * work +
                         4 * g * H * kt;
    const double cpu_p = nL * Wl * wc + hid_p * hc + nL * kv_layer * cc;
    const double slack = 1 + 1e-7;
    *fits = fmax(gpu_p, gpu_g) <= in->gpu_mem * slack && cpu_p <= in->cpu_mem * slack;
    return nL * t_pre + nL * (n - 1) * t_gen;
}

/* The GPU bytes at which shares wg, cg, hg start to fit by fg_eval (to
 * its slack). */
static double fg_gpu_need(const qi_flexgen_inputs *in, int gbs, int nb, double wg, double cg, double hg) {
    qi_flexgen_inputs big = *in;
    /* bisect the capacity at which these shares start to fit */
    double lo = 0, hi = 1e15;
    for (int i = 0; i < 200; i++) {
        bool fits;
        big.gpu_mem = (lo + hi) / 2;
        fg_eval(&big, gbs, nb, wg, cg, hg, &fits);
        if (fits) hi = big.gpu_mem; else lo = big.gpu_mem;
    }
    return hi;
}

/* A small model on a small machine: 4 layers of 1 MB, 256 wide. */
static qi_flexgen_inputs fg_inputs(double gpu_mem) {
    return (qi_flexgen_inputs){
        .n_layer = 4, .layer_bytes = 1e6, .layer_flops = 2.5e6, .n_embd = 256, .q_width = 256, .kv_width = 128,
        .n_ff = 512, .n_head = 4, .prompt_len = 100, .gen_len = 28, .kv_tokens = 128, .batch = 16,
        .gpu_flops = 1e12, .gpu_bw = 1e11, .gpu_mem = gpu_mem, .cpu_flops = 1e11, .cpu_bw = 2e10, .cpu_mem = 1e9,
        .h2d_bw = 1e10, .d2h_bw = 1e10, .eff_gpu = 1, .eff_cpu = 1, .eff_link = 1, .gbs_max = 64, .num_gb_max = 8};
}

/* The LP's optimum for (gbs, nb) against every point of a grid of step
 * 1/20: never worse than the grid's best, and its own shares evaluate to
 * its objective. Returns the grid's best (INFINITY when nothing fits). */
static double fg_check_lp(const qi_flexgen_inputs *in, int gbs, int nb, qi_flexgen_solution *lp, qi_status *st) {
    qi_err e = {0};
    double best = INFINITY;
    for (int i = 0; i <= 20; i++)
        for (int j = 0; j <= 20; j++)
            for (int k = 0; k <= 20; k++) {
                bool fits;
                const double t = fg_eval(in, gbs, nb, i / 20.0, j / 20.0, k / 20.0, &fits);
                if (fits && t < best) best = t;
            }
    *st = qi_flexgen_solve_lp(in, gbs, nb, lp, &e);
    if (*st == QI_ERR_NOMEM) {
        ck_assert_msg(isinf(best), "the LP found nothing for %dx%d, the grid did: %g s", gbs, nb, best);
        ck_assert_msg(strstr(e.msg, "flexgen") != NULL, "%s", e.msg);
        return best;
    }
    ck_assert_msg(*st == QI_OK, "%s", e.msg);
    ck_assert_msg(fabs(lp->wg + lp->wc - 1) < 1e-9 && fabs(lp->cg + lp->cc - 1) < 1e-9 &&
                      fabs(lp->hg + lp->hc - 1) < 1e-9, "shares do not sum to 1");
    bool fits;
    const double self = fg_eval(in, gbs, nb, lp->wg, lp->cg, lp->hg, &fits);
    ck_assert_msg(fits, "the LP's shares (%g %g %g) do not fit", lp->wg, lp->cg, lp->hg);
    ck_assert_msg(fabs(self - lp->total_s) <= 1e-6 * lp->total_s, "LP objective %.12g, its shares give %.12g",
                  lp->total_s, self);
    /* to the grid's memory slack */
    ck_assert_msg(lp->total_s <= best * (1 + 1e-6), "LP %.12g worse than the grid's %.12g", lp->total_s, best);
    ck_assert_msg(fabs(lp->tokens_per_s - (double)gbs * nb * in->gen_len / lp->total_s) <= 1e-9 * lp->tokens_per_s,
                  "throughput");
    return best;
}

/* Under the block schedule each GPU batch reads the layer's weights again
 * in decode, so where everything fits one GPU batch is best, and 16 of one
 * sequence cost more than one of 16; without it the engine runs the batch whole, and the GPU batch size
 * does not change the decode matmuls' time. */
START_TEST(test_flexgen_blocked_batches) {
    qi_flexgen_inputs in = fg_inputs(1e9);
    qi_flexgen_solution one, many, best;
    qi_err e = {0};
    for (int blocked = 0; blocked < 2; blocked++) {
        in.blocked = blocked;
        ck_assert_int_eq(qi_flexgen_solve_lp(&in, in.batch, 1, &one, &e), QI_OK);
        ck_assert_int_eq(qi_flexgen_solve_lp(&in, 1, in.batch, &many, &e), QI_OK);
        if (blocked) {
            ck_assert_msg(many.total_s > 1.2 * one.total_s, "16 GPU batches of 1: %g s, one of 16: %g s", many.total_s,
                          one.total_s);
            ck_assert_int_eq(qi_flexgen_solve(&in, &best, &e), QI_OK);
            ck_assert_msg(best.num_gb == 1, "chose %d GPU batches of %d", best.num_gb, best.gbs);
        } else {
            ck_assert_msg(fabs(many.total_s - one.total_s) <= 1e-9 * one.total_s, "%g against %g", many.total_s,
                          one.total_s);
        }
    }
}
END_TEST

START_TEST(test_flexgen_lp_vs_grid) {
    const int shapes[][2] = {{1, 1}, {2, 2}, {4, 2}, {8, 1}};
    const double mems[] = {3.5e6, 5e6, 8e6, 1.5e7, 3e7, 1e8};
    int solved = 0, strictly = 0;
    for (size_t m = 0; m < sizeof mems / sizeof mems[0]; m++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            const qi_flexgen_inputs in = fg_inputs(mems[m]);
            qi_flexgen_solution lp;
            qi_status st;
            const double grid = fg_check_lp(&in, shapes[k][0], shapes[k][1], &lp, &st);
            solved += st == QI_OK;
            strictly += st == QI_OK && lp.total_s < grid * (1 - 1e-6);
        }
    /* most cases solve, and some optimum lies off the grid (the LP beats it) */
    ck_assert_msg(solved >= 16 && strictly >= 1, "solved %d, better than the grid %d", solved, strictly);

    /* where the grid holds the optimum, the two agree. Room for everything:
     * all on the GPU. */
    qi_flexgen_inputs in = fg_inputs(1e9);
    qi_flexgen_solution lp;
    qi_status st;
    double grid = fg_check_lp(&in, 2, 2, &lp, &st);
    ck_assert_int_eq(st, QI_OK);
    ck_assert_msg(fabs(lp.total_s - grid) <= 1e-9 * grid, "%.12g vs %.12g", lp.total_s, grid);
    ck_assert(lp.wg > 1 - 1e-9 && lp.cg > 1 - 1e-9 && lp.hg > 1 - 1e-9);
    /* a free link and room for the streamed weights' buffers, the hidden
     * states and half the KV: the weights stream (they cost no time), half
     * the KV is on the GPU (the hidden states may go either way: the same
     * bytes, no time) */
    in = fg_inputs(0);
    in.h2d_bw = in.d2h_bw = 1e18;
    in.gpu_mem = fg_gpu_need(&in, 2, 2, 0.0, 0.5, 1.0);
    grid = fg_check_lp(&in, 2, 2, &lp, &st);
    ck_assert_int_eq(st, QI_OK);
    ck_assert_msg(fabs(lp.total_s - grid) <= 1e-6 * grid, "%.12g vs %.12g (%g %g %g)", lp.total_s, grid, lp.wg,
                  lp.cg, lp.hg);
    ck_assert_msg(fabs(lp.wg) < 1e-6 && fabs(lp.cg - 0.5) < 1e-5, "%g %g %g", lp.wg, lp.cg, lp.hg);
    /* planted fault: the grid's evaluation of other shares is worse */
    bool fits;
    ck_assert(fg_eval(&in, 2, 2, 0.0, 0.45, 1.0, &fits) > lp.total_s * (1 + 1e-9) && fits);
}
END_TEST

START_TEST(test_flexgen_search) {
    const double mems[] = {4e6, 8e6, 1e8};
    for (size_t m = 0; m < sizeof mems / sizeof mems[0]; m++) {
        const qi_flexgen_inputs in = fg_inputs(mems[m]);
        qi_flexgen_solution got;
        qi_err e = {0};
        ck_assert_msg(qi_flexgen_solve(&in, &got, &e) == QI_OK, "%s", e.msg);
        /* every (gbs, num_gb) the search may try, in its order */
        qi_flexgen_solution best = {0};
        int tried = 0, nomem = 0;
        for (int g = 1; g <= in.gbs_max && g <= in.batch; g = g < 4 ? g + 1 : 2 * g)
            for (int nb = 1; nb <= in.num_gb_max && g * nb <= in.batch; nb++) {
                qi_flexgen_solution s;
                const qi_status st = qi_flexgen_solve_lp(&in, g, nb, &s, NULL);
                tried++;
                if (st == QI_ERR_NOMEM) {
                    nomem++;
                    continue;
                }
                ck_assert_int_eq(st, QI_OK);
                if (s.tokens_per_s > best.tokens_per_s) best = s;
            }
        ck_assert_msg(got.gbs == best.gbs && got.num_gb == best.num_gb,
                      "search chose %dx%d (%g tok/s), the best is %dx%d (%g tok/s)", got.gbs, got.num_gb,
                      got.tokens_per_s, best.gbs, best.num_gb, best.tokens_per_s);
        ck_assert(fabs(got.tokens_per_s - best.tokens_per_s) <= 1e-12 * best.tokens_per_s);
        ck_assert(got.n_lp >= 1 && got.n_lp <= tried);
        if (m == 0) ck_assert_msg(nomem > 0, "the tight case should leave some blocks out");
    }
    /* nothing fits */
    qi_flexgen_inputs in = fg_inputs(1e3);
    qi_flexgen_solution got;
    qi_err e = {0};
    ck_assert_int_eq(qi_flexgen_solve(&in, &got, &e), QI_ERR_NOMEM);
    ck_assert_msg(strstr(e.msg, "flexgen") != NULL, "%s", e.msg);
    /* bad numbers are refused, not handed to the solver */
    in = fg_inputs(1e8);
    in.eff_gpu = -1;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_flexgen_solve_lp(&in, 1, 1, &got, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "flexgen") && strstr(e.msg, "eff_gpu"), "%s", e.msg);
    in = fg_inputs(1e8);
    in.h2d_bw = NAN;
    ck_assert_int_eq(qi_flexgen_solve(&in, &got, NULL), QI_ERR_INVALID);
}
END_TEST

/* relative to the source tree (a parameter's value is at most
 * QI_PARAM_VALUE_MAX - 1 bytes): the tests below chdir there */
#define FG_PROFILE "engine/backend/sim/profiles/a100-pcie-2xeon.profile"

static qi_status fg_create(const char *spec, qi_placement_policy **p, qi_err *e) {
    ck_assert_int_eq(chdir(QI_SOURCE_DIR), 0);
    qi_params pr;
    qi_params_init(&pr);
    ck_assert_int_eq(qi_params_parse(&pr, spec, e), QI_OK);
    return qi_placement_policy_create("flexgen", &pr, p, e);
}

START_TEST(test_flexgen_errors) {
    const qi_model m = model();
    qi_placement_policy *p = NULL;
    qi_err e = {0};
    qi_plan got = {0};
    ck_assert_ptr_nonnull(qi_placement_policy_find("flexgen"));
    /* no profile: fine for the CPU alone, an error naming it with an accelerator */
    ck_assert_int_eq(fg_create("", &p, &e), QI_OK);
    qi_placement_devices d = devices(0);
    d.n_devices = 1;
    ck_assert_int_eq(qi_placement_policy_plan(p, &m, &d, &wl, &got, &e), QI_OK);
    qi_plan_free(&got);
    d = devices(1 << 24);
    ck_assert_int_eq(qi_placement_policy_plan(p, &m, &d, &wl, &got, &e), QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "flexgen") && strstr(e.msg, "profile=PATH"), "%s", e.msg);
    qi_placement_policy_free(p);
    /* unknown key, bad values */
    static const char *const bad[][2] = {{"colour=blue", "colour"}, {"eff_gpu=-0.5", "eff_gpu"},
                                         {"eff_link=0", "eff_link"}, {"eff_cpu=fast", "eff_cpu"},
                                         {"gbs_max=0", "gbs_max"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qi_err_clear(&e);
        char spec[256];
        snprintf(spec, sizeof spec, "profile=%s,%s", FG_PROFILE, bad[i][0]);
        ck_assert_int_eq(fg_create(spec, &p, &e), QI_ERR_INVALID);
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(e.msg, "flexgen") && strstr(e.msg, bad[i][1]), "%s: %s", bad[i][0], e.msg);
    }
    /* a profile that is not there, one that does not parse, one without a GPU */
    qi_err_clear(&e);
    ck_assert_int_eq(fg_create("profile=/nonexistent/x.profile", &p, &e), QI_ERR_IO);
    ck_assert_msg(strstr(e.msg, "flexgen: profile") && strstr(e.msg, "/nonexistent/x.profile"), "%s", e.msg);
    char path[] = "/tmp/test_flexgen_XXXXXX";
    const int fd = mkstemp(path);
    ck_assert(fd >= 0);
    static const char text[] = "name = broken\nkind = server\ngpu.mem_bw = fast  # source: none\n";
    ck_assert(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1));
    close(fd);
    char spec[128];
    snprintf(spec, sizeof spec, "profile=%s", path);
    qi_err_clear(&e);
    ck_assert_int_eq(fg_create(spec, &p, &e), QI_ERR_INVALID);
    char where[64];
    snprintf(where, sizeof where, "%s:3: gpu.mem_bw", path);
    ck_assert_msg(strstr(e.msg, "flexgen: profile") && strstr(e.msg, where), "%s", e.msg);
    unlink(path);
    qi_err_clear(&e);
    ck_assert_int_eq(fg_create("profile=engine/backend/sim/profiles/epyc-2core-kvm.profile", &p,
                               &e),
                     QI_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "flexgen: profile") && strstr(e.msg, "no GPU"), "%s", e.msg);
}
END_TEST

/* The accelerator's weight bytes in plan p. */
static size_t acc_weight_bytes(const qi_model *m, const qi_plan *p) {
    size_t n = 0;
    for (int b = 0; b < qi_plan_n_blocks(p->n_layer); b++)
        if (qi_plan_block_dev(p, b) == 1) n += qi_plan_block_bytes(m, b);
    return n;
}

START_TEST(test_flexgen_plan) {
    const qi_model m = model();
    qi_placement_policy *p = NULL;
    qi_err e = {0};
    ck_assert_msg(fg_create("profile=" FG_PROFILE, &p, &e) == QI_OK, "%s", e.msg);
    const qi_placement_workload wls[] = {wl, {.batch = 4, .prompt_len = 200, .gen_len = 56},
                                         {.batch = 8, .prompt_len = 64, .gen_len = 64, .kv_budget = 64}};
    int n_split = 0, partial = 0;
    for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++) {
        size_t prev = 0;
        const size_t all = ngl_need(&m, L + 1) * 3;
        for (size_t cap = all / 128; cap <= all; cap += all / 128) {
            qi_placement_devices d = devices(cap);
            qi_plan got = {0};
            ck_assert_msg(qi_placement_policy_plan(p, &m, &d, &wls[w], &got, &e) == QI_OK, "%zu: %s", cap, e.msg);
            ck_assert_msg(qi_placement_check(&m, &d, &wls[w], &got, 0, &e) == QI_OK, "%s", e.msg);
            const size_t bytes = acc_weight_bytes(&m, &got);
            ck_assert_msg(bytes >= prev, "workload %zu: %zu bytes free gave %zu weight bytes, less gave %zu", w, cap,
                          bytes, prev);
            prev = bytes;
            for (int l = 0; l < L; l++) {
                const qi_plan_layer *y = &got.layers[l];
                ck_assert(y->attn_dev == y->mlp_dev);
                /* layers on the accelerator are the last ones */
                if (l > 0 && got.layers[l - 1].attn_dev == 1) ck_assert_int_eq(y->attn_dev, 1);
                if (y->split > 0.0f) {
                    n_split++;
                    ck_assert(y->split >= 0.01f && y->split <= 1.0f && y->split_dev == 1 - y->attn_dev);
                    ck_assert(fabsf(y->split * 100 - roundf(y->split * 100)) < 1e-3f);
                } else {
                    ck_assert_int_eq(y->split_dev, -1);
                }
            }
            partial += bytes > 0 && got.head_dev == 0;
            if (got.head_dev == 1) ck_assert_int_eq(got.layers[0].attn_dev, 1);
            qi_plan_free(&got);
        }
        /* with room for it all, every layer and the head */
        size_t layers_head = 0;
        for (int b = 1; b < qi_plan_n_blocks(L); b++) layers_head += qi_plan_block_bytes(&m, b);
        ck_assert_msg(prev == layers_head, "workload %zu: %zu of %zu bytes at the most room", w, prev, layers_head);
    }
    /* the sweeps pass through plans of some layers and split attention */
    ck_assert_msg(n_split > 0 && partial > 0, "splits %d, partial plans %d", n_split, partial);
    qi_placement_policy_free(p);
}
END_TEST

/* stream=1: the layers not held on the accelerator are streamed to it
 * (FlexGen's offload), none computed by the CPU once the staging fits; the
 * held ones the same as stream=0 gives where the staging leaves room, and
 * the memory check counts a streamed layer's KV and two staging slots on
 * the accelerator, its weights on the host. */
START_TEST(test_flexgen_stream) {
    const qi_model m = model();
    qi_placement_policy *p = NULL;
    qi_err e = {0};
    ck_assert_msg(fg_create("profile=" FG_PROFILE ",stream=1", &p, &e) == QI_OK, "%s", e.msg);
    const size_t all = ngl_need(&m, L + 1) * 3, slots = 2 * (qi_plan_block_bytes(&m, 1) + qi_plan_block_bytes(&m, 2));
    int n_streamed = 0, n_mixed = 0;
    for (size_t cap = all / 64; cap <= all; cap += all / 64) {
        qi_placement_devices d = devices(cap);
        qi_plan got = {0};
        ck_assert_msg(qi_placement_policy_plan(p, &m, &d, &wl, &got, &e) == QI_OK, "%zu: %s", cap, e.msg);
        int streamed = 0, held = 0;
        for (int l = 0; l < L; l++) {
            const qi_plan_layer *y = &got.layers[l];
            streamed += y->stream;
            held += y->attn_dev == 1 && !y->stream;
            /* held layers are the last ones: a streamed one never follows one */
            if (l > 0 && got.layers[l - 1].attn_dev == 1 && !got.layers[l - 1].stream) ck_assert(!y->stream);
        }
        if (streamed) {
            ck_assert_int_eq(streamed + held, L); /* no layer on the CPU */
            n_streamed++;
            n_mixed += held > 0;
            /* the staging counts: without room for it the same plan is refused */
            qi_placement_devices tight = devices(qi_placement_need(&m, &wl, &got, 1) - 1);
            ck_assert_int_eq(qi_placement_check(&m, &tight, &wl, &got, 0, &e), QI_ERR_NOMEM);
            qi_err_clear(&e);
            ck_assert(qi_placement_need(&m, &wl, &got, 1) >= slots);
        }
        qi_plan_free(&got);
    }
    ck_assert_msg(n_streamed > 0 && n_mixed > 0, "plans with streamed layers %d, with held ones too %d", n_streamed,
                  n_mixed);
    qi_placement_policy_free(p);
}
END_TEST
#endif

static Suite *placement_suite(void) {
    Suite *s = suite_create("placement");
    TCase *tc = tcase_create("placement");
    tcase_add_test(tc, test_block_bytes);
    tcase_add_test(tc, test_registry);
    tcase_add_test(tc, test_static_fits);
    tcase_add_test(tc, test_static_devices);
    tcase_add_test(tc, test_static_forced);
    tcase_add_test(tc, test_wrapper_refuses);
    suite_add_tcase(s, tc);
    if (g_model) {
        tc = tcase_create("engine");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_engine_agrees);
        tcase_add_test(tc, test_engine_repack_sizes);
        suite_add_tcase(s, tc);
    }
#ifdef QI_HAVE_GLPK
    tc = tcase_create("flexgen");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_flexgen_lp_vs_grid);
    tcase_add_test(tc, test_flexgen_blocked_batches);
    tcase_add_test(tc, test_flexgen_search);
    tcase_add_test(tc, test_flexgen_errors);
    tcase_add_test(tc, test_flexgen_plan);
    tcase_add_test(tc, test_flexgen_stream);
    suite_add_tcase(s, tc);
#endif
    return s;
}

int main(void) {
    const char *cs = qi_test_case();
    if (strcmp(cs, "engine") == 0 || !*cs) g_model = qi_test_load_cached(SMOL_FILE);
    if (strcmp(cs, "engine") == 0) {
        if (!g_model)
            return qi_test_skip("test_placement_engine", SMOL_FILE " not cached (models/fetch.sh smollm2-135m)");
    }
#ifndef QI_HAVE_GLPK
    if (strcmp(cs, "flexgen") == 0) return qi_test_skip("test_placement_flexgen", "built without GLPK");
#endif
    const int rc = qi_test_run_suite(placement_suite());
    qi_model_free(g_model);
    return rc;
}
