/* Choosing kernels: the generic set for this CPU, and the generated bucket for a layer's shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "convert.h"
#include "kernels.h"

/* The ISA ladder is the generator's (uattn_isa_registry, from gen/manifest.json): best first, the portable set
 * last, with no probe, as it always runs. */
static bool isa_runs_here(const uattn_isa *isa) { return !isa->runs_here || isa->runs_here(); }

const uattn_kernels *uattn_kernels_select(const char **why, bool *forced) {
  const uattn_kernels *best = NULL;
  for (size_t i = 0; i < uattn_isa_registry_size && !best; i++)
    if (isa_runs_here(&uattn_isa_registry[i])) best = uattn_isa_registry[i].set;
  if (why) *why = "the best set this CPU runs";
  if (forced) *forced = false;
  const char *name = getenv("UATTN_ISA");
  if (!name || !*name) return best;
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].set->name, name)) {
      if (!isa_runs_here(&uattn_isa_registry[i])) {
        if (why) *why = "UATTN_ISA names a set this CPU cannot run: using the best one it runs";
        return best;
      }
      if (why) *why = "forced by UATTN_ISA";
      if (forced) *forced = true;
      return uattn_isa_registry[i].set;
    }
  if (why) *why = "UATTN_ISA names no kernel set: using the best one this CPU runs";
  return best;
}

/* The generated values of one dimension among the buckets that match the others before it, e.g.
 * "64, 128", for a fallback's explanation. */
static void list_values(int dim, int32_t bs, int32_t hd, uattn_dtype dt, char *out, size_t size) {
  size_t used = 0;
  int32_t seen[64];
  int n = 0;
  out[0] = '\0';
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[i];
    if (e->dtype != dt || (dim > 1 && e->block_size != bs) || (dim > 2 && e->head_dim != hd)) continue;
    const int32_t v = dim == 1 ? e->block_size : dim == 2 ? e->head_dim : e->chunk_size;
    int dup = 0;
    for (int k = 0; k < n; k++) dup |= seen[k] == v;
    if (dup || n == 64) continue;
    seen[n++] = v;
    if (used < size) used += (size_t)snprintf(out + used, size - used, "%s%d", n > 1 ? ", " : "", v);
  }
}

const uattn_kernels *uattn_kernels_dispatch(int32_t block_size, int32_t head_dim, uattn_dtype cache_dtype,
                                            uattn_dtype dtype, int32_t chunk_size, const uattn_bucket_kernels **bucket,
                                            char *why, size_t why_size) {
  const char *generic_why;
  bool forced;
  const uattn_kernels *generic = uattn_kernels_select(&generic_why, &forced);
  *bucket = NULL;
  if (forced) {
    snprintf(why, why_size, "UATTN_ISA=%s forces the generic %s set", generic->name, generic->name);
    return generic;
  }
  /* bf16 dot products are for bf16 models: an f16 or f32 cache, or an f32 or f16 query, would lose bits to
   * their rounding, so such a layer takes the next level down, the avx512 set (which every CPU with
   * avx512bf16 runs), generated or generic; UATTN_ISA=avx512bf16 still forces them. A bf16 layer on an fp8
   * cache stays on this level: every fp8 value is exact in bf16, so P's rounding (the level's own) is all
   * it changes. This level's buckets take fp8 caches as the others' do (gen/manifest.json's dtypes), so
   * such a layer of a generated shape gets its bucket here, an f32 or f16 layer the avx512 bucket of the
   * shape; another shape gets its level's generic set, and a build that lists no bucket of the cache's
   * format says so: "no bucket was generated for a fp8_e5m2 cache". */
  const bool bf16_level = (cache_dtype == UATTN_BF16 || uattn_dtype_is_fp8(cache_dtype)) && dtype == UATTN_BF16;
  const char *bf16_only = "";
  if (generic == &uattn_kernels_avx512bf16 && !bf16_level) {
    generic = &uattn_kernels_avx512;
    bf16_only = " (avx512bf16 takes bf16 queries on bf16 or fp8 caches only)";
  }
  /* how far the buckets go along (dtype, block size, head dim, chunk size), for the explanation */
  int depth = 0, isa_missing = 0;
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[i];
    const int d = e->dtype != cache_dtype       ? 0
                  : e->block_size != block_size ? 1
                  : e->head_dim != head_dim     ? 2
                  : e->chunk_size != chunk_size ? 3
                                                : 4;
    if (d == 4 && !bf16_level && !strcmp(e->isa, "avx512bf16")) continue; /* see above */
    if (d == 4 && e->runs_here()) {
      *bucket = e;
      snprintf(why, why_size, "generated bucket (%s cache, block size %d, head dim %d, chunk size %d) for %s",
               uattn_dtype_name(cache_dtype), block_size, head_dim, chunk_size, e->isa);
      return &e->set;
    }
    if (d == 4) isa_missing = 1;
    if (d > depth) depth = d;
  }
  char values[128];
  static const char *const dims[] = {"cache dtype", "block size", "head dim", "chunk size"};
  const int32_t asked[] = {(int32_t)cache_dtype, block_size, head_dim, chunk_size};
  if (isa_missing) {
    snprintf(why, why_size, "fallback: the bucket was generated for an ISA this CPU lacks; generic %s kernels%s",
             generic->name, bf16_only);
  } else if (depth == 0) {
    snprintf(why, why_size, "fallback: no bucket was generated for a %s cache; generic %s kernels%s",
             uattn_dtype_name(cache_dtype), generic->name, bf16_only);
  } else {
    list_values(depth, block_size, head_dim, cache_dtype, values, sizeof values);
    snprintf(why, why_size, "fallback: %s %d is not generated for this shape (generated: %s); generic %s kernels%s",
             dims[depth], asked[depth], values, generic->name, bf16_only);
  }
  return generic;
}

int32_t uattn_kernel_buckets(uattn_kernel_bucket *out, int32_t capacity) {
  for (int32_t i = 0; out && i < capacity && (size_t)i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[i];
    const uattn_kernel_bucket b = {e->block_size, e->head_dim, e->dtype, e->chunk_size, e->isa, e->runs_here() != 0};
    /* byte-wise: this call has no status to refuse a misaligned out with, so it needs no alignment */
    memcpy((char *)out + (size_t)i * sizeof b, &b, sizeof b);
  }
  return (int32_t)uattn_bucket_registry_size;
}
