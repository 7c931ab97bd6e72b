/* The vLLM batch utilities (runtime/vllm/) against: the seeds' own worked examples, hand-computed
 * cases, brute-force re-statements written here as plain loops over tokens and positions (not the
 * library's arithmetic), an exhaustive breadth-first search for the fewest swaps, golden outputs of a
 * numpy re-statement of the seed code (tests/ref/vllm_utils_ref.py), and every kind of bad input, which
 * must fail with a message and leave every output as it was. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/support.h"
#include "uattn.h"
#include "uattn_vllm.h"

/* No .timeout here: with timeouts and --jobs 2, Criterion 2.4.1's runner leaks in the parent process and
 * LeakSanitizer then fails the whole suite. ctest's own timeout catches a hang. */

#define S32 ((int32_t)0x5A5A5A5A) /* sentinel: outputs are pre-filled with it to see what a call wrote */
#define S64 ((int64_t)0x5A5A5A5A5A5A5A5ALL)

static void fill32(int32_t *a, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] = S32;
}
static void fill64(int64_t *a, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] = S64;
}
static bool untouched32(const int32_t *a, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != S32) return false;
  return true;
}
static bool untouched64(const int64_t *a, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != S64) return false;
  return true;
}
static bool untouched_bytes(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != 0xA5) return false;
  return true;
}

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, UATTN_OK, "%s returned %s: %s", #call, uattn_status_name(st_), uattn_last_error());              \
  } while (0)

/* A call that must fail with `want`, say why, and leave the outputs as they were (`untouched`). */
#define CHECK_FAILS(want, untouched, call)                                                                             \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, (want), "%s returned %s, expected %s (%s)", #call, uattn_status_name(st_),                       \
                 uattn_status_name(want), uattn_last_error());                                                         \
    cr_assert_neq(uattn_last_error()[0], '\0', "%s failed without a message", #call);                                  \
    cr_assert((untouched), "%s wrote to an output although it failed", #call);                                         \
  } while (0)

static void assert_msg_has(const char *needle) {
  cr_assert(strstr(uattn_last_error(), needle) != NULL, "message \"%s\" does not mention \"%s\"", uattn_last_error(),
            needle);
}

static void assert_i32s(const int32_t *got, const int32_t *want, int32_t n, const char *what, int case_no) {
  for (int32_t i = 0; i < n; i++)
    cr_assert_eq(got[i], want[i], "case %d: %s[%d] = %d, expected %d", case_no, what, i, got[i], want[i]);
}

static void qsl_from_lens(const int32_t *lens, int32_t n, int32_t *qsl) {
  qsl[0] = 0;
  for (int32_t i = 0; i < n; i++) qsl[i + 1] = qsl[i] + lens[i];
}

static void assert_split(uattn_batch_split got, int32_t nd, int32_t ne, int32_t np, int32_t tdt, int32_t tet,
                         int32_t tpt, int case_no) {
  cr_assert(got.num_decodes == nd && got.num_extends == ne && got.num_prefills == np && got.num_decode_tokens == tdt &&
                got.num_extend_tokens == tet && got.num_prefill_tokens == tpt,
            "case %d: got (%d, %d, %d, %d, %d, %d), expected (%d, %d, %d, %d, %d, %d)", case_no, got.num_decodes,
            got.num_extends, got.num_prefills, got.num_decode_tokens, got.num_extend_tokens, got.num_prefill_tokens, nd,
            ne, np, tdt, tet, tpt);
}

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

/* ================================================================================================ */
/* reorder                                                                                            */
/* ================================================================================================ */

/* Regions as the seed defines them: 2 prefill (no context), 0 decode (short), 1 extend. */
static int region(int32_t sched, int32_t comp, int32_t thr) { return comp == 0 ? 2 : (sched <= thr ? 0 : 1); }

/* Regions as today's vLLM defines them: 3 prefill (no context), 2 long extend (more than thr tokens), 0
 * decode (short, prompt done), 1 short extend (short, prompt not done). */
static int region4(int32_t sched, int32_t comp, int32_t prompt, int32_t thr) {
  if (comp == 0) return 3;
  if (sched > thr) return 2;
  return comp >= prompt ? 0 : 1;
}

/* The region of request i under the seed's rule (prompt NULL) or today's. */
static int region_at(const int32_t *sched, const int32_t *comp, const int32_t *prompt, int32_t thr, int32_t i) {
  return prompt ? region4(sched[i], comp[i], prompt[i], thr) : region(sched[i], comp[i], thr);
}

/* A request of a given region under threshold thr. */
static void request_of_region(test_rng *rng, int r, int32_t thr, int32_t *sched, int32_t *comp) {
  if (r == 2) {
    *comp = 0;
    *sched = test_rng_range(rng, 0, thr + 5);
  } else {
    *comp = test_rng_range(rng, 1, 50);
    *sched = r == 0 ? test_rng_range(rng, 0, thr) : test_rng_range(rng, thr + 1, thr + 8);
  }
}

/* Applies the swaps to the identity and checks the result is in region order and matches `order`. */
static void check_reordered(const int32_t *sched, const int32_t *comp, const int32_t *prompt, int32_t n, int32_t thr,
                            const uattn_swap *swaps, int32_t num_swaps, const int32_t *order, int case_no) {
  int32_t *batch = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  for (int32_t i = 0; i < n; i++) batch[i] = i;
  for (int32_t k = 0; k < num_swaps; k++) {
    cr_assert(swaps[k].a >= 0 && swaps[k].a < n && swaps[k].b >= 0 && swaps[k].b < n && swaps[k].a != swaps[k].b,
              "case %d: swap %d = (%d, %d) is not a swap of two positions", case_no, k, swaps[k].a, swaps[k].b);
    int32_t t = batch[swaps[k].a];
    batch[swaps[k].a] = batch[swaps[k].b];
    batch[swaps[k].b] = t;
  }
  for (int32_t i = 1; i < n; i++) {
    int prev = region_at(sched, comp, prompt, thr, batch[i - 1]), cur = region_at(sched, comp, prompt, thr, batch[i]);
    cr_assert(prev <= cur, "case %d: after the swaps position %d (region %d) follows region %d", case_no, i, cur, prev);
  }
  if (order) assert_i32s(order, batch, n, "order", case_no);
  free(batch);
}

/* The seed's own swap sequence, re-stated: move the misplaced requests, taken in (region, position)
 * order, onto the misplaced positions in position order, following each cycle of that assignment. */
static int32_t seed_swap_count(const int *regions, int32_t n) {
  int32_t cnt[3] = {0, 0, 0}, m = 0, k = 0, swaps = 0;
  for (int32_t i = 0; i < n; i++) cnt[regions[i]]++;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n ? n : 1)), *src = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  int32_t *dst_of = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  for (int32_t i = 0; i < n; i++) {
    int target = i < cnt[0] ? 0 : (i < cnt[0] + cnt[1] ? 1 : 2);
    dst_of[i] = -1;
    if (regions[i] != target) pos[m++] = i;
  }
  for (int r = 0; r < 3; r++)
    for (int32_t j = 0; j < m; j++)
      if (regions[pos[j]] == r) src[k++] = pos[j];
  for (int32_t j = 0; j < m; j++) dst_of[src[j]] = pos[j];
  for (int32_t j = 0; j < m; j++) {
    int32_t s = src[j], d = dst_of[s];
    while (s != d) {
      swaps++;
      int32_t next = dst_of[d] < 0 ? d : dst_of[d];
      dst_of[d] = d;
      d = next;
    }
  }
  free(pos);
  free(src);
  free(dst_of);
  return swaps;
}

