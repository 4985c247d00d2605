/* lua_measure.c - the measured helpers of the qinfer Lua module:
 * generate, perplexity and throughput, each one C call over the engine, so
 * that what is timed is the engine and not the Lua loop around it, plus the
 * clock and machine facts experiments label their figures with.
 *
 *   qinfer.generate(engine_or_model, prompt, {n, greedy, temp, ...}) -> text, ids, timing
 *   qinfer.perplexity(model, corpus, {ctx, chunks, decode, batch, kv_...}) -> table
 *   qinfer.throughput(model, {batch, n_gen, prompt, kv_...}) -> table
 *   qinfer.now() -> monotonic seconds; qinfer.sleep(seconds); qinfer.sysinfo() -> table
 *
 * generate repeats the loop of `qinfer generate` (tokenisation, engine size,
 * sampler), so its greedy text is byte-identical to the command's;
 * perplexity calls qi_perplexity_engine as `qinfer ppl` does. Temporaries
 * live in a to-be-closed scratch (lua_int.h): a Lua error raised midway
 * frees the engine, its threads and the token arrays at once.
 */
#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lua_int.h"
#include "qinfer/model_files.h"
#include "qinfer/perplexity.h"
#include "qinfer/sysinfo.h"
#include "qinfer/tokenizer.h"

/* The engine of a helper: the one at idx (its positions in *n_ctx), or a new
 * one over the model at idx (owned by s) with the engine options of opts. */
static qi_engine *helper_engine(lua_State *L, int idx, int opts, lq_scratch *s, const qi_model **m, int max_seqs,
                                int *n_ctx) {
    lq_engine_ud *eu = luaL_testudata(L, idx, LQ_ENGINE);
    if (eu) {
        static const char *const eng_keys[] = {"n_ctx", LQ_ENGINE_KEYS, NULL};
        for (int i = 0; eng_keys[i]; i++) {
            bool given = lq_opt_get(L, opts, eng_keys[i]) != LUA_TNIL;
            lua_pop(L, 1);
            if (given)
                luaL_argerror(L, opts, lua_pushfstring(L, "option '%s' applies only when a model is given, not an "
                                                          "engine", eng_keys[i]));
        }
        if (!eu->e) luaL_argerror(L, idx, "engine is closed");
        *m = eu->mb->m;
        *n_ctx = eu->n_ctx;
        return eu->e;
    }
    lq_model_ud *mu = luaL_testudata(L, idx, LQ_MODEL);
    if (!mu) luaL_typeerror(L, idx, "qinfer engine or model");
    if (!mu->mb) luaL_argerror(L, idx, "model is closed");
    lq_eopts eo;
    lq_read_engine_opts(L, opts, opts, &eo, mu->mb->n_threads);
    eo.o.max_seqs = max_seqs;
    eo.o.n_ctx = *n_ctx;
    qi_err err = {0};
    if (qi_engine_create(mu->mb->m, &eo.o, &s->engine, &err)) lq_fail(L, &err);
    lq_note_plan(L, s->engine);
    s->mb = mu->mb;
    mu->mb->refs++;
    *m = mu->mb->m;
    return s->engine;
}

static const qi_model *arg_model(lua_State *L, int idx) {
    lq_engine_ud *eu = luaL_testudata(L, idx, LQ_ENGINE);
    if (eu) return lq_check_engine(L, idx)->mb->m;
    lq_model_ud *mu = luaL_testudata(L, idx, LQ_MODEL);
    if (!mu) luaL_typeerror(L, idx, "qinfer engine or model");
    return lq_check_model(L, idx)->m;
}

/* qinfer.generate(engine_or_model, prompt, opts) -> text, ids, timing
 * The loop of `qinfer generate`: the same tokenisation, engine sizes and
 * sampler, so greedy output is byte-identical to `qinfer generate --temp 0`.
 * With an engine, one sequence is added for the call and removed after. */
