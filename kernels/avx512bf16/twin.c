/* The avx512bf16 set with vdpbf16ps emulated (avx512bf16/vec.h): bit for bit what an AVX512-BF16 CPU
 * computes, on AVX2, so the tests check the set's arithmetic on machines without the instructions. Not a
 * candidate for dispatch. */
#include "avx512bf16/avx512bf16.h"

#if defined(__x86_64__) || defined(__i386__)

#define BF16_SET uattn_kernels_avx512bf16_twin
#define BF16_FN(name) uattn_avx512bf16_twin_##name
#include "avx512bf16/set.h"

#else

const uattn_kernels uattn_kernels_avx512bf16_twin = {.name = "avx512bf16", .caps = UATTN_CAPS_RECORD(AVX512BF16_CAPS)};

#endif
