/* Tuning files (runtime/tuning/): the writer and the loader round trip, lookups and what they fill in,
 * use counts (also from several threads while files are reloaded), the report, every refusal (missing,
 * malformed, another format version, stale: another uattn version, CPU or kernel set, out-of-range values,
 * unknown or repeated keys, a bucket twice) each with its status and message and the defaults or the
 * previous file kept, the UATTN_TUNING_FILE path at runtime creation, bad arguments, and mangled files that
 * must never crash the loader. No timings are asserted. */
#define _GNU_SOURCE /* setenv, mkdtemp */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tuning/tuning.h" /* uattn_tuning_find: internal, linked from the static library */
#include "common/support.h"
#include "uattn.h"
#include "uattn_tuning.h"

static char dir[64];

static void setup(void) {
  unsetenv("UATTN_TUNING_FILE");
  unsetenv("UATTN_NUM_THREADS");
  snprintf(dir, sizeof dir, "/tmp/uattn-tuning-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

/* One timeout for the whole suite: several values leak in Criterion's runner under LeakSanitizer. */
TestSuite(tuning, .init = setup, .fini = teardown, .timeout = 120);

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, UATTN_OK, "%s returned %s: %s", #call, uattn_status_name(st_), uattn_last_error());              \
  } while (0)

static const char *path_of(const char *name) {
  static char p[4][256];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof p[i], "%s/%s", dir, name);
  return p[i];
}

static uattn_runtime *runtime(void) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 1;
  uattn_runtime *rt = NULL;
  CHECK_OK(uattn_runtime_create(&c, &rt));
  return rt;
}

static uattn_tuning_entry entry(int32_t bs, int32_t hd, uattn_dtype dt, int32_t chunk, int32_t tile, int32_t smin,
                                int32_t skeys, int32_t threads) {
  uattn_tuning_entry e = {bs, hd, dt, chunk, tile, smin, skeys, threads, 0, 0};
  return e;
}

static const uattn_tuning_entry two[2] = {
    {16, 128, UATTN_BF16, 4, 128, 2048, 1024, 1, 41.5, 45.25},
    {128, 64, UATTN_F32, 0, 256, 0, 0, 0, 0, 0},
};

static void write_two(const char *path) {
  CHECK_OK(uattn_tuning_write(path, two, 2, "{\"trace\": \"test\", \"steps\": 3}", NULL));
}

static char *report(const uattn_runtime *rt) {
  size_t len = 0;
  CHECK_OK(uattn_runtime_tuning_report(rt, NULL, 0, &len));
  char *buf = malloc(len + 1);
  cr_assert_not_null(buf);
  size_t len2 = 0;
  CHECK_OK(uattn_runtime_tuning_report(rt, buf, len + 1, &len2));
  cr_assert_eq(len2, len);
  cr_assert_eq(strlen(buf), len);
  return buf;
}

static void assert_contains(const char *text, const char *part) {
  cr_assert(strstr(text, part) != NULL, "expected \"%s\" in:\n%s", part, text);
}

static void assert_defaults(const uattn_runtime *rt) {
  uattn_tuning_info info;
  CHECK_OK(uattn_runtime_tuning_info(rt, &info));
  cr_assert(!info.loaded);
  cr_assert_eq(info.num_entries, 0);
  cr_assert_str_empty(info.file);
  uattn_tuning_entry e;
  bool found = true;
  CHECK_OK(uattn_runtime_tuning_lookup(rt, 16, 128, UATTN_BF16, &e, &found));
  cr_assert(!found);
  cr_assert_null(uattn_tuning_find(rt, 16, 128, UATTN_BF16));
}

/* ---- a hand-written file: this machine's, then changed by a test ------------------------------------- */

