/* backend.h - the ops a forward pass is made of, behind an interface.
 *
 * A backend is a table of op functions plus its own context (thread pool,
 * device handles). The forward pass in engine.c only calls through this
 * table, so a CUDA backend, or a split plan that sends attention to one
 * backend and the MLP to another, slots in without touching the model code.
 * The CPU backend is the reference every other backend is tested against.
 *
 * Buffers are host float arrays for the CPU backend. Shapes use the fixed
 * vocabulary: T tokens in this step, H heads, Hkv KV heads, D head dim.
 */
#ifndef QI_BACKEND_H
#define QI_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qinfer/model.h"
#include "qinfer/status.h"

typedef struct qi_backend qi_backend;

/* ---- devices, buffers, copies, events --------------------------------------
 *
 * A backend is a device: a name, a kind, a capacity, and memory in buffers
 * that only it addresses. The engine keeps (buffer, offset) views, never a
 * raw pointer of one device in another's op; the device resolves a view of
 * its own buffer (qi_buf_ptr) and refuses anybody else's.
 *
 * Each device has a main stream: copies and uploads/downloads are queued
 * on it and run in order with its ops, and may return before they have
 * run (a device may run them on a worker, as a GPU's copy engine does);
 * some devices have a copy stream beside it (below). Events mark points
 * in a stream: the host waits for one (qi_event_sync), another device's
 * stream waits for one (qi_event_wait), and two completed events give the
 * device time between them. A failure inside the stream is recorded, the
 * first one sticks, and qi_dev_synchronize returns it (and clears it)
 * after waiting for the stream, as cudaDeviceSynchronize does. Failures
 * the caller can see at once (a bad view, a buffer over the capacity) are
 * returned at once. Every message names the device and the bytes.
 */
typedef enum { QI_DEV_CPU = 0, QI_DEV_TEST = 1, QI_DEV_CUDA = 2, QI_DEV_SIM = 3 } qi_dev_kind;

typedef struct qi_buf qi_buf;
typedef struct qi_event qi_event;

typedef struct {
    qi_buf *buf;
    size_t off;
} qi_view;

typedef struct {
    char name[24];
    qi_dev_kind kind;
    size_t capacity; /* bytes its buffers may hold in all (0: no limit) */
    size_t in_use;   /* bytes in its buffers now */
    size_t peak;     /* the most in use at once */
    bool host_visible; /* its buffers are host memory the host may read and write (the CPU) */
} qi_dev_info;

const qi_dev_info *qi_dev_info_get(const qi_backend *b);
/* A buffer of n bytes on b ("what" names it in messages). Fails, naming
 * the device, the bytes asked and those free, when it would pass the
 * capacity or memory runs out; nothing is then allocated. */
qi_status qi_buf_alloc(qi_backend *b, size_t n, const char *what, qi_buf **out, qi_err *err);
void qi_buf_free(qi_buf *buf); /* NULL is a no-op; the device's stream must not use it any more */
size_t qi_buf_size(const qi_buf *buf);
qi_backend *qi_buf_device(const qi_buf *buf);
static inline qi_view qi_view_of(qi_buf *buf, size_t off) { return (qi_view){buf, off}; }
/* The address of bytes [v.off, v.off + n) of v.buf, for b's own ops: NULL
 * (and a message) when the buffer is another device's or the range is
 * outside it. */
void *qi_buf_ptr(qi_backend *b, qi_view v, size_t n, qi_err *err);

/* Queued on b's stream: n bytes from src to dst, each a buffer of b or of
 * a host-visible device (one of them b's); from or to host memory that
 * must stay valid until the copy has run (an event after it, or a
 * synchronise, says when). */
qi_status qi_dev_copy(qi_backend *b, qi_view dst, qi_view src, size_t n, qi_err *err);
qi_status qi_dev_upload(qi_backend *b, qi_view dst, const void *src, size_t n, qi_err *err);
/* A strided upload, as one command of b's stream: height rows of width
 * bytes, row r from src + r x spitch to dst.off + r x dpitch of dst.buf
 * (pitches at least width; the rows' extent inside the buffer). For
 * blocks strided in a matrix, such as a neuron's quantisation block in
 * every row of a down projection, where one upload a row would pay the
 * link's latency once a row. */
qi_status qi_dev_upload_2d(qi_backend *b, qi_view dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, qi_err *err);
/* The device whose stream a copy from src's buffers to dst's goes on: the
 * one that is not host-visible (src when both are), so the copy is
 * ordered with that device's ops; NULL when neither is host-visible (two
 * devices' memories with no path between them here). */
qi_backend *qi_dev_copy_stream(qi_backend *dst, qi_backend *src);
qi_status qi_dev_download(qi_backend *b, void *dst, qi_view src, size_t n, qi_err *err);

