/* The tuning files' public calls (uattn_tuning.h and the runtime's tuning calls) under bad input, through the
 * suite's table runner (misuse.h). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misuse.h"
#include "uattn_tuning.h"

/* ---- tuning files ------------------------------------------------------------------------------------- */

typedef struct tuning_host_get_args {
  uattn_tuning_host *out;
  struct {
    uattn_tuning_host out;
  } w;
} tuning_host_get_args;
static void tuning_host_get_init(void *p) {
  tuning_host_get_args *a = p;
  a->out = &a->w.out;
}
static uattn_status tuning_host_get_call(void *p) { return uattn_tuning_host_get(((tuning_host_get_args *)p)->out); }

Test(api_misuse, uattn_tuning_host_get) {
  typedef tuning_host_get_args T;
  static const api_fn fn = API_FN(tuning_host_get, T);
  static const misuse cases[] = {NULL_ARG(T, out, "out")};
  RUN(fn, cases);
}

typedef struct tuning_write_args {
  char file[64];
  const char *path;
  uattn_tuning_entry entries[1];
  const uattn_tuning_entry *entries_ptr;
  int32_t num_entries;
  struct {
    char none;
  } w;
} tuning_write_args;
static void tuning_write_init(void *p) {
  tuning_write_args *a = p;
  snprintf(a->file, sizeof a->file, "/tmp/uattn_misuse_%d.json", (int)getpid());
  a->path = a->file;
  a->entries[0] = (uattn_tuning_entry){.block_size = 16, .head_dim = 128, .cache_dtype = UATTN_BF16, .num_threads = 1};
  a->entries_ptr = a->entries;
  a->num_entries = 1;
}
static uattn_status tuning_write_call(void *p) {
  tuning_write_args *a = p;
  return uattn_tuning_write(a->path, a->entries_ptr, a->num_entries, NULL, NULL);
}
/* nothing written: the file does not appear */
static size_t tuning_write_state(void *p, unsigned char *image) {
  image[0] = access(((tuning_write_args *)p)->file, F_OK) == 0;
  return 1;
}
static void tuning_write_fini(void *p, uattn_status st) { unlink(((tuning_write_args *)p)->file); }

Test(api_misuse, uattn_tuning_write) {
  typedef tuning_write_args T;
  static const api_fn fn = API_FN(tuning_write, T, .state = tuning_write_state, .fini = tuning_write_fini);
  static const misuse cases[] = {
      NULL_ARG(T, path, "path"),
      POINTER_ARG(T, entries_ptr, "entries"),
      LENGTH(T, num_entries, UATTN_OK, "num_entries"),
      COUNT(T, entries[0].block_size, REFUSED, REFUSED, "block_size"),
      COUNT(T, entries[0].head_dim, REFUSED, REFUSED, "head_dim"),
      SET(T, entries[0].num_threads, -1, REFUSED, "num_threads"),
      SET(T, entries[0].num_threads, INT32_MAX, REFUSED, "num_threads"),
      ENUM(T, entries[0].cache_dtype, "cache_dtype"),
  };
  RUN(fn, cases);
}

/* the runtime calls: rt, a bucket (block_size, head_dim, cache_dtype), and their outputs */
typedef struct tuning_args {
  uattn_runtime *rt;
  const char *path;
  int32_t block_size, head_dim;
  uattn_dtype cache_dtype;
  size_t cap;
  char *buf;
  size_t *length;
  uattn_tuning_info *info;
  uattn_tuning_entry *entry;
  bool *found;
  uattn_plan_config config;
  uattn_plan_config *config_ptr;
  uattn_layer layer;
  uattn_layer *layer_ptr;
  struct {
    char buf[4096];
    size_t length;
    uattn_tuning_info info;
    uattn_tuning_entry entry;
    bool found;
  } w;
} tuning_args;
static void tuning_init(void *p) {
  tuning_args *a = p;
  *a = (tuning_args){rt,          "/nonexistent/uattn-tuning.json",
                     16,          128,
                     UATTN_BF16,  sizeof a->w.buf,
                     a->w.buf,    &a->w.length,
                     &a->w.info,  &a->w.entry,
                     &a->w.found, plan_config()};
  a->config_ptr = &a->config;
  a->layer = uattn_layer_default(8, 2, 128, UATTN_BF16);
  a->layer_ptr = &a->layer;
}
#define load_tuning_init tuning_init
#define tuning_info_init tuning_init
#define tuning_report_init tuning_init
#define tuning_lookup_init tuning_init
#define tuned_plan_config_init tuning_init
#define tuned_layer_init tuning_init
static uattn_status load_tuning_call(void *p) {
  tuning_args *a = p;
  return uattn_runtime_load_tuning(a->rt, a->path);
}
static uattn_status tuning_info_call(void *p) {
  tuning_args *a = p;
  return uattn_runtime_tuning_info(a->rt, a->info);
}
static uattn_status tuning_report_call(void *p) {
  tuning_args *a = p;
  return uattn_runtime_tuning_report(a->rt, a->buf, a->cap, a->length);
}
static uattn_status tuning_lookup_call(void *p) {
  tuning_args *a = p;
  return uattn_runtime_tuning_lookup(a->rt, a->block_size, a->head_dim, a->cache_dtype, a->entry, a->found);
}
static uattn_status tuned_plan_config_call(void *p) {
  tuning_args *a = p;
  return uattn_runtime_tuned_plan_config(a->rt, a->head_dim, a->cache_dtype, a->config_ptr);
}
static uattn_status tuned_layer_call(void *p) {
  tuning_args *a = p;
  return uattn_runtime_tuned_layer(a->rt, a->block_size, a->layer_ptr);
}
/* the config and the layer are in/out */
static int tuned_more(void *p, region *r) {
  tuning_args *a = p;
  r[0] = (region){&a->config, sizeof a->config, true};
  r[1] = (region){&a->layer, sizeof a->layer, true};
  return 2;
}
/* the tuning the fixture's runtime uses (a refused load records why in last_status and message: the
 * header says so) */
