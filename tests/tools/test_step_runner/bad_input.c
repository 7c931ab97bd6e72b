/* uattn-run on bad input: usage errors, a missing or malformed JSON file, every missing key, bad values, bad
 * tensor shapes, dtypes and files, and an output directory it cannot write each exit 2 with one line naming
 * the key or file; unknown keys only warn. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step_runner.h"
/* ---- the runner: bad input --------------------------------------------------------------------------- */

Test(step_runner, usage_errors_exit_2) {
  const char *none[] = {NULL};
  result r = run_tool(none);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "missing STEP.json") && strstr(r.err, "usage: uattn-run"), "%s", r.err);
  const char *no_out[] = {"x.json", NULL};
  r = run_tool(no_out);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "missing --out"), "%s", r.err);
  const char *unknown[] = {"x.json", "--out", "o", "--fast", NULL};
  r = run_tool(unknown);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "unknown option --fast"), "%s", r.err);
  const char *repeat[] = {"x.json", "--out", "o", "--repeat", "0", NULL};
  r = run_tool(repeat);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "--repeat"), "%s", r.err);
  const char *help[] = {"--help", NULL};
  r = run_tool(help);
  cr_assert_eq(r.rc, 0);
  cr_assert(strstr(r.out, "usage: uattn-run STEP.json --out DIR"), "%s", r.out);
}

Test(step_runner, missing_or_malformed_json_file) {
  const char *args[] = {in_scratch("absent.json"), "--out", in_scratch("out"), NULL};
  result r = run_tool(args);
  expect_error(&r, "absent", "absent.json: cannot open", NULL);
  write_text(in_scratch("step.json"), "{\"block_size\": 4,\n  \"num_blocks\": ,\n}");
  r = run_step(NULL);
  expect_error(&r, "malformed", "step.json: malformed JSON at line 2", NULL);
  write_text(in_scratch("step.json"), "{\"block_size\": 4} trailing");
  r = run_step(NULL);
  expect_error(&r, "trailing", "malformed JSON", NULL);
  write_text(in_scratch("step.json"), "[1, 2]");
  r = run_step(NULL);
  expect_error(&r, "array", "top level must be a JSON object", NULL);
  cr_assert_not(file_exists(in_scratch("out/out.npy")));
}

static const char *removed_key;
static void remove_key(cJSON *root) { cJSON_DeleteItemFromObjectCaseSensitive(root, removed_key); }

Test(step_runner, every_missing_required_key_is_named) {
  const char *required[] = {"block_size",     "num_blocks",  "num_q_heads", "num_kv_heads", "head_dim",
                            "dtype",          "cache_dtype", "kv_layout",   "scale",        "soft_cap",
                            "sliding_window", "attn_type",   "requests",    "tensors"};
  for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
    removed_key = required[i];
    char want[128];
    snprintf(want, sizeof want, "uattn-run: %s: missing required key", required[i]);
    expect_json_error(remove_key, required[i], want, NULL);
  }
}