Test(reorder, fewer_swaps_than_the_seed_on_its_bad_case) {
  /* regions 1, 2, 0, 1 (extend, prefill, decode, extend): the seed takes 3 swaps, 2 suffice */
  int32_t sched[] = {5, 3, 1, 5}, comp[] = {4, 0, 4, 4}, order[4];
  int regions[] = {1, 2, 0, 1};
  uattn_swap swaps[4];
  int32_t n = 0;
  CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, comp, 1, swaps, 4, &n, order));
  cr_assert_eq(n, 2);
  cr_assert_eq(seed_swap_count(regions, 4), 3);
  check_reordered(sched, comp, NULL, 4, 1, swaps, n, order, 0);
}

Test(reorder, ordered_batch_needs_no_swap) {
  int32_t sched[] = {1, 1, 7, 9, 3}, comp[] = {5, 6, 2, 0, 0}, order[5];
  uattn_swap swaps[1];
  int32_t n = -1;
  fill32(order, 5);
  CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(5, sched, comp, 1, swaps, 0, &n, order));
  cr_assert_eq(n, 0);
  assert_i32s(order, (int32_t[]){0, 1, 2, 3, 4}, 5, "order", 0);
  CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(0, NULL, NULL, 1, NULL, 0, &n, NULL));
  cr_assert_eq(n, 0);
  /* a 1-token prompt is a prefill (no context), so it goes to the back even though it is short */
  int32_t sched2[] = {1, 1}, comp2[] = {0, 3};
  CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(2, sched2, comp2, 1, swaps, 1, &n, order));
  cr_assert_eq(n, 1);
  cr_assert(swaps[0].a + swaps[0].b == 1);
}

/* Breadth-first search over every swap sequence, for every batch of up to 8 requests: the library's
 * count must be the distance to the nearest ordered arrangement. States are region strings in base 3. */
