/* Tuning files that load: the writer and the loader round trip, what the lookups fill in, use counts (also
 * from several threads while files are reloaded) and the report. No timings are asserted. */
#define _GNU_SOURCE /* setenv, mkdtemp */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "tuning/tuning.h" /* uattn_tuning_find: internal, linked from the static library */
#include "tuning_files.h"
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
