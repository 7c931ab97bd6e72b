/*
 * The dense attention oracle (see dense_oracle.h). Written from docs/design.md and uattn.h only; its dtype
 * conversions and element access are in dense_oracle_dtypes.c.
 *
 * The computation, per request r and KV head g:
 *   1. widen every key and value the request can see (cache for j < num_computed, this step's rows after;
 *      the cross sequence for cross attention) into double matrices K[j][d], V[j][d];
 *   2. for each (row, query head of g) -- an "item" -- the visible keys form one contiguous range [lo, hi),
 *      so masks are ranges, never bias tensors;
 *   3. score, cap, ALiBi, then a max-subtracted softmax with the sink in the denominator, in double.
 * Items are processed TILE at a time only so that each widened key and value row is loaded once per tile
 * rather than once per item (a 4k-token prefill would otherwise stream hundreds of GB from memory). Every
 * item's arithmetic is its own and runs in a fixed order (dot products over d in order, sums over j in
 * order), so a row's answer does not depend on which rows share its tile: oracle_attention_rows and
 * oracle_attention agree bit for bit.
 */
#include "support/dense_oracle.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ================================================================================================ */
/* errors                                                                                             */
/* ================================================================================================ */

static _Thread_local char oracle_msg[256];

const char *oracle_last_error(void) { return oracle_msg; }

static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(oracle_msg, sizeof oracle_msg, fmt, ap);
  va_end(ap);
  return -1;
}

/* ================================================================================================ */
/* argument checks                                                                                    */
/* ================================================================================================ */

static bool valid_dtype(uattn_dtype d) { return d == UATTN_F32 || d == UATTN_BF16 || d == UATTN_F16; }
static bool valid_cache_dtype(uattn_dtype d) { return valid_dtype(d) || oracle_is_fp8(d); }
static bool valid_scale(float x) { return isfinite(x) && x > 0; }

static bool is_cross(const uattn_layer *layer) { return layer->attn_type == UATTN_ATTENTION_ENCODER_DECODER; }

/* The step and layer on their own; sets *num_tokens. */
static int check_step_layer(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t,
                            int64_t *num_tokens) {
  if (!s || !layer || !t) return fail("oracle: NULL step, layer or tensors");
  if (s->num_reqs < 0) return fail("oracle: num_reqs %d < 0", s->num_reqs);
  if (s->num_reqs > 0 && (!s->num_computed || !s->num_scheduled))
    return fail("oracle: NULL num_computed or num_scheduled");
  if (s->block_size <= 0) return fail("oracle: block_size %d <= 0", s->block_size);
  if (layer->num_q_heads <= 0 || layer->num_kv_heads <= 0 || layer->head_dim <= 0)
    return fail("oracle: heads %d/%d and head_dim %d must be > 0", layer->num_q_heads, layer->num_kv_heads,
                layer->head_dim);
  if (layer->num_q_heads % layer->num_kv_heads != 0)
    return fail("oracle: num_q_heads %d is not a multiple of num_kv_heads %d", layer->num_q_heads, layer->num_kv_heads);
  if (!valid_dtype(layer->dtype) || !valid_cache_dtype(layer->cache_dtype))
    return fail("oracle: unknown dtype %d or cache_dtype %d", (int)layer->dtype, (int)layer->cache_dtype);
  if (oracle_is_fp8(layer->cache_dtype)) {
    if (!valid_scale(layer->k_scale) || !valid_scale(layer->v_scale))
      return fail("oracle: fp8 cache with k_scale %g, v_scale %g (finite and > 0 needed)", (double)layer->k_scale,
                  (double)layer->v_scale);
  }
  if (layer->kv_layout != UATTN_LAYOUT_NHD && layer->kv_layout != UATTN_LAYOUT_HND &&
      layer->kv_layout != UATTN_LAYOUT_TILED)
    return fail("oracle: unknown kv_layout %d", (int)layer->kv_layout);
  /* TILED's tiles are 16 keys of a block and its key rows dim pairs (uattn.h) */
  if (layer->kv_layout == UATTN_LAYOUT_TILED && (s->block_size % 16 != 0 || layer->head_dim % 2 != 0))
    return fail("oracle: the TILED layout needs a block size that is a multiple of 16 (%d) and an even head_dim (%d)",
                s->block_size, layer->head_dim);
  if (layer->attn_type < UATTN_ATTENTION_DECODER || layer->attn_type > UATTN_ATTENTION_ENCODER_DECODER)
    return fail("oracle: unknown attn_type %d", layer->attn_type);
  if (layer->head_dim_v < 0) return fail("oracle: head_dim_v %d < 0", layer->head_dim_v);
  if (layer->kv_latent) {
    /* a latent's value is its key's first head_dim_v dims, read from the key cache alone (uattn.h) */
    if (layer->head_dim_v <= 0 || layer->head_dim_v > layer->head_dim)
      return fail("oracle: kv_latent needs 0 < head_dim_v (%d) <= head_dim (%d)", layer->head_dim_v, layer->head_dim);
    if (layer->kv_layout == UATTN_LAYOUT_TILED) return fail("oracle: kv_latent needs an NHD or HND cache, not TILED");
    if (oracle_is_fp8(layer->cache_dtype) && layer->v_scale != layer->k_scale)
      return fail("oracle: kv_latent on an fp8 cache needs v_scale (%g) == k_scale (%g)", (double)layer->v_scale,
                  (double)layer->k_scale);
    if (t->v || t->value_cache) return fail("oracle: kv_latent with a v or a value cache (both must be NULL)");
  }
  int64_t total = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const int32_t nc = s->num_computed[r], ns = s->num_scheduled[r];
    if (nc < 0 || ns < 0) return fail("oracle: request %d: num_computed %d, num_scheduled %d", r, nc, ns);
    if ((int64_t)nc + ns > INT32_MAX) return fail("oracle: request %d: sequence length overflows int32", r);
    total += ns;
  }
  if (total > INT32_MAX) return fail("oracle: %lld scheduled tokens overflow int32", (long long)total);
  *num_tokens = total;
  return 0;
}

