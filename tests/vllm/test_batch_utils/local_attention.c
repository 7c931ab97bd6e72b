/* The local attention virtual batches (uattn_count_local_attention_virtual_batches and its maker) on the
 * seed's worked example, against a walk over positions, and on bad input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch_utils.h"
#include "common/support.h"

/* ================================================================================================ */
/* local attention virtual batches                                                                   */
/* ================================================================================================ */

/* The worked example in the seed's comments. */
Test(local_attention, seed_worked_example) {
  int32_t qsl[] = {0, 4, 14, 19}, seq[] = {6, 17, 9}, bt[30];
  for (int i = 0; i < 30; i++) bt[i] = i; /* rows 0..9, 10..19, 20..29 */
  int32_t nb = 0, pages = 0;
  CHECK_OK(uattn_count_local_attention_virtual_batches(4, 2, 3, qsl, seq, &nb, &pages));
  cr_assert_eq(nb, 8);
  cr_assert_eq(pages, 2);
  int32_t lq[9], lk[8], lc[8], lbt[16], lr[8];
  uattn_local_batches out = {
      .capacity = 8, .query_start_loc = lq, .seq_lens = lk, .num_computed = lc, .block_table = lbt, .req_indices = lr};
  CHECK_OK(uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, seq, bt, 10, &out));
  cr_assert_eq(out.num_batches, 8);
  cr_assert_eq(out.pages_per_batch, 2);
  /* seqlens_q_local = [2, 2, 1, 4, 4, 1, 4, 1] */
  assert_i32s(lq, (int32_t[]){0, 2, 4, 5, 9, 13, 14, 18, 19}, 9, "query_start_loc", 0);
  assert_i32s(lk, (int32_t[]){4, 2, 4, 4, 4, 1, 4, 1}, 8, "seq_lens", 0);
  assert_i32s(lc, (int32_t[]){2, 0, 3, 0, 0, 0, 0, 0}, 8, "num_computed", 0);
  assert_i32s(lbt, (int32_t[]){0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19, 22, 23, 24, 25}, 16, "block_table", 0);
  assert_i32s(lr, (int32_t[]){0, 0, 1, 1, 1, 1, 2, 2}, 8, "req_indices", 0);
  cr_assert_eq(out.max_query_len, 4);
  cr_assert_eq(out.max_seq_len, 4);
}

/* The brute force: walk every query position, cut at chunk boundaries, and read the keys and pages of
 * each piece directly from positions. */
typedef struct local_ref {
  int32_t n, qsl[512], seq[512], comp[512], req[512], bt[4096];
} local_ref;

static void local_brute(int32_t chunk, int32_t bs, int32_t num_reqs, const int32_t *qsl, const int32_t *seq,
                        const int32_t *bt, int32_t cols, local_ref *r) {
  int32_t pages = chunk / bs;
  r->n = 0;
  r->qsl[0] = 0;
  for (int32_t i = 0; i < num_reqs; i++) {
    int32_t q = qsl[i + 1] - qsl[i], first = seq[i] - q;
    int32_t p = first;
    do {
      /* one virtual batch per chunk touched; an empty query still makes one (the seed's quirk) */
      int32_t chunk_start, keys, count = 0;
      if (q == 0) {
        chunk_start = seq[i] > 0 ? (seq[i] - 1) / chunk * chunk : -chunk;
        keys = seq[i] - chunk_start;
      } else {
        chunk_start = p / chunk * chunk;
        while (p < seq[i] && p / chunk * chunk == chunk_start) {
          p++;
          count++;
        }
        keys = p - chunk_start; /* up to the last query of the piece (the whole chunk unless the last) */
      }
      int32_t v = r->n++;
      r->qsl[v + 1] = r->qsl[v] + count;
      r->seq[v] = keys;
      r->comp[v] = keys - count;
      r->req[v] = i;
      for (int32_t j = 0; j < pages; j++) {
        int32_t col = (chunk_start >= 0 ? chunk_start / bs : -((-chunk_start + bs - 1) / bs)) + j;
        if (col > cols - 1) col = cols - 1;
        if (col < 0) col += cols;
        r->bt[v * pages + j] = bt[i * cols + col];
      }
    } while (p < seq[i]);
  }
}

