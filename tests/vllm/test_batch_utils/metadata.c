/* The metadata makers: KV-sharing fast prefill, causal conv1d programs, and the attention types' query / key
 * counts and sequence-length block tables, each on hand-computed cases, against a plain scan, and on bad input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "batch_utils.h"
#include "common/support.h"

/* ================================================================================================ */
/* KV-sharing fast prefill                                                                           */
/* ================================================================================================ */

/* The seed's comment: generation indices [14, 18, 19, 27], query_start_loc [0, 15, 20, 28] ->
 * request ids [0, 1, 1, 2], per-request counts [1, 2, 1], query_start_loc [0, 1, 3, 4]. */
Test(fast_prefill, seed_worked_example) {
  int32_t qsl[] = {0, 15, 20, 28}, logits[] = {14, 18, 19, 27}, out[4];
  uattn_fast_prefill_info info;
  CHECK_OK(uattn_make_kv_sharing_fast_prefill_metadata(3, qsl, logits, 4, out, &info));
  assert_i32s(out, (int32_t[]){0, 1, 3, 4}, 4, "query_start_loc", 0);
  cr_assert(!info.unchanged);
  cr_assert_eq(info.num_actual_tokens, 4);
  cr_assert_eq(info.max_query_len, 2);
}

Test(fast_prefill, hand_computed) {
  int32_t out[5];
  uattn_fast_prefill_info info;
  /* all decodes: returned as is, logits not needed */
  int32_t qsl1[] = {0, 1, 2, 2, 3};
  CHECK_OK(uattn_make_kv_sharing_fast_prefill_metadata(4, qsl1, NULL, 0, out, &info));
  assert_i32s(out, qsl1, 5, "unchanged", 0);
  cr_assert(info.unchanged && info.num_actual_tokens == 3 && info.max_query_len == 1);
  /* empty requests never own a row; unsorted and repeated indices count once per entry (bincount) */
  int32_t qsl2[] = {0, 3, 3, 5}, logits[] = {4, 0, 3, 4};
  CHECK_OK(uattn_make_kv_sharing_fast_prefill_metadata(3, qsl2, logits, 4, out, &info));
  assert_i32s(out, (int32_t[]){0, 1, 1, 4}, 4, "with an empty request", 1);
  cr_assert(!info.unchanged && info.num_actual_tokens == 4 && info.max_query_len == 3);
  /* no logits at all */
  CHECK_OK(uattn_make_kv_sharing_fast_prefill_metadata(3, qsl2, NULL, 0, out, &info));
  assert_i32s(out, (int32_t[]){0, 0, 0, 0}, 4, "no logits", 2);
  cr_assert(info.num_actual_tokens == 0 && info.max_query_len == 0);
}

Test(fast_prefill, property_against_linear_scan) {
  test_rng rng = {71};
  int32_t out[17], want[17], logits[80], lens[16], qsl[17];
  uattn_fast_prefill_info info;
  for (int it = 0; it < 3000; it++) {
    int32_t n = test_rng_range(&rng, 0, 16), nl = 0;
    for (int32_t r = 0; r < n; r++) lens[r] = test_rng_range(&rng, 0, 5);
    qsl_from_lens(lens, n, qsl);
    int32_t maxq = 0;
    for (int32_t r = 0; r < n; r++) maxq = lens[r] > maxq ? lens[r] : maxq;
    if (qsl[n] > 0) nl = test_rng_range(&rng, 0, qsl[n]);
    for (int32_t i = 0; i < nl; i++) logits[i] = test_rng_range(&rng, 0, qsl[n] - 1);
    fill32(out, 17);
    CHECK_OK(uattn_make_kv_sharing_fast_prefill_metadata(n, qsl, logits, nl, out, &info));
    cr_assert(untouched32(out + n + 1, (size_t)(16 - n)));
    if (maxq == 1) {
      cr_assert(info.unchanged);
      assert_i32s(out, qsl, n + 1, "unchanged", it);
      continue;
    }
    for (int32_t r = 0; r <= n; r++) want[r] = 0;
    for (int32_t i = 0; i < nl; i++)
      for (int32_t r = 0; r < n; r++)
        if (qsl[r] <= logits[i] && logits[i] < qsl[r + 1]) want[r + 1]++;
    int32_t most = 0;
    for (int32_t r = 0; r < n; r++) {
      most = want[r + 1] > most ? want[r + 1] : most;
      want[r + 1] += want[r];
    }
    assert_i32s(out, want, n + 1, "query_start_loc", it);
    cr_assert(!info.unchanged && info.num_actual_tokens == nl && info.max_query_len == most);
  }
}

