/* Context parallelism (uattn.h: uattn_plan_config.cp_size): a rank's plan and forward over its share of the
 * caches, merged over the ranks with uattn_merge_states, against the single-rank forward and the dense fp64
 * oracle, for every batch kind, dtype, layout and feature; the ranks' cache writes; the convention against
 * the seed's get_dcp_local_seq_lens.
 *
 * Tolerances. Each rank's forward gives its partial in fp32 (uattn_tensors.out_f32), whatever the layer's
 * dtype, and so does the single-rank forward it is held to. The ranks compute the same products as the
 * single rank (the same fp32 scores, weights and values), only the fp32 sums are grouped otherwise (each rank
 * has its own running max and sum over its keys), plus one more fp32 merge (uattn_merge_states' rescaling by
 * exp(lse_i - lse)): a few fp32 roundings apart, so the merged fp32 result is within 1e-5 of the largest
 * output of the single-rank fp32 one for every dtype (the library's fp32 tolerance,
 * tests/common/attention_case.c). The merged result is then rounded once to the layer's dtype, as the
 * single-rank forward's own output is: two roundings to nearest of fp32 values that close differ by at most
 * that difference plus one ulp of the dtype at the element's magnitude, checked element by element against
 * the single-rank dtype output; and against the oracle the rounded result has the forward's own tolerance
 * (attention_tolerance), as it is rounded once, as the forward's output is. Not so where the kernels round
 * the softmax weights P to bf16 (the avx512bf16 level's default for bf16 layers on bf16 caches): the rounding
 * depends on the grouping, so the products differ, by up to 2^-8 max |v| in each result (cp_case_p); such a
 * case runs twice, as it is with that term added to the bounds, and with probs_fp32 under the bounds above. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/attention_case.h"
#include "common/case_names.h"
#include "uattn_vllm.h"
#include "support/requests.h"

#define CP_MAX_RANKS 4

/* The convention, stated apart from the library's code: position p is on rank (p / I) % N at local
 * position (p / (I * N)) * I + p % I. */
static bool cp_owns(int32_t n, int32_t rank, int32_t il, int32_t p) { return (p / il) % n == rank; }
static int32_t cp_local(int32_t n, int32_t il, int32_t p) { return p / (il * n) * il + p % il; }

/* Keys of [0, len) on a rank, counted one position at a time. */
static int32_t cp_count(int32_t n, int32_t rank, int32_t il, int32_t len) {
  int32_t k = 0;
  for (int32_t p = 0; p < len; p++) k += cp_owns(n, rank, il, p);
  return k;
}

/* The global position of a rank's local position: the local run local / I is the rank's (local / I)-th, in
 * round local / I of N runs. Checked to be the inverse of cp_local on the rank. */
static int32_t cp_global(int32_t n, int32_t rank, int32_t il, int32_t local) {
  const int32_t p = local / il * il * n + rank * il + local % il;
  cr_assert(cp_owns(n, rank, il, p) && cp_local(n, il, p) == local, "cp_global(%d) = %d is not the inverse", local, p);
  return p;
}

/* One rank's share of a run: its block tables over local positions and its caches. A local block takes the
 * id of an earlier one whose every slot mirrors the same global slot (a shared prefix stays shared). */
typedef struct cp_rank {
  int32_t n, rank, il;
  int32_t num_blocks;
  int32_t table[RB_MAX_REQS * RB_MAX_LEN];
  int32_t cross_table[RB_MAX_REQS * 64];
  int64_t *mirror; /* [num_blocks * block size]: the global slot a local slot holds, or < 0 */
  size_t cache_bytes;
  uattn_plan *plan;
} cp_rank;

/* The global slot of position g of a row of block ids, or a value < 0 unique to (row, g) when unmapped. */
static int64_t global_slot(const int32_t *row, int32_t row_len, int32_t bs, int32_t row_id, int32_t g) {
  const int32_t b = g / bs < row_len ? row[g / bs] : -1;
  return b >= 0 ? (int64_t)b * bs + g % bs : -1 - ((int64_t)row_id * 4 * RB_MAX_LEN + g);
}

/* Local blocks [0, blocks) of one row: ids into out, each slot's global slot into the rank's mirror. */
static void localize_row(cp_rank *k, int32_t bs, const int32_t *row, int32_t row_len, int32_t row_id, int32_t blocks,
                         int32_t *out, int64_t *keys) {
  for (int32_t j = 0; j < blocks; j++) {
    int64_t *key = keys + (size_t)k->num_blocks * bs;
    for (int32_t o = 0; o < bs; o++)
      key[o] = global_slot(row, row_len, bs, row_id, cp_global(k->n, k->rank, k->il, j * bs + o));
    int32_t id = -1;
    for (int32_t b = 0; b < k->num_blocks && id < 0; b++)
      if (memcmp(keys + (size_t)b * bs, key, sizeof *key * (size_t)bs) == 0) id = b;
    out[j] = id >= 0 ? id : k->num_blocks++;
  }
}