Test(local_attention, property_against_position_walk) {
  test_rng rng = {31};
  static local_ref ref;
  static int32_t bt[16 * 64], lq[513], lk[512], lc[512], lbt[4096], lr[512];
  for (int it = 0; it < 2000; it++) {
    int32_t bs = 1 << test_rng_range(&rng, 0, 3), chunk = bs * test_rng_range(&rng, 1, 4);
    int32_t n = test_rng_range(&rng, 0, 8), qsl[9] = {0}, seq[8], cols = 1;
    for (int32_t i = 0; i < n; i++) {
      int32_t q = test_rng_range(&rng, 0, 3 * chunk), c = test_rng_range(&rng, 0, 3 * chunk);
      if (test_rng_range(&rng, 0, 9) == 0) q = c = 0;
      qsl[i + 1] = qsl[i] + q;
      seq[i] = q + c;
      cols = seq[i] / bs + 1 > cols ? seq[i] / bs + 1 : cols;
    }
    cols = cols + test_rng_range(&rng, -2, 2);
    if (cols < chunk / bs) cols = chunk / bs;
    for (int32_t i = 0; i < n * cols; i++) bt[i] = test_rng_range(&rng, 0, 999);
    local_brute(chunk, bs, n, qsl, seq, bt, cols, &ref);
    int32_t nb = -1, pages = -1;
    CHECK_OK(uattn_count_local_attention_virtual_batches(chunk, bs, n, qsl, seq, &nb, &pages));
    cr_assert_eq(nb, ref.n, "case %d: %d virtual batches, expected %d", it, nb, ref.n);
    uattn_local_batches out = {.capacity = nb,
                               .query_start_loc = lq,
                               .seq_lens = lk,
                               .num_computed = lc,
                               .block_table = lbt,
                               .req_indices = lr};
    CHECK_OK(uattn_make_local_attention_virtual_batches(chunk, bs, n, qsl, seq, bt, cols, &out));
    cr_assert_eq(out.num_batches, ref.n);
    assert_i32s(lq, ref.qsl, ref.n + 1, "query_start_loc", it);
    assert_i32s(lk, ref.seq, ref.n, "seq_lens", it);
    assert_i32s(lc, ref.comp, ref.n, "num_computed", it);
    assert_i32s(lr, ref.req, ref.n, "req_indices", it);
    assert_i32s(lbt, ref.bt, ref.n * pages, "block_table", it);
    int32_t mq = 0, mk = 0;
    for (int32_t v = 0; v < ref.n; v++) {
      mq = ref.qsl[v + 1] - ref.qsl[v] > mq ? ref.qsl[v + 1] - ref.qsl[v] : mq;
      mk = ref.seq[v] > mk ? ref.seq[v] : mk;
    }
    cr_assert_eq(out.max_query_len, mq);
    cr_assert_eq(out.max_seq_len, mk);
    /* no array to fill: the same counts, computed per request */
    uattn_local_batches counts_only = {.capacity = 0};
    CHECK_OK(uattn_make_local_attention_virtual_batches(chunk, bs, n, qsl, seq, bt, cols, &counts_only));
    cr_assert_eq(counts_only.num_batches, ref.n);
    cr_assert_eq(counts_only.max_query_len, mq, "case %d", it);
    cr_assert_eq(counts_only.max_seq_len, mk, "case %d", it);
    /* only the block table, from a changed table (the seed's make_block_table) */
    for (int32_t i = 0; i < n * cols; i++) bt[i] += 1000;
    fill32(lbt, 4096);
    uattn_local_batches only_bt = {.capacity = nb, .block_table = lbt};
    CHECK_OK(uattn_make_local_attention_virtual_batches(chunk, bs, n, qsl, seq, bt, cols, &only_bt));
    for (int32_t i = 0; i < ref.n * pages; i++) cr_assert_eq(lbt[i], ref.bt[i] + 1000);
    cr_assert(untouched32(lbt + ref.n * pages, (size_t)(4096 - ref.n * pages)), "wrote past the block table");
  }
}

