/* fp8 caches, the cache write: uattn_forward's real path (a prefill step whose k and v rows hold the values)
 * against the dense oracle's own quantizer (support/dense_oracle.h: a search over the 256 decoded codes),
 * bit for bit, for every value class of both formats: every code's value times the scale, the halfway points
 * between neighbours and either side of them (ties to even), the saturation edge, infinities, NaN,
 * subnormals and the halfway points below the smallest, both zeros; scales that divide exactly and one that
 * does not (the division by the scale is in fp32, rounded once). The oracle's decoding and rounding are
 * themselves pinned to hand-worked values first, so that the comparison is not between two copies of one
 * mistake. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/attention_case.h"
#include "common/case_names.h"
#include "support/requests.h"

static const uattn_dtype formats[2] = {UATTN_FP8_E4M3, UATTN_FP8_E5M2};

/* ---- the oracle's fp8 against the formats' definitions ---------------------------------------------------- */

Test(fp8_cache, oracle_decodes_and_rounds_as_the_formats_say) {
  const uattn_dtype e4 = UATTN_FP8_E4M3, e5 = UATTN_FP8_E5M2;
  /* decoding: the largest finite, the smallest normal and subnormal, one, NaN / inf patterns, -0 */
  cr_assert_eq(oracle_fp8_to_double(e4, 0x7E), 448.0);
  cr_assert_eq(oracle_fp8_to_double(e4, 0x08), 0x1p-6);
  cr_assert_eq(oracle_fp8_to_double(e4, 0x01), 0x1p-9);
  cr_assert_eq(oracle_fp8_to_double(e4, 0x38), 1.0);
  cr_assert_eq(oracle_fp8_to_double(e4, 0xC0), -2.0);
  cr_assert(isnan(oracle_fp8_to_double(e4, 0x7F)) && isnan(oracle_fp8_to_double(e4, 0xFF)));
  cr_assert_eq(oracle_fp8_to_double(e4, 0x78), 256.0); /* S.1111.000 is a number in the fn variant */
  cr_assert(signbit(oracle_fp8_to_double(e4, 0x80)) && oracle_fp8_to_double(e4, 0x80) == 0.0);
  cr_assert_eq(oracle_fp8_to_double(e5, 0x7B), 57344.0);
  cr_assert_eq(oracle_fp8_to_double(e5, 0x04), 0x1p-14);
  cr_assert_eq(oracle_fp8_to_double(e5, 0x01), 0x1p-16);
  cr_assert_eq(oracle_fp8_to_double(e5, 0x3C), 1.0);
  cr_assert_eq(oracle_fp8_to_double(e5, 0x7C), INFINITY);
  cr_assert_eq(oracle_fp8_to_double(e5, 0xFC), -INFINITY);
  cr_assert(isnan(oracle_fp8_to_double(e5, 0x7D)) && isnan(oracle_fp8_to_double(e5, 0x7F)));
  /* rounding: ties to the even code, saturation, NaN, signed zero */
  cr_assert_eq(oracle_double_to_fp8(e4, 1.0625), 0x38);        /* halfway 1 .. 1.125: even is 1 */
  cr_assert_eq(oracle_double_to_fp8(e4, 1.1875), 0x3A);        /* halfway 1.125 .. 1.25: even is 1.25 */
  cr_assert_eq(oracle_double_to_fp8(e4, 0x1p-10), 0x00);       /* half the smallest subnormal: to 0 */
  cr_assert_eq(oracle_double_to_fp8(e4, 0x1.8p-9), 0x02);      /* 1.5 x smallest: to 2 x */
  cr_assert_eq(oracle_double_to_fp8(e4, -0x1.0001p-10), 0x81); /* just past half: the smallest, negative */
  cr_assert_eq(oracle_double_to_fp8(e4, 464.0), 0x7E);
  cr_assert_eq(oracle_double_to_fp8(e4, 1e9), 0x7E);
  cr_assert_eq(oracle_double_to_fp8(e4, -INFINITY), 0xFE);
  cr_assert_eq(oracle_double_to_fp8(e4, NAN), 0x7F);
  cr_assert_eq(oracle_double_to_fp8(e4, -NAN), 0xFF);
  cr_assert_eq(oracle_double_to_fp8(e4, -0.0), 0x80);
  cr_assert_eq(oracle_double_to_fp8(e4, -1e-30), 0x80);
  cr_assert_eq(oracle_double_to_fp8(e5, 61440.0), 0x7B); /* would be inf in IEEE rounding: saturates */
  cr_assert_eq(oracle_double_to_fp8(e5, INFINITY), 0x7B);
  cr_assert_eq(oracle_double_to_fp8(e5, 3.4e38), 0x7B); /* not a tie of two rounded distances */
  cr_assert_eq(oracle_double_to_fp8(e5, 1.125), 0x3C);  /* halfway 1 .. 1.25: even is 1 */
  cr_assert_eq(oracle_double_to_fp8(e5, 1.375), 0x3E);  /* halfway 1.25 .. 1.5: even is 1.5 */
  cr_assert_eq(oracle_double_to_fp8(e5, 0x1p-17), 0x00);
  cr_assert_eq(oracle_double_to_fp8(e5, 0x1.8p-16), 0x02);
  cr_assert_eq(oracle_double_to_fp8(e5, NAN), 0x7F);
  cr_assert_eq(oracle_quantize_fp8(e4, 3.0, 2.0f), 0x3C); /* 1.5 */
  cr_assert_eq(oracle_quantize_fp8(e4, 1.0, 0.0f), 0x7E); /* 1/0 = inf saturates */
}