#define BFS_MAX_N 8
Test(reorder, fewest_swaps_against_breadth_first_search) {
  static int16_t dist[6561]; /* 3^8 */
  static int32_t queue[6561];
  test_rng rng = {21};
  int32_t pow3[BFS_MAX_N + 1] = {1};
  for (int i = 1; i <= BFS_MAX_N; i++) pow3[i] = pow3[i - 1] * 3;
  long checked = 0, strictly_better = 0;
  for (int n = 1; n <= BFS_MAX_N; n++) {
    for (int c0 = 0; c0 <= n; c0++)
      for (int c1 = 0; c0 + c1 <= n; c1++) {
        /* BFS from the one ordered arrangement with these counts; swaps are their own inverse. */
        for (int32_t s = 0; s < pow3[n]; s++) dist[s] = -1;
        int32_t sorted = 0;
        for (int i = 0; i < n; i++) sorted += (i < c0 ? 0 : (i < c0 + c1 ? 1 : 2)) * pow3[i];
        int32_t head = 0, tail = 0;
        dist[sorted] = 0;
        queue[tail++] = sorted;
        while (head < tail) {
          int32_t s = queue[head++];
          for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) {
              int di = (s / pow3[i]) % 3, dj = (s / pow3[j]) % 3;
              if (di == dj) continue;
              int32_t t = s + (dj - di) * pow3[i] + (di - dj) * pow3[j];
              if (dist[t] < 0) {
                dist[t] = (int16_t)(dist[s] + 1);
                queue[tail++] = t;
              }
            }
        }
        for (int32_t q = 0; q < tail; q++) {
          int32_t s = queue[q], sched[BFS_MAX_N], comp[BFS_MAX_N], order[BFS_MAX_N], num = -1;
          int regions[BFS_MAX_N];
          int32_t thr = test_rng_range(&rng, 0, 3);
          for (int i = 0; i < n; i++) {
            regions[i] = (s / pow3[i]) % 3;
            request_of_region(&rng, regions[i], thr, &sched[i], &comp[i]);
          }
          uattn_swap swaps[BFS_MAX_N];
          CHECK_OK(
              uattn_reorder_batch_to_split_decodes_and_prefills(n, sched, comp, thr, swaps, BFS_MAX_N, &num, order));
          cr_assert_eq(num, dist[s], "n=%d state %d: %d swaps, the fewest possible is %d", n, s, num, dist[s]);
          check_reordered(sched, comp, NULL, n, thr, swaps, num, order, (int)s);
          int32_t seed = seed_swap_count(regions, n);
          cr_assert(seed >= num);
          strictly_better += seed > num;
          checked++;
        }
      }
  }
  cr_assert_eq(checked, 9840); /* 3 + 9 + ... + 3^8: every arrangement was reached */
  cr_assert_gt(strictly_better, 0);
}

Test(reorder, property_large_random_batches) {
  test_rng rng = {22};
  enum { N = 300 };
  static int32_t sched[N], comp[N], order[N];
  static int regions[N];
  static uattn_swap swaps[N];
  for (int it = 0; it < 300; it++) {
    int32_t n = test_rng_range(&rng, 0, N), thr = test_rng_range(&rng, 0, 4), num = -1;
    int32_t w0 = test_rng_range(&rng, 0, 4), w1 = test_rng_range(&rng, 0, 4); /* skew the mix */
    for (int32_t i = 0; i < n; i++) {
      int32_t x = test_rng_range(&rng, 0, w0 + w1 + 2);
      regions[i] = x <= w0 ? 0 : (x <= w0 + w1 + 1 ? 1 : 2);
      request_of_region(&rng, regions[i], thr, &sched[i], &comp[i]);
    }
    CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(n, sched, comp, thr, swaps, N, &num, order));
    check_reordered(sched, comp, NULL, n, thr, swaps, num, order, it);
    cr_assert(num <= (n > 0 ? n - 1 : 0), "case %d: %d swaps for %d requests", it, num, n);
    cr_assert(num <= seed_swap_count(regions, n));
    /* lower bound: a swap fixes at most two misplaced requests */
    int32_t cnt[3] = {0, 0, 0}, misplaced = 0;
    for (int32_t i = 0; i < n; i++) cnt[regions[i]]++;
    for (int32_t i = 0; i < n; i++) misplaced += regions[i] != (i < cnt[0] ? 0 : (i < cnt[0] + cnt[1] ? 1 : 2));
    cr_assert(2 * num >= misplaced);
    /* without the optional order */
    int32_t num2 = -1;
    CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(n, sched, comp, thr, swaps, N, &num2, NULL));
    cr_assert_eq(num2, num);
  }
}