Test(fast_prefill, bad_inputs) {
  int32_t qsl[] = {0, 15, 20, 28}, logits[] = {14, 18, 28}, neg[] = {-1}, down[] = {0, 15, 14, 28}, out[4];
  uattn_fast_prefill_info info;
  fill32(out, 4);
  memset(&info, 0xA5, sizeof info);
#define UNTOUCHED (untouched32(out, 4) && untouched_bytes(&info, sizeof info))
  CHECK_FAILS(UATTN_ERR_OUT_OF_RANGE, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, qsl, logits, 3, out, &info));
  CHECK_FAILS(UATTN_ERR_OUT_OF_RANGE, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, qsl, neg, 1, out, &info));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, qsl, NULL, 2, out, &info));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, qsl, logits, -1, out, &info));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(-3, qsl, logits, 2, out, &info));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, NULL, logits, 2, out, &info));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, qsl, logits, 2, NULL, &info));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, qsl, logits, 2, out, NULL));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_make_kv_sharing_fast_prefill_metadata(3, down, logits, 2, out, &info));
#undef UNTOUCHED
}

/* ================================================================================================ */
/* causal conv1d                                                                                      */
/* ================================================================================================ */

Test(causal_conv1d, hand_computed) {
  int32_t qsl[] = {0, 8, 9, 25, 25}, nums[4], bp[2048], off[2048], tot = -1, len = -1;
  CHECK_OK(uattn_count_causal_conv1d_programs(qsl, 4, UATTN_CAUSAL_CONV1D_BLOCK_M, &tot, &len));
  cr_assert(tot == 4 && len == 2048);
  CHECK_OK(uattn_compute_causal_conv1d_metadata(qsl, 4, UATTN_CAUSAL_CONV1D_BLOCK_M, nums, bp, off, 2048, &tot));
  cr_assert_eq(tot, 4);
  assert_i32s(nums, (int32_t[]){1, 1, 2, 0}, 4, "nums", 0);
  assert_i32s(bp, (int32_t[]){0, 1, 2, 2}, 4, "batch_ptr", 0);
  assert_i32s(off, (int32_t[]){0, 0, 0, 1}, 4, "token_chunk_offset_ptr", 0);
  for (int i = 4; i < 2048; i++) cr_assert(bp[i] == UATTN_PAD_SLOT_ID && off[i] == UATTN_PAD_SLOT_ID);
  /* only diffs matter: the prefills' own query_start_loc may start past 0 */
  int32_t shifted[] = {7, 15, 16, 32, 32};
  CHECK_OK(uattn_compute_causal_conv1d_metadata(shifted, 4, 8, NULL, bp, off, 4, &tot));
  assert_i32s(bp, (int32_t[]){0, 1, 2, 2}, 4, "batch_ptr (shifted)", 1);
  /* more programs than the seed's 1024 floor: buffers of twice the need */
  int32_t big[] = {0, 8 * 1500};
  CHECK_OK(uattn_count_causal_conv1d_programs(big, 1, 8, &tot, &len));
  cr_assert(tot == 1500 && len == 3000);
  /* the seed buffer length may be skipped, and then cannot overflow */
  int32_t huge[] = {0, INT32_MAX};
  CHECK_OK(uattn_count_causal_conv1d_programs(huge, 1, 1, &tot, NULL));
  cr_assert_eq(tot, INT32_MAX);
}