static int l_generate(lua_State *L) {
    static const char *const keys[] = {"n", "greedy", "temp", "top_k", "top_p", "min_p", "repeat_penalty",
                                       "repeat_last_n", "seed", "ignore_eos", "n_ctx", LQ_ENGINE_KEYS, NULL};
    const qi_model *m = arg_model(L, 1);
    if (lua_type(L, 2) != LUA_TSTRING && lua_type(L, 2) != LUA_TTABLE) luaL_typeerror(L, 2, "string or table of ids");
    lq_opts_check(L, 3, 3, keys);
    int n_predict = (int)lq_opt_int(L, 3, 3, "n", 128, 0, 1 << 20);
    qi_sampler_params sp = qi_sampler_defaults();
    bool greedy = lq_opt_bool(L, 3, 3, "greedy", true);
    sp.temp = (float)lq_opt_num(L, 3, 3, "temp", greedy ? 0.0 : sp.temp);
    sp.top_k = (int)lq_opt_int(L, 3, 3, "top_k", sp.top_k, 0, 1 << 30);
    sp.top_p = (float)lq_opt_num(L, 3, 3, "top_p", sp.top_p);
    sp.min_p = (float)lq_opt_num(L, 3, 3, "min_p", sp.min_p);
    sp.repeat_penalty = (float)lq_opt_num(L, 3, 3, "repeat_penalty", sp.repeat_penalty);
    sp.repeat_last_n = (int)lq_opt_int(L, 3, 3, "repeat_last_n", sp.repeat_last_n, 0, 1 << 20);
    sp.seed = (uint64_t)lq_opt_int(L, 3, 3, "seed", (long)sp.seed, 0, LONG_MAX);
    bool ignore_eos = lq_opt_bool(L, 3, 3, "ignore_eos", false);
    int n_ctx = (int)lq_opt_int(L, 3, 3, "n_ctx", 2048 < m->hp.n_ctx_train ? 2048 : m->hp.n_ctx_train, 1,
                             m->hp.n_ctx_train);

    lq_scratch *s = lq_scratch_push(L);
    qi_err err = {0};
    size_t n_ids;
    if (lua_type(L, 2) == LUA_TSTRING) {
        size_t len;
        const char *p = lua_tolstring(L, 2, &len);
        if (qi_tokenize(m->tok, p, len, true, false, &s->ids, &n_ids, &err)) return lq_fail(L, &err);
    } else {
        n_ids = (size_t)lq_read_ids(L, 2, &s->ids);
    }
    if (n_ids == 0) return luaL_argerror(L, 2, "the prompt tokenises to nothing");
    qi_engine *e = helper_engine(L, 1, 3, s, &m, 1, &n_ctx);
    if ((long)n_ids >= n_ctx)
        return luaL_error(L, "the prompt is %d tokens, which does not fit the context of %d", (int)n_ids, n_ctx);
    int sid;
    if (qi_engine_seq_add(e, &sid, &err)) return lq_fail(L, &err);
    s->seq_eng = e;
    s->seq_id = sid;
    if (qi_sampler_create(&sp, m->hp.n_vocab, &s->smp, &err)) return lq_fail(L, &err);
    for (size_t i = 0; i < n_ids; i++) qi_sampler_accept(s->smp, s->ids[i]);
    s->ids2 = qi_malloc(sizeof(int32_t) * (size_t)(n_predict > 0 ? n_predict : 1));
    if (!s->ids2) return luaL_error(L, "out of memory");

    double t0 = lq_now(), t_first = t0;
    if (qi_engine_seq_feed(e, sid, s->ids, (int)n_ids, false, &err)) return lq_fail(L, &err);
    while (qi_engine_seq_pending(e, sid) > 0)
        if (qi_engine_step(e, NULL, &err)) return lq_fail(L, &err);
    int n_gen = 0;
    for (; n_gen < n_predict && qi_engine_seq_n_past(e, sid) < n_ctx; n_gen++) {
        int32_t tok = qi_sampler_sample(s->smp, qi_engine_seq_logits(e, sid, -1));
        qi_sampler_accept(s->smp, tok);
        if (n_gen == 0) t_first = lq_now();
        if (!ignore_eos && qi_tokenizer_is_eog(m->tok, tok)) break;
        s->ids2[n_gen] = tok;
        if (n_gen + 1 < n_predict && qi_engine_seq_n_past(e, sid) < n_ctx &&
            (qi_engine_seq_feed(e, sid, &tok, 1, false, &err) || qi_engine_step(e, NULL, &err)))
            return lq_fail(L, &err);
    }
    double t_end = lq_now();

    size_t cap = qi_tokenizer_max_piece(m->tok) + QI_DETOK_MAX_PENDING;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    qi_detok d;
    qi_detok_init(&d);
    for (int i = 0; i < n_gen; i++) {
        char *p = luaL_prepbuffsize(&b, cap);
        luaL_addsize(&b, qi_detok_push(m->tok, &d, s->ids2[i], false, p, cap));
    }
    char *p = luaL_prepbuffsize(&b, QI_DETOK_MAX_PENDING);
    luaL_addsize(&b, qi_detok_flush(&d, p, QI_DETOK_MAX_PENDING));
    luaL_pushresult(&b);
    lq_push_ids(L, s->ids2, (size_t)n_gen);
    lua_createtable(L, 0, 6);
    lq_set_num(L, "ttft_s", t_first - t0);
    double tpot = n_gen > 1 ? (t_end - t_first) / (n_gen - 1) : 0.0;
    lq_set_num(L, "tpot_s", tpot);
    lq_set_num(L, "tokens_per_s", tpot > 0 ? 1.0 / tpot : 0.0);
    lq_set_num(L, "total_s", t_end - t0);
    lq_set_int(L, "n_prompt", (lua_Integer)n_ids);
    lq_set_int(L, "n_gen", n_gen);
    return 3;
}

