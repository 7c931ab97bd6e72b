/* Portable reference kernels: plain C that every platform runs and every fast path is checked against.
 * They work on fp32 panels (keys and values widened once) and on partial softmax states. */
#ifndef UATTN_PORTABLE_H
#define UATTN_PORTABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A partial attention of one (row, head): the seed's triplet. o is unnormalized: sum_j e^(s_j - m) v_j. */
typedef struct uattn_state {
  float m; /* running max of the scores (-inf while empty) */
  float l; /* sum_j e^(s_j - m) */
  float *o; /* [head_dim] */
} uattn_state;

void uattn_state_reset(uattn_state *st, int32_t head_dim);

/* How scores are formed for one query head. */
typedef struct uattn_score_rule {
  float soft_cap;    /* > 0: cap * tanh(s / cap) */
  float alibi_slope; /* s += slope * (key position - query position); 0 = none */
  int32_t window;    /* > 0: keys with position <= query position - window are not seen */
} uattn_score_rule;

/* Attends one query (already multiplied by the scale) to keys [lo, hi) of a panel whose key i has
 * position key_pos0 + i, adding them to the state with an online-softmax update. Keys outside the rule's
 * window are skipped. scores is scratch of at least hi - lo floats. */
void uattn_attend_panel(const float *q, const float *keys, const float *values, int32_t head_dim, int32_t lo,
                        int32_t hi, int32_t key_pos0, int32_t query_pos, const uattn_score_rule *rule,
                        float *scores, uattn_state *st);

/* A block of query rows, each with all the query heads of one KV head, against one panel of keys. This is
 * the unit every kernel implements (portable here; SIMD and GEMM variants later), so its shape is what
 * matters: the group's heads share each key load, and rows differ only in how many keys they see. */
typedef struct uattn_panel_job {
  int32_t rows, group, head_dim;
  const float *q;           /* [rows][group][head_dim], already multiplied by the scale */
  const int32_t *query_pos; /* [rows] positions of the rows */
  const int32_t *visible;   /* [rows] row i may see keys [0, visible[i]) (the window applies on top) */
  int32_t num_keys, key_pos0; /* key i of the panel is at position key_pos0 + i */
  const float *keys, *values; /* [num_keys][head_dim] */
  float soft_cap;             /* > 0: cap * tanh(s / cap) */
  int32_t window;             /* > 0: keys at or before query position - window are not seen */
  const float *alibi;         /* [group] slopes of the group's heads, or NULL */
  float *m, *l;               /* [rows][group] running max and sum */
  float *o;                   /* [rows][group][head_dim] unnormalized output */
  float *scores;              /* scratch, [num_keys] */
  float scale;                /* the layer's score scale, for the sets that take unscaled queries
                               * (uattn_kernels_unscaled_q, kernels.h) */
  bool probs_fp32;            /* the layer's probs_fp32 (uattn.h): only bf16 sets read it */
} uattn_panel_job;

void uattn_attend_panel_rows(const uattn_panel_job *job);

/* Adds partial b into a (the seed's rescale merge of two partials). */
void uattn_state_merge(uattn_state *a, const uattn_state *b, int32_t head_dim);

/* The seed's merge of partials (unified.py: merge): each part's max floored at fmin (-FLT_MAX), M their
 * max, a_i = e^(m_i - M), out = sum_i o_i a_i / max(sum_i l_i a_i, feps) with feps = FLT_MIN, so a row
 * whose parts are all empty is zeros, not NaN. A sink (pass -inf for none) joins the denominator only.
 * Returns the log-sum-exp of the row, -inf when it saw nothing. */
float uattn_seed_merge(const uattn_state *parts, int32_t num_parts, float sink, int32_t head_dim, float *out);

/* Deterministic dot product (fixed association, whatever the compiler). */
float uattn_dot(const float *a, const float *b, int32_t n);

#endif