/* A weight in b's own form (the iface's weight_size and weight_prepare):
 * its bytes on b (0: b computes on the model's rows as they are), and
 * that form made in bytes [dst.off, dst.off + size) of dst.buf, one of
 * b's buffers, *out then addressing them. A failure in the stream
 * (the upload) is recorded as a copy's is. */
size_t qi_dev_weight_size(qi_backend *b, const qi_weight *w, bool matmul);
qi_status qi_dev_weight_prepare(qi_backend *b, const qi_weight *w, bool matmul, qi_view dst, qi_weight *out,
                                qi_err *err);

/* An event at the current end of b's stream. */
qi_status qi_event_record(qi_backend *b, qi_event **out, qi_err *err);
/* b's later work (copies and ops) runs after ev, an event of any device
 * (or of b's copy stream, below). */
qi_status qi_event_wait(qi_backend *b, qi_event *ev, qi_err *err);
/* The host waits for ev. */
void qi_event_sync(qi_event *ev);
/* Seconds of device time from a to b, both completed (qi_event_sync). */
double qi_event_elapsed(const qi_event *a, const qi_event *b);
void qi_event_free(qi_event *ev);
/* Wait for everything queued on b; the first failure recorded since the
 * last call, or QI_OK. */
qi_status qi_dev_synchronize(qi_backend *b, qi_err *err);
/* For devices: record a failure met inside the stream (the first sticks). */
void qi_dev_fail(qi_backend *b, qi_status st, const qi_err *e);
/* Tests: the n-th copy, upload, download or weight preparation queued on
 * b from now fails inside the stream (not performed; recorded as the
 * device's failure); 0 turns it off. */
void qi_dev_inject_fail(qi_backend *b, long n);

/* The copy stream. A device may have a second stream for copies (a GPU's
 * copy engine): what is queued there runs beside the main stream's ops
 * and copies, ordered with them only by events, so a long upload does not
 * hold up the ops queued after it. The functions below name the stream
 * they queue on (the ones above all use QI_STREAM_MAIN); on a device with
 * one stream (the CPU, the simulated devices) QI_STREAM_COPY is that
 * stream, and its events order nothing more than stream order does. The
 * device's failure record, injected failures and qi_dev_synchronize (which
 * waits for both streams) are shared. The bytes a copy-stream upload
 * writes must not be read by an op, nor written by the main stream, until
 * the main stream has waited for an event recorded after it
 * (qi_event_wait). Either stream may be fed from any host thread. */
typedef enum { QI_STREAM_MAIN = 0, QI_STREAM_COPY = 1 } qi_stream;
/* Whether b runs QI_STREAM_COPY beside its main stream. */
bool qi_dev_has_copy_stream(const qi_backend *b);
qi_status qi_dev_upload_on(qi_backend *b, qi_stream s, qi_view dst, const void *src, size_t n, qi_err *err);
qi_status qi_dev_upload_2d_on(qi_backend *b, qi_stream s, qi_view dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, qi_err *err);
/* Within b's memory, on its main stream: height rows of width bytes from
 * src.off + r x spitch to dst.off + r x dpitch (both views b's buffers;
 * the rows' extents inside them). */
qi_status qi_dev_copy_2d(qi_backend *b, qi_view dst, size_t dpitch, qi_view src, size_t spitch, size_t width,
                         size_t height, qi_err *err);
/* An event at the current end of b's stream s, and stream s of b made to
 * wait for ev (of any device and stream). */
qi_status qi_event_record_on(qi_backend *b, qi_stream s, qi_event **out, qi_err *err);
qi_status qi_event_wait_on(qi_backend *b, qi_stream s, qi_event *ev, qi_err *err);

/* Attention of one sequence over a paged cache (engine/kv.c): KV head hk
 * holds n_slots[hk] tokens, slot i at row i & (2^shift - 1) of block
 * k_blk[hk][i >> shift] (rows of D fp16 values), position pos[hk][i]. Slot
 * order need not be position order: masking is by position only (a key at
 * a position after the query's is -inf, and so is one at or beyond n_swa
 * positions back when n_swa > 0), and every query scores all the slots, so
 * for slots in position order the lanes are those of a causal attention
 * over a contiguous cache. */
