/* What the files of uattn-kernel-bench share (perf/kernel_bench/): the bucket's shape every figure is timed on,
 * the timing on the tool's runs and clock, and the random caches the figures walk. kernel_bench.c times the
 * kernels' attend and load, libxsmm's body and holds main; decode_bench.c times the decode kernels straight
 * from the cache (--decode, --decode-layouts). */
#ifndef UATTN_PERF_KERNEL_BENCH_H
#define UATTN_PERF_KERNEL_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "common/timing.h"
#include "kernels.h"

enum { GROUP = 4, KV_HEADS = 8 };

/* The bucket's shape, which every figure is timed on (main sets it: --bucket, by default kernel_variant.c's):
 * the head dim, the keys of a cache block, the cache's dtype, and the blocks of the cold walks' 256 MiB cache. */
extern int32_t head_dim, block_keys;
extern uattn_dtype cache_dtype;
extern long cold_blocks;

/* A pseudo-random value in [-1, 1), from the tool's one seeded generator. */
float random_unit(void);
/* perf_time_interleaved on the tool's runs and clock. */
void time_interleaved(void (*fn)(void *, long), int n, void *const arg[], double seconds[],
                      double (*raw)[PERF_MAX_RUNS]);
/* The quartiles of a's time over b's, run by run. */
void speedup_quartiles(const double *a, const double *b, double q[3]);
/* A cache of n random elements of cache_dtype; free with free_cache(c, n). */
void *random_cache(size_t n);
void free_cache(void *c, size_t n);
/* The byte offset of call `call`'s block in a walk over `blocks` NHD blocks of the bucket's shape. */
size_t walk_offset(long blocks, long call);

/* decode_bench.c: --decode (with a variant, or NULL) and --decode-layouts; 0, or 1 when the set has no decode
 * kernel for the shape. */
int bench_decode(const uattn_kernels *set, const uattn_kernels *variant, const char *which, double peak);
int bench_decode_layouts(const uattn_kernels *set, const uattn_kernels *variant, const char *which);

#endif