/* Read a text file whole into *slot (qi_malloc'ed); its length. */
static size_t read_file(lua_State *L, const char *path, char **slot) {
    FILE *f = fopen(path, "rb");
    if (!f) return (size_t)luaL_error(L, "%s: cannot open", path);
    size_t cap = 1 << 16, len = 0, got;
    *slot = qi_malloc(cap);
    while (*slot && (got = fread(*slot + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *p = qi_realloc(*slot, cap * 2);
            if (!p) {
                qi_free(*slot);
                *slot = NULL;
                break;
            }
            *slot = p;
            cap *= 2;
        }
    }
    fclose(f);
    if (!*slot) return (size_t)luaL_error(L, "out of memory reading %s", path);
    return len;
}

/* qinfer.perplexity(model, corpus, {ctx=512, chunks, decode, batch=4, kv_...})
 * -> {ppl, err, nll, count, chunks, work_tokens, off_tokens, seconds}; as
 * `qinfer ppl` computes it (decode mode implied by a KV policy or budget).
 * work/off_tokens: per (layer, KV head) stream, averaged over scored steps. */
static int l_perplexity(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    const char *corpus = luaL_checkstring(L, 2);
    static const char *const keys[] = {"ctx", "chunks", "decode", "batch", LQ_ENGINE_KEYS, NULL};
    lq_opts_check(L, 3, 3, keys);
    int n_ctx = (int)lq_opt_int(L, 3, 3, "ctx", 512, 8, mb->m->hp.n_ctx_train);
    int max_chunks = (int)lq_opt_int(L, 3, 3, "chunks", -1, -1, 1 << 30);
    int batch = (int)lq_opt_int(L, 3, 3, "batch", 4, 1, 256);
    lq_eopts eo;
    lq_read_engine_opts(L, 3, 3, &eo, mb->n_threads);
    bool decode = lq_opt_bool(L, 3, 3, "decode", eo.kv_given);
    if (max_chunks == 0) return luaL_argerror(L, 3, "option 'chunks': 0 chunks");

    lq_scratch *s = lq_scratch_push(L);
    qi_err err = {0};
    char path[1024];
    if (qi_cache_resolve(corpus, "corpus", path, sizeof path, &err)) return lq_fail(L, &err);
    if (!mb->corpus_ids || strcmp(mb->corpus, path) != 0) {
        qi_free(mb->corpus_ids);
        mb->corpus_ids = NULL;
        mb->corpus[0] = 0;
        size_t len = read_file(L, path, &s->text);
        /* llama-perplexity drops one trailing newline before tokenising */
        if (len > 0 && s->text[len - 1] == '\n') len--;
        if (qi_tokenize(mb->m->tok, s->text, len, true, false, &mb->corpus_ids, &mb->n_corpus_ids, &err))
            return lq_fail(L, &err);
        snprintf(mb->corpus, sizeof mb->corpus, "%s", path);
    }
    size_t n_ids = mb->n_corpus_ids;
    if (n_ids < 2 * (size_t)n_ctx)
        return luaL_error(L, "%s is %d tokens; perplexity at ctx %d needs at least %d", path, (int)n_ids, n_ctx,
                          2 * n_ctx);
    int n_chunk = (int)(n_ids / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    if (!decode) batch = 1;
    eo.o.n_ctx = n_ctx;
    eo.o.max_seqs = batch < n_chunk ? batch : n_chunk;
    if (qi_engine_create(mb->m, &eo.o, &s->engine, &err)) return lq_fail(L, &err);
    lq_note_plan(L, s->engine);
    qi_ppl_result r;
    qi_ppl_kv kv;
    double t0 = lq_now();
    if (qi_perplexity_engine(mb->m, s->engine, mb->corpus_ids, n_ids, n_ctx, max_chunks, eo.o.max_seqs, decode,
                             NULL, NULL, &r, &kv, &err))
        return lq_fail(L, &err);
    const double streams = (double)mb->m->hp.n_layer * mb->m->hp.n_head_kv;
    lua_createtable(L, 0, 9);
    lq_set_num(L, "ppl", r.ppl);
    lq_set_num(L, "err", r.ppl_err);
    lq_set_num(L, "nll", r.nll);
    lq_set_int(L, "count", r.count);
    lq_set_int(L, "chunks", r.n_chunks);
    lq_set_num(L, "work_tokens", decode ? kv.work_tokens / streams : 0.0);
    lq_set_num(L, "off_tokens", decode ? kv.off_tokens / streams : 0.0);
    lq_set_num(L, "seconds", lq_now() - t0);
    lua_pushboolean(L, decode);
    lua_setfield(L, -2, "decode");
    return 1;
}

/* qinfer.throughput(model, {batch=1, n_gen=32, prompt=32|text, kv_...})
 * -> {tokens_per_s, per_seq_tokens_per_s, ttft_s, tpot_s, batch, n_gen, n_prompt}
 * batch sequences get the prompt (a text, or that many pseudo-random ids
 * after BOS, distinct per sequence); ttft_s is the prefill of all of them
 * plus the first token; then n_gen steps of greedy decoding, one token per
 * sequence each: tpot_s is a step's mean time and tokens_per_s the aggregate
 * rate, batch * n_gen / time. */
static int l_throughput(lua_State *L) {
    lq_model *mb = lq_check_model(L, 1);
    static const char *const keys[] = {"batch", "n_gen", "prompt", "n_ctx", LQ_ENGINE_KEYS, NULL};
    lq_opts_check(L, 2, 2, keys);
    const qi_model *m = mb->m;
    int batch = (int)lq_opt_int(L, 2, 2, "batch", 1, 1, 256);
    int n_gen = (int)lq_opt_int(L, 2, 2, "n_gen", 32, 1, 1 << 20);
    lq_scratch *s = lq_scratch_push(L);
    qi_err err = {0};
    size_t n_prompt;
    int pt = lq_opt_get(L, 2, "prompt");
    if (pt == LUA_TSTRING) {
        size_t len;
        const char *p = lua_tolstring(L, -1, &len);
        if (qi_tokenize(m->tok, p, len, true, false, &s->ids, &n_prompt, &err)) return lq_fail(L, &err);
        if (n_prompt == 0) return luaL_argerror(L, 2, "option 'prompt': tokenises to nothing");
    } else if (pt == LUA_TNIL || lua_isinteger(L, -1)) {
        lua_Integer np = pt == LUA_TNIL ? 32 : lua_tointeger(L, -1);
        if (np < 1 || np > (1 << 20)) return luaL_argerror(L, 2, "option 'prompt': token count not in 1..1048576");
        n_prompt = (size_t)np;
        s->ids = qi_malloc(sizeof(int32_t) * n_prompt * (size_t)batch);
        if (!s->ids) return luaL_error(L, "out of memory");
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < n_prompt * (size_t)batch; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            s->ids[i] = (int32_t)(x % (uint64_t)m->hp.n_vocab);
        }
        int32_t bos = qi_tokenizer_bos(m->tok);
        if (bos >= 0)
            for (int b = 0; b < batch; b++) s->ids[(size_t)b * n_prompt] = bos;
    } else {
        return lq_opt_wrong(L, 2, "prompt", "string or integer");
    }
    bool per_seq = pt != LUA_TSTRING;
    lua_pop(L, 1);
    int n_ctx = (int)lq_opt_int(L, 2, 2, "n_ctx", (long)n_prompt + n_gen + 1, 1, m->hp.n_ctx_train);
    if ((long)n_prompt + n_gen > n_ctx)
        return luaL_error(L, "prompt %d + n_gen %d tokens exceed the context of %d", (int)n_prompt, n_gen, n_ctx);
    lq_eopts eo;
    lq_read_engine_opts(L, 2, 2, &eo, mb->n_threads);
    eo.o.max_seqs = batch;
    eo.o.n_ctx = n_ctx;
    if (qi_engine_create(m, &eo.o, &s->engine, &err)) return lq_fail(L, &err);
    lq_note_plan(L, s->engine);
    qi_engine *e = s->engine;
    /* ids2: the sequence ids, then each sequence's first generated token
     * (-1 until its prompt is done). */
    s->ids2 = qi_malloc(sizeof(int32_t) * 2 * (size_t)batch);
    if (!s->ids2) return luaL_error(L, "out of memory");
    int32_t *first = s->ids2 + batch;
    int n;
    double t0 = lq_now();
    for (int b = 0; b < batch; b++) {
        int id;
        if (qi_engine_seq_add(e, &id, &err) ||
            qi_engine_seq_feed(e, id, s->ids + (per_seq ? (size_t)b * n_prompt : 0), (int)n_prompt, false, &err))
            return lq_fail(L, &err);
        s->ids2[b] = id;
        first[b] = -1;
    }
    /* Step while prompts are pending: a step with nothing to run would
     * leave the sequences without logits. A step holds at most step_tokens
     * tokens, so the prompts of a large batch end in different steps, and
     * a sequence's logits last only until the next step: each one's first
     * token is taken in the step its prompt ends. */
    for (bool pending = true; pending;) {
        if (qi_engine_step(e, &n, &err)) return lq_fail(L, &err);
        pending = false;
        for (int b = 0; b < batch; b++) {
            if (qi_engine_seq_pending(e, s->ids2[b]) > 0) {
                pending = true;
            } else if (first[b] < 0) {
                const float *lg = qi_engine_seq_logits(e, s->ids2[b], -1);
                if (!lg) return luaL_error(L, "sequence %d has no logits after its prompt", s->ids2[b]);
                first[b] = qi_argmax(lg, m->hp.n_vocab);
            }
        }
    }
    double t_first = lq_now(), t1 = t_first;
    for (int i = 0; i < n_gen; i++) {
        for (int b = 0; b < batch; b++) {
            int32_t tok = first[b];
            if (i > 0) {
                const float *lg = qi_engine_seq_logits(e, s->ids2[b], -1);
                if (!lg) return luaL_error(L, "sequence %d has no logits after its step", s->ids2[b]);
                tok = qi_argmax(lg, m->hp.n_vocab);
            }
            if (qi_engine_seq_feed(e, s->ids2[b], &tok, 1, false, &err)) return lq_fail(L, &err);
        }
        if (i == 0) t_first = lq_now();
        if (qi_engine_step(e, &n, &err)) return lq_fail(L, &err);
        if (n != batch)
            return luaL_error(L, "a decode step ran %d tokens, not one for each of %d sequences", n, batch);
    }
    t1 = lq_now();
    double dec = t1 - t_first;
    lua_createtable(L, 0, 8);
    lq_set_num(L, "ttft_s", t_first - t0);
    lq_set_num(L, "tpot_s", dec / n_gen);
    lq_set_num(L, "tokens_per_s", dec > 0 ? batch * (double)n_gen / dec : 0.0);
    lq_set_num(L, "per_seq_tokens_per_s", dec > 0 ? n_gen / dec : 0.0);
    lq_set_int(L, "batch", batch);
    lq_set_int(L, "n_gen", n_gen);
    lq_set_int(L, "n_prompt", (lua_Integer)n_prompt);
    return 1;
}

/* qinfer.now() -> seconds on a monotonic clock; qinfer.sleep(seconds) */
static int l_now(lua_State *L) {
    lua_pushnumber(L, lq_now());
    return 1;
}

static int l_sleep(lua_State *L) {
    double s = luaL_checknumber(L, 1);
    luaL_argcheck(L, s >= 0 && s <= 86400, 1, "seconds must be in 0..86400");
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !lq_interrupted) {
    }
    return 0;
}

