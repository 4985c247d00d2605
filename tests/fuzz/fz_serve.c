/* fz_serve.c - libFuzzer target: `qinfer serve`'s request bodies through
 * the request parser and validator (qi_serve_parse_job, serve_api.c), as
 * the HTTP handlers call it for /v1/completions and /v1/chat/completions,
 * on a server that has a tokenizer and no engine: the parser needs the
 * model's vocabulary (tokenisation, the sampler's size), never its
 * weights, and nothing generates.
 *
 * Input: one byte (bit 0: a chat completion; bit 1: the ChatML template,
 * else Gemma's turns; bit 2: no chat template at all), then the body.
 * Checked: a refusal is a 400 or 500 with a message and an error type and
 * no request; an accepted request's prompt is inside the vocabulary and
 * the context, its token budget fits the context, its stop strings are at
 * most QI_SERVE_MAX_STOP non-empty ones; it is then submitted to a
 * stopping server, which refuses it (2), and released (freed).
 */
#include <string.h>

#include "fz.h"
#include "serve_api.h"

enum { N_CTX = 256 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static qi_model model;
    static qi_serve_app ap[3];
    if (size < 1) return 0;
    if (!model.tok) {
        model.tok = fz_vocab_bpe("smollm");
        model.hp.n_vocab = qi_tokenizer_n_vocab(model.tok);
        snprintf(model.hp.arch_name, sizeof model.hp.arch_name, "llama");
        static const char *const tmpl[3] = {"{{ '<|im_start|>system\\nYou are helpful.<|im_end|>' }}",
                                            "{{ '<start_of_turn>user' }}", NULL};
        for (int i = 0; i < 3; i++) {
            qi_server *s = &ap[i].srv;
            s->m = &model;
            s->n_ctx = N_CTX;
            s->max_queue = 4;
            s->stop = true; /* stopping: nothing is ever queued */
            pthread_mutex_init(&s->mu, NULL);
            pthread_cond_init(&s->work, NULL);
            pthread_cond_init(&s->progress, NULL);
            ap[i].model_id = "fuzz-model";
            qi_err e = {0};
            ap[i].have_chat = qi_chat_detect(tmpl[i], "llama", &ap[i].chat, &e) == QI_OK;
            if (!ap[i].have_chat) snprintf(ap[i].chat_error, sizeof ap[i].chat_error, "%s", e.msg);
        }
    }
    const bool chat = data[0] & 1;
    qi_serve_app *a = &ap[data[0] & 4 ? 2 : data[0] & 2 ? 0 : 1];
    char msg[512] = "";
    const char *etype = NULL;
    qi_serve_job j;
    const unsigned st = qi_serve_parse_job(a, (const char *)data + 1, size - 1, chat, &j, msg, sizeof msg, &etype);
    if (st) {
        FZ_CHECK(st == 400 || st == 500, "status %u", st);
        FZ_CHECK(msg[0] && etype && etype[0], "a refusal without a message or a type");
        FZ_CHECK(j.r == NULL && j.prompt_text == NULL, "a refusal that kept its request");
        fz_note("%u %s: %s", st, etype, msg);
        return 0;
    }
    const qi_sreq *r = j.r;
    FZ_CHECK(r && j.prompt_text && j.chat == chat, "an accepted request without its parts");
    FZ_CHECK(r->n_prompt > 0 && r->n_prompt < N_CTX, "a prompt of %d tokens in a context of %d", r->n_prompt, N_CTX);
    FZ_CHECK(r->max_tokens >= 0 && r->n_prompt + r->max_tokens <= N_CTX, "%d + %d tokens in a context of %d",
             r->n_prompt, r->max_tokens, N_CTX);
    for (int i = 0; i < r->n_prompt; i++)
        FZ_CHECK(r->prompt[i] >= 0 && r->prompt[i] < model.hp.n_vocab, "prompt id %d", r->prompt[i]);
    FZ_CHECK(r->n_stop <= QI_SERVE_MAX_STOP, "%d stop strings", r->n_stop);
    for (int i = 0; i < r->n_stop; i++) FZ_CHECK(r->stop[i][0], "an empty stop string");
    FZ_CHECK(r->logprobs >= -1 && r->logprobs <= QI_SERVE_MAX_TOP, "logprobs %d", r->logprobs);
    fz_note("accepted: %d prompt tokens, %d to generate, %d stops", r->n_prompt, r->max_tokens, r->n_stop);
    FZ_CHECK(qi_server_submit(&a->srv, j.r) == 2, "a stopping server queued a request");
    qi_server_release(&a->srv, j.r);
    qi_free(j.prompt_text);
    return 0;
}
