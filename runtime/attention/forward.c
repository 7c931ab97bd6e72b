/* uattn_forward: the cache update and the attention of one planned step, in portable C, and the other public
 * calls on a layer (uattn_layer_default, uattn_describe_kernels). This file checks a call (validate.c), fills
 * what the layer leaves to the runtime's tuning file, chooses the kernels (kernel_choice.c) and hands the step
 * to units.c, which writes the caches (cache.c) and runs the parts of the attention (parts.c) on the workers
 * in their workspaces (workspace.c); forward_internal.h is what those files share. */
#include <math.h>
#include <string.h>

#include "attention/forward_internal.h"
#include "attention/kernel_choice.h"
#include "threads/pool.h"
#include "tuning/tuning.h"

uattn_layer uattn_layer_default(int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, uattn_dtype dtype) {
  uattn_layer l;
  memset(&l, 0, sizeof l);
  l.num_q_heads = num_q_heads;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.scale = head_dim > 0 ? 1.0f / sqrtf((float)head_dim) : 1.0f;
  l.dtype = dtype;
  l.cache_dtype = dtype;
  l.kv_layout = UATTN_LAYOUT_NHD;
  l.attn_type = UATTN_ATTENTION_DECODER;
  l.k_scale = l.v_scale = 1.0f;
  return l;
}

uattn_status uattn_forward(const uattn_plan *plan, const uattn_layer *L, const uattn_tensors *t, uattn_runtime *rt) {
  uattn_clear_error();
  uattn_schedule sched;
  uattn_status st;
  if ((st = uattn_plan_schedule(plan, &sched))) return st;
  UATTN_CHECK_PTR(L, "layer");
  UATTN_CHECK_PTR(t, "tensors");
  if ((st = uattn_validate_layer(L))) return st;
  const uattn_plan_info *in = sched.info;
  if ((st = uattn_validate_tensors(in, sched.config, L, t))) return st;
  /* the runtime's tuning file fills what the layer leaves to the defaults (its values were checked when
   * the file was loaded) */
  uattn_layer tuned = *L;
  if (sched.config->cp_rank > 0) tuned.sinks = NULL; /* a sink is counted once over the ranks: by rank 0 */
  const uattn_tuning_entry *tuning = uattn_tuning_find(rt, t->block_size, layer_dims(L).kernel, L->cache_dtype);
  if (tuning) {
    if (!tuned.causal_width) tuned.causal_width = tuning->query_tile;
    if (!tuned.chunk_size) tuned.chunk_size = tuning->chunk_size;
  }
  L = &tuned;
  const uattn_kernel_choice *choice = uattn_kernel_choice_for(L, t->block_size);
  uattn_kernel_report report = choice->report;
  if (in->num_tokens == 0) {
    uattn_kernel_report_keep(&report);
    return UATTN_OK;
  }
  int32_t max_workers = uattn_runtime_workers(rt);
  if (tuning && tuning->num_threads > 0 && tuning->num_threads < max_workers) max_workers = tuning->num_threads;
  if ((st = uattn_forward_run(&sched, L, t, rt, choice, max_workers, &report))) return st;
  uattn_kernel_report_keep(&report);
  return UATTN_OK;
}

uattn_status uattn_describe_kernels(const uattn_layer *layer, int32_t block_size, uattn_kernel_report *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(layer, "layer");
  UATTN_CHECK_PTR(out, "out");
  uattn_status st;
  if ((st = uattn_validate_layer(layer))) return st;
  if (block_size <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block_size = %d must be > 0", block_size);
  *out = uattn_kernel_choice_for(layer, block_size)->report;
  return UATTN_OK;
}
