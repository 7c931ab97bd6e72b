/* Which kernels serve a layer: the choice of kernels/dispatch.c (a generated bucket, else the best generic set
 * this CPU runs, or the one UATTN_ISA forces) made once per layer shape and cached, with the report that
 * uattn_describe_kernels and uattn_last_forward_report give. */
#ifndef UATTN_KERNEL_CHOICE_H
#define UATTN_KERNEL_CHOICE_H

#include "kernels.h"
#include "uattn.h"

/* The head dims of a layer (uattn_layer: head_dim, head_dim_v, kv_latent) as the forward uses them. The kernels
 * take one head dim for queries, keys and values (kernels.h), `kernel`: a kv_latent layer's value rows are its
 * key rows, read whole, of which out keeps the first `v`; a layer whose value rows are narrower or wider than its
 * keys has its queries and its rows staged `kernel` long with zeros past their end (cache.c: uattn_stage_block),
 * which add nothing to a score and give out dims that are not kept. */
typedef struct head_dims {
  int32_t k;      /* of q, k and the key cache's rows: head_dim */
  int32_t v;      /* of v, the value cache's rows and out: head_dim_v, or head_dim */
  int32_t kernel; /* the kernels': the longer of the key and value rows */
  bool padded;    /* the key and value rows differ in length (not a latent): the forward stages them */
} head_dims;

static inline head_dims layer_dims(const uattn_layer *L) {
  const int32_t v = L->head_dim_v > 0 ? L->head_dim_v : L->head_dim, v_rows = L->kv_latent ? L->head_dim : v;
  return (head_dims){L->head_dim, v, v_rows > L->head_dim ? v_rows : L->head_dim, v_rows != L->head_dim};
}

/* How the forward uses the set on a layer, decided with the choice so that the forward runs what the report
 * names. */
typedef struct uattn_kernel_use {
  bool decode;       /* decode rows read the cache through set->decode (kernels.h: uattn_decode_fits) */
  bool decode_tiled; /* and, on a TILED cache, through set->decode_tiled as it lies (uattn_decode_tiled_fits) */
  bool load_tiled;   /* a TILED cache's panels come through set->load_tiled (uattn_load_tiled_fits) */
  bool all_heads;    /* short cache-only requests run as all-heads units (units.c: run_all_heads) */
  bool staged;       /* the value rows are not as long as the key rows (head_dims.padded): every
                      * block is staged into rows of the kernels' head dim first (cache.c: uattn_stage_block) */
} uattn_kernel_use;

typedef struct uattn_kernel_choice {
  const uattn_kernels *set;
  uattn_kernel_use use;
  uattn_kernel_report report; /* the bucket, the functions' names and the reason; counters zero */
} uattn_kernel_choice;

/* The kernels for a (valid) layer over caches of block_size. The first call for a shape (block size, head
 * dim, dtypes, chunk size, heads, layout) and a value of UATTN_ISA asks the dispatch; later ones find its answer
 * in a process-wide cache (no lock on a hit). The result stays valid for the life of the process. */
const uattn_kernel_choice *uattn_kernel_choice_for(const uattn_layer *layer, int32_t block_size);

/* Keeps r as this thread's last forward report (uattn_last_forward_report). */
void uattn_kernel_report_keep(const uattn_kernel_report *r);

#endif
