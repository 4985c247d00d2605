/* hwprofile.h - hardware profiles: the figures of a system (its GPU, the
 * link to it, the host CPU) that the simulated device will run on, read
 * from the data files of engine/backend/sim/profiles/ (format, units and
 * rules in engine/backend/sim/README.md).
 *
 * Every number in a profile carries its source (a datasheet, a paper, a
 * measurement) and is stored in SI base units: bytes, bytes/s, FLOP/s (or
 * integer OP/s), seconds. The figures are peaks as published or measured;
 * the efficiencies a simulator applies to them are not part of a profile.
 */
#ifndef QINFER_HWPROFILE_H
#define QINFER_HWPROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "qinfer/status.h"

/* One figure: its value in SI base units, the text after "source:" and the
 * line it came from; set is false for an optional figure left out. */
typedef struct {
    double value;
    char source[256];
    int line;
    bool set;
} qi_hwfig;

/* kind: "server", "desktop", "cloud-vm" or "cpu-only"; a cpu-only profile
 * has no gpu.* or link.* field, every other kind has them all (gpu.bf16, gpu.clock,
 * gpu.tdp, cpu.int8, cpu.llc and cpu.llc_bw are optional everywhere). */
typedef struct qi_hwprofile {
    char name[64];
    char kind[16];
    bool has_gpu;
    /* per GPU (gpu.count of them, all alike) */
    char gpu_name[96];
    qi_hwfig gpu_count;
    qi_hwfig gpu_fp16_tensor; /* FLOP/s, dense */
    qi_hwfig gpu_bf16_tensor; /* FLOP/s, dense; optional */
    qi_hwfig gpu_int8_tensor; /* OP/s, dense */
    qi_hwfig gpu_fp32;        /* FLOP/s, non-tensor */
    qi_hwfig gpu_mem_bw;      /* bytes/s */
    qi_hwfig gpu_mem_bytes;   /* bytes */
    qi_hwfig gpu_launch;      /* seconds per kernel launch */
    qi_hwfig gpu_clock;       /* Hz, the boost clock; optional */
    qi_hwfig gpu_tdp;         /* W, the board's power limit; optional */
    /* the host-GPU link */
    char link_name[96];
    qi_hwfig link_h2d_bw; /* bytes/s, host to device */
    qi_hwfig link_d2h_bw; /* bytes/s, device to host */
    qi_hwfig link_latency; /* seconds */
    /* the host */
    char cpu_name[128];
    qi_hwfig cpu_sockets;
    qi_hwfig cpu_cores;    /* physical, all sockets */
    qi_hwfig cpu_fp32;     /* FLOP/s, all cores */
    qi_hwfig cpu_int8;     /* OP/s, all cores; optional */
    qi_hwfig cpu_mem_bw;   /* bytes/s, all sockets */
    qi_hwfig cpu_llc;      /* bytes, the last-level cache (one socket's); optional */
    qi_hwfig cpu_llc_bw;   /* bytes/s, a read within it, all cores; optional */
    qi_hwfig cpu_mem_bytes; /* bytes */
} qi_hwprofile;

/* Read the profile file at `path` into *prof (caller's storage, cleared
 * first). Strict: an unknown or repeated key, a required field missing, a
 * value that is not a positive finite number (a whole one for counts), an
 * unknown unit or one of the wrong kind, or a number without a "# source:"
 * comment is QI_ERR_INVALID with a one-line message "PATH:LINE: FIELD: why"
 * (a missing field names the file's last line). QI_ERR_IO when the file
 * cannot be read. On failure *prof is cleared. */
qi_status qi_hwprofile_load(const char *path, qi_hwprofile *prof, qi_err *err);

/* The same from `len` bytes of text; `name` stands for the file in
 * messages. */
qi_status qi_hwprofile_parse(const char *text, size_t len, const char *name, qi_hwprofile *prof,
                             qi_err *err);

/* Parse "<number> <unit>" as the unit class of a field: 'f' FLOP/s or
 * OP/s, 'b' bandwidth, 'm' bytes, 't' time, 'h' frequency (Hz), 'w' power
 * (W), 'n' a count (no unit). Gives
 * the value in SI base units; false (with why, a short phrase, in *why)
 * when it is not one. Decimal prefixes (k M G T P) are powers of 1000,
 * binary ones (Ki Mi Gi Ti) powers of 1024. */
bool qi_hwprofile_value(const char *s, char unit_class, double *out, const char **why);

/* Print the profile, one figure a line with its unit and source. */
void qi_hwprofile_print(const qi_hwprofile *prof, FILE *out);

#endif
