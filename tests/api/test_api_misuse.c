/* Every public function of include/ (uattn.h, uattn_vllm.h, uattn_tuning.h) under bad input: each pointer NULL, each count at -1,
 * 0 and INT32_MAX, sizes whose product overflows size_t, misaligned typed buffers and enum values out of
 * range. A refused call must return an error status with a message naming what was wrong, and must leave
 * everything it was given to write exactly as it was: each output is filled with a canary before the call
 * and compared byte for byte after it. Where 0 is a legal count the call must succeed.
 *
 * The cases are tables, one per function: a row edits the function's valid arguments (a field of its
 * argument struct, found by offsetof) and says what the call must return. docs/testing.md's "Bad input" table
 * is this file's summary; keep the two together.
 *
 * INT32_MAX is not tried for a count that is only the length of an array the caller passes (num_reqs of
 * the batch utilities, rows of the merges...): the library cannot know the array is shorter than the
 * caller says, so such a call reads past it by the caller's own error. It is tried wherever the library
 * bounds the count by something it knows (a capacity, a plan's limits, a documented maximum). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/attention_case.h"
#include "uattn_tuning.h"
#include "uattn_vllm.h"

/* ---- the runner ------------------------------------------------------------------------------------- */

#define CANARY 0xa5
#define MAX_REGIONS 6
#define MAX_STATE 2048
#define REFUSED ((uattn_status)-1) /* any error status will do (the message is still checked) */

/* Memory a call may write. keep: an in/out buffer whose bytes are inputs too, compared but not filled. */
typedef struct region {
  void *ptr;
  size_t bytes;
  bool keep;
} region;

typedef enum edit_kind { EDIT_NONE, EDIT_NULL, EDIT_I32, EDIT_SIZE, EDIT_MISALIGN } edit_kind;

/* One change to an argument: the field at `field` of the argument struct set to NULL, to an int32 (counts
 * and enums), to a size_t, or (a pointer) moved one byte on. */
typedef struct edit {
  size_t field;
  edit_kind kind;
  int64_t value;
} edit;

typedef struct misuse {
  const char *label;
  edit edits[3];
  uattn_status want;  /* UATTN_OK: the input is legal and the call must succeed; REFUSED: any error */
  const char *needle; /* what the message must mention: the argument, or the problem */
} misuse;

/* A public function under test, called through a struct holding its arguments. The struct's w member is
 * the storage its outputs point into; init makes valid arguments, so that each row breaks one thing. */
typedef struct api_fn {
  const char *name;
  size_t size, w_offset, w_bytes;
  void (*init)(void *args);
  uattn_status (*call)(void *args);
  /* optional: more memory the call may write (heap buffers, in/out structs); returns how many */
  int (*more)(void *args, region *out);
  /* optional: an image of the state of an object the call may change (a plan, a runtime's tuning) */
  size_t (*state)(void *args, unsigned char *image);
  /* optional: frees what a successful call made */
  void (*fini)(void *args, uattn_status st);
} api_fn;

