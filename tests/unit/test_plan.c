/* test_plan.c - Check suite for placement plans (qinfer/plan.h): the
 * device list, all-cpu, ngl=N as llama.cpp counts it, plan files (written
 * by qi_plan_format and read back; every malformed line refused with its
 * file and line number), validation, and the summary and JSON forms.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/plan.h"
#include "testutil.h"

static qi_plan two(void) {
    qi_plan p = {0};
    qi_err e = {0};
    ck_assert_msg(qi_plan_devices_parse("cpu,testdev", &p, &e) == QI_OK, "%s", e.msg);
    return p;
}

START_TEST(test_devices) {
    qi_plan p = {0};
    qi_err e = {0};
    ck_assert_int_eq(qi_plan_devices_parse("cpu", &p, &e), QI_OK);
    ck_assert_int_eq(p.n_devices, 1);
    ck_assert_int_eq(qi_plan_devices_parse("cpu,testdev,cuda:0", &p, &e), QI_OK);
    ck_assert_int_eq(p.n_devices, 3);
    ck_assert_str_eq(p.devices[2], "cuda:0");
    static const char *const bad[] = {"", "gpu", "testdev,cpu", "cpu,", "cpu,,testdev", "cpu,a b",
                                      "cpu,testdev,testdev", "cpu,a,b,c,d", "cpu,aaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                      /* the plan file's own words: a layer on "head" would read back as the head's line,
                                       * one on "gpu_batch" as the block schedule's */
                                      "cpu,head", "cpu,c,embd", "cpu,gpu_batch"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qi_err_clear(&e);
        ck_assert_msg(qi_plan_devices_parse(bad[i], &p, &e) == QI_ERR_INVALID, "'%s' accepted", bad[i]);
        ck_assert_msg(strstr(e.msg, "devices") != NULL, "'%s': %s", bad[i], e.msg);
    }
}
END_TEST

START_TEST(test_all_cpu_and_ngl) {
    qi_err e = {0};
    qi_plan p = {0};
    ck_assert_int_eq(qi_plan_parse("all-cpu", 30, &p, &e), QI_OK);
    ck_assert_int_eq(p.n_devices, 1);
    for (int l = 0; l < 30; l++) ck_assert(p.layers[l].attn_dev == 0 && p.layers[l].mlp_dev == 0);
    char s[256];
    qi_plan_summary(&p, s, sizeof s);
    ck_assert_str_eq(s, "all-cpu");
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_OK);
    /* ngl needs a second device */
    ck_assert_int_eq(qi_plan_parse("ngl=3", 30, &p, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "second device"));
    qi_plan_free(&p);
    for (int n = 0; n <= 31; n++) {
        qi_plan q = two();
        char spec[32];
        snprintf(spec, sizeof spec, "ngl=%d", n);
        ck_assert_msg(qi_plan_parse(spec, 30, &q, &e) == QI_OK, "%s", e.msg);
        int on1 = 0;
        for (int l = 0; l < 30; l++) {
            ck_assert_int_eq(q.layers[l].attn_dev, l >= 30 - n ? 1 : 0);
            ck_assert_int_eq(q.layers[l].mlp_dev, q.layers[l].attn_dev);
            on1 += q.layers[l].attn_dev;
        }
        ck_assert_int_eq(on1, n > 30 ? 30 : n);
        ck_assert_int_eq(q.head_dev, n == 31 ? 1 : 0);
        ck_assert_int_eq(q.embd_dev, 0);
        qi_plan_summary(&q, s, sizeof s);
        char want[64];
        if (n == 0)
            snprintf(want, sizeof want, "all-cpu");
        else
            snprintf(want, sizeof want, "ngl=%d (testdev)", n);
        ck_assert_str_eq(s, want);
        qi_plan_free(&q);
    }
    /* above the layer count: every layer and the head, as llama.cpp's -ngl 99 */
    static const char *const all[] = {"ngl=32", "ngl=99", "ngl=2147483647"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        qi_plan q = two();
        ck_assert_msg(qi_plan_parse(all[i], 30, &q, &e) == QI_OK, "%s: %s", all[i], e.msg);
        for (int l = 0; l < 30; l++) ck_assert(q.layers[l].attn_dev == 1 && q.layers[l].mlp_dev == 1);
        ck_assert_int_eq(q.head_dev, 1);
        ck_assert_int_eq(q.embd_dev, 0);
        qi_plan_summary(&q, s, sizeof s);
        ck_assert_str_eq(s, "ngl=31 (testdev)");
        qi_plan_free(&q);
    }
    static const char *const bad[] = {"ngl=", "ngl=-1", "ngl=3x", "ngl=2147483648", "ngl=99999999999999999999", "NGL=3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qi_plan q = two();
        qi_err_clear(&e);
        ck_assert_msg(qi_plan_parse(bad[i], 30, &q, &e) != QI_OK, "'%s' accepted", bad[i]);
        qi_plan_free(&q);
    }
}
END_TEST

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/qi_test_plan_%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return path;
}

