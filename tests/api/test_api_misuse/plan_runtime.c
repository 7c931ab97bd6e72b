/* The planner's public calls under bad input (uattn_bucket_range, uattn_plan_create, uattn_plan_step and the
 * plan's queries), then the runtime's and the cache memory's, through the suite's table runner (misuse.h). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "misuse.h"

/* ---- the planner -------------------------------------------------------------------------------------- */

typedef struct bucket_range_args {
  int32_t min, max, round_up, cap;
  int32_t *out, *count;
  struct {
    int32_t out[17], count;
  } w;
} bucket_range_args;
static void bucket_range_init(void *p) {
  bucket_range_args *a = p;
  *a = (bucket_range_args){1, 64, 4, 16, a->w.out, &a->w.count};
}
static uattn_status bucket_range_call(void *p) {
  bucket_range_args *a = p;
  return uattn_bucket_range(a->min, a->max, a->round_up, a->out, a->cap, a->count);
}

Test(api_misuse, uattn_bucket_range) {
  typedef bucket_range_args T;
  static const api_fn fn = API_FN(bucket_range, T);
  static const misuse cases[] = {
      POINTER_ARG(T, count, "count"),
      POINTER_ARG(T, out, "out"),
      COUNT(T, cap, REFUSED, UATTN_OK, "holds"),
      COUNT(T, min, UATTN_OK, REFUSED, "min"),
      COUNT(T, round_up, REFUSED, UATTN_OK, "round_up"),
      SET(T, max, -1, REFUSED, "max"),
  };
  RUN(fn, cases);
}

typedef struct plan_create_args {
  uattn_plan_config config;
  const uattn_plan_config *config_ptr;
  uattn_plan **out;
  struct {
    uattn_plan *plan;
  } w;
} plan_create_args;
static void plan_create_init(void *p) {
  plan_create_args *a = p;
  a->config = plan_config();
  a->config_ptr = &a->config;
  a->out = &a->w.plan;
}
static uattn_status plan_create_call(void *p) {
  plan_create_args *a = p;
  return uattn_plan_create(a->config_ptr, a->out);
}
static void plan_create_fini(void *p, uattn_status st) {
  if (st == UATTN_OK) uattn_plan_destroy(((plan_create_args *)p)->w.plan);
}

Test(api_misuse, uattn_plan_create) {
  typedef plan_create_args T;
  static const api_fn fn = API_FN(plan_create, T, .fini = plan_create_fini);
  static const misuse cases[] = {
      NULL_ARG(T, config_ptr, "config"),
      POINTER_ARG(T, out, "out"),
      COUNT(T, config.block_size, REFUSED, REFUSED, "block_size"),
      COUNT(T, config.num_blocks, REFUSED, REFUSED, "num_blocks"), /* INT32_MAX x block_size overflows */
      COUNT(T, config.max_num_seqs, REFUSED, REFUSED, "max_num_seqs"),
      COUNT(T, config.max_num_batched_tokens, REFUSED, REFUSED, "max_num_batched_tokens"),
      COUNT(T, config.max_model_len, REFUSED, UATTN_OK, "max_model_len"),
      SET(T, config.chunk_size, -1, REFUSED, "chunk_size"),
      SET(T, config.split_min_keys, -1, REFUSED, "split_min_keys"),
      SET(T, config.split_keys, -1, REFUSED, "split_keys"),
      ENUM(T, config.bucketing.mode, "bucketing"),
  };
  RUN(fn, cases);
}

/* The plan's observable state: everything uattn_plan_get_info and uattn_plan_get_stats report. */
static size_t plan_state(const uattn_plan *p, unsigned char *image) {
  uattn_plan_info info;
  uattn_plan_stats stats;
  memset(&info, 0, sizeof info);
  memset(&stats, 0, sizeof stats);
  cr_assert_eq(uattn_plan_get_info(p, &info), UATTN_OK);
  cr_assert_eq(uattn_plan_get_stats(p, &stats), UATTN_OK);
  memcpy(image, &info, sizeof info);
  memcpy(image + sizeof info, &stats, sizeof stats);
  return sizeof info + sizeof stats;
}

typedef struct plan_step_args {
  uattn_plan *plan;
  uattn_step step;
  const uattn_step *step_ptr;
  int32_t drafts[2], draft_offsets[3], ids[2 * 16];
  struct {
    char none;
  } w;
} plan_step_args;
static void plan_step_init(void *p) {
  plan_step_args *a = p;
  a->plan = plan;
  a->step = valid_step();
  a->step_ptr = &a->step;
  /* the decode verifies one draft; ids for every position */
  a->drafts[0] = 7;
  a->draft_offsets[0] = 0, a->draft_offsets[1] = 0, a->draft_offsets[2] = 1;
  a->step.draft_tokens = a->drafts;
  a->step.draft_offsets = a->draft_offsets;
  a->step.token_ids = a->ids;
  a->step.token_ids_stride = 16;
}
static uattn_status plan_step_call(void *p) {
  plan_step_args *a = p;
  return uattn_plan_step(a->plan, a->step_ptr);
}
/* the fixture's plan: the edited arguments may have lost it */
static size_t plan_step_state(void *p, unsigned char *image) { return plan_state(plan, image); }

