/* libFuzzer target: the tuning-file reader (runtime/tuning/tuning_file.c), through uattn_runtime_load_tuning on a file
 * holding the input, then the runtime's info, report and lookups. A file must name this machine (CPU,
 * kernel set, uattn version) to get past the staleness checks to its entries, so the placeholders
 * @VENDOR@, @MODEL@, @KERNELS@ and @VERSION@ in the input are replaced with this machine's values before
 * the file is written: the seed corpus then reaches the entries on any machine. Findings besides crashes:
 * a refusal without a message, and a refused file that changes the tuning in use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uattn.h"
#include "uattn_tuning.h"

static char dir[] = "/tmp/uattn-fuzz-tuning-XXXXXX";
static char path[64];
static uattn_runtime *rt;
static uattn_tuning_host host;

static void fail(const char *what) {
  fprintf(stderr, "fuzz_tuning: %s (%s)\n", what, uattn_last_error());
  abort();
}

static void new_runtime(void) {
  uattn_runtime_destroy(rt);
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 1;
  c.pin = false;
  c.spin_us = 0;
  if (uattn_runtime_create(&c, &rt) != UATTN_OK) fail("cannot create a runtime");
}

static void cleanup(void) {
  uattn_runtime_destroy(rt);
  unlink(path);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (!mkdtemp(dir)) abort();
  snprintf(path, sizeof path, "%s/tuning.json", dir);
  if (uattn_tuning_host_get(&host) != UATTN_OK) fail("uattn_tuning_host_get");
  new_runtime();
  atexit(cleanup);
  return 0;
}

/* Writes the input to the file, each placeholder replaced with this machine's value. */
static void write_input(const uint8_t *data, size_t size) {
  const struct {
    const char *token, *value;
  } subs[] = {{"@VENDOR@", host.cpu_vendor},
              {"@MODEL@", host.cpu_model},
              {"@KERNELS@", host.kernel_set},
              {"@VERSION@", host.uattn_version}};
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  for (size_t i = 0; i < size;) {
    size_t k = 0;
    while (k < 4 && !(size - i >= strlen(subs[k].token) && !memcmp(data + i, subs[k].token, strlen(subs[k].token))))
      k++;
    if (k < 4) {
      fputs(subs[k].value, f);
      i += strlen(subs[k].token);
    } else {
      fputc(data[i++], f);
    }
  }
  if (fclose(f)) abort();
}

static void report(void) {
  size_t length = 0;
  if (uattn_runtime_tuning_report(rt, NULL, 0, &length) != UATTN_OK) fail("report length");
  char *buf = malloc(length + 1);
  if (!buf) abort();
  if (uattn_runtime_tuning_report(rt, buf, length + 1, &length) != UATTN_OK) fail("report");
  if (strlen(buf) != length) fail("the report's length is not its text's");
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  write_input(data, size);
  uattn_tuning_info before, after;
  if (uattn_runtime_tuning_info(rt, &before) != UATTN_OK) fail("tuning info");
  const uattn_status st = uattn_runtime_load_tuning(rt, path);
  const bool said_why = uattn_last_error()[0]; /* the next call clears it */
  if (uattn_runtime_tuning_info(rt, &after) != UATTN_OK) fail("tuning info");
  if (st != UATTN_OK) {
    if (!said_why || !after.message[0]) fail("a refused file gives no message");
    if (after.last_status != st) fail("tuning info's last_status is not the load's status");
    if (after.loaded != before.loaded || after.num_entries != before.num_entries || strcmp(after.file, before.file))
      fail("a refused file changed the tuning in use");
    report();
    return 0;
  }
  report();
  /* the first entry's bucket, and one that no file can hold */
  uattn_tuning_entry e;
  bool found = false;
  static const int32_t block_sizes[] = {16, 128, 1, 0};
  for (int i = 0; i < 4; i++)
    if (uattn_runtime_tuning_lookup(rt, block_sizes[i], 128, (uattn_dtype)(i % 3), &e, &found) == UATTN_OK && !found &&
        (e.chunk_size || e.query_tile || e.split_min_keys || e.split_keys || e.num_threads))
      fail("a lookup without an entry gives tunables other than the defaults");
  uattn_plan_config pc = uattn_plan_config_default(16, 64, 4, 64, 256);
  uattn_layer layer = uattn_layer_default(2, 1, 128, UATTN_BF16);
  layer.cache_dtype = UATTN_BF16;
  if (uattn_runtime_tuned_plan_config(rt, 128, UATTN_BF16, &pc) != UATTN_OK ||
      uattn_runtime_tuned_layer(rt, 16, &layer) != UATTN_OK)
    fail("tuned config of a valid bucket");
  /* a runtime keeps every table it replaced until it is destroyed: start afresh so they do not pile up */
  new_runtime();
  return 0;
}
