/* The kernel suite's checks of a set on random jobs (jobs.h): against the portable set within the bound of
 * fp32 rounding and against fp64, bit for bit against another set, over a list of blocks against one block,
 * over several heads against each head alone, and a bf16 set on what it is dispatched for. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "jobs.h"
#include "portable/portable.h"
void check_sets_same_bits(const uattn_kernels *a, const uattn_kernels *b, uattn_part part, const case_limits *limits,
                          int cases, uint64_t seed, const char *differs) {
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

void check_value_dim_is_a_prefix(const uattn_kernels *set, uattn_part part, const case_limits *lim, int cases,
                                 uint64_t seed, const char *label) {
  test_rng rng = {seed};
  for (int i = 0; i < cases; i++) {
    job_case c;
    make_case(&c, &rng, lim);
    c.value_dim = 0;
    job_result all = run_set(set, part, &c);
    c.value_dim = test_rng_range(&rng, 1, c.D);
    job_result kept = run_set(set, part, &c);
    cr_assert(same_bits(&all, &kept, &c),
              "%s: case %d (rows %d, group %d, D %d, keys %d, dtype %d): value_dim %d changes the bits it keeps", label,
              i, c.rows, c.group, c.D, c.num_keys, (int)c.dtype, c.value_dim);
    free_result(&all), free_result(&kept), free_case(&c);
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
    if (!isnan(ref[i]) && kept_dim(c, i)) err = fmax(err, fabs(r->o[i] / r->l[i / c->D] - ref[i]));
  return scale > 0 ? err / scale : err;
}

/* Checks the states a case leaves: those that saw nothing bit for bit, the maxima and sums of the others
 * against the portable set's. e^(s - m) turns the absolute rounding error of a score (a few ulps of its
 * size) into a relative error of l: the bound on l grows with the scores' size, as the one on m does. */
static void check_states(const job_case *c, const job_result *ref, const job_result *got, const double *score_size,
                         int index) {
  const size_t nx = (size_t)c->rows * c->group, kept = (size_t)(c->value_dim ? c->value_dim : c->D);
  for (size_t x = 0; x < nx; x++) {
    const bool untouched = ref->m[x] == c->m0[x] && ref->l[x] == c->l0[x] &&
                           !memcmp(ref->o + x * c->D, c->o0 + x * c->D, sizeof(float) * c->D);
    if (untouched && c->m0[x] == -INFINITY) { /* nothing seen: bit for bit */
      cr_assert(got->m[x] == -INFINITY && got->l[x] == 0.0f, "case %d vector %zu: an empty state changed", index, x);
      cr_assert(!memcmp(got->o + x * c->D, c->o0 + x * c->D, sizeof(float) * kept), "case %d: o of an empty state",
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

void check_set_on_random_jobs(const uattn_kernels *set, uattn_part part, const char *label, const case_limits *lim,
                              int cases, uint64_t seed) {
  test_rng rng = {seed};
  double worst = 0, worst_portable = 0, worst_set = 0, worst_tol = 0, sum_set = 0, sum_portable = 0;
  /* A bf16 set's P in bf16 (its default): each weight p rounded, by up to 2^-8 p (bf16's 8 significant bits: half
   * a unit in the last place of 1 + 2^-7 is 2^-8 of it), moves o / l by up to 2^-8
   * of sum_j p_j |v_j| / l, which the error scale (exact_job) is at least. Its scores carry no bf16
   * rounding here: the queries are bf16 values, unscaled for its bf16 kernels (uattn_kernel_caps.unscaled_q),
   * keys bf16. The bound is the set's (bf16_inputs), whichever of its kernels (avx512bf16fma: a decode kernel
   * with P in bf16, an attend with P in fp32) the job runs. */
  const double p_tol = set->caps.bf16_inputs && !lim->probs_fp32 ? 0x1p-8 : 0.0;
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
    cr_assert(
        e <= tol,
        "%s: case %d (rows %d, group %d, D %d, value_dim %d, keys %d/%d, %s, cap %g, window %d, alibi %d): %.3g (bound "
        "%.3g; against fp64: %.3g, portable %.3g)",
        label, i, c.rows, c.group, c.D, c.value_dim, c.num_keys, c.panel_keys, uattn_dtype_name(c.dtype), c.soft_cap,
        c.window, c.has_alibi, e, tol, ea, ep);
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

void check_list_is_one_block(const uattn_kernels *set, const case_limits *lim, int n, uint64_t seed,
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

void check_decode_heads(const uattn_kernels *set, const char *label, const case_limits *lim, int cases, uint64_t seed) {
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

void check_bf16_set(const uattn_kernels *set, const char *label, bool decode, uint64_t seed, int sparse) {
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
