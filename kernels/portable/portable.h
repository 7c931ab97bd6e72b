/* The portable kernel set: plain C that every platform runs and every other set is checked against. It works
 * on fp32 row-major panels (keys and values widened once) and on partial softmax states (state.h). */
#ifndef UATTN_PORTABLE_H
#define UATTN_PORTABLE_H

#include "kernels.h"

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
                        int32_t hi, int32_t key_pos0, int32_t query_pos, const uattn_score_rule *rule, float *scores,
                        uattn_state *st);

/* uattn_panel_job semantics (kernels.h), one (row, head) at a time with uattn_attend_panel. */
void uattn_attend_panel_rows(const uattn_panel_job *job);

/* Deterministic dot product (fixed association, whatever the compiler). */
float uattn_dot(const float *a, const float *b, int32_t n);

/* Row-major panels, plain C: runs everywhere, and every other set is checked against it. */
extern const uattn_kernels uattn_kernels_portable;

/* Its capability record (kernels.h: uattn_kernel_caps' fields in order): queries scaled, fp32 inputs, no decode
 * and no TILED kernels. */
#define PORTABLE_CAPS 0, 0, 0, 0, 0, 0, 0, 0, 0, 0

#endif
