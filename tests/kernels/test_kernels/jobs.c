/* The kernel suite's random panel jobs (jobs.h): a job of any shape, rule and dtype the forward can hand a
 * kernel set, or of a bucket's shape, its keys copied into TILED blocks or scattered over a list of blocks,
 * and its run through one part of a set from poisoned panels. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "avx2/avx2.h"
#include "convert.h"
#include "jobs.h"
void need_avx2(void) {
  if (!uattn_avx2_runs_here()) cr_skip_test("this CPU lacks AVX2, FMA or F16C");
}

float uniform(test_rng *rng, float lo, float hi) { return lo + (hi - lo) * (float)test_rng_unit(rng); }

/* ---- random panel jobs ------------------------------------------------------------------------------ */

const int32_t head_dims[14] = {64, 80, 96, 128, 192, 256, 4, 24, 72, 1, 3, 13, 33, 200};

void store_elem(uattn_dtype t, void *dst, size_t i, float f) {
  if (t == UATTN_F32) {
    ((float *)dst)[i] = f;
  } else if (t == UATTN_BF16) {
    ((uint16_t *)dst)[i] = uattn_f32_to_bf16(f);
  } else if (uattn_dtype_is_fp8(t)) { /* raw codes: the kernels widen them; the forward applies the scales */
    ((uint8_t *)dst)[i] = uattn_f32_to_fp8(t, f);
  } else {
    ((uint16_t *)dst)[i] = uattn_f32_to_f16(f);
  }
}