typedef struct {
    int T, H, Hkv, D;
    const int32_t *q_pos;            /* [T] query positions */
    int n_swa;
    float scale;
    const float *q;                  /* [T][H*D] */
    float *out;                      /* [T][H*D] */
    const int *n_slots;              /* [Hkv] */
    const int32_t *const *pos;       /* [Hkv][n_slots[hk]] */
    const uint16_t *const *const *k_blk; /* [Hkv] block tables */
    const uint16_t *const *const *v_blk;
    int shift;
    /* Optional (NULL: none): stats[h * stats_stride + i] += the softmax
     * weight query head h gave slot i, summed over the T queries in query
     * order (t = 0 first), the same sums however the work is split.
     * stats_stride >= every n_slots[hk]; the H rows must not overlap out
     * or another call's stats. */
    float *stats;
    int stats_stride;
    /* Optional (NULL: none; whole attention only, not with part_m or
     * tot_m): SparQ's reallocation of the weight a picking policy left
     * unread. mix[t * H + h] is the share of query t's head h's attention
     * the read slots hold (by the policy's estimate), vmean[hk] KV head
     * hk's mean value over every held token (D floats); the output becomes
     * mix x out + (1 - mix) x vmean. A mix of 1 or more leaves out as it
     * is. */
    const float *mix;
    const float *const *vmean;
    /* A partial result (split attention; NULL: none). With part_m and
     * part_l, the call attends over its slots only and writes, per query
     * and head (row t * H + h of [T][H]): out, the output normalised over
     * these slots; part_m, their largest scaled score (-inf when the query
     * sees none of them, out then 0); part_l, the sum of exp(score -
     * part_m). l * out is the un-normalised output, so partial results
     * over disjoint slot sets merge exactly (attention_merge). The weights
     * are rounded to fp16 as the whole attention rounds them, so a call
     * that holds all of a query's slots gives out bit for bit. No stats. */
    float *part_m, *part_l;
    /* The statistics alone of a split attention (NULL: none): with stats,
     * tot_m and tot_l (the merged max and sum of [T][H], attention_merge's),
     * the call writes no out and adds to stats each of its slots' weight in
     * the softmax over all the parts, exp(score - tot_m) / tot_l rounded to
     * fp16 as the whole attention rounds it. */
    const float *tot_m, *tot_l;
    /* Rows besides the block table's (NULL: none; whole attention only,
     * and only on the host's devices, the CPU and testdev): the offloaded
     * tokens a policy fetches for one step (kv_policy.h's fetch()). KV head
     * hk's slots n_slots[hk] .. n_slots[hk] + x_n[hk] - 1 are the rows
     * x_k[hk][j] and x_v[hk][j] (D fp16 values each) at positions
     * x_pos[hk][j]. They join the table's slots in one softmax, their
     * statistics follow the table's (stats_stride >= n_slots + x_n), and
     * the output is the table's slots' weighted values plus theirs. */
    const int *x_n;
    const int32_t *const *x_pos;
    const uint16_t *const *const *x_k, *const *const *x_v;
} qi_attn_paged_args;

/* The most partial results one merge takes. */
#define QI_ATTN_MAX_PARTS 8

/* Merging n_parts partial results of rows = T * H (query, head) rows of D
 * values: per row, M = max_p m[p], a_p = l[p] exp(m[p] - M), out =
 * sum_p a_p o[p] / sum_p a_p, in double. A row that only one part sees
 * gets that part's o bit for bit. tot_m and tot_l (may be NULL) receive
 * M and sum_p a_p, for a statistics pass. */
typedef struct {
    int rows, D, n_parts;
    const float *const *o;   /* [n_parts] -> [rows][D] */
    const float *const *m;   /* [n_parts] -> [rows] */
    const float *const *l;   /* [n_parts] -> [rows] */
    float *out;              /* [rows][D] */
    float *tot_m, *tot_l;    /* [rows] each, or NULL */
} qi_attn_merge_args;