/* Copies the global caches' slots into a rank's caches by its mirror (unmapped slots: zero). */
static void mirror_caches(const attention_run *run, const cp_rank *k, const void *gk, const void *gv, void *lk,
                          void *lv) {
  const uattn_layer *L = &run->layer;
  const size_t esz = oracle_dtype_size(L->cache_dtype);
  const int32_t bs = run->c.block_size;
  memset(lk, 0, k->cache_bytes);
  memset(lv, 0, k->cache_bytes);
  for (int64_t s = 0; s < (int64_t)k->num_blocks * bs; s++) {
    if (k->mirror[s] < 0) continue;
    /* element by element: a TILED cache's key or value row is not contiguous */
    for (int32_t h = 0; h < L->num_kv_heads; h++)
      for (int32_t d = 0; d < L->head_dim; d++) {
        memcpy((char *)lk + oracle_cache_index(L, bs, s, h, d, false) * esz,
               (const char *)gk + oracle_cache_index(L, bs, k->mirror[s], h, d, false) * esz, esz);
        memcpy((char *)lv + oracle_cache_index(L, bs, s, h, d, true) * esz,
               (const char *)gv + oracle_cache_index(L, bs, k->mirror[s], h, d, true) * esz, esz);
      }
  }
}

/* Builds rank `rank` of n (interleave il) for a run: tables, mirror and plan. */
static void cp_rank_build(cp_rank *k, const attention_run *run, int32_t n, int32_t rank, int32_t il) {
  memset(k, 0, sizeof *k);
  k->n = n, k->rank = rank, k->il = il;
  const rb_batch *b = &run->batch;
  const int32_t bs = run->c.block_size;
  int32_t effective[RB_MAX_REQS];
  attention_oracle_step(run, effective);
  const size_t cap = (size_t)RB_MAX_REQS * 2 * (RB_MAX_LEN / bs + 2);
  int64_t *keys = malloc(sizeof(int64_t) * cap * bs);
  for (int32_t i = 0; i < b->num_reqs * b->stride; i++) k->table[i] = -1;
  for (int32_t r = 0; r < b->num_reqs; r++) {
    const int32_t len = cp_count(n, rank, il, b->num_computed[r] + effective[r]);
    localize_row(k, bs, b->block_table + (size_t)r * b->stride, b->stride, r, (len + bs - 1) / bs,
                 k->table + (size_t)r * b->stride, keys);
  }
  if (run->c.attn_type == UATTN_ATTENTION_ENCODER_DECODER)
    for (int32_t r = 0; r < b->num_reqs; r++) {
      const int32_t len = cp_count(n, rank, il, run->encoder_lens[r]);
      localize_row(k, bs, run->cross_table + r * 64, 64, RB_MAX_REQS + r, (len + bs - 1) / bs, k->cross_table + r * 64,
                   keys);
    }
  k->num_blocks++; /* one block nobody uses */
  k->mirror = malloc(sizeof(int64_t) * (size_t)k->num_blocks * bs);
  memcpy(k->mirror, keys, sizeof(int64_t) * (size_t)(k->num_blocks - 1) * bs);
  for (int32_t o = 0; o < bs; o++) k->mirror[(size_t)(k->num_blocks - 1) * bs + o] = -1;
  free(keys);
  k->cache_bytes =
      (size_t)k->num_blocks * bs * run->c.num_kv_heads * run->c.head_dim * oracle_dtype_size(run->c.cache_dtype);

  uattn_plan_config pc = uattn_plan_config_default(bs, k->num_blocks, RB_MAX_REQS, RB_MAX_TOKENS, RB_MAX_LEN);
  pc.split_min_keys = run->c.split_min_keys;
  pc.split_keys = run->c.split_keys;
  pc.cp_size = n, pc.cp_rank = rank, pc.cp_interleave = il;
  cr_assert_eq(uattn_plan_create(&pc, &k->plan), UATTN_OK, "%s: %s", run->c.name, uattn_last_error());
  uattn_step step = rb_step(b);
  step.block_table = k->table;
  cr_assert_eq(uattn_plan_step(k->plan, &step), UATTN_OK, "%s (N %d, I %d, rank %d): %s", run->c.name, n, il, rank,
               uattn_last_error());
}