static void drop_block_table(cJSON *root) {
  cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 1), "block_table");
}
static void drop_value_cache(cJSON *root) {
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(root, "tensors"), "value_cache");
}
static void string_block_size(cJSON *root) { cJSON_ReplaceItemInObject(root, "block_size", cJSON_CreateString("16")); }
static void fractional_heads(cJSON *root) { cJSON_ReplaceItemInObject(root, "num_q_heads", cJSON_CreateNumber(4.5)); }
static void huge_blocks(cJSON *root) { cJSON_ReplaceItemInObject(root, "num_blocks", cJSON_CreateNumber(3e9)); }
static void bad_dtype(cJSON *root) { cJSON_ReplaceItemInObject(root, "dtype", cJSON_CreateString("fp8")); }
static void bad_cache_dtype(cJSON *root) {
  cJSON_ReplaceItemInObject(root, "cache_dtype", cJSON_CreateString("fp8_e4m3fn"));
}
static void bad_layout(cJSON *root) { cJSON_ReplaceItemInObject(root, "kv_layout", cJSON_CreateString("nhd")); }
/* base_spec's blocks of 4 keys have no TILED shape */
static void tiled_block_4(cJSON *root) { cJSON_ReplaceItemInObject(root, "kv_layout", cJSON_CreateString("TILED")); }
static void bad_attn(cJSON *root) { cJSON_ReplaceItemInObject(root, "attn_type", cJSON_CreateString("cross")); }
static void zero_threads(cJSON *root) { cJSON_AddNumberToObject(root, "threads", 0); }
static void negative_window(cJSON *root) { cJSON_ReplaceItemInObject(root, "sliding_window", cJSON_CreateNumber(-1)); }
static void heads_not_multiple(cJSON *root) { cJSON_ReplaceItemInObject(root, "num_kv_heads", cJSON_CreateNumber(3)); }
static void duplicate_key(cJSON *root) { cJSON_AddNumberToObject(root, "head_dim", 8); }
static void empty_requests(cJSON *root) { cJSON_ReplaceItemInObject(root, "requests", cJSON_CreateArray()); }
static void request_not_object(cJSON *root) {
  cJSON_ReplaceItemInArray(cJSON_GetObjectItem(root, "requests"), 2, cJSON_CreateNumber(3));
}
static void negative_computed(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 3), "num_computed",
                            cJSON_CreateNumber(-1));
}
static void zero_scheduled(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 1), "num_scheduled",
                            cJSON_CreateNumber(0));
}
static void block_out_of_range(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 0), "block_table");
  cJSON_ReplaceItemInArray(t, 1, cJSON_CreateNumber(12));
}
static void block_table_short(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 1), "block_table");
  cJSON_DeleteItemFromArray(t, 3);
}
static void block_table_padding_read(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 3), "block_table");
  cJSON_ReplaceItemInArray(t, 1, cJSON_CreateNumber(-1));
}
static void bad_draft(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 2), "draft_tokens");
  cJSON_ReplaceItemInArray(t, 0, cJSON_CreateNumber(-7));
}
/* a broken table only the planner can see: two requests write into block 2 */
static void shared_written_block(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 3), "block_table");
  cJSON_ReplaceItemInArray(t, 0, cJSON_CreateNumber(2));
}
static void tensor_not_string(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "tensors"), "q", cJSON_CreateNumber(1));
}
static void tensor_absent_file(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "tensors"), "k", cJSON_CreateString("nope/k.npy"));
}

Test(step_runner, bad_values_are_named_by_their_key) {
  expect_json_error(drop_block_table, "request key", "requests[1].block_table: missing required key", NULL);
  expect_json_error(drop_value_cache, "tensor key", "tensors.value_cache: missing required key", NULL);
  expect_json_error(string_block_size, "string int", "block_size: must be an integer, got a string", NULL);
  expect_json_error(fractional_heads, "fraction", "num_q_heads: must be an integer", NULL);
  expect_json_error(huge_blocks, "int32", "num_blocks: 3000000000 is over 2147483647", NULL);
  expect_json_error(bad_dtype, "dtype", "dtype: \"fp8\" is not one of f32, bf16, f16", NULL);
  expect_json_error(bad_cache_dtype, "cache dtype",
                    "cache_dtype: \"fp8_e4m3fn\" is not one of f32, bf16, f16, fp8_e4m3, fp8_e5m2", NULL);
  expect_json_error(bad_layout, "layout", "kv_layout: \"nhd\" is not one of NHD, HND, TILED", NULL);
  expect_json_error(tiled_block_4, "tiled block size", "kv_layout: TILED needs a block_size that is a multiple of 16",
                    "(got 4, 8)");
  expect_json_error(bad_attn, "attn_type", "attn_type: \"cross\" is not one of decoder, encoder", NULL);
  expect_json_error(zero_threads, "threads", "threads: 0 must be >= 1", NULL);
  expect_json_error(negative_window, "window", "sliding_window: -1 must be >= 0", NULL);
  expect_json_error(heads_not_multiple, "gqa", "num_q_heads: 4 is not a multiple of num_kv_heads (3)", NULL);
  expect_json_error(duplicate_key, "duplicate", "head_dim: key appears twice", NULL);
  expect_json_error(empty_requests, "no requests", "requests: the step has no requests", NULL);
  expect_json_error(request_not_object, "request type", "requests[2]: must be an object, got a number", NULL);
  expect_json_error(negative_computed, "num_computed", "requests[3].num_computed: -1 must be >= 0", NULL);
  expect_json_error(zero_scheduled, "num_scheduled", "requests[1].num_scheduled", "at least 1 token");
  expect_json_error(block_out_of_range, "block id", "requests[0].block_table[1]: 12 is not a block id", NULL);
  expect_json_error(block_table_short, "short table", "requests[1].block_table: 3 entries cover 12 positions",
                    "needs 14");
  expect_json_error(block_table_padding_read, "padding read", "requests[3].block_table[1]: -1 is not a block id", NULL);
  expect_json_error(bad_draft, "draft", "requests[2].draft_tokens[0]: -7 must be >= -1", NULL);
  expect_json_error(shared_written_block, "planner", "uattn_plan_step: broken block table", "(UATTN_ERR_INCONSISTENT)");
  expect_json_error(tensor_not_string, "tensor type", "tensors.q: must be a file name, got a number", NULL);
  expect_json_error(tensor_absent_file, "absent tensor", "tensors.k: ", "nope/k.npy: cannot open");
}