typedef struct {
    uint32_t version; /* QI_BACKEND_VERSION */
    const char *name;
    /* y[T][w->n_rows] = x[T][w->n_cols] . W^T, activations quantised per
     * row to the weight type's dot partner first (as llama.cpp does). */
    void (*matmul)(qi_backend *b, const qi_weight *w, const float *x, int T, float *y);
    /* y[i] = matmul(w[i], x) for i < n, weights of equal n_cols reading the
     * same x (Q, K and V; gate and up): the same results as n matmul calls,
     * with the activations quantised once per dot type and the rows of all
     * the weights shared out in one pass of the workers. */
    void (*matmul_n)(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T);
    /* y[T][n] = x / rms(x) * w  (y may alias x) */
    void (*rmsnorm)(qi_backend *b, const float *x, const float *w, int T, int n, float eps, float *y);
    /* RoPE in place on q[T][Hq*D] and, unless k is NULL, k[T][Hk*D]: row
     * t at position pos[t], the first n_rot values of each head rotated
     * (n_rot even, <= D); the angles are computed once per row for both. */
    void (*rope)(qi_backend *b, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot, const int32_t *pos,
                 float base, float freq_scale, int mode);
    void (*attention_paged)(qi_backend *b, const qi_attn_paged_args *a);
    /* n calls of attention_paged at once (independent sequences; no
     * call's out or stats overlaps another's): the same results, outputs
     * and statistics bit for bit, as n calls in turn, in one pass of the
     * workers, so a decode step of many sequences does not pay n rounds of
     * synchronisation. Calls with and without stats may be mixed. */
    void (*attention_paged_n)(qi_backend *b, const qi_attn_paged_args *a, int n);
    void (*attention_merge)(qi_backend *b, const qi_attn_merge_args *a);
    /* gate[T][n] = silu(gate) * up, row by row (the SIMD chunks of
     * llama.cpp's op restart at every row) */
    void (*swiglu)(qi_backend *b, float *gate, const float *up, int T, int n);
    /* gate[T][n] = gelu_tanh(gate) * up, with ggml's fp16 GELU table */
    void (*geglu)(qi_backend *b, float *gate, const float *up, int T, int n);
    /* dst[i][0..D) = fp16(src[i][0..D)) for i < n: K and V rows into the
     * cache's blocks (addresses of this device's pool) */
    void (*kv_write)(qi_backend *b, const float *const *src, uint16_t *const *dst, int n, int D);
    /* x[i] += y[i]; x[i] *= s; x[i] = cap * tanh(x[i] / cap), for i < n */
    void (*add)(qi_backend *b, float *x, const float *y, long n);
    void (*scale)(qi_backend *b, float *x, long n, float s);
    void (*softcap)(qi_backend *b, float *x, long n, float cap);
    /* row r of x[.][width] = row rows[r], for r < n, rows ascending and
     * rows[r] >= r (a step's output rows, gathered to the front in place) */
    void (*gather_rows)(qi_backend *b, float *x, const int32_t *rows, int n, int width);
    /* out[T][w->n_cols] = rows ids[t] of w, dequantised */
    void (*get_rows)(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out);
    /* Size scratch for activations of up to scratch_bytes (quantised rows),
     * ops of up to max_rows rows (tokens), and attention over up to max_pos
     * positions of Hkv KV heads of D values; called before any op, so
     * nothing allocates inside a step. */
    qi_status (*reserve)(qi_backend *b, size_t scratch_bytes, int max_rows, int max_pos, int Hkv, int D,
                         qi_err *err);
    void (*free)(qi_backend *b);
    /* The device (see the top): memory of a buffer (NULL: out of memory),
     * its release, a queued copy of n bytes between addresses its
     * buf_ptr gave or host memory, an event marker queued on the stream
     * (its time written and *done set when the stream reaches it), making
     * the stream wait for another event, and waiting for the stream. */
    void *(*buf_mem)(qi_backend *b, size_t n);
    void (*buf_release)(qi_backend *b, void *mem);
    void (*copy)(qi_backend *b, void *dst, const void *src, size_t n);
    /* Optional (NULL: height copies of width bytes): height rows of width
     * bytes, row r from src + r x spitch to dst + r x dpitch, as one queued
     * copy (cudaMemcpy2DAsync: one launch, not one a row). */
    void (*copy_2d)(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height);
    void (*mark)(qi_backend *b, qi_event *ev);
    void (*wait)(qi_backend *b, qi_event *ev);
    void (*drain)(qi_backend *b);
    /* Weights in the device's own form, made when a plan gives the device
     * a block of them (both NULL: the rows as they are, uploaded).
     * weight_size: the bytes w takes on b, 0 when b computes on w's own
     * rows (host memory it reads: the CPU); matmul says w is the matrix of
     * a matmul, not a vector or a table read by row (get_rows).
     * weight_prepare: that form written to mem (weight_size bytes of one
     * of b's buffers, as qi_buf_ptr gave them), ordered on b's stream
     * before its later ops, and *out set to w with its addresses in mem
     * (a CPU may repack the rows into its matmul order there; a GPU
     * uploads them). */
    size_t (*weight_size)(qi_backend *b, const qi_weight *w, bool matmul);
    void (*weight_prepare)(qi_backend *b, const qi_weight *w, bool matmul, void *mem, qi_weight *out);
    /* Optional (NULL: nothing): the host has waited for an event of b that
     * completed at device time t (qi_event_sync). A device whose clock is
     * not the host's (the simulated ones) moves the host's clock up. */
    void (*host_wait)(qi_backend *b, double t);
    /* Optional ops of the architectures only simulated devices run (OPT,
     * Falcon; NULL on the CPU, testdev and CUDA, and the engine refuses
     * such a model on a device without them):
     * layernorm: y[T][n] = (x - mean(x)) / sqrt(var(x) + eps) * w + bias
     * (bias may be NULL; y may alias x);
     * act: x[T][n] = relu(x) (gelu false) or gelu(x), in place, no gate.
     * And one every device has (qwen2's q, k, v biases; OPT's biases):
     * add_bias: x[t][i] += bias[i] for t < T, i < n, one f32 add each. */
    void (*layernorm)(qi_backend *b, const float *x, const float *w, const float *bias, int T, int n, float eps,
                      float *y);
    void (*add_bias)(qi_backend *b, float *x, const float *bias, int T, int n);
    void (*act)(qi_backend *b, bool gelu, float *x, int T, int n);
    /* Optional (both NULL: a marker completes its event itself, as the
     * CPU's and testdev's do): markers the host completes by asking (a
     * CUDA event recorded on the stream, kept in *qi_event_impl(ev)).
     * ev_sync: block until the stream has passed ev's marker, then
     * qi_event_complete it with its device time; ev_release: ev is being
     * freed, let its marker go (without waiting for it). */
    void (*ev_sync)(qi_backend *b, qi_event *ev);
    void (*ev_release)(qi_backend *b, qi_event *ev);
    /* Optional (all NULL: the device has one stream, and work asked of
     * its copy stream goes on that one): the copy stream (see the top).
     * cs_copy and cs_copy_2d queue as copy and copy_2d do (cs_copy_2d
     * NULL: height cs_copy calls), cs_mark an event marker at its end,
     * cs_wait makes it wait for an event of any device or stream; the
     * main stream's wait is then also given this device's own copy-stream
     * events (qi_event_device, qi_event_stream), and drain waits for both
     * streams. Any of them, and mark, wait, copy and copy_2d, may be
     * called from another host thread than the one issuing ops. */
    void (*cs_copy)(qi_backend *b, void *dst, const void *src, size_t n);
    void (*cs_copy_2d)(qi_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height);
    void (*cs_mark)(qi_backend *b, qi_event *ev);
    void (*cs_wait)(qi_backend *b, qi_event *ev);
} qi_backend_i;

