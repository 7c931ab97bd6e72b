/* Bad input to uattn_forward and the merges: each gets its status and a message, and nothing is written to
 * the caches or the outputs. Also merge_states and merge_partials against hand-worked values. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/attention_case.h"

static attention_run run;
static uattn_tensors t;
static void *k_before, *v_before, *out_before;

static void setup(void) {
  const attention_case c = {
      "errors", BATCH_MIXED, 16, 8, 2, 64, UATTN_F32, UATTN_F32, UATTN_LAYOUT_NHD, UATTN_ATTENTION_DECODER,
      0,        0,           0,  0, 0, 0,  99};
  attention_run_build(&run, &c);
  t = attention_tensors(&run);
  memset(t.out, 0x7b, run.out_bytes);
  k_before = malloc(run.cache_bytes);
  v_before = malloc(run.cache_bytes);
  out_before = malloc(run.out_bytes);
  memcpy(k_before, t.key_cache, run.cache_bytes);
  memcpy(v_before, t.value_cache, run.cache_bytes);
  memcpy(out_before, t.out, run.out_bytes);
}

static void teardown(void) {
  attention_tensors_free(&t);
  attention_run_free(&run);
  free(k_before);
  free(v_before);
  free(out_before);
}

static void expect_refused(const uattn_layer *L, const uattn_tensors *x, uattn_status want, const char *needle) {
  uattn_status st = uattn_forward(run.plan, L, x, NULL);
  cr_assert_eq(st, want, "got %s (%s), want %s", uattn_status_name(st), uattn_last_error(), uattn_status_name(want));
  cr_assert_not_null(strstr(uattn_last_error(), needle), "message '%s' lacks '%s'", uattn_last_error(), needle);
  cr_assert_eq(memcmp(t.key_cache, k_before, run.cache_bytes), 0, "the key cache was written");
  cr_assert_eq(memcmp(t.value_cache, v_before, run.cache_bytes), 0, "the value cache was written");
  cr_assert_eq(memcmp(t.out, out_before, run.out_bytes), 0, "the output was written");
}

TestSuite(attention_errors, .init = setup, .fini = teardown);

Test(attention_errors, null_pointers) {
  cr_assert_eq(uattn_forward(NULL, &run.layer, &t, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_forward(run.plan, NULL, &t, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_forward(run.plan, &run.layer, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  const char *names[] = {"tensors.q",         "tensors.k",           "tensors.v",
                         "tensors.key_cache", "tensors.value_cache", "tensors.out"};
  for (int i = 0; i < 6; i++) {
    uattn_tensors x = t;
    const void **slots[] = {
        &x.q, &x.k, &x.v, (const void **)&x.key_cache, (const void **)&x.value_cache, (const void **)&x.out};
    *slots[i] = NULL;
    expect_refused(&run.layer, &x, UATTN_ERR_INVALID_ARGUMENT, names[i]);
  }
}

Test(attention_errors, layer) {
  uattn_layer L = run.layer;
  L.num_kv_heads = 3;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "multiple of num_kv_heads");
  L = run.layer, L.head_dim = 0;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "head_dim");
  L = run.layer, L.num_q_heads = -8;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "num_q_heads");
  L = run.layer, L.dtype = (uattn_dtype)7;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "dtype");
  L = run.layer, L.kv_layout = (uattn_kv_layout)3;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "kv_layout");
  L = run.layer, L.kv_layout = (uattn_kv_layout)-1;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "kv_layout");
  L = run.layer, L.soft_cap = -1.0f;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "soft_cap");
  L = run.layer, L.scale = NAN;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "scale");
  L = run.layer, L.sliding_window = -4;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "sliding_window");
  L = run.layer, L.attn_type = UATTN_ATTENTION_ENCODER_ONLY, L.sliding_window = 8;
  expect_refused(&L, &t, UATTN_ERR_UNSUPPORTED, "decoder attention only");
  L = run.layer, L.attn_type = (uattn_attention_type)9;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "attn_type");
}

/* TILED stores dims in pairs: an odd head dim is refused (the caches here are sized for D 64, more than D 63
 * needs, which is allowed: the refusal is the layout's, as NHD with the same head dim shows), for every cache
 * dtype, an fp8 one too. */
