/* Where keys go: the slot mapping, the chunks a prefill is cut into, and the local sequence lengths of
 * decode context parallelism, each on worked or hand-computed cases, against a plain walk, and on bad input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "batch_utils.h"
#include "common/support.h"

/* ================================================================================================ */
/* slot mapping                                                                                       */
/* ================================================================================================ */

/* The seed's comment: prompt of 10, sliding window 8, block size 4 -> [-1, -1, 2, 3, 4, 5, 6, 7, 0, 1]
 * (the window's third block reuses block 0). */
Test(slot_mapping, seed_worked_example) {
  int32_t start = -1, n = -1, table[] = {0, 1, 0};
  CHECK_OK(uattn_compute_slot_mapping_start_idx(true, 10, 0, 8, &start));
  cr_assert_eq(start, 2);
  int64_t slots[10];
  CHECK_OK(uattn_compute_slot_mapping(false, 10, 0, start, 4, table, 3, slots, 10, &n));
  cr_assert_eq(n, 10);
  int64_t want[] = {-1, -1, 2, 3, 4, 5, 6, 7, 0, 1};
  for (int i = 0; i < 10; i++) cr_assert_eq(slots[i], want[i], "slot %d = %lld", i, (long long)slots[i]);
}

Test(slot_mapping, hand_computed) {
  int32_t start = -1, n = -1;
  CHECK_OK(uattn_compute_slot_mapping_start_idx(false, 10, 0, 8, &start));
  cr_assert_eq(start, 0); /* decodes keep everything */
  CHECK_OK(uattn_compute_slot_mapping_start_idx(true, 10, 0, 0, &start));
  cr_assert_eq(start, 0); /* no window */
  CHECK_OK(uattn_compute_slot_mapping_start_idx(true, 5, 30, 8, &start));
  cr_assert_eq(start, 0); /* the seed measures from the query length, not from the end */
  CHECK_OK(uattn_compute_slot_mapping_start_idx(true, 12, 30, 8, &start));
  cr_assert_eq(start, 4);
  /* chunked prefill: positions 4..9 of a request whose blocks are 7, 3, 9 */
  int32_t table[] = {7, 3, 9};
  int64_t slots[8];
  fill64(slots, 8);
  CHECK_OK(uattn_compute_slot_mapping(false, 10, 4, 0, 4, table, 3, slots, 8, &n));
  cr_assert_eq(n, 6);
  int64_t want[] = {12, 13, 14, 15, 36, 37};
  for (int i = 0; i < 6; i++) cr_assert_eq(slots[i], want[i]);
  cr_assert(untouched64(slots + 6, 2));
  /* start inside the new tokens: the ones before it are padding */
  CHECK_OK(uattn_compute_slot_mapping(false, 10, 4, 6, 4, table, 3, slots, 8, &n));
  int64_t want2[] = {-1, -1, 14, 15, 36, 37};
  for (int i = 0; i < 6; i++) cr_assert_eq(slots[i], want2[i]);
  /* a profile run: pad slots for the whole sequence, no block table needed */
  CHECK_OK(uattn_compute_slot_mapping(true, 5, 0, 0, 16, NULL, 0, slots, 8, &n));
  cr_assert_eq(n, 5);
  for (int i = 0; i < 5; i++) cr_assert_eq(slots[i], UATTN_PAD_SLOT_ID);
  /* nothing to write */
  CHECK_OK(uattn_compute_slot_mapping(false, 4, 4, 0, 4, NULL, 0, NULL, 0, &n));
  cr_assert_eq(n, 0);
  /* the largest slot fits int64 */
  int32_t big[] = {INT32_MAX};
  CHECK_OK(uattn_compute_slot_mapping(false, 1, 0, 0, INT32_MAX, big, 1, slots, 1, &n));
  cr_assert_eq(slots[0], (int64_t)INT32_MAX * INT32_MAX);
}

Test(slot_mapping, property_against_position_walk) {
  test_rng rng = {41};
  int64_t slots[64];
  int32_t table[40];
  for (int it = 0; it < 5000; it++) {
    int32_t bs = test_rng_range(&rng, 1, 8), seq = test_rng_range(&rng, 0, 40), ctx = test_rng_range(&rng, 0, seq);
    int32_t window = test_rng_range(&rng, 0, 20), start = -1, n = -1;
    bool prompt = test_rng_range(&rng, 0, 1), profile = test_rng_range(&rng, 0, 9) == 0;
    int32_t blocks = (seq + bs - 1) / bs;
    for (int32_t b = 0; b < blocks; b++) table[b] = test_rng_range(&rng, 0, 500);
    CHECK_OK(uattn_compute_slot_mapping_start_idx(prompt, seq - ctx, ctx, window, &start));
    int32_t want_start = (prompt && window > 0 && seq - ctx > window) ? seq - ctx - window : 0;
    cr_assert_eq(start, want_start);
    fill64(slots, 64);
    CHECK_OK(uattn_compute_slot_mapping(profile, seq, ctx, start, bs, table, blocks, slots, 64, &n));
    if (profile) {
      cr_assert_eq(n, seq);
      for (int32_t i = 0; i < seq; i++) cr_assert_eq(slots[i], -1);
    } else {
      cr_assert_eq(n, seq - ctx);
      for (int32_t p = ctx; p < seq; p++) {
        int64_t want = p < start ? -1 : (int64_t)table[p / bs] * bs + p % bs;
        cr_assert_eq(slots[p - ctx], want, "case %d: position %d slot %lld, expected %lld", it, p,
                     (long long)slots[p - ctx], (long long)want);
      }
    }
    cr_assert(untouched64(slots + n, (size_t)(64 - n)));
  }
}

