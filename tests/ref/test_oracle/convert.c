/* The oracle's fp16 and bf16 conversions: their edge values, every value's round trip, narrowing to the
 * nearest value (ties to even) against a brute-force search, and the rounding of its loads and stores. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "env.h"
/* ================================================================================================ */
/* conversions                                                                                        */
/* ================================================================================================ */

static void expect_bf16(double x, uint16_t want) {
  const uint16_t got = oracle_double_to_bf16(x);
  cr_assert_eq(got, want, "bf16(%a) = %#06x, expected %#06x", x, got, want);
}

static void expect_f16(double x, uint16_t want) {
  const uint16_t got = oracle_double_to_f16(x);
  cr_assert_eq(got, want, "f16(%a) = %#06x, expected %#06x", x, got, want);
}

static float float_of_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

Test(convert, bf16_edge_values) {
  expect_bf16(0.0, 0x0000);
  expect_bf16(-0.0, 0x8000);
  expect_bf16(1.0, 0x3F80);
  expect_bf16(-2.0, 0xC000);
  /* ties go to even; anything past the tie goes up */
  expect_bf16(1 + 0x1p-8, 0x3F80);
  expect_bf16(1 + 0x1.8p-7, 0x3F82);
  expect_bf16(1 + 0x1p-8 + 0x1p-40, 0x3F81);
  expect_bf16(1 + 0x1p-8 - 0x1p-40, 0x3F80);
  /* largest finite (2 - 2^-7) 2^127; the tie above it (odd mantissa) and FLT_MAX round to inf */
  expect_bf16(0x1.FEp127, 0x7F7F);
  expect_bf16(0x1.FFp127, 0x7F80);
  expect_bf16(0x1.FEFFFFp127, 0x7F7F);
  expect_bf16((double)float_of_bits(0x7F7FFFFF), 0x7F80);
  expect_bf16(-1e300, 0xFF80);
  /* subnormals: 2^-133 is the smallest; 2^-134 is a tie with 0 (even); 3 * 2^-134 a tie between 1 and 2 */
  expect_bf16(0x1p-133, 0x0001);
  expect_bf16(0x1p-134, 0x0000);
  expect_bf16(0x1.8p-134, 0x0001);
  expect_bf16(0x3p-134, 0x0002);
  expect_bf16(127 * 0x1p-133, 0x007F);
  expect_bf16(0x1p-126, 0x0080);
  expect_bf16(0x1p-126 - 0x1p-134, 0x0080); /* tie between 0x7F and 0x80: the even one, the smallest normal */
  expect_bf16(-0x1p-133, 0x8001);
  expect_bf16(0x1p-149, 0x0000);  /* the smallest float subnormal */
  expect_bf16(-1e-300, 0x8000);   /* underflow keeps the sign */
  expect_bf16(0x1p-1074, 0x0000); /* a double subnormal */
  expect_bf16(INFINITY, 0x7F80);
  expect_bf16(-INFINITY, 0xFF80);
  /* NaN stays NaN (quiet), whatever its payload: a low-bits-only payload must not turn into inf */
  cr_assert_eq(oracle_double_to_bf16(NAN) & 0x7FC0, 0x7FC0);
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x7F800001)), 0x7FC0);
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0xFF800001)), 0xFFC0);
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x7FA00000)), 0x7FE0); /* sNaN: payload kept, quieted */
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x3F808000)), 0x3F80); /* the f32 tie, once rounded */
  cr_assert_eq(oracle_float_to_bf16(float_of_bits(0x3F818000)), 0x3F82);

  cr_assert(oracle_bf16_to_double(0x0001) == 0x1p-133);
  cr_assert(oracle_bf16_to_double(0x7F7F) == 0x1.FEp127);
  cr_assert(oracle_bf16_to_double(0x3F81) == 1 + 0x1p-7);
  cr_assert(oracle_bf16_to_double(0xFF80) == -INFINITY);
  cr_assert(isnan(oracle_bf16_to_double(0x7FC0)) && isnan(oracle_bf16_to_double(0x7F81)));
  const double mz = oracle_bf16_to_double(0x8000);
  cr_assert(mz == 0 && signbit(mz));
}

