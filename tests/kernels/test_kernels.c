/* The kernel sets against each other: the avx2 set's load and attend against the portable set on thousands
 * of random panel jobs (every shape, rule and dtype the forward can hand them), every part (decode included) of
 * every generated bucket in the registry on jobs of its shape, each bucket the dispatch's choice for its shape,
 * the avx2 loads bit for bit, its vector exp and tanh against libm, the ISA ladder (gen/manifest.json) and the
 * selection. The avx2 cases skip themselves on a CPU without AVX2, FMA and F16C, a bucket's on a CPU without
 * its ISA, saying so. Tolerance of attend: max |out - ref| <= 1e-5 * max |ref| over a job (out = o / l),
 * the fp32 rounding of a different summation order with FMA; exact_job and the test say where the fp32
 * conditioning of a job needs more (outputs cancelling to far less than their terms, scores of size 300).
 * Every timed test has the same timeout: two tests with different ones running side by side (--jobs 2) make
 * Criterion 2.4's runner leak a timer, which fails the suite under ASan. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <criterion/parameterized.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>

#include "avx512bf16/vec.h" /* the twin form: vdpbf16ps emulated on AVX2 */
#include "amx/tile.h"       /* the twin form: tdpbf16ps emulated */
#endif

#include "amx/amx.h"
#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "convert.h"
#include "kernels.h"
#include "portable/portable.h"
#include "avx2/xsmm.h"
#include "common/support.h"

/* Sanitized builds run the sweeps thinner (every SPARSE-th point more) and fewer random jobs. */
#if defined(__SANITIZE_ADDRESS__)
#define SPARSE 8
#else
#define SPARSE 1
#endif
/* The amx twin emulates every tile product element by element in C, many times slower than the other twins'
 * vector code, which ASan slows down further: its jobs a further 4 times fewer there. */
#define AMX_TWIN_SPARSE (SPARSE > 1 ? 4 * SPARSE : 1)

static void need_avx2(void) {
  if (!uattn_avx2_runs_here()) cr_skip_test("this CPU lacks AVX2, FMA or F16C");
}

static float uniform(test_rng *rng, float lo, float hi) { return lo + (hi - lo) * (float)test_rng_unit(rng); }

