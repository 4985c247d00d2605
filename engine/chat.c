/* chat.c - chat prompt formats recognised from a model's template markers.
 *
 * ChatML (SmolLM2, Qwen, ...): each turn is "<|im_start|>ROLE\nTEXT<|im_end|>\n"
 * and generation starts after "<|im_start|>assistant\n". Some ChatML
 * templates insert a fixed system turn when the conversation has none; we
 * find it as the literal text between "<|im_start|>system\n" and
 * "<|im_end|>" inside the template (only when that text holds no Jinja
 * expression), so the prompt equals what the template renders.
 *
 * Gemma: "<start_of_turn>user\nTEXT<end_of_turn>\n" then "<start_of_turn>model\n";
 * there is no system role, so a system message is put before the first user
 * message, separated by a blank line (as Gemma's own template does). The BOS
 * token comes from the tokenizer (Gemma's add_bos is on).
 */
#include "qinfer/chat.h"

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
    const char *mark = "<|im_start|>system\n";
    const char *s = strstr(tmpl, mark);
    if (s) {
        s += strlen(mark);
        const char *e = strstr(s, "<|im_end|>");
        size_t n = e ? (size_t)(e - s) : 0;
        if (e && n < sizeof out->default_system && !memchr(s, '{', n)) {
            memcpy(out->default_system, s, n);
            out->default_system[n] = 0;
        }
    }
    return QI_OK;
}

qi_status qi_chat_format(const qi_chat_template *t, const char *system, const char *user, char **out,
                         qi_err *err) {
    *out = NULL;
    if (t->kind != QI_CHAT_CHATML && t->kind != QI_CHAT_GEMMA)
        return QI_ERR(err, QI_ERR_UNSUPPORTED, "unknown chat format %d", (int)t->kind);
    if (!system && t->default_system[0]) system = t->default_system;
    size_t n = strlen(user) + (system ? strlen(system) : 0) + 128;
    char *s = qi_malloc(n);
    if (!s) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    if (t->kind == QI_CHAT_GEMMA)
        snprintf(s, n, "<start_of_turn>user\n%s%s%s<end_of_turn>\n<start_of_turn>model\n", system ? system : "",
                 system ? "\n\n" : "", user);
    else if (system)
        snprintf(s, n, "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n",
                 system, user);
    else
        snprintf(s, n, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
    *out = s;
    return QI_OK;
}