/* ---- the values -------------------------------------------------------------------------------------------- */

static void push(float *v, size_t *n, size_t cap, double x) {
  cr_assert(*n < cap);
  v[(*n)++] = (float)x;
}

/* Every value class of format t, times scale (so that x / scale lands on, between or beyond the codes). */
static size_t fp8_values(uattn_dtype t, float scale, float *v, size_t cap) {
  size_t n = 0;
  double pos[128];
  int npos = 0;
  for (int c = 0; c < 256; c++) { /* every code, NaN and inf patterns included */
    const double x = oracle_fp8_to_double(t, (uint8_t)c);
    push(v, &n, cap, isfinite(x) ? x * scale : x);
    if (c < 128 && isfinite(x)) pos[npos++] = x;
  }
  for (int i = 0; i + 1 < npos; i++) { /* halfway points, either sign, and one fp32 ulp either side */
    const float h = (float)((pos[i] + pos[i + 1]) / 2 * scale);
    for (int s = -1; s <= 1; s += 2) {
      push(v, &n, cap, s * h);
      push(v, &n, cap, s * nextafterf(h, 0));
      push(v, &n, cap, s * nextafterf(h, INFINITY));
    }
  }
  const double max = pos[npos - 1], tiny = pos[1];
  /* the saturation edge: the largest finite, halfway to the next binade step (448 + 16, 57344 + 4096), the
   * next step, far beyond, the fp32 maximum, infinities */
  const double step = t == UATTN_FP8_E4M3 ? 32 : 8192;
  const double edge[] = {max, max + step / 2, max + step / 2 + 1, max + step, max * 1e3, 1e9, 3.4e38, INFINITY};
  for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
    push(v, &n, cap, edge[i] * scale);
    push(v, &n, cap, -edge[i] * scale);
  }
  /* below the smallest subnormal: half of it (a tie with zero: to zero), either side, a quarter, 3/4 */
  const double below[] = {tiny / 2, tiny / 2 * (1 + 0x1p-20), tiny / 2 * (1 - 0x1p-20), tiny / 4, tiny * 0.75};
  for (size_t i = 0; i < sizeof below / sizeof *below; i++) {
    push(v, &n, cap, below[i] * scale);
    push(v, &n, cap, -below[i] * scale);
  }
  push(v, &n, cap, 0.0);
  push(v, &n, cap, -0.0);
  push(v, &n, cap, NAN);
  push(v, &n, cap, -NAN);
  push(v, &n, cap, 0x1p-149); /* fp32's smallest subnormal */
  push(v, &n, cap, -0x1p-149);
  return n;
}