/* Where the avx2 set puts key i, dim d and value i, dim d (its layout; see kernels/avx2/set.c). */
static const float *aligned64(const float *p) { return (const float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* ---- random panel jobs ------------------------------------------------------------------------------ */

typedef struct job_case {
  int32_t rows, group, D, num_keys, count, panel_keys, key_pos0, window, kv_heads;
  uattn_dtype dtype;
  bool nhd;
  float soft_cap;
  float alibi[8];
  bool has_alibi;
  int32_t query_pos[64], visible[64];
  /* the cache-like sources: count keys, each row `stride` elements apart */
  char *k_base, *v_base; /* kv_heads heads a row; the job reads one of them */
  const void *k_src, *v_src;
  size_t stride;
  float *q;            /* [rows][group][D], scaled as the forward scales it for the fp32 sets */
  float *qu, scale;    /* the same queries unscaled (bf16 values, as a bf16 model's), and the scale */
  bool probs_fp32;     /* the layer option the bf16 sets read */
  bool tiled;          /* case_limits.tiled */
  int32_t list_keys;   /* case_limits.list: the keys of each block of the decode call's list (scatter_blocks) */
  uint64_t list_seed;  /* where the list's blocks lie */
  float *m0, *l0, *o0; /* the state before the call */
} job_case;

static const int32_t head_dims[] = {64, 80, 96, 128, 192, 256, 4, 24, 72, 1, 3, 13, 33, 200};

static void store_elem(uattn_dtype t, void *dst, size_t i, float f) {
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

/* What a kernel under test is specialized for (a generated bucket), so its random jobs have that shape;
 * zeros: any shape. */
typedef struct case_limits {
  int32_t head_dim;   /* every job's */
  int32_t block_size; /* most jobs load exactly one block of this many keys in the dtype below */
  uattn_dtype dtype;
  bool decode;     /* jobs the decode kernel takes: up to UATTN_DECODE_MAX_VECTORS vectors */
  bool large;      /* jobs of many rows, often several key chunks long (what the libxsmm body is for) */
  bool bf16;       /* bf16 sources only (a bf16 set's: its dot products round others to bf16) */
  bool fp8;        /* with bf16: fp8 caches instead (E4M3 or E5M2, exact in bf16: the bf16 level takes them too),
                    * and for a bucket's jobs (a block size) bf16 keys among them */
  bool probs_fp32; /* the bf16 sets' P V in fp32 (uattn_layer.probs_fp32) */
  bool tiled;      /* decode jobs on a TILED copy of the keys (decode_tiled), where the set has the kernel */
  bool list;       /* decode jobs over a list of blocks of 8 to 128 keys (uattn_decode_src), scattered over a
                    * pool of twice as many, a quarter of the lists in order */
  bool every_code; /* fp8 caches of random codes, every finite one (subnormals, zeros of both signs, the
                    * largest), mostly at head dims of whole 32s; a third of the jobs' queries 2^76 at a dim
                    * where every key is zero */
  bool specials;   /* with every_code: now and then a code with every exponent bit set (NaN; E5M2's infinities),
                    * in jobs of one row and no window (every vector sees the same keys) */
} case_limits;

static void make_case(job_case *c, test_rng *rng, const case_limits *lim) {
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
}

static void free_case(job_case *c) {
  free(c->k_base), free(c->v_base);
  free(c->q), free(c->qu), free(c->m0), free(c->l0), free(c->o0);
}

typedef struct job_result {
  float *m, *l, *o;
} job_result;

/* count keys (and values) of `heads` heads, rows `heads * D` elements apart as in an NHD block, copied into a
 * fresh TILED block (uattn.h) of whole 16-key tiles, written out from the layout's definition: key i of tile t,
 * head h, dim d = 2 p + e at (((t * heads + h) * D / 2 + p) * 16 + i) * 2 + e; its value at
 * (((t * heads + h) * 8 + i / 2) * D + d) * 2 + i % 2. The slots past the keys hold NaN codes, as slots never
 * written may: a kernel must not let them reach the output. */
static void tiled_copy(uattn_dtype t, const char *k, const char *v, int32_t count, int32_t heads, int32_t D, char **tk,
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

/* Runs a case through a kernel set: load into fresh panels (poisoned with NaN, so anything the set reads
 * that it did not write shows), then attend from the case's initial state. */
static job_result run_set(const uattn_kernels *set, uattn_part part, const job_case *c) {
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
      .q = set->caps.unscaled_q ? c->qu : c->q,
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
  };
  const bool tiled = part == UATTN_PART_UNIQUE && c->tiled &&
                     uattn_decode_tiled_fits(set, c->num_keys, c->D, c->group, c->dtype, c->probs_fp32) &&
                     c->rows * c->group <= set->caps.decode_max_vectors;
  if (tiled) { /* the case's head of a TILED copy of its rows */
    const size_t esz = uattn_dtype_size(c->dtype), head = (size_t)((const char *)c->k_src - c->k_base) / esz / c->D;
    char *tk, *tv;
    tiled_copy(c->dtype, c->k_base, c->v_base, c->count, c->kv_heads, c->D, &tk, &tv);
    const size_t bytes = sizeof(float) * uattn_decode_scratch_floats(1, c->rows * c->group, c->D);
    float *scratch = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    set->decode_tiled(&job, 1, nx, c->dtype, tk + head * 16 * c->D * esz, tv + head * 16 * c->D * esz,
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
      set->decode(&job, 1, nx, c->dtype, &src, scratch);
      free(bl.k_pool), free(bl.v_pool);
    } else { /* from the source, no panels */
      const uattn_decode_src src = uattn_decode_one_block(&c->k_src, &c->v_src, c->stride, 0);
      set->decode(&job, 1, nx, c->dtype, &src, scratch);
    }
    free(scratch);
  } else
    set->attend[part](&job, c->panel_keys);
  free(scores), free(keys), free(values);
  return r;
}

static void free_result(job_result *r) { free(r->m), free(r->l), free(r->o); }

/* Whether two runs of a case left the same bits in every state and output. */
static bool same_bits(const job_result *a, const job_result *b, const job_case *c) {
  const size_t nx = (size_t)c->rows * c->group;
  return !memcmp(a->o, b->o, sizeof(float) * nx * c->D) && !memcmp(a->m, b->m, sizeof(float) * nx) &&
         !memcmp(a->l, b->l, sizeof(float) * nx);
}

/* Sets a and b leave the same bits on `cases` random jobs of `part` (limits, seed); `differs` says what it
 * means when they do not. */
static void check_sets_same_bits(const uattn_kernels *a, const uattn_kernels *b, uattn_part part,
                                 const case_limits *limits, int cases, uint64_t seed, const char *differs) {
  test_rng rng = {seed};
  for (int i = 0; i < cases; i++) {
    job_case c;
    make_case(&c, &rng, limits);
    job_result ra = run_set(a, part, &c), rb = run_set(b, part, &c);
    cr_assert(same_bits(&ra, &rb, &c), "case %d (rows %d, group %d, D %d, keys %d, dtype %d): %s", i, c.rows, c.group,
              c.D, c.num_keys, (int)c.dtype, differs);
    free_result(&ra), free_result(&rb), free_case(&c);
  }
}

/* The case in fp64 from the same widened inputs: out[x * D + d] (NaN where the vector sees nothing),
 * score_size[x] (the largest sum_d |q_d k_d| + |score| of the vector's keys, what the fp32 rounding of a
 * score is proportional to), and the scale errors are measured against: the larger of max |out| and max over (x, d) of
 * the weighted sum of the terms' magnitudes, (|o0| e^(m0 - M) + sum_j p_j |v_jd|) / l. The second is what fp32 rounding
 * of any summation order is proportional to; it only matters when a tiny head dim lets the terms cancel to an output
 * far smaller than themselves (D 1, 230 keys: max |out| 1e-3 of the terms). */
static double exact_job(const job_case *c, double *out, double *score_size) {
  const int32_t D = c->D;
  const size_t esz = uattn_dtype_size(c->dtype);
  float *kf = malloc(sizeof(float) * (size_t)c->count * D), *vf = malloc(sizeof(float) * (size_t)c->count * D);
  for (int32_t j = 0; j < c->count; j++) {
    uattn_widen(c->dtype, (const char *)c->k_src + (size_t)j * c->stride * esz, kf + (size_t)j * D, (size_t)D);
    uattn_widen(c->dtype, (const char *)c->v_src + (size_t)j * c->stride * esz, vf + (size_t)j * D, (size_t)D);
  }
  double scale = 0;
  double *o = malloc(sizeof(double) * D), *mag = malloc(sizeof(double) * D);
  double *s = malloc(sizeof(double) * (size_t)c->num_keys);
  for (int32_t row = 0; row < c->rows; row++)
    for (int32_t h = 0; h < c->group; h++) {
      const size_t x = (size_t)row * c->group + h;
      int32_t lo = 0, hi = c->visible[row] < c->num_keys ? c->visible[row] : c->num_keys;
      if (c->window > 0 && c->query_pos[row] - c->window + 1 - c->key_pos0 > lo)
        lo = c->query_pos[row] - c->window + 1 - c->key_pos0;
      double M = c->m0[x];
      score_size[x] = 0;
      for (int32_t j = lo; j < hi; j++) {
        double dot = 0, size = 0;
        for (int32_t d = 0; d < D; d++) {
          dot += (double)c->q[x * D + d] * kf[(size_t)j * D + d];
          size += fabs((double)c->q[x * D + d] * kf[(size_t)j * D + d]);
        }
        if (c->soft_cap > 0) dot = c->soft_cap * tanh(dot / c->soft_cap);
        if (c->has_alibi) dot += c->alibi[h] * (double)(c->key_pos0 + j - c->query_pos[row]);
        s[j] = dot;
        if (dot > M) M = dot;
        score_size[x] = fmax(score_size[x], size + fabs(dot));
      }
      if (M == -INFINITY) {
        for (int32_t d = 0; d < D; d++) out[x * D + d] = NAN;
        continue;
      }
      const double a = c->m0[x] == -INFINITY ? 0 : exp(c->m0[x] - M);
      double l = c->l0[x] * a;
      for (int32_t d = 0; d < D; d++) o[d] = c->o0[x * D + d] * a, mag[d] = fabs(o[d]);
      for (int32_t j = lo; j < hi; j++) {
        const double p = exp(s[j] - M);
        l += p;
        for (int32_t d = 0; d < D; d++) {
          o[d] += p * vf[(size_t)j * D + d];
          mag[d] += p * fabs(vf[(size_t)j * D + d]);
        }
      }
      for (int32_t d = 0; d < D; d++) {
        out[x * D + d] = o[d] / l;
        scale = fmax(scale, fmax(fabs(o[d]), mag[d]) / l);
      }
    }
  free(o), free(mag), free(s), free(kf), free(vf);
  return scale;
}

/* max over (x, d) of |o / l - ref| / scale, over the vectors that saw something. */
static double error_against(const job_case *c, const job_result *r, const double *ref, double scale) {
  const size_t n = (size_t)c->rows * c->group * c->D;
  double err = 0;
  for (size_t i = 0; i < n; i++)
    if (!isnan(ref[i])) err = fmax(err, fabs(r->o[i] / r->l[i / c->D] - ref[i]));
  return scale > 0 ? err / scale : err;
}

/* Checks the states a case leaves: those that saw nothing bit for bit, the maxima and sums of the others
 * against the portable set's. e^(s - m) turns the absolute rounding error of a score (a few ulps of its
 * size) into a relative error of l: the bound on l grows with the scores' size, as the one on m does. */
static void check_states(const job_case *c, const job_result *ref, const job_result *got, const double *score_size,
                         int index) {
  const size_t nx = (size_t)c->rows * c->group;
  for (size_t x = 0; x < nx; x++) {
    const bool untouched = ref->m[x] == c->m0[x] && ref->l[x] == c->l0[x] &&
                           !memcmp(ref->o + x * c->D, c->o0 + x * c->D, sizeof(float) * c->D);
    if (untouched && c->m0[x] == -INFINITY) { /* nothing seen: bit for bit */
      cr_assert(got->m[x] == -INFINITY && got->l[x] == 0.0f, "case %d vector %zu: an empty state changed", index, x);
      cr_assert(!memcmp(got->o + x * c->D, c->o0 + x * c->D, sizeof(float) * c->D), "case %d: o of an empty state",
                index);
      continue;
    }
    cr_assert(fabsf(got->m[x] - ref->m[x]) <= 1e-5f * fmaxf(1.0f, fabsf(ref->m[x])),
              "case %d vector %zu: m %.9g, portable %.9g", index, x, got->m[x], ref->m[x]);
    /* l is relative to e^m; with m equal up to rounding, l agrees to the same relative precision */
    const double lr = ref->l[x] * exp((double)ref->m[x] - (double)got->m[x]);
    const double tol = 1e-5 + 16 * FLT_EPSILON * score_size[x];
    cr_assert(fabs(got->l[x] - lr) <= tol * lr, "case %d vector %zu: l %.9g, portable %.9g (scores of size %.3g)",
              index, x, got->l[x], lr, score_size[x]);
  }
}

/* Runs `cases` random jobs of the limits' shape through one part of a set and the portable set: each within
 * the bound of the fp32 rounding of a different order, as accurate against fp64 as the portable set, the
 * same bits when run twice. */
static void check_set_on_random_jobs(const uattn_kernels *set, uattn_part part, const char *label,
                                     const case_limits *lim, int cases, uint64_t seed) {
  test_rng rng = {seed};
  double worst = 0, worst_portable = 0, worst_set = 0, worst_tol = 0, sum_set = 0, sum_portable = 0;
  /* A bf16 set's P in bf16 (its default): each weight p rounded, by up to 2^-9 p, moves o / l by up to 2^-9
   * of sum_j p_j |v_j| / l, which the error scale (exact_job) is at least. Its scores carry no bf16
   * rounding here: the queries are bf16 values, unscaled for it (uattn_kernel_caps.unscaled_q), keys bf16. */
  const double p_tol = set->caps.unscaled_q && !lim->probs_fp32 ? 0x1p-9 : 0.0;
  int worst_case = -1;
  for (int i = 0; i < cases; i++) {
    job_case c;
    make_case(&c, &rng, lim);
    job_result ref = run_set(&uattn_kernels_portable, part, &c), got = run_set(set, part, &c);
    const size_t nx = (size_t)c.rows * c.group;
    double *exact = malloc(sizeof(double) * nx * c.D), *size = malloc(sizeof(double) * nx);
    const double scale = exact_job(&c, exact, size);
    check_states(&c, &ref, &got, size, i);
    /* The bound: 1e-5, plus one ulp of the largest score. A score is rounded to fp32 (to a few ulps of its
     * size) before e^(s - m) makes that absolute error a relative one of its weight: with ALiBi over long
     * distances (scores near -300) that alone is 3e-5, in any summation order. */
    double score_max = 0;
    for (size_t x = 0; x < nx; x++) score_max = fmax(score_max, size[x]);
    const double tol = 1e-5 + FLT_EPSILON * score_max + p_tol;
    free(size);
    /* the portable output as the reference, the fp64 one for the scale */
    double *port = exact;
    const double ep = error_against(&c, &ref, exact, scale), ea = error_against(&c, &got, exact, scale);
    for (size_t k = 0; k < (size_t)c.rows * c.group * c.D; k++)
      if (!isnan(port[k])) port[k] = ref.o[k] / ref.l[k / c.D];
    const double e = error_against(&c, &got, port, scale);
    free(exact);
    if (e > worst) worst = e, worst_case = i;
    if (ep > worst_portable) worst_portable = ep;
    if (ea > worst_set) worst_set = ea;
    sum_set += ea, sum_portable += ep;
    if (tol > worst_tol) worst_tol = tol;
    cr_assert(e <= tol,
              "%s: case %d (rows %d, group %d, D %d, keys %d/%d, %s, cap %g, window %d, alibi %d): %.3g (bound "
              "%.3g; against fp64: %.3g, portable %.3g)",
              label, i, c.rows, c.group, c.D, c.num_keys, c.panel_keys, uattn_dtype_name(c.dtype), c.soft_cap, c.window,
              c.has_alibi, e, tol, ea, ep);
    /* the same job again: the same bits (no state, no data-dependent order) */
    job_result again = run_set(set, part, &c);
    cr_assert(same_bits(&again, &got, &c), "%s: case %d: two runs differ", label, i);
    free_result(&again), free_result(&ref), free_result(&got);
    free_case(&c);
  }
  const double mean_set = sum_set / cases, mean_portable = sum_portable / cases;
  fprintf(stderr,
          "%s vs portable: worst error %.3g of the output scale (case %d of %d; the loosest bound %.3g); "
          "against fp64: worst %.3g, portable %.3g; mean %.3g, portable %.3g\n",
          label, worst, worst_case, cases, worst_tol, worst_set, worst_portable, mean_set, mean_portable);
  /* As accurate as the reference: a different order, not a lossier one. On the mean error over the cases:
   * the worst of a few dozen jobs is a noisy figure (over 12 seeds of every bucket's parts, 11 jobs each,
   * as the sanitized build runs them, the set's worst came out at up to 2.5x the portable set's, in 1.6% of
   * the checks; the mean at most at 1.35x, median 0.94x), where a kernel that loses a bit on every job
   * doubles its mean. */
  cr_assert(mean_set <= 1.5 * mean_portable + p_tol + 1e-8, "%s is %.3g from fp64 on average, portable %.3g", label,
            mean_set, mean_portable);
}

Test(kernels, avx2_attend_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  /* $UATTN_TEST_KERNEL_CASES: more (a soak) or fewer */
  const char *env = getenv("UATTN_TEST_KERNEL_CASES");
  const case_limits any = {0};
  check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_SHARED, "avx2", &any, env ? atoi(env) : 3000 / SPARSE,
                           20240611);
}

/* ---- the libxsmm body ----------------------------------------------------------------------------------- */

static void need_xsmm(void) {
  need_avx2();
  if (!uattn_xsmm_runs_here()) cr_skip_test("libxsmm is not built in, or JITs nothing on this CPU");
}

/* The libxsmm GEMM body on every job, whatever its size (the avx2 set and the buckets hand it only large
 * ones; the bucket tests above cover that choice): mostly large jobs, then any shape. */
Test(kernels, xsmm_attend_matches_portable_on_random_jobs, .timeout = 300) {
  need_xsmm();
  const case_limits large = {.large = true}, any = {0};
  check_set_on_random_jobs(&uattn_kernels_xsmm, UATTN_PART_SHARED, "xsmm (large jobs)", &large, 800 / SPARSE, 20240612);
  check_set_on_random_jobs(&uattn_kernels_xsmm, UATTN_PART_SHARED, "xsmm (any job)", &any, 800 / SPARSE, 20240613);
}

/* Where every block of the fused kernel has 4 vectors or more (one FMA chain per accumulator), the libxsmm
 * body computes the same bits: its S is summed in the same DB-dim pieces, each one chain in dim order (as
 * libxsmm's NN kernels run k), and its P V is one chain over keys on top of alpha o. So handing a job to one
 * or the other (uattn_xsmm_wins) never changes a result. Jobs of 8 vectors or more (n = 7 splits 4 + 3). */
Test(kernels, xsmm_attend_is_bitwise_the_fused_kernel_on_large_jobs, .timeout = 300) {
  need_xsmm();
  const case_limits large = {.large = true};
  check_sets_same_bits(&uattn_kernels_avx2_fused, &uattn_kernels_xsmm, UATTN_PART_SHARED, &large, 300 / SPARSE, 4242,
                       "the libxsmm body differs from the fused one");
}

/* UATTN_PERF_MAP=1: every JIT kernel the body dispatches is listed in /tmp/perf-<pid>.map as
 * "START SIZE libxsmm_smm_m<M>_n<N>_k<K>_beta<B>", START inside an executable mapping of the process. */
Test(kernels, xsmm_perf_map_lists_the_jit_kernels, .timeout = 300) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
  remove(path);
  setenv("UATTN_PERF_MAP", "1", 1); /* read at the first dispatch: before need_xsmm's probe */
  need_xsmm();
  test_rng rng = {99};
  job_case c; /* head dim 77: a shape no test before it used in this process, so its kernels are new here */
  make_case(&c, &rng, &(case_limits){.head_dim = 77, .large = true});
  for (int32_t r = 0; r < c.rows; r++) c.visible[r] = c.count; /* every vector sees every key loaded */
  c.window = 0;
  job_result r = run_set(&uattn_kernels_xsmm, UATTN_PART_SHARED, &c);
  free_result(&r);
  free_case(&c);
  FILE *f = fopen(path, "r");
  cr_assert(f, "no %s", path);
  char line[256];
  int entries = 0, qk = 0, pv = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long start, size;
    int m, n, k, beta, used = 0;
    cr_assert(sscanf(line, "%lx %lx libxsmm_smm_m%d_n%d_k%d_beta%d%n", &start, &size, &m, &n, &k, &beta, &used) == 6 &&
                  line[used] == '\n',
              "a malformed line: %s", line);
    cr_assert(size > 0 && m > 0 && n > 0 && k > 0 && (beta == 0 || beta == 1), "%s", line);
    qk += beta == 0 && k == 77 % 32, pv += beta == 1 && m == 77; /* the last 13-dim piece of S; P V */
    /* the kernel lies in an executable mapping */
    FILE *maps = fopen("/proc/self/maps", "r");
    char ml[512];
    bool exec = false;
    while (maps && fgets(ml, sizeof ml, maps)) {
      unsigned long lo, hi;
      char perms[8];
      if (sscanf(ml, "%lx-%lx %7s", &lo, &hi, perms) == 3 && start >= lo && start + size <= hi && perms[2] == 'x')
        exec = true;
    }
    if (maps) fclose(maps);
    cr_assert(exec, "%s: not in an executable mapping", line);
    entries++;
  }
  fclose(f);
  remove(path);
  cr_assert(qk > 0 && pv > 0, "%d entries, %d for S, %d for P V", entries, qk, pv);
}

/* The decode kernel (a few rows straight from the cache) on jobs of every shape it takes: one row half the
 * time, else up to UATTN_DECODE_MAX_VECTORS vectors. */
Test(kernels, avx2_decode_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_UNIQUE, "avx2 decode", &few_rows, 1500 / SPARSE, 20261121);
}

