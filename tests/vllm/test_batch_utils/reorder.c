/* The reorder of a batch into its regions, the seed's three (uattn_reorder_batch_to_split_decodes_and_prefills)
 * and today's vLLM's four (uattn_reorder_batch_with_prompt_lens): valid swaps, no more of them than the seed,
 * vLLM or a breadth-first search need, vLLM's own cases, and bad input. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_utils.h"
#include "common/support.h"

/* ================================================================================================ */
/* reorder                                                                                            */
/* ================================================================================================ */

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
