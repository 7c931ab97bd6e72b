/* The AVX-512 kernel set (avx512/set.c): the avx2 set's panels and loads, with the attend (avx512/body.h) and
 * the decode kernel (avx512/decode.h) in 16-float vectors. Nothing here may be called unless uattn_avx512_runs_here() said yes. */
#ifndef UATTN_AVX512_H
#define UATTN_AVX512_H

#include "avx2/avx2.h"
#include "kernels.h"

extern const uattn_kernels uattn_kernels_avx512;

/* Its capability record (kernels.h: uattn_kernel_caps' fields in order): queries scaled, fp32 inputs; decode of
 * head dims of whole ymm vectors, P V tiles of 8 keys; the avx2 set's decode_tiled (avx2/avx2.h). */
#define AVX512_CAPS AVX2_CAPS
UATTN_CAPS_CHECK(AVX512_CAPS);

/* 1 when this CPU runs the avx2 set and AVX-512F, and the OS saves the zmm and opmask registers; always 0
 * off x86. Safe to call anywhere. */
int uattn_avx512_runs_here(void);

/* The avx512 set's twin (common/vec16.h): its attend and decode kernels' arithmetic, bit for bit, on AVX2.
 * For the tests, on machines without AVX-512; only after uattn_avx2_runs_here(). */
extern const uattn_kernels uattn_kernels_avx512_twin;

/* The two sets' attend (every part), which the avx512bf16fma set shares: the zmm one, and the twin's. */
void uattn_avx512_attend(const uattn_panel_job *job, int32_t panel_keys);
void uattn_avx512_twin_attend(const uattn_panel_job *job, int32_t panel_keys);

#endif
