/* The avx512bf16 kernel set for any shape (see avx512bf16.h), its probe (no target attribute: it runs
 * anywhere) and its panel size. */
#include "avx512bf16/avx512bf16.h"

#include "avx512/avx512.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <stdatomic.h>

/* On top of the avx512 set's probe (AVX-512F, the OS saving zmm and opmask state): BW and VL, which GCC's
 * bf16 intrinsics are declared with, VBMI (vpermi2b: the decode kernel's fp8 widening; the whole set is
 * compiled with it), and AVX512_BF16 itself, which only CPUID leaf 7 subleaf 1 reports. Zen 4, Ice Lake
 * and Sapphire Rapids have both; Cooper Lake has AVX512_BF16 without VBMI and so takes the avx512 level. */
static int probe(void) {
  if (!uattn_avx512_runs_here()) return 0;
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, NULL) < 7 || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") ||
      !__builtin_cpu_supports("avx512vbmi"))
    return 0;
  __cpuid_count(7, 1, a, b, c, d);
  return (a >> 5) & 1u;
}

int uattn_avx512bf16_runs_here(void) {
  static _Atomic int state = -1; /* -1: not probed yet; a race probes twice and stores the same answer */
  int v = atomic_load_explicit(&state, memory_order_relaxed);
  if (v < 0) atomic_store_explicit(&state, v = probe(), memory_order_relaxed);
  return v;
}

#define AVX512_VEC_ZMM
#include "avx512bf16/body.h"

size_t uattn_avx512bf16_panel_floats(int32_t panel_keys, int32_t head_dim) {
  return bf16_panel_floats(panel_keys, head_dim);
}

#define BF16_SET uattn_kernels_avx512bf16
#define BF16_FN(name) uattn_avx512bf16_##name
#include "avx512bf16/set.h"

#else /* not x86: the set exists (dispatch.c lists it) but never runs */

int uattn_avx512bf16_runs_here(void) { return 0; }
size_t uattn_avx512bf16_panel_floats(int32_t panel_keys, int32_t head_dim) { return (size_t)panel_keys * head_dim; }
const uattn_kernels uattn_kernels_avx512bf16 = {.name = "avx512bf16", .caps = UATTN_CAPS_RECORD(AVX512BF16_CAPS)};

#endif
