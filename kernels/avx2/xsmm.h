/* The attend of panel jobs of many query vectors (shared blocks of grouped decodes, prefill and causal tiles)
 * as libxsmm JIT fp32 GEMMs over the avx2 set's panels (kernels/avx2/xsmm.c). The avx2 set and its generated
 * buckets call it for the causal and shared parts where uattn_xsmm_wins says it is the faster one, and their
 * fused register-tile body otherwise.
 * Like everything of the avx2 set, nothing here may run before uattn_avx2_runs_here() says yes. */
#ifndef UATTN_XSMM_H
#define UATTN_XSMM_H

#include "kernels.h"

/* The jobs the libxsmm body takes, where uattn-kernel-bench --xsmm timed it ahead of the fused kernel: at
 * least 8 query vectors (rows x group), a row that sees at least 32 keys, and a head dim up to 128. */
enum { UATTN_XSMM_MIN_VECTORS = 8, UATTN_XSMM_MIN_KEYS = 32, UATTN_XSMM_MAX_HEAD_DIM = 128 };

/* 1 when libxsmm was built in and JITs its kernels on this CPU (probed once; thread-safe), else 0. Like the
 * rest, only after uattn_avx2_runs_here() said yes (the body's own code is AVX2). */
int uattn_xsmm_runs_here(void);

/* The code libxsmm generates for the body, by libxsmm's name of the target ("hsw": AVX2, which the body pins
 * so that it has the fused body's bits on every CPU; see xsmm.c), or "none" where libxsmm does not run. */
const char *uattn_xsmm_target(void);

/* uattn_panel_job semantics over the avx2 set's panels, as the fused body (kernels/avx2/body.h): the same
 * rules and online softmax, S = Q K^T and O += P V as libxsmm GEMMs. Any shape; where libxsmm is missing or
 * returns no kernel for a shape, plain C loops in the same order stand in. */
void uattn_xsmm_attend(const uattn_panel_job *job, int32_t panel_keys);

/* Whether the libxsmm body is the faster one for this job: its number of query vectors, the keys its rows
 * see (a causal tile's first rows see few) and its head dim. The job's shape only; and where it says yes,
 * the result is bit for bit the fused body's anyway (xsmm.c), so the choice only decides the speed. */
static inline int uattn_xsmm_wins(const uattn_panel_job *job) {
  if (job->rows * job->group < UATTN_XSMM_MIN_VECTORS || job->num_keys < UATTN_XSMM_MIN_KEYS ||
      job->head_dim > UATTN_XSMM_MAX_HEAD_DIM)
    return 0;
  int32_t keys = 0;
  for (int32_t r = 0; r < job->rows && keys < UATTN_XSMM_MIN_KEYS; r++)
    if (job->visible[r] > keys) keys = job->visible[r];
  return keys >= UATTN_XSMM_MIN_KEYS && uattn_xsmm_runs_here();
}

/* The body's two products alone, on one full block (its most query vectors, its chunk of keys) of the given
 * head dim: the score GEMMs as the body forms S (its DB-dim pieces summed) or the P V GEMM, with the body's
 * shapes and strides. For uattn-kernel-bench --xsmm, which times them as the ceiling of the body: what its
 * products reach with nothing around them. scratch: uattn_xsmm_products_floats(head_dim) floats, any values;
 * returns the product's flops. Only where uattn_xsmm_runs_here(). */
typedef enum { UATTN_XSMM_SCORES, UATTN_XSMM_VALUES } uattn_xsmm_product;
size_t uattn_xsmm_products_floats(int32_t head_dim);
double uattn_xsmm_products(uattn_xsmm_product which, int32_t head_dim, float *scratch);

#endif