#define API_FN(fn, T, ...)                                                                                             \
  { #fn, sizeof(T), offsetof(T, w), sizeof(((T *)0)->w), fn##_init, fn##_call, __VA_ARGS__ }

#define CASE(T, f, kind, v, want, needle)                                                                              \
  { #f " " #kind " " #v, {{offsetof(T, f), kind, (v) } }, want, needle }
#define NULL_ARG(T, f, needle) CASE(T, f, EDIT_NULL, 0, UATTN_ERR_INVALID_ARGUMENT, needle)
#define MISALIGNED(T, f, needle) CASE(T, f, EDIT_MISALIGN, 1, UATTN_ERR_INVALID_ARGUMENT, needle)
#define SET(T, f, v, want, needle) CASE(T, f, EDIT_I32, v, want, needle)
/* -1 and 0 (zero: what 0 must give) of a count that is an array's length; COUNT adds INT32_MAX (max: what
 * it must give, UATTN_OK for a capacity) */
#define LENGTH(T, f, zero, needle) SET(T, f, -1, REFUSED, needle), SET(T, f, 0, zero, needle)
#define COUNT(T, f, zero, max, needle) LENGTH(T, f, zero, needle), SET(T, f, INT32_MAX, max, needle)
#define ENUM(T, f, needle) SET(T, f, 99, REFUSED, needle), SET(T, f, -1, REFUSED, needle)

static void apply(void *args, const edit *e) {
  char *at = (char *)args + e->field;
  switch (e->kind) {
  case EDIT_NONE: break;
  case EDIT_NULL: memset(at, 0, sizeof(void *)); break;
  case EDIT_I32: {
    const int32_t v = (int32_t)e->value;
    memcpy(at, &v, sizeof v);
    break;
  }
  case EDIT_SIZE: {
    const size_t v = (size_t)e->value;
    memcpy(at, &v, sizeof v);
    break;
  }
  case EDIT_MISALIGN: {
    char *p;
    memcpy(&p, at, sizeof p);
    p += e->value;
    memcpy(at, &p, sizeof p);
    break;
  }
  }
}

/* What fn may write, filled with the canary (all but the kept buffers) and copied. Taken after the row's
 * edits, which may change an in/out struct; the regions are those of the valid arguments. */
static int snapshot(const api_fn *fn, void *args, region *r, unsigned char **before) {
  int n = 0;
  r[n++] = (region){(char *)args + fn->w_offset, fn->w_bytes, false};
  if (fn->more) n += fn->more(args, r + n);
  for (int i = 0; i < n; i++) {
    if (!r[i].keep) memset(r[i].ptr, CANARY, r[i].bytes);
    before[i] = malloc(r[i].bytes);
    memcpy(before[i], r[i].ptr, r[i].bytes);
  }
  return n;
}

static void run_case(const api_fn *fn, const misuse *m) {
  void *args = calloc(1, fn->size);
  fn->init(args);
  region r[MAX_REGIONS];
  unsigned char *before[MAX_REGIONS], state0[MAX_STATE] = {0}, state1[MAX_STATE] = {0};
  for (int i = 0; i < 3; i++) apply(args, &m->edits[i]);
  const int n = snapshot(fn, args, r, before);
  const size_t state_bytes = fn->state ? fn->state(args, state0) : 0;

  const uattn_status st = fn->call(args);
  const char *msg = uattn_last_error();
  if (m->want == UATTN_OK) {
    cr_expect_eq(st, UATTN_OK, "%s, %s: must succeed, got %s (%s)", fn->name, m->label, uattn_status_name(st), msg);
  } else {
    cr_expect_neq(st, UATTN_OK, "%s, %s: accepted", fn->name, m->label);
    if (m->want != REFUSED)
      cr_expect_eq(st, m->want, "%s, %s: got %s (%s), want %s", fn->name, m->label, uattn_status_name(st), msg,
                   uattn_status_name(m->want));
    cr_expect(msg[0] != '\0', "%s, %s: refused without a message", fn->name, m->label);
    cr_expect(strstr(msg, m->needle) != NULL, "%s, %s: message '%s' does not mention '%s'", fn->name, m->label, msg,
              m->needle);
    for (int i = 0; i < n; i++)
      cr_expect(memcmp(before[i], r[i].ptr, r[i].bytes) == 0, "%s, %s: output %d was written", fn->name, m->label, i);
    if (fn->state) {
      fn->state(args, state1);
      cr_expect(memcmp(state0, state1, state_bytes) == 0, "%s, %s: the object changed", fn->name, m->label);
    }
  }
  if (fn->fini) fn->fini(args, st);
  for (int i = 0; i < n; i++) free(before[i]);
  free(args);
}

static void run_table(const api_fn *fn, const misuse *cases, size_t count) {
  for (size_t i = 0; i < count; i++) run_case(fn, &cases[i]);
}

#define RUN(fn, cases) run_table(&(fn), (cases), sizeof(cases) / sizeof((cases)[0]))

/* ---- fixtures: a planned step and a runtime ----------------------------------------------------------- */

/* A prompt of 5 tokens and a decode over 6 cached ones, block size 4; the plan buckets the seed's way. */
static const int32_t step_computed[] = {0, 6}, step_scheduled[] = {5, 1}, step_prompt[] = {5, 4};
static const int32_t step_table[] = {0, 1, -1, -1, 2, 3, -1, -1};
static uattn_plan *plan;
static uattn_runtime *rt;

static uattn_plan_config plan_config(void) {
  uattn_plan_config c = uattn_plan_config_default(4, 16, 4, 64, 64);
  c.bucketing.mode = UATTN_BUCKETING_EXPONENTIAL;
  return c;
}

static uattn_step valid_step(void) {
  return (uattn_step){.num_reqs = 2,
                      .num_computed = step_computed,
                      .num_scheduled = step_scheduled,
                      .num_prompt = step_prompt,
                      .block_table = step_table,
                      .block_table_stride = 4};
}

static void setup(void) {
  const uattn_plan_config c = plan_config();
  cr_assert_eq(uattn_plan_create(&c, &plan), UATTN_OK, "%s", uattn_last_error());
  const uattn_step s = valid_step();
  cr_assert_eq(uattn_plan_step(plan, &s), UATTN_OK, "%s", uattn_last_error());
  uattn_runtime_config rc = uattn_runtime_config_default();
  rc.num_threads = 1;
  rc.pin = false;
  cr_assert_eq(uattn_runtime_create(&rc, &rt), UATTN_OK, "%s", uattn_last_error());
}

static void teardown(void) {
  uattn_plan_destroy(plan);
  uattn_runtime_destroy(rt);
}

TestSuite(api_misuse, .init = setup, .fini = teardown);

/* ---- status, version, defaults, destroy: functions without a status ---------------------------------- */

Test(api_misuse, functions_without_a_status) {
  cr_expect_str_eq(uattn_status_name((uattn_status)99), "UATTN_ERR_UNKNOWN");
  cr_expect_str_eq(uattn_status_name((uattn_status)-1), "UATTN_ERR_UNKNOWN");
  cr_expect_not_null(uattn_version());
  cr_expect_not_null(uattn_kernel_set(NULL), "why may be NULL");
  cr_expect_not_null(uattn_last_error());
  /* the defaults copy their arguments; uattn_plan_create and uattn_forward judge them */
  const uattn_plan_config c = uattn_plan_config_default(-1, 0, INT32_MAX, -1, 0);
  cr_expect_eq(c.block_size, -1);
  const uattn_layer l = uattn_layer_default(-1, 0, INT32_MAX, (uattn_dtype)99);
  cr_expect(l.scale > 0.0f && l.scale < 1.0f, "a finite scale for any head_dim");
  cr_expect_eq(uattn_layer_default(8, 2, 0, UATTN_F32).scale, 1.0f, "no division by head_dim 0");
  cr_expect_eq(uattn_layer_default(8, 2, -4, UATTN_F32).scale, 1.0f);
  cr_expect_eq(uattn_runtime_config_default().num_threads, 0);
  /* destroy and free accept NULL */
  uattn_plan_destroy(NULL);
  uattn_runtime_destroy(NULL);
  uattn_cache_free(NULL, 0);
  uattn_cache_free(NULL, SIZE_MAX);
  /* uattn_kernel_buckets gives its count; a negative or NULL capacity copies nothing */
  const int32_t n = uattn_kernel_buckets(NULL, 0);
  cr_expect_geq(n, 0);
  uattn_kernel_bucket b[2];
  memset(b, CANARY, sizeof b);
  const unsigned char *bytes = (const unsigned char *)b;
  cr_expect_eq(uattn_kernel_buckets(b, -1), n);
  cr_expect_eq(uattn_kernel_buckets(b, 0), n);
  cr_expect_eq(uattn_kernel_buckets(NULL, INT32_MAX), n);
  for (size_t i = 0; i < sizeof b; i++) cr_expect_eq(bytes[i], CANARY, "uattn_kernel_buckets wrote past capacity");
  /* it has no status to refuse a misaligned out with: it copies byte-wise, the same bucket */
  unsigned char misaligned[sizeof(uattn_kernel_bucket) + 1];
  if (n > 0) {
    cr_expect_eq(uattn_kernel_buckets(b, 1), n);
    cr_expect_eq(uattn_kernel_buckets((uattn_kernel_bucket *)(misaligned + 1), 1), n);
    uattn_kernel_bucket got;
    memcpy(&got, misaligned + 1, sizeof got);
    cr_expect(got.block_size == b[0].block_size && got.head_dim == b[0].head_dim && got.dtype == b[0].dtype &&
                  got.chunk_size == b[0].chunk_size && got.isa == b[0].isa && got.runs_here == b[0].runs_here,
              "a misaligned out got another bucket");
  }
}

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
      NULL_ARG(T, count, "count"),
      NULL_ARG(T, out, "out"),
      MISALIGNED(T, out, "out"),
      MISALIGNED(T, count, "count"),
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
      NULL_ARG(T, out, "out"),
      MISALIGNED(T, out, "out"),
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
      NULL_ARG(T, step.num_computed, "step.num_computed"),
      NULL_ARG(T, step.num_scheduled, "step.num_scheduled"),
      NULL_ARG(T, step.num_prompt, "step.num_prompt"),
      NULL_ARG(T, step.block_table, "step.block_table"),
      NULL_ARG(T, step.draft_tokens, "step.draft_tokens"),
      MISALIGNED(T, step.num_computed, "step.num_computed"),
      MISALIGNED(T, step.num_scheduled, "step.num_scheduled"),
      MISALIGNED(T, step.num_prompt, "step.num_prompt"),
      MISALIGNED(T, step.block_table, "step.block_table"),
      MISALIGNED(T, step.token_ids, "step.token_ids"),
      MISALIGNED(T, step.draft_tokens, "step.draft_tokens"),
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
      NULL_ARG(T, plan, "plan"),         NULL_ARG(T, count, "count"),   NULL_ARG(T, buckets, "buckets"),
      MISALIGNED(T, buckets, "buckets"), MISALIGNED(T, count, "count"), COUNT(T, cap, REFUSED, UATTN_OK, "holds"),
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
      NULL_ARG(T, out, "out"),
      MISALIGNED(T, out, "out"),
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
      NULL_ARG(T, out, "out"),
      MISALIGNED(T, out, "out"),
      CASE(T, bytes, EDIT_SIZE, 0, UATTN_ERR_INVALID_ARGUMENT, "bytes"),
      CASE(T, bytes, EDIT_SIZE, -1, UATTN_ERR_OVERFLOW, "overflow"),
      CASE(T, bytes, EDIT_SIZE, SIZE_MAX - (1 << 20), UATTN_ERR_OVERFLOW, "overflow"),
  };
  static const misuse placed_cases[] = {NULL_ARG(T, rt, "rt")};
  RUN(plain, cases);
  RUN(placed, cases);
  RUN(placed, placed_cases);
}