/* The cache block holding key j of request r of the given table, checked. */
static int block_of(const int32_t *table, int32_t stride, int32_t r, int32_t j, int32_t block_size, int32_t num_blocks,
                    const char *which, int32_t *block) {
  const int32_t col = j / block_size;
  if (!table) return fail("oracle: request %d reads or writes the cache but the %s block table is NULL", r, which);
  if (col >= stride)
    return fail("oracle: request %d position %d needs %s block table column %d, stride is %d", r, j, which, col,
                stride);
  const int32_t b = table[(size_t)r * (size_t)stride + (size_t)col];
  if (b < 0 || b >= num_blocks)
    return fail("oracle: request %d position %d: %s block id %d outside [0, %d)", r, j, which, b, num_blocks);
  *block = b;
  return 0;
}

/* Every cache block request r reads: keys [0, num_computed + num_scheduled) of a self-attention (this step's
 * too, as written), [0, encoder_len) of cross. */
static int check_reads(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t) {
  const bool cross = is_cross(layer);
  if (cross) {
    if (!t->cross || (s->num_reqs > 0 && !t->cross->encoder_lens))
      return fail("oracle: cross attention without t->cross or its encoder_lens");
  }
  bool any = false;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const int32_t n = cross ? t->cross->encoder_lens[r] : s->num_computed[r] + s->num_scheduled[r];
    if (n < 0) return fail("oracle: request %d: encoder_len %d < 0", r, n);
    /* every key of a block lies in that block, so checking one key per block is checking them all */
    for (int32_t j = 0; j < n; j += s->block_size) {
      int32_t b = 0;
      int rc = cross ? block_of(t->cross->block_table, t->cross->block_table_stride, r, j, s->block_size, t->num_blocks,
                                "cross", &b)
                     : block_of(s->block_table, s->block_table_stride, r, j, s->block_size, t->num_blocks, "step", &b);
      if (rc) return rc;
      any = true;
    }
  }
  if (any && (!t->key_cache || (!layer->kv_latent && !t->value_cache)))
    return fail("oracle: keys are read from a NULL cache");
  return 0;
}