/* Found by tests/fuzz/fuzz_batch_utils: with no array to fill, the call still walked every
 * virtual batch, 2^31 - 1 of them for one request of INT32_MAX tokens at chunk 1 (3.6 s optimized, in a
 * call that writes three numbers; now microseconds). An alarm, not Criterion's .timeout (see the top of
 * the file), ends a walk: SIGALRM fails the test. */
Test(local_attention, no_array_to_fill_does_not_walk_the_batches) {
  const int32_t qsl[] = {0, INT32_MAX}, seq[] = {INT32_MAX};
  uattn_local_batches out = {.capacity = 0};
  alarm(2);
  CHECK_OK(uattn_make_local_attention_virtual_batches(1, 1, 1, qsl, seq, NULL, 1, &out));
  alarm(0);
  cr_assert_eq(out.num_batches, INT32_MAX);
  cr_assert_eq(out.max_query_len, 1);
  cr_assert_eq(out.max_seq_len, 1);
}

Test(local_attention, bad_inputs) {
  int32_t qsl[] = {0, 4, 14, 19}, seq[] = {6, 17, 9}, bt[30] = {0}, short_seq[] = {6, 9, 9}, down[] = {0, 4, 3, 19};
  int32_t lq[9], lk[8], lc[8], lbt[16], lr[8], nb = S32, pages = S32;
  uattn_local_batches out = {
      .capacity = 8, .query_start_loc = lq, .seq_lens = lk, .num_computed = lc, .block_table = lbt, .req_indices = lr};
  fill32(lq, 9);
  fill32(lk, 8);
  fill32(lc, 8);
  fill32(lbt, 16);
  fill32(lr, 8);
  out.num_batches = out.pages_per_batch = out.max_query_len = out.max_seq_len = S32;
  const uattn_local_batches saved = out;
#define UNTOUCHED                                                                                                      \
  (untouched32(lq, 9) && untouched32(lk, 8) && untouched32(lc, 8) && untouched32(lbt, 16) && untouched32(lr, 8) &&     \
   out.num_batches == S32 && out.pages_per_batch == S32 && out.max_query_len == S32 && out.max_seq_len == S32 &&       \
   nb == S32 && pages == S32)
  out.capacity = 7;
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, seq, bt, 10, &out));
  assert_msg_has("8");
  out = saved;
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(6, 4, 3, qsl, seq, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(0, 2, 3, qsl, seq, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 0, 3, qsl, seq, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, -2, 3, qsl, seq, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, -3, qsl, seq, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, NULL, seq, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, NULL, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, seq, NULL, 10, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, seq, bt, 0, &out));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, seq, bt, 10, NULL));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, short_seq, bt, 10, &out));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, down, seq, bt, 10, &out));
  out.capacity = -1;
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(4, 2, 3, qsl, seq, bt, 10, &out));
  out = saved;
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_local_attention_virtual_batches(4, 2, 3, qsl, seq, NULL, &pages));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_count_local_attention_virtual_batches(4, 2, 3, qsl, seq, &nb, NULL));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_count_local_attention_virtual_batches(4, 3, 3, qsl, seq, &nb, &pages));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED,
              uattn_count_local_attention_virtual_batches(4, 2, 3, qsl, short_seq, &nb, &pages));
  /* more virtual batches than int32 can count: INT32_MAX one-token chunks plus one empty request */
  int32_t big_qsl[] = {0, INT32_MAX, INT32_MAX}, big_seq[] = {INT32_MAX, 0};
  CHECK_FAILS(UATTN_ERR_OVERFLOW, UNTOUCHED,
              uattn_count_local_attention_virtual_batches(1, 1, 2, big_qsl, big_seq, &nb, &pages));
  /* a block table of more entries than int32 can count (2^28 batches x 8 pages) */
  out.capacity = INT32_MAX;
  CHECK_FAILS(UATTN_ERR_OVERFLOW, UNTOUCHED,
              uattn_make_local_attention_virtual_batches(8, 1, 1, big_qsl, big_seq, bt, 1, &out));
#undef UNTOUCHED
}
