/* cmd_sysinfo.c - `qinfer sysinfo`: the hardware every figure is labelled
 * with (CPU, cores, memory, GPU and CUDA versions when present; the memory
 * available and the last-level cache that bench sizes its probe by), and with
 * --probe the measured copy bandwidths of the GPU (engine/backend/cuda/device.h),
 * the link and HBM figures the placement cost model starts from.
 *
 * It also reads and writes hardware profiles (qinfer/hwprofile.h):
 * --show-profile checks one and prints it; --profile-out measures this
 * host (cores, memory, read bandwidth, fp32 FMA rate) and writes its
 * cpu-only profile, every number sourced as measured here and now, then
 * reads it back through the same strict reader. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cuda/device.h"
#include "qinfer/hwprofile.h"
#include "qinfer/sysinfo.h"

static int print_probe(void) {
    qi_err err = {0};
    qi_cuda_bw bw;
    fflush(stdout); /* the machine lines stay first even if the probe fails */
    if (qi_cuda_probe(&bw, &err) != QI_OK) {
        qi_err_prefix(&err, "--probe");
        return qi_cli_fail("sysinfo", &err);
    }
    printf("h2d:     pinned %.1f GB/s, pageable %.1f GB/s\n", bw.h2d_pinned_gbs, bw.h2d_pageable_gbs);
    printf("d2h:     pinned %.1f GB/s, pageable %.1f GB/s\n", bw.d2h_pinned_gbs, bw.d2h_pageable_gbs);
    printf("d2d:     %.1f GB/s (read + write counted)\n", bw.d2d_gbs);
    printf("probe:   device %d; median of %d copies of %llu MiB (h2d, d2h), %d of %llu MiB (d2d);\n"
           "         GB/s = 1e9 bytes/s; h2d and d2h count each byte once\n",
           bw.device, bw.n_reps_hd, (unsigned long long)(bw.hd_bytes >> 20), bw.n_reps_dd,
           (unsigned long long)(bw.dd_bytes >> 20));
    return 0;
}

static int show_profile(const char *path) {
    qi_hwprofile p;
    qi_err err = {0};
    if (qi_hwprofile_load(path, &p, &err) != QI_OK) return qi_cli_fail("sysinfo", &err);
    printf("profile: %s (%s), read from %s; SI units as printed (GB = 1e9 bytes, GiB = 2^30)\n", p.name, p.kind,
           path);
    qi_hwprofile_print(&p, stdout);
    return 0;
}

/* Sockets: the distinct "physical id" lines of /proc/cpuinfo (1 when it
 * has none, as in many VMs). */
static int n_sockets(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 1;
    char line[256];
    bool seen[256] = {false};
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        int id;
        if (sscanf(line, "physical id : %d", &id) == 1 && id >= 0 && id < 256 && !seen[id]) {
            seen[id] = true;
            n++;
        }
    }
    fclose(f);
    return n > 0 ? n : 1;
}

/* The profile's name: the file's base name without ".profile". */
static void profile_name(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 8 && strcmp(b + n - 8, ".profile") == 0) n -= 8;
    snprintf(out, cap, "%.*s", (int)n, b);
    for (char *c = out; *c; c++)
        if (*c == '#' || (unsigned char)*c < 0x20) *c = '_';
}