/* A set's decode kernel over a list of blocks (case_limits.list: blocks of 8 to 64 keys, in order or scattered)
 * computes, bit for bit, what it computes on the same keys in one block: the avx2 kernel's P V tiles never
 * straddle two blocks, the avx512 sets' fused walks take a share over blocks smaller than it in pieces.
 * Reading a step's rows from the wrong block fails it. */
static void check_list_is_one_block(const uattn_kernels *set, const case_limits *lim, int n, uint64_t seed,
                                    const char *label) {
  test_rng rng = {seed};
  int lists_of_several = 0;
  for (int i = 0; i < n; i++) {
    job_case c;
    make_case(&c, &rng, lim);
    job_result list = run_set(set, UATTN_PART_UNIQUE, &c);
    lists_of_several += c.list_keys && c.num_keys > c.list_keys && uattn_decode_list_fits(set, c.list_keys);
    c.list_keys = 0;
    job_result one = run_set(set, UATTN_PART_UNIQUE, &c);
    cr_assert(same_bits(&list, &one, &c),
              "%s: case %d (rows %d, group %d, D %d, keys %d, %s, window %d): the list's bits differ", label, i, c.rows,
              c.group, c.D, c.num_keys, uattn_dtype_name(c.dtype), c.window);
    free_result(&list), free_result(&one);
    free_case(&c);
  }
  cr_assert(lists_of_several > n / 8, "%s: only %d lists of several blocks", label, lists_of_several);
}

/* The decode kernel over a list of blocks (uattn_decode_src: a request's blocks wherever the cache holds
 * them): against the portable set, and bit for bit what it computes on the same keys in one block (it walks
 * a list as one stretch of keys, its P V tiles never straddling two blocks). */
Test(kernels, avx2_decode_over_a_list_of_blocks_is_the_one_block_bit_for_bit, .timeout = 300) {
  need_avx2();
  const case_limits lists = {.decode = true, .list = true};
  check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_UNIQUE, "avx2 decode, a list of blocks", &lists,
                           1000 / SPARSE, 20261201);
  check_list_is_one_block(&uattn_kernels_avx2, &lists, 1000 / SPARSE, 20261202, "avx2 decode");
}

/* The decode kernel on fp8 caches of every code: the avx2 kernel widens 32 codes at a time into quarters and
 * folds the formats' rebias into the queries, P, the scores and the outputs (common/decode8.h), which is exact
 * only while they stay in f32's normal range: queries of 2^76 at a dim (too large to fold) take its
 * natural-order path. The bound and the fp64 oracle are check_set_on_random_jobs'. */
Test(kernels, avx2_decode_reads_every_fp8_code, .timeout = 300) {
  need_avx2();
  const case_limits codes = {.decode = true, .every_code = true};
  check_set_on_random_jobs(&uattn_kernels_avx2, UATTN_PART_UNIQUE, "avx2 decode, every fp8 code", &codes, 800 / SPARSE,
                           20261129);
}

/* Codes with every exponent bit set (E4M3's NaN; E5M2's infinities and NaN) among them: each output the
 * portable set makes NaN or infinite, the decode kernel makes the same (a NaN key makes its vectors' rows
 * NaN, a NaN value its dim; an infinite score or value infinite outputs, or NaN ones), the rest within 1e-5
 * of the format's largest value (a sum of values up to 57344 in another order). */
Test(kernels, avx2_decode_keeps_fp8_specials, .timeout = 300) {
  need_avx2();
  const case_limits specials = {.decode = true, .every_code = true, .specials = true};
  test_rng rng = {20261130};
  int nan_outputs = 0, inf_outputs = 0;
  for (int i = 0; i < 600; i++) { /* not thinned in sanitized builds: these 600 make the infinite outputs */
    job_case c;
    make_case(&c, &rng, &specials);
    job_result ref = run_set(&uattn_kernels_portable, UATTN_PART_UNIQUE, &c),
               got = run_set(&uattn_kernels_avx2, UATTN_PART_UNIQUE, &c);
    const size_t nx = (size_t)c.rows * c.group;
    for (size_t k = 0; k < nx * c.D; k++) {
      const float r = ref.o[k] / ref.l[k / c.D], g = got.o[k] / got.l[k / c.D];
      nan_outputs += isnan(r), inf_outputs += isinf(r);
      if (isnan(r) || isinf(r)) {
        cr_assert(isnan(r) ? isnan(g) : g == r, "case %d (%s, D %d), output %zu: %g where the portable set has %g", i,
                  uattn_dtype_name(c.dtype), c.D, k, (double)g, (double)r);
        continue;
      }
      const double largest = c.dtype == UATTN_FP8_E4M3 ? 448 : 57344; /* the values' largest finite code */
      cr_assert(fabs((double)g - r) <= 1e-5 * largest, "case %d (%s, D %d), output %zu: %.9g, portable %.9g", i,
                uattn_dtype_name(c.dtype), c.D, k, (double)g, (double)r);
    }
    free_result(&ref), free_result(&got);
    free_case(&c);
  }
  fprintf(stderr, "avx2 decode on fp8 specials: %d NaN and %d infinite outputs, each as the portable set's\n",
          nan_outputs, inf_outputs);
  cr_assert(nan_outputs > 0 && inf_outputs > 0, "the cases made %d NaN and %d infinite outputs", nan_outputs,
            inf_outputs);
}

/* The decode kernel over several KV heads at once (an all-heads unit on an NHD cache) gives each head what
 * a call for that head alone gives, bit for bit (that call is checked against the portable set above):
 * heads' vectors and states further apart than the job's rows (as an all-heads unit's slots are, when a
 * shared span covers some of its rows), their slopes a group apart, their keys a head dim apart in a row.
 * The vectors between the heads' (another span's rows) are left as they were. */
static void check_decode_heads(const uattn_kernels *set, const char *label, const case_limits *lim, int cases,
                               uint64_t seed) {
  test_rng rng = {seed};
  for (int i = 0; i < cases; i++) {
    job_case c;
    make_case(&c, &rng, lim);
    if (!uattn_decode_fits(set, c.num_keys, c.D, c.group) ||
        (lim->tiled && !uattn_decode_tiled_fits(set, c.num_keys, c.D, c.group, c.dtype, c.probs_fp32))) {
      free_case(&c);
      continue;
    }
    const int32_t heads = test_rng_range(&rng, 2, 8), D = c.D;
    const size_t nx = (size_t)c.rows * c.group, hv = nx + (size_t)test_rng_range(&rng, 0, 2) * c.group;
    const size_t esz = uattn_dtype_size(c.dtype), stride = (size_t)heads * D, n = (size_t)c.count * stride;
    char *k = malloc(n * esz), *v = malloc(n * esz);
    for (size_t x = 0; x < n; x++) {
      store_elem(c.dtype, k, x, uniform(&rng, -1.0f, 1.0f));
      store_elem(c.dtype, v, x, uniform(&rng, -1.0f, 1.0f));
    }
    const size_t vecs = (size_t)heads * hv;
    float *q = malloc(sizeof(float) * vecs * D), *alibi = malloc(sizeof(float) * heads * c.group);
    float *state[2][3]; /* [every head in one call, each head alone][m, l, o] */
    for (int w = 0; w < 2; w++)
      for (int a = 0; a < 3; a++) state[w][a] = malloc(sizeof(float) * vecs * (a == 2 ? D : 1));
    for (size_t x = 0; x < vecs * D; x++) q[x] = uniform(&rng, -1.0f, 1.0f) / sqrtf((float)D);
    for (int32_t h = 0; h < heads * c.group; h++) alibi[h] = uniform(&rng, 0.0f, 0.5f);
    const bool fresh = test_rng_range(&rng, 0, 1);
    for (size_t x = 0; x < vecs; x++) {
      state[0][0][x] = fresh ? -INFINITY : uniform(&rng, -3.0f, 3.0f);
      state[0][1][x] = fresh ? 0.0f : uniform(&rng, 0.5f, 4.0f);
      for (int32_t d = 0; d < D; d++) state[0][2][x * D + d] = fresh ? 0.0f : uniform(&rng, -1.0f, 1.0f);
    }
    for (int a = 0; a < 3; a++) memcpy(state[1][a], state[0][a], sizeof(float) * vecs * (a == 2 ? D : 1));
    float *before = malloc(sizeof(float) * vecs * D);
    memcpy(before, state[0][2], sizeof(float) * vecs * D);
    const size_t bytes = sizeof(float) * uattn_decode_scratch_floats(heads, (int32_t)nx, D);
    float *scratch = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    uattn_panel_job job = {
        .rows = c.rows,
        .group = c.group,
        .head_dim = D,
        .query_pos = c.query_pos,
        .visible = c.visible,
        .num_keys = c.num_keys,
        .key_pos0 = c.key_pos0,
        .soft_cap = c.soft_cap,
        .window = c.window,
        .scale = c.scale,
        .probs_fp32 = c.probs_fp32,
    };
    char *tk = NULL, *tv = NULL; /* lim->tiled: the keys in a TILED block, its tiles every head in turn */
    if (lim->tiled) tiled_copy(c.dtype, k, v, c.count, heads, D, &tk, &tv);
    for (int32_t g = -1; g < heads; g++) { /* -1: every head in one call; then each head alone */
      const int w = g < 0 ? 0 : 1;
      const size_t h = g < 0 ? 0 : (size_t)g;
      job.q = q + h * hv * D, job.o = state[w][2] + h * hv * D;
      job.m = state[w][0] + h * hv, job.l = state[w][1] + h * hv;
      job.alibi = c.has_alibi ? alibi + h * c.group : NULL;
      if (lim->tiled)
        set->decode_tiled(&job, g < 0 ? heads : 1, hv, c.dtype, tk + h * 16 * D * esz, tv + h * 16 * D * esz,
                          stride * 16, (size_t)16 * D, scratch);
      else {
        const void *kh = k + h * D * esz, *vh = v + h * D * esz;
        const uattn_decode_src src = uattn_decode_one_block(&kh, &vh, stride, (size_t)D);
        set->decode(&job, g < 0 ? heads : 1, hv, c.dtype, &src, scratch);
      }
    }
    free(tk), free(tv);
    for (int32_t g = 0; g < heads; g++) {
      const size_t x0 = (size_t)g * hv;
      cr_assert(!memcmp(state[0][0] + x0, state[1][0] + x0, sizeof(float) * nx) &&
                    !memcmp(state[0][1] + x0, state[1][1] + x0, sizeof(float) * nx) &&
                    !memcmp(state[0][2] + x0 * D, state[1][2] + x0 * D, sizeof(float) * nx * D),
                "%s: case %d (heads %d, rows %d, group %d, D %d, keys %d): head %d differs from its own call", label, i,
                heads, c.rows, c.group, D, c.num_keys, g);
      cr_assert(!memcmp(state[0][2] + (x0 + nx) * D, before + (x0 + nx) * D, sizeof(float) * (hv - nx) * D),
                "%s: case %d: head %d's call wrote past its rows", label, i, g);
    }
    free(scratch), free(before), free(q), free(alibi), free(k), free(v);
    for (int w = 0; w < 2; w++)
      for (int a = 0; a < 3; a++) free(state[w][a]);
    free_case(&c);
  }
}

Test(kernels, avx2_decode_over_several_heads_is_each_head_alone, .timeout = 300) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_decode_heads(&uattn_kernels_avx2, "avx2 decode", &few_rows, 400 / SPARSE, 20261122);
}

/* The avx512 set's decode kernel, through its twin (common/vec16.h: the same arithmetic on pairs of ymm
 * registers), which runs wherever AVX2 does: against the portable set, and over several heads. */
Test(kernels, avx512_twin_decode_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_UNIQUE, "avx512 decode (twin)", &few_rows,
                           1500 / SPARSE, 20261123);
}

/* Over a list of blocks, which the phases walk (bf16 rows) and the fused walk (16-key shares, in pieces over
 * 8-key blocks) take as it is: against the portable set, and bit for bit the same keys in one block. */
Test(kernels, avx512_twin_decode_over_a_list_of_blocks_matches_portable, .timeout = 300) {
  need_avx2();
  const case_limits lists = {.decode = true, .list = true};
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_UNIQUE, "avx512 decode (twin), a list of blocks",
                           &lists, 1000 / SPARSE, 20261203);
  check_list_is_one_block(&uattn_kernels_avx512_twin, &lists, 800 / SPARSE, 20261205, "avx512 decode (twin)");
}