/* ---- through uattn_forward ---------------------------------------------------------------------------------- */

enum { BS = 16, D = 16, HKV = 2, CAP = 4096 };

/* One prefill of ceil(n / (HKV * D)) tokens whose k rows hold vals and v rows hold them reversed, input
 * dtype `in` (the values rounded to it first), cache t in `layout`; every byte of both caches against the
 * oracle's quantizer. Returns the number of values checked. */
static size_t check_write(uattn_dtype t, uattn_dtype in, uattn_kv_layout layout, float ks, float vs, const float *vals,
                          size_t n) {
  const int32_t T = (int32_t)((n + HKV * D - 1) / (HKV * D)), nb = (T + BS - 1) / BS;
  const size_t kv = (size_t)T * HKV * D, cache = (size_t)nb * BS * HKV * D, esz = oracle_dtype_size(in);
  void *k = calloc(kv, esz), *v = calloc(kv, esz), *q = calloc(kv, esz), *out = calloc(kv, esz);
  uint8_t *kc = malloc(cache), *vc = malloc(cache);
  memset(kc, 0x55, cache);
  memset(vc, 0x55, cache);
  for (size_t i = 0; i < kv; i++) {
    /* bf16 inputs hold the value rounded to bf16 (which keeps every fp8 value and tie exactly) */
    if (in == UATTN_F32) {
      ((float *)k)[i] = vals[i % n];
      ((float *)v)[i] = vals[n - 1 - i % n];
    } else {
      oracle_store(k, in, i, vals[i % n]);
      oracle_store(v, in, i, vals[n - 1 - i % n]);
    }
  }
  int32_t table[64], nc = 0, ns = T, np = T;
  for (int32_t b = 0; b < 64; b++) table[b] = b < nb ? nb - 1 - b : -1; /* blocks in reverse: slots matter */
  uattn_plan_config pc = uattn_plan_config_default(BS, nb, 4, 1024, 64 * BS);
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&pc, &plan), UATTN_OK, "%s", uattn_last_error());
  const uattn_step step = step_requests(1, &nc, &ns, &np, table, 64);
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_layer L = uattn_layer_default(HKV, HKV, D, in);
  L.cache_dtype = t;
  L.kv_layout = layout;
  L.k_scale = ks;
  L.v_scale = vs;
  const uattn_tensors x = {
      .q = q, .k = k, .v = v, .key_cache = kc, .value_cache = vc, .num_blocks = nb, .block_size = BS, .out = out};
  cr_assert_eq(uattn_forward(plan, &L, &x, NULL), UATTN_OK, "%s", uattn_last_error());

  size_t bad = 0;
  for (int32_t p = 0; p < T; p++) {
    const int64_t slot = (int64_t)table[p / BS] * BS + p % BS;
    for (int32_t g = 0; g < HKV; g++) {
      for (int32_t d = 0; d < D; d++) {
        const size_t i = ((size_t)p * HKV + (size_t)g) * D + (size_t)d;
        const size_t ak = oracle_cache_index(&L, BS, slot, g, d, false),
                     av = oracle_cache_index(&L, BS, slot, g, d, true);
        const double xk = oracle_load(k, in, i), xv = oracle_load(v, in, i);
        const uint8_t wk = oracle_quantize_fp8(t, xk, ks), wv = oracle_quantize_fp8(t, xv, vs);
        if (kc[ak] != wk || vc[av] != wv) {
          if (bad++ < 8)
            cr_log_error("%s, %s in, scales %g/%g: k %.9g -> 0x%02x (oracle 0x%02x), v %.9g -> 0x%02x (oracle 0x%02x)",
                         t == UATTN_FP8_E4M3 ? "e4m3" : "e5m2", in == UATTN_F32 ? "f32" : "bf16", (double)ks,
                         (double)vs, xk, kc[ak], wk, xv, vc[av], wv);
        }
      }
    }
  }
  cr_assert_eq(bad, 0, "%zu cache bytes differ from the oracle's quantizer", bad);
  uattn_plan_destroy(plan);
  free(k), free(v), free(q), free(out), free(kc), free(vc);
  return kv;
}