void make_case(job_case *c, test_rng *rng, const case_limits *lim) {
  memset(c, 0, sizeof *c);
  c->rows = test_rng_range(rng, 0, 3) == 0 ? 1 : test_rng_range(rng, 1, 64);
  if (lim->large) c->rows = test_rng_range(rng, 8, 64);
  c->group = test_rng_range(rng, 1, 8);
  if (lim->decode)
    c->rows = test_rng_range(rng, 0, 1) ? 1 : test_rng_range(rng, 1, UATTN_DECODE_MAX_VECTORS / c->group);
  c->D = lim->head_dim ? lim->head_dim
                       : head_dims[test_rng_range(rng, 0, (int32_t)(sizeof head_dims / sizeof *head_dims) - 1)];
  if (lim->every_code)
    c->D = test_rng_range(rng, 0, 4) ? 32 * test_rng_range(rng, 1, 8) : 8 * test_rng_range(rng, 1, 40);
  /* what decode_tiled takes; past 256 its bf16 P V goes in 256-dim pieces */
  if (lim->tiled && !lim->head_dim) c->D = 32 * test_rng_range(rng, 1, 10);
  /* every cache dtype, fp8 ones included (raw codes) */
  c->dtype = (uattn_dtype)test_rng_range(rng, UATTN_F32, UATTN_FP8_E5M2);
  /* up to 256 keys (a cache block), now and then a causal slice of several of the avx2 set's key chunks */
  c->num_keys =
      test_rng_range(rng, 0, lim->large ? 2 : 19) == 0 ? test_rng_range(rng, 257, 700) : test_rng_range(rng, 1, 256);
  bool own = false;
  if (lim->block_size && test_rng_range(rng, 0, 3) > 0) /* a whole cache block, the bucket's own case */
    c->num_keys = lim->block_size, c->dtype = lim->dtype, own = true;
  /* a bf16 set's other jobs: bf16 keys, or fp8 ones of either format; a bf16 fp8 bucket's also bf16 ones (its
   * causal part reads a bf16 layer's own keys) */
  if (lim->bf16 && !own) {
    const int32_t k = !lim->fp8 ? 2 : test_rng_range(rng, 0, lim->block_size ? 2 : 1);
    c->dtype = k == 2 ? UATTN_BF16 : k == 1 ? UATTN_FP8_E4M3 : UATTN_FP8_E5M2;
  }
  if (lim->every_code) c->dtype = test_rng_range(rng, 0, 1) ? UATTN_FP8_E4M3 : UATTN_FP8_E5M2;
  c->probs_fp32 = lim->probs_fp32;
  c->tiled = lim->tiled;
  /* panels as the forward sizes them: at least the keys, sometimes a causal-width panel */
  c->panel_keys =
      c->num_keys + (test_rng_range(rng, 0, 3) == 0 ? test_rng_range(rng, 0, 300) : test_rng_range(rng, 0, 9));
  /* a cache block past the end of a sequence is loaded partly and attended with num_keys = block size, every
   * row seeing no more than was loaded */
  const bool partial = test_rng_range(rng, 0, 4) == 0;
  c->count = partial ? test_rng_range(rng, 1, c->num_keys) : c->num_keys;
  c->key_pos0 = test_rng_range(rng, 0, 2000);
  c->window = test_rng_range(rng, 0, 2) == 0 ? test_rng_range(rng, 1, 300) : 0;
  c->soft_cap = test_rng_range(rng, 0, 2) == 0 ? uniform(rng, 2.0f, 50.0f) : 0.0f;
  c->has_alibi = test_rng_range(rng, 0, 2) == 0;
  for (int32_t h = 0; h < c->group; h++) c->alibi[h] = c->has_alibi ? uniform(rng, 0.0f, 0.5f) : 0.0f;
  for (int32_t r = 0; r < c->rows; r++) {
    const int32_t kind = test_rng_range(rng, 0, 5);
    int32_t vis = kind == 0   ? 0
                  : kind == 1 ? c->num_keys + test_rng_range(rng, 0, 10)
                              : test_rng_range(rng, 0, c->num_keys);
    if (partial && vis > c->count) vis = c->count;
    c->visible[r] = vis;
    /* positions around the panel, so windows cut through it, before it and after it */
    c->query_pos[r] = c->key_pos0 + test_rng_range(rng, -20, c->num_keys + 80);
  }
  if (lim->specials) c->rows = 1, c->window = 0;
  if (lim->list && c->num_keys <= UATTN_DECODE_MAX_KEYS) {
    c->list_keys = UATTN_DECODE_MIN_TILE << test_rng_range(rng, 0, 4);
    c->list_seed = test_rng_range(rng, 0, 3) == 0 ? 0 : (uint64_t)test_rng_range(rng, 1, 1 << 30);
  }
  c->nhd = test_rng_range(rng, 0, 1);
  c->kv_heads = c->nhd ? test_rng_range(rng, 1, 4) : 1;
  c->stride = (size_t)c->kv_heads * c->D;
  const size_t esz = uattn_dtype_size(c->dtype), n = (size_t)c->count * c->stride;
  c->k_base = malloc(n * esz);
  c->v_base = malloc(n * esz);
  for (size_t i = 0; i < n; i++) {
    store_elem(c->dtype, c->k_base, i, uniform(rng, -1.0f, 1.0f));
    store_elem(c->dtype, c->v_base, i, uniform(rng, -1.0f, 1.0f));
  }
  if (lim->every_code) { /* raw codes; one with every exponent bit set is drawn again unless specials allows it */
    const int special = c->dtype == UATTN_FP8_E4M3 ? 0x7f : 0x7c;
    for (size_t i = 0; i < 2 * n; i++) {
      uint8_t b = (uint8_t)test_rng_range(rng, 0, 255);
      while ((b & special) == special && !(lim->specials && test_rng_range(rng, 0, 3000) == 0))
        b = (uint8_t)test_rng_range(rng, 0, 255);
      ((uint8_t *)(i < n ? c->k_base : c->v_base))[i % n] = b;
    }
  }
  const size_t head = (size_t)test_rng_range(rng, 0, c->kv_heads - 1) * c->D; /* the head the job reads */
  c->k_src = c->k_base + head * esz, c->v_src = c->v_base + head * esz;
  /* queries pre-scaled as the forward does, sometimes far sharper than 1/sqrt(D) */
  const float sharp = (float)(test_rng_range(rng, 0, 2) == 0 ? 8.0 : 1.0) / sqrtf((float)c->D);
  const size_t nx = (size_t)c->rows * c->group;
  c->q = malloc(sizeof(float) * nx * c->D), c->qu = malloc(sizeof(float) * nx * c->D);
  c->scale = sharp;
  c->m0 = malloc(sizeof(float) * nx), c->l0 = malloc(sizeof(float) * nx), c->o0 = malloc(sizeof(float) * nx * c->D);
  for (size_t i = 0; i < nx * c->D; i++) {
    c->qu[i] = uattn_bf16_to_f32(uattn_f32_to_bf16(uniform(rng, -1.0f, 1.0f)));
    c->q[i] = c->qu[i] * sharp;
  }
  if (lim->every_code) /* scores of the sizes of the other cases' (the largest codes: E4M3 448, E5M2 57344) */
    for (size_t i = 0; i < nx * c->D; i++) {
      const float f = c->dtype == UATTN_FP8_E4M3 ? 0x1p-9f : 0x1p-16f;
      c->qu[i] *= f, c->q[i] *= f;
    }
  if (lim->every_code && test_rng_range(rng, 0, 2) == 0) { /* queries past what a kernel may fold in (2^76) at */
    const int32_t d = test_rng_range(rng, 0, c->D - 1);    /* one dim, where every key is a zero of either sign */
    for (size_t x = 0; x < nx; x++)
      c->qu[x * c->D + d] = (x % 2 ? -0x1p76f : 0x1p76f), c->q[x * c->D + d] = c->qu[x * c->D + d] * sharp;
    for (size_t i = (size_t)d; i < n; i += (size_t)c->D)
      ((uint8_t *)c->k_base)[i] = test_rng_range(rng, 0, 1) ? 0x80 : 0;
  }
  const bool fresh = test_rng_range(rng, 0, 1);
  for (size_t x = 0; x < nx; x++) {
    c->m0[x] = fresh ? -INFINITY : uniform(rng, -3.0f, 3.0f);
    c->l0[x] = fresh ? 0.0f : uniform(rng, 0.5f, 4.0f);
    for (int32_t d = 0; d < c->D; d++) c->o0[x * c->D + d] = fresh ? 0.0f : uniform(rng, -1.0f, 1.0f) * c->l0[x];
  }
  /* a quarter of the jobs keep fewer dims of o than the head dim (an MLA layer's values) */
  c->value_dim = test_rng_range(rng, 0, 3) == 0 ? test_rng_range(rng, 1, c->D) : 0;
}

