/* Kernel reports: what serves a layer, and what served this thread's last forward. */
#include "attention/report.h"

#include <stdio.h>
#include <string.h>

#include "common/internal.h"

static _Thread_local uattn_kernel_report last_report;
static _Thread_local bool have_last_report;

const uattn_kernels *uattn_describe_choose(const uattn_layer *L, int32_t block_size, uattn_kernel_report *r) {
  memset(r, 0, sizeof *r);
  r->block_size = block_size;
  r->head_dim = L->head_dim;
  r->cache_dtype = L->cache_dtype;
  r->chunk_size = L->chunk_size;
  const uattn_bucket_kernels *bucket;
  const uattn_kernels *set = uattn_kernels_dispatch(block_size, L->head_dim, L->cache_dtype, L->dtype, L->chunk_size,
                                                    &bucket, r->reason, sizeof r->reason);
  r->bucket_hit = bucket != NULL;
  r->kernel_set = set->name;
  for (int p = 0; p < UATTN_NUM_PARTS; p++)
    snprintf(r->part_kernel[p], sizeof r->part_kernel[p], "%s", bucket ? bucket->part_names[p] : set->name);
  /* a bucket's unique part is its decode kernel */
  if (uattn_decode_fits(set, block_size, L->head_dim, L->num_q_heads / L->num_kv_heads))
    snprintf(r->decode_kernel, sizeof r->decode_kernel, "%s", bucket ? bucket->part_names[UATTN_PART_UNIQUE] : set->name);
  return set;
}

void uattn_describe_keep(const uattn_kernel_report *r) {
  last_report = *r;
  have_last_report = true;
}

uattn_status uattn_last_forward_report(uattn_kernel_report *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "out");
  if (!have_last_report)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "no uattn_forward has succeeded on this thread yet: the report is per calling thread");
  *out = last_report;
  return UATTN_OK;
}