static void cp_rank_free(cp_rank *k) {
  uattn_plan_destroy(k->plan);
  free(k->mirror);
}

/* A rank's forward: its fp32 partial outputs (out_f32) and lse, its caches after the step checked against
 * the global ones after the single-rank step (gk, gv), seen through its mirror: its tokens' writes land at
 * their local slots, nothing else changes. */
static void cp_rank_forward(const attention_run *run, cp_rank *k, const void *gk, const void *gv, uattn_runtime *rt,
                            float *out, float *lse) {
  const attention_case *c = &run->c;
  const int32_t T = run->info.num_tokens, Hq = c->num_q_heads, D = c->head_dim, bs = c->block_size;
  uattn_plan_info info;
  uattn_plan_get_info(k->plan, &info);
  for (int32_t row = 0; row < T; row++) { /* the slot mapping writes exactly the rank's tokens */
    const int32_t p = info.token_positions[row], r = info.token_groups[row];
    const int32_t local = cp_local(k->n, k->il, p);
    const int64_t want =
        cp_owns(k->n, k->rank, k->il, p) ? (int64_t)k->table[r * run->batch.stride + local / bs] * bs + local % bs : -1;
    cr_assert_eq(info.slot_mapping[row], want, "%s: rank %d row %d slot %lld, want %lld", c->name, k->rank, row,
                 (long long)info.slot_mapping[row], (long long)want);
  }
  uattn_tensors t = attention_tensors(run);
  attention_tensors_out_f32(run, &t);
  free(t.key_cache);
  free(t.value_cache);
  t.key_cache = malloc(k->cache_bytes + 1);
  t.value_cache = malloc(k->cache_bytes + 1);
  t.num_blocks = k->num_blocks;
  mirror_caches(run, k, run->key_cache0, run->value_cache0, t.key_cache, t.value_cache);
  uattn_cross cross = {run->encoder_lens, k->cross_table, 64};
  if (t.cross) t.cross = &cross;
  cr_assert_eq(uattn_forward(k->plan, &run->layer, &t, rt), UATTN_OK, "%s: %s", c->name, uattn_last_error());

  void *wk = malloc(k->cache_bytes + 1), *wv = malloc(k->cache_bytes + 1);
  mirror_caches(run, k, gk, gv, wk, wv);
  cr_assert_eq(memcmp(t.key_cache, wk, k->cache_bytes), 0, "%s: rank %d's key cache after the step", c->name, k->rank);
  cr_assert_eq(memcmp(t.value_cache, wv, k->cache_bytes), 0, "%s: rank %d's value cache", c->name, k->rank);
  free(wk);
  free(wv);
  for (size_t i = 0; i < (size_t)T * Hq; i++) {
    lse[i] = t.lse[i];
    for (int32_t d = 0; d < D; d++) {
      out[i * D + d] = ((const float *)t.out)[i * D + d];
      /* a row with no key on this rank: zeros and lse -inf */
      if (isinf(lse[i]) && lse[i] < 0) cr_assert_eq(out[i * D + d], 0.0f, "%s: empty row not zero", c->name);
    }
  }
  attention_tensors_free(&t);
}

/* Largest |a - b| against the largest |b|: fails past tol of it plus abs_tol. */
static double check_close(const char *what, const attention_case *c, int32_t n, int32_t il, const float *got,
                          const double *want, size_t count, double tol, double abs_tol) {
  double scale = 0.0, err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < count; i++) scale = fmax(scale, fabs(want[i]));
  for (size_t i = 0; i < count; i++) {
    cr_assert(!isnan(got[i]), "%s: NaN", c->name);
    if (fabs(got[i] - want[i]) > err) err = fabs(got[i] - want[i]), worst = i;
  }
  const size_t D = (size_t)c->head_dim, Hq = (size_t)c->num_q_heads;
  cr_assert(err <= tol * fmax(scale, 1e-30) + abs_tol,
            "%s, N %d, I %d: merged output %.3g from %s (tolerance %.1g x %.3g + %.3g) at row %zu, head %zu, dim %zu: "
            "%.9g, want %.9g",
            c->name, n, il, err, what, tol, scale, abs_tol, worst / D / Hq, worst / D % Hq, worst % D, got[worst],
            want[worst]);
  return err / fmax(scale, 1e-30);
}

/* The spacing of `dtype`'s values at magnitude x (one ulp): 8, 11 and 24 significant bits; f16's subnormal
 * spacing 2^-24 below its smallest normal. */
