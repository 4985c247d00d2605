/* serve_api.c - the OpenAI API's request and answer JSON for `qinfer serve`
 * (serve_api.h), through cJSON: a completion or chat request read, every
 * field type- and range-checked, the prompt tokenised (chat through the
 * model's template) into a qi_sreq; a finished request's answer, with the
 * completions API's logprobs object (echo: the prompt's tokens first).
 * Built only with QI_HAVE_SERVE.
 */
#ifdef QI_HAVE_SERVE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_api.h"

char *qi_serve_utf8_clean(const char *s, size_t n) {
    char *o = qi_malloc(n * 3 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && c != 0 && i + (size_t)len <= n && !(len == 2 && c < 0xC2) && !(c > 0xF4);
        for (int k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (ok && len > 2) { /* no overlong forms, surrogates or values past U+10FFFF */
            const unsigned char c1 = (unsigned char)s[i + 1];
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0) && !(c == 0xF0 && c1 < 0x90) &&
                 !(c == 0xF4 && c1 >= 0x90);
        }
        if (ok) {
            memcpy(p, s + i, (size_t)len);
            p += len;
            i += (size_t)len;
        } else {
            memcpy(p, "\xEF\xBF\xBD", 3);
            p += 3;
            i++;
        }
    }
    *p = '\0';
    return o;
}

cJSON *qi_serve_json_text(const char *s, size_t n) {
    char *t = qi_serve_utf8_clean(s, n);
    cJSON *j = t ? cJSON_CreateString(t) : NULL;
    qi_free(t);
    return j;
}

/* ---- parsing a completion request ---------------------------------------------------- */

/* Reads an optional number field; false (with *msg) when it is of the wrong type or range. */
static bool opt_num(const cJSON *req, const char *key, double lo, double hi, double *v, char *msg, size_t cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(req, key);
    if (!x || cJSON_IsNull(x)) return true;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi)) {
        snprintf(msg, cap, "'%s' must be a number in %g..%g", key, lo, hi);
        return false;
    }
    *v = x->valuedouble;
    return true;
}

static bool opt_bool(const cJSON *req, const char *key, bool *v, char *msg, size_t cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(req, key);
    if (!x || cJSON_IsNull(x)) return true;
    if (!cJSON_IsBool(x)) {
        snprintf(msg, cap, "'%s' must be a boolean", key);
        return false;
    }
    *v = cJSON_IsTrue(x);
    return true;
}

static bool is_int(double v) { return v == floor(v); }

/* The request's prompt text: a completion's prompt, or the chat formatted by
 * the model's template. NULL with *msg on a bad request. */
static char *prompt_of(qi_serve_app *ap, const cJSON *req, bool chat, char *msg, size_t cap) {
    if (!chat) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) p = cJSON_GetArrayItem(p, 0);
        if (!cJSON_IsString(p)) {
            snprintf(msg, cap, "'prompt' must be a string (or a list of one string)");
            return NULL;
        }
        char *t = qi_malloc(strlen(p->valuestring) + 1);
        if (t) strcpy(t, p->valuestring);
        return t;
    }
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) < 1) {
        snprintf(msg, cap, "'messages' must be a non-empty list");
        return NULL;
    }
    const char *system = NULL;
    int n = cJSON_GetArraySize(ms), n_turns = 0;
    const char **turns = qi_malloc(sizeof *turns * (size_t)n);
    if (!turns) {
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(ms, i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
            snprintf(msg, cap, "messages[%d] must have a string 'role' and a string 'content'", i);
            qi_free(turns);
            return NULL;
        }
        const char *want = n_turns % 2 == 0 ? "user" : "assistant";
        if (!strcmp(role->valuestring, "system") && i == 0) system = content->valuestring;
        else if (!strcmp(role->valuestring, want)) turns[n_turns++] = content->valuestring;
        else {
            snprintf(msg, cap, "messages[%d] is '%.64s' where '%s' was due: an optional system message, then "
                               "user and assistant messages in turn, the last one the user's", i,
                     role->valuestring, want);
            qi_free(turns);
            return NULL;
        }
    }
    if (n_turns % 2 == 0) {
        snprintf(msg, cap, "messages must end with a user message");
        qi_free(turns);
        return NULL;
    }
    if (!ap->have_chat) {
        snprintf(msg, cap, "this model has no chat format: %.400s", ap->chat_error);
        qi_free(turns);
        return NULL;
    }
    char *t = NULL;
    qi_err err = {0};
    qi_status st = qi_chat_format_turns(&ap->chat, system, turns, n_turns, &t, &err);
    qi_free(turns);
    if (st) {
        snprintf(msg, cap, "%s", err.msg);
        return NULL;
    }
    return t;
}

