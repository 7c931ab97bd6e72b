/* Tuning files that do not load: every refusal (missing, malformed, another format version, stale,
 * out-of-range values, wrong keys and types) with its status and message and the defaults or the previous file
 * kept, the UATTN_TUNING_FILE path at runtime creation, bad arguments, and mangled files that must never crash
 * the loader. */
#define _GNU_SOURCE /* setenv, mkdtemp */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/support.h"
#include "tuning/tuning.h" /* uattn_tuning_find: internal, linked from the static library */
#include "tuning_files.h"
/* ---- refusals ------------------------------------------------------------------------------------------ */

Test(tuning, missing_file_is_refused) {
  assert_refused(path_of("nothing-here.json"), UATTN_ERR_INVALID_ARGUMENT, "No such file");
  assert_refused(dir, UATTN_ERR_INVALID_ARGUMENT, "not a regular file");
}

Test(tuning, malformed_json_is_refused_with_its_line) {
  const char *bad = "{\"format\": \"uattn-tuning\",\n \"format_version\": 1,\n \"entries\": [}\n";
  assert_refused(write_text(bad, strlen(bad), "bad.json"), UATTN_ERR_INVALID_ARGUMENT, "malformed JSON at line 3");
  assert_refused(write_text("", 0, "empty.json"), UATTN_ERR_INVALID_ARGUMENT, "malformed JSON");
  assert_refused(write_text("[1, 2]", 6, "array.json"), UATTN_ERR_INVALID_ARGUMENT, "must be a JSON object");
  assert_refused(write_text("{} {}", 5, "two.json"), UATTN_ERR_INVALID_ARGUMENT, "malformed JSON");
  assert_refused(write_text("{\"a\": 1}\0junk", 13, "nul.json"), UATTN_ERR_INVALID_ARGUMENT, "NUL byte");
}

Test(tuning, other_format_or_version_is_refused) {
  cJSON *d = valid_doc();
  cJSON_ReplaceItemInObject(d, "format_version", cJSON_CreateNumber(UATTN_TUNING_FORMAT_VERSION + 1));
  assert_refused(write_doc(d, "v2.json"), UATTN_ERR_UNSUPPORTED, "format_version 2");
  d = valid_doc();
  cJSON_ReplaceItemInObject(d, "format", cJSON_CreateString("something-else"));
  assert_refused(write_doc(d, "fmt.json"), UATTN_ERR_UNSUPPORTED, "\"something-else\" is not \"uattn-tuning\"");
  d = valid_doc();
  cJSON_DeleteItemFromObject(d, "format_version");
  assert_refused(write_doc(d, "nov.json"), UATTN_ERR_INVALID_ARGUMENT, "format_version is missing");
}

Test(tuning, stale_files_are_refused) {
  cJSON *d = valid_doc();
  cJSON_ReplaceItemInObject(d, "uattn_version", cJSON_CreateString("0.0.1"));
  assert_refused(write_doc(d, "old.json"), UATTN_ERR_INCONSISTENT, "made by uattn 0.0.1");

  d = valid_doc();
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "cpu"), "model", cJSON_CreateString("Imaginary CPU 9000"));
  assert_refused(write_doc(d, "model.json"), UATTN_ERR_INCONSISTENT, "another CPU");
  d = valid_doc();
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "cpu"), "vendor", cJSON_CreateString("OtherVendorX"));
  assert_refused(write_doc(d, "vendor.json"), UATTN_ERR_INCONSISTENT, "OtherVendorX");

  d = valid_doc();
  const char *other = strcmp(uattn_kernel_set(NULL), "portable") ? "portable" : "avx2";
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "cpu"), "kernel_set", cJSON_CreateString(other));
  char reason[96];
  snprintf(reason, sizeof reason, "made for the %s kernel set", other);
  assert_refused(write_doc(d, "isa.json"), UATTN_ERR_INCONSISTENT, reason);

  /* white space in the CPU's names does not make a file stale */
  d = valid_doc();
  uattn_tuning_host h;
  CHECK_OK(uattn_tuning_host_get(&h));
  char padded[200];
  snprintf(padded, sizeof padded, "  %s\t", h.cpu_model);
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "cpu"), "model", cJSON_CreateString(padded));
  const char *p = write_doc(d, "ws.json");
  uattn_runtime *rt = runtime();
  CHECK_OK(uattn_runtime_load_tuning(rt, p));
  uattn_runtime_destroy(rt);
}