/* Both reorders; with the prompt lengths below the batch is regions 2, 3, 0, 2 of four (2 swaps). */
Test(reorder, bad_inputs) {
  int32_t sched[] = {5, 3, 1, 5}, comp[] = {4, 0, 4, 4}, neg[] = {5, -1, 1, 5}, prompt[] = {9, 3, 2, 4},
          zero[] = {9, 3, 0, 4};
  uattn_swap swaps[4];
  int32_t order[4], n;
  memset(swaps, 0xA5, sizeof swaps);
  fill32(order, 4);
  n = S32;
#define UNTOUCHED (untouched_bytes(swaps, sizeof swaps) && untouched32(order, 4) && n == S32)
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, comp, 1, swaps, 1, &n, order));
  assert_msg_has("2");
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, comp, 1, swaps, 4, NULL, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, NULL, comp, 1, swaps, 4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, NULL, 1, swaps, 4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, comp, 1, NULL, 4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(-1, sched, comp, 1, swaps, 4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, comp, -1, swaps, 4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, comp, 1, swaps, -4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, neg, comp, 1, swaps, 4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, neg, 1, swaps, 4, &n, order));
#define REORDER4(ns, nc, np, thr, cap, out)                                                                            \
  uattn_reorder_batch_with_prompt_lens(4, ns, nc, np, thr, swaps, cap, out, order)
  CHECK_FAILS(UATTN_ERR_CAPACITY, UNTOUCHED, REORDER4(sched, comp, prompt, 1, 1, &n));
  assert_msg_has("2");
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, comp, NULL, 1, 4, &n));
  assert_msg_has("num_prompt");
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, comp, zero, 1, 4, &n));
  assert_msg_has("num_prompt[2]");
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, comp, neg, 1, 4, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(neg, comp, prompt, 1, 4, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, neg, prompt, 1, 4, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(NULL, comp, prompt, 1, 4, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, NULL, prompt, 1, 4, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, comp, prompt, -1, 4, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, comp, prompt, 1, -1, &n));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED, REORDER4(sched, comp, prompt, 1, 4, NULL));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_with_prompt_lens(-1, sched, comp, prompt, 1, swaps, 4, &n, order));
  CHECK_FAILS(UATTN_ERR_INVALID_ARGUMENT, UNTOUCHED,
              uattn_reorder_batch_with_prompt_lens(4, sched, comp, prompt, 1, NULL, 4, &n, order));
#undef REORDER4
#undef UNTOUCHED
  /* exactly the needed capacity is enough */
  CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(4, sched, comp, 1, swaps, 2, &n, order));
  cr_assert_eq(n, 2);
  CHECK_OK(uattn_reorder_batch_with_prompt_lens(4, sched, comp, prompt, 1, swaps, 2, &n, order));
  cr_assert_eq(n, 2);
  check_reordered(sched, comp, prompt, 4, 1, swaps, n, order, 0);
  /* no requests: nothing to read, num_prompt may be NULL */
  CHECK_OK(uattn_reorder_batch_with_prompt_lens(0, NULL, NULL, NULL, 1, NULL, 0, &n, NULL));
  cr_assert_eq(n, 0);
}

/* ---- today's vLLM: four regions and prompt lengths (uattn_reorder_batch_with_prompt_lens) ---------- */

/* A request of a given four-class region under threshold thr. */
static void request_of_region4(test_rng *rng, int r, int32_t thr, int32_t *sched, int32_t *comp, int32_t *prompt) {
  *comp = r == 3 ? 0 : test_rng_range(rng, 1, 50);
  *sched = r == 2 ? test_rng_range(rng, thr + 1, thr + 8) : test_rng_range(rng, 0, r == 3 ? thr + 5 : thr);
  if (r == 0)
    *prompt = test_rng_range(rng, 1, *comp);
  else if (r == 1)
    *prompt = test_rng_range(rng, *comp + 1, *comp + 20);
  else
    *prompt = test_rng_range(rng, 1, 80);
}

static int32_t jint(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  cr_assert(cJSON_IsNumber(v), "missing %s", key);
  return (int32_t)v->valuedouble;
}

static int32_t jints(const cJSON *obj, const char *key, int32_t *out, int cap) {
  int n = test_json_ints(cJSON_GetObjectItemCaseSensitive(obj, key), out, cap);
  cr_assert_geq(n, 0, "bad array %s", key);
  return n;
}

/* The tests directory ($UATTN_TESTS_DIR, else this file's folder), in a static buffer. */
static const char *tests_dir(void) {
  static char dir[4096];
  const char *from_env = test_env("UATTN_TESTS_DIR", NULL);
  if (from_env) {
    snprintf(dir, sizeof dir, "%s", from_env);
  } else { /* run outside ctest: the tests directory is this file's */
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash)
      *slash = '\0';
    else
      snprintf(dir, sizeof dir, ".");
  }
  return dir;
}

/* vLLM's own cases (tests/ref/vllm_reorder_cases.json, from its test_batch_reordering.py): every position
 * must hold a request of the region vLLM's expected order puts there, and the batch must change exactly
 * when vLLM reports it modified. Inside a region the order is uattn's own. */
