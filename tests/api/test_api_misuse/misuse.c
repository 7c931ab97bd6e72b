/* Every public function of include/ (uattn.h, uattn_vllm.h, uattn_tuning.h) under bad input: each pointer NULL, each count at -1,
 * 0 and INT32_MAX, sizes whose product overflows size_t, misaligned typed buffers and enum values out of
 * range. A refused call must return an error status with a message naming what was wrong, and must leave
 * everything it was given to write exactly as it was: each output is filled with a canary before the call
 * and compared byte for byte after it. Where 0 is a legal count the call must succeed.
 *
 * The cases are tables, one per function: a row edits the function's valid arguments (a field of its
 * argument struct, found by offsetof) and says what the call must return. docs/testing.md's "Bad input" table
 * is this suite's summary; keep the two together.
 *
 * INT32_MAX is not tried for a count that is only the length of an array the caller passes (num_reqs of
 * the batch utilities, rows of the merges...): the library cannot know the array is shorter than the
 * caller says, so such a call reads past it by the caller's own error. It is tried wherever the library
 * bounds the count by something it knows (a capacity, a plan's limits, a documented maximum). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "misuse.h"

/* ---- the runner ------------------------------------------------------------------------------------- */

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

void run_table(const api_fn *fn, const misuse *cases, size_t count) {
  for (size_t i = 0; i < count; i++) run_case(fn, &cases[i]);
}

/* ---- fixtures: a planned step and a runtime ----------------------------------------------------------- */

/* A prompt of 5 tokens and a decode over 6 cached ones, block size 4; the plan buckets the seed's way. */
static const int32_t step_computed[] = {0, 6}, step_scheduled[] = {5, 1}, step_prompt[] = {5, 4};
static const int32_t step_table[] = {0, 1, -1, -1, 2, 3, -1, -1};
uattn_plan *plan;
uattn_runtime *rt;

uattn_plan_config plan_config(void) {
  uattn_plan_config c = uattn_plan_config_default(4, 16, 4, 64, 64);
  c.bucketing.mode = UATTN_BUCKETING_EXPONENTIAL;
  return c;
}

uattn_step valid_step(void) {
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
