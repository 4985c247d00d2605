/* cupti_none.c - a build without CUPTI (or without CUDA): recording
 * kernels and copies is not available, and says so. */
#include <string.h>

#include "cuda/cupti.h"

const char *qi_cupti_dir_name(qi_cupti_dir d) {
    static const char *const names[QI_CUPTI_DIRS] = {"H2D", "D2H", "D2D", "other"};
    return d >= 0 && d < QI_CUPTI_DIRS ? names[d] : "?";
}

qi_status qi_cupti_start(qi_err *err) { return QI_ERR(err, QI_ERR_UNSUPPORTED, "built without CUPTI"); }

qi_status qi_cupti_stop(qi_cupti_totals *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    return QI_ERR(err, QI_ERR_UNSUPPORTED, "built without CUPTI");
}