static int l_sysinfo(lua_State *L) {
    qi_sysinfo si;
    qi_sysinfo_get(&si);
    lua_createtable(L, 0, 10);
    lq_set_str(L, "cpu", si.cpu_model);
    lq_set_int(L, "cores", si.n_cores);
    lq_set_int(L, "threads", si.n_threads);
    lq_set_int(L, "mem_bytes", (lua_Integer)si.mem_bytes);
    lua_pushboolean(L, si.cuda_built);
    lua_setfield(L, -2, "cuda_built");
    lq_set_int(L, "gpus", si.n_gpus);
    lq_set_str(L, "gpu", si.gpu_name);
    lq_set_int(L, "gpu_mem_bytes", (lua_Integer)si.gpu_mem_bytes);
    lq_set_int(L, "cuda_driver", si.cuda_driver);
    lq_set_int(L, "cuda_runtime", si.cuda_runtime);
    lq_set_str(L, "gpu_note", si.gpu_note);
    return 1;
}

const luaL_Reg lq_measure_functions[] = {
    {"generate", l_generate},
    {"perplexity", l_perplexity},
    {"throughput", l_throughput},
    {"now", l_now},
    {"sleep", l_sleep},
    {"sysinfo", l_sysinfo},
    {NULL, NULL},
};