Test(fp8_cache, the_cache_write_bit_for_bit, .timeout = 120) {
  static float vals[CAP];
  /* 3 and 0.5 divide the codes' values exactly; 0.3 and 1/7 do not (the fp32 division rounds) */
  const float scales[] = {1.0f, 0.5f, 3.0f, 0.3f, 1.0f / 7.0f};
  const size_t ns = sizeof scales / sizeof *scales;
  /* each input dtype meets every layout; TILED puts a key's codes 2 apart and a value's 2 keys interleaved */
  const uattn_kv_layout layouts[3] = {UATTN_LAYOUT_NHD, UATTN_LAYOUT_HND, UATTN_LAYOUT_TILED};
  for (int f = 0; f < 2; f++)
    for (size_t s = 0; s < ns; s++) {
      const size_t n = fp8_values(formats[f], scales[s], vals, CAP);
      /* k with this scale, v with the next one: the two scales must not be swapped */
      check_write(formats[f], UATTN_F32, layouts[s % 3], scales[s], scales[(s + 1) % ns], vals, n);
      check_write(formats[f], UATTN_BF16, layouts[(s + 1) % 3], scales[s], scales[(s + 1) % ns], vals, n);
    }
}

/* ---- every key as the cache holds it ------------------------------------------------------------------------ */

/* The step's own keys too (uattn.h, uattn_forward): prompt rows (the causal part: prefills, chunks over a cached
 * context, prefix prefills, bidirectional encoders) beside decodes and verifications, on fp8 caches of both
 * formats with scales that keep the values inside the format and scales that saturate most of them (k_scale
 * 2^-10: |k| / k_scale up to 1024, past E4M3's 448; 2^-16 past E5M2's 57344), and on bf16 and f16 caches under
 * queries of another dtype; every layout, causal widths that cut a prompt into several tiles, and a generated
 * bucket's shape; on every level of the ladder (UATTN_ISA; a level this CPU lacks through its twin). Against the
 * dense fp64 oracle computed on the dequantized cache for every key (attention_run_check: the caches bit for
 * bit, the output within the level's contract, attention_tolerance's input dtype tolerance). A causal part that
 * reads the step's k and v as given misses by the keys' own rounding: up to 2^-4 of a key on E4M3 and more than
 * half of it where it saturates, 2^-9 on a bf16 cache, each far past the 1e-5 of an f32 output. */
