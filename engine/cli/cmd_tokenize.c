/* cmd_tokenize.c - `qinfer tokenize`: token ids of a text, for checking the
 * tokenizer against other implementations by eye or by script. Only the
 * file's tokenizer is read (qi_tokenizer_load), so any GGUF with tokenizer
 * metadata works, vocabulary-only files and unsupported architectures
 * included. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "qinfer/model_files.h"
#include "qinfer/tokenizer.h"

static void help(void) {
    printf(
        "usage: qinfer tokenize [-m MODEL] -p TEXT [--no-bos] [--special] [--pieces] [--show-count]\n\n"
        "Print the token ids of TEXT, space-separated.\n\n"
        "  -m, --model MODEL  GGUF path or cached short name (default smollm2-135m); only\n"
        "                     its tokenizer is read: a vocabulary-only GGUF will do\n"
        "  -p, --prompt TEXT  the text\n"
        "      --no-bos       do not add BOS/EOS even if the model asks for them\n"
        "      --special      parse special-token text such as <|im_start|>\n"
        "      --pieces       print one \"ID -> 'PIECE'\" line per token instead, as\n"
        "                     llama.cpp's llama-tokenize does (piece up to any NUL)\n"
        "      --show-count   then print 'Total number of tokens: N'\n"
        "  -h, --help         this help\n");
}

int qi_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *model_arg = "smollm2-135m", *text = NULL;
    bool add_special = true, special = false, pieces = false, count = false;
    qi_args a;
    qi_args_init(&a, cmd, argc, argv);
    while (qi_args_next(&a)) {
        if (qi_args_is(&a, "-h", "--help")) { help(); return 0; }
        else if (qi_args_is(&a, "-m", "--model")) model_arg = qi_args_str(&a);
        else if (qi_args_is(&a, "-p", "--prompt")) text = qi_args_str(&a);
        else if (qi_args_is(&a, NULL, "--no-bos")) add_special = false;
        else if (qi_args_is(&a, NULL, "--special")) special = true;
        else if (qi_args_is(&a, NULL, "--pieces")) pieces = true;
        else if (qi_args_is(&a, NULL, "--show-count")) count = true;
        else qi_args_unknown(&a);
    }
    if (a.failed) return QI_EXIT_USAGE;
    if (!text) {
        qi_cli_error(cmd, "no text given: use -p TEXT");
        return QI_EXIT_USAGE;
    }
    qi_err err = {0};
    char path[1024];
    qi_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (qi_cache_resolve(model_arg, "model", path, sizeof path, &err) || qi_tokenizer_load(path, &tok, &err) ||
        qi_tokenize(tok, text, strlen(text), add_special, special, &ids, &n, &err)) {
        qi_tokenizer_free(tok);
        return qi_cli_fail(cmd, &err);
    }
    size_t cap = qi_tokenizer_max_piece(tok) + 1;
    char *buf = pieces ? qi_malloc(cap) : NULL;
    if (pieces && !buf) {
        qi_free(ids);
        qi_tokenizer_free(tok);
        qi_cli_error(cmd, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (pieces) {
            size_t nb = qi_token_to_piece(tok, ids[i], true, buf, cap);
            const char *nul = memchr(buf, 0, nb); /* llama-tokenize prints it with %s */
            printf("%6d -> '%.*s'\n", ids[i], (int)(nul ? (size_t)(nul - buf) : nb), buf);
        } else {
            printf("%s%d", i ? " " : "", ids[i]);
        }
    }
    if (!pieces) printf("\n");
    if (count) printf("Total number of tokens: %zu\n", n);
    qi_free(buf);
    qi_free(ids);
    qi_tokenizer_free(tok);
    return 0;
}