Test(attention_errors, tiled_needs_an_even_head_dim) {
  const uattn_dtype caches[] = {UATTN_F32, UATTN_BF16, UATTN_FP8_E4M3, UATTN_FP8_E5M2};
  const int32_t dims[] = {63, 33, 1};
  for (size_t c = 0; c < sizeof caches / sizeof *caches; c++)
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
      uattn_layer L = run.layer;
      L.cache_dtype = caches[c];
      L.kv_layout = UATTN_LAYOUT_TILED;
      L.head_dim = dims[i];
      expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "head_dim");
      cr_assert_not_null(strstr(uattn_last_error(), "TILED"), "the message '%s' does not name the layout",
                         uattn_last_error());
    }
  uattn_layer L = run.layer;
  L.head_dim = 63; /* on NHD: accepted */
  cr_assert_eq(uattn_forward(run.plan, &L, &t, NULL), UATTN_OK, "%s", uattn_last_error());
}

/* TILED's tiles are 16 keys of a block: caches of block size 8 or 24 (or 40) are refused, nothing written,
 * whatever the batch; the same plans and caches on NHD and HND are fine. */
Test(attention_errors, tiled_needs_a_block_size_multiple_of_16) {
  const int32_t sizes[] = {8, 24, 40};
  const batch_kind kinds[] = {BATCH_DECODE, BATCH_MIXED, BATCH_SHARED_PREFIX};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    const attention_case c = {
        "tiled block size",      kinds[i], sizes[i], 8, 2, 64, UATTN_BF16, UATTN_BF16, UATTN_LAYOUT_NHD,
        UATTN_ATTENTION_DECODER, 0,        0,        0, 0, 0,  0,          98};
    attention_run r;
    attention_run_build(&r, &c);
    uattn_tensors x = attention_tensors(&r);
    memset(x.out, 0x7b, r.out_bytes);
    void *kb = malloc(r.cache_bytes), *vb = malloc(r.cache_bytes), *ob = malloc(r.out_bytes);
    memcpy(kb, x.key_cache, r.cache_bytes);
    memcpy(vb, x.value_cache, r.cache_bytes);
    memcpy(ob, x.out, r.out_bytes);
    uattn_layer L = r.layer;
    L.kv_layout = UATTN_LAYOUT_TILED;
    const uattn_status st = uattn_forward(r.plan, &L, &x, NULL);
    cr_assert_eq(st, UATTN_ERR_INVALID_ARGUMENT, "block size %d: got %s (%s)", sizes[i], uattn_status_name(st),
                 uattn_last_error());
    const char *msg = uattn_last_error();
    cr_assert(strstr(msg, "TILED") && (strstr(msg, "block_size") || strstr(msg, "block size")),
              "block size %d: the message '%s' does not name the layout and the block size", sizes[i], msg);
    cr_assert_eq(memcmp(x.key_cache, kb, r.cache_bytes), 0, "block size %d: the key cache was written", sizes[i]);
    cr_assert_eq(memcmp(x.value_cache, vb, r.cache_bytes), 0, "block size %d: the value cache was written", sizes[i]);
    cr_assert_eq(memcmp(x.out, ob, r.out_bytes), 0, "block size %d: the output was written", sizes[i]);
    for (int lay = UATTN_LAYOUT_NHD; lay <= UATTN_LAYOUT_HND; lay++) {
      L.kv_layout = (uattn_kv_layout)lay;
      cr_assert_eq(uattn_forward(r.plan, &L, &x, NULL), UATTN_OK, "block size %d, layout %d: %s", sizes[i], lay,
                   uattn_last_error());
    }
    free(kb), free(vb), free(ob);
    attention_tensors_free(&x);
    attention_run_free(&r);
  }
}

/* fp8 is a cache dtype only, and an fp8 cache needs usable scales: a zero, negative, NaN or infinite
 * k_scale / v_scale would store or read infinities and NaNs for finite inputs. The caches here are f32-sized,
 * larger than an fp8 layer needs, which is allowed; nothing may be written. */
