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
static const unsigned char some_byte = 1;
static qi_layer layers[L];

static qi_weight w(uint64_t row_bytes, int64_t n_rows) {
    return (qi_weight){.data = &some_byte, .n_rows = n_rows, .row_bytes = row_bytes};
}

/* Widths of a tiny llama: 256 wide, 4 heads of 64, 2 KV heads, FFN 512,
 * vocabulary 1000, F16 rows. */
static qi_model model(void) {
    qi_model m = {0};
    m.hp.n_vocab = 1000;
    m.hp.n_embd = 256;
    m.hp.n_layer = L;
    m.hp.n_head = 4;
    m.hp.n_head_kv = 2;
    m.hp.head_dim = 64;
    m.hp.n_ff = 512;
    m.tok_embd = w(512, 1000);
    m.out_norm = w(1024, 1);
    m.output = w(512, 1000);
    for (int l = 0; l < L; l++) {
        layers[l] = (qi_layer){0};
        layers[l].attn_norm = w(1024, 1);
        layers[l].wq = w(512, 256);
        layers[l].wk = w(512, 128);
        layers[l].wv = w(512, 128);
        layers[l].wo = w(512, 256);
        layers[l].ffn_norm = w(1024, 1);
        layers[l].w_gate = w(512, 512);
        layers[l].w_up = w(512, 512);
        layers[l].w_down = w(1024, 256);
    }
    m.layers = layers;
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
    odd.tok_embd = w(3, 7);
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
    return s;
}

int main(void) {
    const char *cs = qi_test_case();
    if (strcmp(cs, "engine") == 0 || !*cs) g_model = qi_test_load_cached(SMOL_FILE);
    if (strcmp(cs, "engine") == 0) {
        if (!g_model)
            return qi_test_skip("test_placement_engine", SMOL_FILE " not cached (models/fetch.sh smollm2-135m)");
    }
    const int rc = qi_test_run_suite(placement_suite());
    qi_model_free(g_model);
    return rc;
}