void free_case(job_case *c) {
  free(c->k_base), free(c->v_base);
  free(c->q), free(c->qu), free(c->m0), free(c->l0), free(c->o0);
}

void tiled_copy(uattn_dtype t, const char *k, const char *v, int32_t count, int32_t heads, int32_t D, char **tk,
                char **tv) {
  const size_t esz = uattn_dtype_size(t), tiles = (size_t)(count + 15) / 16, n = tiles * 16 * heads * D;
  *tk = malloc(n * esz), *tv = malloc(n * esz);
  for (size_t x = 0; x < n; x++) /* NaN: bf16 0x7fc0, fp8 S.1111.111 (both formats) */
    if (esz == 1)
      (*tk)[x] = (*tv)[x] = 0x7f;
    else
      ((uint16_t *)*tk)[x] = ((uint16_t *)*tv)[x] = 0x7fc0;
  for (int32_t j = 0; j < count; j++)
    for (int32_t h = 0; h < heads; h++)
      for (int32_t d = 0; d < D; d++) {
        const size_t tile = (size_t)j / 16, i = (size_t)j % 16, src = ((size_t)j * heads + h) * D + d;
        const size_t share = (tile * heads + h) * 16 * D;
        memcpy(*tk + (share + (((size_t)d / 2) * 16 + i) * 2 + d % 2) * esz, k + src * esz, esz);
        memcpy(*tv + (share + ((i / 2) * D + d) * 2 + i % 2) * esz, v + src * esz, esz);
      }
}