static cJSON *valid_doc(void) {
  uattn_tuning_host h;
  CHECK_OK(uattn_tuning_host_get(&h));
  cJSON *root = cJSON_CreateObject(), *cpu = cJSON_CreateObject(), *list = cJSON_CreateArray();
  cJSON_AddStringToObject(root, "format", "uattn-tuning");
  cJSON_AddNumberToObject(root, "format_version", UATTN_TUNING_FORMAT_VERSION);
  cJSON_AddStringToObject(root, "uattn_version", uattn_version());
  cJSON_AddStringToObject(cpu, "vendor", h.cpu_vendor);
  cJSON_AddStringToObject(cpu, "model", h.cpu_model);
  cJSON_AddStringToObject(cpu, "kernel_set", uattn_kernel_set(NULL));
  cJSON_AddItemToObject(root, "cpu", cpu);
  cJSON_AddStringToObject(root, "date", "2025-01-02T03:04:05Z");
  cJSON_AddItemToObject(root, "workload", cJSON_CreateString("hand-written"));
  cJSON *e = cJSON_CreateObject();
  cJSON_AddNumberToObject(e, "block_size", 32);
  cJSON_AddNumberToObject(e, "head_dim", 96);
  cJSON_AddStringToObject(e, "cache_dtype", "f16");
  cJSON_AddNumberToObject(e, "query_tile", 64);
  cJSON_AddItemToArray(list, e);
  cJSON_AddItemToObject(root, "entries", list);
  return root;
}

static const char *write_doc(cJSON *root, const char *name) {
  const char *p = path_of(name);
  char *text = cJSON_Print(root);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  cJSON_free(text);
  cJSON_Delete(root);
  return p;
}

static const char *write_text(const char *text, size_t len, const char *name) {
  const char *p = path_of(name);
  FILE *f = fopen(p, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(text, 1, len, f), len);
  fclose(f);
  return p;
}

static cJSON *first_entry(cJSON *root) { return cJSON_GetArrayItem(cJSON_GetObjectItem(root, "entries"), 0); }

/* Loading path into a fresh runtime is refused with status st and a message naming the file and
 * containing reason; the runtime keeps the defaults and the report says why. */
static void assert_refused(const char *path, uattn_status st, const char *reason) {
  uattn_runtime *rt = runtime();
  uattn_status got = uattn_runtime_load_tuning(rt, path);
  cr_assert_eq(got, st, "%s: got %s (%s), want %s", path, uattn_status_name(got), uattn_last_error(),
               uattn_status_name(st));
  const char *msg = uattn_last_error();
  assert_contains(msg, path);
  assert_contains(msg, reason);
  assert_contains(msg, "library defaults stay in use");
  assert_defaults(rt);
  uattn_tuning_info info;
  CHECK_OK(uattn_runtime_tuning_info(rt, &info));
  cr_assert_eq(info.last_status, st);
  assert_contains(info.message, reason);
  char *r = report(rt);
  assert_contains(r, "library defaults");
  assert_contains(r, "refused");
  assert_contains(r, reason);
  free(r);
  uattn_runtime_destroy(rt);
}

/* ---- round trip ------------------------------------------------------------------------------------------ */

Test(tuning, write_then_load_finds_every_entry) {
  const char *p = path_of("t.json");
  write_two(p);
  uattn_runtime *rt = runtime();
  assert_defaults(rt);
  CHECK_OK(uattn_runtime_load_tuning(rt, p));
  cr_assert_str_empty(uattn_last_error());

  uattn_tuning_info info;
  CHECK_OK(uattn_runtime_tuning_info(rt, &info));
  cr_assert(info.loaded && !info.from_env);
  cr_assert_eq(info.num_entries, 2);
  cr_assert_str_eq(info.file, p);
  cr_assert_eq(info.last_status, UATTN_OK);
  cr_assert_str_empty(info.message);

  for (int i = 0; i < 2; i++) {
    uattn_tuning_entry e;
    bool found = false;
    CHECK_OK(uattn_runtime_tuning_lookup(rt, two[i].block_size, two[i].head_dim, two[i].cache_dtype, &e, &found));
    cr_assert(found);
    cr_assert_eq(memcmp(&e, &two[i], offsetof(uattn_tuning_entry, tuned_ms)), 0, "entry %d differs", i);
    cr_assert_float_eq(e.tuned_ms, two[i].tuned_ms, 1e-9);
    cr_assert_float_eq(e.default_ms, two[i].default_ms, 1e-9);
    const uattn_tuning_entry *f = uattn_tuning_find(rt, two[i].block_size, two[i].head_dim, two[i].cache_dtype);
    cr_assert_not_null(f);
    cr_assert_eq(f->query_tile, two[i].query_tile);
  }
  /* the bucket is all three keys */
  bool found = true;
  uattn_tuning_entry e;
  CHECK_OK(uattn_runtime_tuning_lookup(rt, 16, 128, UATTN_F16, &e, &found));
  cr_assert(!found);
  cr_assert(e.block_size == 16 && e.head_dim == 128 && e.cache_dtype == UATTN_F16 && e.query_tile == 0 &&
            e.chunk_size == 0 && e.split_keys == 0 && e.num_threads == 0);
  cr_assert_null(uattn_tuning_find(rt, 16, 64, UATTN_BF16));
  cr_assert_null(uattn_tuning_find(rt, 32, 128, UATTN_BF16));
  cr_assert_null(uattn_tuning_find(NULL, 16, 128, UATTN_BF16));
  uattn_runtime_destroy(rt);
}