Test(api_misuse, uattn_plan_step) {
  typedef plan_step_args T;
  static const api_fn fn = API_FN(plan_step, T, .state = plan_step_state);
  static const misuse cases[] = {
      NULL_ARG(T, plan, "plan"),
      NULL_ARG(T, step_ptr, "step"),
      POINTER_ARG(T, step.num_computed, "step.num_computed"),
      POINTER_ARG(T, step.num_scheduled, "step.num_scheduled"),
      POINTER_ARG(T, step.num_prompt, "step.num_prompt"),
      POINTER_ARG(T, step.block_table, "step.block_table"),
      POINTER_ARG(T, step.draft_tokens, "step.draft_tokens"),
      MISALIGNED(T, step.token_ids, "step.token_ids"),
      MISALIGNED(T, step.draft_offsets, "step.draft_offsets"),
      COUNT(T, step.num_reqs, UATTN_OK, REFUSED, "num_reqs"),
      LENGTH(T, step.block_table_stride, REFUSED, "block_table_stride"),
      LENGTH(T, step.token_ids_stride, REFUSED, "token_ids_stride"),
  };
  RUN(fn, cases);
}

typedef struct plan_query_args {
  uattn_plan *plan;
  uattn_plan_info *info;
  uattn_plan_stats *stats;
  struct {
    uattn_plan_info info;
    uattn_plan_stats stats;
  } w;
} plan_query_args;
static void plan_get_info_init(void *p) {
  plan_query_args *a = p;
  *a = (plan_query_args){plan, &a->w.info, &a->w.stats};
}
#define plan_get_stats_init plan_get_info_init
static uattn_status plan_get_info_call(void *p) {
  plan_query_args *a = p;
  return uattn_plan_get_info(a->plan, a->info);
}
static uattn_status plan_get_stats_call(void *p) {
  plan_query_args *a = p;
  return uattn_plan_get_stats(a->plan, a->stats);
}

Test(api_misuse, uattn_plan_get_info_and_stats) {
  typedef plan_query_args T;
  static const api_fn info = API_FN(plan_get_info, T), stats = API_FN(plan_get_stats, T);
  static const misuse info_cases[] = {NULL_ARG(T, plan, "plan"), NULL_ARG(T, info, "info")};
  static const misuse stats_cases[] = {NULL_ARG(T, plan, "plan"), NULL_ARG(T, stats, "stats")};
  RUN(info, info_cases);
  RUN(stats, stats_cases);
}

typedef struct plan_buckets_args {
  uattn_plan *plan;
  uattn_bucket *buckets;
  bool *causal;
  int32_t cap, *count;
  struct {
    uattn_bucket buckets[1024];
    bool causal[1024];
    int32_t count;
  } w;
} plan_buckets_args;
static void plan_buckets_init(void *p) {
  plan_buckets_args *a = p;
  *a = (plan_buckets_args){plan, a->w.buckets, a->w.causal, 1024, &a->w.count};
}
static uattn_status plan_buckets_call(void *p) {
  plan_buckets_args *a = p;
  return uattn_plan_buckets(a->plan, a->buckets, a->causal, a->cap, a->count);
}

Test(api_misuse, uattn_plan_buckets) {
  typedef plan_buckets_args T;
  static const api_fn fn = API_FN(plan_buckets, T);
  static const misuse cases[] = {
      NULL_ARG(T, plan, "plan"),
      POINTER_ARG(T, count, "count"),
      POINTER_ARG(T, buckets, "buckets"),
      COUNT(T, cap, REFUSED, UATTN_OK, "holds"),
  };
  RUN(fn, cases);
}

typedef struct plan_materialize_args {
  uattn_plan *plan;
  unsigned what;
  uattn_graph_tensors *out;
  struct {
    uattn_graph_tensors out;
  } w;
} plan_materialize_args;
static void plan_materialize_init(void *p) {
  plan_materialize_args *a = p;
  *a = (plan_materialize_args){plan, UATTN_GRAPH_CAUSAL_BIAS | UATTN_GRAPH_PADDED_IDS, &a->w.out};
}
static uattn_status plan_materialize_call(void *p) {
  plan_materialize_args *a = p;
  return uattn_plan_materialize(a->plan, a->what, a->out);
}