#define QI_BACKEND_VERSION 17u

struct qi_backend {
    const qi_backend_i *iface;
    void *ctx;
    qi_dev_info info;
    /* the first failure inside the stream since the last synchronise */
    void *lock; /* pthread_mutex_t *, devices with a worker */
    qi_status fail_st;
    qi_err fail;
    long inject; /* tests: > 0, the inject-th stream command from now fails */
    long inject_op; /* tests: > 0, the inject_op-th op from now fails (qi_backend_*) */
};

/* ---- ops as the engine calls them (ops.c) ----------------------------------
 *
 * Each wrapper checks its arguments before the device sees them (a bad
 * shape, a missing array, an id outside a table: QI_ERR_INVALID naming
 * the device and the op, never an assertion inside a kernel), does
 * nothing for zero rows, and calls the device's op. The caller times an
 * op with the device's events around it, so an asynchronous device is
 * timed on its own clock, not by the host's around a call that only
 * queued work. Results are the iface ops' (above). */
qi_status qi_backend_matmul_n(qi_backend *b, const qi_weight *const *w, float *const *y, int n, const float *x, int T,
                              qi_err *err);
qi_status qi_backend_rmsnorm(qi_backend *b, const float *x, const float *w, int T, int n, float eps, float *y,
                             qi_err *err);
qi_status qi_backend_rope(qi_backend *b, float *q, int Hq, float *k, int Hk, int T, int D, int n_rot,
                          const int32_t *pos, float base, float freq_scale, int mode, qi_err *err);
qi_status qi_backend_attention(qi_backend *b, const qi_attn_paged_args *a, int n, qi_err *err);
qi_status qi_backend_attention_merge(qi_backend *b, const qi_attn_merge_args *a, qi_err *err);
/* gate = act(gate) * up: GELU (tanh) with gelu, else SiLU */
qi_status qi_backend_glu(qi_backend *b, bool gelu, float *gate, const float *up, int T, int n, qi_err *err);
qi_status qi_backend_kv_write(qi_backend *b, const float *const *src, uint16_t *const *dst, int n, int D, qi_err *err);
qi_status qi_backend_add(qi_backend *b, float *x, const float *y, long n, qi_err *err);
qi_status qi_backend_scale(qi_backend *b, float *x, long n, float s, qi_err *err);
qi_status qi_backend_softcap(qi_backend *b, float *x, long n, float cap, qi_err *err);
qi_status qi_backend_gather_rows(qi_backend *b, float *x, const int32_t *rows, int n, int width, qi_err *err);
qi_status qi_backend_get_rows(qi_backend *b, const qi_weight *w, const int32_t *ids, int T, float *out, qi_err *err);
/* The optional ops (the iface's): QI_ERR_UNSUPPORTED naming the device
 * and the op where b has none. */
