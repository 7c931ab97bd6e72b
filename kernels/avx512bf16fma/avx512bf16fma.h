/* The avx512bf16fma kernel set (avx512bf16fma/set.c): the avx512 set's panels, loads and attend (fp32 FMAs in zmm,
 * on panels widened once as they are loaded) with the avx512bf16 set's decode kernels (vdpbf16ps on the cache's
 * bf16 pairs as they lie), for Intel's cores, where vdpbf16ps runs at half the fp32 FMA rate (32 FLOP a cycle
 * against the FMAs' 64 on a family 6 model 167 Xeon): there the attend's products are faster in fp32 (prefills
 * 1.25-1.3x), while the decode kernels, which read each key for a few query vectors, are faster with
 * avx512bf16's (1.2-1.3x).
 * Its decode kernels round P to bf16, so the dispatch gives it bf16 queries on bf16 or fp8 caches only, as
 * avx512bf16; its attend keeps P in fp32. Nothing here may be called unless uattn_avx512bf16fma_runs_here()
 * said yes. */
#ifndef UATTN_AVX512BF16FMA_H
#define UATTN_AVX512BF16FMA_H

#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "kernels.h"

extern const uattn_kernels uattn_kernels_avx512bf16fma;

/* Its capability record: avx512bf16's (its decode kernels and bf16 inputs) but with the queries scaled for the
 * attend, which is avx512's. */
#define AVX512BF16FMA_CAPS_(uq, ...) 0, __VA_ARGS__
#define AVX512BF16FMA_CAPS UATTN_CAPS_APPLY_(AVX512BF16FMA_CAPS_, AVX512BF16_CAPS)
UATTN_CAPS_CHECK(AVX512BF16FMA_CAPS);

/* 1 where the avx512bf16 set runs and the CPU is Intel's (CPUID's vendor "GenuineIntel"); always 0 off x86. AMD's
 * Zen 4 and 5 run vdpbf16ps at 2 and 3.7 times the fp32 FMA rate, so there the avx512bf16 set serves and this
 * rung is passed over (UATTN_ISA=avx512bf16fma too: the level below; with UATTN_TWINS, its twin). Probed once;
 * safe to call anywhere, from any thread. */
int uattn_avx512bf16fma_runs_here(void);

/* The set's twin: the avx512 and avx512bf16 twins' functions in the same places, the same bits on any CPU that
 * runs AVX2, for the tests. Not a candidate for dispatch. */
extern const uattn_kernels uattn_kernels_avx512bf16fma_twin;

#endif