static double dtype_ulp(uattn_dtype dtype, double x) {
  int e;
  frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
  const int bits = dtype == UATTN_BF16 ? 8 : dtype == UATTN_F16 ? 11 : 24;
  const int lowest = dtype == UATTN_BF16 ? -133 : dtype == UATTN_F16 ? -24 : -149;
  return ldexp(1.0, e - bits > lowest ? e - bits : lowest);
}

/* The merged result rounded once to the layer's dtype (rounded) against the single-rank forward's output in
 * that dtype (want): element by element within the fp32 results' tolerance (tol32 of the largest output plus
 * abs_tol) plus one ulp of the dtype at the larger of the two. Returns how many elements differ. */
static size_t check_rounded(const attention_case *c, int32_t n, int32_t il, const float *rounded, const double *want,
                            size_t count, double tol32, double abs_tol) {
  double scale = 0.0;
  size_t differ = 0;
  for (size_t i = 0; i < count; i++) scale = fmax(scale, fabs(want[i]));
  for (size_t i = 0; i < count; i++) {
    const double ulp = dtype_ulp(c->dtype, fmax(fabs(rounded[i]), fabs(want[i]))), e = fabs(rounded[i] - want[i]);
    cr_assert(e <= tol32 * scale + abs_tol + ulp,
              "%s, N %d, I %d: rounded merged out[%zu] = %.9g, the single rank's %.9g", c->name, n, il, i, rounded[i],
              want[i]);
    differ += e != 0;
  }
  return differ;
}

static void check_lse(const char *what, const attention_case *c, int32_t n, int32_t il, const float *got,
                      const double *want, size_t count, double tol) {
  for (size_t i = 0; i < count; i++) {
    if (isinf(want[i])) {
      cr_assert(got[i] == want[i], "%s, N %d, I %d: lse[%zu] = %g, %s %g", c->name, n, il, i, got[i], what, want[i]);
      continue;
    }
    cr_assert(fabs(got[i] - want[i]) <= 10 * tol * fmax(1.0, fabs(want[i])) + 1e-5,
              "%s, N %d, I %d: lse[%zu] = %.7g, %s %.7g", c->name, n, il, i, got[i], what, want[i]);
  }
}

/* Seen in a test, for its log: the merged fp32 result's error against the single rank's fp32 result and
 * the rounded one's against the oracle (of the largest output), the elements where the rounded one and the
 * single rank's dtype output differ; [1]: runs with P rounded to bf16 (see cp_case). */
static double worst_vs_single[2], worst_vs_oracle[2];
static size_t rounded_differ[2], rounded_count[2];

/* Every N in 1..4 and interleave in `ils` for one case, with the layer's probs_fp32 as given; true when its
 * kernels round P to bf16 (the avx512bf16 level with probs_fp32 false). */