/* ================================================================================================ */
/* the cache update                                                                                   */
/* ================================================================================================ */

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Copies or converts element si of a dtype array to element di of a cache_dtype array (an fp8 one through
 * scale). */
static void convert_elem(const void *src, uattn_dtype sdt, size_t si, void *dst, uattn_dtype ddt, size_t di,
                         float scale) {
  if (oracle_is_fp8(ddt)) {
    ((uint8_t *)dst)[di] = oracle_quantize_fp8(ddt, oracle_load(src, sdt, si), scale);
  } else if (sdt == ddt) {
    /* equal dtypes: the bits themselves, so that even a signalling NaN's payload survives */
    const size_t es = oracle_dtype_size(sdt);
    memcpy((char *)dst + di * es, (const char *)src + si * es, es);
  } else {
    oracle_store(dst, ddt, di, oracle_load(src, sdt, si));
  }
}

int oracle_write_cache(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t) {
  int64_t num_tokens = 0;
  if (check_step_layer(s, layer, t, &num_tokens)) return -1;
  if (is_cross(layer)) return 0; /* cross attention's step k/v are ignored and not written */
  if (num_tokens == 0) return 0;
  if (!t->k || !t->key_cache || (!layer->kv_latent && (!t->v || !t->value_cache)))
    return fail("oracle: NULL k, v or cache");

  /* Check every slot (and that no two tokens share one) before writing anything. */
  int64_t *slots = malloc((size_t)num_tokens * sizeof *slots);
  if (!slots) return fail("oracle: out of memory");
  size_t n = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    for (int32_t i = 0; i < s->num_scheduled[r]; i++) {
      const int32_t p = s->num_computed[r] + i;
      int32_t b = 0;
      if (block_of(s->block_table, s->block_table_stride, r, p, s->block_size, t->num_blocks, "step", &b)) {
        free(slots);
        return -1;
      }
      slots[n++] = (int64_t)b * s->block_size + p % s->block_size;
    }
  }
  int64_t *sorted = malloc((size_t)num_tokens * sizeof *sorted);
  if (!sorted) {
    free(slots);
    return fail("oracle: out of memory");
  }
  memcpy(sorted, slots, (size_t)num_tokens * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cmp_i64);
  for (size_t i = 1; i < n; i++) {
    if (sorted[i] == sorted[i - 1]) {
      const long long dup = (long long)sorted[i];
      free(sorted);
      free(slots);
      return fail("oracle: two tokens of the step write slot %lld: the result would depend on the order", dup);
    }
  }
  free(sorted);

  const int32_t hkv = layer->num_kv_heads, D = layer->head_dim, Dv = oracle_value_dim(layer), bs = s->block_size;
  for (size_t row = 0; row < n; row++) {
    for (int32_t g = 0; g < hkv; g++) {
      for (int32_t d = 0; d < D; d++) {
        const size_t src = (row * (size_t)hkv + (size_t)g) * (size_t)D + (size_t)d;
        convert_elem(t->k, layer->dtype, src, t->key_cache, layer->cache_dtype,
                     oracle_cache_index(layer, bs, slots[row], g, d, false), layer->k_scale);
      }
      for (int32_t d = 0; d < Dv && !layer->kv_latent; d++) {
        const size_t src = (row * (size_t)hkv + (size_t)g) * (size_t)Dv + (size_t)d;
        convert_elem(t->v, layer->dtype, src, t->value_cache, layer->cache_dtype,
                     oracle_cache_index(layer, bs, slots[row], g, d, true), layer->v_scale);
      }
    }
  }
  free(slots);
  return 0;
}

/* ================================================================================================ */
/* attention                                                                                          */
/* ================================================================================================ */

/* (row, query head) items per tile: the score loop keeps TILE accumulators in registers. */
enum { TILE = 16 };
/* Keys per block of the weighted-value sum: KEY_BLOCK widened value rows (32 KiB at D 128) stay in L1
 * while every item of the tile uses them (64 was measured 25% slower, 16 no faster). */
