/* unicode_norm.c - the Unicode mappings of WordPiece (BERT) normalisation:
 * simple lowercase, the first code point of the canonical decomposition, and
 * the control categories. Binary searches over the generated tables of
 * unicode_norm_data.c (scripts/gen_unicode_norm.py; Unicode 15.1, the version
 * unicode.c's classes have), which were checked code point by code point
 * against llama.cpp's own lowercase, NFD and control tables: identical. */
#include "unicode_int.h"

uint32_t qi_uc_tolower(uint32_t cp) {
    size_t lo = 0, hi = qi_uc_lower_runs_n; /* last run starting at or before cp */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (qi_uc_lower_runs[mid].start <= cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return cp;
    const qi_uc_lower_run *r = &qi_uc_lower_runs[lo - 1];
    uint32_t off = cp - r->start;
    if (off % r->stride || off / r->stride >= r->count) return cp;
    return (uint32_t)((int64_t)cp + r->delta);
}

uint32_t qi_uc_nfd_first(uint32_t cp) {
    size_t lo = 0, hi = qi_uc_nfd_ranges_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (qi_uc_nfd_ranges[mid].first <= cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0 || cp > qi_uc_nfd_ranges[lo - 1].last) return cp;
    return qi_uc_nfd_ranges[lo - 1].target;
}

int qi_uc_is_control(uint32_t cp) {
    size_t lo = 0, hi = qi_uc_control_ranges_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (qi_uc_control_ranges[mid].first <= cp) lo = mid + 1;
        else hi = mid;
    }
    return lo > 0 && cp <= qi_uc_control_ranges[lo - 1].last;
}
