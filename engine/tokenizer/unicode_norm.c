/* unicode_norm.c - the Unicode mappings of WordPiece (BERT) normalisation:
 * simple lowercase, the first code point of the canonical decomposition, and
 * the control categories. Binary searches over the generated tables of
 * unicode_norm_data.c (scripts/gen_unicode_norm.py; Unicode 15.1, the version
 * unicode.c's classes have), which were checked code point by code point
 * against llama.cpp's own lowercase, NFD and control tables: identical. */
#include "unicode_int.h"

/* Entries before the first whose leading uint32_t (its start) is above cp:
 * the index + 1 of the last entry starting at or before cp, 0 if none. */
static size_t count_le(const void *tab, size_t n, size_t size, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (*(const uint32_t *)((const char *)tab + mid * size) <= cp) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

uint32_t qi_uc_tolower(uint32_t cp) {
    size_t k = count_le(qi_uc_lower_runs, qi_uc_lower_runs_n, sizeof qi_uc_lower_runs[0], cp);
    if (k == 0) return cp;
    const qi_uc_lower_run *r = &qi_uc_lower_runs[k - 1];
    uint32_t off = cp - r->start;
    if (off % r->stride || off / r->stride >= r->count) return cp;
    return (uint32_t)((int64_t)cp + r->delta);
}

uint32_t qi_uc_nfd_first(uint32_t cp) {
    size_t k = count_le(qi_uc_nfd_ranges, qi_uc_nfd_ranges_n, sizeof qi_uc_nfd_ranges[0], cp);
    if (k == 0 || cp > qi_uc_nfd_ranges[k - 1].last) return cp;
    return qi_uc_nfd_ranges[k - 1].target;
}

int qi_uc_is_control(uint32_t cp) {
    size_t k =
        count_le(qi_uc_control_ranges, qi_uc_control_ranges_n, sizeof qi_uc_control_ranges[0], cp);
    return k > 0 && cp <= qi_uc_control_ranges[k - 1].last;
}