Test(causal_conv1d, property_against_token_walk) {
  test_rng rng = {81};
  static int32_t bp[600], off[600], nums[10], want_b[600], want_o[600];
  for (int it = 0; it < 3000; it++) {
    int32_t n = test_rng_range(&rng, 0, 10), bm = test_rng_range(&rng, 1, 9), qsl[11], tot = -1;
    qsl[0] = test_rng_range(&rng, 0, 5);
    for (int32_t r = 0; r < n; r++) qsl[r + 1] = qsl[r] + test_rng_range(&rng, 0, 50);
    /* walk the tokens: a new program starts at every block_m-th token of a request */
    int32_t w = 0;
    for (int32_t r = 0; r < n; r++)
      for (int32_t t = 0; t < qsl[r + 1] - qsl[r]; t++)
        if (t % bm == 0) {
          want_b[w] = r;
          want_o[w] = t / bm;
          w++;
        }
    int32_t cap = w + test_rng_range(&rng, 0, 20);
    fill32(bp, 600);
    fill32(off, 600);
    CHECK_OK(uattn_compute_causal_conv1d_metadata(qsl, n, bm, nums, bp, off, cap, &tot));
    cr_assert_eq(tot, w);
    assert_i32s(bp, want_b, w, "batch_ptr", it);
    assert_i32s(off, want_o, w, "token_chunk_offset_ptr", it);
    for (int32_t i = w; i < cap; i++) cr_assert(bp[i] == -1 && off[i] == -1);
    cr_assert(untouched32(bp + cap, (size_t)(600 - cap)) && untouched32(off + cap, (size_t)(600 - cap)));
    for (int32_t r = 0; r < n; r++) {
      int32_t c = 0;
      for (int32_t i = 0; i < w; i++) c += want_b[i] == r;
      cr_assert_eq(nums[r], c);
    }
  }
}

Test(causal_conv1d, bad_inputs) {
  int32_t qsl[] = {0, 8, 9, 25, 25}, down[] = {0, 8, 7}, neg[] = {-1, 8}, nums[4], bp[8], off[8];
  int32_t tot = S32, len = S32;
  fill32(nums, 4);
  fill32(bp, 8);
  fill32(off, 8);
#define UNTOUCHED (untouched32(nums, 4) && untouched32(bp, 8) && untouched32(off, 8) && tot == S32 && len == S32)
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED, uattn_compute_causal_conv1d_metadata(qsl, 4, 8, nums, bp, off, 3, &tot));
  assert_msg_has("4");
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(qsl, 4, 0, nums, bp, off, 8, &tot));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(qsl, -4, 8, nums, bp, off, 8, &tot));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(NULL, 4, 8, nums, bp, off, 8, &tot));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(qsl, 4, 8, nums, NULL, off, 8, &tot));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(qsl, 4, 8, nums, bp, NULL, 8, &tot));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(qsl, 4, 8, nums, bp, off, 8, NULL));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(qsl, 4, 8, nums, bp, off, -8, &tot));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(down, 2, 8, nums, bp, off, 8, &tot));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_causal_conv1d_metadata(neg, 1, 8, nums, bp, off, 8, &tot));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_count_causal_conv1d_programs(qsl, 4, 8, NULL, &len));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_count_causal_conv1d_programs(qsl, 4, -8, &tot, &len));
  int32_t huge2[] = {0, INT32_MAX, INT32_MAX};
  /* the seed's buffer length (2 x INT32_MAX) does not fit */
  CHECK_FAILS(UATTN_ERR_OVERFLOW, UNTOUCHED, uattn_count_causal_conv1d_programs(huge2, 2, 1, &tot, &len));
#undef UNTOUCHED
}

/* ================================================================================================ */
/* attention types                                                                                    */
/* ================================================================================================ */

Test(attention_types, query_kv_tokens) {
  uattn_query_kv_tokens t;
  CHECK_OK(uattn_count_query_kv_tokens(UATTN_ATTENTION_DECODER, 100, 7, -1, &t));
  cr_assert(t.num_prefill_query_tokens == 100 && t.num_prefill_kv_tokens == 100 && t.num_decode_query_tokens == 7);
  CHECK_OK(uattn_count_query_kv_tokens(UATTN_ATTENTION_ENCODER_ONLY, 100, 7, 55, &t));
  cr_assert(t.num_prefill_query_tokens == 100 && t.num_prefill_kv_tokens == 100 && t.num_decode_query_tokens == 7);
  CHECK_OK(uattn_count_query_kv_tokens(UATTN_ATTENTION_ENCODER, 100, 7, 55, &t));
  cr_assert(t.num_prefill_query_tokens == 55 && t.num_prefill_kv_tokens == 55 && t.num_decode_query_tokens == 0);
  CHECK_OK(uattn_count_query_kv_tokens(UATTN_ATTENTION_ENCODER_DECODER, 100, 7, 55, &t));
  cr_assert(t.num_prefill_query_tokens == 100 && t.num_prefill_kv_tokens == 55 && t.num_decode_query_tokens == 7);
}