Test(tuning, written_file_records_the_machine_and_the_workload) {
  const char *p = path_of("t.json");
  CHECK_OK(uattn_tuning_write(p, two, 2, "{\"trace\": \"test\"}", "2030-01-01T00:00:00Z"));
  cJSON *root = test_load_json(p);
  cr_assert_not_null(root);
  uattn_tuning_host h;
  CHECK_OK(uattn_tuning_host_get(&h));
  cr_assert(h.cpu_vendor[0] && h.cpu_model[0]);
  cr_assert_str_eq(h.kernel_set, uattn_kernel_set(NULL));
  cr_assert_str_eq(h.uattn_version, uattn_version());
  const cJSON *cpu = cJSON_GetObjectItem(root, "cpu");
  cr_assert_str_eq(cJSON_GetObjectItem(root, "format")->valuestring, "uattn-tuning");
  cr_assert_eq(cJSON_GetObjectItem(root, "format_version")->valueint, UATTN_TUNING_FORMAT_VERSION);
  cr_assert_str_eq(cJSON_GetObjectItem(root, "uattn_version")->valuestring, uattn_version());
  cr_assert_str_eq(cJSON_GetObjectItem(cpu, "vendor")->valuestring, h.cpu_vendor);
  cr_assert_str_eq(cJSON_GetObjectItem(cpu, "model")->valuestring, h.cpu_model);
  cr_assert_str_eq(cJSON_GetObjectItem(cpu, "kernel_set")->valuestring, h.kernel_set);
  cr_assert_str_eq(cJSON_GetObjectItem(root, "date")->valuestring, "2030-01-01T00:00:00Z");
  cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "workload"), "trace")->valuestring, "test");
  const cJSON *e = first_entry(root);
  cr_assert_str_eq(cJSON_GetObjectItem(e, "cache_dtype")->valuestring, "bf16");
  cr_assert_eq(cJSON_GetObjectItem(e, "split_min_keys")->valueint, 2048);
  cJSON_Delete(root);

  /* the version macro agrees with the library linked */
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", UATTN_VERSION_NUMBER / 10000, UATTN_VERSION_NUMBER / 100 % 100,
           UATTN_VERSION_NUMBER % 100);
  cr_assert_str_eq(v, uattn_version());

  /* no date: now, in UTC */
  CHECK_OK(uattn_tuning_write(p, NULL, 0, NULL, NULL));
  root = test_load_json(p);
  const char *date = cJSON_GetObjectItem(root, "date")->valuestring;
  cr_assert(strlen(date) == 20 && date[4] == '-' && date[10] == 'T' && date[19] == 'Z', "date %s", date);
  cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(root, "entries")), 0);
  cJSON_Delete(root);
  uattn_runtime *rt = runtime();
  CHECK_OK(uattn_runtime_load_tuning(rt, p)); /* an empty table is a valid file */
  uattn_tuning_info info;
  CHECK_OK(uattn_runtime_tuning_info(rt, &info));
  cr_assert(info.loaded && info.num_entries == 0);
  uattn_runtime_destroy(rt);
}