Test(kernels, avx512_twin_decode_over_several_heads_is_each_head_alone, .timeout = 300) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_decode_heads(&uattn_kernels_avx512_twin, "avx512 decode (twin)", &few_rows, 400 / SPARSE, 20261124);
}

/* The avx512 set's attend (avx512/body.h) through its twin: against the portable set on jobs of any shape, and
 * on large ones (many rows, several key chunks). */
Test(kernels, avx512_twin_attend_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  const case_limits any = {0}, large = {.large = true};
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_SHARED, "avx512 attend (twin)", &any, 1500 / SPARSE,
                           20261206);
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_CAUSAL, "avx512 attend (twin), large jobs", &large,
                           200 / SPARSE, 20261207);
}

/* Where AVX-512 runs: the zmm kernels compute their twin's bits, decode and attend (what the tests above
 * checked). */
Test(kernels, avx512_decode_is_its_twin_bit_for_bit, .timeout = 300) {
  if (!uattn_avx512_runs_here()) cr_skip_test("this CPU lacks AVX-512F (the twin is tested above)");
  const case_limits few_rows = {.decode = true};
  check_sets_same_bits(&uattn_kernels_avx512_twin, &uattn_kernels_avx512, UATTN_PART_UNIQUE, &few_rows, 1000 / SPARSE,
                       20261125, "the zmm kernel differs from its twin");
}

Test(kernels, avx512_attend_is_its_twin_bit_for_bit, .timeout = 300) {
  if (!uattn_avx512_runs_here()) cr_skip_test("this CPU lacks AVX-512F (the twin is tested above)");
  const case_limits any = {0}, large = {.large = true};
  check_sets_same_bits(&uattn_kernels_avx512_twin, &uattn_kernels_avx512, UATTN_PART_SHARED, &any, 1000 / SPARSE,
                       20261208, "the zmm attend differs from its twin");
  check_sets_same_bits(&uattn_kernels_avx512_twin, &uattn_kernels_avx512, UATTN_PART_CAUSAL, &large, 150 / SPARSE,
                       20261209, "the zmm attend differs from its twin on large jobs");
}

/* ---- the avx512bf16 set -------------------------------------------------------------------------------- */

/* Its arithmetic through its twin (avx512bf16/vec.h: vdpbf16ps emulated exactly), which runs wherever AVX2
 * does: attend and decode against the portable set, P in bf16 (the default) and in fp32, on what the set is
 * dispatched for: bf16 queries on bf16 keys and values, and on fp8 ones (half as many cases). */
static void check_bf16_set(const uattn_kernels *set, const char *label, bool decode, uint64_t seed, int sparse) {
  for (int fp8 = 0; fp8 < 2; fp8++)
    for (int fp32 = 0; fp32 < 2; fp32++) {
      const case_limits lim = {.decode = decode, .bf16 = true, .fp8 = fp8, .probs_fp32 = fp32};
      char name[96];
      snprintf(name, sizeof name, "%s%s, %s cache, P in %s", label, decode ? " decode" : "", fp8 ? "fp8" : "bf16",
               fp32 ? "fp32" : "bf16");
      check_set_on_random_jobs(set, decode ? UATTN_PART_UNIQUE : UATTN_PART_SHARED, name, &lim,
                               (decode ? 1500 : 2000) / (fp8 ? 2 : 1) / sparse, seed + (uint64_t)fp32 + 10u * fp8);
    }
  if (decode) return;
  /* head dims past the 512 whose query pairs the attend rounds at once (it takes them a slice at a time),
   * an odd one with its last dim alone in the last slice */
  const int32_t wide[] = {1030, 1031};
  for (int k = 0; k < 2; k++) {
    const case_limits lim = {.head_dim = wide[k], .bf16 = true};
    check_set_on_random_jobs(set, UATTN_PART_SHARED, "avx512bf16, head dims past 512", &lim, 40 / sparse + 4,
                             seed + 2 + (uint64_t)k);
  }
}

Test(kernels, avx512bf16_twin_attend_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  check_bf16_set(&uattn_kernels_avx512bf16_twin, "avx512bf16 (twin)", false, 20261130, SPARSE);
}

Test(kernels, avx512bf16_twin_decode_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  check_bf16_set(&uattn_kernels_avx512bf16_twin, "avx512bf16 (twin)", true, 20261132, SPARSE);
}

/* Over a list of blocks, taken as it is: bf16 and fp8 rows, P in bf16 (the fused walks: shares of 16 keys of
 * bf16 and 32 of fp8, in pieces over smaller blocks) and in fp32 (the phases walk): against the portable set,
 * and bit for bit the same keys in one block. */
Test(kernels, avx512bf16_twin_decode_over_a_list_of_blocks_matches_portable, .timeout = 300) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++)
    for (int fp32 = 0; fp32 < 2; fp32++) {
      const case_limits lim = {.decode = true, .bf16 = true, .fp8 = fp8, .probs_fp32 = fp32, .list = true};
      const uint64_t seed = 20261204 + (uint64_t)fp32 + 10u * fp8;
      check_set_on_random_jobs(&uattn_kernels_avx512bf16_twin, UATTN_PART_UNIQUE,
                               "avx512bf16 decode (twin), a list of blocks", &lim, 500 / SPARSE, seed);
      check_list_is_one_block(&uattn_kernels_avx512bf16_twin, &lim, 400 / SPARSE, seed + 100,
                              "avx512bf16 decode (twin)");
    }
}

Test(kernels, avx512bf16_twin_decode_over_several_heads_is_each_head_alone, .timeout = 300) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_decode_heads(&uattn_kernels_avx512bf16_twin, "avx512bf16 decode (twin)", &few_rows, 400 / SPARSE, 20261134);
}

/* Its decode kernel on a TILED cache (decode_tiled.h), through the twin: against the portable set on bf16 and
 * fp8 blocks with NaN in the slots past the keys (tiled_copy), and over several heads. */
Test(kernels, avx512bf16_twin_tiled_decode_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.decode = true, .bf16 = true, .fp8 = fp8, .tiled = true};
    check_set_on_random_jobs(&uattn_kernels_avx512bf16_twin, UATTN_PART_UNIQUE,
                             fp8 ? "avx512bf16 (twin) tiled decode, fp8 cache" : "avx512bf16 (twin) tiled decode", &lim,
                             1200 / (fp8 ? 2 : 1) / SPARSE, 20261126 + (uint64_t)fp8);
  }
}

Test(kernels, avx512bf16_twin_tiled_decode_over_several_heads_is_each_head_alone, .timeout = 300) {
  need_avx2();
  const case_limits lim = {.decode = true, .bf16 = true, .fp8 = true, .tiled = true};
  check_decode_heads(&uattn_kernels_avx512bf16_twin, "avx512bf16 tiled decode (twin)", &lim, 400 / SPARSE, 20261128);
}

/* vdpbf16ps as Intel's pseudocode has it, in scalar C: acc + a1 b1, then + a0 b0, each an FMA rounded to
 * nearest even (the products of bf16 are exact), inputs denormal read as zero, denormal results flushed. */
static float daz(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if (!(u & 0x7f800000u)) u &= 0x80000000u;
  memcpy(&x, &u, 4);
  return x;
}
static float dpbf16_reference(float acc, uint32_t a, uint32_t b) {
  const float a0 = daz(uattn_bf16_to_f32((uint16_t)a)), a1 = daz(uattn_bf16_to_f32((uint16_t)(a >> 16)));
  const float b0 = daz(uattn_bf16_to_f32((uint16_t)b)), b1 = daz(uattn_bf16_to_f32((uint16_t)(b >> 16)));
  acc = daz(fmaf(a1, b1, daz(acc)));
  return daz(fmaf(a0, b0, acc));
}

/* 16 lanes of the twin's emulation (avx512bf16/vec.h, included in its twin form above). */
#if defined(__x86_64__)
AVX2_TARGET static void dpbf16_twin(const float *acc, const uint32_t *a, const uint32_t *b, float *out) {
  v16_store(out, v16_dpbf16(v16_load(acc), v16i_load(a), v16i_load(b)));
}

__attribute__((target("avx512f,avx512bf16"))) static void dpbf16_hardware(const float *acc, const uint32_t *a,
                                                                          const uint32_t *b, float *out) {
  _mm512_storeu_ps(
      out, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b)));
}
#endif

/* A random bf16: mostly of attention's sizes, now and then tiny or denormal (the flushes), never inf or NaN. */
static uint16_t random_bf16(test_rng *rng, int kind) {
  const int32_t e = kind == 0   ? test_rng_range(rng, 115, 135)
                    : kind == 1 ? test_rng_range(rng, 0, 2)
                                : test_rng_range(rng, 0, 254);
  const uint32_t sign = (uint32_t)test_rng_range(rng, 0, 1), mantissa = (uint32_t)test_rng_range(rng, 0, 127);
  return (uint16_t)(sign << 15 | (uint32_t)e << 7 | mantissa);
}

/* 16 random lanes: accumulators near minus the products, so sums cancel and round; tiny ones, so results
 * flush; operands of every size, denormals included. */
static void random_dpbf16_lanes(test_rng *rng, int it, float *acc, uint32_t *a, uint32_t *b) {
  const int kind = it % 7 == 0 ? 1 : it % 11 == 0 ? 2 : 0;
  for (int i = 0; i < 16; i++) {
    a[i] = random_bf16(rng, kind) | (uint32_t)random_bf16(rng, kind) << 16;
    b[i] = random_bf16(rng, kind) | (uint32_t)random_bf16(rng, kind) << 16;
    const float p = uattn_bf16_to_f32((uint16_t)(a[i] >> 16)) * uattn_bf16_to_f32((uint16_t)(b[i] >> 16));
    const int32_t pick = test_rng_range(rng, 0, 2);
    acc[i] = pick == 0   ? -p * (1.0f + (float)test_rng_range(rng, -2, 2) * 1e-3f)
             : pick == 1 ? uniform(rng, -1.0f, 1.0f) * (kind == 1 ? 1e-37f : 1.0f)
                         : uniform(rng, -1e-38f, 1e-38f);
  }
}

/* The twin's vector emulation is the scalar pseudocode, lane for lane, wherever AVX2 runs. */
Test(kernels, vdpbf16ps_twin_is_the_pseudocode, .timeout = 300) {
  need_avx2();
#if defined(__x86_64__)
  test_rng rng = {20261137};
  for (int it = 0; it < 200000 / SPARSE; it++) {
    float acc[16], out[16];
    uint32_t a[16], b[16];
    random_dpbf16_lanes(&rng, it, acc, a, b);
    dpbf16_twin(acc, a, b, out);
    for (int i = 0; i < 16; i++) {
      const float e = dpbf16_reference(acc[i], a[i], b[i]);
      cr_assert(!memcmp(&e, &out[i], 4), "acc %a, pairs %08x %08x: twin %a, pseudocode %a", acc[i], a[i], b[i], out[i],
                e);
    }
  }
#endif
}

/* Where AVX512-BF16 runs: the instruction is that pseudocode too, lane for lane (so the twin can be held to
 * the real kernels, as the next test does). */
Test(kernels, vdpbf16ps_is_its_emulation_bit_for_bit, .timeout = 300) {
  if (!uattn_avx512bf16_runs_here()) cr_skip_test("this CPU lacks AVX512-BF16 (the emulation is what the twin runs)");
#if defined(__x86_64__)
  test_rng rng = {20261135};
  for (int it = 0; it < 200000 / SPARSE; it++) {
    float acc[16], out[16];
    uint32_t a[16], b[16];
    random_dpbf16_lanes(&rng, it, acc, a, b);
    dpbf16_hardware(acc, a, b, out);
    for (int i = 0; i < 16; i++) {
      const float e = dpbf16_reference(acc[i], a[i], b[i]);
      cr_assert(!memcmp(&e, &out[i], 4), "acc %a, pairs %08x %08x: vdpbf16ps %a, emulation %a", acc[i], a[i], b[i],
                out[i], e);
    }
  }
#endif
}

/* vcvtneps2bf16 as Intel's pseudocode has it: a denormal input a zero of its sign, a NaN quieted, the rest
 * rounded to nearest even (overflow to infinity). */