enum { KEY_BLOCK = 32 };
/* Items per unit of work handed to a thread. */
enum { UNIT_ITEMS = 1024 };

/* Four doubles handled as one value. The two loops that do nearly all the arithmetic use it so that the
 * compiler emits vector code (plain loops came out 4x slower: GCC vectorized the wrong loop); it changes no
 * result: each lane is an independent, in-order chain of rounded multiplies and adds. The avx2 clone is
 * only wider, not different: "avx2" does not enable FMA, so nothing can be contracted. */
typedef double v4d __attribute__((vector_size(32)));

/* Not under ThreadSanitizer: the clones' resolver runs while the program is being loaded, before TSan's
 * runtime is up, and its instrumented code crashes there. */
#if defined(__x86_64__) && defined(__has_attribute) && !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define ORACLE_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef ORACLE_CLONES
#define ORACLE_CLONES
#endif

/* The same four doubles as they lie in a double array: any alignment, and allowed to alias double. */
typedef double v4d_mem __attribute__((vector_size(32), aligned(8), may_alias));
#define V4_LOAD(x, p) ((x) = *(const v4d_mem *)(const void *)(p))
#define V4_STORE(p, x) (*(v4d_mem *)(void *)(p) = (x))

/* S[i][j - klo] = <q_i, k_j> for the TILE items i and keys j in [klo, khi): Qt is the tile's queries
 * transposed [Dp][TILE] and K the widened keys [n][Dp]. Lane i runs over d in order, so it is the plain
 * sequential dot product, whatever else shares the tile. */
ORACLE_CLONES static void scores_tile(const double *K, const double *Qt, size_t Dp, int32_t klo, int32_t khi, double *S,
                                      size_t span) {
  for (int32_t j = klo; j < khi; j++) {
    const double *kj = K + (size_t)j * Dp;
    v4d acc[TILE / 4] = {{0}};
    for (size_t d = 0; d < Dp; d++) {
      const v4d kd = {kj[d], kj[d], kj[d], kj[d]};
      for (int i = 0; i < TILE / 4; i++) {
        v4d q;
        V4_LOAD(q, Qt + d * TILE + (size_t)i * 4);
        acc[i] += q * kd;
      }
    }
    for (int i = 0; i < TILE; i++) S[(size_t)i * span + (size_t)(j - klo)] = acc[i / 4][i % 4];
  }
}

/* o[d] += w[j] * V[j][d] for j = a, a+1, ..., b-1 in that order, d < Dp (a multiple of 16). */
ORACLE_CLONES static void weighted_sum(double *o, const double *w, const double *V, size_t Dp, int32_t a, int32_t b) {
  for (size_t d = 0; d < Dp; d += 16) {
    v4d acc[4], v;
    for (int c = 0; c < 4; c++) V4_LOAD(acc[c], o + d + 4 * c);
    for (int32_t j = a; j < b; j++) {
      const v4d wj = {w[j], w[j], w[j], w[j]};
      const double *vj = V + (size_t)j * Dp + d;
      for (int c = 0; c < 4; c++) {
        V4_LOAD(v, vj + 4 * c);
        acc[c] += wj * v;
      }
    }
    for (int c = 0; c < 4; c++) V4_STORE(o + d + 4 * c, acc[c]);
  }
}

/* One selected output: the step row, and where its answer goes in out/lse. */
typedef struct sel {
  int32_t row, dst;
} sel;

static int cmp_sel(const void *a, const void *b) {
  const sel *x = a, *y = b;
  if (x->row != y->row) return (x->row > y->row) - (x->row < y->row);
  return (x->dst > y->dst) - (x->dst < y->dst);
}

/* Items [it0, it1) of request r and KV head g. Request r's selected rows are order[first..], and its
 * items are (selected row, query head of g) in row-major order. */
typedef struct unit {
  int32_t r, g, first;
  int64_t it0, it1;
} unit;