Test(convert, f16_edge_values) {
  expect_f16(0.0, 0x0000);
  expect_f16(-0.0, 0x8000);
  expect_f16(1.0, 0x3C00);
  expect_f16(-2.0, 0xC000);
  expect_f16(0.1, 0x2E66);
  expect_f16(1.0 / 3, 0x3555);
  expect_f16(3.14159265358979, 0x4248);
  /* ties to even in the normal range */
  expect_f16(1 + 0x1p-11, 0x3C00);
  expect_f16(1 + 0x3p-11, 0x3C02);
  expect_f16(1 + 0x1p-11 + 0x1p-40, 0x3C01);
  /* 65504 is the largest; 65519.99 rounds down; 65520 is the tie with 2^16 (odd mantissa): inf */
  expect_f16(65504, 0x7BFF);
  expect_f16(65519.99, 0x7BFF);
  expect_f16(65520, 0x7C00);
  expect_f16(65536, 0x7C00);
  expect_f16(-1e10, 0xFC00);
  /* subnormals: 2^-24 the smallest, 2^-25 a tie with 0, 3 * 2^-25 a tie between 1 and 2 */
  expect_f16(0x1p-24, 0x0001);
  expect_f16(0x1p-25, 0x0000);
  expect_f16(0x1p-25 + 0x1p-50, 0x0001);
  expect_f16(0x3p-25, 0x0002);
  expect_f16(1023 * 0x1p-24, 0x03FF);
  expect_f16(0x1p-14, 0x0400);
  expect_f16(0x1p-14 - 0x1p-25, 0x0400); /* tie between 0x3FF and 0x400: the even one */
  expect_f16(0x1p-14 - 0x3p-26, 0x03FF);
  expect_f16(-0x1p-24, 0x8001);
  expect_f16(-1e-30, 0x8000);
  expect_f16(INFINITY, 0x7C00);
  expect_f16(-INFINITY, 0xFC00);
  const uint16_t n = oracle_double_to_f16(-NAN);
  cr_assert((n & 0x7E00) == 0x7E00 && (n & 0x8000), "-NaN -> %#x", n);
  cr_assert_eq(oracle_float_to_f16(float_of_bits(0x7F800001)), 0x7E00);
  cr_assert_eq(oracle_float_to_f16(float_of_bits(0x477FF000)), 0x7C00); /* 65520.0f */

  cr_assert(oracle_f16_to_double(0x0001) == 0x1p-24);
  cr_assert(oracle_f16_to_double(0x03FF) == 1023 * 0x1p-24);
  cr_assert(oracle_f16_to_double(0x0400) == 0x1p-14);
  cr_assert(oracle_f16_to_double(0x7BFF) == 65504);
  cr_assert(oracle_f16_to_double(0x3555) == 0.333251953125);
  cr_assert(oracle_f16_to_double(0xFC00) == -INFINITY);
  cr_assert(isnan(oracle_f16_to_double(0x7E00)) && isnan(oracle_f16_to_double(0x7C01)));
  const double mz = oracle_f16_to_double(0x8000);
  cr_assert(mz == 0 && signbit(mz));
}

/* Every pattern: widening is strictly increasing over the finite positives and narrowing undoes it. */
static void check_exhaustive(double (*widen)(uint16_t), uint16_t (*narrow)(double), uint16_t max_finite) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    const double x = widen((uint16_t)h);
    if (isnan(x)) {
      cr_assert((h & 0x7FFF) > (uint32_t)max_finite + 1, "%#x widened to NaN", h);
      cr_assert(isnan(widen(narrow(x))), "NaN %#x did not stay NaN", h);
      continue;
    }
    cr_assert_eq(narrow(x), h, "%#x -> %a -> %#x", h, x, narrow(x));
    if ((h & 0x7FFF) < max_finite && h < 0x8000) cr_assert(widen((uint16_t)(h + 1)) > x, "not increasing at %#x", h);
  }
}

