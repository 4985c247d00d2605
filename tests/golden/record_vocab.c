/* record_vocab.c - llama.cpp's token ids for every line of strings.tsv, with
 * one of llama.cpp's vocabulary-only GGUF files (models/ggml-vocab-*.gguf of
 * the reference sdist): the goldens in tests/golden/vocab/. Built and run by
 * record_vocab.sh against the libllama that build_llama.sh builds; nothing
 * here tokenises by itself.
 *
 *   record_vocab VOCAB.gguf STRINGS.tsv > NAME.tsv
 *
 * For each data line of STRINGS.tsv (hex, category, add_special,
 * parse_special) it prints llama_tokenize's ids, space-separated (an empty
 * line for none), in the same order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: record_vocab VOCAB.gguf STRINGS.tsv\n");
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "record_vocab: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    FILE *f = fopen(argv[2], "r");
    if (!f) {
        fprintf(stderr, "record_vocab: cannot open %s\n", argv[2]);
        return 1;
    }
    static char line[1 << 20], text[1 << 19];
    static llama_token ids[1 << 19];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *field[4] = {line, NULL, NULL, NULL};
        for (int k = 1; k < 4; k++) {
            char *tab = field[k - 1] ? strchr(field[k - 1], '\t') : NULL;
            if (tab) *tab = 0, field[k] = tab + 1;
        }
        if (!field[3]) {
            fprintf(stderr, "record_vocab: a line of %s has fewer than 4 fields\n", argv[2]);
            return 1;
        }
        size_t n = strlen(field[0]) / 2;
        for (size_t i = 0; i < n; i++)
            text[i] = (char)(hexval(field[0][2 * i]) * 16 + hexval(field[0][2 * i + 1]));
        int k = llama_tokenize(vocab, text, (int32_t)n, ids, (int32_t)(sizeof ids / sizeof ids[0]),
                               atoi(field[2]) != 0, atoi(field[3]) != 0);
        if (k < 0) {
            fprintf(stderr, "record_vocab: llama_tokenize failed (%d)\n", k);
            return 1;
        }
        for (int i = 0; i < k; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
    }
    fclose(f);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