/* Everything the threads share; they only read it, except `next` and disjoint parts of out/lse. */
typedef struct job {
  const oracle_step *s;
  const uattn_layer *layer;
  const uattn_tensors *t;
  const sel *order;
  const int32_t *qstart; /* [num_reqs] first row of each request */
  const unit *units;
  int32_t num_units;
  _Atomic int32_t next;
  size_t Dp;  /* head_dim rounded up to 16; the padding lanes are zeros that add exact zeros */
  size_t Dvp; /* the value dim rounded up to 16, likewise */
  double *out, *lse;
} job;

/* A thread's working memory, sized for the step's longest key sequence. */
typedef struct work {
  double *K, *V; /* [max_n][Dp] widened keys and [max_n][Dvp] values of (r, g), rows [0, loaded) valid */
  double *Qt;    /* [Dp][TILE] */
  double *S;     /* [TILE][max_n] scores, then unnormalized weights */
  double *O;     /* [TILE][Dvp] unnormalized outputs */
  int32_t r, g, loaded;
} work;

static bool is_encoder_kind(const uattn_layer *layer) { return layer->attn_type != UATTN_ATTENTION_DECODER; }

/* Number of keys request r has: its whole sequence, or the encoder's for cross attention. */
static int32_t num_keys(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t, int32_t r) {
  return is_cross(layer) ? t->cross->encoder_lens[r] : s->num_computed[r] + s->num_scheduled[r];
}

/* The visible key range [lo, hi) of the query at position p of a request with n keys. */
static void key_range(const uattn_layer *layer, int32_t p, int32_t n, int32_t *lo, int32_t *hi) {
  if (is_encoder_kind(layer)) { /* encoder, encoder-only, cross: every key, no causal mask, no window */
    *lo = 0;
    *hi = n;
    return;
  }
  *hi = p + 1;
  *lo = layer->sliding_window > 0 && p - layer->sliding_window + 1 > 0 ? p - layer->sliding_window + 1 : 0;
}

/* Widens keys/values [w->loaded, n) of request r, KV head g (keys already widened for (r, g) are kept): each as
 * the (updated) cache holds it, this step's own too. */
static void load_kv(const job *jb, int32_t r, int32_t g, int32_t n, work *w) {
  const oracle_step *s = jb->s;
  const uattn_layer *layer = jb->layer;
  const uattn_tensors *t = jb->t;
  const size_t D = (size_t)layer->head_dim, Dp = jb->Dp, Dv = (size_t)oracle_value_dim(layer), Dvp = jb->Dvp;
  const bool cross = is_cross(layer);
  const int32_t bs = s->block_size;
  if (w->r != r || w->g != g) {
    w->r = r;
    w->g = g;
    w->loaded = 0;
  }
  const bool fp8 = oracle_is_fp8(layer->cache_dtype);
  /* an fp8 code is read times its scale (1 for other caches, which multiplies exactly) */
  const double ks = fp8 ? (double)layer->k_scale : 1.0, vs = fp8 ? (double)layer->v_scale : 1.0;
  /* a latent's values are read from the key cache, through the key's scale */
  const void *vcache = layer->kv_latent ? t->key_cache : t->value_cache;
  const double vread = layer->kv_latent ? ks : vs;
  const int32_t *table = cross ? t->cross->block_table : s->block_table;
  const int32_t stride = cross ? t->cross->block_table_stride : s->block_table_stride;
  for (int32_t j = w->loaded; j < n; j++) {
    double *kj = w->K + (size_t)j * Dp, *vj = w->V + (size_t)j * Dvp;
    const int64_t slot = (int64_t)table[(size_t)r * (size_t)stride + (size_t)(j / bs)] * bs + j % bs;
    for (size_t d = 0; d < D; d++)
      kj[d] =
          oracle_load(t->key_cache, layer->cache_dtype, oracle_cache_index(layer, bs, slot, g, (int32_t)d, false)) * ks;
    for (size_t d = 0; d < Dv; d++)
      vj[d] = oracle_load(vcache, layer->cache_dtype, oracle_cache_index(layer, bs, slot, g, (int32_t)d, true)) * vread;
    for (size_t d = D; d < Dp; d++) kj[d] = 0;
    for (size_t d = Dv; d < Dvp; d++) vj[d] = 0;
  }
  if (n > w->loaded) w->loaded = n;
}

