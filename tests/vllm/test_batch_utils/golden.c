/* Every batch utility against golden outputs of the numpy re-statement of the seed code
 * (tests/ref/vllm_utils_ref.py), run here for each section. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "batch_utils.h"
#include "common/support.h"

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

/* Both reorder sections hold uattn's swap count to a rival's (the case's key rival_swaps), counting its wins. */
static void no_more_swaps(const cJSON *c, int k, const char *rival_swaps, int32_t num, void *better) {
  cr_assert_leq(num, jint(c, rival_swaps), "case %d", k);
  *(int *)better += num < jint(c, rival_swaps);
}

/* A section in which uattn never beats the rival is too easy to tell the two apart. */
static void for_each_golden_beating(const char *section, golden_check *check, const char *rival) {
  int better = 0;
  for_each_golden(section, check, &better);
  cr_assert_gt(better, 0, "%s was never beaten: the cases are too easy", rival);
}

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
  no_more_swaps(c, k, "seed_swaps", num, better);
}

Test(golden, reorder) { for_each_golden_beating("reorder", check_golden_reorder, "the seed"); }

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
  no_more_swaps(c, k, "vllm_swaps", num, better);
}

Test(golden, reorder4) { for_each_golden_beating("reorder4", check_golden_reorder4, "vLLM"); }

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
