/* The avx512 and avx512bf16 sets through their twins (the same arithmetic on AVX2) against the portable set,
 * and where the CPU runs them, each set bit for bit its twin; vdpbf16ps and vcvtneps2bf16, twin and
 * instruction, against Intel's pseudocode. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>

#include "avx512bf16/vec.h" /* the twin form: vdpbf16ps emulated on AVX2 */
#endif

#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "convert.h"
#include "jobs.h"

/* The avx512 set's decode kernel, through its twin (common/vec16.h: the same arithmetic on pairs of ymm
 * registers), which runs wherever AVX2 does: against the portable set, and over several heads. */
Test(kernels, avx512_twin_decode_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_UNIQUE, "avx512 decode (twin)", &few_rows,
                           1500 / SPARSE, 20261123);
}

/* Over a list of blocks, which the phases walk (bf16 rows) and the fused walk (16-key shares, in pieces over
 * 8-key blocks) take as it is: against the portable set, and bit for bit the same keys in one block. */
Test(kernels, avx512_twin_decode_over_a_list_of_blocks_matches_portable, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits lists = {.decode = true, .list = true};
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_UNIQUE, "avx512 decode (twin), a list of blocks",
                           &lists, 1000 / SPARSE, 20261203);
  check_list_is_one_block(&uattn_kernels_avx512_twin, &lists, 800 / SPARSE, 20261205, "avx512 decode (twin)");
}

Test(kernels, avx512_twin_decode_over_several_heads_is_each_head_alone, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_decode_heads(&uattn_kernels_avx512_twin, "avx512 decode (twin)", &few_rows, 400 / SPARSE, 20261124);
}

/* Its decode kernel on a TILED cache, the avx2 set's (tested there), through the twin: the set's wiring, on bf16
 * and fp8 blocks. */
Test(kernels, avx512_twin_tiled_decode_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.decode = true, .bf16 = true, .fp8 = fp8, .tiled = true};
    check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_UNIQUE,
                             fp8 ? "avx512 (twin) tiled decode, fp8 cache" : "avx512 (twin) tiled decode", &lim,
                             200 / SPARSE, 20261211 + (uint64_t)fp8);
  }
}

/* The avx512 set's attend (avx512/body.h) through its twin: against the portable set on jobs of any shape, and
 * on large ones (many rows, several key chunks). */
Test(kernels, avx512_twin_attend_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits any = {0}, large = {.large = true};
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_SHARED, "avx512 attend (twin)", &any, 1500 / SPARSE,
                           20261206);
  check_set_on_random_jobs(&uattn_kernels_avx512_twin, UATTN_PART_CAUSAL, "avx512 attend (twin), large jobs", &large,
                           200 / SPARSE, 20261207);
}

/* Where AVX-512 runs: the zmm kernels compute their twin's bits, decode and attend (what the tests above
 * checked). */
Test(kernels, avx512_decode_is_its_twin_bit_for_bit, .timeout = KERNEL_TEST_TIMEOUT) {
  if (!uattn_avx512_runs_here()) cr_skip_test("this CPU lacks AVX-512F (the twin is tested above)");
  const case_limits few_rows = {.decode = true};
  check_sets_same_bits(&uattn_kernels_avx512_twin, &uattn_kernels_avx512, UATTN_PART_UNIQUE, &few_rows, 1000 / SPARSE,
                       20261125, "the zmm kernel differs from its twin");
  const case_limits tiled = {.decode = true, .bf16 = true, .fp8 = true, .tiled = true};
  check_sets_same_bits(&uattn_kernels_avx512_twin, &uattn_kernels_avx512, UATTN_PART_UNIQUE, &tiled, 200 / SPARSE,
                       20261213, "the zmm set's tiled decode differs from its twin");
}

Test(kernels, avx512_attend_is_its_twin_bit_for_bit, .timeout = KERNEL_TEST_TIMEOUT) {
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
Test(kernels, avx512bf16_twin_attend_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  check_bf16_set(&uattn_kernels_avx512bf16_twin, "avx512bf16 (twin)", false, 20261130, SPARSE);
}

Test(kernels, avx512bf16_twin_decode_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  check_bf16_set(&uattn_kernels_avx512bf16_twin, "avx512bf16 (twin)", true, 20261132, SPARSE);
}

/* Over a list of blocks, taken as it is: bf16 and fp8 rows, P in bf16 (the fused walks: shares of 16 keys of
 * bf16 and 32 of fp8, in pieces over smaller blocks) and in fp32 (the phases walk): against the portable set,
 * and bit for bit the same keys in one block. */
Test(kernels, avx512bf16_twin_decode_over_a_list_of_blocks_matches_portable, .timeout = KERNEL_TEST_TIMEOUT) {
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

Test(kernels, avx512bf16_twin_decode_over_several_heads_is_each_head_alone, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  const case_limits few_rows = {.decode = true};
  check_decode_heads(&uattn_kernels_avx512bf16_twin, "avx512bf16 decode (twin)", &few_rows, 400 / SPARSE, 20261134);
}

/* Its decode kernel on a TILED cache (decode_tiled.h), through the twin: against the portable set on bf16 and
 * fp8 blocks with NaN in the slots past the keys (tiled_copy), and over several heads. */
Test(kernels, avx512bf16_twin_tiled_decode_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.decode = true, .bf16 = true, .fp8 = fp8, .tiled = true};
    check_set_on_random_jobs(&uattn_kernels_avx512bf16_twin, UATTN_PART_UNIQUE,
                             fp8 ? "avx512bf16 (twin) tiled decode, fp8 cache" : "avx512bf16 (twin) tiled decode", &lim,
                             1200 / (fp8 ? 2 : 1) / SPARSE, 20261126 + (uint64_t)fp8);
  }
}

Test(kernels, avx512bf16_twin_tiled_decode_over_several_heads_is_each_head_alone, .timeout = KERNEL_TEST_TIMEOUT) {
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
Test(kernels, vdpbf16ps_twin_is_the_pseudocode, .timeout = KERNEL_TEST_TIMEOUT) {
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
Test(kernels, vdpbf16ps_is_its_emulation_bit_for_bit, .timeout = KERNEL_TEST_TIMEOUT) {
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
Test(kernels, avx512bf16_is_its_twin_bit_for_bit, .timeout = KERNEL_TEST_TIMEOUT) {
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