/* A case's keys and values in blocks of list_keys keys (every head of a row, as an NHD block holds them),
 * scattered over a pool of twice as many blocks (list_seed 0: in order, one after the other), the slots
 * around them and past the case's keys NaN codes (0xff bytes, NaN in every dtype); k and v: the job's head
 * in each block, its decode call's list. */
typedef struct block_list {
  char *k_pool, *v_pool;
  const void *k[UATTN_DECODE_MAX_BLOCKS], *v[UATTN_DECODE_MAX_BLOCKS];
} block_list;

static void scatter_blocks(const job_case *c, block_list *bl) {
  const int32_t bk = c->list_keys, blocks = (c->num_keys + bk - 1) / bk, slots = 2 * blocks;
  const size_t esz = uattn_dtype_size(c->dtype), row = c->stride * esz, block = (size_t)bk * row;
  const size_t head = (size_t)((const char *)c->k_src - c->k_base);
  bl->k_pool = malloc(block * (size_t)slots), bl->v_pool = malloc(block * (size_t)slots);
  memset(bl->k_pool, 0xff, block * (size_t)slots), memset(bl->v_pool, 0xff, block * (size_t)slots);
  int32_t slot[2 * UATTN_DECODE_MAX_BLOCKS];
  for (int32_t i = 0; i < slots; i++) slot[i] = i;
  test_rng rng = {c->list_seed};
  for (int32_t i = slots - 1; c->list_seed && i > 0; i--) {
    const int32_t j = test_rng_range(&rng, 0, i), x = slot[i];
    slot[i] = slot[j], slot[j] = x;
  }
  for (int32_t b = 0; b < blocks; b++) {
    const int32_t keys = c->count - b * bk < bk ? c->count - b * bk : bk;
    char *k = bl->k_pool + (size_t)slot[b] * block, *v = bl->v_pool + (size_t)slot[b] * block;
    if (keys > 0) memcpy(k, c->k_base + (size_t)b * block, (size_t)keys * row);
    if (keys > 0) memcpy(v, c->v_base + (size_t)b * block, (size_t)keys * row);
    bl->k[b] = k + head, bl->v[b] = v + head;
  }
}

