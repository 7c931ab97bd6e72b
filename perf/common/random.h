/* The tools' random numbers: splitmix64 (Steele, Lea and Flood's generator), each tool from a fixed seed so
 * that every run draws the same data and the same block tables. */
#ifndef UATTN_PERF_RANDOM_H
#define UATTN_PERF_RANDOM_H

#include <stdint.h>

/* The next 64 random bits of the generator at *state. */
static inline uint64_t perf_random_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* a[0..n) in a random order (Fisher-Yates): how the tools make a block table an engine's cache could hold,
 * its blocks handed out long after the cache was new. */
static inline void perf_random_shuffle(int32_t *a, int32_t n, uint64_t *state) {
  for (int32_t i = n - 1; i > 0; i--) {
    const int32_t j = (int32_t)(perf_random_next(state) % (uint64_t)(i + 1)), x = a[i];
    a[i] = a[j];
    a[j] = x;
  }
}

#endif