static uint16_t cvtneps2bf16_reference(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if (!(u & 0x7f800000u)) return (uint16_t)(u >> 16 & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40u);
  return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

#if defined(__x86_64__)
AVX2_TARGET static void cvtneps2bf16_twin(const float *x, uint16_t *out) {
  _mm256_storeu_si256((__m256i *)out, v16_pairs_bf16(v16_load(x)));
}
__attribute__((target("avx512f,avx512bf16"))) static void cvtneps2bf16_hardware(const float *x, uint16_t *out) {
  _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x)));
}
#endif

/* 16 random floats' bits: every class (normal, denormal, zero, infinity, NaN), halfway cases and the largest
 * finite values that round to infinity. */
static void random_f32_lanes(test_rng *rng, float *x) {
  for (int i = 0; i < 16; i++) {
    const uint32_t sign = (uint32_t)test_rng_range(rng, 0, 1) << 31, low = (uint32_t)test_rng_range(rng, 0, 0xffff);
    const uint32_t mid = (uint32_t)test_rng_range(rng, 0, 0x7f) << 16;
    const int32_t kind = test_rng_range(rng, 0, 5);
    const uint32_t e = kind == 0 ? 0u : kind == 1 ? 0xffu : kind == 2 ? 0xfeu : (uint32_t)test_rng_range(rng, 1, 254);
    const uint32_t frac = kind == 3 ? mid | 0x8000u : mid | low; /* kind 3: halfway between two bf16 */
    const uint32_t u = sign | e << 23 | frac;
    memcpy(&x[i], &u, 4);
  }
}

/* The twin's v16_pairs_bf16 is vcvtneps2bf16's pseudocode, wherever AVX2 runs; and where AVX512-BF16 runs, the
 * instruction is too (the zmm kernels round the query and P with it). */
Test(kernels, vcvtneps2bf16_twin_and_instruction_are_the_pseudocode) {
  need_avx2();
#if defined(__x86_64__)
  const bool hardware = uattn_avx512bf16_runs_here();
  test_rng rng = {20261125};
  for (int it = 0; it < 100000 / SPARSE; it++) {
    _Alignas(64) float x[16];
    uint16_t twin[16], hw[16];
    random_f32_lanes(&rng, x);
    cvtneps2bf16_twin(x, twin);
    if (hardware) cvtneps2bf16_hardware(x, hw);
    for (int i = 0; i < 16; i++) {
      uint32_t u;
      memcpy(&u, &x[i], 4);
      const uint16_t e = cvtneps2bf16_reference(x[i]);
      cr_assert_eq(twin[i], e, "%08x: twin %04x, pseudocode %04x", u, twin[i], e);
      if (hardware) cr_assert_eq(hw[i], e, "%08x: vcvtneps2bf16 %04x, pseudocode %04x", u, hw[i], e);
    }
  }
#endif
}

/* Where AVX512-BF16 runs: the set computes its twin's bits, attend and decode, both P modes, every dtype. */
Test(kernels, avx512bf16_is_its_twin_bit_for_bit, .timeout = 300) {
  if (!uattn_avx512bf16_runs_here()) cr_skip_test("this CPU lacks AVX512-BF16 (the twin is tested above)");
  for (int fp32 = 0; fp32 < 2; fp32++) {
    const case_limits any = {.probs_fp32 = fp32}, few_rows = {.decode = true, .probs_fp32 = fp32};
    check_sets_same_bits(&uattn_kernels_avx512bf16_twin, &uattn_kernels_avx512bf16, UATTN_PART_SHARED, &any,
                         1000 / SPARSE, 20261136 + (uint64_t)fp32, "the vdpbf16ps attend differs from its twin");
    check_sets_same_bits(&uattn_kernels_avx512bf16_twin, &uattn_kernels_avx512bf16, UATTN_PART_UNIQUE, &few_rows,
                         1000 / SPARSE, 20261138 + (uint64_t)fp32, "the vdpbf16ps decode differs from its twin");
  }
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits tiled = {.decode = true, .bf16 = true, .fp8 = fp8, .tiled = true};
    check_sets_same_bits(&uattn_kernels_avx512bf16_twin, &uattn_kernels_avx512bf16, UATTN_PART_UNIQUE, &tiled,
                         600 / SPARSE, 20261140 + (uint64_t)fp8, "the vdpbf16ps tiled decode differs from its twin");
  }
}

/* The libxsmm body pins libxsmm to AVX2 code, whatever the CPU offers: on an AVX-512 CPU libxsmm would JIT
 * AVX-512 kernels by itself, and the test above would find other bits. LIBXSMM_TARGET asks for more; the pin
 * still wins (libxsmm reads the variable at its first use, in this process: each test is a fresh child). */
Test(kernels, xsmm_body_generates_avx2_code_on_every_cpu, .timeout = 300) {
  setenv("LIBXSMM_TARGET", "cpx", 1);
  need_xsmm();
  cr_assert_str_eq(uattn_xsmm_target(), "hsw", "libxsmm generates %s code for the body, not AVX2 (hsw)",
                   uattn_xsmm_target());
}

/* ---- the generated buckets ----------------------------------------------------------------------------- */

/* One (bucket, part) of the registry a test. */
typedef struct bucket_param {
  int32_t index;
  uattn_part part;
} bucket_param;

enum { MAX_BUCKET_PARAMS = 3 * 1024 };
static bucket_param bucket_params[MAX_BUCKET_PARAMS];

ParameterizedTestParameters(buckets, match_portable_on_random_jobs) {
  size_t n = 0;
  for (size_t i = 0; i < uattn_bucket_registry_size && n + UATTN_NUM_PARTS <= MAX_BUCKET_PARAMS; i++)
    for (int p = 0; p < UATTN_NUM_PARTS; p++) bucket_params[n++] = (bucket_param){(int32_t)i, (uattn_part)p};
  return cr_make_param_array(bucket_param, bucket_params, n);
}

/* Every part of every generated bucket against the portable set, on random jobs of the bucket's head dim,
 * mostly whole blocks of its block size and dtype (the unique part: the decode kernel's jobs of a few rows),
 * NHD and HND sources; an fp8 bucket's blocks are raw codes of its format, as the cache holds them (the forward
 * applies the scales). */
ParameterizedTest(bucket_param *param, buckets, match_portable_on_random_jobs, .timeout = 300) {
  const uattn_bucket_kernels *b = uattn_bucket_registry[param->index];
  if (!b->runs_here()) cr_skip_test("this CPU lacks %s", b->isa);
  const bool decode = param->part == UATTN_PART_UNIQUE;
  const case_limits lim = {.head_dim = b->head_dim,
                           .block_size = b->block_size,
                           .dtype = b->dtype,
                           .decode = decode,
                           .bf16 = b->set.caps.unscaled_q,
                           .fp8 = uattn_dtype_is_fp8(b->dtype)};
  const int cases = (decode ? 6 : 1) * (60 / SPARSE + 4); /* the decode kernel's jobs are small and cheap */
  /* seeds from the bucket's shape, not its place in the registry: the same jobs for every ISA's bucket of a
   * shape, and for every build that lists it */
  const uint64_t shape =
      (((uint64_t)b->dtype * 4099u + (uint64_t)b->block_size) * 4099u + (uint64_t)b->head_dim) * 4099u +
      (uint64_t)b->chunk_size;
  check_set_on_random_jobs(&b->set, param->part, b->part_names[param->part], &lim, cases,
                           1000u + 7u * shape + (uint64_t)param->part);
  if (decode && b->set.decode)
    check_decode_heads(&b->set, b->part_names[param->part], &lim, 40 / SPARSE + 4, 5000u + shape);
}

static int32_t bucket_indices[MAX_BUCKET_PARAMS];

ParameterizedTestParameters(buckets, dispatch_to_themselves) {
  size_t n = 0;
  for (; n < uattn_bucket_registry_size && n < MAX_BUCKET_PARAMS; n++) bucket_indices[n] = (int32_t)n;
  return cr_make_param_array(int32_t, bucket_indices, n);
}

static bool same_shape(const uattn_bucket_kernels *a, const uattn_bucket_kernels *b) {
  return a->dtype == b->dtype && a->block_size == b->block_size && a->head_dim == b->head_dim &&
         a->chunk_size == b->chunk_size;
}

/* Every generated bucket is what the dispatch gives for its shape on a CPU that runs its ISA, for queries of
 * some dtype (the bf16 level takes bf16 queries only and leaves the others to the level below), unless a
 * better ISA's bucket of the same shape runs here too (the registry is best ISA first): then that one serves,
 * and the test says so. Queries of every dtype get a bucket of the shape this CPU runs, never a generic set. */
ParameterizedTest(int32_t *index, buckets, dispatch_to_themselves) {
  unsetenv("UATTN_ISA");
  const uattn_bucket_kernels *b = uattn_bucket_registry[*index];
  if (!b->runs_here()) cr_skip_test("this CPU lacks %s", b->isa);
  char label[96];
  snprintf(label, sizeof label, "%s b%d d%d c%d (%s)", uattn_dtype_name(b->dtype), b->block_size, b->head_dim,
           b->chunk_size, b->isa);
  const uattn_bucket_kernels *better = NULL; /* the best bucket of the shape this CPU runs, where not b */
  for (int32_t i = 0; i < *index && !better; i++)
    if (same_shape(uattn_bucket_registry[i], b) && uattn_bucket_registry[i]->runs_here())
      better = uattn_bucket_registry[i];
  bool itself = false;
  for (int q = UATTN_F32; q <= UATTN_F16; q++) {
    const uattn_bucket_kernels *got;
    char why[256];
    const uattn_kernels *set = uattn_kernels_dispatch(b->block_size, b->head_dim, b->dtype, (uattn_dtype)q,
                                                      b->chunk_size, &got, why, sizeof why);
    cr_assert(got, "%s, %s queries: %s", label, uattn_dtype_name((uattn_dtype)q), why);
    cr_assert_eq(set, &got->set, "%s: the set returned is not the bucket's", label);
    cr_assert(same_shape(got, b) && got->runs_here(), "%s: served by %s's bucket of another shape", label, got->isa);
    itself |= got == b;
  }
  cr_assert(itself || better, "%s: no query dtype dispatches to it", label);
  if (!itself) cr_log_info("%s: served by its %s bucket, a better ISA this CPU runs", label, better->isa);
}

/* ---- vector math ------------------------------------------------------------------------------------- */

/* Distance in ulps between two non-negative floats (their bit patterns are ordered like their values). */
static int64_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

Test(kernels, avx2_exp_is_within_2_ulps_of_expf, .timeout = 300) {
  need_avx2();
  /* every 7th float of [-104, 0] (subnormal results included), and a few special points */
  enum { N = 1 << 16 };
  static float x[N], y[N];
  int64_t worst = 0, worst_exact = 0;
  float worst_x = 0;
  const uint32_t first = 0x80000000u, last = 0xC2D00000u; /* -0 .. -104 */
  uint32_t u = first;
  while (u <= last) {
    size_t n = 0;
    for (; n < N && u <= last; n++, u += 7 * SPARSE) memcpy(&x[n], &u, 4);
    uattn_avx2_exp(x, y, n);
    for (size_t i = 0; i < n; i++) {
      const int64_t e = ulps(y[i], expf(x[i]));
      const int64_t ex = ulps(y[i], (float)exp((double)x[i]));
      if (e > worst) worst = e, worst_x = x[i];
      if (ex > worst_exact) worst_exact = ex;
    }
  }
  cr_log_info("exp: worst %lld ulps from expf (at %.9g), %lld from the rounded exact value", (long long)worst, worst_x,
              (long long)worst_exact);
  fprintf(stderr, "exp: worst %lld ulps from expf (at %.9g), %lld from the rounded exact value\n", (long long)worst,
          worst_x, (long long)worst_exact);
  cr_assert(worst <= 2, "exp is %lld ulps from expf at %.9g", (long long)worst, worst_x);
  const float special[] = {-INFINITY, -1000.0f, -110.0f, 0.0f, -0.0f, 1.0f, 10.0f, 88.0f};
  float out[8];
  uattn_avx2_exp(special, out, 8);
  cr_assert(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f, "exp of masked scores must be 0");
  cr_assert(out[3] == 1.0f && out[4] == 1.0f, "exp(0) must be exactly 1");
  for (int i = 5; i < 8; i++) cr_assert(ulps(out[i], expf(special[i])) <= 2, "exp(%g)", special[i]);
}