Test(reorder4, vllm_test_cases) {
  char path[4200];
  snprintf(path, sizeof path, "%s/ref/vllm_reorder_cases.json", tests_dir());
  cJSON *root = test_load_json(path);
  cr_assert_not_null(root, "cannot read %s", path);
  const cJSON *t;
  int k = 0;
  cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(root, "cases")) {
    int32_t sched[16], comp[16], prompt[16], expected[16], order[16], num = -1, n = 0,
                                                                      thr = jint(t, "decode_threshold");
    const cJSON *req;
    cJSON_ArrayForEach(req, cJSON_GetObjectItemCaseSensitive(t, "requests")) {
      int32_t r[3];
      cr_assert(n < 16 && test_json_ints(req, r, 3) == 3, "%s: bad request", t->string);
      sched[n] = r[0], comp[n] = r[1], prompt[n] = r[2];
      n++;
    }
    cr_assert_eq(jints(t, "expected_order", expected, 16), n, "%s: bad expected order", t->string);
    uattn_swap swaps[16];
    CHECK_OK(uattn_reorder_batch_with_prompt_lens(n, sched, comp, prompt, thr, swaps, n, &num, order));
    check_reordered(sched, comp, prompt, n, thr, swaps, num, order, k);
    const bool modified = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(t, "expected_modified"));
    cr_assert_eq(num > 0, modified, "%s: %d swaps, vLLM says modified=%d", t->string, num, modified);
    for (int32_t i = 0; i < n; i++)
      cr_assert_eq(region_at(sched, comp, prompt, thr, order[i]), region_at(sched, comp, prompt, thr, expected[i]),
                   "%s: position %d holds request %d, vLLM request %d of another region", t->string, i, order[i],
                   expected[i]);
    k++;
  }
  cr_assert_eq(k, 16, "vLLM has 16 cases, read %d", k);
  cJSON_Delete(root);
}

/* Every arrangement of the four regions over up to 7 requests, against a breadth-first search from all
 * ordered arrangements at once (a swap keeps the region counts, so each search stays among its own). */
#define BFS4_MAX_N 7
Test(reorder4, fewest_swaps_against_breadth_first_search) {
  static int16_t dist[1 << (2 * BFS4_MAX_N)];
  static int32_t queue[1 << (2 * BFS4_MAX_N)];
  test_rng rng = {31};
  long checked = 0;
  for (int n = 1; n <= BFS4_MAX_N; n++) {
    const int32_t states = 1 << (2 * n);
    int32_t head = 0, tail = 0;
    for (int32_t s = 0; s < states; s++) {
      bool sorted = true;
      for (int i = 1; i < n; i++) sorted &= ((s >> (2 * i - 2)) & 3) <= ((s >> (2 * i)) & 3);
      dist[s] = sorted ? 0 : -1;
      if (sorted) queue[tail++] = s;
    }
    while (head < tail) {
      int32_t s = queue[head++];
      for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
          int32_t di = (s >> (2 * i)) & 3, dj = (s >> (2 * j)) & 3;
          int32_t t = s ^ ((di ^ dj) << (2 * i)) ^ ((di ^ dj) << (2 * j));
          if (di != dj && dist[t] < 0) {
            dist[t] = (int16_t)(dist[s] + 1);
            queue[tail++] = t;
          }
        }
    }
    cr_assert_eq(tail, states, "n=%d: some arrangement was not reached", n);
    for (int32_t s = 0; s < states; s++) {
      int32_t sched[BFS4_MAX_N], comp[BFS4_MAX_N], prompt[BFS4_MAX_N], order[BFS4_MAX_N], num = -1;
      int32_t thr = test_rng_range(&rng, 0, 3);
      for (int i = 0; i < n; i++) request_of_region4(&rng, (s >> (2 * i)) & 3, thr, &sched[i], &comp[i], &prompt[i]);
      uattn_swap swaps[BFS4_MAX_N];
      CHECK_OK(uattn_reorder_batch_with_prompt_lens(n, sched, comp, prompt, thr, swaps, n, &num, order));
      cr_assert_eq(num, dist[s], "n=%d state %d: %d swaps, the fewest possible is %d", n, s, num, dist[s]);
      check_reordered(sched, comp, prompt, n, thr, swaps, num, order, (int)s);
      checked++;
    }
  }
  cr_assert_eq(checked, 21844); /* 4 + 16 + ... + 4^7 */
}

/* Without short extends (every prompt done once it has context) the four regions are the seed's three
 * with decode and extend apart in the same way: both reorders need the same number of swaps. */
Test(reorder4, agrees_with_the_seed_form_without_short_extends) {
  test_rng rng = {32};
  enum { N = 200 };
  static int32_t sched[N], comp[N], prompt[N], order3[N], order4[N];
  static uattn_swap swaps[N];
  for (int it = 0; it < 200; it++) {
    int32_t n = test_rng_range(&rng, 0, N), thr = test_rng_range(&rng, 0, 4), n3 = -1, n4 = -1;
    for (int32_t i = 0; i < n; i++) {
      static const int no_short_extend[] = {0, 2, 3};
      request_of_region4(&rng, no_short_extend[test_rng_range(&rng, 0, 2)], thr, &sched[i], &comp[i], &prompt[i]);
      if (comp[i] > 0) prompt[i] = test_rng_range(&rng, 1, comp[i]);
    }
    CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(n, sched, comp, thr, swaps, N, &n3, order3));
    CHECK_OK(uattn_reorder_batch_with_prompt_lens(n, sched, comp, prompt, thr, swaps, N, &n4, order4));
    cr_assert_eq(n4, n3, "case %d: %d swaps with prompt lengths, %d without", it, n4, n3);
    for (int32_t i = 0; i < n; i++)
      cr_assert_eq(region(sched[order4[i]], comp[order4[i]], thr), region(sched[order3[i]], comp[order3[i]], thr));
  }
}

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