Test(api_misuse, uattn_plan_materialize) {
  typedef plan_materialize_args T;
  static const api_fn fn = API_FN(plan_materialize, T);
  static const misuse cases[] = {
      NULL_ARG(T, plan, "plan"),
      NULL_ARG(T, out, "out"),
      SET(T, what, 1 << 7, REFUSED, "flags"),
      SET(T, what, -1, REFUSED, "flags"),
      SET(T, what, 0, UATTN_OK, "flags"),
  };
  RUN(fn, cases);
}

/* ---- the runtime and cache memory --------------------------------------------------------------------- */

typedef struct runtime_create_args {
  uattn_runtime_config config;
  const uattn_runtime_config *config_ptr;
  uattn_runtime **out;
  struct {
    uattn_runtime *rt;
  } w;
} runtime_create_args;
static void runtime_create_init(void *p) {
  runtime_create_args *a = p;
  a->config = uattn_runtime_config_default();
  a->config.num_threads = 1;
  a->config.pin = false;
  a->config_ptr = &a->config;
  a->out = &a->w.rt;
}
static uattn_status runtime_create_call(void *p) {
  runtime_create_args *a = p;
  return uattn_runtime_create(a->config_ptr, a->out);
}
static void runtime_create_fini(void *p, uattn_status st) {
  if (st == UATTN_OK) uattn_runtime_destroy(((runtime_create_args *)p)->w.rt);
}

Test(api_misuse, uattn_runtime_create) {
  typedef runtime_create_args T;
  static const api_fn fn = API_FN(runtime_create, T, .fini = runtime_create_fini);
  static const misuse cases[] = {
      POINTER_ARG(T, out, "out"),
      COUNT(T, config.num_threads, UATTN_OK, REFUSED, "num_threads"),
      SET(T, config.spin_us, -1, REFUSED, "spin_us"),
      SET(T, config.spin_us, INT32_MAX, REFUSED, "spin_us"),
  };
  RUN(fn, cases);
  /* config NULL means the defaults */
  uattn_runtime *r = NULL;
  cr_expect_eq(uattn_runtime_create(NULL, &r), UATTN_OK, "%s", uattn_last_error());
  uattn_runtime_destroy(r);
}

typedef struct runtime_get_topology_args {
  uattn_runtime *rt;
  uattn_topology *out;
  struct {
    uattn_topology out;
  } w;
} runtime_get_topology_args;
static void runtime_get_topology_init(void *p) {
  runtime_get_topology_args *a = p;
  *a = (runtime_get_topology_args){rt, &a->w.out};
}
static uattn_status runtime_get_topology_call(void *p) {
  runtime_get_topology_args *a = p;
  return uattn_runtime_get_topology(a->rt, a->out);
}

Test(api_misuse, uattn_runtime_get_topology) {
  typedef runtime_get_topology_args T;
  static const api_fn fn = API_FN(runtime_get_topology, T);
  static const misuse cases[] = {NULL_ARG(T, rt, "rt"), NULL_ARG(T, out, "out")};
  RUN(fn, cases);
}

/* uattn_cache_alloc and uattn_runtime_cache_alloc (rt unused by the first) */
typedef struct cache_alloc_args {
  uattn_runtime *rt;
  size_t bytes;
  void **out;
  struct {
    void *ptr;
  } w;
} cache_alloc_args;
static void cache_alloc_init(void *p) {
  cache_alloc_args *a = p;
  *a = (cache_alloc_args){rt, 4096, &a->w.ptr};
}
#define runtime_cache_alloc_init cache_alloc_init
static uattn_status cache_alloc_call(void *p) {
  cache_alloc_args *a = p;
  return uattn_cache_alloc(a->bytes, a->out);
}
static uattn_status runtime_cache_alloc_call(void *p) {
  cache_alloc_args *a = p;
  return uattn_runtime_cache_alloc(a->rt, a->bytes, a->out);
}
static void cache_alloc_fini(void *p, uattn_status st) {
  const cache_alloc_args *a = p;
  if (st == UATTN_OK) uattn_cache_free(a->w.ptr, a->bytes);
}

Test(api_misuse, uattn_cache_alloc_and_runtime_cache_alloc) {
  typedef cache_alloc_args T;
  static const api_fn plain = API_FN(cache_alloc, T, .fini = cache_alloc_fini),
                      placed = API_FN(runtime_cache_alloc, T, .fini = cache_alloc_fini);
  static const misuse cases[] = {
      POINTER_ARG(T, out, "out"),
      CASE(T, bytes, EDIT_SIZE, 0, UATTN_ERR_INVALID_ARGUMENT, "bytes"),
      CASE(T, bytes, EDIT_SIZE, -1, UATTN_ERR_OVERFLOW, "overflow"),
      CASE(T, bytes, EDIT_SIZE, SIZE_MAX - (1 << 20), UATTN_ERR_OVERFLOW, "overflow"),
  };
  static const misuse placed_cases[] = {NULL_ARG(T, rt, "rt")};
  RUN(plain, cases);
  RUN(placed, cases);
  RUN(placed, placed_cases);
}