Test(tuning, hand_written_file_loads_with_absent_tunables_zero) {
  const char *p = write_doc(valid_doc(), "hand.json");
  uattn_runtime *rt = runtime();
  CHECK_OK(uattn_runtime_load_tuning(rt, p));
  uattn_tuning_entry e;
  bool found = false;
  CHECK_OK(uattn_runtime_tuning_lookup(rt, 32, 96, UATTN_F16, &e, &found));
  cr_assert(found);
  cr_assert(e.query_tile == 64 && e.chunk_size == 0 && e.split_min_keys == 0 && e.split_keys == 0 &&
            e.num_threads == 0 && e.tuned_ms == 0 && e.default_ms == 0);
  uattn_runtime_destroy(rt);
}

/* ---- what the lookups fill in ------------------------------------------------------------------------ */

Test(tuning, tuned_plan_config_fills_defaults_only) {
  const char *p = path_of("t.json");
  write_two(p);
  uattn_runtime *rt = runtime();
  CHECK_OK(uattn_runtime_load_tuning(rt, p));

  uattn_plan_config c = uattn_plan_config_default(16, 256, 8, 256, 4096);
  CHECK_OK(uattn_runtime_tuned_plan_config(rt, 128, UATTN_BF16, &c));
  cr_assert_eq(c.split_min_keys, 2048);
  cr_assert_eq(c.split_keys, 1024);
  uattn_plan *plan;
  CHECK_OK(uattn_plan_create(&c, &plan)); /* the result is a config the planner takes */
  uattn_plan_destroy(plan);

  c = uattn_plan_config_default(16, 256, 8, 256, 4096);
  c.split_min_keys = 0;
  c.split_keys = 512; /* the engine's own choice wins */
  CHECK_OK(uattn_runtime_tuned_plan_config(rt, 128, UATTN_BF16, &c));
  cr_assert_eq(c.split_min_keys, 2048);
  cr_assert_eq(c.split_keys, 512);

  /* an entry with split 0 (the defaults) changes nothing; no entry changes nothing */
  const uattn_plan_config d = uattn_plan_config_default(128, 256, 8, 256, 4096);
  c = d;
  CHECK_OK(uattn_runtime_tuned_plan_config(rt, 64, UATTN_F32, &c));
  cr_assert_eq(memcmp(&c, &d, sizeof c), 0);
  CHECK_OK(uattn_runtime_tuned_plan_config(rt, 80, UATTN_F32, &c));
  cr_assert_eq(memcmp(&c, &d, sizeof c), 0);

  uattn_layer L = uattn_layer_default(8, 2, 128, UATTN_BF16);
  L.cache_dtype = UATTN_BF16;
  CHECK_OK(uattn_runtime_tuned_layer(rt, 16, &L));
  cr_assert_eq(L.causal_width, 128);
  cr_assert_eq(L.chunk_size, 4);
  L.causal_width = 32;
  L.chunk_size = 0;
  CHECK_OK(uattn_runtime_tuned_layer(rt, 16, &L));
  cr_assert_eq(L.causal_width, 32);
  cr_assert_eq(L.chunk_size, 4);
  uattn_layer M = uattn_layer_default(8, 2, 128, UATTN_BF16);
  M.cache_dtype = UATTN_F16; /* no entry */
  uattn_layer before = M;
  CHECK_OK(uattn_runtime_tuned_layer(rt, 16, &M));
  cr_assert_eq(memcmp(&M, &before, sizeof M), 0);
  uattn_runtime_destroy(rt);
}

/* ---- uses and the report ---------------------------------------------------------------------------- */

