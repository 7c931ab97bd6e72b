/* A kernel set: how one implementation loads key/value panels and attends rows to them. The forward picks
 * one set per call (the best the CPU runs, or the one UATTN_ISA forces) and uses nothing else, so each set is
 * free to choose its own panel layout. */
#ifndef UATTN_KERNELS_H
#define UATTN_KERNELS_H

#include "portable.h"
#include "uattn.h"

typedef struct uattn_kernels {
  const char *name; /* e.g. "portable", "avx2" */
  /* Widens count keys and values (rows k_src + i * stride and v_src + i * stride, elements of dtype, each
   * head_dim long) into the panels, in this set's layout for a panel of panel_keys keys. */
  void (*load)(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count,
               int32_t head_dim, int32_t panel_keys, float *keys, float *values);
  /* uattn_panel_job semantics, with job->keys/values as load produced them (num_keys <= panel_keys). */
  void (*attend)(const uattn_panel_job *job, int32_t panel_keys);
  /* Floats each panel needs for panel_keys keys (a set may pad). */
  size_t (*panel_floats)(int32_t panel_keys, int32_t head_dim);
} uattn_kernels;

/* Row-major panels, plain C: runs everywhere, and every other set is checked against it. */
extern const uattn_kernels uattn_kernels_portable;

/* The set for this CPU: the best one it runs, unless $UATTN_ISA names another ("portable", "avx2"). A name the
 * CPU cannot run falls back to the best one, and *why says so (NULL when not asked). */
const uattn_kernels *uattn_kernels_select(const char **why);

#endif