/* clang-format off */
static const attention_case as_cached[] = {
    {"e4m3 prefill, saturating",              BATCH_PREFILL,        16,  8, 2, 64,  F32,  E4M3, NHD,   DEC,      0,  0,  0, 0, 0, 0,  301, 0, 0, 0x1p-10f, 0x1p-9f},
    {"e5m2 mixed, saturating, bf16",          BATCH_MIXED,          16,  8, 2, 64,  BF16, E5M2, HND,   DEC,      0,  0,  0, 0, 0, 0,  302, 0, 0, 0x1p-16f, 0x1p-17f},
    {"e4m3 chunked prefill, 16-row tiles",    BATCH_CHUNKED_LONG,   16,  8, 2, 64,  F32,  E4M3, TILED, DEC,      0,  0,  0, 0, 0, 16, 303, 0, 0, 0.5f, 3.0f},
    {"e5m2 prefix prefill, window, sinks",    BATCH_PREFIX_PREFILL, 16,  8, 2, 64,  F32,  E5M2, NHD,   DEC,      0,  40, 1, 0, 0, 0,  304, 0, 0, 3.0f, 0.5f},
    {"e4m3 encoder, saturating",              BATCH_PREFILL,        16,  8, 2, 64,  F32,  E4M3, HND,   ENC,      0,  0,  0, 0, 0, 0,  305, 0, 0, 0x1p-10f, 0x1p-9f},
    {"e4m3 shared prefix, chunked, ALiBi, cap", BATCH_SHARED_PREFIX, 32, 8, 2, 64,  BF16, E4M3, TILED, DEC,      20, 0,  0, 1, 2, 0,  306, 0, 0, 0.5f, 3.0f},
    {"e4m3 prefill, bucket shape, saturating", BATCH_PREFILL,       128, 32, 8, 128, BF16, E4M3, NHD,   DEC,      0,  0,  0, 0, 0, 0,  307, 0, 0, 0x1p-10f, 0x1p-9f},
    {"e5m2 spec decode, split-K",             BATCH_SPEC_DECODE,    16,  8, 2, 64,  F32,  E5M2, HND,   DEC,      0,  0,  0, 0, 0, 0,  308, 64, 48, 0.5f, 3.0f},
    {"bf16 cache, f32 queries, mixed",        BATCH_MIXED,          16,  8, 2, 64,  F32,  BF16, NHD,   DEC,      0,  0,  0, 0, 0, 0,  309},
    {"f16 cache, f32 queries, chunked",       BATCH_CHUNKED_LONG,   16,  8, 2, 64,  F32,  F16,  HND,   DEC,      0,  0,  0, 0, 0, 32, 310},
    {"bf16 cache, f16 queries, prefill",      BATCH_PREFILL,        16,  8, 2, 64,  F16,  BF16, TILED, DEC,      0,  0,  0, 0, 0, 0,  311},
    {"f16 cache, bf16 queries, encoder only", BATCH_PREFIX_PREFILL, 16,  8, 2, 64,  BF16, F16,  NHD,   ENC_ONLY, 0,  0,  1, 0, 0, 0,  312},
};
/* clang-format on */

Test(fp8_cache, every_key_as_the_cache_holds_it, .timeout = 300) {
  static const char *const isas[] = {"portable", "avx2", "avx512", "avx512bf16"};
  const char *forced = getenv("UATTN_ISA");
  for (size_t k = 0; k < sizeof isas / sizeof *isas; k++) {
    setenv("UATTN_ISA", isas[k], 1);
    const char *why;
    const char *set = uattn_kernel_set(&why);
    fprintf(stderr, "every key as the cache holds it: UATTN_ISA=%s runs %s (%s)\n", isas[k], set, why);
    for (size_t i = 0; i < sizeof as_cached / sizeof *as_cached; i++) {
      attention_run run;
      attention_run_build(&run, &as_cached[i]);
      uattn_kernel_report r;
      cr_assert_eq(uattn_describe_kernels(&run.layer, run.c.block_size, &r), UATTN_OK, "%s", uattn_last_error());
      /* bf16 products on a layer whose queries are not bf16 would round them: the dispatch's to refuse
       * (test_dispatch), not a question of which keys the attention reads */
      if (strcmp(r.kernel_set, "avx512bf16") == 0 && run.layer.dtype != UATTN_BF16)
        fprintf(stderr, "  %s: skipped, avx512bf16 would round its %s queries\n", as_cached[i].name,
                run.layer.dtype == UATTN_F32 ? "f32" : "f16");
      else
        attention_run_check(&run);
      attention_run_free(&run);
    }
  }
  if (forced)
    setenv("UATTN_ISA", forced, 1);
  else
    unsetenv("UATTN_ISA");
}
