/* The AVX-512 kernel set for any shape (see avx512.h), and its probe, which carries no target attribute
 * so that it runs anywhere. */
#include "avx512/avx512.h"

#include "avx2/avx2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <stdatomic.h>

/* CPU and OS, asked once (as uattn_avx2_runs_here: CPUID is slow in a VM). */
static int probe(void) {
  if (!uattn_avx2_runs_here()) return 0;
  __builtin_cpu_init();
  unsigned a, b, c, d, lo, hi;
  if (!__builtin_cpu_supports("avx512f") || !__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
  /* XCR0: the OS saves the ymm halves (bit 2), the opmask registers and both halves of the zmm (5, 6, 7) */
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6u) == 0xe6u;
}

int uattn_avx512_runs_here(void) {
  static _Atomic int state = -1; /* -1: not probed yet */
  int v = atomic_load_explicit(&state, memory_order_relaxed);
  if (v < 0) atomic_store_explicit(&state, v = probe(), memory_order_relaxed);
  return v;
}

#define AVX512_VEC_ZMM
#define AVX512_SET uattn_kernels_avx512
#define AVX512_ATTEND uattn_avx512_attend
#include "avx512/set.h"

#else /* not x86: the set exists (dispatch.c lists it) but never runs */

int uattn_avx512_runs_here(void) { return 0; }
const uattn_kernels uattn_kernels_avx512 = {.name = "avx512", .caps = UATTN_CAPS_RECORD(AVX512_CAPS)};

#endif
