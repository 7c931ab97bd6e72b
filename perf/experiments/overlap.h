/* uattn-experiments overlap (overlap.c): how much of a compute load a cold walk over memory hides, for the
 * ways a decode kernel's walk can read its keys and values. */
#ifndef UATTN_PERF_EXPERIMENTS_OVERLAP_H
#define UATTN_PERF_EXPERIMENTS_OVERLAP_H

#include <stdbool.h>
#include <stddef.h>

/* OVERLAP_SHARE: bytes of keys (and of values) a share, a head's 16 bf16 rows at head dim 128, as the fused
 * walks take them */
enum { OVERLAP_WORKS = 7, OVERLAP_SHARE = 4096 };

/* The compute loads: FMAs (ymm) a 64-byte line read, 0 first (overlap.c's OVERLAP_LOADS). */
extern const int overlap_work[OVERLAP_WORKS];

/* shares shares of a walk, each OVERLAP_SHARE bytes of keys at k + (c & mask) step, then as many of values at
 * v + (c & mask) step, each line's two halves fed to overlap_work[w] FMAs in 12 chains; ask: each line asks for
 * its place in the next share (step bytes on) into L1, as the decode kernels' walks do. sink: the sums. */
void overlap_walk(int w, const char *k, const char *v, size_t step, size_t shares, size_t mask, bool ask,
                  float sink[8]);

#endif