Test(attention_errors, fp8_dtypes_and_scales) {
  const uattn_dtype fp8[2] = {UATTN_FP8_E4M3, UATTN_FP8_E5M2};
  const float bad[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
  for (int f = 0; f < 2; f++) {
    uattn_layer L = run.layer;
    L.dtype = fp8[f]; /* q, k, v and out in fp8 */
    expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "dtype");
    L.cache_dtype = fp8[f];
    expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "dtype");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
      L = run.layer, L.cache_dtype = fp8[f], L.k_scale = bad[i];
      expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "k_scale");
      L = run.layer, L.cache_dtype = fp8[f], L.v_scale = bad[i];
      expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "v_scale");
    }
  }
}

/* Multi-head latent attention's fields (uattn.h: head_dim_v, kv_latent). head_dim_v is a width like head_dim:
 * negative or past 4096 is a bad argument. An absorbed layer (kv_latent) needs 0 < head_dim_v <= head_dim (its
 * value is the latent's first head_dim_v dims), no v and no value cache (passing one is a mistake about the layer,
 * refused rather than ignored) and on an fp8 cache v_scale == k_scale (the values are the keys' bytes): bad
 * arguments. A latent on a TILED cache is a layout that has no form for it: unsupported. Nothing is written; the
 * same latent layer on NHD with head_dim_v 32, v and the value cache NULL, is accepted. */
Test(attention_errors, mla_fields) {
  const int32_t bad_widths[] = {-1, -64, INT32_MIN, 4097, INT32_MAX};
  for (size_t i = 0; i < sizeof bad_widths / sizeof *bad_widths; i++) {
    uattn_layer L = run.layer;
    L.head_dim_v = bad_widths[i];
    expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "head_dim_v");
    L.kv_latent = true;
    uattn_tensors x = t;
    x.v = NULL, x.value_cache = NULL;
    expect_refused(&L, &x, UATTN_ERR_INVALID_ARGUMENT, "head_dim_v");
  }
  uattn_layer latent = run.layer;
  latent.kv_latent = true, latent.head_dim_v = 32;
  uattn_tensors x = t;
  x.v = NULL, x.value_cache = NULL;
  /* the value cannot be wider than the latent it is part of, nor absent (0) */
  const int32_t not_in_the_latent[] = {65, 128, 0};
  for (size_t i = 0; i < sizeof not_in_the_latent / sizeof *not_in_the_latent; i++) {
    uattn_layer L = latent;
    L.head_dim_v = not_in_the_latent[i];
    expect_refused(&L, &x, UATTN_ERR_INVALID_ARGUMENT, "head_dim_v");
    cr_assert_not_null(strstr(uattn_last_error(), "kv_latent"), "the message '%s' does not name kv_latent",
                       uattn_last_error());
  }
  /* a latent has no value rows to tile */
  const uattn_dtype caches[] = {UATTN_F32, UATTN_BF16, UATTN_FP8_E4M3};
  for (size_t c = 0; c < sizeof caches / sizeof *caches; c++) {
    uattn_layer L = latent;
    L.kv_layout = UATTN_LAYOUT_TILED, L.cache_dtype = caches[c];
    expect_refused(&L, &x, UATTN_ERR_UNSUPPORTED, "kv_latent");
    cr_assert_not_null(strstr(uattn_last_error(), "TILED"), "the message '%s' does not name the layout",
                       uattn_last_error());
  }
  /* v or a value cache given to a layer that has none */
  {
    uattn_tensors y = x;
    y.v = t.v;
    expect_refused(&latent, &y, UATTN_ERR_INVALID_ARGUMENT, "tensors.v");
    cr_assert_not_null(strstr(uattn_last_error(), "kv_latent"), "'%s' does not say why", uattn_last_error());
    y = x, y.value_cache = t.value_cache;
    expect_refused(&latent, &y, UATTN_ERR_INVALID_ARGUMENT, "tensors.value_cache");
    cr_assert_not_null(strstr(uattn_last_error(), "kv_latent"), "'%s' does not say why", uattn_last_error());
    expect_refused(&latent, &t, UATTN_ERR_INVALID_ARGUMENT, "kv_latent");
  }
  /* fp8: the values are the keys' codes, read with one scale */
  const uattn_dtype fp8[2] = {UATTN_FP8_E4M3, UATTN_FP8_E5M2};
  const float scales[][2] = {{1.0f, 2.0f}, {0.5f, 0.25f}, {3.0f, 1.0f}};
  for (int f = 0; f < 2; f++)
    for (size_t i = 0; i < sizeof scales / sizeof *scales; i++) {
      uattn_layer L = latent;
      L.cache_dtype = fp8[f], L.k_scale = scales[i][0], L.v_scale = scales[i][1];
      expect_refused(&L, &x, UATTN_ERR_INVALID_ARGUMENT, "v_scale");
    }
  /* the same layers made right: accepted (an fp8 one with equal scales; caches here larger than needed) */
  cr_assert_eq(uattn_forward(run.plan, &latent, &x, NULL), UATTN_OK, "%s", uattn_last_error());
  uattn_layer L = latent;
  L.cache_dtype = UATTN_FP8_E4M3, L.k_scale = L.v_scale = 0.5f;
  cr_assert_eq(uattn_forward(run.plan, &L, &x, NULL), UATTN_OK, "%s", uattn_last_error());
  L = latent, L.head_dim_v = 64; /* the whole latent its value */
  cr_assert_eq(uattn_forward(run.plan, &L, &x, NULL), UATTN_OK, "%s", uattn_last_error());
  L = run.layer, L.head_dim_v = 4096; /* an expanded layer's values may be wider than its keys */
  uattn_tensors wide = t;
  float *big_out = calloc((size_t)run.info.num_tokens * run.c.num_q_heads * 4096 + 1, sizeof(float));
  float *big_v = calloc((size_t)run.info.num_tokens * run.c.num_kv_heads * 4096 + 1, sizeof(float));
  float *big_cache = calloc((size_t)run.num_blocks * run.c.block_size * run.c.num_kv_heads * 4096 + 1, sizeof(float));
  wide.out = big_out, wide.v = big_v, wide.value_cache = big_cache;
  cr_assert_eq(uattn_forward(run.plan, &L, &wide, NULL), UATTN_OK, "%s", uattn_last_error());
  free(big_out), free(big_v), free(big_cache);
}