unsigned qi_serve_parse_job(qi_serve_app *ap, const char *body, size_t n, bool chat, qi_serve_job *j, char *msg, size_t cap,
                          const char **etype) {
    *etype = "invalid_request_error";
    memset(j, 0, sizeof *j);
    j->chat = chat;
    cJSON *req = cJSON_ParseWithLength(body, n);
    unsigned status = 400;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!req || !cJSON_IsObject(req)) {
        snprintf(msg, cap, "the body is not a JSON object");
        goto out;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, ap->model_id))) {
        snprintf(msg, cap, "unknown model %s%s%s: this server has '%s'", cJSON_IsString(model) ? "'" : "",
                 cJSON_IsString(model) ? model->valuestring : "(not a string)", cJSON_IsString(model) ? "'" : "",
                 ap->model_id);
        *etype = "model_not_found";
        goto out;
    }
    double max_tokens = 16, temp = 1.0, top_p = 1.0, seed = -1, logprobs = -1;
    bool echo = false, stream = false;
    if (!opt_num(req, "max_tokens", 0, 1 << 20, &max_tokens, msg, cap) ||
        !opt_num(req, chat ? "max_completion_tokens" : "max_tokens", 0, 1 << 20, &max_tokens, msg, cap) ||
        !opt_num(req, "temperature", 0, 2, &temp, msg, cap) || !opt_num(req, "top_p", 1e-6, 1, &top_p, msg, cap) ||
        !opt_num(req, "seed", -9.2e18, 9.2e18, &seed, msg, cap) || !opt_bool(req, "stream", &stream, msg, cap) ||
        (!chat && !opt_bool(req, "echo", &echo, msg, cap)) ||
        !opt_bool(req, "qinfer_timeline", &j->timeline, msg, cap) ||
        (!chat && !opt_num(req, "logprobs", 0, QI_SERVE_MAX_TOP, &logprobs, msg, cap)))
        goto out;
    if (!is_int(max_tokens) || !is_int(logprobs) || !is_int(seed)) {
        snprintf(msg, cap, "max_tokens, logprobs and seed must be integers");
        goto out;
    }
    const cJSON *n_choices = cJSON_GetObjectItemCaseSensitive(req, "n");
    if (n_choices && !cJSON_IsNull(n_choices) && !(cJSON_IsNumber(n_choices) && n_choices->valuedouble == 1)) {
        snprintf(msg, cap, "'n' must be 1 (one choice per request)");
        goto out;
    }
    if (!(text = prompt_of(ap, req, chat, msg, cap))) goto out;
    qi_err err = {0};
    const qi_model *m = ap->srv.m;
    if (qi_tokenize(m->tok, text, strlen(text), true, chat, &ids, &n_ids, &err)) {
        snprintf(msg, cap, "%s", err.msg);
        status = err.code == QI_ERR_NOMEM ? 500 : 400;
        goto out;
    }
    if (n_ids == 0) {
        snprintf(msg, cap, "the prompt tokenises to nothing");
        goto out;
    }
    if ((long)n_ids >= ap->srv.n_ctx) {
        snprintf(msg, cap, "the prompt is %zu tokens; the context is %d", n_ids, ap->srv.n_ctx);
        *etype = "context_length_exceeded";
        goto out;
    }
    if (max_tokens > ap->srv.n_ctx - (double)n_ids) max_tokens = ap->srv.n_ctx - (double)n_ids;
    qi_sampler_params sp = qi_sampler_defaults();
    sp.temp = (float)temp;
    sp.top_p = (float)top_p;
    sp.top_k = 0;
    sp.min_p = 0;
    sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)j;
    if (qi_sreq_create(&ap->srv, ids, (int)n_ids, (int)max_tokens, &sp, (int)logprobs, echo && logprobs >= 0,
                       &j->r, &err)) {
        snprintf(msg, cap, "%s", err.msg);
        status = err.code == QI_ERR_NOMEM ? 500 : 400;
        goto out;
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        const cJSON *one = cJSON_IsString(stop) ? stop : NULL;
        int k = one ? 1 : cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : -1;
        if (k < 0 || k > QI_SERVE_MAX_STOP) {
            snprintf(msg, cap, "'stop' must be a string or a list of at most %d strings", QI_SERVE_MAX_STOP);
            goto out;
        }
        for (int i = 0; i < k; i++) {
            const cJSON *s = one ? one : cJSON_GetArrayItem(stop, i);
            if (!cJSON_IsString(s) || !s->valuestring[0]) {
                snprintf(msg, cap, "'stop' must hold non-empty strings");
                goto out;
            }
            if (!qi_sreq_add_stop(j->r, s->valuestring)) {
                snprintf(msg, cap, "out of memory");
                status = 500;
                goto out;
            }
        }
    }
    j->stream = stream;
    j->echo = echo;
    j->prompt_text = text;
    text = NULL;
    status = 0;
