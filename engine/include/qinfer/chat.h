/* chat.h - turn a user message into the prompt text a chat model expects.
 *
 * GGUF files carry their chat template as Jinja text; we do not run Jinja.
 * Instead the template is recognised by its markers and the matching format
 * is produced by code, as llama.cpp's built-in templates do. A template we do
 * not recognise is an error, never a silent guess. A default system message
 * that the template inserts when none is given (SmolLM2's does) is read from
 * the template and inserted the same way. A model whose file carries no
 * template but whose architecture has one fixed format (gemma3's turns) gets
 * that format.
 */
#ifndef QINFER_CHAT_H
#define QINFER_CHAT_H

#include "qinfer/status.h"

typedef enum { QI_CHAT_CHATML = 0, QI_CHAT_GEMMA = 1 } qi_chat_kind;

typedef struct {
    qi_chat_kind kind;
    char default_system[1024]; /* "" when the template adds none */
} qi_chat_template;

/* Recognise the template (NULL: the model has none; arch, which may be NULL,
 * is general.architecture, used when the template is absent). */
qi_status qi_chat_detect(const char *tmpl, const char *arch, qi_chat_template *out, qi_err *err);
/* One user turn, after the system message (NULL: the template's default, if
 * any), followed by the assistant's opening, ready for generation. *out is
 * qi_malloc'ed. */
qi_status qi_chat_format(const qi_chat_template *t, const char *system, const char *user, char **out,
                         qi_err *err);

/* A conversation: turns[0..n_turns) alternate user, assistant, ..., user
 * (n_turns odd), after the system message as above, followed by the
 * assistant's opening. QI_ERR_INVALID for an even count; *out as above. */
qi_status qi_chat_format_turns(const qi_chat_template *t, const char *system, const char *const *turns, int n_turns,
                               char **out, qi_err *err);

#endif
