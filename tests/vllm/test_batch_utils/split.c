/* The decode / extend / prefill split of a batch (uattn_split_decodes_and_prefills and the three-way split)
 * on hand-computed cases, random batches built in region order, and bad input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "batch_utils.h"
#include "common/support.h"

/* ================================================================================================ */
/* decode / extend / prefill split                                                                   */
/* ================================================================================================ */

static uattn_batch_split split2(const int32_t *lens, int32_t n, int32_t num_tokens, int32_t thr, bool uniform) {
  int32_t qsl[64];
  qsl_from_lens(lens, n, qsl);
  uattn_batch_split s;
  CHECK_OK(uattn_split_decodes_and_prefills(n, qsl, num_tokens < 0 ? qsl[n] : num_tokens, thr, uniform, &s));
  return s;
}

Test(split, hand_computed_two_way) {
  assert_split(split2((int32_t[]){1, 1, 1}, 3, -1, 1, false), 3, 0, 0, 3, 0, 0, 0);
  assert_split(split2((int32_t[]){1, 1, 5, 7}, 4, -1, 1, false), 2, 0, 2, 2, 0, 12, 1);
  assert_split(split2((int32_t[]){3, 1}, 2, -1, 1, false), 0, 0, 2, 0, 0, 4, 2);
  assert_split(split2((int32_t[]){2, 2, 1, 3}, 4, -1, 2, false), 3, 0, 1, 5, 0, 3, 3);
  /* padded num_actual_tokens: the padding goes to the prefills */
  assert_split(split2((int32_t[]){1, 1, 5}, 3, 10, 1, false), 2, 0, 1, 2, 0, 8, 4);
  /* threshold 0: only empty queries are decodes */
  assert_split(split2((int32_t[]){0, 0, 1}, 3, -1, 0, false), 2, 0, 1, 0, 0, 1, 5);
  /* not reordered: the split is at the first long request, as in the seed */
  assert_split(split2((int32_t[]){1, 4, 1}, 3, -1, 1, false), 1, 0, 2, 1, 0, 5, 6);
  /* an empty batch */
  assert_split(split2(NULL, 0, 0, 1, false), 0, 0, 0, 0, 0, 0, 7);
  assert_split(split2(NULL, 0, 3, 1, true), 0, 0, 0, 3, 0, 0, 8);
}

Test(split, hand_computed_uniform) {
  /* threshold > 1 with require_uniform goes on to compare lengths even when all are short */
  assert_split(split2((int32_t[]){2, 2, 2}, 3, -1, 2, true), 3, 0, 0, 6, 0, 0, 0);
  assert_split(split2((int32_t[]){2, 2, 1, 3}, 4, -1, 2, true), 2, 0, 2, 4, 0, 4, 1);
  assert_split(split2((int32_t[]){2, 2, 1, 3}, 4, -1, 2, false), 3, 0, 1, 5, 0, 3, 2);
  /* zero-length requests are padding of a captured uniform batch, counted in num_tokens */
  assert_split(split2((int32_t[]){2, 0, 2}, 3, 6, 2, true), 3, 0, 0, 6, 0, 0, 3);
  /* ... but not when some other length breaks the uniformity: then the 0 is where the prefills start */
  assert_split(split2((int32_t[]){2, 0, 2, 3}, 4, -1, 3, true), 1, 0, 3, 2, 0, 5, 4);
  /* threshold <= 1: the seed returns all-decode before looking at uniformity */
  assert_split(split2((int32_t[]){1, 0, 1}, 3, -1, 1, true), 3, 0, 0, 2, 0, 0, 5);
  /* first request too long: no decodes */
  assert_split(split2((int32_t[]){3, 2, 2}, 3, -1, 2, true), 0, 0, 3, 0, 0, 7, 6);
}

Test(split, uniform_batch_with_unpadded_token_count_is_inconsistent) {
  int32_t qsl[] = {0, 2, 2, 4}; /* lengths 2, 0, 2: uniform with padding, so num_tokens must be 6 */
  uattn_batch_split s;
  memset(&s, 0xA5, sizeof s);
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, untouched_bytes(&s, sizeof s),
              uattn_split_decodes_and_prefills(3, qsl, 4, 2, true, &s));
  assert_msg_has("6");
}