/* ---- attention ---------------------------------------------------------------------------------------- */

/* fp32 inputs over bf16 caches: the cache update converts, so each cache store is a 2-byte one (defect 4). */
static const attention_case forward_case = {
    "misuse", BATCH_MIXED, 16, 4, 2, 32, UATTN_F32, UATTN_BF16, UATTN_LAYOUT_NHD, UATTN_ATTENTION_DECODER,
    0,        0,           0,  0, 0, 0,  19};
static attention_run forward_run;
static float forward_sinks[4], forward_slopes[4];
#define SLACK 64 /* room past each buffer for a pointer moved one byte on */

typedef struct forward_args {
  const uattn_plan *plan;
  uattn_layer layer;
  uattn_tensors tensors;
  uattn_runtime *rt;
  const uattn_layer *layer_ptr;
  const uattn_tensors *tensors_ptr;
  uattn_cross cross;
  void *owned[4]; /* the heap buffers, as allocated (a row may move the pointers) */
  int32_t encoder_lens[RB_MAX_REQS + 1], cross_table[RB_MAX_REQS * 4 + 1];
  struct {
    char none;
  } w;
} forward_args;

static void *heap_copy(const void *src, size_t bytes) {
  void *p = calloc(bytes + SLACK, 1);
  memcpy(p, src, bytes);
  return p;
}

static void forward_init(void *p) {
  forward_args *a = p;
  const attention_run *run = &forward_run;
  a->plan = run->plan;
  a->layer = run->layer;
  a->layer.sinks = forward_sinks;
  a->layer.alibi_slopes = forward_slopes;
  a->rt = rt;
  a->tensors = (uattn_tensors){.q = run->q,
                               .k = run->k,
                               .v = run->v,
                               .key_cache = heap_copy(run->key_cache0, run->cache_bytes),
                               .value_cache = heap_copy(run->value_cache0, run->cache_bytes),
                               .num_blocks = run->num_blocks,
                               .block_size = run->c.block_size,
                               .out = calloc(run->out_bytes + SLACK, 1),
                               .lse = calloc((size_t)run->info.num_tokens * run->c.num_q_heads + SLACK, sizeof(float)),
                               .cross = &a->cross};
  a->cross = (uattn_cross){a->encoder_lens, a->cross_table, 4};
  a->owned[0] = a->tensors.key_cache, a->owned[1] = a->tensors.value_cache;
  a->owned[2] = a->tensors.out, a->owned[3] = a->tensors.lse;
  a->layer_ptr = &a->layer;
  a->tensors_ptr = &a->tensors;
}
static uattn_status forward_call(void *p) {
  forward_args *a = p;
  return uattn_forward(a->plan, a->layer_ptr, a->tensors_ptr, a->rt);
}
static int forward_more(void *p, region *r) {
  forward_args *a = p;
  const attention_run *run = &forward_run;
  r[0] = (region){a->owned[0], run->cache_bytes + SLACK, true};
  r[1] = (region){a->owned[1], run->cache_bytes + SLACK, true};
  r[2] = (region){a->owned[2], run->out_bytes + SLACK, false};
  r[3] = (region){a->owned[3], ((size_t)run->info.num_tokens * run->c.num_q_heads + SLACK) * sizeof(float), false};
  return 4;
}
static void forward_fini(void *p, uattn_status st) {
  (void)st;
  forward_args *a = p;
  for (int i = 0; i < 4; i++) free(a->owned[i]);
}

/* (after the suite's own setup, before its teardown) */
static void forward_setup(void) { attention_run_build(&forward_run, &forward_case); }
static void forward_teardown(void) { attention_run_free(&forward_run); }

static const api_fn forward_fn = API_FN(forward, forward_args, .more = forward_more, .fini = forward_fini);

/* Defect 4 of issue 19: a bf16 key cache one byte off its 2-byte alignment reached a misaligned store in
 * the cache update (kernels/convert.c) instead of a status. */
Test(api_misuse, forward_refuses_a_misaligned_bf16_key_cache, .init = forward_setup, .fini = forward_teardown) {
  static const misuse cases[] = {MISALIGNED(forward_args, tensors.key_cache, "tensors.key_cache")};
  RUN(forward_fn, cases);
}

Test(api_misuse, uattn_forward, .init = forward_setup, .fini = forward_teardown) {
  typedef forward_args T;
  /* a cache of INT32_MAX blocks of INT32_MAX heads: its byte size overflows size_t */
  static const misuse overflow = {"cache bytes overflow size_t",
                                  {{offsetof(T, tensors.num_blocks), EDIT_I32, INT32_MAX},
                                   {offsetof(T, layer.num_kv_heads), EDIT_I32, INT32_MAX},
                                   {offsetof(T, layer.num_q_heads), EDIT_I32, INT32_MAX}},
                                  UATTN_ERR_OVERFLOW,
                                  "overflow"};
  /* TILED stores dims in pairs (head_dim 31 fits the buffers made for 32: the refusal is the layout's) */
  static const misuse tiled_odd_dim = {
      "TILED with an odd head_dim",
      {{offsetof(T, layer.kv_layout), EDIT_I32, UATTN_LAYOUT_TILED}, {offsetof(T, layer.head_dim), EDIT_I32, 31}},
      UATTN_ERR_INVALID_ARGUMENT,
      "head_dim"};
  static const misuse cases[] = {
      NULL_ARG(T, plan, "plan"),
      NULL_ARG(T, layer_ptr, "layer"),
      NULL_ARG(T, tensors_ptr, "tensors"),
      NULL_ARG(T, tensors.q, "tensors.q"),
      NULL_ARG(T, tensors.k, "tensors.k"),
      NULL_ARG(T, tensors.v, "tensors.v"),
      NULL_ARG(T, tensors.key_cache, "tensors.key_cache"),
      NULL_ARG(T, tensors.value_cache, "tensors.value_cache"),
      NULL_ARG(T, tensors.out, "tensors.out"),
      MISALIGNED(T, tensors.q, "tensors.q"),
      MISALIGNED(T, tensors.k, "tensors.k"),
      MISALIGNED(T, tensors.v, "tensors.v"),
      MISALIGNED(T, tensors.key_cache, "tensors.key_cache"),
      MISALIGNED(T, tensors.value_cache, "tensors.value_cache"),
      MISALIGNED(T, tensors.out, "tensors.out"),
      MISALIGNED(T, tensors.lse, "tensors.lse"),
      MISALIGNED(T, layer.sinks, "layer.sinks"),
      MISALIGNED(T, layer.alibi_slopes, "layer.alibi_slopes"),
      COUNT(T, tensors.num_blocks, REFUSED, UATTN_OK, "num_blocks"),
      COUNT(T, tensors.block_size, REFUSED, REFUSED, "block_size"),
      COUNT(T, layer.num_q_heads, REFUSED, REFUSED, "num_q_heads"),
      COUNT(T, layer.num_kv_heads, REFUSED, REFUSED, "num_kv_heads"),
      COUNT(T, layer.head_dim, REFUSED, REFUSED, "head_dim"),
      SET(T, layer.sliding_window, -1, REFUSED, "sliding_window"),
      SET(T, layer.causal_width, -1, REFUSED, "causal_width"),
      SET(T, layer.chunk_size, -1, REFUSED, "chunk_size"),
      ENUM(T, layer.dtype, "dtype"),
      ENUM(T, layer.cache_dtype, "cache_dtype"),
      ENUM(T, layer.kv_layout, "kv_layout"),
      SET(T, layer.kv_layout, 3, REFUSED, "kv_layout"), /* one past the last layout */
      SET(T, layer.kv_layout, UATTN_LAYOUT_TILED, UATTN_OK, "kv_layout"),
      tiled_odd_dim,
      ENUM(T, layer.attn_type, "attn_type"),
      overflow,
  };
  RUN(forward_fn, cases);
}

