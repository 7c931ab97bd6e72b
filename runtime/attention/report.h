/* Which kernels serve a layer (uattn_kernel_report): chosen here for uattn_forward and uattn_describe_kernels,
 * and kept per thread for uattn_last_forward_report. */
#ifndef UATTN_DESCRIBE_H
#define UATTN_DESCRIBE_H

#include "kernels.h"
#include "uattn.h"

/* The kernels for a (valid) layer over caches of block_size: fills the report's bucket, names and reason,
 * and zeroes its counters. */
const uattn_kernels *uattn_describe_choose(const uattn_layer *layer, int32_t block_size, uattn_kernel_report *r);

/* Keeps r as this thread's last forward report. */
void uattn_describe_keep(const uattn_kernel_report *r);

#endif