out:
    if (status) {
        qi_server_release(&ap->srv, j->r); /* never submitted: freed */
        j->r = NULL;
    }
    qi_free(text);
    qi_free(ids);
    cJSON_Delete(req);
    return status;
}

/* ---- answers --------------------------------------------------------------------------- */

const char *qi_serve_finish_name(qi_finish f) { return f == QI_FINISH_LENGTH ? "length" : "stop"; }

void qi_serve_add_usage(cJSON *o, const qi_serve_job *j) {
    const qi_sreq *r = j->r;
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_gen);
    if (!j->timeline) return;
    /* cJSON prints a number with the digits that read back as the same
     * double, so a client recomputes the server's figures exactly */
    cJSON *t = cJSON_AddObjectToObject(o, "qinfer_timeline");
    cJSON_AddNumberToObject(t, "arrival_s", r->arrival);
    if (!isnan(r->start)) cJSON_AddNumberToObject(t, "start_s", r->start);
    cJSON *a = cJSON_AddArrayToObject(t, "token_s");
    for (int k = 0; k < r->n_gen && a; k++) cJSON_AddItemToArray(a, cJSON_CreateNumber(r->tok_t[k]));
}

static cJSON *piece_json(const qi_model *m, int32_t id) {
    char buf[256];
    size_t n = qi_token_to_piece(m->tok, id, true, buf, sizeof buf);
    return qi_serve_json_text(buf, n < sizeof buf ? n : sizeof buf);
}

/* The completions logprobs object over the prompt's tokens (echo) and the
 * generated ones; text_offset counts bytes of the returned text. */
static cJSON *logprobs_json(const qi_serve_app *ap, const qi_sreq *r, bool echo) {
    const qi_model *m = ap->srv.m;
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    const int from = echo ? 0 : r->n_prompt, to = r->n_prompt + r->n_gen;
    long off = 0;
    for (int pos = from; pos < to; pos++) {
        const int32_t id = pos < r->n_prompt ? r->prompt[pos] : r->out[pos - r->n_prompt];
        cJSON_AddItemToArray(toks, piece_json(m, id));
        cJSON_AddItemToArray(lps, isnan(r->lp[pos]) ? cJSON_CreateNull() : cJSON_CreateNumber(r->lp[pos]));
        if (isnan(r->lp[pos]) || r->logprobs <= 0) {
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
        } else {
            cJSON *t = cJSON_CreateObject();
            for (int k = 0; k < r->logprobs; k++) {
                char buf[256];
                size_t n = qi_token_to_piece(m->tok, r->top_id[(size_t)pos * r->logprobs + k], true, buf, sizeof buf);
                char *key = qi_serve_utf8_clean(buf, n < sizeof buf ? n : sizeof buf);
                if (key && !cJSON_GetObjectItemCaseSensitive(t, key))
                    cJSON_AddNumberToObject(t, key, r->top_lp[(size_t)pos * r->logprobs + k]);
                qi_free(key);
            }
            cJSON_AddItemToArray(tops, t);
        }
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += (long)qi_token_to_piece(m->tok, id, false, NULL, 0);
    }
    return o;
}

cJSON *qi_serve_answer(const qi_serve_app *ap, const qi_serve_job *j, long created) {
    const qi_sreq *r = j->r;
    char id[48];
    snprintf(id, sizeof id, "%s-%ld", j->chat ? "chatcmpl" : "cmpl", r->id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", j->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", ap->model_id);
    cJSON *cs = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cs, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddItemToObject(msg, "content", qi_serve_json_text(r->text, r->n_text));
    } else {
        size_t np = j->echo ? strlen(j->prompt_text) : 0;
        char *all = qi_malloc(np + r->n_text + 1);
        if (all) {
            memcpy(all, j->prompt_text, np);
            memcpy(all + np, r->text, r->n_text);
        }
        cJSON_AddItemToObject(c, "text", all ? qi_serve_json_text(all, np + r->n_text) : NULL);
        qi_free(all);
        if (r->logprobs >= 0) cJSON_AddItemToObject(c, "logprobs", logprobs_json(ap, r, j->echo));
        else cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", qi_serve_finish_name(r->finish));
    qi_serve_add_usage(o, j);
    return o;
}

#endif