/* Attention of m <= TILE items (position pos[i], query head head[i], keys [lo[i], hi[i]), queries in w->Qt)
 * against the widened K/V, written to out/lse at row dst[i]. */
static void tile_attention(const job *jb, work *w, int m, const int32_t *pos, const int32_t *head, const int32_t *lo,
                           const int32_t *hi, const int32_t *dst) {
  const uattn_layer *layer = jb->layer;
  const size_t Dp = jb->Dp, Dv = (size_t)oracle_value_dim(layer), Dvp = jb->Dvp, Hq = (size_t)layer->num_q_heads;
  const double scale = (double)layer->scale, cap = (double)layer->soft_cap;

  int32_t klo = INT32_MAX, khi = 0;
  for (int i = 0; i < m; i++) {
    if (lo[i] < hi[i]) {
      if (lo[i] < klo) klo = lo[i];
      if (hi[i] > khi) khi = hi[i];
    }
  }
  const size_t span = khi > klo ? (size_t)(khi - klo) : 0;
  /* Every item's dot product with every key of the tile's range; an item only ever reads its own range. */
  scores_tile(w->K, w->Qt, Dp, klo, khi, w->S, span);

  /* Per item: logits, their max (the sink included, so that no exp overflows), unnormalized weights. */
  double mx[TILE], sum[TILE];
  for (int i = 0; i < m; i++) {
    double *si = w->S + (size_t)i * span - klo; /* si[j] for j in [lo, hi) */
    double mi = -INFINITY;
    for (int32_t j = lo[i]; j < hi[i]; j++) {
      double x = scale * si[j];
      if (cap > 0) x = cap * tanh(x / cap);
      if (layer->alibi_slopes) x += (double)layer->alibi_slopes[head[i]] * (double)((int64_t)j - pos[i]);
      si[j] = x;
      if (x > mi) mi = x;
    }
    const double sink = layer->sinks ? (double)layer->sinks[head[i]] : -INFINITY;
    if (sink > mi) mi = sink;
    double l = 0;
    if (mi != -INFINITY) { /* -inf: no key and no sink (or every logit -inf): nothing to weigh */
      for (int32_t j = lo[i]; j < hi[i]; j++) {
        si[j] = exp(si[j] - mi);
        l += si[j];
      }
      if (layer->sinks) l += exp(sink - mi);
    }
    mx[i] = mi;
    sum[i] = l;
  }

  /* sum_j w_ij v_j, in key order per item, a block of keys at a time so that the block's value rows are
   * reused by every item; a key outside an item's range is skipped, never multiplied by 0 (0 * inf). */
  memset(w->O, 0, (size_t)TILE * Dvp * sizeof *w->O);
  for (int32_t kb = klo; kb < khi; kb += KEY_BLOCK) {
    const int32_t ke = khi - kb > KEY_BLOCK ? kb + KEY_BLOCK : khi;
    for (int i = 0; i < m; i++) {
      const int32_t a = lo[i] > kb ? lo[i] : kb, b = hi[i] < ke ? hi[i] : ke;
      if (a < b && sum[i] != 0) weighted_sum(w->O + (size_t)i * Dvp, w->S + (size_t)i * span - klo, w->V, Dvp, a, b);
    }
  }

  for (int i = 0; i < m; i++) {
    double *o = jb->out + ((size_t)dst[i] * Hq + (size_t)head[i]) * Dv;
    const double *acc = w->O + (size_t)i * Dvp;
    /* sum == 0 only when nothing was weighed; a NaN sum (NaN inputs) is passed on, not hidden */
    for (size_t d = 0; d < Dv; d++) o[d] = sum[i] == 0 ? 0.0 : acc[d] / sum[i];
    if (jb->lse) jb->lse[(size_t)dst[i] * Hq + (size_t)head[i]] = sum[i] == 0 ? mx[i] : mx[i] + log(sum[i]);
  }
}