job_result run_set(const uattn_kernels *set, uattn_part part, const job_case *c) {
  const size_t floats = set->panel_floats(c->panel_keys, c->D), nx = (size_t)c->rows * c->group;
  const size_t canary = 64;
  float *keys = malloc(sizeof(float) * (floats + canary)), *values = malloc(sizeof(float) * (floats + canary));
  for (size_t i = 0; i < floats + canary; i++) keys[i] = values[i] = NAN;
  set->load(c->dtype, c->k_src, c->v_src, c->stride, c->count, c->D, c->panel_keys, keys, values);
  for (size_t i = floats; i < floats + canary; i++)
    cr_assert(isnan(keys[i]) && isnan(values[i]), "%s: load wrote past panel_floats", set->name);
  job_result r = {malloc(sizeof(float) * nx), malloc(sizeof(float) * nx), malloc(sizeof(float) * nx * c->D)};
  memcpy(r.m, c->m0, sizeof(float) * nx);
  memcpy(r.l, c->l0, sizeof(float) * nx);
  memcpy(r.o, c->o0, sizeof(float) * nx * c->D);
  float *scores = malloc(sizeof(float) * (size_t)c->panel_keys);
  const uattn_panel_job job = {
      .rows = c->rows,
      .group = c->group,
      .head_dim = c->D,
      .q = set->caps.unscaled_q ? c->qu : c->q, /* the attend's; the decode kernels' below */
      .query_pos = c->query_pos,
      .visible = c->visible,
      .num_keys = c->num_keys,
      .key_pos0 = c->key_pos0,
      .keys = keys,
      .values = values,
      .soft_cap = c->soft_cap,
      .window = c->window,
      .alibi = c->has_alibi ? c->alibi : NULL,
      .m = r.m,
      .l = r.l,
      .o = r.o,
      .scores = scores,
      .scale = c->scale,
      .probs_fp32 = c->probs_fp32,
      .value_dim = c->value_dim,
  };
  const bool tiled = part == UATTN_PART_UNIQUE && c->tiled &&
                     uattn_decode_tiled_fits(set, c->num_keys, c->D, c->group, c->dtype, c->probs_fp32) &&
                     c->rows * c->group <= set->caps.decode_max_vectors;
  uattn_panel_job decode_job = job;
  decode_job.q = set->caps.decode_unscaled_q ? c->qu : c->q;
  if (tiled) { /* the case's head of a TILED copy of its rows */
    const size_t esz = uattn_dtype_size(c->dtype), head = (size_t)((const char *)c->k_src - c->k_base) / esz / c->D;
    char *tk, *tv;
    tiled_copy(c->dtype, c->k_base, c->v_base, c->count, c->kv_heads, c->D, &tk, &tv);
    const size_t bytes = sizeof(float) * uattn_decode_scratch_floats(1, c->rows * c->group, c->D);
    float *scratch = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    set->decode_tiled(&decode_job, 1, nx, c->dtype, tk + head * 16 * c->D * esz, tv + head * 16 * c->D * esz,
                      (size_t)c->kv_heads * 16 * c->D, (size_t)16 * c->D, scratch);
    free(scratch), free(tk), free(tv);
  } else if (part == UATTN_PART_UNIQUE && uattn_decode_fits(set, c->num_keys, c->D, c->group) &&
             c->rows * c->group <= set->caps.decode_max_vectors) {
    const size_t bytes = sizeof(float) * uattn_decode_scratch_floats(1, c->rows * c->group, c->D);
    float *scratch = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (c->list_keys && uattn_decode_list_fits(set, c->list_keys)) {
      block_list bl;
      scatter_blocks(c, &bl);
      const uattn_decode_src src = {bl.k, bl.v, c->list_keys, c->stride, 0};
      set->decode(&decode_job, 1, nx, c->dtype, &src, scratch);
      free(bl.k_pool), free(bl.v_pool);
    } else { /* from the source, no panels */
      const uattn_decode_src src = uattn_decode_one_block(&c->k_src, &c->v_src, c->stride, 0);
      set->decode(&decode_job, 1, nx, c->dtype, &src, scratch);
    }
    free(scratch);
  } else
    set->attend[part](&job, c->panel_keys);
  free(scores), free(keys), free(values);
  return r;
}

void free_result(job_result *r) { free(r->m), free(r->l), free(r->o); }

bool kept_dim(const job_case *c, size_t i) { return c->value_dim == 0 || (int32_t)(i % (size_t)c->D) < c->value_dim; }

bool same_bits(const job_result *a, const job_result *b, const job_case *c) {
  const size_t nx = (size_t)c->rows * c->group;
  for (size_t i = 0; i < nx * c->D; i++)
    if (kept_dim(c, i) && memcmp(&a->o[i], &b->o[i], sizeof(float))) return false;
  return !memcmp(a->m, b->m, sizeof(float) * nx) && !memcmp(a->l, b->l, sizeof(float) * nx);
}

uint16_t random_bf16(test_rng *rng, int kind) {
  const int32_t e = kind == 0   ? test_rng_range(rng, 115, 135)
                    : kind == 1 ? test_rng_range(rng, 0, 2)
                                : test_rng_range(rng, 0, 254);
  const uint32_t sign = (uint32_t)test_rng_range(rng, 0, 1), mantissa = (uint32_t)test_rng_range(rng, 0, 127);
  return (uint16_t)(sign << 15 | (uint32_t)e << 7 | mantissa);
}
