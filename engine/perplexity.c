/* perplexity.c - perplexity, following llama-perplexity's definition exactly (see
 * perplexity.h) so the two figures are comparable digit for digit. */
#include "qinfer/perplexity.h"

#include <math.h>
#include <string.h>

double qi_log_prob(const float *logits, int V, int tok) {
    float mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += expf(logits[i] - mx);
    return logits[tok] - mx - log(sum);
}

qi_status qi_perplexity(const qi_model *m, qi_ctx *c, const int32_t *ids, size_t n_ids, int n_ctx,
                        int max_chunks, qi_ppl_progress cb, void *ud, qi_ppl_result *out, qi_err *err) {
    if (n_ctx < 4) return QI_ERR(err, QI_ERR_INVALID, "perplexity context %d is too small", n_ctx);
    if (n_ids < 2 * (size_t)n_ctx)
        return QI_ERR(err, QI_ERR_INVALID, "the text is %zu tokens; perplexity at context %d needs at least %d",
                      n_ids, n_ctx, 2 * n_ctx);
    if (qi_ctx_n_ctx(c) < n_ctx)
        return QI_ERR(err, QI_ERR_INVALID, "evaluation context holds %d positions, need %d", qi_ctx_n_ctx(c), n_ctx);
    int n_chunk = (int)(n_ids / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    const int V = m->hp.n_vocab, first = n_ctx / 2;
    const bool add_bos = qi_tokenizer_add_bos(m->tok);
    int32_t *buf = qi_malloc(sizeof *buf * (size_t)n_ctx);
    if (!buf) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    double nll = 0, nll2 = 0;
    long count = 0;
    for (int k = 0; k < n_chunk; k++) {
        const int32_t *chunk = ids + (size_t)k * n_ctx;
        for (int i = 0; i < n_ctx; i++) buf[i] = chunk[i];
        if (add_bos) buf[0] = qi_tokenizer_bos(m->tok);
        qi_ctx_reset(c);
        qi_status st = qi_ctx_eval(c, buf, n_ctx, true, err);
        if (st) {
            qi_free(buf);
            return st;
        }
        for (int j = first; j < n_ctx - 1; j++) {
            double lp = qi_log_prob(qi_ctx_logits(c, j), V, chunk[j + 1]);
            nll -= lp;
            nll2 += lp * lp;
            count++;
        }
        if (cb) cb(ud, k + 1, n_chunk, exp(nll / count));
    }
    qi_free(buf);
    double mean = nll / count, var = nll2 / count - mean * mean;
    out->nll = mean;
    out->ppl = exp(mean);
    out->ppl_err = var > 0 ? sqrt(var / (count - 1)) * out->ppl : 0;
    out->count = count;
    out->n_chunks = n_chunk;
    return QI_OK;
}

qi_status qi_perplexity_engine(const qi_model *m, qi_engine *e, const int32_t *ids, size_t n_ids, int n_ctx,
                               int max_chunks, int batch, bool decode, qi_ppl_progress cb, void *ud,
                               qi_ppl_result *out, qi_ppl_kv *kv, qi_err *err) {
    if (n_ctx < 4) return QI_ERR(err, QI_ERR_INVALID, "perplexity context %d is too small", n_ctx);
    if (n_ids < 2 * (size_t)n_ctx)
        return QI_ERR(err, QI_ERR_INVALID, "the text is %zu tokens; perplexity at context %d needs at least %d",
                      n_ids, n_ctx, 2 * n_ctx);
    if (batch < 1 || batch > 256) return QI_ERR(err, QI_ERR_INVALID, "batch %d out of range 1..256", batch);
    int n_chunk = (int)(n_ids / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    const int V = m->hp.n_vocab, first = n_ctx / 2;
    const bool add_bos = qi_tokenizer_add_bos(m->tok);
    struct {
        int id, chunk, fed, j; /* tokens fed; logits consumed (= next position scored) */
    } act[256];
    int n_act = 0, next_chunk = 0, chunks_done = 0;
    double nll = 0, nll2 = 0, kv_w = 0, kv_o = 0, kv_a = 0;
    long count = 0, kv_n = 0;
    int32_t *buf = qi_malloc(sizeof *buf * (size_t)n_ctx);
    if (!buf) return QI_ERR(err, QI_ERR_NOMEM, "out of memory");
    qi_status st = QI_OK;
    while (chunks_done < n_chunk) {
        while (n_act < batch && next_chunk < n_chunk) {
            int id;
            if ((st = qi_engine_seq_add(e, &id, err))) goto out;
            act[n_act].id = id;
            act[n_act].chunk = next_chunk++;
            act[n_act].fed = act[n_act].j = 0;
            n_act++;
        }
        for (int a = 0; a < n_act; a++) {
            if (qi_engine_seq_pending(e, act[a].id) > 0 || act[a].fed == n_ctx) continue;
            const int32_t *chunk = ids + (size_t)act[a].chunk * n_ctx;
            const int n = decode ? 1 : n_ctx;
            memcpy(buf, chunk + act[a].fed, sizeof *buf * (size_t)n);
            if (act[a].fed == 0 && add_bos) buf[0] = qi_tokenizer_bos(m->tok);
            if ((st = qi_engine_seq_feed(e, act[a].id, buf, n, !decode, err))) goto out;
            act[a].fed += n;
        }
        if ((st = qi_engine_step(e, NULL, err))) goto out;
        for (int a = 0; a < n_act; a++) {
            const int32_t *chunk = ids + (size_t)act[a].chunk * n_ctx;
            const int nl = qi_engine_seq_n_logits(e, act[a].id);
            for (int r = 0; r < nl; r++) {
                const int j = act[a].j++;
                if (j < first || j >= n_ctx - 1) continue;
                double lp = qi_log_prob(qi_engine_seq_logits(e, act[a].id, r), V, chunk[j + 1]);
                nll -= lp;
                nll2 += lp * lp;
                count++;
                if (kv) {
                    qi_engine_kv_seq ks;
                    qi_engine_kv_seq_stats(e, act[a].id, &ks);
                    kv_w += (double)ks.work_tokens;
                    kv_o += (double)ks.off_tokens;
                    kv_a += (double)ks.attn_tokens;
                    kv_n++;
                }
            }
        }
        for (int a = 0; a < n_act;) {
            if (act[a].j < n_ctx) {
                a++;
                continue;
            }
            qi_engine_seq_remove(e, act[a].id, NULL);
            act[a] = act[--n_act];
            chunks_done++;
            if (cb) cb(ud, chunks_done, n_chunk, exp(nll / count));
        }
    }
out:
    for (int a = 0; a < n_act; a++) qi_engine_seq_remove(e, act[a].id, NULL);
    qi_free(buf);
    if (st) return st;
    double mean = nll / count, var = nll2 / count - mean * mean;
    out->nll = mean;
    out->ppl = exp(mean);
    out->ppl_err = var > 0 ? sqrt(var / (count - 1)) * out->ppl : 0;
    out->count = count;
    out->n_chunks = n_chunk;
    if (kv) {
        kv->work_tokens = kv_n ? kv_w / kv_n : 0;
        kv->off_tokens = kv_n ? kv_o / kv_n : 0;
        kv->attn_tokens = kv_n ? kv_a / kv_n : 0;
    }
    return QI_OK;
}