static uattn_batch_split split3(const int32_t *lens, const int32_t *seq, int32_t n, int32_t num_tokens, int32_t thr) {
  int32_t qsl[64];
  qsl_from_lens(lens, n, qsl);
  uattn_batch_split s;
  CHECK_OK(uattn_split_decodes_prefills_and_extends(n, qsl, seq, num_tokens < 0 ? qsl[n] : num_tokens, thr, &s));
  return s;
}

Test(split, hand_computed_three_way) {
  assert_split(split3((int32_t[]){1, 1, 4, 3, 6, 2}, (int32_t[]){10, 20, 30, 3, 6, 2}, 6, -1, 1), 2, 1, 3, 2, 4, 11, 0);
  assert_split(split3((int32_t[]){1, 5}, (int32_t[]){3, 9}, 2, -1, 1), 1, 1, 0, 1, 5, 0, 1);
  assert_split(split3((int32_t[]){1, 1}, (int32_t[]){3, 1}, 2, -1, 1), 2, 0, 0, 2, 0, 0, 2);
  assert_split(split3((int32_t[]){4, 4}, (int32_t[]){4, 4}, 2, -1, 1), 0, 0, 2, 0, 0, 8, 3);
  /* a short prompt after the first extend counts as an extend (the seed's rule) */
  assert_split(split3((int32_t[]){1, 5, 1, 4}, (int32_t[]){9, 9, 1, 4}, 4, -1, 1), 1, 2, 1, 1, 6, 4, 4);
  /* padding tokens go to the prefills, or to the extends when there is no prefill */
  assert_split(split3((int32_t[]){1, 5, 4}, (int32_t[]){9, 9, 4}, 3, 13, 1), 1, 1, 1, 1, 5, 7, 5);
  assert_split(split3((int32_t[]){1, 5}, (int32_t[]){9, 9}, 2, 9, 1), 1, 1, 0, 1, 8, 0, 6);
  assert_split(split3(NULL, NULL, 0, 2, 1), 0, 0, 0, 2, 0, 0, 7);
}

/* Builds a batch already in decode -> extend -> prefill order with known region sizes; the split must
 * find exactly those regions. Region sizes and lengths are drawn independently of the library. */
Test(split, property_ordered_batches_split_into_their_regions) {
  test_rng rng = {11};
  for (int it = 0; it < 3000; it++) {
    int32_t thr = test_rng_range(&rng, 0, 4);
    int32_t nd = test_rng_range(&rng, 0, 6), ne = test_rng_range(&rng, 0, 6), np = test_rng_range(&rng, 0, 6);
    int32_t n = nd + ne + np, lens[18], seq[18], td = 0, te = 0, tp = 0;
    for (int32_t i = 0; i < n; i++) {
      if (i < nd) { /* decodes: short; with or without context */
        lens[i] = test_rng_range(&rng, 0, thr);
        seq[i] = lens[i] + test_rng_range(&rng, 0, 5);
        td += lens[i];
      } else if (i < nd + ne) { /* extends: long, with context */
        lens[i] = test_rng_range(&rng, thr + 1, thr + 9);
        seq[i] = lens[i] + test_rng_range(&rng, 1, 30);
        te += lens[i];
      } else { /* prefills: long, no context */
        lens[i] = test_rng_range(&rng, thr + 1, thr + 9);
        seq[i] = lens[i];
        tp += lens[i];
      }
    }
    int32_t pad = test_rng_range(&rng, 0, 1) ? test_rng_range(&rng, 0, 4) : 0;
    int32_t total = td + te + tp + pad;
    uattn_batch_split s3 = split3(lens, seq, n, total, thr);
    if (ne + np == 0)
      assert_split(s3, n, 0, 0, total, 0, 0, it);
    else if (np == 0)
      assert_split(s3, nd, ne, 0, td, te + pad, 0, it);
    else
      assert_split(s3, nd, ne, np, td, te, tp + pad, it);
    uattn_batch_split s2 = split2(lens, n, total, thr, false);
    if (ne + np == 0)
      assert_split(s2, n, 0, 0, total, 0, 0, it);
    else
      assert_split(s2, nd, 0, ne + np, td, 0, te + tp + pad, it);
  }
}

