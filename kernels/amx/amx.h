/* The amx kernel set (amx/set.c): avx512bf16's panels, decode kernels and softmax, with S = Q K^T and P V of
 * jobs of at least 16 query vectors on AMX tiles (tdpbf16ps); see amx/body.h for the arithmetic. Like
 * avx512bf16 it rounds its inputs to bf16, so the dispatch gives it bf16 queries on bf16 or fp8 caches only.
 * Nothing here may be called unless uattn_amx_runs_here() said yes. */
#ifndef UATTN_AMX_H
#define UATTN_AMX_H

#include "avx512bf16/avx512bf16.h"
#include "kernels.h"

extern const uattn_kernels uattn_kernels_amx;

/* Its capability record: avx512bf16's, whose load and decode kernels it runs. */
#define AMX_CAPS AVX512BF16_CAPS

/* 1 when this CPU runs the avx512bf16 set and has AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22), and
 * the OS grants this process the tile data state (Linux's arch_prctl ARCH_REQ_XCOMP_PERM, asked once per
 * process); always 0 elsewhere. Safe to call anywhere, from any thread. */
int uattn_amx_runs_here(void);

/* The set with tdpbf16ps emulated exactly in plain C (amx/tile.h) over the avx512bf16 twin: the same bits as
 * uattn_kernels_amx, on any CPU that runs AVX2, for the tests. Not a candidate for dispatch. */
extern const uattn_kernels uattn_kernels_amx_twin;

#endif
