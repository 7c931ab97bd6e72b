/* uattn-sweep's command line (perf/sweep/options.c): the kernel buckets to tune, the candidate values of each
 * tunable and the workload's shape, which sweep.c times. */
#ifndef UATTN_PERF_SWEEP_OPTIONS_H
#define UATTN_PERF_SWEEP_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "uattn.h"

enum { MAX_BUCKETS = 16, MAX_CANDIDATES = 16, NUM_TUNABLES = 4 };
enum { T_THREADS = 0, T_TILE = 1, T_CHUNK = 2, T_SPLIT = 3 };

typedef struct bucket {
  int32_t block_size, head_dim;
  uattn_dtype dtype;
} bucket;

typedef struct options {
  const char *out_dir, *trace_file;
  bucket buckets[MAX_BUCKETS];
  int num_buckets;
  int32_t hq, hkv, runs, steps, skip, stride, seqs, tokens, max_len, prefix;
  uint64_t seed;
  double min_gain;
  bool plot;
  /* candidates per tunable; index 0 is always the default (0); split candidates index split_pairs */
  int32_t cand[NUM_TUNABLES][MAX_CANDIDATES];
  int num_cand[NUM_TUNABLES];
  int32_t split_min[MAX_CANDIDATES], split_keys[MAX_CANDIDATES];
} options;

/* Parses argv into o, the defaults where an option is not given; --help prints the usage and exits 0. 0, or -1
 * after saying on stderr what was wrong. */
int sweep_parse_options(int argc, char **argv, options *o);

#endif
