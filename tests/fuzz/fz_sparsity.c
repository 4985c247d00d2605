/* fz_sparsity.c - libFuzzer target: sparsity calibration files
 * (qi_sparsity_load, what --sparsity-calib reads; `qinfer
 * sparsity-calibrate` writes them).
 *
 * Input: one byte (bits 0-2: the layer count 1..8; bit 3: teal or cats;
 * bits 4-7: the target share, 0..0.9375), then the file. Checked: a
 * rejection has a message and no thresholds; accepted thresholds are
 * finite and either >= 0 or the "not thresholded" -1.
 */
#include <math.h>
#include <string.h>

#include "fz.h"
#include "qinfer/sparsity.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int n_layer = 1 + (data[0] & 7);
    const qi_sparsity_mode mode = data[0] & 8 ? QI_SPARSITY_CATS : QI_SPARSITY_TEAL;
    const double target = (data[0] >> 4) / 16.0;
    char path[4200];
    fz_path(path, sizeof path, "fuzz.sparsity");
    fz_write(path, data + 1, size - 1);
    qi_sparsity s;
    qi_err e = {0};
    if (qi_sparsity_load(path, mode, target, n_layer, &s, &e) != QI_OK) {
        FZ_CHECK(e.msg[0] && s.thr == NULL, "a rejection without a message or with thresholds");
        fz_note("%s", e.msg);
        return 0;
    }
    FZ_CHECK(s.n_layer == n_layer && s.thr, "thresholds of %d layers for %d", s.n_layer, n_layer);
    for (int i = 0; i < n_layer * QI_SITE_COUNT; i++)
        FZ_CHECK(isfinite(s.thr[i]) && (s.thr[i] >= 0 || s.thr[i] == -1.0f), "threshold %d is %g", i, s.thr[i]);
    qi_sparsity_free(&s);
    return 0;
}
