/* Choosing kernels: the generic set for this CPU, and the generated bucket for a layer's shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "kernels.h"

/* The ISA ladder is the generator's (uattn_isa_registry, from gen/manifest.json): best first, the portable set
 * last, with no probe, as it always runs. */
static bool isa_runs_here(const uattn_isa *isa) { return !isa->runs_here || isa->runs_here(); }

/* The test suites set UATTN_TWINS, so that a level this CPU lacks still runs, through its exact twin. */
static bool twins_wanted(void) {
  const char *t = getenv("UATTN_TWINS");
  return t && *t && strcmp(t, "0") != 0;
}

/* Rung i's set where it runs here: its own, or with twins (twins_wanted) its twin; NULL where neither runs. */
static const uattn_kernels *rung_set(size_t i, bool twins, bool *twin) {
  const uattn_isa *isa = &uattn_isa_registry[i];
  *twin = false;
  if (isa_runs_here(isa)) return isa->set;
  if (twins && isa->twin && isa->twin_runs_here()) return *twin = true, isa->twin;
  return NULL;
}

/* The set of the best rung at or below rung `top` that runs here (the portable rung always does), its rung in
 * *rung; with twins a rung the CPU lacks runs as its twin. */
static const uattn_kernels *best_from(size_t top, bool twins, size_t *rung, bool *twin) {
  for (size_t i = top;; i++) {
    const uattn_kernels *set = rung_set(i, twins, twin);
    if (set || i + 1 == uattn_isa_registry_size) return *rung = i, set ? set : uattn_isa_registry[i].set;
  }
}

/* The generic choice: the rung UATTN_ISA names (the highest to use) or the top one, and the set that serves it. */
typedef struct generic_choice {
  const uattn_kernels *set;
  size_t rung;
  bool forced, twin;
  const char *why;
} generic_choice;

static generic_choice choose_generic(void) {
  generic_choice c = {.why = "the best set this CPU runs"};
  c.set = best_from(0, false, &c.rung, &c.twin);
  const char *name = getenv("UATTN_ISA");
  if (!name || !*name) return c;
  for (size_t i = 0; i < uattn_isa_registry_size; i++)
    if (!strcmp(uattn_isa_registry[i].set->name, name)) {
      c.set = best_from(i, twins_wanted(), &c.rung, &c.twin);
      c.forced = true;
      c.why = c.rung != i ? "UATTN_ISA names a level this CPU lacks: the best set below it"
              : c.twin    ? "forced by UATTN_ISA; this CPU lacks the level: its exact twin (UATTN_TWINS)"
                          : "forced by UATTN_ISA";
      return c;
    }
  c.why = "UATTN_ISA names no kernel set: using the best one this CPU runs";
  return c;
}

const uattn_kernels *uattn_kernels_select(const char **why, bool *forced) {
  const generic_choice c = choose_generic();
  if (why) *why = c.why;
  if (forced) *forced = c.forced;
  return c.set;
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
  generic_choice g = choose_generic();
  const uattn_kernels *generic = g.set;
  *bucket = NULL;
  /* A level that rounds its inputs to bf16 serves only layers that lose nothing by it (bf16 queries on bf16 or
   * fp8 caches); any other layer takes the next level down that keeps its precision, also where UATTN_ISA
   * names the level: it names the highest level to use, not one to force on every layer. */
  char lowered[96] = "";
  while (!uattn_kernels_keep_precision(generic, dtype, cache_dtype) && g.rung + 1 < uattn_isa_registry_size) {
    if (!*lowered)
      snprintf(lowered, sizeof lowered, " (%s takes bf16 queries on bf16 or fp8 caches only)", generic->name);
    generic = best_from(g.rung + 1, g.twin || (g.forced && twins_wanted()), &g.rung, &g.twin);
  }
  if (g.forced) {
    snprintf(why, why_size, "UATTN_ISA=%s forces the generic %s set%s%s", getenv("UATTN_ISA"), generic->name,
             g.twin ? " (its exact twin: this CPU lacks the level)" : "", lowered);
    return generic;
  }
  const bool bf16_level = uattn_kernels_keep_precision(&(uattn_kernels){.caps.bf16_inputs = true}, dtype, cache_dtype);
  /* how far the buckets go along (dtype, block size, head dim, chunk size), for the explanation */
  int depth = 0, isa_missing = 0;
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[i];
    const int d = e->dtype != cache_dtype       ? 0
                  : e->block_size != block_size ? 1
                  : e->head_dim != head_dim     ? 2
                  : e->chunk_size != chunk_size ? 3
                                                : 4;
    if (d == 4 && !bf16_level && e->set.caps.bf16_inputs) continue; /* see above */
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
             generic->name, lowered);
  } else if (depth == 0) {
    snprintf(why, why_size, "fallback: no bucket was generated for a %s cache; generic %s kernels%s",
             uattn_dtype_name(cache_dtype), generic->name, lowered);
  } else {
    list_values(depth, block_size, head_dim, cache_dtype, values, sizeof values);
    snprintf(why, why_size, "fallback: %s %d is not generated for this shape (generated: %s); generic %s kernels%s",
             dims[depth], asked[depth], values, generic->name, lowered);
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