/* Cross attention's own arrays (the layer made an encoder-decoder one, every request with 4 encoder keys). */
static void cross_forward_init(void *p) {
  forward_args *a = p;
  forward_init(a);
  a->layer.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
  a->layer.alibi_slopes = NULL;
  for (int i = 0; i < RB_MAX_REQS; i++) a->encoder_lens[i] = 4;
}
#define cross_forward_call forward_call

Test(api_misuse, uattn_forward_cross, .init = forward_setup, .fini = forward_teardown) {
  typedef forward_args T;
  static const api_fn fn = API_FN(cross_forward, T, .more = forward_more, .fini = forward_fini);
  static const misuse cases[] = {
      NULL_ARG(T, tensors.cross, "tensors.cross"),     NULL_ARG(T, cross.encoder_lens, "encoder_lens"),
      NULL_ARG(T, cross.block_table, "block_table"),   MISALIGNED(T, cross.encoder_lens, "encoder_lens"),
      MISALIGNED(T, cross.block_table, "block_table"), LENGTH(T, cross.block_table_stride, REFUSED, "stride"),
  };
  RUN(fn, cases);
}

typedef struct describe_kernels_args {
  uattn_layer layer;
  const uattn_layer *layer_ptr;
  int32_t block_size;
  uattn_kernel_report *out;
  struct {
    uattn_kernel_report out;
  } w;
} describe_kernels_args;
static void describe_kernels_init(void *p) {
  describe_kernels_args *a = p;
  a->layer = uattn_layer_default(4, 2, 32, UATTN_BF16);
  a->layer.sinks = forward_sinks;
  a->layer_ptr = &a->layer;
  a->block_size = 16;
  a->out = &a->w.out;
}
static uattn_status describe_kernels_call(void *p) {
  describe_kernels_args *a = p;
  return uattn_describe_kernels(a->layer_ptr, a->block_size, a->out);
}

Test(api_misuse, uattn_describe_kernels) {
  typedef describe_kernels_args T;
  static const api_fn fn = API_FN(describe_kernels, T);
  static const misuse cases[] = {
      NULL_ARG(T, layer_ptr, "layer"),
      NULL_ARG(T, out, "out"),
      SET(T, block_size, -1, REFUSED, "block_size"),
      SET(T, block_size, 0, REFUSED, "block_size"),
      SET(T, block_size, INT32_MAX, UATTN_OK, "block_size"),
      COUNT(T, layer.head_dim, REFUSED, REFUSED, "head_dim"),
      COUNT(T, layer.num_q_heads, REFUSED, REFUSED, "num_q_heads"),
      ENUM(T, layer.cache_dtype, "cache_dtype"),
      ENUM(T, layer.kv_layout, "kv_layout"),
      SET(T, layer.kv_layout, 3, REFUSED, "kv_layout"),
      SET(T, layer.kv_layout, UATTN_LAYOUT_TILED, UATTN_OK, "kv_layout"),
      MISALIGNED(T, layer.sinks, "layer.sinks"), /* judged as the forward judges the layer */
  };
  RUN(fn, cases);
}

typedef struct last_forward_report_args {
  uattn_kernel_report *out;
  struct {
    uattn_kernel_report out;
  } w;
} last_forward_report_args;
static void last_forward_report_init(void *p) {
  last_forward_report_args *a = p;
  a->out = &a->w.out;
}
static uattn_status last_forward_report_call(void *p) {
  return uattn_last_forward_report(((last_forward_report_args *)p)->out);
}

Test(api_misuse, uattn_last_forward_report) {
  typedef last_forward_report_args T;
  static const api_fn fn = API_FN(last_forward_report, T);
  /* a thread that ran no forward has no report */
  static const misuse cases[] = {NULL_ARG(T, out, "out"), {"no forward yet", {{0}}, REFUSED, "no uattn_forward"}};
  RUN(fn, cases);
}

/* ---- merges ------------------------------------------------------------------------------------------- */

/* two parts of 2 rows, 2 heads, head_dim 4 */
#define MERGE_VALUES (2 * 2 * 4)
typedef struct merge_args {
  int32_t num_parts, rows, heads, head_dim;
  const float *outs_arr[2], *lses_arr[2], *sums_arr[2];
  const float *const *outs, *const *lses, *const *sums;
  float part_out[2][MERGE_VALUES + 1], part_lse[2][2 * 2 + 1], part_sum[2][2 * 2 + 1];
  float *out, *lse;
  struct {
    float out[MERGE_VALUES + 1], lse[2 * 2 + 1];
  } w;
} merge_args;
static void merge_init(void *p) {
  merge_args *a = p;
  *a = (merge_args){2, 2, 2, 4};
  for (int i = 0; i < 2; i++) {
    for (int x = 0; x < MERGE_VALUES; x++) a->part_out[i][x] = (float)(x + i);
    for (int x = 0; x < 4; x++) a->part_lse[i][x] = (float)i, a->part_sum[i][x] = 1.0f;
    a->outs_arr[i] = a->part_out[i], a->lses_arr[i] = a->part_lse[i], a->sums_arr[i] = a->part_sum[i];
  }
  a->outs = a->outs_arr, a->lses = a->lses_arr, a->sums = a->sums_arr;
  a->out = a->w.out, a->lse = a->w.lse;
}
#define merge_states_init merge_init
#define merge_partials_init merge_init
static uattn_status merge_states_call(void *p) {
  merge_args *a = p;
  return uattn_merge_states(a->num_parts, a->outs, a->lses, a->rows, a->heads, a->head_dim, a->out, a->lse);
}
/* the partials' maxes are the states' lses */
static uattn_status merge_partials_call(void *p) {
  merge_args *a = p;
  return uattn_merge_partials(a->num_parts, a->outs, a->lses, a->sums, a->rows, a->heads, a->head_dim, a->out);
}

