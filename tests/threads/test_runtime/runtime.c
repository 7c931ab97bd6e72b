/* The runtime suite's shared helpers (runtime.h): the suite's init, a runtime made or its topology read where
 * either must succeed, the kernel's own view of this process's CPUs, a job that counts each worker's runs, and
 * a thread-safe counting allocator. */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET, setenv */
#include <stdlib.h>

#include "runtime.h"
static void clear_env(void) {
  unsetenv("UATTN_NUM_THREADS");
  unsetenv("UATTN_CPUSET");
}

TestSuite(runtime, .init = clear_env);

uattn_runtime *create(const uattn_runtime_config *cfg) {
  uattn_runtime *rt = NULL;
  CHECK_OK(uattn_runtime_create(cfg, &rt));
  cr_assert_not_null(rt);
  return rt;
}

uattn_topology topology(const uattn_runtime *rt) {
  uattn_topology t;
  CHECK_OK(uattn_runtime_get_topology(rt, &t));
  return t;
}

int affinity_count(void) {
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

int first_allowed_cpu(int nth) {
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set) && nth-- == 0) return c;
  return -1;
}

void count_job(void *p, int32_t w, int32_t n) {
  count_ctx *c = p;
  if (w < 0 || w >= n || w >= MAXW) {
    atomic_store(&c->bad_index, 1);
    return;
  }
  atomic_store(&c->seen_workers, n);
  c->cpu[w] = sched_getcpu();
  atomic_fetch_add(&c->runs[w], 1);
}

void run_counted(uattn_runtime *rt, int calls) {
  int32_t n = uattn_runtime_workers(rt);
  cr_assert(n >= 1 && n <= MAXW);
  count_ctx *c = calloc(1, sizeof *c);
  cr_assert_not_null(c);
  for (int i = 0; i < calls; i++) {
    uattn_runtime_run(rt, count_job, c);
    for (int32_t w = 0; w < n; w++)
      cr_assert_eq(atomic_load(&c->runs[w]), i + 1, "call %d: worker %d ran %d times", i, w, atomic_load(&c->runs[w]));
  }
  cr_assert_eq(atomic_load(&c->seen_workers), n);
  cr_assert_eq(atomic_load(&c->bad_index), 0);
  free(c);
}

_Atomic long ts_allocs, ts_frees;
void *ts_alloc(void *user, size_t bytes) {
  (void)user;
  atomic_fetch_add(&ts_allocs, 1);
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}
void ts_free(void *user, void *ptr) {
  (void)user;
  atomic_fetch_add(&ts_frees, 1);
  free(ptr);
}