Test(tuning, another_kernel_set_forced_makes_a_file_stale) {
  const char *p = path_of("t.json");
  write_two(p); /* for the set this process runs */
  char made_for[32];
  snprintf(made_for, sizeof made_for, "%s", uattn_kernel_set(NULL));
  setenv("UATTN_ISA", "portable", 1);
  if (!strcmp(uattn_kernel_set(NULL), made_for)) cr_skip_test("this CPU runs the portable set only");
  assert_refused(p, UATTN_ERR_INCONSISTENT, "this process runs portable");
  unsetenv("UATTN_ISA");
}

typedef struct bad_value {
  const char *key;
  double value;
  const char *reason;
} bad_value;

Test(tuning, out_of_range_values_are_refused) {
  const bad_value cases[] = {
      {"block_size", 0, "entries[0].block_size = 0 is out of range [1, 65536]"},
      {"block_size", 65537, "entries[0].block_size = 65537 is out of range"},
      {"head_dim", -1, "entries[0].head_dim = -1 is out of range [1, 4096]"},
      {"head_dim", 4097, "head_dim = 4097"},
      {"chunk_size", -2, "entries[0].chunk_size = -2"},
      {"query_tile", 1 << 21, "entries[0].query_tile = 2097152 is out of range"},
      {"split_min_keys", -1, "split_min_keys = -1"},
      {"split_keys", 4294967296.0, "split_keys = 4294967296 is out of range"},
      {"num_threads", UATTN_RUNTIME_MAX_THREADS + 1, "num_threads = 1025"},
      {"tuned_ms", -1, "tuned_ms must be a number >= 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    cJSON *d = valid_doc();
    cJSON *e = first_entry(d);
    cJSON_DeleteItemFromObject(e, cases[i].key);
    cJSON_AddNumberToObject(e, cases[i].key, cases[i].value);
    assert_refused(write_doc(d, "range.json"), UATTN_ERR_OUT_OF_RANGE, cases[i].reason);
  }
  cJSON *d = valid_doc();
  cJSON_ReplaceItemInObject(first_entry(d), "cache_dtype", cJSON_CreateString("fp8"));
  assert_refused(write_doc(d, "dtype.json"), UATTN_ERR_OUT_OF_RANGE,
                 "cache_dtype \"fp8\" is not one of f32, bf16, f16, fp8_e4m3, fp8_e5m2");
  d = valid_doc();
  cJSON_DeleteItemFromObject(first_entry(d), "query_tile");
  cJSON_AddNumberToObject(first_entry(d), "query_tile", 1.5);
  assert_refused(write_doc(d, "frac.json"), UATTN_ERR_INVALID_ARGUMENT, "query_tile = 1.5 is not an integer");
}

Test(tuning, wrong_keys_and_types_are_refused) {
  cJSON *d = valid_doc();
  cJSON_AddNumberToObject(first_entry(d), "query_tiles", 3);
  assert_refused(write_doc(d, "typo.json"), UATTN_ERR_INVALID_ARGUMENT, "unknown key entries[0].query_tiles");
  d = valid_doc();
  cJSON_AddNumberToObject(d, "extra", 1);
  assert_refused(write_doc(d, "extra.json"), UATTN_ERR_INVALID_ARGUMENT, "unknown key extra");
  d = valid_doc();
  cJSON_AddStringToObject(cJSON_GetObjectItem(d, "cpu"), "cores", "2");
  assert_refused(write_doc(d, "cpukey.json"), UATTN_ERR_INVALID_ARGUMENT, "unknown key cpu.cores");
  d = valid_doc();
  cJSON_DeleteItemFromObject(first_entry(d), "head_dim");
  assert_refused(write_doc(d, "nohd.json"), UATTN_ERR_INVALID_ARGUMENT, "entries[0].head_dim is missing");
  d = valid_doc();
  cJSON_ReplaceItemInObject(first_entry(d), "query_tile", cJSON_CreateString("64"));
  assert_refused(write_doc(d, "str.json"), UATTN_ERR_INVALID_ARGUMENT, "query_tile must be an integer, not a string");
  d = valid_doc();
  cJSON_ReplaceItemInObject(d, "entries", cJSON_CreateObject());
  assert_refused(write_doc(d, "obj.json"), UATTN_ERR_INVALID_ARGUMENT, "entries must be an array, not an object");
  d = valid_doc();
  cJSON_DeleteItemFromObject(d, "entries");
  assert_refused(write_doc(d, "noentries.json"), UATTN_ERR_INVALID_ARGUMENT, "entries is missing");
  d = valid_doc();
  cJSON_AddItemToArray(cJSON_GetObjectItem(d, "entries"), cJSON_CreateNumber(7));
  assert_refused(write_doc(d, "num.json"), UATTN_ERR_INVALID_ARGUMENT, "entries[1] must be an object, not a number");
  d = valid_doc();
  cJSON_ReplaceItemInObject(d, "cpu", cJSON_CreateString("AMD"));
  assert_refused(write_doc(d, "cpustr.json"), UATTN_ERR_INVALID_ARGUMENT, "cpu must be an object, not a string");
  d = valid_doc();
  cJSON_ReplaceItemInObject(d, "date", cJSON_CreateNumber(2025));
  assert_refused(write_doc(d, "date.json"), UATTN_ERR_INVALID_ARGUMENT, "date must be a string");
  d = valid_doc();
  cJSON_AddItemToArray(cJSON_GetObjectItem(d, "entries"), cJSON_Duplicate(first_entry(d), true));
  assert_refused(write_doc(d, "dup.json"), UATTN_ERR_INVALID_ARGUMENT,
                 "entries[0] and entries[1] are both for block_size 32, head_dim 96, f16");
  const char *twice = "{\"format\": \"uattn-tuning\", \"format_version\": 1, \"format_version\": 1, \"entries\": []}";
  assert_refused(write_text(twice, strlen(twice), "twice.json"), UATTN_ERR_INVALID_ARGUMENT,
                 "format_version appears twice");
}

Test(tuning, refused_file_keeps_the_previous_one) {
  const char *good = path_of("t.json");
  write_two(good);
  uattn_runtime *rt = runtime();
  CHECK_OK(uattn_runtime_load_tuning(rt, good));
  cJSON *d = valid_doc();
  cJSON_ReplaceItemInObject(d, "uattn_version", cJSON_CreateString("9.9.9"));
  const char *bad = write_doc(d, "stale.json");
  cr_assert_eq(uattn_runtime_load_tuning(rt, bad), UATTN_ERR_INCONSISTENT);
  assert_contains(uattn_last_error(), "stays in use");
  assert_contains(uattn_last_error(), good);
  uattn_tuning_info info;
  CHECK_OK(uattn_runtime_tuning_info(rt, &info));
  cr_assert(info.loaded);
  cr_assert_str_eq(info.file, good);
  cr_assert_eq(info.last_status, UATTN_ERR_INCONSISTENT);
  cr_assert_not_null(uattn_tuning_find(rt, 16, 128, UATTN_BF16));
  char *r = report(rt);
  assert_contains(r, "2 entries");
  assert_contains(r, "refused");
  assert_contains(r, "9.9.9");
  free(r);
  uattn_runtime_destroy(rt);
}

/* ---- the environment variable ---------------------------------------------------------------------------- */

Test(tuning, env_file_is_loaded_at_creation) {
  const char *p = path_of("t.json");
  write_two(p);
  setenv("UATTN_TUNING_FILE", p, 1);
  uattn_runtime *rt = runtime();
  uattn_tuning_info info;
  CHECK_OK(uattn_runtime_tuning_info(rt, &info));
  cr_assert(info.loaded && info.from_env);
  cr_assert_eq(info.num_entries, 2);
  cr_assert_not_null(uattn_tuning_find(rt, 128, 64, UATTN_F32));
  char *r = report(rt);
  assert_contains(r, "$UATTN_TUNING_FILE");
  free(r);
  uattn_runtime_destroy(rt);
  setenv("UATTN_TUNING_FILE", "", 1); /* empty: none */
  rt = runtime();
  assert_defaults(rt);
  uattn_runtime_destroy(rt);
}

Test(tuning, refused_env_file_leaves_creation_working_on_the_defaults) {
  const char *cases[] = {path_of("missing.json"), write_text("{\"format\":", 10, "cut.json"), NULL};
  cJSON *d = valid_doc();
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "cpu"), "model", cJSON_CreateString("Some Other CPU"));
  cases[2] = write_doc(d, "other.json");
  const char *reasons[] = {"cannot open it", "malformed JSON", "another CPU"};
  for (int i = 0; i < 3; i++) {
    setenv("UATTN_TUNING_FILE", cases[i], 1);
    uattn_runtime *rt = NULL;
    CHECK_OK(uattn_runtime_create(NULL, &rt));
    cr_assert_not_null(rt);
    cr_assert_str_empty(uattn_last_error(), "creation succeeded: no error message");
    assert_defaults(rt);
    uattn_tuning_info info;
    CHECK_OK(uattn_runtime_tuning_info(rt, &info));
    cr_assert(info.from_env);
    cr_assert_neq(info.last_status, UATTN_OK);
    assert_contains(info.message, cases[i]);
    assert_contains(info.message, reasons[i]);
    char *r = report(rt);
    assert_contains(r, "from $UATTN_TUNING_FILE");
    assert_contains(r, reasons[i]);
    free(r);
    uattn_runtime_destroy(rt);
  }
}