/* rows * heads * head_dim floats overflow size_t */
#define MERGE_OVERFLOW                                                                                                 \
  {                                                                                                                    \
    "rows * heads * head_dim overflows size_t",                                                                        \
        {{offsetof(merge_args, rows), EDIT_I32, INT32_MAX},                                                            \
         {offsetof(merge_args, heads), EDIT_I32, INT32_MAX},                                                           \
         {offsetof(merge_args, head_dim), EDIT_I32, 4096}},                                                            \
        UATTN_ERR_OVERFLOW, "overflow"                                                                                 \
  }

Test(api_misuse, uattn_merge_states_and_partials) {
  typedef merge_args T;
  static const api_fn states = API_FN(merge_states, T), partials = API_FN(merge_partials, T);
  static const misuse common[] = {
      NULL_ARG(T, outs, "outs"),
      NULL_ARG(T, out, "out"),
      NULL_ARG(T, outs_arr[1], "1"),
      NULL_ARG(T, lses_arr[1], "1"),
      MISALIGNED(T, out, "out"),
      MISALIGNED(T, outs, "outs"),
      MISALIGNED(T, outs_arr[1], "outs[1]"),
      MISALIGNED(T, lses_arr[0], "[0]"),
      LENGTH(T, num_parts, REFUSED, "num_parts"),
      LENGTH(T, rows, UATTN_OK, "rows"),
      LENGTH(T, heads, REFUSED, "heads"),
      COUNT(T, head_dim, REFUSED, REFUSED, "head_dim"),
      MERGE_OVERFLOW,
  };
  static const misuse states_only[] = {NULL_ARG(T, lses, "lses"), MISALIGNED(T, lse, "lse"),
                                       MISALIGNED(T, lses, "lses")};
  static const misuse partials_only[] = {NULL_ARG(T, lses, "maxes"), NULL_ARG(T, sums, "sums"),
                                         NULL_ARG(T, sums_arr[1], "1"), MISALIGNED(T, sums_arr[1], "sums[1]"),
                                         SET(T, num_parts, INT32_MAX, REFUSED, "num_parts")};
  RUN(states, common);
  RUN(states, states_only);
  RUN(partials, common);
  RUN(partials, partials_only);
}

/* ---- vLLM batch utilities ----------------------------------------------------------------------------- */

/* Three requests: a decode, a decode and a prefill of 4 tokens. */
static const int32_t batch_qsl[] = {0, 1, 2, 6}, batch_seq_lens[] = {5, 3, 4};

typedef struct split_args {
  int32_t num_reqs, num_tokens, decode_threshold;
  const int32_t *query_start_loc, *seq_lens;
  uattn_batch_split *out;
  struct {
    uattn_batch_split out;
  } w;
} split_args;
static void split_init(void *p) {
  split_args *a = p;
  *a = (split_args){3, 6, 1, batch_qsl, batch_seq_lens, &a->w.out};
}
#define split_decodes_and_prefills_init split_init
#define split_decodes_prefills_and_extends_init split_init
static uattn_status split_decodes_and_prefills_call(void *p) {
  split_args *a = p;
  return uattn_split_decodes_and_prefills(a->num_reqs, a->query_start_loc, a->num_tokens, a->decode_threshold, false,
                                          a->out);
}
static uattn_status split_decodes_prefills_and_extends_call(void *p) {
  split_args *a = p;
  return uattn_split_decodes_prefills_and_extends(a->num_reqs, a->query_start_loc, a->seq_lens, a->num_tokens,
                                                  a->decode_threshold, a->out);
}