/* out_f32: out holds floats whatever the layer's dtype, so it must be aligned for them. A bf16 layer here (q,
 * k, v: this case's f32 arrays, aligned for anything) and out 2 bytes into its buffer: aligned for bf16, not
 * for fp32. Refused, nothing written; the same pointer as a bf16 out (out_f32 false) is accepted. */
Test(attention_errors, out_f32_misaligned_for_floats) {
  uattn_layer L = run.layer;
  L.dtype = UATTN_BF16;
  uattn_tensors x = t;
  x.out = (char *)t.out + 2;
  x.out_f32 = true;
  expect_refused(&L, &x, UATTN_ERR_INVALID_ARGUMENT, "tensors.out");
  x.out_f32 = false;
  cr_assert_eq(uattn_forward(run.plan, &L, &x, NULL), UATTN_OK, "%s", uattn_last_error());
}

Test(attention_errors, a_plan_for_another_block_size) {
  uattn_tensors x = t;
  x.block_size = 32;
  expect_refused(&run.layer, &x, UATTN_ERR_INCONSISTENT, "block size 16");
}

Test(attention_errors, a_cache_too_small_for_a_slot) {
  uattn_tensors x = t;
  x.num_blocks = 2;
  expect_refused(&run.layer, &x, UATTN_ERR_OUT_OF_RANGE, "too small");
  x.num_blocks = 0;
  expect_refused(&run.layer, &x, UATTN_ERR_INVALID_ARGUMENT, "num_blocks");
}

