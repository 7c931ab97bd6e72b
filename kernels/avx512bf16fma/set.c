/* The avx512bf16fma set and its twin: tables of the avx512 and avx512bf16 sets' functions (see avx512bf16fma.h),
 * and its probe, which carries no target attribute so that it runs anywhere. */
#include "avx512bf16fma/avx512bf16fma.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <stdatomic.h>

static int probe(void) {
  unsigned a, b, c, d;
  if (!uattn_avx512bf16_runs_here() || !__get_cpuid(0, &a, &b, &c, &d)) return 0;
  return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu; /* "Genu" "ineI" "ntel" */
}

int uattn_avx512bf16fma_runs_here(void) {
  static _Atomic int state = -1; /* -1: not probed yet; a race probes twice and stores the same answer */
  int v = atomic_load_explicit(&state, memory_order_relaxed);
  if (v < 0) atomic_store_explicit(&state, v = probe(), memory_order_relaxed);
  return v;
}

const uattn_kernels uattn_kernels_avx512bf16fma = {
    .name = "avx512bf16fma",
    .load = uattn_avx2_load,
    .load_tiled = uattn_avx2_load_tiled,
    .attend = {uattn_avx512_attend, uattn_avx512_attend, uattn_avx512_attend},
    .panel_floats = uattn_avx2_panel_floats,
    .decode = uattn_avx512bf16_decode,
    .decode_tiled = uattn_avx512bf16_decode_tiled,
    .caps = UATTN_CAPS_RECORD(AVX512BF16FMA_CAPS)};

const uattn_kernels uattn_kernels_avx512bf16fma_twin = {
    .name = "avx512bf16fma",
    .load = uattn_avx2_load,
    .load_tiled = uattn_avx2_load_tiled,
    .attend = {uattn_avx512_twin_attend, uattn_avx512_twin_attend, uattn_avx512_twin_attend},
    .panel_floats = uattn_avx2_panel_floats,
    .decode = uattn_avx512bf16_twin_decode,
    .decode_tiled = uattn_avx512bf16_twin_decode_tiled,
    .caps = UATTN_CAPS_RECORD(AVX512BF16FMA_CAPS)};

#else /* not x86: the set exists (dispatch.c lists it) but never runs */

int uattn_avx512bf16fma_runs_here(void) { return 0; }
const uattn_kernels uattn_kernels_avx512bf16fma = {.name = "avx512bf16fma",
                                                   .caps = UATTN_CAPS_RECORD(AVX512BF16FMA_CAPS)};
const uattn_kernels uattn_kernels_avx512bf16fma_twin = {.name = "avx512bf16fma",
                                                        .caps = UATTN_CAPS_RECORD(AVX512BF16FMA_CAPS)};

#endif
