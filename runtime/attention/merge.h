/* Merging partial attentions: the seed's rule (its unified.py merge), shared by the forward's final merge of
 * a row's parts and by the public cascade merge (cascade.c). Two partials add with uattn_state_merge
 * (kernels/state.h). */
#ifndef UATTN_MERGE_H
#define UATTN_MERGE_H

#include "state.h"

/* The seed's merge of partials (unified.py: merge): each part's max floored at fmin (-FLT_MAX), M their
 * max, a_i = e^(m_i - M), out = sum_i o_i a_i / max(sum_i l_i a_i, feps) with feps = FLT_MIN, so a row
 * whose parts are all empty is zeros, not NaN. A sink (pass -inf for none) joins the denominator only.
 * Returns the log-sum-exp of the row, -inf when it saw nothing. */
float uattn_merge_parts(const uattn_state *parts, int32_t num_parts, float sink, int32_t head_dim, float *out);

#endif