static bool cp_case_p(const attention_case *c, const int32_t *ils, int32_t num_ils, bool probs_fp32) {
  attention_run run;
  attention_run_build(&run, c);
  run.layer.probs_fp32 = probs_fp32;
  uattn_kernel_report kr;
  cr_assert_eq(uattn_describe_kernels(&run.layer, c->block_size, &kr), UATTN_OK, "%s", uattn_last_error());
  const bool p_bf16 = attention_contract(kr.kernel_set, run.layer.dtype, run.layer.cache_dtype, probs_fp32).abs > 0;
  /* P in bf16: each weight p_j is rounded to bf16 relative to its tile's running max, which the ranks'
   * groupings of keys change, so the products are no longer the same ones: each result is within 2^-8
   * sum_j p_j |v_j| / l <= 2^-8 max |v| = 2^-8 (values in [-1, 1]) of its P-in-fp32 value
   * (tests/attention/test_attention.c, the bf16 level), and two of them within twice that */
  const double p_abs = p_bf16 ? 0x1p-7 : 0.0, p_oracle = p_bf16 ? 0x1p-8 : 0.0;
  const int32_t T = run.info.num_tokens, Hq = c->num_q_heads, D = c->head_dim;
  const size_t rows = (size_t)T * Hq, elems = rows * D;
  /* the single rank: its output in the layer's dtype (and its caches after the step), and in fp32 */
  uattn_tensors single = attention_run_forward(&run, NULL), single32 = attention_tensors(&run);
  attention_tensors_out_f32(&run, &single32);
  cr_assert_eq(uattn_forward(run.plan, &run.layer, &single32, NULL), UATTN_OK, "%s: %s", c->name, uattn_last_error());
  double *s_out = malloc(sizeof(double) * (elems + 1)), *s_out32 = malloc(sizeof(double) * (elems + 1));
  double *s_lse = malloc(sizeof(double) * (rows + 1));
  double *o_out = malloc(sizeof(double) * (elems + 1)), *o_lse = malloc(sizeof(double) * (rows + 1));
  for (size_t i = 0; i < elems; i++) {
    s_out[i] = oracle_load(single.out, c->dtype, i);
    s_out32[i] = ((const float *)single32.out)[i];
  }
  for (size_t i = 0; i < rows; i++) s_lse[i] = single32.lse[i];
  uattn_tensors ref = attention_tensors(&run);
  int32_t effective[RB_MAX_REQS];
  const oracle_step os = attention_oracle_step(&run, effective);
  cr_assert_eq(oracle_write_cache(&os, &run.layer, &ref), 0, "%s: oracle: %s", c->name, oracle_last_error());
  cr_assert_eq(oracle_attention(&os, &run.layer, &ref, o_out, o_lse), 0, "%s: %s", c->name, oracle_last_error());
  attention_tensors_free(&ref);

  float *outs[CP_MAX_RANKS], *lses[CP_MAX_RANKS], *merged = malloc(sizeof(float) * (elems + 1)),
                                                  *merged_lse = malloc(sizeof(float) * (rows + 1)),
                                                  *rounded = malloc(sizeof(float) * (elems + 1));
  for (int32_t i = 0; i < CP_MAX_RANKS; i++) {
    outs[i] = malloc(sizeof(float) * (elems + 1));
    lses[i] = malloc(sizeof(float) * (rows + 1));
  }
  const double tol32 = 1e-5, oracle_tol = attention_tolerance(c->dtype, c->cache_dtype);
  static cp_rank ranks[CP_MAX_RANKS]; /* large: off the stack */
  for (int32_t n = 1; n <= CP_MAX_RANKS; n++)
    for (int32_t x = 0; x < num_ils; x++) {
      for (int32_t rank = 0; rank < n; rank++) {
        cp_rank_build(&ranks[rank], &run, n, rank, ils[x]);
        cp_rank_forward(&run, &ranks[rank], single.key_cache, single.value_cache, NULL, outs[rank], lses[rank]);
        cp_rank_free(&ranks[rank]);
      }
      if (T == 0) continue;
      cr_assert_eq(
          uattn_merge_states(n, (const float *const *)outs, (const float *const *)lses, T, Hq, D, merged, merged_lse),
          UATTN_OK, "%s", uattn_last_error());
      /* the one rounding to the dtype (a dtype value is a float: exact) */
      for (size_t i = 0; i < elems; i++) rounded[i] = (float)oracle_round(c->dtype, merged[i]);
      worst_vs_single[p_bf16] = fmax(worst_vs_single[p_bf16], check_close("the single rank's fp32", c, n, ils[x],
                                                                          merged, s_out32, elems, tol32, p_abs));
      const size_t differ = check_rounded(c, n, ils[x], rounded, s_out, elems, tol32, p_abs);
      if (c->dtype != UATTN_F32) rounded_differ[p_bf16] += differ, rounded_count[p_bf16] += elems;
      worst_vs_oracle[p_bf16] = fmax(worst_vs_oracle[p_bf16], check_close("the oracle's", c, n, ils[x], rounded, o_out,
                                                                          elems, oracle_tol, p_oracle));
      check_lse("the single rank's", c, n, ils[x], merged_lse, s_lse, rows, tol32);
      check_lse("the oracle's", c, n, ils[x], merged_lse, o_lse, rows, oracle_tol);
    }
  for (int32_t i = 0; i < CP_MAX_RANKS; i++) {
    free(outs[i]);
    free(lses[i]);
  }
  free(merged);
  free(merged_lse);
  free(s_out);
  free(s_out32);
  free(s_lse);
  free(rounded);
  free(o_out);
  free(o_lse);
  attention_tensors_free(&single);
  attention_tensors_free(&single32);
  attention_run_free(&run);
  return p_bf16;
}

/* A case as its layer is (probs_fp32 false), and where its kernels round P to bf16, once more with P in
 * fp32, where the 1e-5 bound holds. */
static void cp_case(const attention_case *c, const int32_t *ils, int32_t num_ils) {
  if (cp_case_p(c, ils, num_ils, false)) cp_case_p(c, ils, num_ils, true);
}

/* Interleaves: 1 (vLLM's default), runs shorter than a block and one that divides no block size here (3),
 * a whole block (16) and one that does not divide it (24). */
static const int32_t interleaves[] = {1, 3, 16, 24};
#define NUM_INTERLEAVES ((int32_t)(sizeof interleaves / sizeof *interleaves))