static void run_unit(const job *jb, const unit *u, work *w) {
  const oracle_step *s = jb->s;
  const uattn_layer *layer = jb->layer;
  const size_t D = (size_t)layer->head_dim, Dp = jb->Dp;
  const int32_t Hq = layer->num_q_heads, group = Hq / layer->num_kv_heads;
  const int32_t n = num_keys(s, layer, jb->t, u->r), nc = s->num_computed[u->r], q0 = jb->qstart[u->r];

  /* keys up to the furthest one any item of the unit sees (rows are sorted: it is the last item's) */
  int32_t lo, hi;
  key_range(layer, nc + (jb->order[u->first + (u->it1 - 1) / group].row - q0), n, &lo, &hi);
  load_kv(jb, u->r, u->g, hi, w);

  for (int64_t it0 = u->it0; it0 < u->it1; it0 += TILE) {
    int32_t pos[TILE], head[TILE], klo[TILE], khi[TILE], dst[TILE];
    const int m = u->it1 - it0 < TILE ? (int)(u->it1 - it0) : TILE;
    memset(w->Qt, 0, Dp * TILE * sizeof *w->Qt);
    for (int i = 0; i < m; i++) {
      const sel *e = &jb->order[u->first + (it0 + i) / group];
      dst[i] = e->dst;
      pos[i] = nc + (e->row - q0);
      head[i] = u->g * group + (int32_t)((it0 + i) % group);
      key_range(layer, pos[i], n, &klo[i], &khi[i]);
      const size_t qoff = ((size_t)e->row * (size_t)Hq + (size_t)head[i]) * D;
      for (size_t d = 0; d < D; d++) w->Qt[d * TILE + (size_t)i] = oracle_load(jb->t->q, layer->dtype, qoff + d);
    }
    tile_attention(jb, w, m, pos, head, klo, khi, dst);
  }
}

static void *worker(void *arg) {
  void **a = arg;
  job *jb = a[0];
  work *w = a[1];
  for (;;) {
    const int32_t u = atomic_fetch_add(&jb->next, 1);
    if (u >= jb->num_units) return NULL;
    run_unit(jb, &jb->units[u], w);
  }
}

static int oracle_threads = 0; /* 0: one per online CPU */

void oracle_set_num_threads(int n) { oracle_threads = n > 0 ? n : 0; }

static void free_work(work *w) {
  free(w->K);
  free(w->V);
  free(w->Qt);
  free(w->S);
  free(w->O);
}