static size_t tuning_state(void *p, unsigned char *image) {
  uattn_tuning_info info;
  memset(&info, 0, sizeof info);
  cr_assert_eq(uattn_runtime_tuning_info(rt, &info), UATTN_OK);
  const size_t kept = offsetof(uattn_tuning_info, last_status);
  memcpy(image, &info, kept);
  return kept;
}

Test(api_misuse, uattn_runtime_tuning_calls) {
  typedef tuning_args T;
  static const api_fn load = API_FN(load_tuning, T, .state = tuning_state), info = API_FN(tuning_info, T),
                      report = API_FN(tuning_report, T), lookup = API_FN(tuning_lookup, T),
                      plan_config = API_FN(tuned_plan_config, T, .more = tuned_more),
                      layer = API_FN(tuned_layer, T, .more = tuned_more);
  static const misuse load_cases[] = {
      NULL_ARG(T, rt, "rt"),
      {"a file that cannot be read", {{0}}, REFUSED, "/nonexistent/uattn-tuning.json"},
      CASE(T, path, EDIT_NULL, 0, UATTN_OK, "path"), /* NULL drops the tuning */
  };
  static const misuse info_cases[] = {NULL_ARG(T, rt, "rt"), NULL_ARG(T, info, "out")};
  static const misuse report_cases[] = {
      NULL_ARG(T, rt, "rt"),
      POINTER_ARG(T, length, "length"),
      NULL_ARG(T, buf, "buf"),
      CASE(T, cap, EDIT_SIZE, 1, UATTN_ERR_CAPACITY, "cap"),
      CASE(T, cap, EDIT_SIZE, 0, UATTN_ERR_CAPACITY, "cap"),
  };
  static const misuse lookup_cases[] = {
      NULL_ARG(T, rt, "rt"),
      POINTER_ARG(T, entry, "out"),
      CASE(T, found, EDIT_NULL, 0, UATTN_OK, "found"), /* optional */
      COUNT(T, block_size, REFUSED, UATTN_OK, "block_size"),
      COUNT(T, head_dim, REFUSED, UATTN_OK, "head_dim"),
      ENUM(T, cache_dtype, "cache_dtype"),
  };
  static const misuse plan_config_cases[] = {
      NULL_ARG(T, rt, "rt"),
      POINTER_ARG(T, config_ptr, "config"),
      COUNT(T, head_dim, REFUSED, UATTN_OK, "head_dim"),
      COUNT(T, config.block_size, REFUSED, UATTN_OK, "block_size"),
      ENUM(T, cache_dtype, "cache_dtype"),
  };
  static const misuse layer_cases[] = {
      NULL_ARG(T, rt, "rt"),
      POINTER_ARG(T, layer_ptr, "layer"),
      COUNT(T, block_size, REFUSED, UATTN_OK, "block_size"),
      COUNT(T, layer.head_dim, REFUSED, UATTN_OK, "head_dim"),
      ENUM(T, layer.cache_dtype, "cache_dtype"),
  };
  RUN(load, load_cases);
  RUN(info, info_cases);
  RUN(report, report_cases);
  RUN(lookup, lookup_cases);
  RUN(plan_config, plan_config_cases);
  RUN(layer, layer_cases);
}