Test(convert, exhaustive_round_trips) {
  check_exhaustive(oracle_bf16_to_double, oracle_double_to_bf16, 0x7F7F);
  check_exhaustive(oracle_f16_to_double, oracle_double_to_f16, 0x7BFF);
}

/* Narrowing against its definition: the nearest of all finite values plus 2^(emax+1) (which stands for
 * inf), ties to the even pattern, searched in the sorted table -- no bit manipulation. Inputs: random
 * magnitudes over the whole range, every exact midpoint of a neighbour pair, and the doubles next to it. */
static void check_nearest(double (*widen)(uint16_t), uint16_t (*narrow)(double), uint16_t max_finite, double beyond,
                          uint64_t seed) {
  const int n = max_finite + 2;
  double *val = malloc((size_t)n * sizeof *val);
  for (int i = 0; i <= max_finite; i++) val[i] = widen((uint16_t)i);
  val[max_finite + 1] = beyond; /* the pattern after max_finite is inf */
  test_rng rng = {seed};
  for (int trial = 0; trial < 60000; trial++) {
    double x;
    const int kind = trial % 3;
    const int i = test_rng_range(&rng, 0, n - 2);
    const double mid = (val[i] + val[i + 1]) / 2; /* exact: one bit more than the format */
    if (kind == 0)
      x = mid;
    else if (kind == 1)
      x = nextafter(mid, test_rng_next(&rng) & 1 ? INFINITY : 0);
    else
      x = val[i] + (val[i + 1] - val[i]) * test_rng_unit(&rng);
    /* nearest by search */
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) {
      const int m = (lo + hi) / 2;
      if (val[m] <= x)
        lo = m;
      else
        hi = m;
    }
    int want = x - val[lo] < val[hi] - x ? lo : x - val[lo] > val[hi] - x ? hi : (lo % 2 == 0 ? lo : hi);
    if (x >= val[n - 1]) want = n - 1;
    for (int sgn = 0; sgn < 2; sgn++) {
      const double y = sgn ? -x : x;
      const uint16_t w = (uint16_t)(want | (sgn ? 0x8000 : 0)), got = narrow(y);
      cr_assert_eq(got, w, "%a -> %#x, nearest is %#x", y, got, w);
    }
  }
  free(val);
}

Test(convert, narrowing_is_the_nearest_value_ties_to_even) {
  check_nearest(oracle_bf16_to_double, oracle_double_to_bf16, 0x7F7F, 0x1p128, 17);
  check_nearest(oracle_f16_to_double, oracle_double_to_f16, 0x7BFF, 0x1p16, 18);
}

Test(convert, load_store_round) {
  unsigned char buf[16];
  oracle_store(buf, UATTN_F32, 1, 1 + 0x1p-24); /* tie: to 1.0f */
  cr_assert(((const float *)buf)[1] == 1.0f && oracle_load(buf, UATTN_F32, 1) == 1.0);
  oracle_store(buf, UATTN_BF16, 3, 0x1.FFp127);
  cr_assert(isinf(oracle_load(buf, UATTN_BF16, 3)));
  oracle_store(buf, UATTN_F16, 2, 0x1p-25 * 3);
  cr_assert(oracle_load(buf, UATTN_F16, 2) == 0x1p-23);
  cr_assert(oracle_round(UATTN_BF16, 1 + 0x1p-8) == 1 && oracle_round(UATTN_F16, 1 + 0x1p-8) == 1 + 0x1p-8);
  cr_assert(oracle_dtype_size(UATTN_F32) == 4 && oracle_dtype_size(UATTN_BF16) == 2 &&
            oracle_dtype_size(UATTN_F16) == 2 && oracle_dtype_size((uattn_dtype)7) == 0);
}