START_TEST(test_file_round_trip) {
    qi_err e = {0};
    qi_plan p = two();
    ck_assert_int_eq(qi_plan_all_host(6, &p, &e), QI_OK);
    p.layers[1].attn_dev = 1;
    p.layers[2].mlp_dev = 1;
    p.layers[3].split = 0.25f;
    p.layers[3].split_dev = 1;
    p.layers[4].attn_dev = 1;
    p.layers[4].split = 0.75f;
    p.layers[4].split_dev = 0;
    p.head_dev = 1;
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_OK);
    char text[4096];
    const int n = qi_plan_format(&p, text, sizeof text);
    ck_assert_int_lt(n, (int)sizeof text);
    qi_plan q = two();
    ck_assert_msg(qi_plan_parse(write_tmp(text), 6, &q, &e) == QI_OK, "%s\n%s", e.msg, text);
    ck_assert_int_eq(q.head_dev, 1);
    ck_assert_int_eq(q.embd_dev, 0);
    ck_assert_mem_eq(p.layers, q.layers, sizeof *p.layers * 6);
    char j1[1024], j2[1024];
    qi_plan_json(&p, j1, sizeof j1);
    qi_plan_json(&q, j2, sizeof j2);
    ck_assert_str_eq(j1, j2);
    ck_assert_str_eq(j1, "{\"devices\":[\"cpu\",\"testdev\"],\"embd\":0,\"head\":1,\"layers\":[[0,0],[1,0],[0,1],"
                         "[0,0,0.25,1],[1,0,0.75,0],[0,0]]}");
    char s[256];
    qi_plan_summary(&q, s, sizeof s);
    ck_assert_str_eq(s, "plan: cpu attn 4 mlp 5; testdev attn 2 mlp 1; split layers 2; head testdev");
    /* a short buffer: the length needed, the text cut and terminated */
    char tiny[8];
    ck_assert_int_eq(qi_plan_json(&p, tiny, sizeof tiny), (int)strlen(j1));
    ck_assert_int_eq((int)strlen(tiny), 7);
    /* devices by index, comments, blank lines; split device implied with two devices */
    ck_assert_msg(qi_plan_parse(write_tmp("# a plan\n\n0 0\n1 1 # gpu\ncpu testdev 0.5\n"), 3, &q, &e) == QI_OK,
                  "%s", e.msg);
    ck_assert_int_eq(q.layers[1].attn_dev, 1);
    ck_assert_int_eq(q.layers[2].split_dev, 1);
    /* a device named without its capacity names the capped one of --devices */
    qi_plan c = {0};
    ck_assert_int_eq(qi_plan_devices_parse("cpu,cuda:2G", &c, &e), QI_OK);
    ck_assert_msg(qi_plan_parse(write_tmp("cuda cpu\ncpu cuda 0.5 cuda\nhead cuda\n"), 2, &c, &e) == QI_OK, "%s",
                  e.msg);
    ck_assert_int_eq(c.layers[0].attn_dev, 1);
    ck_assert_int_eq(c.layers[1].split_dev, 1);
    ck_assert_int_eq(c.head_dev, 1);
    ck_assert_int_ne(qi_plan_parse(write_tmp("cud cpu\ncpu cpu\n"), 2, &c, &e), QI_OK); /* a prefix is not a name */
    qi_plan_free(&c);
    qi_plan_free(&p);
    qi_plan_free(&q);
    unlink(write_tmp(""));
}
END_TEST