Test(attention_types, seq_len_block_table) {
  int32_t seq[2] = {5, 9}, bt[4] = {0}, enc[2] = {12, 3}, cross[6] = {0};
  uattn_attention_metadata m = {.seq_lens = seq,
                                .max_prefill_seq_len = 9,
                                .max_decode_seq_len = 6,
                                .block_tables = bt,
                                .block_tables_stride = 2,
                                .encoder_seq_lens = enc,
                                .max_encoder_seq_len = 12,
                                .cross_block_tables = cross,
                                .cross_block_tables_stride = 3};
  uattn_seq_len_block_table t;
  CHECK_OK(uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_DECODER, &t));
  cr_assert(t.seq_lens == seq && t.max_seq_len == 9 && t.block_tables == bt && t.block_tables_stride == 2);
  CHECK_OK(uattn_select_seq_len_block_table(&m, false, UATTN_ATTENTION_DECODER, &t));
  cr_assert(t.seq_lens == seq && t.max_seq_len == 6 && t.block_tables == bt);
  CHECK_OK(uattn_select_seq_len_block_table(&m, false, UATTN_ATTENTION_ENCODER_DECODER, &t));
  cr_assert(t.seq_lens == enc && t.max_seq_len == 12 && t.block_tables == cross && t.block_tables_stride == 3);
  CHECK_OK(uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_ENCODER, &t));
  cr_assert(t.seq_lens == enc && t.max_seq_len == 12 && t.block_tables == NULL);
  /* decoder fields are not needed for encoder attention */
  uattn_attention_metadata enc_only = {.encoder_seq_lens = enc, .max_encoder_seq_len = 12};
  CHECK_OK(uattn_select_seq_len_block_table(&enc_only, true, UATTN_ATTENTION_ENCODER, &t));
}

Test(attention_types, bad_inputs) {
  uattn_query_kv_tokens t;
  uattn_seq_len_block_table s;
  memset(&t, 0xA5, sizeof t);
  memset(&s, 0xA5, sizeof s);
#define UNTOUCHED (untouched_bytes(&t, sizeof t) && untouched_bytes(&s, sizeof s))
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_query_kv_tokens(UATTN_ATTENTION_ENCODER, 1, 1, -1, &t));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_query_kv_tokens(UATTN_ATTENTION_ENCODER_DECODER, 1, 1, -1, &t));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_count_query_kv_tokens((uattn_attention_type)9, 1, 1, 1, &t));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_query_kv_tokens(UATTN_ATTENTION_DECODER, -1, 1, 1, &t));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_query_kv_tokens(UATTN_ATTENTION_DECODER, 1, -1, 1, &t));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_query_kv_tokens(UATTN_ATTENTION_DECODER, 1, 1, -2, &t));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_query_kv_tokens(UATTN_ATTENTION_DECODER, 1, 1, 1, NULL));
  int32_t seq[2] = {5, 9}, bt[4] = {0}, enc[2] = {12, 3};
  uattn_attention_metadata m = {.seq_lens = seq,
                                .max_prefill_seq_len = 9,
                                .max_decode_seq_len = -1,
                                .block_tables = bt,
                                .block_tables_stride = 2,
                                .encoder_seq_lens = enc,
                                .max_encoder_seq_len = 12};
  CHECK_FAILS(UATTN_ERR_UNSUPPORTED, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_ENCODER_ONLY, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, (uattn_attention_type)-1, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, false, UATTN_ATTENTION_DECODER, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_ENCODER_DECODER, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(NULL, true, UATTN_ATTENTION_DECODER, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_DECODER, NULL));
  m.block_tables_stride = -2;
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_DECODER, &s));
  m.block_tables = NULL;
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_DECODER, &s));
  m.encoder_seq_lens = NULL;
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_ENCODER, &s));
  m.encoder_seq_lens = enc;
  m.max_encoder_seq_len = -1;
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_select_seq_len_block_table(&m, true, UATTN_ATTENTION_ENCODER, &s));
#undef UNTOUCHED
}
