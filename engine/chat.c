/* chat.c - chat prompt formats recognised from a model's template markers.
 *
 * ChatML (SmolLM2, Qwen, ...): each turn is "<|im_start|>ROLE\nTEXT<|im_end|>\n"
 * and generation starts after "<|im_start|>assistant\n". Some ChatML
 * templates insert a fixed system turn when the conversation has none; we
 * find it as the literal text between "<|im_start|>system" plus a newline
 * (a real one, or the two characters of the escape in a Jinja string, as
 * Qwen2.5's template writes it) and "<|im_end|>" inside the template (only
 * when that text holds no Jinja expression, quote or escape), so the prompt
 * equals what the template renders.
 *
 * Gemma: "<start_of_turn>user\nTEXT<end_of_turn>\n" then "<start_of_turn>model\n";
 * there is no system role, so a system message is put before the first user
 * message, separated by a blank line (as Gemma's own template does). The BOS
 * token comes from the tokenizer (Gemma's add_bos is on).
 */
#include "qinfer/chat.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

qi_status qi_chat_detect(const char *tmpl, const char *arch, qi_chat_template *out, qi_err *err) {
    memset(out, 0, sizeof *out);
    if ((tmpl && strstr(tmpl, "<start_of_turn>")) || (!tmpl && arch && strcmp(arch, "gemma3") == 0)) {
        out->kind = QI_CHAT_GEMMA;
        return QI_OK;
    }
    if (!tmpl) return QI_ERR(err, QI_ERR_UNSUPPORTED, "the model has no chat template (tokenizer.chat_template)");
    if (!strstr(tmpl, "<|im_start|>"))
        return QI_ERR(err, QI_ERR_UNSUPPORTED,
                      "the model's chat template is not one we support (supported: ChatML with <|im_start|>, "
                      "Gemma turns with <start_of_turn>); "
                      "pass the formatted prompt without --chat instead");
    out->kind = QI_CHAT_CHATML;
    /* the newline after "system" as a character (SmolLM2) or as the escape
     * inside a Jinja string literal (Qwen2.5); the first such turn whose
     * text is a plain literal: no expression, quote or escape in it (Qwen's
     * first "<|im_start|>system" turn holds messages[0]['content']) */
    static const char *const marks[] = {"<|im_start|>system\n", "<|im_start|>system\\n"};
    for (size_t k = 0; k < sizeof marks / sizeof marks[0] && !out->default_system[0]; k++) {
        for (const char *s = strstr(tmpl, marks[k]); s; s = strstr(s, marks[k])) {
            s += strlen(marks[k]);
            const char *e = strstr(s, "<|im_end|>");
            if (!e) break;
            const size_t n = (size_t)(e - s);
            if (n > 0 && n < sizeof out->default_system && !memchr(s, '{', n) && !memchr(s, '\'', n) &&
                !memchr(s, '"', n) && !memchr(s, '\\', n)) {
                memcpy(out->default_system, s, n);
                out->default_system[n] = 0;
                break;
            }
        }
    }
    return QI_OK;
}

/* Appends text to the growing prompt; false when out of memory. */
static bool put(char **s, size_t *n, size_t *cap, const char *text) {
    const size_t k = strlen(text);
    if (*n + k + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        while (c < *n + k + 1) c *= 2;
        char *p = qi_realloc(*s, c);
        if (!p) return false;
        *s = p, *cap = c;
    }
    memcpy(*s + *n, text, k + 1);
    *n += k;
    return true;
}

qi_status qi_chat_format_turns(const qi_chat_template *t, const char *system, const char *const *turns, int n_turns,
                               char **out, qi_err *err) {
    *out = NULL;
    if (t->kind != QI_CHAT_CHATML && t->kind != QI_CHAT_GEMMA)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "unknown chat format %d", (int)t->kind);
    if (n_turns < 1 || n_turns % 2 == 0)
        return QI_ERR(err, QI_ERR_INVALID, "a conversation alternates user and assistant turns and ends with the "
                                           "user's: %d turns", n_turns);
    if (!system && t->default_system[0]) system = t->default_system;
    const bool gemma = t->kind == QI_CHAT_GEMMA;
    char *s = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    if (system && !gemma) ok = put(&s, &n, &cap, "<|im_start|>system\n") && put(&s, &n, &cap, system) &&
                               put(&s, &n, &cap, "<|im_end|>\n");
    for (int i = 0; ok && i < n_turns; i++) {
        const bool user = i % 2 == 0;
        if (gemma)
            ok = put(&s, &n, &cap, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n") &&
                 (i > 0 || !system || (put(&s, &n, &cap, system) && put(&s, &n, &cap, "\n\n"))) &&
                 put(&s, &n, &cap, turns[i]) && put(&s, &n, &cap, "<end_of_turn>\n");
        else
            ok = put(&s, &n, &cap, user ? "<|im_start|>user\n" : "<|im_start|>assistant\n") &&
                 put(&s, &n, &cap, turns[i]) && put(&s, &n, &cap, "<|im_end|>\n");
    }
    ok = ok && put(&s, &n, &cap, gemma ? "<start_of_turn>model\n" : "<|im_start|>assistant\n");
    if (!ok) {
        qi_free(s);
        return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return QI_OK;
}

qi_status qi_chat_format(const qi_chat_template *t, const char *system, const char *user, char **out,
                         qi_err *err) {
    return qi_chat_format_turns(t, system, &user, 1, out, err);
}