/* issue 19 (found by tests/fuzz/fuzz_batch_utils): with no array to fill, the call still walked every
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

/* ================================================================================================ */
/* golden outputs of the numpy re-statement of the seed (tests/ref/vllm_utils_ref.py)                 */
/* ================================================================================================ */

/* Runs the reference for one section and returns its case array (the root is kept in *root). */
static const cJSON *golden(const char *section, cJSON **root) {
  const char *dir = tests_dir();
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "'%s' '%s/ref/vllm_utils_ref.py' --only %s", test_env("UATTN_PYTHON", "/usr/bin/python3"),
           dir, section);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "cannot run %s", cmd);
  size_t cap = 1 << 20, len = 0;
  char *text = malloc(cap);
  size_t got;
  while ((got = fread(text + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 2) text = realloc(text, cap *= 2);
  }
  text[len] = '\0';
  int rc = pclose(p);
  cr_assert_eq(rc, 0, "%s exited with %d", cmd, rc);
  *root = cJSON_Parse(text);
  free(text);
  cr_assert_not_null(*root, "%s printed no JSON", cmd);
  const cJSON *cases = cJSON_GetObjectItemCaseSensitive(*root, section);
  cr_assert(cJSON_IsArray(cases) && cJSON_GetArraySize(cases) > 100, "no %s cases", section);
  return cases;
}

#define GOLDEN_CAP 4096

/* A check of one golden case: the case, its number (for messages) and the test's own state. */
typedef void golden_check(const cJSON *c, int k, void *state);

/* Runs `check` on every case of a section, numbered from 0. */
static void for_each_golden(const char *section, golden_check *check, void *state) {
  cJSON *root;
  const cJSON *cases = golden(section, &root);
  const cJSON *c;
  int k = 0;
  cJSON_ArrayForEach(c, cases) check(c, k++, state);
  cJSON_Delete(root);
}

static void check_golden_split_two_way(const cJSON *c, int k, void *unused) {
  int32_t qsl[64], want[6];
  int32_t n = jints(c, "qsl", qsl, 64) - 1;
  uattn_batch_split s;
  uattn_status st = uattn_split_decodes_and_prefills(n, qsl, jint(c, "num_tokens"), jint(c, "thr"),
                                                     cJSON_IsTrue(cJSON_GetObjectItem(c, "uniform")), &s);
  const cJSON *e = cJSON_GetObjectItem(c, "expect");
  if (cJSON_IsString(e)) {
    cr_assert_eq(st, UATTN_ERR_INCONSISTENT, "case %d: the seed's assertion fails here", k);
  } else {
    cr_assert_eq(st, UATTN_OK, "case %d: %s", k, uattn_last_error());
    jints(c, "expect", want, 6);
    assert_split(s, want[0], 0, want[1], want[2], 0, want[3], k);
  }
}

Test(golden, split_two_way) { for_each_golden("split2", check_golden_split_two_way, NULL); }

static void check_golden_split_three_way(const cJSON *c, int k, void *unused) {
  int32_t qsl[64], seq[64], want[6];
  int32_t n = jints(c, "qsl", qsl, 64) - 1;
  jints(c, "seq_lens", seq, 64);
  jints(c, "expect", want, 6);
  uattn_batch_split s;
  CHECK_OK(uattn_split_decodes_prefills_and_extends(n, qsl, seq, jint(c, "num_tokens"), jint(c, "thr"), &s));
  assert_split(s, want[0], want[1], want[2], want[3], want[4], want[5], k);
}

Test(golden, split_three_way) { for_each_golden("split3", check_golden_split_three_way, NULL); }

static void check_golden_reorder(const cJSON *c, int k, void *better) {
  int32_t sched[64], comp[64], seed_batch[64], order[64], num = -1;
  int32_t n = jints(c, "num_scheduled", sched, 64), thr = jint(c, "thr");
  jints(c, "num_computed", comp, 64);
  jints(c, "seed_batch", seed_batch, 64);
  uattn_swap swaps[64];
  CHECK_OK(uattn_reorder_batch_to_split_decodes_and_prefills(n, sched, comp, thr, swaps, 64, &num, order));
  check_reordered(sched, comp, NULL, n, thr, swaps, num, order, k);
  /* same regions at every position as the seed's result (the order inside a region may differ) */
  for (int32_t i = 0; i < n; i++)
    cr_assert_eq(region(sched[order[i]], comp[order[i]], thr), region(sched[seed_batch[i]], comp[seed_batch[i]], thr));
  cr_assert_leq(num, jint(c, "seed_swaps"), "case %d", k);
  *(int *)better += num < jint(c, "seed_swaps");
}

