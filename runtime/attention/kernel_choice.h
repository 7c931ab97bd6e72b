/* Which kernels serve a layer: the choice of kernels/dispatch.c (a generated bucket, else the best generic set
 * this CPU runs, or the one UATTN_ISA forces) made once per layer shape and cached, with the report that
 * uattn_describe_kernels and uattn_last_forward_report give. */
#ifndef UATTN_KERNEL_CHOICE_H
#define UATTN_KERNEL_CHOICE_H

#include "kernels.h"
#include "uattn.h"

/* How the forward uses the set on a layer, decided with the choice so that the forward runs what the report
 * names. */
typedef struct uattn_kernel_use {
  bool decode;       /* decode rows read the cache through set->decode (kernels.h: uattn_decode_fits) */
  bool decode_tiled; /* and, on a TILED cache, through set->decode_tiled as it lies (uattn_decode_tiled_fits) */
  bool load_tiled;   /* a TILED cache's panels come through set->load_tiled (uattn_load_tiled_fits) */
  bool all_heads;    /* short cache-only requests run as all-heads units (units.c: run_all_heads) */
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
