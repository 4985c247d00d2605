/* cmd_inspect.c - `qinfer inspect MODEL`: metadata and tensor table of a GGUF
 * file. Reads only through the validating reader, so it is also the quickest
 * way to see why a file is rejected. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "qinfer/model_files.h"
#include "qinfer/gguf.h"

static void help(void) {
    printf(
        "usage: qinfer inspect [options] MODEL\n\n"
        "Print a GGUF file's metadata and tensor table. MODEL is a path or a cached\n"
        "short name (e.g. smollm2-135m).\n\n"
        "  --full        print whole arrays and strings (default: first few items)\n"
        "  --no-tensors  metadata only\n"
        "  -h, --help    this help\n");
}

/* Print a string with control and non-ASCII bytes escaped, up to max bytes. */
static void put_str(qi_str s, uint64_t max) {
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch == '\n') printf("\\n");
        else if (ch >= 0x20 && ch < 0x7f) putchar(ch);
        else if (ch >= 0x80) putchar(ch); /* UTF-8 passes through */
        else printf("\\x%02x", ch);
    }
    putchar('"');
    if (s.len > max) printf("... (%llu bytes)", (unsigned long long)s.len);
}

static void put_arr(const qi_gguf_arr *arr, bool full, int depth) {
    uint64_t show = full ? arr->n : (arr->n < 8 ? arr->n : 8);
    printf("%s[%llu] [", qi_gguf_vtype_name(arr->type), (unsigned long long)arr->n);
    for (uint64_t i = 0; i < show; i++) {
        if (i) printf(", ");
        int64_t iv;
        double fv;
        qi_str sv;
        qi_gguf_arr sub;
        if (arr->type == QI_GGUF_STRING && qi_gguf_arr_str(arr, i, &sv)) put_str(sv, full ? sv.len : 40);
        else if (arr->type == QI_GGUF_ARRAY && qi_gguf_arr_arr(arr, i, &sub)) put_arr(&sub, full, depth + 1);
        else if ((arr->type == QI_GGUF_F32 || arr->type == QI_GGUF_F64) && qi_gguf_arr_f64(arr, i, &fv)) printf("%g", fv);
        else if (qi_gguf_arr_i64(arr, i, &iv)) printf("%lld", (long long)iv);
        else if (qi_gguf_arr_f64(arr, i, &fv)) printf("%g", fv);
        else printf("?");
    }
    if (show < arr->n) printf(", ...");
    printf("]");
}

int qi_cmd_inspect(int argc, char **argv) {
    const char *cmd = "inspect", *model_arg = NULL;
    bool full = false, tensors = true;
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, NULL, "--full")) full = true;
        else if (qi_args_is(&a, NULL, "--no-tensors")) tensors = false;
        else if (a.flag[0] != '-' && !model_arg) model_arg = a.flag;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!model_arg) {
        qi_cli_error(cmd, "no model given (see qinfer inspect --help)");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    char path[1024];
    qi_gguf *g = NULL;
    if (qi_cache_resolve(model_arg, "model", path, sizeof path, &err) || qi_gguf_open(path, &g, &err))
        return qi_cli_fail(cmd, &err);
    printf("file: %s\nGGUF version %u, %llu bytes, alignment %llu, %llu metadata entries, %llu tensors\n\n", path,
           qi_gguf_version(g), (unsigned long long)qi_gguf_file_size(g), (unsigned long long)qi_gguf_alignment(g),
           (unsigned long long)qi_gguf_n_kv(g), (unsigned long long)qi_gguf_n_tensors(g));
    printf("metadata:\n");
    for (uint64_t i = 0; i < qi_gguf_n_kv(g); i++) {
        const qi_gguf_kv *kv = qi_gguf_kv_at(g, i);
        qi_str key = qi_gguf_kv_key(kv);
        printf("  %-48.*s %-7s ", (int)key.len, key.ptr, qi_gguf_vtype_name(qi_gguf_kv_type(kv)));
        int64_t iv;
        uint64_t uv;
        double fv;
        bool bv;
        qi_str sv;
        qi_gguf_arr arr;
        switch (qi_gguf_kv_type(kv)) {
        case QI_GGUF_STRING: qi_gguf_kv_str(kv, &sv); put_str(sv, full ? sv.len : 80); break;
        case QI_GGUF_ARRAY: qi_gguf_kv_arr(kv, &arr); put_arr(&arr, full, 0); break;
        case QI_GGUF_BOOL: qi_gguf_kv_bool(kv, &bv); printf("%s", bv ? "true" : "false"); break;
        case QI_GGUF_F32:
        case QI_GGUF_F64: qi_gguf_kv_f64(kv, &fv); printf("%g", fv); break;
        case QI_GGUF_U64: qi_gguf_kv_u64(kv, &uv); printf("%llu", (unsigned long long)uv); break;
        default: qi_gguf_kv_i64(kv, &iv); printf("%lld", (long long)iv); break;
        }
        printf("\n");
    }
    if (tensors) {
        printf("\ntensors:\n  %-5s %-36s %-6s %-26s %12s %12s\n", "#", "name", "type", "shape", "offset", "bytes");
        uint64_t total = 0, params = 0;
        for (uint64_t i = 0; i < qi_gguf_n_tensors(g); i++) {
            const qi_gguf_tensor *t = qi_gguf_tensor_at(g, i);
            char shape[64] = "";
            for (uint32_t d = 0; d < t->n_dims; d++) {
                char part[24];
                snprintf(part, sizeof part, d ? " x %llu" : "%llu", (unsigned long long)t->ne[d]);
                strncat(shape, part, sizeof shape - strlen(shape) - 1);
            }
            printf("  %-5llu %-36.*s %-6s %-26s %12llu %12llu\n", (unsigned long long)i, (int)t->name.len,
                   t->name.ptr, qi_type_get(t->type)->name, shape, (unsigned long long)t->offset,
                   (unsigned long long)t->n_bytes);
            total += t->n_bytes;
            params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        }
        printf("\n%llu parameters, %.2f MiB of tensor data\n", (unsigned long long)params, total / 1048576.0);
    }
    qi_gguf_close(g);
    return 0;
}