static int write_profile(const char *path) {
    qi_sysinfo s;
    qi_sysinfo_get(&s);
    char cpu[128];
    snprintf(cpu, sizeof cpu, "%s", s.cpu_model);
    for (char *c = cpu; *c; c++)
        if (*c == '#') *c = ' '; /* '#' starts a comment in a profile */
    char name[64];
    profile_name(path, name, sizeof name);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));

    /* opened first: a path that cannot be written fails before the probes */
    FILE *f = fopen(path, "w");
    if (!f) {
        qi_cli_error("sysinfo", "--profile-out: cannot write %s", path);
        return QI_EXIT_RUNTIME;
    }
    /* the read probe's buffer: 512 MiB or twice the last-level cache
     * (past it: some have hundreds of MiB), or a quarter of memory when
     * smaller */
    uint64_t probe_bytes = 512ull << 20;
    if (2 * qi_sysinfo_llc_bytes() > probe_bytes) probe_bytes = 2 * qi_sysinfo_llc_bytes();
    if (s.mem_bytes / 4 < probe_bytes) probe_bytes = s.mem_bytes / 4;
    fprintf(stderr, "qinfer sysinfo: measuring %s (%d threads): read bandwidth, fp32 rate...\n", cpu,
            s.n_threads);
    double bw = qi_sysinfo_mem_read_gbs(probe_bytes, s.n_threads, 3);
    /* the last-level cache (sysfs) and a read within it: a buffer of a
     * quarter of it, at most 16 MiB, so that it stays in the cache while
     * the other cores and tenants use the rest; the best of 20 passes */
    const uint64_t llc = qi_sysinfo_llc_bytes();
    uint64_t llc_probe = llc / 4 < (16ull << 20) ? llc / 4 : 16ull << 20;
    const double llc_bw = llc_probe >= (1u << 20) ? qi_sysinfo_mem_read_gbs(llc_probe, s.n_threads, 20) : -1;
    bool fma = false;
    double flops = qi_sysinfo_fp32_flops(s.n_threads, 3, &fma);
    if (bw <= 0 || flops <= 0) {
        fclose(f);
        remove(path);
        qi_cli_error("sysinfo", "--profile-out: the %s probe failed", bw <= 0 ? "bandwidth" : "fp32");
        return QI_EXIT_RUNTIME;
    }
    /* the load at the time says how much of the machine the probes had */
    double load[1] = {-1};
    if (getloadavg(load, 1) != 1) load[0] = -1;
    char src[200];
    snprintf(src, sizeof src, "measured: qinfer sysinfo --profile-out, %s, %.100s, load average %.1f", date, cpu,
             load[0]);
    fprintf(f,
            "# This host, measured by `qinfer sysinfo --profile-out`: achieved rates\n"
            "# on a possibly busy machine, not datasheet peaks.\n"
            "name = %s\n"
            "kind = cpu-only\n\n"
            "cpu.name = %s\n"
            "cpu.sockets = %d  # source: %s (/proc/cpuinfo physical ids)\n"
            "cpu.cores = %d  # source: %s (physical cores)\n"
            "cpu.fp32 = %.2f GFLOP/s  # source: %s (%d threads, %s, best of 3)\n"
            "cpu.mem_bw = %.2f GB/s  # source: %s (read of %llu MiB, %d threads, best of 3)\n"
            "cpu.mem = %.2f GiB  # source: %s (physical pages)\n",
            name, cpu, n_sockets(), src, s.n_cores, src, flops / 1e9, src, s.n_threads,
            fma ? "8-wide FMA chains" : "plain C multiply-add chains, no FMA", bw, src,
            (unsigned long long)(probe_bytes >> 20), s.n_threads, s.mem_bytes / 1073741824.0, src);
    if (llc > 0 && llc_bw > 0)
        fprintf(f,
                "cpu.llc = %.2f MiB  # source: %s (/sys/devices/system/cpu/cpu0/cache, the last level)\n"
                "cpu.llc_bw = %.2f GB/s  # source: %s (read of %llu MiB, %d threads, best of 20)\n",
                llc / 1048576.0, src, llc_bw, src, (unsigned long long)(llc_probe >> 20), s.n_threads);
    if (fclose(f) != 0) {
        remove(path);
        qi_cli_error("sysinfo", "--profile-out: cannot write %s", path);
        return QI_EXIT_RUNTIME;
    }
    return show_profile(path);
}