Test(slot_mapping, bad_inputs) {
  int32_t table[] = {7, 3, 9}, neg[] = {7, -3, 9}, n = S32, start = S32;
  int64_t slots[8];
  fill64(slots, 8);
#define UNTOUCHED (untouched64(slots, 8) && n == S32 && start == S32)
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED, uattn_compute_slot_mapping(false, 10, 0, 0, 4, table, 3, slots, 8, &n));
  assert_msg_has("10");
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED, uattn_compute_slot_mapping(true, 10, 4, 0, 4, NULL, 0, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_OUT_OF_RANGE, UNTOUCHED,
              uattn_compute_slot_mapping(false, 13, 6, 0, 4, table, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_OUT_OF_RANGE, UNTOUCHED, uattn_compute_slot_mapping(false, 10, 4, 0, 4, neg, 3, slots, 8, &n));
  int32_t pad_id[] = {7, UATTN_PAD_SLOT_ID, 9}; /* a padding entry is not a block either */
  CHECK_FAILS(UATTN_ERR_OUT_OF_RANGE, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 0, 4, pad_id, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 0, 4, NULL, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 0, 4, table, 3, NULL, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 0, 4, table, 3, slots, 8, NULL));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 0, 0, table, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, -1, 0, 0, 4, table, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, -4, 0, 4, table, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, -1, 4, table, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 0, 4, table, -3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 0, 4, table, 3, slots, -8, &n));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 11, 0, 4, table, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_compute_slot_mapping(false, 10, 4, 11, 4, table, 3, slots, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_slot_mapping_start_idx(true, 10, 0, 8, NULL));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_slot_mapping_start_idx(true, -1, 0, 8, &start));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_slot_mapping_start_idx(true, 10, -1, 8, &start));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_slot_mapping_start_idx(true, 10, 0, -8, &start));
#undef UNTOUCHED
}

/* ================================================================================================ */
/* prefill chunks                                                                                     */
/* ================================================================================================ */

Test(prefill_chunks, hand_computed) {
  uattn_req_range c[8];
  int32_t n = -1;
  CHECK_OK(uattn_split_prefill_chunks((int32_t[]){3, 4, 2, 5}, 4, 7, 10, c, 8, &n));
  cr_assert_eq(n, 2);
  cr_assert(c[0].start == 10 && c[0].end == 12 && c[1].start == 12 && c[1].end == 14);
  CHECK_OK(uattn_split_prefill_chunks((int32_t[]){5, 5, 5}, 3, 9, 0, c, 3, &n));
  cr_assert(n == 3 && c[2].start == 2 && c[2].end == 3);
  CHECK_OK(uattn_split_prefill_chunks((int32_t[]){0, 0}, 2, 0, 0, c, 8, &n)); /* empty requests all fit */
  cr_assert(n == 1 && c[0].start == 0 && c[0].end == 2);
  CHECK_OK(uattn_split_prefill_chunks(NULL, 0, 5, 3, NULL, 0, &n));
  cr_assert_eq(n, 0);
}

Test(prefill_chunks, property_cover_fit_and_greedy) {
  test_rng rng = {51};
  uattn_req_range c[20];
  for (int it = 0; it < 5000; it++) {
    int32_t ws = test_rng_range(&rng, 0, 30), m = test_rng_range(&rng, 0, 20), off = test_rng_range(&rng, 0, 5);
    int32_t seq[20], n = -1;
    for (int32_t i = 0; i < m; i++) seq[i] = test_rng_range(&rng, 0, ws);
    CHECK_OK(uattn_split_prefill_chunks(seq, m, ws, off, c, m, &n));
    int32_t at = 0;
    for (int32_t k = 0; k < n; k++) {
      cr_assert_eq(c[k].start, at + off, "case %d: chunk %d starts at %d", it, k, c[k].start);
      cr_assert_gt(c[k].end, c[k].start);
      int32_t sum = 0;
      for (int32_t i = c[k].start - off; i < c[k].end - off; i++) sum += seq[i];
      cr_assert_leq(sum, ws);
      if (c[k].end - off < m) cr_assert_gt(sum + seq[c[k].end - off], ws, "case %d: chunk %d could take more", it, k);
      at = c[k].end - off;
    }
    cr_assert_eq(at, m);
  }
}