qi_status qi_backend_layernorm(qi_backend *b, const float *x, const float *w, const float *bias, int T, int n,
                               float eps, float *y, qi_err *err);
qi_status qi_backend_add_bias(qi_backend *b, float *x, const float *bias, int T, int n, qi_err *err);
qi_status qi_backend_act(qi_backend *b, bool gelu, float *x, int T, int n, qi_err *err);
/* Tests: the n-th qi_backend_* op called on b from now fails (not run;
 * QI_ERR_BACKEND naming the device and the op); 0 turns it off. */
void qi_dev_inject_op_fail(qi_backend *b, long n);

/* The parts of an event a device fills (device.c owns the rest), and the
 * time it completed at (for a device's wait). */
void qi_event_complete(qi_event *ev, double t);
double qi_event_time(const qi_event *ev);
/* A device's own slot in an event (NULL until the device's mark sets it). */
void **qi_event_impl(qi_event *ev);
/* The device and the stream an event was recorded on. */
qi_backend *qi_event_device(const qi_event *ev);
qi_stream qi_event_stream(const qi_event *ev);
/* A clock for device timelines, in seconds. */
double qi_dev_now(void);

/* The largest row of quantised activations any matmul of m needs (the
 * scratch reserve() sizes per token). */
size_t qi_backend_max_act_row_bytes(const qi_model *m);

/* The CPU reference backend with n_threads workers and flags:
 * - QI_CPU_ATTN_BLAS: the attention of calls with T >= 2 runs through
 *   OpenBLAS sgemm (faster, not bit-identical to llama.cpp; see
 *   backend_cpu.c); OpenBLAS is loaded here, and creation fails
 *   (QI_ERR_UNSUPPORTED, naming the library) when it cannot be;
 * - QI_CPU_REPACK: the matrices of the blocks it runs whose type has a
 *   packed form (q4_0, q4_1, q5_0, q5_1, q8_0; engine/kernels/kernels.h)
 *   are repacked into 16-row groups when prepared (weight_prepare), and
 *   its matmuls run in the packed order: faster, above all batched, but
 *   each row sums its blocks in one float lane where llama.cpp keeps
 *   eight partial sums, so logits are no longer llama.cpp's bit for bit
 *   (a batched step still equals single-sequence runs). */
enum { QI_CPU_ATTN_BLAS = 1u << 0, QI_CPU_REPACK = 1u << 1 };
qi_status qi_backend_cpu_create(int n_threads, unsigned flags, qi_backend **out, qi_err *err);
/* The CPU device's own (no other device has host threads): fn(ctx, ith,
 * nth) on each of its threads, the caller being ith 0, returning when all
 * have finished; nth is at most the thread count it was made with. For a
 * step's host work that is not an op (the KV policy's decisions over a
 * layer's streams). */