/* Uniform decodes of one length q (some padded to 0), then requests of other lengths. */
Test(split, property_uniform_decodes) {
  test_rng rng = {12};
  for (int it = 0; it < 3000; it++) {
    int32_t thr = test_rng_range(&rng, 2, 5), q = test_rng_range(&rng, 1, thr);
    int32_t nd = test_rng_range(&rng, 1, 8), np = test_rng_range(&rng, 0, 5), n = nd + np, lens[16];
    int32_t real = 0, tp = 0;
    for (int32_t i = 0; i < n; i++) {
      if (i < nd) {
        lens[i] = (i > 0 && np == 0 && test_rng_range(&rng, 0, 3) == 0) ? 0 : q; /* pads only when uniform */
        real += lens[i];
      } else {
        do lens[i] = test_rng_range(&rng, 1, 9);
        while (lens[i] == q);
        tp += lens[i];
      }
    }
    if (np == 0) {
      /* the padded count the seed demands: every request at q */
      assert_split(split2(lens, n, nd * q, thr, true), n, 0, 0, nd * q, 0, 0, it);
    } else {
      assert_split(split2(lens, n, -1, thr, true), nd, 0, np, real, 0, tp, it);
    }
  }
}

/* Unordered batches: the seed's rule re-stated as "the longest prefix of short requests". */
Test(split, property_any_order_matches_prefix_rule) {
  test_rng rng = {13};
  for (int it = 0; it < 3000; it++) {
    int32_t n = test_rng_range(&rng, 1, 12), thr = test_rng_range(&rng, 0, 3), lens[12], seq[12], qsl[13];
    for (int32_t i = 0; i < n; i++) {
      lens[i] = test_rng_range(&rng, 0, 6);
      seq[i] = lens[i] + (test_rng_range(&rng, 0, 2) ? test_rng_range(&rng, 1, 9) : 0);
    }
    qsl_from_lens(lens, n, qsl);
    int32_t prefix = 0;
    while (prefix < n && lens[prefix] <= thr) prefix++;
    int32_t first_prefill = n;
    for (int32_t i = prefix; i < n; i++)
      if (lens[i] > thr && seq[i] == lens[i]) {
        first_prefill = i;
        break;
      }
    uattn_batch_split s2 = split2(lens, n, -1, thr, false);
    assert_split(s2, prefix, 0, n - prefix, qsl[prefix], 0, qsl[n] - qsl[prefix], it);
    uattn_batch_split s3 = split3(lens, seq, n, -1, thr);
    if (prefix == n)
      assert_split(s3, n, 0, 0, qsl[n], 0, 0, it);
    else
      assert_split(s3, prefix, first_prefill - prefix, n - first_prefill, qsl[prefix], qsl[first_prefill] - qsl[prefix],
                   qsl[n] - qsl[first_prefill], it);
  }
}

Test(split, bad_inputs) {
  int32_t qsl[] = {0, 1, 3}, seq[] = {4, 2}, bad_down[] = {0, 3, 2}, bad_start[] = {1, 2, 3}, short_seq[] = {4, 1};
  uattn_batch_split s;
  memset(&s, 0xA5, sizeof s);
#define UNTOUCHED untouched_bytes(&s, sizeof s)
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_and_prefills(2, qsl, 3, 1, false, NULL));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_and_prefills(2, NULL, 3, 1, false, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_and_prefills(-1, qsl, 3, 1, false, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_and_prefills(2, qsl, 3, -1, false, &s));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED, uattn_split_decodes_and_prefills(2, qsl, 2, 1, false, &s));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED, uattn_split_decodes_and_prefills(2, bad_down, 3, 1, false, &s));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED, uattn_split_decodes_and_prefills(2, bad_start, 3, 1, false, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(2, qsl, seq, 3, 1, NULL));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(2, qsl, NULL, 3, 1, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(2, NULL, seq, 3, 1, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(-3, qsl, seq, 3, 1, &s));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(2, qsl, seq, 3, -2, &s));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(2, qsl, short_seq, 3, 1, &s));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(2, bad_down, seq, 3, 1, &s));
  CHECK_FAILS(UATTN_ERR_INCONSISTENT, UNTOUCHED, uattn_split_decodes_prefills_and_extends(2, qsl, seq, 1, 1, &s));
#undef UNTOUCHED
}