Test(prefill_chunks, bad_inputs) {
  int32_t seq[] = {3, 4, 2, 5}, n = S32, neg[] = {3, -4};
  uattn_req_range c[8];
  memset(c, 0xA5, sizeof c);
#define UNTOUCHED (untouched_bytes(c, sizeof c) && n == S32)
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, 7, 0, c, 1, &n));
  assert_msg_has("2");
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, 4, 0, c, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, -1, 0, c, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, 7, -1, c, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(seq, -4, 7, 0, c, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(NULL, 4, 7, 0, c, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, 7, 0, NULL, 8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, 7, 0, c, 8, NULL));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, 7, 0, c, -8, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_prefill_chunks(neg, 2, 7, 0, c, 8, &n));
  CHECK_FAILS(UATTN_ERR_OVERFLOW, UNTOUCHED, uattn_split_prefill_chunks(seq, 4, 7, INT32_MAX - 2, c, 8, &n));
#undef UNTOUCHED
}

/* ================================================================================================ */
/* DCP local sequence lengths                                                                        */
/* ================================================================================================ */

Test(dcp, hand_computed) {
  int32_t seq[] = {10, 11, 0, 1}, out[8];
  CHECK_OK(uattn_compute_dcp_local_seq_lens(seq, 4, 2, -1, 1, out, 8));
  assert_i32s(out, (int32_t[]){5, 5, 6, 5, 0, 0, 1, 0}, 8, "all ranks, interleave 1", 0);
  /* runs of 2: rank 0 holds keys 0,1,4,5,8,9 of 11, rank 1 holds 2,3,6,7,10 */
  CHECK_OK(uattn_compute_dcp_local_seq_lens(seq, 4, 2, -1, 2, out, 8));
  assert_i32s(out, (int32_t[]){6, 4, 6, 5, 0, 0, 1, 0}, 8, "all ranks, interleave 2", 1);
  CHECK_OK(uattn_compute_dcp_local_seq_lens(seq, 4, 2, 1, 2, out, 4));
  assert_i32s(out, (int32_t[]){4, 5, 0, 0}, 4, "rank 1", 2);
  CHECK_OK(uattn_compute_dcp_local_seq_lens(seq, 4, 1, 0, 3, out, 4)); /* one rank holds everything */
  assert_i32s(out, seq, 4, "one rank", 3);
}

Test(dcp, property_against_dealing_keys) {
  test_rng rng = {61};
  int32_t seq[8], out[64], want[64];
  for (int it = 0; it < 3000; it++) {
    int32_t n = test_rng_range(&rng, 0, 8), d = test_rng_range(&rng, 1, 8), il = test_rng_range(&rng, 1, 5);
    int32_t rank = test_rng_range(&rng, -1, d - 1);
    for (int32_t r = 0; r < n; r++) seq[r] = test_rng_range(&rng, 0, 90);
    /* deal the keys one by one: key j goes to rank (j / interleave) % dcp_size */
    for (int32_t r = 0; r < n; r++) {
      for (int32_t k = 0; k < d; k++) want[r * d + k] = 0;
      for (int32_t j = 0; j < seq[r]; j++) want[r * d + (j / il) % d]++;
    }
    fill32(out, 64);
    CHECK_OK(uattn_compute_dcp_local_seq_lens(seq, n, d, rank, il, out, 64));
    if (rank < 0) {
      assert_i32s(out, want, n * d, "dcp", it);
      cr_assert(untouched32(out + n * d, (size_t)(64 - n * d)));
    } else {
      for (int32_t r = 0; r < n; r++) cr_assert_eq(out[r], want[r * d + rank]);
      cr_assert(untouched32(out + n, (size_t)(64 - n)));
    }
  }
}

Test(dcp, bad_inputs) {
  int32_t seq[] = {10, 11}, neg[] = {10, -1}, out[8];
  fill32(out, 8);
#define UNTOUCHED untouched32(out, 8)
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 4, -1, 1, out, 7));
  assert_msg_has("8");
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 4, 0, 1, out, 1));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 4, 4, 1, out, 8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 4, -2, 1, out, 8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 0, -1, 1, out, 8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 4, -1, 0, out, 8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, -2, 4, -1, 1, out, 8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(NULL, 2, 4, -1, 1, out, 8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 4, -1, 1, NULL, 8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, 2, 4, -1, 1, out, -8));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_compute_dcp_local_seq_lens(neg, 2, 4, -1, 1, out, 8));
  /* requests x ranks past int32 */
  CHECK_FAILS(UATTN_ERR_OVERFLOW, UNTOUCHED, uattn_compute_dcp_local_seq_lens(seq, INT32_MAX / 2, 4, -1, 1, out, 8));
#undef UNTOUCHED
}
