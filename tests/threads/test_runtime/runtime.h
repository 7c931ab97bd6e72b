/* The runtime (runtime/threads/runtime.c, pool.c, topology.c): topology against the kernel's own view (sysfs and
 * sched_getaffinity, not hwloc), thread counts and the environment, cpusets, pinning checked with
 * sched_getcpu, a process bound to one CPU (a forked child with sched_setaffinity, as under taskset),
 * every worker running each job exactly once, several runtimes and several engine threads at once,
 * serialization of concurrent calls on one runtime, scratch memory, idle workers that really go to sleep,
 * and bad configurations, which must fail with a message and leave *out alone. Then the KV cache memory.
 *
 * This header holds what the suite's files share (runtime.c). Each file defines _GNU_SOURCE (sched_getcpu,
 * CPU_SET, setenv) before it includes anything. */
#ifndef UATTN_TEST_RUNTIME_H
#define UATTN_TEST_RUNTIME_H

#ifdef UATTN_TEST_STANDALONE
#include "common/standalone_test.h" /* for ThreadSanitizer, under which Criterion cannot run (see there) */
#else
#include <criterion/criterion.h>
#endif
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "threads/pool.h" /* uattn_runtime_run and friends: internal, linked from the static library */
#include "uattn.h"

/* No .timeout here: with timeouts and --jobs 2, Criterion 2.4.1's runner leaks in the parent process and
 * LeakSanitizer then fails the whole suite. ctest's own timeout catches a hang. */

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, UATTN_OK, "%s returned %s: %s", #call, uattn_status_name(st_), uattn_last_error());              \
  } while (0)

uattn_runtime *create(const uattn_runtime_config *cfg);
uattn_topology topology(const uattn_runtime *rt);

/* Under AddressSanitizer a leak must fail the test: LeakSanitizer's report in a Criterion child does not. */
#if defined(__SANITIZE_ADDRESS__)
#define UATTN_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UATTN_TEST_LSAN 1
#endif
#endif
#ifdef UATTN_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#define CHECK_NO_LEAKS() cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "leaks: see LeakSanitizer's report")
#else
#define CHECK_NO_LEAKS() ((void)0)
#endif

static inline int32_t uattn_min(int32_t a, int32_t b) { return a < b ? a : b; }

/* ---- the kernel's view, independent of hwloc ---------------------------------------------------------- */

int affinity_count(void);
int first_allowed_cpu(int nth);

/* ---- jobs ------------------------------------------------------------------------------------------------ */

#define MAXW UATTN_RUNTIME_MAX_THREADS

/* Counts each worker's runs and records where it ran. */
typedef struct count_ctx {
  _Atomic int32_t runs[MAXW];
  _Atomic int32_t seen_workers; /* num_workers as passed to the job; must be the runtime's */
  int32_t cpu[MAXW];
  _Atomic int32_t bad_index;
} count_ctx;

void count_job(void *p, int32_t w, int32_t n);
/* calls runs of count_job on rt; every worker must run each exactly once */
void run_counted(uattn_runtime *rt, int calls);

/* A thread-safe counting allocator: the workers grow their scratch concurrently. */
extern _Atomic long ts_allocs, ts_frees;
void *ts_alloc(void *user, size_t bytes);
void ts_free(void *user, void *ptr);

#endif