static void misspell_sliding_window(cJSON *root) { cJSON_AddNumberToObject(root, "sliding_windw", 4); }

Test(step_runner, unknown_keys_warn_but_run) {
  spec s = base_spec();
  spec_fill(&s, 2);
  spec_write_edited(&s, misspell_sliding_window);
  const result r = run_step(NULL);
  cr_assert_eq(r.rc, 0, "%s", r.err);
  cr_assert(strstr(r.err, "warning: ignoring unknown key sliding_windw"), "%s", r.err);
  spec_free(&s);
}

/* A tensor file replaced by one of the wrong shape, dtype or layout. */
static void expect_tensor_error(spec *s, const char *file, npy_dtype dtype, int ndim, const int64_t *shape,
                                const char *frag1, const char *frag2) {
  spec_fill(s, 3);
  spec_write(s);
  size_t n = 1;
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
  void *zeros = calloc(n ? n : 1, 8);
  save(file, dtype, ndim, shape, zeros);
  free(zeros);
  const result r = run_step(NULL);
  expect_error(&r, file, frag1, frag2);
  spec_free(s);
}

Test(step_runner, tensor_shape_and_dtype_errors) {
  spec s = base_spec(); /* T = 3 + 1 + 3 + 5 = 12: request 2's placeholder draft does not count */
  expect_tensor_error(&s, "q.npy", NPY_F4, 3, (int64_t[]){13, 4, 8},
                      "uattn-run: tensors.q: shape [13, 4, 8] does not match [12, 4, 8] (T, num_q_heads, head_dim)",
                      NULL);
  s = base_spec();
  expect_tensor_error(&s, "v.npy", NPY_F4, 2, (int64_t[]){12, 16}, "tensors.v: shape [12, 16] does not match",
                      "(T, num_kv_heads, head_dim_v)");
  s = base_spec();
  expect_tensor_error(&s, "q.npy", NPY_U2, 3, (int64_t[]){12, 4, 8},
                      "tensors.q: ", "dtype <u2 does not match dtype \"f32\" (<f4)");
  s = base_spec();
  expect_tensor_error(&s, "kc.npy", NPY_F4, 3, (int64_t[]){47, 2, 8}, "tensors.key_cache: shape [47, 2, 8]",
                      "(num_blocks * block_size, num_kv_heads, head_dim)");
  s = base_spec();
  s.layout = "HND";
  expect_tensor_error(&s, "vc.npy", NPY_F4, 3, (int64_t[]){48, 2, 8}, "tensors.value_cache: shape [48, 2, 8]",
                      "does not match [12, 2, 4, 8] (num_blocks, num_kv_heads, block_size, head_dim_v)");
  s = base_spec();
  s.layout = "TILED";
  s.bs = 16; /* a value cache shaped like the keys */
  expect_tensor_error(&s, "vc.npy", NPY_F4, 6, (int64_t[]){12, 1, 2, 4, 16, 2},
                      "tensors.value_cache: shape [12, 1, 2, 4, 16, 2] does not match [12, 1, 2, 8, 8, 2]",
                      "(TILED values: num_blocks, block_size / 16, num_kv_heads, 8, head_dim_v, 2)");
  s = base_spec();
  s.cache_dtype = "bf16";
  expect_tensor_error(&s, "kc.npy", NPY_F2, 3, (int64_t[]){48, 2, 8}, "tensors.key_cache",
                      "dtype <f2 does not match cache_dtype \"bf16\" (<u2)");
  s = base_spec();
  s.sinks = true;
  expect_tensor_error(&s, "sinks.npy", NPY_F4, 1, (int64_t[]){2}, "tensors.sinks: shape [2] does not match [4]",
                      "(num_q_heads)");
  s = base_spec();
  s.alibi = true;
  expect_tensor_error(&s, "alibi.npy", NPY_I4, 1, (int64_t[]){4}, "tensors.alibi_slopes", "dtype <i4, expected <f4");
}

