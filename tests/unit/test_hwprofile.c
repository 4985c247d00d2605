/* test_hwprofile.c - Check suite for hardware profiles (qinfer/hwprofile.h):
 * every shipped profile in engine/backend/sim/profiles/ loads with its
 * figures in SI units; unit conversion, decimal and binary; each kind of
 * malformed file refused with its file, line and field named; and
 * truncated or garbled versions of a good profile never crash the reader.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qinfer/hwprofile.h"
#include "testutil.h"

#define PROFILES QI_SOURCE_DIR "/engine/backend/sim/profiles"

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b); }

START_TEST(test_units) {
    static const struct { const char *s; char c; double want; } ok[] = {
        {"1935 GB/s", 'b', 1935e9}, {"3.35 TB/s", 'b', 3.35e12}, {"1 GiB/s", 'b', 1073741824.0},
        {"10 kB/s", 'b', 1e4}, {"5 B/s", 'b', 5}, {"312 TFLOP/s", 'f', 312e12}, {"624 TOP/s", 'f', 624e12},
        {"1.5 GFLOP/s", 'f', 1.5e9}, {"2 PFLOP/s", 'f', 2e15}, {"80 GiB", 'm', 80.0 * 1073741824.0},
        {"80 GB", 'm', 80e9}, {"2 TiB", 'm', 2.0 * 1099511627776.0}, {"512 MiB", 'm', 512.0 * 1048576},
        {"4 KiB", 'm', 4096}, {"5 us", 't', 5e-6}, {"1.5 ms", 't', 1.5e-3}, {"800 ns", 't', 800e-9},
        {"2 s", 't', 2}, {"56", 'n', 56}, {"  7  ", 'n', 7}, {".5 s", 't', 0.5}, {"1e3 GB/s", 'b', 1e12},
        {"1410 MHz", 'h', 1.41e9}, {"2.52 GHz", 'h', 2.52e9}, {"300 W", 'w', 300}, {"1.5 kW", 'w', 1500}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        double v = -1;
        const char *why = NULL;
        ck_assert_msg(qi_hwprofile_value(ok[i].s, ok[i].c, &v, &why), "'%s' refused: %s", ok[i].s, why);
        ck_assert_msg(near(v, ok[i].want), "'%s' = %g, want %g", ok[i].s, v, ok[i].want);
    }
    static const struct { const char *s; char c; const char *why; } bad[] = {
        {"1935", 'b', "no unit"}, {"1935 GB", 'b', "bandwidth"}, {"1935 Gb/s", 'b', "bandwidth"},
        {"80 GB/s", 'm', "size"}, {"5 TFLOPS", 'f', "compute rate"}, {"5 TiFLOP/s", 'f', "compute rate"},
        {"5 ks", 't', "time"}, {"5 mB", 'm', "size"}, {"0 GB/s", 'b', "positive"}, {"-3 GB/s", 'b', "positive"},
        {"abc", 'b', "not a number"}, {"inf GB/s", 'b', "not a number"}, {"nan s", 't', "not a number"},
        {"0x10 GB", 'm', "not a number"}, {"5GB", 'm', "space"}, {"5 GB extra", 'm', "after the unit"},
        {"2.5", 'n', "whole"}, {"4 cores", 'n', "no unit"}, {"1e400 GB", 'm', "finite"},
        {"1e300 PB", 'm', "range"}, {"", 'n', "not a number"}, {"1e-400 s", 't', "positive"},
        {"1410 GB/s", 'h', "frequency"}, {"1 GiHz", 'h', "frequency"}, {"300 mW", 'w', "power"},
        {"300 Watts", 'w', "power"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double v = -1;
        const char *why = NULL;
        ck_assert_msg(!qi_hwprofile_value(bad[i].s, bad[i].c, &v, &why), "'%s' accepted", bad[i].s);
        ck_assert_msg(why && strstr(why, bad[i].why), "'%s': '%s', want '%s'", bad[i].s, why, bad[i].why);
    }
}
END_TEST

START_TEST(test_shipped) {
    DIR *d = opendir(PROFILES);
    ck_assert_ptr_nonnull(d);
    int n = 0, n_gpu = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 9 || strcmp(de->d_name + len - 8, ".profile") != 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", PROFILES, de->d_name);
        qi_hwprofile p;
        qi_err e = {0};
        ck_assert_msg(qi_hwprofile_load(path, &p, &e) == QI_OK, "%s", e.msg);
        /* the name is the file's */
        ck_assert_msg(strlen(p.name) == len - 8 && strncmp(p.name, de->d_name, len - 8) == 0, "%s: name %s",
                      de->d_name, p.name);
        ck_assert(p.cpu_cores.value >= 1 && p.cpu_mem_bw.value > 1e9 && p.cpu_mem_bytes.value > 1e9);
        if (p.has_gpu) {
            n_gpu++;
            /* sanity ranges that catch a wrong prefix: a GPU has 1..1000 GB
             * of memory, 0.1..100 TB/s, launches in 1..100 us */
            ck_assert(p.gpu_mem_bytes.value > 1e9 && p.gpu_mem_bytes.value < 1e12);
            ck_assert(p.gpu_mem_bw.value > 1e11 && p.gpu_mem_bw.value < 1e14);
            ck_assert(p.gpu_launch.value >= 1e-6 && p.gpu_launch.value <= 1e-4);
            ck_assert(p.gpu_fp16_tensor.value >= p.gpu_fp32.value);
            ck_assert(!p.gpu_clock.set || (p.gpu_clock.value > 5e8 && p.gpu_clock.value < 4e9));
            ck_assert(!p.gpu_tdp.set || (p.gpu_tdp.value >= 30 && p.gpu_tdp.value <= 1500));
            ck_assert(p.link_h2d_bw.value < p.gpu_mem_bw.value);
        }
        n++;
    }
    closedir(d);
    ck_assert_int_ge(n, 6);
    ck_assert_int_ge(n_gpu, 5);

    qi_hwprofile p;
    qi_err e = {0};
    ck_assert_int_eq(qi_hwprofile_load(PROFILES "/a100-pcie-2xeon.profile", &p, &e), QI_OK);
    ck_assert(near(p.gpu_mem_bw.value, 1935e9));
    ck_assert(near(p.gpu_fp16_tensor.value, 312e12));
    ck_assert(near(p.gpu_int8_tensor.value, 624e12));
    ck_assert(near(p.gpu_mem_bytes.value, 80.0 * 1073741824.0));
    ck_assert(near(p.gpu_launch.value, 5e-6));
    ck_assert_ptr_nonnull(strstr(p.gpu_mem_bw.source, "A100 datasheet"));
    ck_assert_int_eq(qi_hwprofile_load(PROFILES "/t4-cloud-vm.profile", &p, &e), QI_OK);
    ck_assert(!p.gpu_bf16_tensor.set);
    ck_assert(near(p.cpu_mem_bytes.value, 208e9));
    ck_assert_int_eq(qi_hwprofile_load(PROFILES "/h200-sxm-pcie5.profile", &p, &e), QI_OK);
    ck_assert(near(p.gpu_mem_bw.value, 4.8e12));
    ck_assert_int_eq(qi_hwprofile_load(PROFILES "/rtx4090-desktop.profile", &p, &e), QI_OK);
    ck_assert(p.gpu_clock.set && near(p.gpu_clock.value, 2520e6) && p.gpu_tdp.set && near(p.gpu_tdp.value, 450));
}
END_TEST

