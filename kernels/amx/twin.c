/* The amx set with tdpbf16ps emulated (amx/tile.h) over the avx512bf16 twin: bit for bit what an AMX CPU
 * computes, wherever AVX2 runs, so the tests check the set's logic on machines without AMX. Not a candidate for
 * dispatch. */
#include "amx/amx.h"

#if defined(__x86_64__) || defined(__i386__)

#define AMX_SET uattn_kernels_amx_twin
#define AMX_BASE uattn_kernels_amx_bf16_base_twin
#define AMX_FN(name) uattn_amx_twin_##name
#include "amx/set.h"

#else

const uattn_kernels uattn_kernels_amx_twin = {.name = "amx", .caps = UATTN_CAPS_RECORD(AMX_CAPS)};

#endif
