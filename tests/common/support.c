#include "common/support.h"

#include <stdio.h>
#include <stdlib.h>

const char *test_env(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return (v && *v) ? v : fallback;
}

const char *test_fixture_path(const char *file) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/%s", test_env("UATTN_FIXTURES_DIR", "fixtures"), file);
  return path;
}

cJSON *test_load_json(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n + 1);
  size_t got = text ? fread(text, 1, (size_t)n, f) : 0;
  fclose(f);
  if (!text || got != (size_t)n) {
    free(text);
    fprintf(stderr, "cannot read %s\n", path);
    return NULL;
  }
  text[n] = '\0';
  cJSON *root = cJSON_Parse(text);
  free(text);
  if (!root) fprintf(stderr, "malformed JSON in %s\n", path);
  return root;
}

int test_json_ints(const cJSON *array, int32_t *out, int cap) {
  if (!cJSON_IsArray(array)) return -1;
  int n = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, array) {
    if (!cJSON_IsNumber(item) || n >= cap) return -1;
    out[n++] = (int32_t)item->valuedouble;
  }
  return n;
}

uint64_t test_rng_next(test_rng *rng) {
  uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int32_t test_rng_range(test_rng *rng, int32_t lo, int32_t hi) {
  uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
  return (int32_t)(lo + (int64_t)(test_rng_next(rng) % span));
}

double test_rng_unit(test_rng *rng) { return (double)(test_rng_next(rng) >> 11) * 0x1.0p-53; }

static void *counting_alloc(void *user, size_t bytes) {
  test_counting_allocator *a = user;
  a->allocs++;
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

static void counting_free(void *user, void *ptr) {
  test_counting_allocator *a = user;
  a->frees++;
  free(ptr);
}

void test_counting_allocator_init(test_counting_allocator *a) {
  a->allocs = a->frees = 0;
  a->hooks.alloc = counting_alloc;
  a->hooks.free = counting_free;
  a->hooks.user = a;
}
