/* The tuning suite's shared helpers (tuning_files.h) and its init, which gives each test an empty directory and an
 * environment without the tuning file or thread count variables. */
#define _GNU_SOURCE /* setenv, mkdtemp */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tuning/tuning.h" /* uattn_tuning_find: internal, linked from the static library */
#include "tuning_files.h"

char dir[64];

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

const char *path_of(const char *name) {
  static char p[4][256];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof p[i], "%s/%s", dir, name);
  return p[i];
}

uattn_runtime *runtime(void) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 1;
  uattn_runtime *rt = NULL;
  CHECK_OK(uattn_runtime_create(&c, &rt));
  return rt;
}

uattn_tuning_entry entry(int32_t bs, int32_t hd, uattn_dtype dt, int32_t chunk, int32_t tile, int32_t smin,
                         int32_t skeys, int32_t threads) {
  uattn_tuning_entry e = {bs, hd, dt, chunk, tile, smin, skeys, threads, 0, 0};
  return e;
}

const uattn_tuning_entry two[2] = {
    {16, 128, UATTN_BF16, 4, 128, 2048, 1024, 1, 41.5, 45.25},
    {128, 64, UATTN_F32, 0, 256, 0, 0, 0, 0, 0},
};

void write_two(const char *path) {
  CHECK_OK(uattn_tuning_write(path, two, 2, "{\"trace\": \"test\", \"steps\": 3}", NULL));
}

char *report(const uattn_runtime *rt) {
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

void assert_contains(const char *text, const char *part) {
  cr_assert(strstr(text, part) != NULL, "expected \"%s\" in:\n%s", part, text);
}

void assert_defaults(const uattn_runtime *rt) {
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

cJSON *valid_doc(void) {
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

const char *write_doc(cJSON *root, const char *name) {
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

const char *write_text(const char *text, size_t len, const char *name) {
  const char *p = path_of(name);
  FILE *f = fopen(p, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(text, 1, len, f), len);
  fclose(f);
  return p;
}

cJSON *first_entry(cJSON *root) { return cJSON_GetArrayItem(cJSON_GetObjectItem(root, "entries"), 0); }

void assert_refused(const char *path, uattn_status st, const char *reason) {
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
