/* Helpers shared by the Criterion suites: environment, JSON fixtures, a seeded RNG, a counting allocator. */
#ifndef UATTN_TEST_SUPPORT_H
#define UATTN_TEST_SUPPORT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "uattn.h"

/* $name, or fallback when unset. */
const char *test_env(const char *name, const char *fallback);
/* dir/file under $UATTN_FIXTURES_DIR, in a static buffer. */
const char *test_fixture_path(const char *file);
/* Parses a whole JSON file; NULL (with a message on stderr) when missing or malformed. */
cJSON *test_load_json(const char *path);
/* Reads a JSON array of integers into out (at most cap); returns the count, -1 if not such an array. */
int test_json_ints(const cJSON *array, int32_t *out, int cap);

/* splitmix64: small, seeded, the same on every machine. */
typedef struct test_rng {
  uint64_t state;
} test_rng;
uint64_t test_rng_next(test_rng *rng);
/* Uniform in [lo, hi]. */
int32_t test_rng_range(test_rng *rng, int32_t lo, int32_t hi);
/* Uniform in [0, 1). */
double test_rng_unit(test_rng *rng);

/* An allocator that counts its calls, for "no allocation per step" checks. */
typedef struct test_counting_allocator {
  uattn_allocator hooks; /* pass &hooks to the library */
  long allocs;
  long frees;
} test_counting_allocator;
void test_counting_allocator_init(test_counting_allocator *a);

#endif
