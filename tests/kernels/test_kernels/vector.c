/* The avx2 set's vector math and loads: exp, tanh and the bf16 sets' exp2 against libm, the loads bit for bit the portable widening
 * (every 16-bit value, tiled rows, the avx512bf16 loads against their twins), and fp8 widening exact for every
 * code. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>

#include "avx512bf16/vec.h" /* the twin form: vdpbf16ps emulated on AVX2 */
#endif

#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "convert.h"
#include "jobs.h"
#include "portable/portable.h"

/* Where the avx2 set puts key i, dim d and value i, dim d (its layout; see kernels/avx2/set.c). */
static const float *aligned64(const float *p) { return (const float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* The avx2 set's key and value panels of `keys` keys of dim D (keys, values: the caller frees them), and
 * where its layout puts key i, dim d (kp[d * ks + i]) and value i, dim d (vp[i * vs + d]) in them. */
typedef struct avx2_panels {
  float *keys, *values;
  const float *kp, *vp;
  int32_t ks, vs;
} avx2_panels;

static avx2_panels avx2_panels_alloc(int32_t keys, int32_t D) {
  avx2_panels p;
  const size_t floats = uattn_kernels_avx2.panel_floats(keys, D);
  p.keys = malloc(sizeof(float) * floats), p.values = malloc(sizeof(float) * floats);
  uattn_avx2_layout(keys, D, &p.ks, &p.vs);
  p.kp = aligned64(p.keys), p.vp = aligned64(p.values);
  return p;
}

/* ---- vector math ------------------------------------------------------------------------------------- */

/* Distance in ulps between two non-negative floats (their bit patterns are ordered like their values). */
static int64_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* The next batch of at most n floats from *u (the bit pattern of a float <= -0) down to `last`, `step` patterns
 * apart (negative floats grow in value as their patterns fall): x[i]; returns how many, 0 when done. */
static size_t negative_floats(uint32_t *u, uint32_t last, uint32_t step, float *x, size_t n) {
  size_t k = 0;
  for (; k < n && *u <= last; k++, *u += step) memcpy(&x[k], u, 4);
  return k;
}

Test(kernels, avx2_exp_is_within_2_ulps_of_expf, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  /* every 7th float of [-104, 0] (subnormal results included), and a few special points */
  enum { N = 1 << 16 };
  static float x[N], y[N];
  int64_t worst = 0, worst_exact = 0;
  float worst_x = 0;
  uint32_t u = 0x80000000u; /* -0 .. -104 */
  for (size_t n; (n = negative_floats(&u, 0xC2D00000u, 7 * SPARSE, x, N)) > 0;) {
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

/* exp2_fms8 (the softmax weights of the bf16 sets, 2^(x c - mc); v16_exp2_fms is its twin in zmm) on n floats, n a
 * multiple of 8 */
#if defined(__x86_64__)
AVX2_TARGET static void exp2_fms_all(const float *x, float c, float mc, float *y, size_t n) {
  for (size_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(y + i, exp2_fms8(_mm256_loadu_ps(x + i), _mm256_set1_ps(c), _mm256_set1_ps(mc)));
}
#endif

/* Its accuracy: within 2.5e-7 of 2^t relative (the polynomial's 1.6e-7, its fp32 evaluation and the one
 * rounding of the result), plus half a subnormal step below 2^-126; t comes from one FMA, so 2^(x c - mc) is
 * also off by t's rounding, |t| 2^-24 ln 2 relative. */
Test(kernels, exp2_fms_is_within_its_stated_error_of_exp2, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  enum { N = 1 << 16 };
  static float x[N], y[N];
  double worst = 0.0;
  float worst_x = 0.0f;
  uint32_t u = 0x80000000u; /* -0 .. -151 */
  for (size_t n; (n = negative_floats(&u, 0xC3170000u, 5 * SPARSE, x, N)) > 0;) {
    for (size_t i = n; i % 8; i++) x[i] = 0.0f;
    exp2_fms_all(x, 1.0f, 0.0f, y, (n + 7) & ~(size_t)7); /* t = x exactly */
    for (size_t i = 0; i < n; i++) {
      const double want = exp2((double)x[i]), rel = (fabs((double)y[i] - want) - 0x1p-150) / want;
      if (rel > worst) worst = rel, worst_x = x[i];
    }
  }
  cr_log_info("exp2: worst relative error %.3g (at %.9g)", worst, worst_x);
  cr_assert(worst <= 2.5e-7, "exp2 is %.3g off relative at %.9g", worst, worst_x);
  /* a score times a scale minus the max, as the softmax calls it */
  for (size_t i = 0; i < 4096; i++) x[i] = -30.0f + 60.0f * (float)i / 4096.0f;
  const float c = 0.0883883476f * 1.44269504f, mc = 30.0f * c;
  exp2_fms_all(x, c, mc, y, 4096);
  for (size_t i = 0; i < 4096; i++) {
    const double t = (double)x[i] * c - mc, want = exp2(t);
    cr_assert(fabs(y[i] - want) <= want * (2.5e-7 + fabs(t) * 0x1p-24 * 0.6931472) + 0x1p-150, "2^(%g c - mc)", x[i]);
  }
  const float special[8] = {-INFINITY, -1000.0f, -151.0f, -150.5f, 0.0f, NAN, -NAN, 1.0f};
  float out[8];
  exp2_fms_all(special, 1.0f, 0.0f, out, 8);
  cr_assert(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f && out[3] == 0.0f, "masked scores must weigh 0");
  cr_assert(fabsf(out[4] - 1.0f) <= 2e-7f && isnan(out[5]) && isnan(out[6]), "2^0 about 1, a NaN stays NaN");
  cr_assert(fabsf(out[7] - 2.0f) <= 4e-7f, "2^1");
}

/* ---- loads ----------------------------------------------------------------------------------------------- */

/* Random bits in every element (NaNs, infinities, subnormals included), random shapes and strides: the avx2
 * panels hold exactly what the portable widening gives, where its layout puts it, and zeros in the padding
 * it promises. F16C quiets signaling NaNs, so a 16-bit NaN need only stay a NaN of the same sign. */
Test(kernels, avx2_load_is_bit_exact, .timeout = KERNEL_TEST_TIMEOUT) {
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
Test(kernels, avx2_load_widens_every_16_bit_value, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  enum { D = 256, KEYS = 256 }; /* 65536 elements */
  uint16_t *src = malloc(sizeof(uint16_t) * D * KEYS);
  for (uint32_t i = 0; i < D * KEYS; i++) src[i] = (uint16_t)i;
  const avx2_panels p = avx2_panels_alloc(KEYS, D);
  for (int t = UATTN_BF16; t <= UATTN_F16; t++) {
    uattn_kernels_avx2.load((uattn_dtype)t, src, src, D, KEYS, D, KEYS, p.keys, p.values);
    for (int32_t i = 0; i < KEYS; i++)
      for (int32_t d = 0; d < D; d++) {
        float want;
        uattn_widen((uattn_dtype)t, src + (size_t)i * D + d, &want, 1);
        const float a = p.kp[(size_t)d * p.ks + i], b = p.vp[(size_t)i * p.vs + d];
        if (isnan(want)) {
          cr_assert(isnan(a) && isnan(b) && signbit(a) == signbit(want) && signbit(b) == signbit(want),
                    "a NaN changed");
        } else {
          cr_assert(!memcmp(&a, &want, 4) && !memcmp(&b, &want, 4), "dtype %d, 0x%04x: %a %a, want %a", t,
                    src[(size_t)i * D + d], a, b, want);
        }
      }
  }
  free(src), free(p.keys), free(p.values);
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

/* Every set with a load_tiled (the avx2 and avx512 sets share one, on their fp32 panels; avx512bf16 has its
 * own, on its pair panels), each generic set through its twin where the CPU lacks it, and every bucket whose
 * dtype the forward gives its load_tiled (uattn_load_tiled_fits: an f16 or f32 bucket's is never called). */
Test(kernels, load_tiled_is_the_load_of_the_same_rows, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  check_load_tiled(&uattn_kernels_avx2, "avx2", tiled_load_dtypes, 3, 0, 0, 1500 / SPARSE, 20261207);
  check_load_tiled(&uattn_kernels_avx512_twin, "avx512 (twin)", tiled_load_dtypes, 3, 0, 0, 500 / SPARSE, 20261208);
  if (uattn_avx512_runs_here())
    check_load_tiled(&uattn_kernels_avx512, "avx512", tiled_load_dtypes, 3, 0, 0, 500 / SPARSE, 20261209);
  check_load_tiled(&uattn_kernels_avx512bf16_twin, "avx512bf16 (twin)", tiled_load_dtypes, 3, 0, 0, 1500 / SPARSE,
                   20261126);
  if (uattn_avx512bf16_runs_here())
    check_load_tiled(&uattn_kernels_avx512bf16, "avx512bf16", tiled_load_dtypes, 3, 0, 0, 1500 / SPARSE, 20261127);
  for (size_t i = 0; i < uattn_bucket_registry_size; i++) {
    const uattn_bucket_kernels *b = uattn_bucket_registry[i];
    if (uattn_load_tiled_fits(&b->set, b->dtype) && b->runs_here() && b->block_size % 16 == 0 && b->head_dim % 2 == 0)
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
  static const int32_t dims[] = {32, 64, 96, 128, 160, 256, 512, 576, 16, 48, 80, 8, 2};
  test_rng rng = {seed};
  for (int it = 0; it < iters; it++) {
    const uattn_dtype t = fixed_dtype >= 0 ? (uattn_dtype)fixed_dtype : it % 2 ? UATTN_BF16 : dtypes[it / 2 % 5];
    const int32_t D = fixed_D ? fixed_D : dims[test_rng_range(&rng, 0, (int32_t)(sizeof dims / sizeof *dims) - 1)];
    const int32_t count = test_rng_range(&rng, 0, 300), panel = count + test_rng_range(&rng, 0, 40);
    const size_t stride = (size_t)D * test_rng_range(&rng, 1, 3) + (size_t)(test_rng_range(&rng, 0, 2) * 32);
    const bool latent = test_rng_range(&rng, 0, 3) == 0;
    const size_t esz = uattn_dtype_size(t), n = (size_t)(count ? count - 1 : 0) * stride + D;
    uint8_t *k = malloc(n * esz), *v = malloc(n * esz);
    for (size_t i = 0; i < n * esz; i++) k[i] = (uint8_t)test_rng_next(&rng), v[i] = (uint8_t)test_rng_next(&rng);
    const size_t floats = (set->panel_floats(panel, D) + 15) & ~(size_t)15, bytes = sizeof(float) * (floats + 64);
    float *want_k = aligned_alloc(64, bytes), *want_v = aligned_alloc(64, bytes), *got_k = aligned_alloc(64, bytes),
          *got_v = aligned_alloc(64, bytes);
    for (size_t i = 0; i < floats + 64; i++) want_k[i] = want_v[i] = got_k[i] = got_v[i] = NAN;
    const uint8_t *vs = latent ? k : v; /* a latent: the values are the keys' rows, which the zmm load reads once */
    uattn_kernels_avx512bf16_twin.load(t, k, vs, stride, count, D, panel, want_k, want_v);
    set->load(t, k, vs, stride, count, D, panel, got_k, got_v);
    const bool fp8 = uattn_dtype_is_fp8(t); /* other dtypes' panels must match bit for bit, NaNs included */
    for (int p = 0; p < 2; p++) {
      const uint16_t *w = (const uint16_t *)(p ? want_v : want_k), *g = (const uint16_t *)(p ? got_v : got_k);
      for (size_t h = 0; h < bytes / 2; h++)
        cr_assert(w[h] == g[h] || (fp8 && isnan(uattn_bf16_to_f32(w[h])) && isnan(uattn_bf16_to_f32(g[h])) &&
                                   (w[h] ^ g[h]) < 0x8000),
                  "%s, load %d (dtype %d, D %d, %d keys, stride %zu, panel %d, latent %d): %s half %zu is %#x, the "
                  "twin's %#x",
                  what, it, (int)t, D, count, stride, panel, latent, p ? "value" : "key", h, g[h], w[h]);
    }
    free(want_k), free(want_v), free(got_k), free(got_v), free(k), free(v);
  }
}

Test(kernels, avx512bf16_load_is_its_twins, .timeout = KERNEL_TEST_TIMEOUT) {
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
  const avx2_panels p = avx2_panels_alloc(KEYS, D);
  for (int t = UATTN_FP8_E4M3; t <= UATTN_FP8_E5M2; t++) {
    uattn_kernels_avx2.load((uattn_dtype)t, src, src, D, KEYS, D, KEYS, p.keys, p.values);
    for (int32_t i = 0; i < KEYS; i++)
      for (int32_t d = 0; d < D; d++) {
        const uint8_t code = src[(size_t)i * D + d];
        const float want = uattn_fp8_to_f32((uattn_dtype)t, code);
        float got[2] = {p.kp[(size_t)d * p.ks + i], p.vp[(size_t)i * p.vs + d]};
        for (int x = 0; x < 2; x++)
          cr_assert(isnan(want) ? isnan(got[x]) && signbit(got[x]) == signbit(want) : !memcmp(&got[x], &want, 4),
                    "dtype %d, code 0x%02x: %a, want %a", t, code, got[x], want);
      }
  }
  free(src), free(p.keys), free(p.values);
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
Test(kernels, avx2_tanh_is_within_1_ulp_of_the_rounded_exact_value, .timeout = KERNEL_TEST_TIMEOUT) {
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