/* clang-format off */
/* name, kind, bs, Hq, Hkv, D, dtype, cache dtype, layout, type, soft cap, window, sinks, alibi, chunk, width, seed,
 * split_min_keys, split_keys, k_scale, v_scale */
static const attention_case kinds[] = {
    {"decode",         BATCH_DECODE,         16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 101},
    {"prefill",        BATCH_PREFILL,        16, 8, 2, 64, F32, F32, HND, DEC, 0, 0, 0, 0, 0, 0, 102},
    {"prefix prefill", BATCH_PREFIX_PREFILL, 16, 4, 4, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 103},
    {"chunked",        BATCH_CHUNKED_LONG,   16, 8, 2, 64, F32, F32, HND, DEC, 0, 0, 0, 0, 0, 0, 104},
    {"mixed",          BATCH_MIXED,          16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 7, 105},
    {"spec decode",    BATCH_SPEC_DECODE,    16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 106},
    {"shared prefix",  BATCH_SHARED_PREFIX,  16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 107},
    {"shared, chunks", BATCH_SHARED_PREFIX,  16, 8, 8, 64, F32, F32, HND, DEC, 0, 0, 0, 0, 2, 0, 108},
    {"split-K",        BATCH_SPEC_DECODE,    16, 8, 2, 64, F32, F32, NHD, DEC, 0, 0, 0, 0, 0, 0, 109, 64, 48},
};

static const attention_case dtypes[] = {
    {"bf16",             BATCH_MIXED,         16, 8, 2, 64,  BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 111},
    {"bf16 bucket",      BATCH_SHARED_PREFIX, 16, 8, 2, 128, BF16, BF16, NHD, DEC, 0, 0, 0, 0, 0, 0, 112},
    {"f16",              BATCH_SPEC_DECODE,   16, 8, 2, 64,  F16,  F16,  HND, DEC, 0, 0, 0, 0, 0, 0, 113},
    {"f32 over bf16",    BATCH_MIXED,         16, 8, 2, 64,  F32,  BF16, HND, DEC, 0, 0, 0, 0, 0, 0, 114},
    {"fp8 e4m3",         BATCH_MIXED,         16, 8, 2, 64,  F32,  E4M3, NHD, DEC, 0, 0, 0, 0, 0, 0, 115, 0, 0, 0.5f, 3},
    {"fp8 e5m2, bf16 in", BATCH_CHUNKED_LONG, 16, 8, 2, 64,  BF16, E5M2, HND, DEC, 0, 0, 0, 0, 0, 0, 116, 0, 0, 3, 0.5f},
    {"TILED, mixed",     BATCH_MIXED,         32, 8, 2, 64,  F32,  F32,  TILED, DEC, 0, 0, 0, 0, 0, 0, 117},
    {"TILED bf16, split-K", BATCH_SPEC_DECODE, 16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 1, 0, 0, 0, 118, 64, 48},
    {"TILED fp8 e4m3, shared", BATCH_SHARED_PREFIX, 16, 8, 2, 64, BF16, E4M3, TILED, DEC, 0, 0, 0, 0, 2, 0, 119, 0, 0, 0.5f, 3},
};

static const attention_case features[] = {
    {"window",           BATCH_MIXED,         16, 8, 2, 64, F32, F32, NHD, DEC, 0,  37, 0, 0, 0, 0, 121},
    {"window, decodes",  BATCH_SPEC_DECODE,   16, 8, 2, 64, F32, F32, NHD, DEC, 0,  9,  0, 0, 0, 0, 122},
    {"soft cap",         BATCH_MIXED,         16, 8, 2, 64, F32, F32, HND, DEC, 5,  0,  0, 0, 0, 0, 123},
    {"sinks",            BATCH_MIXED,         16, 8, 2, 64, F32, F32, NHD, DEC, 0,  0,  1, 0, 0, 0, 124},
    {"alibi",            BATCH_MIXED,         16, 8, 2, 64, F32, F32, HND, DEC, 0,  0,  0, 1, 0, 0, 125},
    {"alibi, shared",    BATCH_SHARED_PREFIX, 16, 8, 2, 64, F32, F32, NHD, DEC, 0,  0,  0, 1, 0, 0, 126},
    {"everything",       BATCH_MIXED,         16, 8, 2, 64, F32, F32, NHD, DEC, 20, 13, 1, 1, 0, 5, 127},
    {"encoder",          BATCH_MIXED,         16, 8, 2, 64, F32, F32, NHD, ENC, 0,  0,  1, 1, 0, 0, 128},
    {"encoder only",     BATCH_PREFIX_PREFILL,16, 8, 2, 64, F32, F32, HND, ENC_ONLY, 0, 0, 1, 1, 0, 0, 129},
    {"cross",            BATCH_MIXED,         16, 8, 2, 64, F32, F32, NHD, CROSS, 0, 0, 1, 0, 0, 0, 130},
    /* ALiBi's pieces load TILED blocks from any key, odd ones included (load_tiled) */
    {"TILED bf16, alibi", BATCH_MIXED,        16, 8, 2, 64, BF16, BF16, TILED, DEC, 0, 0, 0, 1, 0, 0, 131},
    {"TILED fp8 e5m2, alibi, shared", BATCH_SHARED_PREFIX, 32, 8, 2, 64, BF16, E5M2, TILED, DEC, 0, 0, 0, 1, 0, 0, 132, 0, 0, 2, 0.25f},
};
/* clang-format on */

