/* cmd_tokenize.c - `qinfer tokenize`: token ids of a text, for checking the
 * tokenizer against other implementations by eye or by script. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "qinfer/model_files.h"
#include "qinfer/model.h"

static void help(void) {
    printf(
        "usage: qinfer tokenize [-m MODEL] -p TEXT [--no-bos] [--special] [--pieces]\n\n"
        "Print the token ids of TEXT, space-separated.\n\n"
        "  -m, --model MODEL  GGUF path or cached short name (default smollm2-135m)\n"
        "  -p, --prompt TEXT  the text\n"
        "      --no-bos       do not add BOS/EOS even if the model asks for them\n"
        "      --special      parse special-token text such as <|im_start|>\n"
        "      --pieces       print one 'id<TAB>piece' per line instead\n"
        "  -h, --help         this help\n");
}

int qi_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *model_arg = "smollm2-135m", *text = NULL;
    bool add_special = true, special = false, pieces = false;
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-p", "--prompt")) text = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--no-bos")) add_special = false;
        else if (qi_args_is(&a, NULL, "--special")) special = true;
        else if (qi_args_is(&a, NULL, "--pieces")) pieces = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!text) {
        qi_cli_error(cmd, "no text given: use -p TEXT");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    char path[1024];
    qi_model *m = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (qi_cache_resolve(model_arg, "model", path, sizeof path, &err) || qi_model_load(path, &m, &err) ||
        qi_tokenize(m->tok, text, strlen(text), add_special, special, &ids, &n, &err)) {
        qi_model_free(m);
        return qi_cli_fail(cmd, &err);
    }
    for (size_t i = 0; i < n; i++) {
        if (pieces) {
            char buf[256];
            size_t nb = qi_token_to_piece(m->tok, ids[i], true, buf, sizeof buf);
            printf("%d\t%.*s\n", ids[i], (int)(nb < sizeof buf ? nb : sizeof buf), buf);
        } else {
            printf("%s%d", i ? " " : "", ids[i]);
        }
    }
    if (!pieces) printf("\n");
    qi_free(ids);
    qi_model_free(m);
    return 0;
}
