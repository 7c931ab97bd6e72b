/* The avx512 set's twin: the kernels of avx512/set.c computed with pairs of ymm registers
 * (common/vec16.h), bit for bit what an AVX-512 CPU computes, so the tests check that kernel's arithmetic on
 * machines without AVX-512. Not a candidate for dispatch. */
#include "avx512/avx512.h"

#if defined(__x86_64__) || defined(__i386__)

#define AVX512_SET uattn_kernels_avx512_twin
#define AVX512_ATTEND uattn_avx512_twin_attend
#include "avx512/set.h"

#else

const uattn_kernels uattn_kernels_avx512_twin = {.name = "avx512", .caps = UATTN_CAPS_RECORD(AVX512_CAPS)};

#endif
