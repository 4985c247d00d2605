/* kv_policy_test.h - the parts of test_kv_policy (the KV selection
 * policies and their wrappers; see test_kv_policy.c): their shared views,
 * helpers and oracle (util.c), and each part's cases. */
#ifndef QI_KV_POLICY_TEST_H
#define QI_KV_POLICY_TEST_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kv.h"
#include "kv/kv_policy.h"
#include "kv/rank_int.h"
#include "qinfer/quant.h"
#include "testutil.h"

#define MAXN 4096
#define N_LAYER 8

typedef struct {
    qi_kv_view v;
    int32_t pos[MAXN];
    uint8_t tier[MAXN];
    float score[MAXN];
    uint8_t fate[MAXN];
} tview;

/* What the scored tokens are ranked by: the score itself, or (for
 * scissorhands, whose score is a bit mask of unimportant steps) the fewest
 * bits set. */
enum { KEY_SCORE = 0, KEY_FEWEST_BITS };

typedef struct {
    int sinks, windows;
    double heavy;
    bool recall;   /* offloaded tokens compete */
    uint8_t evict; /* QI_KV_DROP or QI_KV_OFFLOAD */
    int key;       /* KEY_SCORE unless given */
    int recent_n;  /* > 0: recent = min(recent_n, budget - sinks) and the rest scored (snapkv), not by heavy */
} rule;

/* A policy by name and parameters, and the rule it should follow. */
typedef struct {
    const char *name, *spec;
    rule r;
} config;

/* util.c */
tview *tv_new(int n, int budget, int layer);
/* qinfer's selection rules are tested at its working budget: without
 * fetch= in the spec it is made with fetch=0, so that it keeps the whole
 * budget working (fetch's share is tested on its own, qinfer_fetch_*;
 * make_as_is makes the defaults). */
qi_kv_policy *make(const char *name, const char *spec);
qi_kv_policy *make_as_is(const char *name, const char *spec);
int sel(qi_kv_policy *p, tview *t);
uint8_t fate_at(const tview *t, int32_t pos);
void expect_kept(const tview *t, const int32_t *keep, int n_keep, uint8_t evict);
void shuffle(tview *t, uint64_t *rng);
bool newer(const tview *t, int i, int j);
void oracle(const tview *t, rule r, uint8_t *f);
void expect_oracle(const tview *t, rule r, const char *what, int iter);
void random_view(tview *t, uint64_t *rng, int n, double p_off, int32_t stride);
extern int g_key; /* the rule's key, for better(): set by oracle() */
int bits_set(float mask);
float sh_rank_ref(float mask);
float key_of(const tview *t, int i);
bool better(const tview *t, int i, int j);
/* cases.c: a planted policy keeping the first 60 tokens */
void keep_60(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate);
/* views.c: planted policies' parts: keep every token; free nothing */
void keep_all(qi_kv_policy *p, const qi_kv_view *v, uint8_t *fate);
void no_free(qi_kv_policy *p);

/* Each part adds its cases to the suite's one case list. */
void kv_cases_add(TCase *tc);        /* cases.c: hand-made patterns */
void kv_ada_add(TCase *tc);          /* ada.c: Ada-KV's head budgets */
void kv_oracle_add(TCase *tc);       /* views.c: scores, selection, random views, the wrapper */
void kv_quest_add(TCase *tc);        /* quest.c: Quest's blocks and the cache's bounds */
void kv_sparq_add(TCase *tc);        /* sparq.c: SparQ and qinfer's fetch */

#endif
