/* sha256.h - SHA-256 of buffers and files (hex digest). */
#ifndef QI_SHA256_H
#define QI_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "qinfer/status.h"

typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t n;
} qi_sha256;

void qi_sha256_init(qi_sha256 *s);
void qi_sha256_update(qi_sha256 *s, const void *data, size_t len);
void qi_sha256_final(qi_sha256 *s, char hex[65]);
qi_status qi_sha256_file(const char *path, char hex[65], qi_err *err);
/* 1 when the blocks go through the CPU's SHA instructions (x86 SHA-NI,
 * chosen by CPUID on first use), 0 for the portable C */
int qi_sha256_accelerated(void);
/* portable != 0: the portable C from now on (the tests compare the two);
 * 0: back to the CPU's instructions where it has them */
void qi_sha256_set_portable(int portable);

#endif