START_TEST(test_file_errors) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"cpu cpu\ncpu gpu\ncpu cpu\n", ":2: no device 'gpu'"},
        {"cpu cpu\ncpu cpu 1.5\ncpu cpu\n", ":2: split ratio '1.5'"},
        {"cpu cpu\ncpu cpu nan\ncpu cpu\n", ":2: split ratio 'nan'"},
        {"cpu cpu\ncpu\ncpu cpu\n", ":2: a layer line is"},
        {"cpu cpu\ncpu cpu\n", "2 layer lines for a model of 3"},
        {"cpu cpu\ncpu cpu\ncpu cpu\ncpu cpu\n", ":4: more layer lines"},
        {"cpu cpu\ncpu cpu 0.5 cpu\ncpu cpu\n", ":2: split attention needs a second device other"},
        {"embd\ncpu cpu\ncpu cpu\ncpu cpu\n", ":1: 'embd' takes one device"},
        {"head 7\ncpu cpu\ncpu cpu\ncpu cpu\n", ":1: 'head' takes one device"},
        {"cpu cpu 0.5 1 x y z\n", ":1: too many fields"},
        {"\x01\xff garbage\ncpu cpu\ncpu cpu\n", ":1: no device"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qi_plan p = two();
        qi_err e = {0};
        const char *path = write_tmp(cases[i].text);
        ck_assert_msg(qi_plan_parse(path, 3, &p, &e) != QI_OK, "case %zu accepted", i);
        ck_assert_msg(strstr(e.msg, cases[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, e.msg, cases[i].want);
        ck_assert_msg(strstr(e.msg, path) != NULL, "case %zu: '%s' does not name the file", i, e.msg);
        ck_assert_ptr_null(p.layers);
    }
    qi_plan p = two();
    qi_err e = {0};
    ck_assert_int_eq(qi_plan_parse("/nonexistent/plan.txt", 3, &p, &e), QI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "not all-cpu or ngl=N"));
    /* with one device, a split has no second device */
    qi_plan one = {0};
    ck_assert_int_eq(qi_plan_parse(write_tmp("cpu cpu 0.5\n"), 1, &one, &e), QI_ERR_FORMAT);
    unlink(write_tmp(""));
}
END_TEST

/* Streamed layers: `ATTN~ MLP~` in a file, round trips through the text
 * and JSON forms, and the refusals (one device not the host, both marked,
 * no neuron split); the block schedule's `gpu_batch N` likewise. */
