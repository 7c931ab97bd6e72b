/* The runtime's dispatch: every worker runs each job exactly once, a NULL runtime and nested runs inline,
 * several runtimes and several engine threads at once, concurrent calls on one runtime serialized, and idle
 * workers that really go to sleep. */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET, setenv */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

/* ---- dispatch ---------------------------------------------------------------------------------------- */

Test(runtime, every_worker_runs_each_job_once) {
  uattn_runtime *rt = create(NULL);
  run_counted(rt, 1000);
  uattn_runtime_destroy(rt);

  uattn_runtime_config c = uattn_runtime_config_default();
  c.spin_us = 0; /* every call wakes sleeping workers */
  c.num_threads = 2;
  rt = create(&c);
  run_counted(rt, 1000);
  uattn_runtime_destroy(rt);
}

Test(runtime, null_runtime_runs_inline) {
  cr_assert_eq(uattn_runtime_workers(NULL), 1);
  count_ctx *cc = calloc(1, sizeof *cc);
  uattn_runtime_run(NULL, count_job, cc);
  cr_assert_eq(cc->runs[0], 1);
  cr_assert_eq(cc->seen_workers, 1);
  cr_assert_eq(cc->cpu[0], sched_getcpu());
  free(cc);
}

/* A job with nothing to share runs on the caller alone, as worker 0 of 1, whatever the workers; the
 * workers' next job still reaches every one of them. */
Test(runtime, run_alone_runs_on_the_caller_only) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 3;
  c.spin_us = 0; /* the workers sleep: run_alone must not need them */
  uattn_runtime *rt = create(&c);
  count_ctx *cc = calloc(1, sizeof *cc);
  for (int i = 0; i < 50; i++) uattn_runtime_run_alone(rt, count_job, cc);
  cr_assert_eq(cc->runs[0], 50);
  for (int w = 1; w < MAXW; w++) cr_assert_eq(cc->runs[w], 0, "worker %d ran a job meant for the caller", w);
  cr_assert_eq(cc->seen_workers, 1);
  cr_assert_eq(cc->bad_index, 0);
  free(cc);
  run_counted(rt, 10);
  cc = calloc(1, sizeof *cc);
  uattn_runtime_run_alone(NULL, count_job, cc);
  cr_assert_eq(cc->runs[0], 1);
  cr_assert_eq(cc->seen_workers, 1);
  free(cc);
  uattn_runtime_destroy(rt);
}

typedef struct nested_ctx {
  uattn_runtime *rt;
  _Atomic int32_t inner_runs;
  _Atomic int32_t inner_bad;
} nested_ctx;

static void inner_job(void *p, int32_t w, int32_t n) {
  nested_ctx *c = p;
  if (w != 0 || n != 1) atomic_store(&c->inner_bad, 1);
  atomic_fetch_add(&c->inner_runs, 1);
}

static void outer_job(void *p, int32_t w, int32_t n) {
  nested_ctx *c = p;
  uattn_runtime_run(c->rt, inner_job, c); /* runs inline: no deadlock on the runtime's lock */
}

Test(runtime, nested_run_runs_inline) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 3;
  nested_ctx ctx = {.rt = create(&c)};
  for (int i = 0; i < 10; i++) uattn_runtime_run(ctx.rt, outer_job, &ctx);
  cr_assert_eq(ctx.inner_runs, 30);
  cr_assert_eq(ctx.inner_bad, 0);
  uattn_runtime_destroy(ctx.rt);
}

/* Several engines, each with its own runtime and thread, at once. */
static void *engine_thread(void *arg) {
  int spin = (int)(intptr_t)arg;
  uattn_runtime_config c = uattn_runtime_config_default();
  c.spin_us = spin;
  uattn_runtime *rt;
  if (uattn_runtime_create(&c, &rt) != UATTN_OK) return (void *)"create failed";
  count_ctx *cc = calloc(1, sizeof *cc);
  int32_t n = uattn_runtime_workers(rt);
  const char *err = NULL;
  for (int i = 0; i < 300 && !err; i++) {
    uattn_runtime_run(rt, count_job, cc);
    for (int32_t w = 0; w < n; w++)
      if (atomic_load(&cc->runs[w]) != i + 1) err = "a worker missed a job or ran it twice";
  }
  free(cc);
  uattn_runtime_destroy(rt);
  return (void *)err;
}

Test(runtime, several_runtimes_from_several_threads) {
  pthread_t th[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, engine_thread, (void *)(intptr_t)(i % 2 ? 0 : 50)), 0);
  for (int i = 0; i < 4; i++) {
    void *res;
    pthread_join(th[i], &res);
    cr_assert_null(res, "engine %d: %s", i, (const char *)res);
  }
  CHECK_NO_LEAKS();
}

/* Two engine threads calling uattn_runtime_run on one runtime: whole jobs must not overlap. */
typedef struct serial_ctx {
  int32_t id;
  int32_t runs[MAXW]; /* plain ints on purpose: only serialization keeps them race-free (TSan checks) */
} serial_ctx;

/* (id of the job whose workers are inside it << 16) | how many are inside: one word, so that entering,
 * leaving and checking leave no window in which a correct run looks like an overlap */
static _Atomic uint32_t serial_state;
static _Atomic int32_t serial_overlaps;

static void serial_job(void *p, int32_t w, int32_t n) {
  serial_ctx *c = p;
  const uint32_t id = (uint32_t)c->id;
  uint32_t s = atomic_load(&serial_state);
  do {
    if ((s & 0xffff) != 0 && s >> 16 != id) {
      atomic_fetch_add(&serial_overlaps, 1); /* another job's workers are inside */
      return;
    }
  } while (!atomic_compare_exchange_weak(&serial_state, &s, (id << 16) | ((s & 0xffff) + 1)));
  c->runs[w]++;
  for (volatile int spin = 0; spin < 200; spin++) {
  }
  if (atomic_load(&serial_state) >> 16 != id) atomic_fetch_add(&serial_overlaps, 1);
  atomic_fetch_sub(&serial_state, 1);
}

typedef struct serial_arg {
  uattn_runtime *rt;
  serial_ctx ctx;
} serial_arg;

static void *serial_engine(void *p) {
  serial_arg *a = p;
  for (int i = 0; i < 500; i++) uattn_runtime_run(a->rt, serial_job, &a->ctx);
  return NULL;
}

Test(runtime, concurrent_calls_on_one_runtime_are_serialized) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 3;
  uattn_runtime *rt = create(&c);
  serial_arg args[2] = {{.rt = rt, .ctx = {.id = 1}}, {.rt = rt, .ctx = {.id = 2}}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, serial_engine, &args[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  cr_assert_eq(atomic_load(&serial_overlaps), 0, "jobs of two engine threads overlapped");
  for (int i = 0; i < 2; i++)
    for (int w = 0; w < 3; w++)
      cr_assert_eq(args[i].ctx.runs[w], 500, "engine %d worker %d: %d runs", i, w, args[i].ctx.runs[w]);
  uattn_runtime_destroy(rt);
}

/* Idle workers spin for spin_us, then sleep: the process must use next to no CPU between calls. */
Test(runtime, idle_workers_sleep) {
  uattn_runtime *rt = create(NULL);
  run_counted(rt, 10);
  struct timespec a, b, nap = {0, 200 * 1000 * 1000};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  nanosleep(&nap, NULL);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  double cpu_ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6;
  cr_assert(cpu_ms < 20.0, "%.1f ms of CPU in a 200 ms pause with %d workers: they keep spinning", cpu_ms,
            uattn_runtime_workers(rt));
  uattn_runtime_destroy(rt);
}