static int attention(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t, int32_t num_rows,
                     const int32_t *rows, double *out, double *lse) {
  int64_t num_tokens = 0;
  if (check_step_layer(s, layer, t, &num_tokens)) return -1;
  if (!out) return fail("oracle: NULL out");
  if (num_rows < 0 || (num_rows > 0 && !rows && num_rows != num_tokens))
    return fail("oracle: bad row selection (%d rows)", num_rows);
  for (int32_t i = 0; rows && i < num_rows; i++)
    if (rows[i] < 0 || rows[i] >= num_tokens)
      return fail("oracle: selected row %d outside [0, %lld)", rows[i], (long long)num_tokens);
  if (num_tokens > 0 && !t->q) return fail("oracle: NULL q");
  if (num_tokens > 0 && !is_cross(layer) && (!t->k || (!layer->kv_latent && !t->v))) return fail("oracle: NULL k or v");
  if (check_reads(s, layer, t)) return -1;
  if (num_rows == 0) return 0;

  const int32_t R = s->num_reqs, group = layer->num_q_heads / layer->num_kv_heads, Hkv = layer->num_kv_heads;
  const size_t Dp = ((size_t)layer->head_dim + 15) / 16 * 16, Dvp = ((size_t)oracle_value_dim(layer) + 15) / 16 * 16;
  int32_t max_n = 1;
  for (int32_t r = 0; r < R; r++)
    if (num_keys(s, layer, t, r) > max_n) max_n = num_keys(s, layer, t, r);

  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int nthreads = oracle_threads > 0 ? oracle_threads : (cpus > 0 ? (int)cpus : 1);
  if (nthreads > 64) nthreads = 64;

  sel *order = malloc((size_t)num_rows * sizeof *order);
  int32_t *qstart = malloc(((size_t)R + 1) * sizeof *qstart);
  unit *units = NULL;
  work *ws = calloc((size_t)nthreads, sizeof *ws);
  int rc = 0;
  if (!order || !qstart || !ws) {
    rc = fail("oracle: out of memory");
    goto done;
  }
  for (int32_t i = 0; i < num_rows; i++) order[i] = (sel){rows ? rows[i] : i, i};
  qsort(order, (size_t)num_rows, sizeof *order, cmp_sel);

  /* Units: per request with selected rows, per KV head, UNIT_ITEMS items at a time. */
  int64_t num_units = 0;
  for (int pass = 0; pass < 2; pass++) {
    int64_t k = 0;
    int32_t next = 0, q0 = 0;
    for (int32_t r = 0; r < R; q0 += s->num_scheduled[r], r++) {
      qstart[r] = q0;
      const int32_t first = next;
      while (next < num_rows && order[next].row < q0 + s->num_scheduled[r]) next++;
      const int64_t items = (int64_t)(next - first) * group;
      for (int32_t g = 0; g < Hkv; g++)
        for (int64_t it = 0; it < items; it += UNIT_ITEMS, k++)
          if (pass == 1) units[k] = (unit){r, g, first, it, items - it < UNIT_ITEMS ? items : it + UNIT_ITEMS};
    }
    if (pass == 0) {
      num_units = k;
      units = malloc((size_t)num_units * sizeof *units);
      if (!units) {
        rc = fail("oracle: out of memory");
        goto done;
      }
    }
  }
  if (num_units > INT32_MAX) {
    rc = fail("oracle: %lld units of work", (long long)num_units);
    goto done;
  }
  if (nthreads > num_units) nthreads = (int)num_units;
  for (int i = 0; i < nthreads; i++) {
    work *w = &ws[i];
    w->K = malloc((size_t)max_n * Dp * sizeof(double));
    w->V = malloc((size_t)max_n * Dvp * sizeof(double));
    w->Qt = malloc(Dp * TILE * sizeof(double));
    w->S = malloc((size_t)TILE * (size_t)max_n * sizeof(double));
    w->O = malloc((size_t)TILE * Dvp * sizeof(double));
    w->r = -1;
    if (!w->K || !w->V || !w->Qt || !w->S || !w->O) {
      rc = fail("oracle: out of memory (%d keys, %d threads)", max_n, nthreads);
      goto done;
    }
  }

  job jb = {.s = s,
            .layer = layer,
            .t = t,
            .order = order,
            .qstart = qstart,
            .units = units,
            .num_units = (int32_t)num_units,
            .Dp = Dp,
            .Dvp = Dvp,
            .out = out,
            .lse = lse};
  atomic_init(&jb.next, 0);
  /* Threads only share out the units: each item's arithmetic is the same whichever thread runs it. A
   * thread that cannot be started just leaves its share to the others (this one always works). */
  pthread_t tid[64];
  void *args[64][2];
  bool started[64] = {false};
  for (int i = 1; i < nthreads; i++) {
    args[i][0] = &jb;
    args[i][1] = &ws[i];
    started[i] = pthread_create(&tid[i], NULL, worker, args[i]) == 0;
  }
  args[0][0] = &jb;
  args[0][1] = &ws[0];
  worker(args[0]);
  for (int i = 1; i < nthreads; i++)
    if (started[i]) pthread_join(tid[i], NULL);

done:
  if (ws)
    for (int i = 0; i < nthreads; i++) free_work(&ws[i]);
  free(ws);
  free(units);
  free(qstart);
  free(order);
  return rc;
}

int oracle_attention(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t, double *out, double *lse) {
  int64_t num_tokens = 0;
  if (check_step_layer(s, layer, t, &num_tokens)) return -1;
  return attention(s, layer, t, (int32_t)num_tokens, NULL, out, lse);
}

int oracle_attention_rows(const oracle_step *s, const uattn_layer *layer, const uattn_tensors *t, int32_t num_rows,
                          const int32_t *rows, double *out, double *lse) {
  if (num_rows > 0 && !rows) return fail("oracle: NULL rows");
  return attention(s, layer, t, num_rows, rows, out, lse);
}
