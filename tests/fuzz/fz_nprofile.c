/* fz_nprofile.c - libFuzzer target: neuron profile files
 * (qi_neuron_profile_readf, what `qinfer neuron-plan --profile` and the
 * neuron policies read; `qinfer profile -o` writes them).
 *
 * Checked: a rejection has a message and leaves the profile zeroed; an
 * accepted profile holds what the reader promises: every neuron's counts
 * whole and within its layer's tokens, every mass finite and >= 0.
 */
#include <math.h>
#include <string.h>

#include "fz.h"
#include "neuron/neuron_policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fmemopen(size ? (void *)data : (void *)"", size, "r");
    if (!f) return 0;
    qi_neuron_profile p, zero;
    memset(&p, 0x5A, sizeof p);
    memset(&zero, 0, sizeof zero);
    qi_err e = {0};
    const qi_status st = qi_neuron_profile_readf(f, "fuzz.txt", &p, &e);
    fclose(f);
    if (st != QI_OK) {
        FZ_CHECK(e.msg[0], "a rejection without a message");
        FZ_CHECK(memcmp(&p, &zero, sizeof p) == 0, "a rejected profile is not zeroed");
        fz_note("%s", e.msg);
        return 0;
    }
    FZ_CHECK(p.n_layer > 0 && p.n_ff > 0, "a profile of %d layers x %d", p.n_layer, p.n_ff);
    for (int l = 0; l < p.n_layer; l++) {
        FZ_CHECK(p.layer_tokens[l] >= 0, "layer %d of %ld tokens", l, p.layer_tokens[l]);
        for (int j = 0; j < p.n_ff; j++) {
            const size_t i = (size_t)l * (size_t)p.n_ff + (size_t)j;
            FZ_CHECK(p.active[i] >= 0 && p.active[i] <= p.layer_tokens[l], "active %lld of %ld",
                     (long long)p.active[i], p.layer_tokens[l]);
            FZ_CHECK(p.hot[i] >= 0 && p.hot[i] <= p.layer_tokens[l], "hot %lld of %ld", (long long)p.hot[i],
                     p.layer_tokens[l]);
            FZ_CHECK(isfinite(p.mass[i]) && p.mass[i] >= 0, "mass %g", p.mass[i]);
        }
    }
    qi_neuron_profile_fini(&p);
    return 0;
}