START_TEST(test_stream) {
    qi_err e = {0};
    qi_plan p = two();
    ck_assert_msg(qi_plan_parse(write_tmp("testdev~ 1~\ncpu cpu\n1 1 0.5 cpu\n"), 3, &p, &e) == QI_OK, "%s", e.msg);
    ck_assert(p.layers[0].stream && !p.layers[1].stream && !p.layers[2].stream);
    ck_assert_int_eq(p.layers[0].attn_dev, 1);
    ck_assert_int_eq(p.layers[0].mlp_dev, 1);
    char text[2048], j[512], sum[256];
    ck_assert_int_lt(qi_plan_format(&p, text, sizeof text), (int)sizeof text);
    ck_assert_ptr_nonnull(strstr(text, "testdev~ testdev~"));
    qi_plan q = two();
    ck_assert_msg(qi_plan_parse(write_tmp(text), 3, &q, &e) == QI_OK, "%s\n%s", e.msg, text);
    ck_assert_mem_eq(p.layers, q.layers, sizeof *p.layers * 3);
    qi_plan_json(&q, j, sizeof j);
    ck_assert_str_eq(j, "{\"devices\":[\"cpu\",\"testdev\"],\"embd\":0,\"head\":0,\"layers\":[[1,1,0,-1,\"stream\"],"
                        "[0,0],[1,1,0.5,0]]}");
    qi_plan_summary(&q, sum, sizeof sum);
    ck_assert_str_eq(sum, "plan: cpu attn 1 mlp 1; testdev attn 2 mlp 2; split layers 1; streamed layers 1; head cpu");
    /* not ngl=N even when the devices would say so */
    qi_plan n = two();
    ck_assert_int_eq(qi_plan_parse(write_tmp("cpu cpu\n1~ 1~\n"), 2, &n, &e), QI_OK);
    qi_plan_summary(&n, sum, sizeof sum);
    ck_assert_ptr_null(strstr(sum, "ngl"));
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"testdev~ testdev\ncpu cpu\n", ":1: a streamed layer marks both devices"},
        {"cpu~ cpu~\ncpu cpu\n", "layer 0: a streamed layer runs both its blocks on one device other than the cpu"},
        {"testdev~ cpu~\ncpu cpu\n", "layer 0: a streamed layer"},
        {"~ ~\ncpu cpu\n", ":1: no device '~'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qi_plan b = two();
        qi_err_clear(&e);
        ck_assert_msg(qi_plan_parse(write_tmp(bad[i].text), 2, &b, &e) != QI_OK, "case %zu accepted", i);
        ck_assert_msg(strstr(e.msg, bad[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, e.msg, bad[i].want);
    }
    /* the block schedule: `gpu_batch N`, round trip, JSON, summary, refusals */
    qi_plan g = two();
    ck_assert_msg(qi_plan_parse(write_tmp("gpu_batch 48\n1~ 1~\ncpu cpu\n"), 2, &g, &e) == QI_OK, "%s", e.msg);
    ck_assert_int_eq(g.gpu_batch, 48);
    ck_assert_int_lt(qi_plan_format(&g, text, sizeof text), (int)sizeof text);
    ck_assert_ptr_nonnull(strstr(text, "gpu_batch 48\n"));
    qi_plan_free(&g);
    g = two();
    ck_assert_msg(qi_plan_parse(write_tmp(text), 2, &g, &e) == QI_OK, "%s\n%s", e.msg, text);
    ck_assert_int_eq(g.gpu_batch, 48);
    qi_plan_json(&g, j, sizeof j);
    ck_assert_str_eq(j, "{\"devices\":[\"cpu\",\"testdev\"],\"embd\":0,\"head\":0,\"layers\":[[1,1,0,-1,\"stream\"],"
                        "[0,0]],\"gpu_batch\":48}");
    qi_plan_summary(&g, sum, sizeof sum);
    ck_assert_ptr_nonnull(strstr(sum, "block of GPU batches of 48;"));
    g.gpu_batch = -1;
    ck_assert_int_eq(qi_plan_validate(&g, &e), QI_ERR_INVALID);
    qi_plan_free(&g);
    static const char *const bad_gb[] = {"gpu_batch\ncpu cpu\ncpu cpu\n", "gpu_batch 0\ncpu cpu\ncpu cpu\n",
                                         "gpu_batch 2x\ncpu cpu\ncpu cpu\n", "gpu_batch 1 2\ncpu cpu\ncpu cpu\n"};
    for (size_t i = 0; i < sizeof bad_gb / sizeof bad_gb[0]; i++) {
        qi_plan b = two();
        qi_err_clear(&e);
        ck_assert_msg(qi_plan_parse(write_tmp(bad_gb[i]), 2, &b, &e) != QI_OK, "gpu_batch case %zu accepted", i);
        ck_assert_msg(strstr(e.msg, "'gpu_batch' takes one count"), "%s", e.msg);
    }
    p.layers[0].ffn_dev = 1; /* a neuron split on a streamed layer */
    p.layers[0].ffn_rows = 10;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    qi_plan_free(&n);
    qi_plan_free(&p);
    qi_plan_free(&q);
    unlink(write_tmp(""));
}
END_TEST

START_TEST(test_validate) {
    qi_err e = {0};
    qi_plan p = two();
    ck_assert_int_eq(qi_plan_all_host(2, &p, &e), QI_OK);
    p.layers[1].mlp_dev = 2;
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "layer 1"));
    p.layers[1].mlp_dev = 0;
    p.layers[0].split = 0.5f; /* no split device */
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    p.layers[0].split_dev = 0; /* the attention's own */
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    p.layers[0].split_dev = 1;
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_OK);
    /* a neuron split: a device after the cpu other than the MLP's, with neurons */
    p.layers[0].ffn_dev = 1;
    p.layers[0].ffn_rows = 100;
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_OK);
    p.layers[0].ffn_rows = 0;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "neuron split"));
    p.layers[0].ffn_rows = 100;
    p.layers[0].mlp_dev = 1; /* the MLP's own device */
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    p.layers[0].mlp_dev = 0;
    p.layers[0].ffn_dev = 0; /* the cpu */
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    p.layers[0].ffn_dev = -1; /* rows without a device */
    ck_assert_int_eq(qi_plan_validate(&p, &e), QI_ERR_INVALID);
    p.layers[0].ffn_dev = 1;
    char buf[1024];
    ck_assert_int_lt(qi_plan_json(&p, buf, sizeof buf), (int)sizeof buf);
    ck_assert_ptr_nonnull(strstr(buf, "\"ffn\":[[0,1,100]]"));
    qi_plan_summary(&p, buf, sizeof buf);
    ck_assert_ptr_nonnull(strstr(buf, "neuron split layers 1, 100 neurons on"));
    qi_plan_format(&p, buf, sizeof buf);
    ck_assert_ptr_nonnull(strstr(buf, "100 FFN neurons on"));
    qi_plan_free(&p);
    qi_plan_free(&p); /* twice is harmless */
}
END_TEST

static Suite *plan_suite(void) {
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_devices);
    tcase_add_test(tc, test_all_cpu_and_ngl);
    tcase_add_test(tc, test_file_round_trip);
    tcase_add_test(tc, test_file_errors);
    tcase_add_test(tc, test_validate);
    tcase_add_test(tc, test_stream);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return qi_test_run_suite(plan_suite()); }