/* ---- loads ----------------------------------------------------------------------------------------------- */

/* Random bits in every element (NaNs, infinities, subnormals included), random shapes and strides: the avx2
 * panels hold exactly what the portable widening gives, where its layout puts it, and zeros in the padding
 * it promises. F16C quiets signaling NaNs, so a 16-bit NaN need only stay a NaN of the same sign. */
Test(kernels, avx2_load_is_bit_exact, .timeout = 300) {
  need_avx2();
  test_rng rng = {77};
  for (int it = 0; it < 600 / SPARSE; it++) {
    const uattn_dtype t = it % 3 == 0 ? UATTN_F32 : it % 3 == 1 ? UATTN_BF16 : UATTN_F16;
    const int32_t D = head_dims[test_rng_range(&rng, 0, (int32_t)(sizeof head_dims / sizeof *head_dims) - 1)];
    const int32_t count = test_rng_range(&rng, 0, 300), panel = count + test_rng_range(&rng, 0, 40);
    const size_t stride = (size_t)D * test_rng_range(&rng, 1, 3) + (size_t)test_rng_range(&rng, 0, 5);
    const size_t esz = uattn_dtype_size(t), n = (size_t)(count ? count - 1 : 0) * stride + D;
    uint8_t *k = malloc(n * esz), *v = malloc(n * esz);
    for (size_t i = 0; i < n * esz; i++) k[i] = (uint8_t)test_rng_next(&rng), v[i] = (uint8_t)test_rng_next(&rng);
    const size_t floats = uattn_kernels_avx2.panel_floats(panel, D);
    float *keys = malloc(sizeof(float) * floats), *values = malloc(sizeof(float) * floats);
    for (size_t i = 0; i < floats; i++) keys[i] = values[i] = NAN;
    uattn_kernels_avx2.load(t, k, v, stride, count, D, panel, keys, values);
    int32_t ks, vs;
    uattn_avx2_layout(panel, D, &ks, &vs);
    cr_assert(ks >= panel && vs >= D, "strides below the panel size");
    const float *kp = aligned64(keys), *vp = aligned64(values);
    cr_assert((size_t)(kp - keys) + (size_t)D * ks <= floats && (size_t)(vp - values) + (size_t)panel * vs <= floats,
              "the layout does not fit panel_floats");
    float *want = malloc(sizeof(float) * 2 * D);
    for (int32_t i = 0; i < count; i++) {
      uattn_widen(t, k + (size_t)i * stride * esz, want, (size_t)D);
      uattn_widen(t, v + (size_t)i * stride * esz, want + D, (size_t)D);
      for (int32_t d = 0; d < D; d++) {
        const float a[2] = {kp[(size_t)d * ks + i], vp[(size_t)i * vs + d]}, b[2] = {want[d], want[D + d]};
        for (int w = 0; w < 2; w++) {
          if (t != UATTN_F32 && isnan(b[w])) {
            cr_assert(isnan(a[w]) && signbit(a[w]) == signbit(b[w]), "load %d: a NaN changed", it);
          } else {
            cr_assert(!memcmp(&a[w], &b[w], 4), "load %d (%s, D %d, %d keys): %s %d, dim %d: %a, want %a", it,
                      t == UATTN_F32    ? "f32"
                      : t == UATTN_BF16 ? "bf16"
                                        : "f16",
                      D, count, w ? "value" : "key", i, d, a[w], b[w]);
          }
        }
      }
      for (int32_t d = D; d < ((D + 7) & ~7); d++) cr_assert(vp[(size_t)i * vs + d] == 0.0f, "value padding");
    }
    for (int32_t d = 0; d < D; d++)
      for (int32_t i = count; i < ((count + 7) & ~7); i++) cr_assert(kp[(size_t)d * ks + i] == 0.0f, "key padding");
    free(want), free(keys), free(values), free(k), free(v);
  }
}

/* Every f16 and bf16 value through the 8 x 8 transposes and the row widening. */
Test(kernels, avx2_load_widens_every_16_bit_value, .timeout = 300) {
  need_avx2();
  enum { D = 256, KEYS = 256 }; /* 65536 elements */
  uint16_t *src = malloc(sizeof(uint16_t) * D * KEYS);
  for (uint32_t i = 0; i < D * KEYS; i++) src[i] = (uint16_t)i;
  const size_t floats = uattn_kernels_avx2.panel_floats(KEYS, D);
  float *keys = malloc(sizeof(float) * floats), *values = malloc(sizeof(float) * floats);
  int32_t ks, vs;
  uattn_avx2_layout(KEYS, D, &ks, &vs);
  const float *kp = aligned64(keys), *vp = aligned64(values);
  for (int t = UATTN_BF16; t <= UATTN_F16; t++) {
    uattn_kernels_avx2.load((uattn_dtype)t, src, src, D, KEYS, D, KEYS, keys, values);
    for (int32_t i = 0; i < KEYS; i++)
      for (int32_t d = 0; d < D; d++) {
        float want;
        uattn_widen((uattn_dtype)t, src + (size_t)i * D + d, &want, 1);
        const float a = kp[(size_t)d * ks + i], b = vp[(size_t)i * vs + d];
        if (isnan(want)) {
          cr_assert(isnan(a) && isnan(b) && signbit(a) == signbit(want) && signbit(b) == signbit(want),
                    "a NaN changed");
        } else {
          cr_assert(!memcmp(&a, &want, 4) && !memcmp(&b, &want, 4), "dtype %d, 0x%04x: %a %a, want %a", t,
                    src[(size_t)i * D + d], a, b, want);
        }
      }
  }
  free(src), free(keys), free(values);
}

/* A set's load_tiled on random keys [first, first + count) of a random TILED block (tiled_copy: written out
 * from the layout's definition, NaN codes past the block's keys) against its load of the same keys as rows:
 * the same panels bit for bit, pads included, and nothing written past panel_floats. Any first, odd ones
 * (which pair the values anew) included; the keys before and after the range hold values that must not
 * reach the panels. Codes are random but for NaN, whose bits the vector and scalar widenings need not
 * share. */
static const uattn_dtype tiled_load_dtypes[] = {UATTN_BF16, UATTN_FP8_E4M3, UATTN_FP8_E5M2};

/* iters loads of set, its dtype cycling through dtypes[0, ndtypes); fixed_D, fixed_bs: a bucket's (0: random) */
static void check_load_tiled(const uattn_kernels *set, const char *what, const uattn_dtype *dtypes, int ndtypes,
                             int32_t fixed_D, int32_t fixed_bs, int iters, uint64_t seed) {
  test_rng rng = {seed};
  for (int it = 0; it < iters; it++) {
    const uattn_dtype t = dtypes[it % ndtypes];
    const int32_t D = fixed_D ? fixed_D : 2 * test_rng_range(&rng, 1, 140);
    const int32_t bs = fixed_bs ? fixed_bs : 16 * test_rng_range(&rng, 1, 16);
    const int32_t heads = test_rng_range(&rng, 1, 3), h = test_rng_range(&rng, 0, heads - 1);
    const int32_t filled = test_rng_range(&rng, 1, bs), first = test_rng_range(&rng, 0, filled - 1);
    const int32_t count = test_rng_range(&rng, 1, filled - first), panel = bs + 16 * test_rng_range(&rng, 0, 2);
    const size_t esz = uattn_dtype_size(t), n = (size_t)filled * heads * D;
    uint8_t *k = malloc(n * esz), *v = malloc(n * esz);
    for (size_t i = 0; i < n * esz; i++) k[i] = (uint8_t)test_rng_next(&rng), v[i] = (uint8_t)test_rng_next(&rng);
    for (size_t i = 0; i < n; i++) /* NaN codes to -0 and 0 */
      for (uint8_t *x = k; x; x = x == k ? v : NULL)
        if (isnan(esz == 1 ? uattn_fp8_to_f32(t, x[i]) : uattn_bf16_to_f32((uint16_t)(x[2 * i] | x[2 * i + 1] << 8))))
          memset(x + i * esz, x == k ? 0x80 : 0, esz);
    char *tk, *tv;
    tiled_copy(t, (const char *)k, (const char *)v, filled, heads, D, &tk, &tv);
    /* 64-byte aligned, so that both calls put their panels at the same offsets */
    const size_t floats = (set->panel_floats(panel, D) + 15) & ~(size_t)15, canary = 64;
    const size_t bytes = sizeof(float) * (floats + canary);
    float *want_k = aligned_alloc(64, bytes), *want_v = aligned_alloc(64, bytes), *got_k = aligned_alloc(64, bytes),
          *got_v = aligned_alloc(64, bytes);
    for (size_t i = 0; i < floats + canary; i++) want_k[i] = want_v[i] = got_k[i] = got_v[i] = NAN;
    const size_t row = ((size_t)first * heads + h) * D * esz;
    set->load(t, k + row, v + row, (size_t)heads * D, count, D, panel, want_k, want_v);
    set->load_tiled(t, tk + (size_t)h * 16 * D * esz, tv + (size_t)h * 16 * D * esz, (size_t)heads * 16 * D, first,
                    count, D, panel, got_k, got_v);
    const char *name = t == UATTN_BF16 ? "bf16" : t == UATTN_FP8_E4M3 ? "fp8 e4m3" : "fp8 e5m2";
    cr_assert(!memcmp(want_k, got_k, bytes),
              "%s, load %d (%s, D %d, block %d, head %d of %d, keys %d + %d): keys differ", what, it, name, D, bs, h,
              heads, first, count);
    cr_assert(!memcmp(want_v, got_v, bytes),
              "%s, load %d (%s, D %d, block %d, head %d of %d, keys %d + %d): values differ", what, it, name, D, bs, h,
              heads, first, count);
    free(want_k), free(want_v), free(got_k), free(got_v), free(tk), free(tv), free(k), free(v);
  }
}

Test(kernels, avx512bf16_load_tiled_is_its_load_of_the_same_rows, .timeout = 300) {
  need_avx2();
  check_load_tiled(&uattn_kernels_avx512bf16_twin, "avx512bf16 (twin)", tiled_load_dtypes, 3, 0, 0, 1500 / SPARSE,
                   20261126);
  if (uattn_avx512bf16_runs_here())
    check_load_tiled(&uattn_kernels_avx512bf16, "avx512bf16", tiled_load_dtypes, 3, 0, 0, 1500 / SPARSE, 20261127);
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *b = uattn_bucket_registry[i];
    if (b->set.load_tiled && b->runs_here() && b->block_size % 16 == 0 && b->head_dim % 2 == 0)
      check_load_tiled(&b->set, b->part_names[0], &b->dtype, 1, b->head_dim, b->block_size, 300 / SPARSE, 20261128 + i);
  }
}

/* iters loads of set against its twin's (the staged path, which the tests above hold to the portable
 * widening) on random bits, shapes and strides, every dtype the set loads: the same panel buffers, 16 bits at
 * a time, canary included (set's load of bf16 and fp8 rows at whole 32s of dims is its own zmm transpose). An
 * fp8 NaN need only stay a NaN of the same sign: the staged path widens an fp8 NaN by F16C, the zmm one by
 * fp8_bf16_table (0x7ff0 and 0x7fc0 for E4M3's). fixed_D, fixed_dtype: a bucket's (0 / -1: random). */