/* ---- arguments and the writer's own refusals ----------------------------------------------------------- */

Test(tuning, bad_arguments_are_refused) {
  uattn_runtime *rt = runtime();
  uattn_tuning_entry e;
  uattn_tuning_info info;
  size_t len;
  uattn_plan_config c = uattn_plan_config_default(16, 64, 4, 64, 256);
  uattn_layer L = uattn_layer_default(4, 1, 64, UATTN_F32);
  cr_assert_eq(uattn_runtime_load_tuning(NULL, "x"), UATTN_ERR_INVALID_ARGUMENT);
  assert_contains(uattn_last_error(), "rt must not be NULL");
  cr_assert_eq(uattn_runtime_load_tuning(rt, ""), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_info(NULL, &info), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_info(rt, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_report(rt, NULL, 0, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_report(rt, NULL, 10, &len), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_report(NULL, NULL, 0, &len), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_lookup(rt, 16, 128, UATTN_BF16, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_lookup(rt, 0, 128, UATTN_BF16, &e, NULL), UATTN_ERR_INVALID_ARGUMENT);
  assert_contains(uattn_last_error(), "block_size 0");
  cr_assert_eq(uattn_runtime_tuning_lookup(rt, 16, -4, UATTN_BF16, &e, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuning_lookup(rt, 16, 128, (uattn_dtype)7, &e, NULL), UATTN_ERR_INVALID_ARGUMENT);
  assert_contains(uattn_last_error(), "cache_dtype 7");
  cr_assert_eq(uattn_runtime_tuned_plan_config(rt, 128, UATTN_BF16, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuned_plan_config(NULL, 128, UATTN_BF16, &c), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuned_plan_config(rt, 0, UATTN_BF16, &c), UATTN_ERR_INVALID_ARGUMENT);
  c.block_size = -1;
  cr_assert_eq(uattn_runtime_tuned_plan_config(rt, 64, UATTN_BF16, &c), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuned_layer(rt, 16, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuned_layer(rt, 0, &L), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_runtime_tuned_layer(NULL, 16, &L), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_tuning_host_get(NULL), UATTN_ERR_INVALID_ARGUMENT);
  assert_defaults(rt);
  uattn_runtime_destroy(rt);
}

Test(tuning, writer_refuses_bad_entries_and_paths) {
  const char *p = path_of("w.json");
  uattn_tuning_entry bad[2] = {entry(16, 128, UATTN_BF16, 0, 0, 0, 0, 0), entry(16, 128, UATTN_BF16, 4, 0, 0, 0, 0)};
  cr_assert_eq(uattn_tuning_write(p, bad, 2, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  assert_contains(uattn_last_error(), "both for block_size 16");
  bad[1] = entry(16, 0, UATTN_BF16, 0, 0, 0, 0, 0);
  cr_assert_eq(uattn_tuning_write(p, bad, 2, NULL, NULL), UATTN_ERR_OUT_OF_RANGE);
  assert_contains(uattn_last_error(), "entries[1].head_dim = 0");
  bad[1] = entry(16, 64, UATTN_BF16, 0, 0, 0, 0, 0);
  bad[1].tuned_ms = -1;
  cr_assert_eq(uattn_tuning_write(p, bad, 2, NULL, NULL), UATTN_ERR_OUT_OF_RANGE);
  bad[1].tuned_ms = 0;
  bad[1].cache_dtype = (uattn_dtype)9;
  cr_assert_eq(uattn_tuning_write(p, bad, 2, NULL, NULL), UATTN_ERR_OUT_OF_RANGE);
  cr_assert_eq(uattn_tuning_write(p, bad, 1, "{not json", NULL), UATTN_ERR_INVALID_ARGUMENT);
  assert_contains(uattn_last_error(), "workload_json");
  cr_assert_eq(uattn_tuning_write(p, NULL, 1, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_tuning_write(p, bad, -1, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_tuning_write(NULL, bad, 1, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(uattn_tuning_write("", bad, 1, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert_eq(access(p, F_OK), -1, "nothing written");
  const char *nodir = path_of("no/such/dir/t.json");
  cr_assert_eq(uattn_tuning_write(nodir, bad, 1, NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  assert_contains(uattn_last_error(), nodir);
  assert_contains(uattn_last_error(), "No such file");
}

/* ---- nothing crashes on bad input ------------------------------------------------------------------------ */

Test(tuning, mangled_files_never_crash_the_loader) {
  const char *p = path_of("t.json");
  write_two(p);
  FILE *f = fopen(p, "rb");
  char text[8192];
  const size_t n = fread(text, 1, sizeof text, f);
  fclose(f);
  cr_assert(n > 100 && n < sizeof text);
  uattn_runtime *rt = runtime();
  test_rng rng = {2024};
  int accepted = 0, refused = 0;
  for (int i = 0; i < 600; i++) {
    char buf[8192];
    size_t len = n;
    memcpy(buf, text, n);
    if (i < 200) { /* every kind of truncation */
      len = (size_t)test_rng_range(&rng, 0, (int32_t)n - 1);
    } else { /* a few bytes changed to bytes that matter to JSON, or to anything */
      static const char pick[] = "{}[]\",:0123456789-.eE \n\\tfnu";
      const int flips = test_rng_range(&rng, 1, 4);
      for (int k = 0; k < flips; k++) {
        const size_t at = (size_t)test_rng_range(&rng, 0, (int32_t)n - 1);
        buf[at] = i % 2 ? pick[test_rng_range(&rng, 0, (int32_t)sizeof pick - 2)] : (char)test_rng_range(&rng, 1, 255);
      }
    }
    const char *q = write_text(buf, len, "m.json");
    const uattn_status st = uattn_runtime_load_tuning(rt, q);
    if (st == UATTN_OK) {
      accepted++;
      continue;
    }
    refused++;
    cr_assert(strlen(uattn_last_error()) > 0);
    assert_contains(uattn_last_error(), q);
  }
  cr_assert_gt(refused, 200);
  char *r = report(rt); /* still reportable */
  free(r);
  (void)accepted;
  uattn_runtime_destroy(rt);
}