Test(golden, reorder) {
  int better = 0;
  for_each_golden("reorder", check_golden_reorder, &better);
  cr_assert_gt(better, 0, "the seed was never beaten: the cases are too easy");
}

/* Today's vLLM on random batches: every position holds a request of the region vLLM's result puts
 * there, and the count is the reference's own fewest (vLLM's sequence is sometimes longer). */
static void check_golden_reorder4(const cJSON *c, int k, void *better) {
  int32_t sched[64], comp[64], prompt[64], vllm_batch[64], order[64], num = -1;
  int32_t n = jints(c, "num_scheduled", sched, 64), thr = jint(c, "thr");
  jints(c, "num_computed", comp, 64);
  jints(c, "num_prompt", prompt, 64);
  jints(c, "vllm_batch", vllm_batch, 64);
  uattn_swap swaps[64];
  CHECK_OK(uattn_reorder_batch_with_prompt_lens(n, sched, comp, prompt, thr, swaps, 64, &num, order));
  check_reordered(sched, comp, prompt, n, thr, swaps, num, order, k);
  for (int32_t i = 0; i < n; i++)
    cr_assert_eq(region_at(sched, comp, prompt, thr, order[i]), region_at(sched, comp, prompt, thr, vllm_batch[i]),
                 "case %d: position %d", k, i);
  cr_assert_eq(num, jint(c, "fewest"), "case %d", k);
  cr_assert_leq(num, jint(c, "vllm_swaps"), "case %d", k);
  *(int *)better += num < jint(c, "vllm_swaps");
}

Test(golden, reorder4) {
  int better = 0;
  for_each_golden("reorder4", check_golden_reorder4, &better);
  cr_assert_gt(better, 0, "vLLM was never beaten: the cases are too easy");
}

static void check_golden_local_attention(const cJSON *c, int k, void *unused) {
  static int32_t qsl[64], seq[64], bt[GOLDEN_CAP], want[GOLDEN_CAP], lq[GOLDEN_CAP], lk[GOLDEN_CAP], lc[GOLDEN_CAP],
      lbt[GOLDEN_CAP], lr[GOLDEN_CAP];
  int32_t n = jints(c, "qsl", qsl, 64) - 1, cols = jint(c, "cols");
  jints(c, "seq_lens", seq, 64);
  const cJSON *row;
  int32_t r = 0;
  cJSON_ArrayForEach(row, cJSON_GetObjectItem(c, "block_table")) {
    cr_assert_eq(test_json_ints(row, bt + r * cols, cols), cols);
    r++;
  }
  uattn_local_batches out = {.capacity = GOLDEN_CAP - 1,
                             .query_start_loc = lq,
                             .seq_lens = lk,
                             .num_computed = lc,
                             .block_table = lbt,
                             .req_indices = lr};
  CHECK_OK(
      uattn_make_local_attention_virtual_batches(jint(c, "chunk"), jint(c, "block_size"), n, qsl, seq, bt, cols, &out));
  const cJSON *e = cJSON_GetObjectItem(c, "expect");
  int32_t m = jints(e, "seq_lens", want, GOLDEN_CAP);
  cr_assert_eq(out.num_batches, m, "case %d: %d virtual batches, the seed has %d", k, out.num_batches, m);
  assert_i32s(lk, want, m, "seq_lens", k);
  cr_assert_eq(jints(e, "query_start_loc", want, GOLDEN_CAP), m + 1);
  assert_i32s(lq, want, m + 1, "query_start_loc", k);
  jints(e, "num_computed", want, GOLDEN_CAP);
  assert_i32s(lc, want, m, "num_computed", k);
  jints(e, "req_indices", want, GOLDEN_CAP);
  assert_i32s(lr, want, m, "req_indices", k);
  cr_assert_eq(jints(e, "block_table", want, GOLDEN_CAP), m * out.pages_per_batch);
  assert_i32s(lbt, want, m * out.pages_per_batch, "block_table", k);
  cr_assert_eq(out.max_query_len, jint(e, "max_query_len"));
  cr_assert_eq(out.max_seq_len, jint(e, "max_seq_len"));
}

Test(golden, local_attention) { for_each_golden("local", check_golden_local_attention, NULL); }

