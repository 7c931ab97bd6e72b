/* The amx set through its twin (tdpbf16ps emulated) against the portable set, tdpbf16ps itself against its
 * emulation, and where the CPU runs AMX, the set bit for bit its twin. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>

#include "amx/tile.h" /* the twin form: tdpbf16ps emulated */
#endif

#include "amx/amx.h"
#include "avx512bf16/avx512bf16.h"
#include "jobs.h"
#include "portable/portable.h"

/* ---- the amx set ---------------------------------------------------------------------------------------- */

/* Its logic through its twin (amx/tile.h: tdpbf16ps emulated exactly, over the avx512bf16 twin), wherever AVX2
 * runs: check_bf16_set's jobs (many of 16 vectors or more, which the tiles take; the rest, P in fp32 and head
 * dims that are not multiples of 32 go to avx512bf16's attend), and long jobs of many rows, several key chunks
 * each, on bf16 and fp8 caches, against the portable set and the fp64 oracle. */
Test(kernels, amx_twin_attend_matches_portable_on_random_jobs, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  check_bf16_set(&uattn_kernels_amx_twin, "amx (twin)", false, 20261150, AMX_TWIN_SPARSE);
}

Test(kernels, amx_twin_long_jobs_match_portable, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const case_limits lim = {.large = true, .bf16 = true, .fp8 = fp8};
    check_set_on_random_jobs(&uattn_kernels_amx_twin, UATTN_PART_CAUSAL,
                             fp8 ? "amx (twin), long, fp8 cache" : "amx (twin), long", &lim, 300 / AMX_TWIN_SPARSE,
                             20261152 + (uint64_t)fp8);
  }
  /* the widest head dim the tiles take: multi-head latent attention's 576-dim latent */
  const case_limits latent = {.head_dim = 576, .bf16 = true};
  check_set_on_random_jobs(&uattn_kernels_amx_twin, UATTN_PART_SHARED, "amx (twin), head dim 576", &latent,
                           60 / AMX_TWIN_SPARSE + 4, 20261162);
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
Test(kernels, tdpbf16ps_is_its_emulation_bit_for_bit, .timeout = KERNEL_TEST_TIMEOUT) {
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
Test(kernels, amx_is_its_twin_bit_for_bit, .timeout = KERNEL_TEST_TIMEOUT) {
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
  const case_limits latent = {.head_dim = 576, .bf16 = true};
  check_sets_same_bits(&uattn_kernels_amx_twin, &uattn_kernels_amx, UATTN_PART_SHARED, &latent, 60 / SPARSE + 4,
                       20261164, "the amx attend differs from its twin at head dim 576");
}