Test(tuning, report_lists_entries_uses_and_default_buckets) {
  const char *p = path_of("t.json");
  write_two(p);
  uattn_runtime *rt = runtime();
  char *r = report(rt);
  assert_contains(r, "library defaults");
  assert_contains(r, "UATTN_TUNING_FILE");
  free(r);

  CHECK_OK(uattn_runtime_load_tuning(rt, p));
  for (int i = 0; i < 3; i++) cr_assert_not_null(uattn_tuning_find(rt, 16, 128, UATTN_BF16));
  for (int i = 0; i < 5; i++) cr_assert_null(uattn_tuning_find(rt, 64, 256, UATTN_F16));
  r = report(rt);
  assert_contains(r, p);
  assert_contains(r, "2 entries");
  assert_contains(r, uattn_version());
  assert_contains(r, uattn_kernel_set(NULL));
  assert_contains(r, "\"trace\":\"test\"");
  assert_contains(r, "block 16, head_dim 128, bf16");
  assert_contains(r, "block 128, head_dim 64, f32");
  assert_contains(r, "block 64, head_dim 256, f16: 5 uses");
  /* the row of the used entry ends with its 3 uses, the other with 0 */
  const char *row = strstr(r, "block 16, head_dim 128, bf16");
  const char *eol = strchr(row, '\n');
  cr_assert(eol - row > 2 && !strncmp(eol - 2, " 3", 2), "row: %.*s", (int)(eol - row), row);
  row = strstr(r, "block 128, head_dim 64, f32");
  eol = strchr(row, '\n');
  cr_assert(!strncmp(eol - 2, " 0", 2), "row: %.*s", (int)(eol - row), row);
  free(r);

  /* too small a buffer: refused, with the size needed, nothing written */
  size_t len = 0;
  CHECK_OK(uattn_runtime_tuning_report(rt, NULL, 0, &len));
  char small[8] = "xxxxxxx";
  size_t len2 = 12345;
  cr_assert_eq(uattn_runtime_tuning_report(rt, small, sizeof small, &len2), UATTN_ERR_CAPACITY);
  assert_contains(uattn_last_error(), "needs");
  cr_assert_str_eq(small, "xxxxxxx");
  cr_assert_eq(len2, 12345);
  char *exact = malloc(len);
  cr_assert_eq(uattn_runtime_tuning_report(rt, exact, len, &len2), UATTN_ERR_CAPACITY, "the NUL needs room");
  free(exact);

  /* a new file starts its counts afresh; dropping it goes back to the defaults */
  CHECK_OK(uattn_runtime_load_tuning(rt, p));
  r = report(rt);
  cr_assert_null(strstr(r, "5 uses"));
  free(r);
  CHECK_OK(uattn_runtime_load_tuning(rt, NULL));
  assert_defaults(rt);
  uattn_runtime_destroy(rt);
}

typedef struct race {
  uattn_runtime *rt;
  _Atomic int stop, started;
  _Atomic long found, missed;
  int calls; /* > 0: make exactly this many lookups, then return */
} race;

static void *finder(void *p) {
  race *r = p;
  atomic_fetch_add(&r->started, 1);
  for (int i = 0; r->calls ? i < r->calls : !atomic_load(&r->stop); i++) {
    const uattn_tuning_entry *e = uattn_tuning_find(r->rt, 16, 128, UATTN_BF16);
    if (e) {
      cr_assert_eq(e->query_tile, 128); /* a whole entry, never a torn one */
      atomic_fetch_add(&r->found, 1);
    } else {
      atomic_fetch_add(&r->missed, 1);
    }
  }
  return NULL;
}

Test(tuning, lookups_from_threads_while_files_are_reloaded) {
  const char *p = path_of("t.json");
  write_two(p);
  race r = {.rt = runtime()};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) cr_assert_eq(pthread_create(&th[i], NULL, finder, &r), 0);
  /* the reloads start once every finder runs (on a loaded machine they could otherwise all be over first,
   * and a finder that starts after the stop looks nothing up) */
  while (atomic_load(&r.started) < 3) sched_yield();
  for (int i = 0; i < 40; i++) CHECK_OK(uattn_runtime_load_tuning(r.rt, i % 4 == 3 ? NULL : p));
  atomic_store(&r.stop, 1);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  cr_assert_gt(atomic_load(&r.found) + atomic_load(&r.missed), 0);

  /* with nothing reloaded the counts are exact: 3 threads x 500 lookups */
  CHECK_OK(uattn_runtime_load_tuning(r.rt, p));
  race exact = {.rt = r.rt, .calls = 500};
  for (int i = 0; i < 3; i++) cr_assert_eq(pthread_create(&th[i], NULL, finder, &exact), 0);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  cr_assert_eq(atomic_load(&exact.found), 1500);
  char *rep = report(r.rt);
  const char *row = strstr(rep, "block 16, head_dim 128, bf16");
  cr_assert(row && strstr(row, " 1500\n") == strchr(row, '\n') - 5, "%s", rep);
  free(rep);
  uattn_runtime_destroy(r.rt);
}

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
