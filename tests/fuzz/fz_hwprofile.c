/* fz_hwprofile.c - libFuzzer target: hardware profiles
 * (qi_hwprofile_parse, what --sim PROFILE and `qinfer sysinfo
 * --show-profile` read).
 *
 * Checked: a rejection has a one-line message and leaves the profile
 * cleared; an accepted profile's figures are positive and finite, as the
 * reader promises.
 */
#include <math.h>
#include <string.h>

#include "fz.h"
#include "qinfer/hwprofile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qi_hwprofile p, zero;
    memset(&p, 0xA5, sizeof p);
    memset(&zero, 0, sizeof zero);
    qi_err e = {0};
    if (qi_hwprofile_parse((const char *)data, size, "fuzz.profile", &p, &e) != QI_OK) {
        FZ_CHECK(e.msg[0] && !strchr(e.msg, '\n'), "a rejection without a one-line message: '%s'", e.msg);
        FZ_CHECK(memcmp(&p, &zero, sizeof p) == 0, "a rejected profile is not cleared");
        fz_note("%s", e.msg);
        return 0;
    }
    const qi_hwfig *f[] = {&p.cpu_fp32, &p.cpu_mem_bw, &p.cpu_mem_bytes};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        FZ_CHECK(isfinite(f[i]->value) && f[i]->value > 0, "figure %zu is %g", i, f[i]->value);
    return 0;
}