static void report_worst(void) {
  for (int p = 0; p < 2; p++)
    if (worst_vs_single[p] > 0 || rounded_count[p])
      fprintf(stderr,
              "P in %s: merged fp32 vs the single rank's fp32: %.3g, rounded once vs the oracle: %.3g of the largest "
              "output; rounded vs the single rank's bf16 / f16 output: %zu of %zu elements differ\n",
              p ? "bf16" : "fp32", worst_vs_single[p], worst_vs_oracle[p], rounded_differ[p], rounded_count[p]);
}

Test(cp, every_kind_of_batch, .timeout = 600) {
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) cp_case(&kinds[i], interleaves, NUM_INTERLEAVES);
  report_worst();
}

Test(cp, dtypes_and_layouts, .timeout = 600) {
  for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++) cp_case(&dtypes[i], interleaves, NUM_INTERLEAVES);
  report_worst();
}

Test(cp, features, .timeout = 600) {
  for (size_t i = 0; i < sizeof features / sizeof *features; i++) cp_case(&features[i], interleaves, NUM_INTERLEAVES);
  report_worst();
}

/* cp_size 1, given explicitly (with an interleave, which then means nothing), is today's forward bit for bit. */
Test(cp, one_rank_is_the_plain_forward_bit_for_bit, .timeout = 300) {
  const attention_case *all[] = {&kinds[4], &kinds[6], &kinds[8], &dtypes[0], &features[6], &features[9]};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    attention_run run;
    attention_run_build(&run, all[i]);
    uattn_tensors plain = attention_run_forward(&run, NULL);
    uattn_plan_config pc =
        uattn_plan_config_default(all[i]->block_size, run.num_blocks, RB_MAX_REQS, RB_MAX_TOKENS, RB_MAX_LEN);
    pc.split_min_keys = all[i]->split_min_keys;
    pc.split_keys = all[i]->split_keys;
    pc.cp_size = 1, pc.cp_rank = 0, pc.cp_interleave = 7;
    uattn_plan *plan;
    cr_assert_eq(uattn_plan_create(&pc, &plan), UATTN_OK, "%s", uattn_last_error());
    uattn_step step = rb_step(&run.batch);
    cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
    uattn_plan_destroy(run.plan);
    run.plan = plan;
    uattn_tensors cp = attention_run_forward(&run, NULL);
    cr_assert_eq(memcmp(plain.out, cp.out, run.out_bytes), 0, "%s: out", all[i]->name);
    cr_assert_eq(memcmp(plain.lse, cp.lse, sizeof(float) * run.info.num_tokens * all[i]->num_q_heads), 0, "%s: lse",
                 all[i]->name);
    cr_assert_eq(memcmp(plain.key_cache, cp.key_cache, run.cache_bytes), 0, "%s: key cache", all[i]->name);
    cr_assert_eq(memcmp(plain.value_cache, cp.value_cache, run.cache_bytes), 0, "%s: value cache", all[i]->name);
    attention_tensors_free(&plain);
    attention_tensors_free(&cp);
    attention_run_free(&run);
  }
}

