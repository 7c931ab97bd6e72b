/* The amx kernel set for any shape (see amx.h) and its probe (no target attribute: it runs anywhere). */
#define _GNU_SOURCE /* syscall */
#include "amx/amx.h"

#include "avx512bf16/avx512bf16.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
#include <cpuid.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

enum {
  AMX_REQ_XCOMP_PERM = 0x1023, /* arch_prctl: ask for an extended state component */
  AMX_XFEATURE_XTILEDATA = 18, /* the tiles' data */
};

/* On top of avx512bf16's probe (the softmax, the decode kernels and the small jobs are its code): AMX-TILE and
 * AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22), and the OS's grant of the tile data, which Linux gives a
 * process only when asked (the state is large; a kernel without AMX support, or a policy, says no). */
static int probe(void) {
  if (!uattn_avx512bf16_runs_here()) return 0;
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  if (!((d >> 24) & 1u) || !((d >> 22) & 1u)) return 0;
  return syscall(SYS_arch_prctl, AMX_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0;
}

int uattn_amx_runs_here(void) {
  static _Atomic int state = -1; /* -1: not probed yet; a race asks the OS twice and stores the same answer */
  int v = atomic_load_explicit(&state, memory_order_relaxed);
  if (v < 0) atomic_store_explicit(&state, v = probe(), memory_order_relaxed);
  return v;
}

#define AMX_TILE_HW
#define AVX512_VEC_ZMM
#define AMX_SET uattn_kernels_amx
#define AMX_BASE uattn_kernels_amx_bf16_base
#define AMX_FN(name) uattn_amx_##name
#include "amx/set.h"

#else /* not x86 Linux: the set exists (the ladder lists it) but never runs */

int uattn_amx_runs_here(void) { return 0; }
const uattn_kernels uattn_kernels_amx = {.name = "amx", .caps = UATTN_CAPS_RECORD(AMX_CAPS)};

#endif