void qi_backend_cpu_host_run(qi_backend *cpu, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* A second CPU device for tests and CI ("testdev"): its own buffers up to
 * capacity bytes (0: no limit), which other devices' ops cannot address,
 * and a stream run by a worker thread of its own, so copies complete
 * later than they are queued and only events order them, with a copy
 * stream beside it run by another. Its ops are the
 * CPU backend's arithmetic on n_threads threads, run after its stream has
 * drained, so results equal the CPU's bit for bit. Every copy first fills
 * its destination with 0xff bytes (NaN as fp32 and fp16), so a read that
 * skips the wait sees garbage rather than, by luck, the right bytes. */
/* flags: QI_CPU_REPACK prepares its weights as a CPU with it does (the
 * rows and their packed form), so its results stay the CPU's. */
qi_status qi_backend_testdev_create(int n_threads, size_t capacity, unsigned flags, qi_backend **out, qi_err *err);
/* Tests: hold the workers of both streams (queued work waits) or let
 * them go. testdev has a copy stream, run by a worker of its own. */
void qi_testdev_hold(qi_backend *b, bool hold);
/* Tests: from now each copy on testdev's copy stream, its destination
 * filled with 0xff, waits until `ops` more of the device's ops have run
 * (us microseconds at most; 0: no wait) before writing it, so an op that
 * reads what a copy-stream copy writes without waiting for its event
 * meets the NaN. */
void qi_testdev_slow_copies(qi_backend *b, long ops, int us);
/* Tests: from now each copy on testdev's main stream, its destination
 * filled with 0xff, waits us microseconds before writing it, so the host
 * reading what such a copy writes without waiting for its event meets the
 * NaN (0: not). */
void qi_testdev_slow_main_copies(qi_backend *b, int us);
/* The copies testdev's stream s has run. */
long qi_testdev_copies(qi_backend *b, qi_stream s);

/* The CUDA device (cuda/backend_cuda.c): GPU `ordinal` of this build's
 * runtime, its memory counted against capacity bytes (0: the GPU's; a
 * smaller figure caps it, as --devices cuda:BYTES does). Its ops run the
 * kernels of cuda/kernels_cuda.h on one stream; host-side tables of an op
 * (positions, ids, KV block tables) are staged to the device through a
 * pinned ring; events are CUDA events, their times device times. Fails
 * with QI_ERR_UNSUPPORTED in a build without CUDA, QI_ERR_BACKEND (naming
 * the call and CUDA's reason) when there is no usable GPU. */
qi_status qi_backend_cuda_create(int ordinal, size_t capacity, qi_backend **out, qi_err *err);
/* The GPU a CUDA device runs on ("NVIDIA H100 80GB HBM3 (sm_90)"); NULL for
 * another device. */
const char *qi_backend_cuda_gpu_name(const qi_backend *b);
/* Tests: the runtime CUDA devices are made with from now on (a
 * qi_cuda_rt, cuda/cuda_rt.h; NULL: the build's). */
struct qi_cuda_rt;
void qi_cuda_use_rt(const struct qi_cuda_rt *rt);
/* ---- simulated devices (sim/backend_sim.c) -------------------------------------------
 *
 * A simulated machine (qi_sim) is a hardware profile (qinfer/hwprofile.h),
 * the efficiencies its op classes reach and one clock for the host; its
 * devices (a CPU, host-visible, and the profile's GPU) run the engine's
 * ops and copies without arithmetic, each advancing a virtual clock by a
 * time computed from the op's FLOPs and bytes (sim/README.md). Results
 * are not computed: logits are zeros. */
#include "qinfer/hwprofile.h"

#define QI_SIM_OP_CLASSES 3 /* matmul, attention, other; index 3 is copies */
/* The most an op class's efficiency may be: a fraction of a peak, but
 * above 1 where the caches serve an op's bytes faster than the profile's
 * memory bandwidth (a small model's weights in the last-level cache);
 * the link's stays at most 1. */
#define QI_SIM_EFF_MAX 16
typedef struct {
    /* the fraction of the peak compute rate and of the memory bandwidth
     * an op class reaches, [0] on the CPU and [1] on the GPU */
    double compute[2][QI_SIM_OP_CLASSES];
    double memory[2][QI_SIM_OP_CLASSES];
    /* the CPU's matmul compute efficiency for weights of one type (a
     * qi_type id: "cpu_matmul_compute_q5_0"), where its dot product costs
     * more or less per FLOP than the others'; 0: compute[0][0] */
    double cpu_matmul_type[QI_TYPE_COUNT];
    /* The GPU's kernels as llama.cpp's run them (sim/README.md, "The GPU's
     * cost model"); at their defaults (0, the overlap 1) the plain roofline:
     * gpu_matvec_compute: the efficiency of the FP32 rate a matmul of
     *   fewer than 8 rows reaches (0: compute[1][0]);
     * gpu_gemm_simt: the CUDA-core work of a quantised GEMM (unpacking and
     *   scaling its blocks) per tensor FLOP, at the FP32 rate, in [0, 1];
     * gpu_matmul_overlap: how much of the shorter of a matmul's compute
     *   and memory times hides under the longer (1: max, the default; 0:
     *   their sum);
     * gpu_op_cycles: a kernel's fixed cost (launch, ramp, tail) in GPU
     *   clock cycles, in place of the profile's gpu.launch where it gives
     *   gpu.clock;
     * gpu_power_ref, gpu_power_exp: the clock a power-limited board holds,
     *   min(1, (tdp / (fp32 TFLOP/s x ref))^exp) of its boost clock, on
     *   every compute rate and gpu_op_cycles (profiles with gpu.tdp);
     * gpu_matmul_type: the GEMM compute efficiency of a weight type
     *   ("gpu_matmul_compute_f16"; 0: compute[1][0]). */
    double gpu_matvec_compute, gpu_gemm_simt, gpu_matmul_overlap, gpu_op_cycles, gpu_power_ref, gpu_power_exp;
    double gpu_matmul_type[QI_TYPE_COUNT];
    /* The CPU's machine model for matmuls (sim/sim_cpu.c, sim/README.md
     * "The CPU's machine model"); off, the class roofline above, while
     * cpu_dram_memory is 0 (the default):
     * cpu_dram_memory: the share of the profile's cpu.mem_bw a weight
     *   streamed from DRAM is read at;
     * cpu_llc_memory: the share of cpu.llc_bw a weight the last-level cache
     *   holds is read at;
     * cpu_llc_share: the share of cpu.llc the CPU's weights keep;
     * cpu_unpack: the cost of one unit of a format's unpacking work
     *   (qi_sim_cpu_unpack_ops) per weight, in multiply-adds;
     * cpu_matmul_overlap: how much of the shorter of a matmul's compute
     *   and memory times hides under the longer (1: their max; 0: sum);
     * cpu_matmul_tiled: the share of the peak the kernels' tiled path
     *   (qi_sim_cpu_tiled) reaches in its tile products, each token's
     *   products over a weight counted once per tile part of the format
     *   (qi_sim_cpu_tile_parts; 0: compute[0][0], no parts);
     * cpu_tile_unpack: the multiply-adds of the peak, per weight, the tiled
     *   path spends once per call rearranging a block into the tile layout
     *   (0: none);
     * cpu_threads: the engine's worker threads (0: the profile's cores);
     *   the run's, not fitted: the compute rates scale by the cores they
     *   use, min(threads, cpu.cores) / cpu.cores, since the profile's
     *   probes ran on every core;
     * cpu_thread_memory: the share of the memory rates one thread reaches
     *   (0: 1, every thread count the same), min(1, threads x it). */
    double cpu_dram_memory, cpu_llc_memory, cpu_llc_share, cpu_unpack, cpu_matmul_overlap, cpu_matmul_tiled;
    double cpu_tile_unpack, cpu_thread_memory;
    int cpu_threads;
    double link;     /* of the link's bandwidth */
    double cpu_op_s; /* fixed seconds per CPU op (waking and joining its threads) */
    double noise;    /* sigma of a log-normal factor on every duration (0: none) */
    uint64_t seed;
} qi_sim_params;
typedef struct qi_sim qi_sim;
void qi_sim_params_default(qi_sim_params *p);
/* One parameter by name ("gpu_matmul_memory", "link", "noise", ...): an
 * unknown name or a value out of range is QI_ERR_INVALID naming it. */
qi_status qi_sim_params_set(qi_sim_params *p, const char *key, double v, qi_err *err);
/* A calibration file (`qinfer calibrate -o`, sim/README.md): one
 * `key = value  # source: TEXT` a line, keys as qi_sim_params_set's,
 * applied on top of *p, which is left as it was on any error. Errors, one
 * line `FILE:LINE: KEY: why`: an unknown key or a value out of range, a
 * value that is not a number, a key given twice, a missing source
 * (QI_ERR_FORMAT); the file unreadable (QI_ERR_IO). */
qi_status qi_sim_params_load(const char *path, qi_sim_params *p, qi_err *err);
/* The text of a calibration file's `# validated: TEXT` comment (how far
 * its predictions were from what they were checked against) into out;
 * false (out "") when the file has none or cannot be read. */
bool qi_sim_cal_validated(const char *path, char *out, size_t cap);
/* The machine a calibration is fitted on, as its file records it (`qinfer
 * calibrate -o` writes this line from the profile): "# machine: cpu=NAME;
 * cores=N; mem_bw=X GB/s; llc=Y MiB". */
void qi_sim_cal_machine_line(const qi_hwprofile *prof, char *out, size_t cap);
/* True, with the reason in why, when the calibration at path records a
 * machine other than prof's: another CPU model or core count, or a memory
 * bandwidth or last-level cache a quarter or more apart. False when they
 * match, the file has no record, or it cannot be read. */
bool qi_sim_cal_machine_differs(const char *path, const qi_hwprofile *prof, char *why, size_t cap);
const char *qi_sim_op_class_name(int k); /* "matmul", "attention", "other"; "copy" for 3 */
/* par NULL: the defaults. The profile is copied. */
qi_status qi_sim_create(const qi_hwprofile *prof, const qi_sim_params *par, qi_sim **out, qi_err *err);
void qi_sim_free(qi_sim *s); /* after its devices */
/* The host's clock: simulated seconds since creation. */
double qi_sim_now(const qi_sim *s);
const qi_hwprofile *qi_sim_profile(const qi_sim *s);
const qi_sim_params *qi_sim_get_params(const qi_sim *s);
/* A device of s: the host CPU (gpu false; host-visible, capacity the
 * profile's host memory) or its GPU (capacity the profile's GPU memory,
 * or `capacity` when smaller and not 0, as --gpu-mem caps it). */
qi_status qi_backend_sim_create(qi_sim *s, bool gpu, size_t capacity, qi_backend **out, qi_err *err);
/* Simulated seconds device b spent on an op class (QI_SIM_OP_CLASSES:
 * copies); 0 for a device that is not simulated. */
double qi_sim_busy(qi_backend *b, int op_class);
/* How many ops of a class (QI_SIM_OP_CLASSES: copies) s's CPU or GPU has
 * run since creation. */
long qi_sim_op_count(const qi_sim *s, bool gpu, int op_class);

void qi_backend_free(qi_backend *b); /* NULL is a no-op */

#endif