static const char good_cpu[] =
    "# a test profile\n"
    "name = t\n"
    "kind = cpu-only\n"
    "cpu.name = some CPU\n"
    "cpu.sockets = 1        # source: test\n"
    "cpu.cores = 2          # source: test\n"
    "cpu.fp32 = 100 GFLOP/s # source: test\n"
    "cpu.mem_bw = 20 GB/s   # source: test\n"
    "cpu.mem = 16 GiB       # source: test\n";

/* good_cpu with line `line` (1-based) replaced by `with` (NULL: removed),
 * or `with` appended when line is 0; written to /tmp, loaded. */
static qi_status load_edited(int line, const char *with, qi_err *e, char *path, size_t cap) {
    snprintf(path, cap, "/tmp/qi_hwprofile_%d.profile", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    const char *s = good_cpu;
    for (int ln = 1; *s; ln++) {
        const char *nl = strchr(s, '\n');
        if (ln == line) {
            if (with) fprintf(f, "%s\n", with);
        } else {
            fwrite(s, 1, (size_t)(nl - s + 1), f);
        }
        s = nl + 1;
    }
    if (line == 0) fprintf(f, "%s\n", with);
    fclose(f);
    qi_hwprofile p;
    qi_err_clear(e);
    qi_status st = qi_hwprofile_load(path, &p, e);
    if (st != QI_OK) ck_assert_msg(p.name[0] == 0 && !p.cpu_cores.set, "profile not cleared on failure");
    unlink(path);
    return st;
}

START_TEST(test_malformed) {
    char path[256];
    qi_err e = {0};
    ck_assert_msg(load_edited(-1, NULL, &e, path, sizeof path) == QI_OK, "%s", e.msg);
    static const struct { int line; const char *with; int want_line; const char *field, *why; } cases[] = {
        {0, "cpu.flops = 1 GFLOP/s # source: x", 10, "cpu.flops", "unknown key"},
        {0, "cpu.cores = 4 # source: x", 10, "cpu.cores", "repeated (first on line 6)"},
        {6, NULL, 8, "cpu.cores", "required field missing"},
        {2, NULL, 8, "name", "required field missing"},
        {6, "cpu.cores = 0 # source: x", 6, "cpu.cores", "not a positive number"},
        {6, "cpu.cores = -2 # source: x", 6, "cpu.cores", "not a positive number"},
        {6, "cpu.cores = two # source: x", 6, "cpu.cores", "not a number"},
        {6, "cpu.cores = 2.5 # source: x", 6, "cpu.cores", "not a whole number"},
        {8, "cpu.mem_bw = 20 GB/s", 8, "cpu.mem_bw", "without a '# source: ...'"},
        {8, "cpu.mem_bw = 20 GB/s # from the datasheet", 8, "cpu.mem_bw", "without a '# source: ...'"},
        {8, "cpu.mem_bw = 20 GB/s # source:   ", 8, "cpu.mem_bw", "empty source"},
        {8, "cpu.mem_bw = 20 GBps # source: x", 8, "cpu.mem_bw", "unknown unit"},
        {8, "cpu.mem_bw = 20 GiB # source: x", 8, "cpu.mem_bw", "want a bandwidth"},
        {8, "cpu.mem_bw = 20 # source: x", 8, "cpu.mem_bw", "no unit"},
        {9, "cpu.mem = 16 GiB/s # source: x", 9, "cpu.mem", "want a size"},
        {7, "cpu.fp32 = 1 TB/s # source: x", 7, "cpu.fp32", "want a compute rate"},
        {3, "kind = laptop", 3, "kind", "not one of"},
        {3, "kind = server", 9, "gpu.name", "required field missing"},
        {0, "gpu.mem_bw = 1 TB/s # source: x", 10, "gpu.mem_bw", "not allowed in a cpu-only profile"},
        {0, "just words", 10, "(no key)", "expected 'key = value'"},
        {0, "= 5", 10, "(no key)", "expected 'key = value'"},
        {4, "cpu.name =", 4, "cpu.name", "no value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qi_status st = load_edited(cases[i].line, cases[i].with, &e, path, sizeof path);
        ck_assert_msg(st == QI_ERR_INVALID, "case %zu ('%s') accepted", i, cases[i].with ? cases[i].with : "-");
        char want[512];
        snprintf(want, sizeof want, "%s:%d: %s: ", path, cases[i].want_line, cases[i].field);
        ck_assert_msg(strncmp(e.msg, want, strlen(want)) == 0, "case %zu: '%s', want prefix '%s'", i, e.msg, want);
        ck_assert_msg(strstr(e.msg, cases[i].why) != NULL, "case %zu: '%s' lacks '%s'", i, e.msg, cases[i].why);
        ck_assert_msg(strchr(e.msg, '\n') == NULL, "case %zu: message is not one line", i);
    }
    qi_hwprofile p;
    qi_err_clear(&e);
    ck_assert_int_eq(qi_hwprofile_load("/nonexistent/x.profile", &p, &e), QI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent/x.profile"));
    /* an optional field may be left out; CRLF line ends are read */
    ck_assert_int_eq(load_edited(0, "cpu.int8 = 1 TOP/s # source: x\r", &e, path, sizeof path), QI_OK);
}
END_TEST

START_TEST(test_garbled) {
    size_t len;
    char *text = qi_test_read_file(PROFILES "/h100-sxm-dgx.profile", &len);
    ck_assert_ptr_nonnull(text);
    char *buf = malloc(len + 1);
    qi_hwprofile p;
    qi_err e;
    int n_ok = 0;
    /* every truncation */
    for (size_t cut = 0; cut <= len; cut++) {
        qi_err_clear(&e);
        qi_status st = qi_hwprofile_parse(text, cut, "trunc", &p, &e);
        ck_assert(st == QI_OK || st == QI_ERR_INVALID);
        if (st == QI_OK) n_ok++;
        else ck_assert_msg(strncmp(e.msg, "trunc:", 6) == 0, "%s", e.msg);
    }
    ck_assert_int_ge(n_ok, 1); /* at least the whole file */
    /* random byte flips, insertions of awkward bytes, swapped lines */
    static const char awkward[] = {0, '\n', '#', '=', ' ', '\r', '\t', '-', '.', 'e', 'G', '\xff', '9'};
    uint64_t rng = 16;
    int n_iter = qi_test_quick() ? 500 : 5000;
    for (int it = 0; it < n_iter; it++) {
        memcpy(buf, text, len);
        int n_edits = 1 + (int)(qi_test_rand(&rng) % 4);
        for (int k = 0; k < n_edits; k++) {
            size_t at = qi_test_rand(&rng) % len;
            uint64_t r = qi_test_rand(&rng);
            buf[at] = r & 1 ? awkward[(r >> 1) % sizeof awkward] : (char)(r >> 8);
        }
        size_t n = qi_test_rand(&rng) % 2 ? len : qi_test_rand(&rng) % (len + 1);
        qi_err_clear(&e);
        qi_status st = qi_hwprofile_parse(buf, n, "garbled", &p, &e);
        ck_assert(st == QI_OK || st == QI_ERR_INVALID);
        if (st != QI_OK) ck_assert(e.msg[0] && strchr(e.msg, '\n') == NULL);
    }
    free(buf);
    free(text);
}
END_TEST

static Suite *hwprofile_suite(void) {
    Suite *s = suite_create("hwprofile");
    TCase *tc = tcase_create("hwprofile");
    tcase_add_test(tc, test_units);
    tcase_add_test(tc, test_shipped);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_garbled);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return qi_test_run_suite(hwprofile_suite()); }