static void check_load_against_twin(const uattn_kernels *set, const char *what, int32_t fixed_D, int fixed_dtype,
                                    int iters, uint64_t seed) {
  static const uattn_dtype dtypes[] = {UATTN_BF16, UATTN_F32, UATTN_F16, UATTN_FP8_E4M3, UATTN_FP8_E5M2};
  static const int32_t dims[] = {32, 64, 96, 128, 160, 256, 512, 16, 48, 80, 8, 2};
  test_rng rng = {seed};
  for (int it = 0; it < iters; it++) {
    const uattn_dtype t = fixed_dtype >= 0 ? (uattn_dtype)fixed_dtype : it % 2 ? UATTN_BF16 : dtypes[it / 2 % 5];
    const int32_t D = fixed_D ? fixed_D : dims[test_rng_range(&rng, 0, (int32_t)(sizeof dims / sizeof *dims) - 1)];
    const int32_t count = test_rng_range(&rng, 0, 300), panel = count + test_rng_range(&rng, 0, 40);
    const size_t stride = (size_t)D * test_rng_range(&rng, 1, 3) + (size_t)(test_rng_range(&rng, 0, 2) * 32);
    const size_t esz = uattn_dtype_size(t), n = (size_t)(count ? count - 1 : 0) * stride + D;
    uint8_t *k = malloc(n * esz), *v = malloc(n * esz);
    for (size_t i = 0; i < n * esz; i++) k[i] = (uint8_t)test_rng_next(&rng), v[i] = (uint8_t)test_rng_next(&rng);
    const size_t floats = (set->panel_floats(panel, D) + 15) & ~(size_t)15, bytes = sizeof(float) * (floats + 64);
    float *want_k = aligned_alloc(64, bytes), *want_v = aligned_alloc(64, bytes), *got_k = aligned_alloc(64, bytes),
          *got_v = aligned_alloc(64, bytes);
    for (size_t i = 0; i < floats + 64; i++) want_k[i] = want_v[i] = got_k[i] = got_v[i] = NAN;
    uattn_kernels_avx512bf16_twin.load(t, k, v, stride, count, D, panel, want_k, want_v);
    set->load(t, k, v, stride, count, D, panel, got_k, got_v);
    const bool fp8 = uattn_dtype_is_fp8(t); /* other dtypes' panels must match bit for bit, NaNs included */
    for (int p = 0; p < 2; p++) {
      const uint16_t *w = (const uint16_t *)(p ? want_v : want_k), *g = (const uint16_t *)(p ? got_v : got_k);
      for (size_t h = 0; h < bytes / 2; h++)
        cr_assert(w[h] == g[h] || (fp8 && isnan(uattn_bf16_to_f32(w[h])) && isnan(uattn_bf16_to_f32(g[h])) &&
                                   (w[h] ^ g[h]) < 0x8000),
                  "%s, load %d (dtype %d, D %d, %d keys, stride %zu, panel %d): %s half %zu is %#x, the twin's %#x",
                  what, it, (int)t, D, count, stride, panel, p ? "value" : "key", h, g[h], w[h]);
    }
    free(want_k), free(want_v), free(got_k), free(got_v), free(k), free(v);
  }
}

Test(kernels, avx512bf16_load_is_its_twins, .timeout = 300) {
  need_avx2();
  if (!uattn_avx512bf16_runs_here()) return; /* the twin is the staged path itself */
  check_load_against_twin(&uattn_kernels_avx512bf16, "avx512bf16", 0, -1, 1200 / SPARSE, 20261129);
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *b = uattn_bucket_registry[i];
    if (!strcmp(b->isa, "avx512bf16") && b->runs_here())
      check_load_against_twin(&b->set, b->part_names[0], b->head_dim, (int)b->dtype, 200 / SPARSE, 20261130 + i);
  }
}

/* Every fp8 code of both formats through the avx2 loads (the 8 x 8 byte tiles and the row widening) and
 * the decode kernels' widenings (avx2 widen8; avx512 v16_widen, zmm where the CPU has it): exactly
 * convert.h's value, NaN for NaN. */
Test(kernels, fp8_widening_is_exact_for_every_code) {
  need_avx2();
  enum { D = 64, KEYS = 64 }; /* 4096 elements: every code 16 times, at every position mod 8 and 16 */
  uint8_t *src = malloc(D * KEYS);
  for (uint32_t i = 0; i < D * KEYS; i++) src[i] = (uint8_t)(i * 7u + i / 256u);
  const size_t floats = uattn_kernels_avx2.panel_floats(KEYS, D);
  float *keys = malloc(sizeof(float) * floats), *values = malloc(sizeof(float) * floats);
  int32_t ks, vs;
  uattn_avx2_layout(KEYS, D, &ks, &vs);
  const float *kp = aligned64(keys), *vp = aligned64(values);
  for (int t = UATTN_FP8_E4M3; t <= UATTN_FP8_E5M2; t++) {
    uattn_kernels_avx2.load((uattn_dtype)t, src, src, D, KEYS, D, KEYS, keys, values);
    for (int32_t i = 0; i < KEYS; i++)
      for (int32_t d = 0; d < D; d++) {
        const uint8_t code = src[(size_t)i * D + d];
        const float want = uattn_fp8_to_f32((uattn_dtype)t, code);
        float got[2] = {kp[(size_t)d * ks + i], vp[(size_t)i * vs + d]};
        for (int x = 0; x < 2; x++)
          cr_assert(isnan(want) ? isnan(got[x]) && signbit(got[x]) == signbit(want) : !memcmp(&got[x], &want, 4),
                    "dtype %d, code 0x%02x: %a, want %a", t, code, got[x], want);
      }
  }
  free(src), free(keys), free(values);
}

/* The avx512bf16 decode kernel's fp8 widening (avx512bf16/vec.h's v16i_fp8_widen, its twin form: table
 * indexing that the vpermi2b form is held to by avx512bf16_is_its_twin_bit_for_bit) on every code of both
 * formats at every one of its 64 positions: convert.h's value as bf16, in the byte unpack's lane order. */
#if defined(__x86_64__)
/* the 64 bf16 v16i_fp8_widen makes of src, back in dim order */
AVX2_TARGET static void fp8_widen_in_order(const uint8_t *src, const uint8_t *tab, uint16_t *out) {
  _Alignas(32) uint16_t w[2][32];
  v16i a, b;
  v16i_fp8_widen(v16i_load(src), tab, &a, &b);
  _mm256_store_si256((__m256i *)w[0], a.lo), _mm256_store_si256((__m256i *)w[0] + 1, a.hi);
  _mm256_store_si256((__m256i *)w[1], b.lo), _mm256_store_si256((__m256i *)w[1] + 1, b.hi);
  for (int j = 0; j < 4; j++)
    for (int k = 0; k < 8; k++) out[16 * j + k] = w[0][8 * j + k], out[16 * j + 8 + k] = w[1][8 * j + k];
}
#endif

Test(kernels, avx512bf16_fp8_widening_is_exact_for_every_code) {
  need_avx2();
#if defined(__x86_64__)
  for (int t = UATTN_FP8_E4M3; t <= UATTN_FP8_E5M2; t++) {
    const uint8_t *tab = fp8_bf16_table((uattn_dtype)t);
    for (int shift = 0; shift < 256; shift++) {
      uint8_t src[64];
      uint16_t out[64];
      for (int i = 0; i < 64; i++) src[i] = (uint8_t)(i + shift);
      fp8_widen_in_order(src, tab, out);
      for (int i = 0; i < 64; i++) {
        const float want = uattn_fp8_to_f32((uattn_dtype)t, src[i]), got = uattn_bf16_to_f32(out[i]);
        cr_assert(isnan(want) ? isnan(got) && signbit(got) == signbit(want) : !memcmp(&got, &want, 4),
                  "dtype %d, code 0x%02x at %d: %a, want %a", t, src[i], i, got, want);
      }
    }
  }
#endif
}

/* The soft cap's tanh is computed in fp64 and rounded once: every 5th float of [-20, 20] (tiny magnitudes
 * included) within 1 ulp of the correctly rounded value (within half an ulp but for near-ties), and tanhf's
 * own error on top. */
Test(kernels, avx2_tanh_is_within_1_ulp_of_the_rounded_exact_value, .timeout = 300) {
  need_avx2();
  enum { N = 1 << 16 };
  static float x[N], y[N];
  int64_t worst = 0, worst_libm = 0;
  float worst_x = 0;
  for (int neg = 0; neg < 2; neg++) {
    const uint32_t sign = neg ? 0x80000000u : 0u, last = 0x41A00000u; /* 20 */
    uint32_t u = 0;
    while (u <= last) {
      size_t n = 0;
      for (; n < N && u <= last; n++, u += 5 * SPARSE) {
        const uint32_t b = u | sign;
        memcpy(&x[n], &b, 4);
      }
      uattn_avx2_tanh(x, y, n);
      for (size_t i = 0; i < n; i++) {
        const float want = (float)tanh((double)x[i]);
        cr_assert(signbit(y[i]) == signbit(x[i]), "tanh(%a) has the wrong sign", x[i]);
        const int64_t e = ulps(fabsf(y[i]), fabsf(want)), el = ulps(fabsf(y[i]), fabsf(tanhf(x[i])));
        if (e > worst) worst = e, worst_x = x[i];
        if (el > worst_libm) worst_libm = el;
      }
    }
  }
  fprintf(stderr, "tanh: worst %lld ulps from the rounded exact value (at %.9g), %lld from tanhf\n", (long long)worst,
          worst_x, (long long)worst_libm);
  cr_assert(worst <= 1, "tanh is %lld ulps off at %.9g", (long long)worst, worst_x);
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-30f, 1e-45f};
  float out[8];
  uattn_avx2_tanh(special, out, 8);
  cr_assert(out[0] == 0.0f && !signbit(out[0]) && out[1] == 0.0f && signbit(out[1]), "tanh(+-0)");
  cr_assert(out[2] == 1.0f && out[3] == -1.0f && out[4] == 1.0f && out[5] == -1.0f, "tanh at the ends");
  cr_assert(out[6] == 1e-30f && out[7] == 1e-45f, "tanh of tiny values");
}

/* ---- which ISA paths this run covered ------------------------------------------------------------------- */

/* After the run, on stderr and in $UATTN_ISA_REPORT (make test prints it): every ISA path of the kernels,
 * whether this CPU ran it and, where not, why and what stood in for it. Asked in the runner's process after
 * every test, so that no probe runs before a test's own first use of libxsmm. */
static void isa_report(FILE *f) {
  const bool avx2 = uattn_avx2_runs_here(), avx512 = uattn_avx512_runs_here();
  const bool xsmm = avx2 && uattn_xsmm_runs_here();
  fprintf(f, "test_kernels: ISA paths on this CPU\n");
  fprintf(f, "  %-34s ran: the reference every other set is held to\n", "portable");
  fprintf(f, "  %-34s %s\n", "avx2 (loads, fused attend, decode)",
          avx2 ? "ran" : "skipped: this CPU lacks AVX2, FMA or F16C");
  if (xsmm)
    fprintf(f, "  %-34s ran, libxsmm generating %s code\n", "libxsmm body", uattn_xsmm_target());
  else
    fprintf(f, "  %-34s skipped: %s\n", "libxsmm body",
            avx2 ? "libxsmm is not built in, or JITs nothing on this CPU" : "it runs on the avx2 set's panels");
  fprintf(f, "  %-34s %s\n", "avx512 attend, decode, ymm twin", avx2 ? "ran" : "skipped: the twin needs AVX2");
  fprintf(f, "  %-34s %s\n", "avx512 attend, decode, zmm",
          avx512 ? "ran, held to its twin bit for bit" : "skipped: this CPU lacks AVX-512F (its twin ran instead)");
  fprintf(f, "  %-34s %s\n", "avx512bf16, emulated twin", avx2 ? "ran" : "skipped: the twin needs AVX2");
  fprintf(f, "  %-34s %s\n", "avx512bf16, vdpbf16ps",
          uattn_avx512bf16_runs_here() ? "ran, held to its twin bit for bit"
                                       : "skipped: this CPU lacks AVX512-BF16 (its twin ran instead)");
  fprintf(f, "  the ladder's levels in the attention suites (UATTN_ISA, UATTN_TWINS):\n");
  for (size_t i = 0; i < uattn_isa_registry_size; i++) {
    const uattn_isa *isa = &uattn_isa_registry[i];
    fprintf(f, "    %-32s %s\n", isa->name,
            !isa->runs_here || isa->runs_here()  ? "native"
            : isa->twin && isa->twin_runs_here() ? "as its exact twin: this CPU lacks it"
                                                 : "skipped: this CPU lacks it and its twin's ISA");
  }
  int runs = 0, lacks = 0;
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) uattn_bucket_registry[i]->runs_here() ? runs++ : lacks++;
  fprintf(f, "  %-34s %d ran", "generated buckets", runs);
  if (lacks) {
    fprintf(f, ", %d skipped: this CPU lacks", lacks);
    const char *named[16];
    int n = 0;
    for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
      const uattn_bucket_kernels *b = uattn_bucket_registry[i];
      bool seen = b->runs_here();
      for (int k = 0; k < n && !seen; k++) seen = !strcmp(named[k], b->isa);
      if (!seen && n < 16) {
        fprintf(f, "%s %s", n ? "," : "", b->isa);
        named[n++] = b->isa;
      }
    }
  }
  fprintf(f, "\n");
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
  (void)stats;
  isa_report(stderr);
  const char *path = getenv("UATTN_ISA_REPORT");
  FILE *f = path && *path ? fopen(path, "w") : NULL;
  if (f) isa_report(f), fclose(f);
}

