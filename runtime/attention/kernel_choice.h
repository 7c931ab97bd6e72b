/* Which kernels serve a layer: the choice of kernels/dispatch.c (a generated bucket, else the best generic set
 * this CPU runs, or the one UATTN_ISA forces) made once per layer shape and cached, with the report that
 * uattn_describe_kernels and uattn_last_forward_report give. */
#ifndef UATTN_KERNEL_CHOICE_H
#define UATTN_KERNEL_CHOICE_H

#include "kernels.h"
#include "uattn.h"

typedef struct uattn_kernel_choice {
  const uattn_kernels *set;
  uattn_kernel_report report; /* the bucket, the functions' names and the reason; counters zero */
} uattn_kernel_choice;

/* The kernels for a (valid) layer over caches of block_size. The first call for a shape (block size, head
 * dim, dtypes, chunk size, GQA group) and a value of UATTN_ISA asks the dispatch; later ones find its answer
 * in a process-wide cache (no lock on a hit). The result stays valid for the life of the process. */
const uattn_kernel_choice *uattn_kernel_choice_for(const uattn_layer *layer, int32_t block_size);

/* Keeps r as this thread's last forward report (uattn_last_forward_report). */
void uattn_kernel_report_keep(const uattn_kernel_report *r);

#endif