static void check_golden_slot_mapping(const cJSON *c, int k, void *unused) {
  int32_t table[64], want[64], start = -1, n = -1;
  int32_t len = jints(c, "block_table", table, 64), window = jint(c, "window");
  int32_t seq = jint(c, "seq_len"), ctx = jint(c, "context_len"), bs = jint(c, "block_size");
  bool prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "is_prompt"));
  bool profile = cJSON_IsTrue(cJSON_GetObjectItem(c, "profile"));
  CHECK_OK(uattn_compute_slot_mapping_start_idx(prompt, seq - ctx, ctx, window, &start));
  cr_assert_eq(start, jint(c, "start_idx"), "case %d", k);
  int64_t slots[64];
  CHECK_OK(uattn_compute_slot_mapping(profile, seq, ctx, start, bs, table, len, slots, 64, &n));
  int32_t m = jints(c, "expect", want, 64);
  cr_assert_eq(n, m, "case %d: %d slots, the seed has %d", k, n, m);
  for (int32_t i = 0; i < m; i++) cr_assert_eq(slots[i], want[i], "case %d: slot %d", k, i);
}

Test(golden, slot_mapping) { for_each_golden("slots", check_golden_slot_mapping, NULL); }

static void check_golden_prefill_chunks(const cJSON *c, int k, void *unused) {
  int32_t seq[64], n = -1;
  int32_t m = jints(c, "seq_lens", seq, 64);
  uattn_req_range chunks[64];
  CHECK_OK(uattn_split_prefill_chunks(seq, m, jint(c, "ws"), jint(c, "offset"), chunks, 64, &n));
  const cJSON *e = cJSON_GetObjectItem(c, "expect");
  cr_assert_eq(n, cJSON_GetArraySize(e), "case %d", k);
  const cJSON *pair;
  int32_t i = 0;
  cJSON_ArrayForEach(pair, e) {
    int32_t b[2];
    cr_assert_eq(test_json_ints(pair, b, 2), 2);
    cr_assert(chunks[i].start == b[0] && chunks[i].end == b[1], "case %d: chunk %d", k, i);
    i++;
  }
}

Test(golden, prefill_chunks) { for_each_golden("chunks", check_golden_prefill_chunks, NULL); }

static void check_golden_dcp(const cJSON *c, int k, void *unused) {
  int32_t seq[64], want[512], out[512];
  int32_t n = jints(c, "seq_lens", seq, 64);
  int32_t m = jints(c, "expect", want, 512);
  CHECK_OK(
      uattn_compute_dcp_local_seq_lens(seq, n, jint(c, "dcp_size"), jint(c, "rank"), jint(c, "interleave"), out, 512));
  assert_i32s(out, want, m, "dcp", k);
}

Test(golden, dcp) { for_each_golden("dcp", check_golden_dcp, NULL); }

static void check_golden_fast_prefill(const cJSON *c, int k, void *unused) {
  int32_t qsl[64], logits[256], want[64], out[64];
  int32_t n = jints(c, "qsl", qsl, 64) - 1, nl = jints(c, "logits", logits, 256);
  uattn_fast_prefill_info info;
  CHECK_OK(uattn_make_kv_sharing_fast_prefill_metadata(n, qsl, logits, nl, out, &info));
  const cJSON *e = cJSON_GetObjectItem(c, "expect");
  jints(e, "query_start_loc", want, 64);
  assert_i32s(out, want, n + 1, "query_start_loc", k);
  cr_assert_eq(info.unchanged, cJSON_IsTrue(cJSON_GetObjectItem(e, "unchanged")), "case %d", k);
  cr_assert_eq(info.num_actual_tokens, jint(e, "num_actual_tokens"), "case %d", k);
  cr_assert_eq(info.max_query_len, jint(e, "max_query_len"), "case %d", k);
}

Test(golden, fast_prefill) { for_each_golden("fast_prefill", check_golden_fast_prefill, NULL); }

static void check_golden_causal_conv1d(const cJSON *c, int k, void *unused) {
  static int32_t bp[8192], off[8192], want[8192], nums[64];
  int32_t qsl[64], tot = -1, len = -1;
  int32_t n = jints(c, "qsl", qsl, 64) - 1;
  const cJSON *e = cJSON_GetObjectItem(c, "expect");
  CHECK_OK(uattn_count_causal_conv1d_programs(qsl, n, UATTN_CAUSAL_CONV1D_BLOCK_M, &tot, &len));
  cr_assert_eq(tot, jint(e, "tot"), "case %d", k);
  cr_assert_eq(len, jint(e, "buffer_len"), "case %d", k);
  cr_assert_leq(len, 8192);
  CHECK_OK(uattn_compute_causal_conv1d_metadata(qsl, n, UATTN_CAUSAL_CONV1D_BLOCK_M, nums, bp, off, len, &tot));
  int32_t m = jints(e, "batch_ptr", want, 8192);
  assert_i32s(bp, want, m, "batch_ptr", k);
  jints(e, "token_chunk_offset_ptr", want, 8192);
  assert_i32s(off, want, m, "token_chunk_offset_ptr", k);
  for (int32_t i = m; i < len; i++) cr_assert(bp[i] == -1 && off[i] == -1);
  jints(e, "nums", want, 64);
  assert_i32s(nums, want, n, "nums", k);
}

Test(golden, causal_conv1d) { for_each_golden("conv1d", check_golden_causal_conv1d, NULL); }