/* The ISA ladder the generator writes from gen/manifest.json: best first, each rung a generic set under its own
 * name with its probe, the portable set last and without one; the default is the first rung this CPU runs,
 * and UATTN_ISA names the highest rung to use: the first at or below it that runs, or with UATTN_TWINS the named
 * rung's twin where the CPU lacks the rung and runs the twin. Every bucket belongs to a rung and has its probe, and a rung
 * that shares another's bucket functions names another rung. */
Test(kernels, the_isa_ladder_is_the_manifests) {
  cr_assert_geq(uattn_isa_registry_size, 1);
  const uattn_isa *last = &uattn_isa_registry[uattn_isa_registry_size - 1];
  cr_assert(last->set == &uattn_kernels_portable && !last->runs_here, "the portable set is the last rung");
  unsetenv("UATTN_ISA");
  unsetenv("UATTN_TWINS");
  const uattn_kernels *best = NULL;
  for (size_t i = 0; i < uattn_isa_registry_size; i++) {
    const uattn_isa *isa = &uattn_isa_registry[i];
    cr_assert_str_eq(isa->name, isa->set->name);
    cr_assert(isa->runs_here || isa == last, "%s has no probe", isa->name);
    for (size_t j = 0; j < i; j++) cr_assert_str_neq(isa->name, uattn_isa_registry[j].name);
    const bool runs = !isa->runs_here || isa->runs_here();
    if (!best && runs) best = isa->set;
    size_t other = 0;
    while (isa->shares && other < uattn_isa_registry_size && strcmp(uattn_isa_registry[other].name, isa->shares))
      other++;
    cr_assert(!isa->shares || (other < uattn_isa_registry_size && other != i), "%s shares %s, not another rung",
              isa->name, isa->shares);
    cr_assert_eq(!isa->twin, !isa->twin_runs_here, "%s: a twin and its probe come together", isa->name);
    cr_assert(!isa->twin || (!strcmp(isa->twin->name, isa->name) && isa->twin != isa->set), "%s's twin", isa->name);
  }
  const char *why;
  cr_assert_eq(uattn_kernels_select(&why, NULL), best);
  for (size_t i = 0; i < uattn_isa_registry_size; i++) {
    const uattn_isa *isa = &uattn_isa_registry[i];
    setenv("UATTN_ISA", isa->name, 1);
    size_t below = i;
    while (uattn_isa_registry[below].runs_here && !uattn_isa_registry[below].runs_here()) below++;
    cr_assert_eq(uattn_kernels_select(&why, NULL), uattn_isa_registry[below].set, "UATTN_ISA=%s: %s", isa->name, why);
    setenv("UATTN_TWINS", "1", 1);
    const bool twin = below != i && isa->twin && isa->twin_runs_here();
    cr_assert_eq(uattn_kernels_select(&why, NULL), twin ? isa->twin : uattn_isa_registry[below].set,
                 "UATTN_ISA=%s, UATTN_TWINS=1: %s", isa->name, why);
    unsetenv("UATTN_TWINS");
  }
  unsetenv("UATTN_ISA");
  for (size_t b = 0; b < uattn_bucket_registry_size; b++) {
    const uattn_bucket_kernels *e = uattn_bucket_registry[b];
    size_t i = 0;
    while (i < uattn_isa_registry_size && strcmp(uattn_isa_registry[i].name, e->isa)) i++;
    cr_assert_lt(i, uattn_isa_registry_size, "a bucket of %s, which is not a rung", e->isa);
    cr_assert(e->runs_here == uattn_isa_registry[i].runs_here, "a %s bucket with another probe", e->isa);
    cr_assert_str_eq(e->set.name, e->isa);
  }
}

/* The best set the CPU runs is the default; UATTN_ISA picks another by name (each test is its own process). */
Test(kernels, selection) {
  const char *why;
  unsetenv("UATTN_ISA");
  unsetenv("UATTN_TWINS");
  const uattn_kernels *best = uattn_kernels_select(&why, NULL);
  cr_assert_str_eq(best->name, uattn_amx_runs_here()          ? "amx"
                               : uattn_avx512bf16_runs_here() ? "avx512bf16"
                               : uattn_avx512_runs_here()     ? "avx512"
                               : uattn_avx2_runs_here()       ? "avx2"
                                                              : "portable");
  setenv("UATTN_ISA", "portable", 1);
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, "portable");
  cr_assert_str_eq(why, "forced by UATTN_ISA");
  setenv("UATTN_ISA", "avx2", 1);
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, uattn_avx2_runs_here() ? "avx2" : best->name);
  setenv("UATTN_ISA", "avx512", 1); /* where the CPU lacks it: the best set below it, and why says so */
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, uattn_avx512_runs_here() ? "avx512" : best->name);
  if (!uattn_avx512_runs_here()) cr_assert_str_eq(why, "UATTN_ISA names a level this CPU lacks: the best set below it");
  setenv("UATTN_TWINS", "1", 1); /* the tests' twin where the CPU lacks it and runs the twin */
  const uattn_kernels *k = uattn_kernels_select(&why, NULL);
  if (!uattn_avx512_runs_here() && uattn_avx2_runs_here())
    cr_assert(k == &uattn_kernels_avx512_twin && strstr(why, "exact twin"), "%s", why);
  unsetenv("UATTN_TWINS");
  setenv("UATTN_ISA", "avx512bf16", 1);
  cr_assert_str_eq(uattn_kernels_select(&why, NULL)->name, uattn_avx512bf16_runs_here() ? "avx512bf16" : best->name);
  setenv("UATTN_ISA", "no-such-set", 1);
  cr_assert_eq(uattn_kernels_select(&why, NULL), best);
}

/* ---- the amx set ---------------------------------------------------------------------------------------- */

/* Its logic through its twin (amx/tile.h: tdpbf16ps emulated exactly, over the avx512bf16 twin), wherever AVX2
 * runs: check_bf16_set's jobs (many of 16 vectors or more, which the tiles take; the rest, P in fp32 and head
 * dims that are not multiples of 32 go to avx512bf16's attend), and long jobs of many rows, several key chunks
 * each, on bf16 and fp8 caches, against the portable set and the fp64 oracle. */
Test(kernels, amx_twin_attend_matches_portable_on_random_jobs, .timeout = 300) {
  need_avx2();
  check_bf16_set(&uattn_kernels_amx_twin, "amx (twin)", false, 20261150, AMX_TWIN_SPARSE);
}

Test(kernels, amx_twin_long_jobs_match_portable, .timeout = 300) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.large = true, .bf16 = true, .fp8 = fp8};
    check_set_on_random_jobs(&uattn_kernels_amx_twin, UATTN_PART_CAUSAL,
                             fp8 ? "amx (twin), long, fp8 cache" : "amx (twin), long", &lim, 300 / AMX_TWIN_SPARSE,
                             20261152 + (uint64_t)fp8);
  }
}

#if defined(__x86_64__)
/* One tdpbf16ps of the instruction and of the emulation on the same tiles: C (16 x 16 fp32) += A (16 x 2K bf16)
 * B (K x 16 pairs), K pairs of 16 or 8 (the two shapes amx/body.h uses; the sums are per instruction). */
__attribute__((target("amx-tile,amx-bf16"))) static void tdpbf16ps_hardware(float *c, const uint32_t *a,
                                                                            const uint32_t *b, int K) {
  amx_config cfg = {.palette = 1};
  cfg.rows[0] = 16, cfg.colsb[0] = 64, cfg.rows[1] = 16, cfg.colsb[1] = (uint16_t)(4 * K);
  cfg.rows[2] = (uint8_t)K, cfg.colsb[2] = 64;
  _tile_loadconfig(&cfg);
  _tile_loadd(0, c, 64);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, 64);
  _tile_release();
}

static void tdpbf16ps_twin(float *c, const uint32_t *a, const uint32_t *b, int K) {
  amx_tiles t;
  amx_config cfg = {.palette = 1};
  cfg.rows[0] = 16, cfg.colsb[0] = 64, cfg.rows[1] = 16, cfg.colsb[1] = (uint16_t)(4 * K);
  cfg.rows[2] = (uint8_t)K, cfg.colsb[2] = 64;
  amx_configure(&t, &cfg);
  amx_load(&t, 0, c, 64);
  amx_load(&t, 1, a, 64);
  amx_load(&t, 2, b, 64);
  amx_dpbf16(&t, 0, 1, 2);
  amx_store(&t, 0, c, 64);
}
#endif

/* Where AMX runs: the instruction is the emulation, element for element, on tiles of every size of operand
 * (denormals and tiny products included, so the flushes count) with accumulators that cancel the sums; a
 * model of the instruction in Intel's pseudocode order (each pair added to C in turn) fails this test. */
Test(kernels, tdpbf16ps_is_its_emulation_bit_for_bit, .timeout = 300) {
  if (!uattn_amx_runs_here())
    cr_skip_test("this CPU lacks AMX, or the OS grants no tiles (the emulation is what the twin runs)");
#if defined(__x86_64__)
  test_rng rng = {20261154};
  for (int it = 0; it < 20000 / SPARSE; it++) {
    const int K = it % 3 ? 16 : 8, kind = it % 7 == 0 ? 1 : it % 11 == 0 ? 2 : 0;
    _Alignas(64) uint32_t a[256], b[256];
    _Alignas(64) float c[256], hw[256], twin[256];
    for (int i = 0; i < 256; i++) {
      a[i] = random_bf16(&rng, kind) | (uint32_t)random_bf16(&rng, kind) << 16;
      b[i] = random_bf16(&rng, kind) | (uint32_t)random_bf16(&rng, kind) << 16;
    }
    for (int i = 0; i < 256; i++) {
      const int32_t pick = test_rng_range(&rng, 0, 2);
      const float p = uattn_bf16_to_f32((uint16_t)a[(i / 16) * 16]) * uattn_bf16_to_f32((uint16_t)b[i % 16]) * (float)K;
      c[i] = pick == 0   ? -p * (1.0f + (float)test_rng_range(&rng, -2, 2) * 1e-3f)
             : pick == 1 ? uniform(&rng, -1.0f, 1.0f) * (kind == 1 ? 1e-37f : 1.0f)
                         : uniform(&rng, -1e-38f, 1e-38f);
    }
    memcpy(hw, c, sizeof c), memcpy(twin, c, sizeof c);
    tdpbf16ps_hardware(hw, a, b, K);
    tdpbf16ps_twin(twin, a, b, K);
    for (int i = 0; i < 256; i++)
      cr_assert(!memcmp(&hw[i], &twin[i], 4), "K %d, element %d, acc %a: tdpbf16ps %a, emulation %a", K, i, c[i], hw[i],
                twin[i]);
  }
#endif
}

/* Where AMX runs: the set computes its twin's bits, attend (tiles and the jobs it hands avx512bf16) and decode,
 * both P modes, bf16 and fp8 caches. */
Test(kernels, amx_is_its_twin_bit_for_bit, .timeout = 300) {
  if (!uattn_amx_runs_here()) cr_skip_test("this CPU lacks AMX, or the OS grants no tiles (the twin is tested above)");
  for (int fp32 = 0; fp32 < 2; fp32++) {
    const case_limits any = {.probs_fp32 = fp32}, few_rows = {.decode = true, .probs_fp32 = fp32};
    check_sets_same_bits(&uattn_kernels_amx_twin, &uattn_kernels_amx, UATTN_PART_SHARED, &any, 1000 / SPARSE,
                         20261156 + (uint64_t)fp32, "the amx attend differs from its twin");
    check_sets_same_bits(&uattn_kernels_amx_twin, &uattn_kernels_amx, UATTN_PART_UNIQUE, &few_rows, 500 / SPARSE,
                         20261158 + (uint64_t)fp32, "the amx decode differs from its twin");
  }
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.large = true, .bf16 = true, .fp8 = fp8};
    check_sets_same_bits(&uattn_kernels_amx_twin, &uattn_kernels_amx, UATTN_PART_CAUSAL, &lim, 300 / SPARSE,
                         20261160 + (uint64_t)fp8, "the amx attend differs from its twin on long jobs");
  }
}