/* A rank's partial does not depend on the thread count: 1 and 3 threads, bit for bit. */
Test(cp, bitwise_identical_for_any_thread_count, .timeout = 300) {
  const attention_case *all[] = {&kinds[4], &kinds[8], &features[4], &features[6]};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    attention_run run;
    attention_run_build(&run, all[i]);
    uattn_tensors single = attention_run_forward(&run, NULL);
    const size_t rows = (size_t)run.info.num_tokens * all[i]->num_q_heads, elems = rows * all[i]->head_dim;
    float *out1 = malloc(sizeof(float) * (elems + 1)), *lse1 = malloc(sizeof(float) * (rows + 1));
    float *out3 = malloc(sizeof(float) * (elems + 1)), *lse3 = malloc(sizeof(float) * (rows + 1));
    uattn_runtime_config cfg = uattn_runtime_config_default();
    cfg.num_threads = 3;
    uattn_runtime *rt;
    cr_assert_eq(uattn_runtime_create(&cfg, &rt), UATTN_OK, "%s", uattn_last_error());
    static cp_rank k;
    for (int32_t rank = 0; rank < 3; rank++) {
      cp_rank_build(&k, &run, 3, rank, 5);
      cp_rank_forward(&run, &k, single.key_cache, single.value_cache, NULL, out1, lse1);
      cp_rank_forward(&run, &k, single.key_cache, single.value_cache, rt, out3, lse3);
      cr_assert_eq(memcmp(out1, out3, sizeof(float) * elems), 0, "%s: rank %d's out", all[i]->name, rank);
      cr_assert_eq(memcmp(lse1, lse3, sizeof(float) * rows), 0, "%s: rank %d's lse", all[i]->name, rank);
      cp_rank_free(&k);
    }
    uattn_runtime_destroy(rt);
    free(out1);
    free(lse1);
    free(out3);
    free(lse3);
    attention_tensors_free(&single);
    attention_run_free(&run);
  }
}

/* A decode of sequence length S planned on a rank: its row's context (token_context_lens) is the rank's
 * local length of S. */
static int32_t planned_local_len(int32_t n, int32_t rank, int32_t il, int32_t s) {
  uattn_plan_config pc = uattn_plan_config_default(4, 64, 1, 1, 256);
  pc.cp_size = n, pc.cp_rank = rank, pc.cp_interleave = il;
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&pc, &plan), UATTN_OK, "%s", uattn_last_error());
  int32_t nc = s - 1, ns = 1, np = 1, table[64];
  for (int32_t i = 0; i < 64; i++) table[i] = i;
  const uattn_step step = step_requests(1, &nc, &ns, &np, table, 64);
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info info;
  uattn_plan_get_info(plan, &info);
  const int32_t len = info.token_context_lens[0];
  uattn_plan_destroy(plan);
  return len;
}

/* The convention's local lengths against the seed's get_dcp_local_seq_lens: its numpy re-statement
 * (tests/ref/vllm_utils_ref.py), the library's uattn_compute_dcp_local_seq_lens, and positions counted one
 * by one; and the plan's. */
Test(cp, local_lengths_are_the_seeds, .timeout = 300) {
  enum { MAX_N = 5, MAX_I = 6, MAX_S = 100 };
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s -c 'import sys; sys.path.insert(0, \"%s/ref\"); from vllm_utils_ref import get_dcp_local_seq_lens as f\n"
           "for n in range(1, %d):\n for i in range(1, %d):\n  print(*f(list(range(1, %d)), n, None, i))'",
           test_env("UATTN_PYTHON", "/usr/bin/python3"), test_env("UATTN_TESTS_DIR", "tests"), MAX_N + 1, MAX_I + 1,
           MAX_S + 1);
  FILE *py = popen(cmd, "r");
  cr_assert(py, "cannot run %s", cmd);
  int32_t seq_lens[MAX_S], lib[MAX_S * MAX_N];
  for (int32_t s = 1; s <= MAX_S; s++) seq_lens[s - 1] = s;
  for (int32_t n = 1; n <= MAX_N; n++)
    for (int32_t il = 1; il <= MAX_I; il++) {
      cr_assert_eq(uattn_compute_dcp_local_seq_lens(seq_lens, MAX_S, n, -1, il, lib, MAX_S * MAX_N), UATTN_OK, "%s",
                   uattn_last_error());
      for (int32_t s = 1; s <= MAX_S; s++)
        for (int32_t rank = 0; rank < n; rank++) {
          int32_t seed = -1;
          cr_assert_eq(fscanf(py, "%d", &seed), 1, "the numpy re-statement's output ended early");
          const int32_t counted = cp_count(n, rank, il, s);
          cr_assert_eq(seed, counted, "N %d, I %d, rank %d, S %d: the seed says %d, counting %d", n, il, rank, s, seed,
                       counted);
          cr_assert_eq(lib[(s - 1) * n + rank], counted, "N %d, I %d, rank %d, S %d: the library's utility", n, il,
                       rank, s);
          if (s >= 2 && (s % 7 == 0 || s < 12)) /* a decode (S 1 would be a prompt: context 0) */
            cr_assert_eq(planned_local_len(n, rank, il, s), counted, "N %d, I %d, rank %d, S %d: the plan", n, il, rank,
                         s);
        }
    }
  cr_assert_eq(pclose(py), 0, "the numpy re-statement failed");
}