Test(step_runner, malformed_tensor_file_is_named) {
  spec s = base_spec();
  spec_fill(&s, 4);
  spec_write(&s);
  raw_npy(in_scratch("v.npy"), 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (12, 2, 8), }", s.v,
          12 * 2 * 8 * sizeof(float));
  const result r = run_step(NULL);
  expect_error(&r, "fortran", "tensors.v: ", "v.npy: fortran_order is True");
  spec_free(&s);
}

Test(step_runner, unwritable_output_directory) {
  spec s = base_spec();
  spec_fill(&s, 5);
  spec_write(&s);
  write_text(in_scratch("file"), "x");
  const char *args[] = {in_scratch("step.json"), "--out", in_scratch("file/sub"), NULL};
  const result r = run_tool(args);
  expect_error(&r, "out dir", "--out ", "cannot create");
  spec_free(&s);
}

/* Multi-head latent attention's keys (uattn.h: head_dim_v, kv_latent) on base_spec's step (Hkv 2, head_dim 8,
 * v and value_cache named). */
static void latent_with_values(cJSON *root) {
  cJSON_AddNumberToObject(root, "head_dim_v", 4);
  cJSON_AddBoolToObject(root, "kv_latent", true);
}
static void drop_values(cJSON *root) {
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(root, "tensors"), "v");
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(root, "tensors"), "value_cache");
}
static void latent_with_value_cache(cJSON *root) {
  latent_with_values(root);
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(root, "tensors"), "v");
}
static void latent_without_head_dim_v(cJSON *root) {
  drop_values(root);
  cJSON_AddBoolToObject(root, "kv_latent", true);
}
static void latent_wider_values(cJSON *root) {
  drop_values(root);
  cJSON_AddNumberToObject(root, "head_dim_v", 9);
  cJSON_AddBoolToObject(root, "kv_latent", true);
}
static void latent_not_bool(cJSON *root) { cJSON_AddNumberToObject(root, "kv_latent", 1); }
static void latent_tiled(cJSON *root) {
  latent_wider_values(root);
  cJSON_ReplaceItemInObject(root, "head_dim_v", cJSON_CreateNumber(8));
  cJSON_ReplaceItemInObject(root, "kv_layout", cJSON_CreateString("TILED"));
}
static void latent_fp8_v_scale(cJSON *root) {
  latent_wider_values(root);
  cJSON_ReplaceItemInObject(root, "head_dim_v", cJSON_CreateNumber(8));
  cJSON_ReplaceItemInObject(root, "cache_dtype", cJSON_CreateString("fp8_e4m3"));
  cJSON_AddNumberToObject(root, "k_scale", 0.5);
  cJSON_AddNumberToObject(root, "v_scale", 2);
}
static void negative_head_dim_v(cJSON *root) { cJSON_AddNumberToObject(root, "head_dim_v", -1); }
static void narrower_values(cJSON *root) { cJSON_AddNumberToObject(root, "head_dim_v", 4); }

Test(step_runner, bad_latent_keys_are_named) {
  expect_json_error(latent_with_values, "latent v", "tensors.v: a kv_latent step has no values",
                    "remove the key, or drop kv_latent");
  expect_json_error(latent_with_value_cache, "latent value cache",
                    "tensors.value_cache: a kv_latent step has no "
                    "value cache",
                    NULL);
  expect_json_error(latent_without_head_dim_v, "latent head_dim_v", "head_dim_v: missing; a kv_latent step needs it",
                    "0 < head_dim_v <= head_dim (8)");
  expect_json_error(latent_wider_values, "latent dims", "head_dim_v: a kv_latent step needs 0 < head_dim_v <= head_dim",
                    "(got 9, head_dim 8)");
  expect_json_error(latent_not_bool, "latent type", "kv_latent: must be true or false, got a number", NULL);
  expect_json_error(latent_tiled, "latent tiled", "kv_latent: needs kv_layout NHD or HND", NULL);
  expect_json_error(latent_fp8_v_scale, "latent scales", "v_scale: a kv_latent step on an fp8 cache", "k_scale (0.5)");
  expect_json_error(negative_head_dim_v, "head_dim_v", "head_dim_v: -1 must be >= 0", NULL);
  /* values as wide as the keys where the step says 4: the tensors' check names the dimension */
  expect_json_error(narrower_values, "v width", "tensors.v: shape [12, 2, 8] does not match [12, 2, 4]",
                    "(T, num_kv_heads, head_dim_v)");
}