Test(attention_errors, cross_attention_inputs) {
  uattn_layer L = run.layer;
  L.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
  expect_refused(&L, &t, UATTN_ERR_INVALID_ARGUMENT, "tensors.cross");
  int32_t lens[RB_MAX_REQS] = {0}, table[RB_MAX_REQS * 4];
  for (int i = 0; i < RB_MAX_REQS * 4; i++) table[i] = 0;
  uattn_cross cross = {lens, table, 4};
  uattn_tensors x = t;
  x.cross = &cross;
  lens[1] = -1;
  expect_refused(&L, &x, UATTN_ERR_INVALID_ARGUMENT, "encoder_lens[1]");
  lens[1] = 100; /* 7 blocks of 16, the row holds 4 */
  expect_refused(&L, &x, UATTN_ERR_OUT_OF_RANGE, "past its block-table row");
  lens[1] = 20, table[1 * 4 + 1] = run.num_blocks;
  expect_refused(&L, &x, UATTN_ERR_OUT_OF_RANGE, "cross block table");
  L.alibi_slopes = run.slopes, table[1 * 4 + 1] = 0;
  expect_refused(&L, &x, UATTN_ERR_UNSUPPORTED, "ALiBi");
}

/* ---- merges ------------------------------------------------------------------------------------------ */

/* Two disjoint key sets {s=0: v=1} and {s=ln 3: v=5}: together out = (1*1 + 3*5) / 4 = 4, lse = ln 4. */
Test(merge, merge_states_by_hand) {
  const float o1[1] = {1.0f}, o2[1] = {5.0f}, l1[1] = {0.0f}, l2[1] = {logf(3.0f)};
  const float *outs[] = {o1, o2}, *lses[] = {l1, l2};
  float out[1], lse[1];
  cr_assert_eq(uattn_merge_states(2, outs, lses, 1, 1, 1, out, lse), UATTN_OK);
  cr_assert_float_eq(out[0], 4.0f, 1e-6);
  cr_assert_float_eq(lse[0], logf(4.0f), 1e-6);
  /* a part with no key (lse -inf) changes nothing; all parts empty gives zeros and -inf */
  const float empty_o[1] = {123.0f}, empty_l[1] = {-INFINITY};
  const float *outs3[] = {o1, empty_o}, *lses3[] = {l1, empty_l};
  cr_assert_eq(uattn_merge_states(2, outs3, lses3, 1, 1, 1, out, lse), UATTN_OK);
  cr_assert_float_eq(out[0], 1.0f, 1e-6);
  const float *outs4[] = {empty_o}, *lses4[] = {empty_l};
  cr_assert_eq(uattn_merge_states(1, outs4, lses4, 1, 1, 1, out, lse), UATTN_OK);
  cr_assert_eq(out[0], 0.0f);
  cr_assert(isinf(lse[0]) && lse[0] < 0);
  cr_assert_eq(uattn_merge_states(0, outs, lses, 1, 1, 1, out, lse), UATTN_ERR_INVALID_ARGUMENT);
  const float *bad[] = {o1, NULL};
  cr_assert_eq(uattn_merge_states(2, bad, lses, 1, 1, 1, out, lse), UATTN_ERR_INVALID_ARGUMENT);
}

/* The seed's triplets for the same two key sets: (o=1*e^0, m=0, l=1) and (o=5*e^0, m=ln 3, l=1). */
Test(merge, merge_partials_by_hand) {
  const float o1[1] = {1.0f}, o2[1] = {5.0f}, m1[1] = {0.0f}, m2[1] = {logf(3.0f)}, s1[1] = {1.0f}, s2[1] = {1.0f};
  const float *outs[] = {o1, o2}, *maxes[] = {m1, m2}, *sums[] = {s1, s2};
  float out[1];
  cr_assert_eq(uattn_merge_partials(2, outs, maxes, sums, 1, 1, 1, out), UATTN_OK, "%s", uattn_last_error());
  cr_assert_float_eq(out[0], 4.0f, 1e-6);
  /* an empty part in the seed's form: max -inf (floored to fmin), sum 0 */
  const float mi[1] = {-INFINITY}, s0[1] = {0.0f}, o0[1] = {0.0f};
  const float *outs2[] = {o0}, *maxes2[] = {mi}, *sums2[] = {s0};
  cr_assert_eq(uattn_merge_partials(1, outs2, maxes2, sums2, 1, 1, 1, out), UATTN_OK);
  cr_assert_eq(out[0], 0.0f, "an empty row is zeros, not NaN");
}