Test(api_misuse, uattn_split_decodes_and_prefills_and_extends) {
  typedef split_args T;
  static const api_fn two = API_FN(split_decodes_and_prefills, T),
                      three = API_FN(split_decodes_prefills_and_extends, T);
  static const misuse cases[] = {
      NULL_ARG(T, query_start_loc, "query_start_loc"),
      NULL_ARG(T, out, "out"),
      MISALIGNED(T, query_start_loc, "query_start_loc"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
      COUNT(T, num_tokens, REFUSED, UATTN_OK, "num_tokens"),
      COUNT(T, decode_threshold, UATTN_OK, UATTN_OK, "decode_threshold"),
  };
  static const misuse extends_only[] = {NULL_ARG(T, seq_lens, "seq_lens"), MISALIGNED(T, seq_lens, "seq_lens")};
  RUN(two, cases);
  RUN(three, cases);
  RUN(three, extends_only);
}

typedef struct reorder_args {
  int32_t num_reqs, decode_threshold, swaps_capacity;
  const int32_t *num_scheduled, *num_computed, *num_prompt; /* num_prompt: the four-region form only */
  int32_t scheduled[3], computed[3], prompt[3];
  uattn_swap *swaps;
  int32_t *num_swaps, *order;
  struct {
    uattn_swap swaps[4];
    int32_t num_swaps, order[4];
  } w;
} reorder_args;
static void reorder_init(void *p) {
  reorder_args *a = p;
  /* a prefill and two decodes, or with the prompt lengths a prefill, a short extend and a decode: one swap */
  *a = (reorder_args){.num_reqs = 3,
                      .decode_threshold = 1,
                      .swaps_capacity = 3,
                      .num_scheduled = a->scheduled,
                      .num_computed = a->computed,
                      .num_prompt = a->prompt,
                      .scheduled = {5, 1, 1},
                      .computed = {0, 4, 3},
                      .prompt = {5, 9, 3},
                      .swaps = a->w.swaps,
                      .num_swaps = &a->w.num_swaps,
                      .order = a->w.order};
}
static uattn_status reorder_call(void *p) {
  reorder_args *a = p;
  return uattn_reorder_batch_to_split_decodes_and_prefills(a->num_reqs, a->num_scheduled, a->num_computed,
                                                           a->decode_threshold, a->swaps, a->swaps_capacity,
                                                           a->num_swaps, a->order);
}
#define reorder4_init reorder_init
static uattn_status reorder4_call(void *p) {
  reorder_args *a = p;
  return uattn_reorder_batch_with_prompt_lens(a->num_reqs, a->num_scheduled, a->num_computed, a->num_prompt,
                                              a->decode_threshold, a->swaps, a->swaps_capacity, a->num_swaps, a->order);
}

/* The rows both reorders share. */
#define REORDER_MISUSE(T)                                                                                              \
  NULL_ARG(T, num_scheduled, "num_scheduled"), NULL_ARG(T, num_computed, "num_computed"), NULL_ARG(T, swaps, "swaps"), \
      NULL_ARG(T, num_swaps, "num_swaps"), MISALIGNED(T, num_scheduled, "num_scheduled"),                              \
      MISALIGNED(T, num_computed, "num_computed"), MISALIGNED(T, swaps, "swaps"),                                      \
      MISALIGNED(T, num_swaps, "num_swaps"), MISALIGNED(T, order, "order"), LENGTH(T, num_reqs, UATTN_OK, "num_reqs"), \
      COUNT(T, decode_threshold, UATTN_OK, UATTN_OK, "decode_threshold"),                                              \
      COUNT(T, swaps_capacity, REFUSED, UATTN_OK, "swaps")

Test(api_misuse, uattn_reorder_batch_to_split_decodes_and_prefills) {
  typedef reorder_args T;
  static const api_fn fn = API_FN(reorder, T);
  static const misuse cases[] = {REORDER_MISUSE(T)};
  RUN(fn, cases);
}

Test(api_misuse, uattn_reorder_batch_with_prompt_lens) {
  typedef reorder_args T;
  static const api_fn fn = API_FN(reorder4, T);
  static const misuse cases[] = {REORDER_MISUSE(T), NULL_ARG(T, num_prompt, "num_prompt"),
                                 MISALIGNED(T, num_prompt, "num_prompt")};
  RUN(fn, cases);
}

/* Two requests cut into chunks of 8 keys over blocks of 4: 10 keys (3 new) and 12 keys (1 new). */
static const int32_t local_qsl[] = {0, 3, 4}, local_seq_lens[] = {10, 12}, local_table[] = {0, 1, 2, 3, 4, 5, 6, 7};

typedef struct local_args {
  int32_t attn_chunk_size, block_size, num_reqs, block_table_stride;
  const int32_t *query_start_loc, *seq_lens, *block_table;
  int32_t *num_batches, *pages_per_batch;
  uattn_local_batches out;
  struct {
    int32_t qsl[9], seq_lens[8], num_computed[8], table[8 * 2 + 1], req_indices[8], num_batches, pages;
  } w;
} local_args;
static void local_init(void *p) {
  local_args *a = p;
  *a = (local_args){8, 4, 2, 4, local_qsl, local_seq_lens, local_table, &a->w.num_batches, &a->w.pages};
  a->out = (uattn_local_batches){8, a->w.qsl, a->w.seq_lens, a->w.num_computed, a->w.table, a->w.req_indices};
}
#define count_local_init local_init
#define make_local_init local_init
static uattn_status count_local_call(void *p) {
  local_args *a = p;
  return uattn_count_local_attention_virtual_batches(a->attn_chunk_size, a->block_size, a->num_reqs, a->query_start_loc,
                                                     a->seq_lens, a->num_batches, a->pages_per_batch);
}
static uattn_status make_local_call(void *p) {
  local_args *a = p;
  return uattn_make_local_attention_virtual_batches(a->attn_chunk_size, a->block_size, a->num_reqs, a->query_start_loc,
                                                    a->seq_lens, a->block_table, a->block_table_stride, &a->out);
}
/* the out struct is the caller's request (capacity, arrays) as well as a result */
static int make_local_more(void *p, region *r) {
  local_args *a = p;
  r[0] = (region){&a->out, sizeof a->out, true};
  return 1;
}

Test(api_misuse, uattn_count_and_make_local_attention_virtual_batches) {
  typedef local_args T;
  static const api_fn count = API_FN(count_local, T), make = API_FN(make_local, T, .more = make_local_more);
  static const misuse cases[] = {
      NULL_ARG(T, query_start_loc, "query_start_loc"),
      NULL_ARG(T, seq_lens, "seq_lens"),
      MISALIGNED(T, query_start_loc, "query_start_loc"),
      MISALIGNED(T, seq_lens, "seq_lens"),
      COUNT(T, attn_chunk_size, REFUSED, REFUSED, "attn_chunk_size"),
      COUNT(T, block_size, REFUSED, REFUSED, "block_size"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
  };
  static const misuse count_only[] = {
      NULL_ARG(T, num_batches, "num_batches"), NULL_ARG(T, pages_per_batch, "pages_per_batch"),
      MISALIGNED(T, num_batches, "num_batches"), MISALIGNED(T, pages_per_batch, "pages_per_batch")};
  static const misuse make_only[] = {
      NULL_ARG(T, block_table, "block_table"),
      MISALIGNED(T, block_table, "block_table"),
      MISALIGNED(T, out.query_start_loc, "query_start_loc"),
      MISALIGNED(T, out.seq_lens, "seq_lens"),
      MISALIGNED(T, out.num_computed, "num_computed"),
      MISALIGNED(T, out.block_table, "block_table"),
      MISALIGNED(T, out.req_indices, "req_indices"),
      LENGTH(T, block_table_stride, REFUSED, "block_table_stride"),
      COUNT(T, out.capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(count, cases);
  RUN(count, count_only);
  RUN(make, cases);
  RUN(make, make_only);
}

typedef struct slot_args {
  int32_t query_len, context_len, sliding_window, seq_len, start_idx, block_size, block_table_len, capacity;
  const int32_t *block_table;
  int32_t *start_out, *num_slots;
  int64_t *slot_mapping;
  struct {
    int64_t slots[17];
    int32_t start, num_slots;
  } w;
} slot_args;
static const int32_t slot_table[] = {3, 1, 2};
static void slot_init(void *p) {
  slot_args *a = p;
  *a = (slot_args){10, 0, 4, 10, 2, 4, 3, 16, slot_table, &a->w.start, &a->w.num_slots, a->w.slots};
}
#define slot_mapping_start_idx_init slot_init
#define slot_mapping_init slot_init
static uattn_status slot_mapping_start_idx_call(void *p) {
  slot_args *a = p;
  return uattn_compute_slot_mapping_start_idx(true, a->query_len, a->context_len, a->sliding_window, a->start_out);
}
static uattn_status slot_mapping_call(void *p) {
  slot_args *a = p;
  return uattn_compute_slot_mapping(false, a->seq_len, a->context_len, a->start_idx, a->block_size, a->block_table,
                                    a->block_table_len, a->slot_mapping, a->capacity, a->num_slots);
}

Test(api_misuse, uattn_compute_slot_mapping_and_start_idx) {
  typedef slot_args T;
  static const api_fn start = API_FN(slot_mapping_start_idx, T), slots = API_FN(slot_mapping, T);
  static const misuse start_cases[] = {
      NULL_ARG(T, start_out, "start_idx"),
      MISALIGNED(T, start_out, "start_idx"),
      COUNT(T, query_len, UATTN_OK, UATTN_OK, "query_len"),
      COUNT(T, context_len, UATTN_OK, UATTN_OK, "context_len"),
      COUNT(T, sliding_window, UATTN_OK, UATTN_OK, "sliding_window"),
  };
  static const misuse slot_cases[] = {
      NULL_ARG(T, num_slots, "num_slots"),
      NULL_ARG(T, slot_mapping, "slot_mapping"),
      NULL_ARG(T, block_table, "block_table"),
      MISALIGNED(T, num_slots, "num_slots"),
      MISALIGNED(T, slot_mapping, "slot_mapping"),
      MISALIGNED(T, block_table, "block_table"),
      LENGTH(T, seq_len, REFUSED, "seq_len"),
      SET(T, seq_len, INT32_MAX, UATTN_ERR_CAPACITY, "capacity"),
      COUNT(T, context_len, UATTN_OK, REFUSED, "context_len"),
      COUNT(T, start_idx, UATTN_OK, REFUSED, "start_idx"),
      COUNT(T, block_size, REFUSED, UATTN_OK, "block_size"),
      SET(T, block_table_len, -1, REFUSED, "block_table_len"),
      SET(T, block_table_len, 0, UATTN_ERR_OUT_OF_RANGE, "block table"), /* position 9 needs entry 2 */
      COUNT(T, capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(start, start_cases);
  RUN(slots, slot_cases);
}

typedef struct chunks_args {
  int32_t num_reqs, workspace_size, request_offset, capacity;
  const int32_t *seq_lens;
  uattn_req_range *chunks;
  int32_t *num_chunks;
  struct {
    uattn_req_range chunks[4];
    int32_t num_chunks;
  } w;
} chunks_args;
static void chunks_init(void *p) {
  chunks_args *a = p;
  *a = (chunks_args){3, 8, 0, 3, batch_seq_lens, a->w.chunks, &a->w.num_chunks};
}
static uattn_status chunks_call(void *p) {
  chunks_args *a = p;
  return uattn_split_prefill_chunks(a->seq_lens, a->num_reqs, a->workspace_size, a->request_offset, a->chunks,
                                    a->capacity, a->num_chunks);
}

Test(api_misuse, uattn_split_prefill_chunks) {
  typedef chunks_args T;
  static const api_fn fn = API_FN(chunks, T);
  static const misuse cases[] = {
      NULL_ARG(T, seq_lens, "seq_lens"),
      NULL_ARG(T, chunks, "chunks"),
      NULL_ARG(T, num_chunks, "num_chunks"),
      MISALIGNED(T, seq_lens, "seq_lens"),
      MISALIGNED(T, chunks, "chunks"),
      MISALIGNED(T, num_chunks, "num_chunks"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
      COUNT(T, workspace_size, REFUSED, UATTN_OK, "workspace_size"),
      COUNT(T, request_offset, UATTN_OK, REFUSED, "request_offset"),
      COUNT(T, capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(fn, cases);
}

typedef struct dcp_args {
  int32_t num_reqs, dcp_size, dcp_rank, interleave, capacity;
  const int32_t *seq_lens;
  int32_t *out;
  struct {
    int32_t out[9];
  } w;
} dcp_args;
static void dcp_init(void *p) {
  dcp_args *a = p;
  *a = (dcp_args){3, 2, -1, 1, 8, batch_seq_lens, a->w.out};
}
static uattn_status dcp_call(void *p) {
  dcp_args *a = p;
  return uattn_compute_dcp_local_seq_lens(a->seq_lens, a->num_reqs, a->dcp_size, a->dcp_rank, a->interleave, a->out,
                                          a->capacity);
}

Test(api_misuse, uattn_compute_dcp_local_seq_lens) {
  typedef dcp_args T;
  static const api_fn fn = API_FN(dcp, T);
  static const misuse cases[] = {
      NULL_ARG(T, seq_lens, "seq_lens"),
      NULL_ARG(T, out, "out"),
      MISALIGNED(T, seq_lens, "seq_lens"),
      MISALIGNED(T, out, "out"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
      SET(T, num_reqs, INT32_MAX, UATTN_ERR_OVERFLOW, "do not fit"), /* num_reqs x dcp_size values */
      LENGTH(T, dcp_size, REFUSED, "dcp_size"),
      SET(T, dcp_size, INT32_MAX, UATTN_ERR_OVERFLOW, "do not fit"),
      SET(T, dcp_rank, -2, REFUSED, "dcp_rank"),
      SET(T, dcp_rank, INT32_MAX, REFUSED, "dcp_rank"),
      COUNT(T, interleave, REFUSED, UATTN_OK, "interleave"),
      COUNT(T, capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(fn, cases);
}

typedef struct fast_prefill_args {
  int32_t num_reqs, num_logits;
  const int32_t *query_start_loc, *logits_indices;
  int32_t *query_start_loc_out;
  uattn_fast_prefill_info *info;
  struct {
    int32_t qsl_out[5];
    uattn_fast_prefill_info info;
  } w;
} fast_prefill_args;
static const int32_t fast_logits[] = {0, 1, 5};
static void fast_prefill_init(void *p) {
  fast_prefill_args *a = p;
  *a = (fast_prefill_args){3, 3, batch_qsl, fast_logits, a->w.qsl_out, &a->w.info};
}
static uattn_status fast_prefill_call(void *p) {
  fast_prefill_args *a = p;
  return uattn_make_kv_sharing_fast_prefill_metadata(a->num_reqs, a->query_start_loc, a->logits_indices, a->num_logits,
                                                     a->query_start_loc_out, a->info);
}

Test(api_misuse, uattn_make_kv_sharing_fast_prefill_metadata) {
  typedef fast_prefill_args T;
  static const api_fn fn = API_FN(fast_prefill, T);
  static const misuse cases[] = {
      NULL_ARG(T, query_start_loc, "query_start_loc"),
      NULL_ARG(T, logits_indices, "logits_indices"),
      NULL_ARG(T, query_start_loc_out, "query_start_loc_out"),
      NULL_ARG(T, info, "info"),
      MISALIGNED(T, query_start_loc, "query_start_loc"),
      MISALIGNED(T, logits_indices, "logits_indices"),
      MISALIGNED(T, query_start_loc_out, "query_start_loc_out"),
      MISALIGNED(T, info, "info"),
      SET(T, num_reqs, -1, REFUSED, "num_reqs"),
      SET(T, num_reqs, 0, UATTN_ERR_OUT_OF_RANGE, "query row"), /* no rows for the logits to index */
      LENGTH(T, num_logits, UATTN_OK, "num_logits"),
  };
  RUN(fn, cases);
}

typedef struct conv1d_args {
  int32_t num_reqs, block_m, capacity;
  const int32_t *query_start_loc;
  int32_t *num_programs, *padded_buffer_len, *programs_per_req, *batch_ptr, *token_chunk_offset_ptr;
  struct {
    int32_t num_programs, padded_buffer_len, programs_per_req[4], batch_ptr[9], offsets[9];
  } w;
} conv1d_args;
static void conv1d_init(void *p) {
  conv1d_args *a = p;
  *a = (conv1d_args){
      3,           2, 8, batch_qsl, &a->w.num_programs, &a->w.padded_buffer_len, a->w.programs_per_req, a->w.batch_ptr,
      a->w.offsets};
}
#define count_conv1d_init conv1d_init
#define conv1d_metadata_init conv1d_init
static uattn_status count_conv1d_call(void *p) {
  conv1d_args *a = p;
  return uattn_count_causal_conv1d_programs(a->query_start_loc, a->num_reqs, a->block_m, a->num_programs,
                                            a->padded_buffer_len);
}
static uattn_status conv1d_metadata_call(void *p) {
  conv1d_args *a = p;
  return uattn_compute_causal_conv1d_metadata(a->query_start_loc, a->num_reqs, a->block_m, a->programs_per_req,
                                              a->batch_ptr, a->token_chunk_offset_ptr, a->capacity, a->num_programs);
}

Test(api_misuse, uattn_causal_conv1d_programs_and_metadata) {
  typedef conv1d_args T;
  static const api_fn count = API_FN(count_conv1d, T), metadata = API_FN(conv1d_metadata, T);
  static const misuse cases[] = {
      NULL_ARG(T, query_start_loc, "query_start_loc"),   NULL_ARG(T, num_programs, "num_programs"),
      MISALIGNED(T, query_start_loc, "query_start_loc"), MISALIGNED(T, num_programs, "num_programs"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),         COUNT(T, block_m, REFUSED, UATTN_OK, "block_m"),
  };
  static const misuse count_only[] = {MISALIGNED(T, padded_buffer_len, "padded_buffer_len")};
  static const misuse metadata_only[] = {
      NULL_ARG(T, batch_ptr, "batch_ptr"),
      NULL_ARG(T, token_chunk_offset_ptr, "token_chunk_offset_ptr"),
      MISALIGNED(T, batch_ptr, "batch_ptr"),
      MISALIGNED(T, token_chunk_offset_ptr, "token_chunk_offset_ptr"),
      MISALIGNED(T, programs_per_req, "programs_per_req"),
      LENGTH(T, capacity, REFUSED, "capacity"), /* all of the capacity is written: an array length */
  };
  RUN(count, cases);
  RUN(count, count_only);
  RUN(metadata, cases);
  RUN(metadata, metadata_only);
}

typedef struct query_kv_args {
  uattn_attention_type type;
  int32_t num_prefill_tokens, num_decode_tokens, num_encoder_tokens;
  uattn_query_kv_tokens *out;
  struct {
    uattn_query_kv_tokens out;
  } w;
} query_kv_args;
static void query_kv_init(void *p) {
  query_kv_args *a = p;
  *a = (query_kv_args){UATTN_ATTENTION_ENCODER_DECODER, 5, 2, 7, &a->w.out};
}
static uattn_status query_kv_call(void *p) {
  query_kv_args *a = p;
  return uattn_count_query_kv_tokens(a->type, a->num_prefill_tokens, a->num_decode_tokens, a->num_encoder_tokens,
                                     a->out);
}

Test(api_misuse, uattn_count_query_kv_tokens) {
  typedef query_kv_args T;
  static const api_fn fn = API_FN(query_kv, T);
  static const misuse cases[] = {
      NULL_ARG(T, out, "out"),
      MISALIGNED(T, out, "out"),
      ENUM(T, type, "attention type"),
      COUNT(T, num_prefill_tokens, UATTN_OK, UATTN_OK, "num_prefill_tokens"),
      COUNT(T, num_decode_tokens, UATTN_OK, UATTN_OK, "num_decode_tokens"),
      SET(T, num_encoder_tokens, -1, REFUSED, "num_encoder_tokens"), /* unset: an error for encoder types */
      SET(T, num_encoder_tokens, -2, REFUSED, "num_encoder_tokens"),
      SET(T, num_encoder_tokens, 0, UATTN_OK, "num_encoder_tokens"),
      SET(T, num_encoder_tokens, INT32_MAX, UATTN_OK, "num_encoder_tokens"),
  };
  RUN(fn, cases);
}

typedef struct select_args {
  uattn_attention_metadata metadata;
  const uattn_attention_metadata *metadata_ptr;
  uattn_attention_type type;
  uattn_seq_len_block_table *out;
  struct {
    uattn_seq_len_block_table out;
  } w;
} select_args;
static void select_init(void *p) {
  select_args *a = p;
  a->metadata = (uattn_attention_metadata){batch_seq_lens, 5, 3, local_table, 4, batch_seq_lens, 5, local_table, 4};
  a->metadata_ptr = &a->metadata;
  a->type = UATTN_ATTENTION_DECODER;
  a->out = &a->w.out;
}
static uattn_status select_call(void *p) {
  select_args *a = p;
  return uattn_select_seq_len_block_table(a->metadata_ptr, true, a->type, a->out);
}

Test(api_misuse, uattn_select_seq_len_block_table) {
  typedef select_args T;
  static const api_fn fn = API_FN(select, T);
  static const misuse cases[] = {
      NULL_ARG(T, metadata_ptr, "metadata"),
      NULL_ARG(T, out, "out"),
      NULL_ARG(T, metadata.seq_lens, "seq_lens"),
      NULL_ARG(T, metadata.block_tables, "block_tables"),
      MISALIGNED(T, out, "out"),
      MISALIGNED(T, metadata.seq_lens, "seq_lens"),
      MISALIGNED(T, metadata.block_tables, "block_tables"),
      ENUM(T, type, "attention type"),
      SET(T, metadata.max_prefill_seq_len, -1, REFUSED, "max_prefill_seq_len"),
      SET(T, metadata.block_tables_stride, -1, REFUSED, "stride"),
  };
  RUN(fn, cases);
}

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
      NULL_ARG(T, entries_ptr, "entries"),
      MISALIGNED(T, entries_ptr, "entries"),
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
      NULL_ARG(T, length, "length"),
      NULL_ARG(T, buf, "buf"),
      MISALIGNED(T, length, "length"),
      CASE(T, cap, EDIT_SIZE, 1, UATTN_ERR_CAPACITY, "cap"),
      CASE(T, cap, EDIT_SIZE, 0, UATTN_ERR_CAPACITY, "cap"),
  };
  static const misuse lookup_cases[] = {
      NULL_ARG(T, rt, "rt"),
      NULL_ARG(T, entry, "out"),
      CASE(T, found, EDIT_NULL, 0, UATTN_OK, "found"), /* optional */
      MISALIGNED(T, entry, "out"),
      COUNT(T, block_size, REFUSED, UATTN_OK, "block_size"),
      COUNT(T, head_dim, REFUSED, UATTN_OK, "head_dim"),
      ENUM(T, cache_dtype, "cache_dtype"),
  };
  static const misuse plan_config_cases[] = {
      NULL_ARG(T, rt, "rt"),
      NULL_ARG(T, config_ptr, "config"),
      MISALIGNED(T, config_ptr, "config"),
      COUNT(T, head_dim, REFUSED, UATTN_OK, "head_dim"),
      COUNT(T, config.block_size, REFUSED, UATTN_OK, "block_size"),
      ENUM(T, cache_dtype, "cache_dtype"),
  };
  static const misuse layer_cases[] = {
      NULL_ARG(T, rt, "rt"),
      NULL_ARG(T, layer_ptr, "layer"),
      MISALIGNED(T, layer_ptr, "layer"),
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