int qi_cmd_sysinfo(int argc, char **argv) {
    qi_args a;
    bool probe = false;
    const char *show = NULL, *out = NULL;
    qi_args_init(&a, "sysinfo", argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) {
            printf("usage: qinfer sysinfo [--probe] [--show-profile FILE | --profile-out FILE]\n\n"
                   "Print the CPU, core count, memory and CUDA device this machine has,\n"
                   "as recorded with every benchmark and experiment row, with the memory\n"
                   "available now and the last-level cache (when the kernel lists them).\n\n"
                   "  --probe              also measure GPU 0's copy bandwidths: host-to-device and\n"
                   "                       device-to-host from pinned and from pageable memory (256 MiB\n"
                   "                       copies), and device-to-device (1 GiB copies, read + write\n"
                   "                       counted); medians in GB/s (1e9 bytes/s). Fails (exit 1) when\n"
                   "                       the build has no CUDA or there is no device.\n"
                   "  --show-profile FILE  check a hardware profile (engine/backend/sim/README.md)\n"
                   "                       and print its figures with their sources; a bad file is\n"
                   "                       one line naming its line and field, exit 2 (1 when\n"
                   "                       it cannot be read)\n"
                   "  --profile-out FILE   measure this host (cores, memory, read bandwidth, fp32\n"
                   "                       FMA rate, last-level cache size and read rate; a few\n"
                   "                       seconds) and write its cpu-only profile\n"
                   "                       to FILE, named after FILE, then print it\n");
            return 0;
        }
        if (qi_args_is(&a, NULL, "--probe")) {
            probe = true;
            continue;
        }
        if (qi_args_is(&a, NULL, "--show-profile")) {
            show = qi_args_str(&a);
            continue;
        }
        if (qi_args_is(&a, NULL, "--profile-out")) {
            out = qi_args_str(&a);
            continue;
        }
        qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (show && out) {
        qi_cli_error("sysinfo", "--show-profile and --profile-out do not go together");
        return QI_EXIT_USAGE;
    }
    if (show) return show_profile(show);
    qi_sysinfo s;
    qi_sysinfo_get(&s);
    printf("cpu:     %s\n", s.cpu_model);
    printf("cores:   %d physical, %d logical\n", s.n_cores, s.n_threads);
    uint64_t avail = qi_sysinfo_mem_available(), llc = qi_sysinfo_llc_bytes();
    printf("memory:  %.1f GiB", s.mem_bytes / 1073741824.0);
    if (avail) printf(", %.1f GiB available", avail / 1073741824.0);
    printf("\n");
    if (llc) printf("cache:   last-level %.0f MiB\n", llc / 1048576.0);
    if (!s.cuda_built) {
        printf("gpu:     none (%s)\n", s.gpu_note);
    } else if (s.n_gpus == 0) {
        printf("gpu:     none (%s); CUDA runtime %d.%d\n", s.gpu_note, s.cuda_runtime / 1000, s.cuda_runtime % 1000 / 10);
    } else {
        printf("gpu:     %s, %.1f GiB, %d device(s)\n", s.gpu_name, s.gpu_mem_bytes / 1073741824.0, s.n_gpus);
        printf("cuda:    driver %d.%d, runtime %d.%d\n", s.cuda_driver / 1000, s.cuda_driver % 1000 / 10,
               s.cuda_runtime / 1000, s.cuda_runtime % 1000 / 10);
        /* double data rate: two transfers a memory clock */
        printf("gpu0:    %d SMs, SM clock %d MHz, memory clock %d MHz, %d-bit bus (%.0f GB/s by those figures)\n",
               s.gpu_sms, s.gpu_clock_mhz, s.gpu_mem_clock_mhz, s.gpu_bus_bits,
               2.0 * s.gpu_mem_clock_mhz * 1e6 * (s.gpu_bus_bits / 8) / 1e9);
    }
    if (probe) {
        int rc = print_probe();
        if (rc) return rc;
    }
    return out ? write_profile(out) : 0;
}
