/* The runtime (runtime/threads/runtime.c, pool.c, topology.c): topology against the kernel's own view (sysfs and
 * sched_getaffinity, not hwloc), thread counts and the environment, cpusets, pinning checked with
 * sched_getcpu, a process bound to one CPU (a forked child with sched_setaffinity, as under taskset),
 * every worker running each job exactly once, several runtimes and several engine threads at once,
 * serialization of concurrent calls on one runtime, scratch memory, idle workers that really go to sleep,
 * and bad configurations, which must fail with a message and leave *out alone. */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET, setenv */
#ifdef UATTN_TEST_STANDALONE
#include "common/standalone_test.h" /* for ThreadSanitizer, under which Criterion cannot run (see there) */
#else
#include <criterion/criterion.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#endif

#include "threads/pool.h" /* uattn_runtime_run and friends: internal, linked from the static library */
#include "uattn.h"

/* No .timeout here: with timeouts and --jobs 2, Criterion 2.4.1's runner leaks in the parent process and
 * LeakSanitizer then fails the whole suite. ctest's own timeout catches a hang. */

static void clear_env(void) {
  unsetenv("UATTN_NUM_THREADS");
  unsetenv("UATTN_CPUSET");
}

TestSuite(runtime, .init = clear_env);

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, UATTN_OK, "%s returned %s: %s", #call, uattn_status_name(st_), uattn_last_error());              \
  } while (0)

static uattn_runtime *create(const uattn_runtime_config *cfg) {
  uattn_runtime *rt = NULL;
  CHECK_OK(uattn_runtime_create(cfg, &rt));
  cr_assert_not_null(rt);
  return rt;
}

static uattn_topology topology(const uattn_runtime *rt) {
  uattn_topology t;
  CHECK_OK(uattn_runtime_get_topology(rt, &t));
  return t;
}

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

static int32_t uattn_min(int32_t a, int32_t b) { return a < b ? a : b; }

/* ---- the kernel's view, independent of hwloc ---------------------------------------------------------- */

static int affinity_count(void) {
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

static int first_allowed_cpu(int nth) {
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set) && nth-- == 0) return c;
  return -1;
}

/* Physical cores among the CPUs this process may use: a core is named by the first CPU of its
 * thread_siblings_list. -1 if sysfs does not say. */
static int sysfs_cores_in_affinity(void) {
  cpu_set_t set, seen;
  CPU_ZERO(&seen);
  cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
  int cores = 0;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &set)) continue;
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int first = -1;
    int got = fscanf(f, "%d", &first);
    fclose(f);
    if (got != 1 || first < 0 || first >= CPU_SETSIZE) return -1;
    if (!CPU_ISSET(first, &seen)) cores++;
    CPU_SET(first, &seen);
  }
  return cores;
}

/* ---- jobs ------------------------------------------------------------------------------------------------ */

#define MAXW UATTN_RUNTIME_MAX_THREADS

/* Counts each worker's runs and records where it ran. */
typedef struct count_ctx {
  _Atomic int32_t runs[MAXW];
  _Atomic int32_t seen_workers; /* num_workers as passed to the job; must be the runtime's */
  int32_t cpu[MAXW];
  _Atomic int32_t bad_index;
} count_ctx;

static void count_job(void *p, int32_t w, int32_t n) {
  count_ctx *c = p;
  if (w < 0 || w >= n || w >= MAXW) {
    atomic_store(&c->bad_index, 1);
    return;
  }
  atomic_store(&c->seen_workers, n);
  c->cpu[w] = sched_getcpu();
  atomic_fetch_add(&c->runs[w], 1);
}

/* calls runs of count_job on rt; every worker must run each exactly once */
static void run_counted(uattn_runtime *rt, int calls) {
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

/* ---- topology ---------------------------------------------------------------------------------------------- */

Test(runtime, topology_is_plausible) {
  uattn_runtime *rt = create(NULL);
  uattn_topology t = topology(rt);
  const uattn_topology_counts *m = &t.machine, *b = &t.binding, *u = &t.usable;
  cr_assert(m->cores >= 1 && m->pus >= m->cores, "machine: %d cores, %d PUs", m->cores, m->pus);
  cr_assert(m->packages >= 1 && m->numa_nodes >= 1, "machine: %d packages, %d NUMA nodes", m->packages, m->numa_nodes);
  cr_assert(b->cores >= 1 && b->cores <= m->cores && b->pus >= b->cores && b->pus <= m->pus);
  cr_assert(b->packages >= 1 && b->packages <= m->packages && b->numa_nodes >= 1 && b->numa_nodes <= m->numa_nodes);
  cr_assert(!memcmp(u, b, sizeof *u), "no cpuset: usable == binding");
  cr_assert_eq(b->pus, affinity_count(), "PUs in the binding: hwloc %d, sched_getaffinity %d", b->pus,
               affinity_count());
  int sys_cores = sysfs_cores_in_affinity();
  if (sys_cores > 0) cr_assert_eq(b->cores, sys_cores, "cores in the binding: hwloc %d, sysfs %d", b->cores, sys_cores);

  /* caches: 0 means unknown, else the usual order and sizes */
  if (t.l1d_bytes) cr_assert(t.l1d_bytes >= 4096 && t.l1d_bytes <= (1u << 20), "L1d %zu", t.l1d_bytes);
  if (t.l2_bytes) cr_assert(t.l2_bytes > t.l1d_bytes && t.l2_bytes <= (64u << 20), "L2 %zu", t.l2_bytes);
  if (t.l3_bytes) {
    cr_assert(t.l3_bytes >= t.l2_bytes && t.l3_bytes <= ((size_t)4 << 30), "L3 %zu", t.l3_bytes);
    cr_assert(t.l3_cores >= 1 && t.l3_cores <= m->cores);
  }

  /* one worker per core, worker 0 (the caller) unbound, the others on distinct PUs of the binding */
  cr_assert_eq(t.num_workers, b->cores);
  cr_assert_eq(uattn_runtime_workers(rt), b->cores);
  cr_assert(t.pinned && !t.oversubscribed);
  cr_assert_eq(t.worker_pu[0], -1);
  cr_assert_eq(t.worker_numa[0], -1);
  cpu_set_t aff;
  sched_getaffinity(0, sizeof aff, &aff);
  cr_assert(t.caller_pu >= 0 && CPU_ISSET(t.caller_pu, &aff));
  for (int32_t w = 1; w < t.num_workers && w < UATTN_TOPOLOGY_MAX_WORKERS; w++) {
    cr_assert(t.worker_pu[w] >= 0 && CPU_ISSET(t.worker_pu[w], &aff), "worker %d on PU %d", w, t.worker_pu[w]);
    cr_assert_neq(t.worker_pu[w], t.caller_pu, "worker %d took the caller's core", w);
    cr_assert(t.worker_numa[w] >= 0);
    for (int32_t v = 1; v < w; v++) cr_assert_neq(t.worker_pu[v], t.worker_pu[w], "workers %d and %d share a PU", v, w);
  }
  for (int32_t w = t.num_workers; w < UATTN_TOPOLOGY_MAX_WORKERS; w++) cr_assert_eq(t.worker_pu[w], -1);
  uattn_runtime_destroy(rt);
}

Test(runtime, config_default_values) {
  uattn_runtime_config c = uattn_runtime_config_default();
  cr_assert_eq(c.num_threads, 0);
  cr_assert_null(c.cpuset);
  cr_assert(c.pin && !c.pin_caller);
  cr_assert_eq(c.spin_us, 50);
  cr_assert_null(c.allocator);
}

/* ---- thread counts and the environment --------------------------------------------------------------- */

Test(runtime, explicit_thread_counts_and_oversubscription) {
  uattn_runtime *probe = create(NULL);
  int32_t cores = topology(probe).usable.cores;
  uattn_runtime_destroy(probe);
  int32_t counts[] = {1, 2, cores, cores + 1, uattn_min(2 * cores + 1, MAXW)};
  for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
    uattn_runtime_config c = uattn_runtime_config_default();
    c.num_threads = counts[i];
    uattn_runtime *rt = create(&c);
    uattn_topology t = topology(rt);
    cr_assert_eq(uattn_runtime_workers(rt), counts[i]);
    cr_assert_eq(t.num_workers, counts[i]);
    cr_assert_eq(t.oversubscribed, counts[i] > cores, "%d workers on %d cores", counts[i], cores);
    /* round robin: worker k on core k mod cores, so worker `cores` shares the caller's core */
    if (counts[i] > cores) cr_assert_eq(t.worker_pu[cores], t.caller_pu);
    run_counted(rt, 50);
    uattn_runtime_destroy(rt);
  }
  CHECK_NO_LEAKS();
}

Test(runtime, env_num_threads_and_config_wins) {
  setenv("UATTN_NUM_THREADS", "3", 1);
  uattn_runtime *rt = create(NULL);
  cr_assert_eq(uattn_runtime_workers(rt), 3);
  uattn_runtime_destroy(rt);

  uattn_runtime_config c = uattn_runtime_config_default();
  rt = create(&c); /* num_threads 0: the environment decides */
  cr_assert_eq(uattn_runtime_workers(rt), 3);
  uattn_runtime_destroy(rt);

  c.num_threads = 2;
  rt = create(&c);
  cr_assert_eq(uattn_runtime_workers(rt), 2, "an explicit num_threads wins over UATTN_NUM_THREADS");
  uattn_runtime_destroy(rt);

  setenv("UATTN_NUM_THREADS", "0", 1); /* 0: one per core, as when unset */
  rt = create(NULL);
  uattn_topology t = topology(rt);
  cr_assert_eq(t.num_workers, t.binding.cores);
  uattn_runtime_destroy(rt);

  setenv("UATTN_NUM_THREADS", "", 1); /* empty: unset */
  rt = create(NULL);
  cr_assert_eq(uattn_runtime_workers(rt), t.binding.cores);
  uattn_runtime_destroy(rt);
}

Test(runtime, env_cpuset_and_config_wins) {
  int last = first_allowed_cpu(affinity_count() - 1), first = first_allowed_cpu(0);
  char s[32];
  snprintf(s, sizeof s, "%d", last);
  setenv("UATTN_CPUSET", s, 1);
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 2; /* worker 1 is pinned: it shows where the runtime went */
  uattn_runtime *rt = create(&c);
  uattn_topology t = topology(rt);
  cr_assert_eq(t.usable.pus, 1);
  cr_assert_eq(t.worker_pu[1], last, "UATTN_CPUSET=%d but worker 1 on PU %d", last, t.worker_pu[1]);
  uattn_runtime_destroy(rt);

  char s2[32];
  snprintf(s2, sizeof s2, "%d", first);
  c.cpuset = s2;
  rt = create(&c);
  t = topology(rt);
  cr_assert_eq(t.worker_pu[1], first, "an explicit cpuset wins over UATTN_CPUSET");
  uattn_runtime_destroy(rt);

  c.cpuset = ""; /* empty: not given, the environment decides */
  rt = create(&c);
  cr_assert_eq(topology(rt).worker_pu[1], last);
  uattn_runtime_destroy(rt);
}

Test(runtime, malformed_environment_is_refused) {
  const char *bad_threads[] = {"abc", "-2", "3x", " 3", "+3", "99999999999999999999", "1025"};
  for (size_t i = 0; i < sizeof bad_threads / sizeof *bad_threads; i++) {
    setenv("UATTN_NUM_THREADS", bad_threads[i], 1);
    uattn_runtime *rt = (uattn_runtime *)0x1;
    cr_assert_eq(uattn_runtime_create(NULL, &rt), UATTN_ERR_INVALID_ARGUMENT, "UATTN_NUM_THREADS=%s", bad_threads[i]);
    cr_assert(strstr(uattn_last_error(), "UATTN_NUM_THREADS"), "message: %s", uattn_last_error());
    cr_assert_eq(rt, (uattn_runtime *)0x1);
  }
  /* an explicit num_threads never reads the variable */
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 1;
  uattn_runtime_destroy(create(&c));

  unsetenv("UATTN_NUM_THREADS");
  setenv("UATTN_CPUSET", "0,,1", 1);
  uattn_runtime *rt = (uattn_runtime *)0x1;
  cr_assert_eq(uattn_runtime_create(NULL, &rt), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "UATTN_CPUSET"), "message: %s", uattn_last_error());
  cr_assert_eq(rt, (uattn_runtime *)0x1);
}

/* ---- cpusets ------------------------------------------------------------------------------------------- */

Test(runtime, one_pu_cpuset_gives_one_worker_there) {
  int pu = first_allowed_cpu(affinity_count() - 1);
  char s[32];
  snprintf(s, sizeof s, "%d", pu);
  uattn_runtime_config c = uattn_runtime_config_default();
  c.cpuset = s;
  c.pin_caller = true;
  uattn_runtime *rt = create(&c);
  uattn_topology t = topology(rt);
  cr_assert_eq(t.num_workers, 1);
  cr_assert_eq(t.usable.pus, 1);
  cr_assert_eq(t.usable.cores, 1);
  cr_assert_eq(t.worker_pu[0], pu);
  cr_assert_eq(t.caller_pu, pu);
  count_ctx *cc = calloc(1, sizeof *cc);
  uattn_runtime_run(rt, count_job, cc);
  cr_assert_eq(cc->cpu[0], pu, "the only worker ran on CPU %d, not %d", cc->cpu[0], pu);
  free(cc);
  uattn_runtime_destroy(rt);
}

Test(runtime, cpuset_ranges) {
  int n = affinity_count();
  if (n < 2) cr_skip_test("one CPU");
  /* two PUs as a list, in any order, and as a range with a repetition */
  int a = first_allowed_cpu(0), b = first_allowed_cpu(1);
  char s[64];
  snprintf(s, sizeof s, "%d,%d", b, a); /* order and repetition do not matter */
  uattn_runtime_config c = uattn_runtime_config_default();
  c.cpuset = s;
  uattn_runtime *rt = create(&c);
  uattn_topology t = topology(rt);
  cr_assert_eq(t.usable.pus, 2);
  uattn_runtime_destroy(rt);
  if (b == a + 1) {
    snprintf(s, sizeof s, "%d-%d,%d", a, b, a);
    rt = create(&c);
    cr_assert_eq(topology(rt).usable.pus, 2);
    uattn_runtime_destroy(rt);
  }
}

Test(runtime, cpuset_outside_binding_is_refused) {
  uattn_runtime *probe = create(NULL);
  int32_t machine_pus = topology(probe).machine.pus;
  uattn_runtime_destroy(probe);
  char s[64];
  snprintf(s, sizeof s, "0-%d", machine_pus + 3); /* PUs that do not exist are outside any binding */
  uattn_runtime_config c = uattn_runtime_config_default();
  c.cpuset = s;
  uattn_runtime *rt = (uattn_runtime *)0x1;
  cr_assert_eq(uattn_runtime_create(&c, &rt), UATTN_ERR_OUT_OF_RANGE, "%s", uattn_last_error());
  cr_assert(strstr(uattn_last_error(), "outside the process's CPU binding"), "message: %s", uattn_last_error());
  cr_assert_eq(rt, (uattn_runtime *)0x1);
}

/* ---- pinning ---------------------------------------------------------------------------------------------- */

Test(runtime, workers_run_on_their_pinned_pus) {
  uattn_runtime *probe = create(NULL);
  int32_t cores = topology(probe).usable.cores;
  uattn_runtime_destroy(probe);
  int32_t counts[] = {cores, cores + 2};
  for (int k = 0; k < 2; k++) {
    uattn_runtime_config c = uattn_runtime_config_default();
    c.num_threads = uattn_min(counts[k], UATTN_TOPOLOGY_MAX_WORKERS);
    c.pin_caller = true;
    uattn_runtime *rt = create(&c);
    uattn_topology t = topology(rt);
    count_ctx *cc = calloc(1, sizeof *cc);
    for (int i = 0; i < 20; i++) {
      uattn_runtime_run(rt, count_job, cc);
      for (int32_t w = 0; w < t.num_workers; w++)
        cr_assert_eq(cc->cpu[w], t.worker_pu[w], "call %d: worker %d ran on CPU %d, pinned to %d", i, w, cc->cpu[w],
                     t.worker_pu[w]);
    }
    free(cc);
    uattn_runtime_destroy(rt);
  }
}

Test(runtime, pin_caller_is_undone_by_destroy) {
  cpu_set_t before, during, after;
  sched_getaffinity(0, sizeof before, &before);
  uattn_runtime_config c = uattn_runtime_config_default();
  c.pin_caller = true;
  uattn_runtime *rt = create(&c);
  sched_getaffinity(0, sizeof during, &during);
  cr_assert_eq(CPU_COUNT(&during), 1);
  cr_assert(CPU_ISSET(topology(rt).caller_pu, &during));
  uattn_runtime_destroy(rt);
  sched_getaffinity(0, sizeof after, &after);
  cr_assert(CPU_EQUAL(&before, &after), "the caller's binding was not given back");
}

/* Binds the calling thread to `run_on` alone (Linux moves it there at once), then widens the binding to
 * `then`, which includes run_on: the thread stays where it runs. */
static void place_self(int run_on, const cpu_set_t *then) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(run_on, &one);
  cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
  cr_assert_eq(sched_getcpu(), run_on);
  cr_assert_eq(sched_setaffinity(0, sizeof *then, then), 0);
}

/* A caller the scheduler left on a worker's PU moves to caller_pu for the call (else the two share one
 * CPU, and a 2-thread job runs at one thread's speed) and keeps its binding; a caller whose binding
 * excludes caller_pu stays where it is, and the job still runs on every worker. */
Test(runtime, caller_on_a_workers_pu_moves_to_caller_pu) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 2;
  uattn_runtime *rt = create(&c);
  uattn_topology t = topology(rt);
  if (t.usable.cores < 2) {
    uattn_runtime_destroy(rt);
    cr_skip_test("one usable core: no worker PU apart from the caller's");
  }
  const int worker_pu = t.worker_pu[1];
  cr_assert(worker_pu >= 0 && worker_pu != t.caller_pu);
  cpu_set_t before, both, only_worker, now;
  cr_assert_eq(sched_getaffinity(0, sizeof before, &before), 0);
  CPU_ZERO(&both);
  CPU_SET(t.caller_pu, &both);
  CPU_SET(worker_pu, &both);
  CPU_ZERO(&only_worker);
  CPU_SET(worker_pu, &only_worker);
  count_ctx *cc = calloc(1, sizeof *cc);
  cr_assert_not_null(cc);

  for (int i = 0; i < 5; i++) {
    place_self(worker_pu, &both);
    uattn_runtime_run(rt, count_job, cc);
    cr_assert_eq(cc->cpu[0], t.caller_pu, "call %d: the caller ran its share on CPU %d, the worker's is %d", i,
                 cc->cpu[0], worker_pu);
    cr_assert_eq(cc->cpu[1], worker_pu);
    cr_assert_eq(sched_getaffinity(0, sizeof now, &now), 0);
    cr_assert(CPU_EQUAL(&now, &both), "call %d: the caller's binding was changed", i);
  }
  place_self(worker_pu, &only_worker);
  uattn_runtime_run(rt, count_job, cc);
  cr_assert_eq(cc->cpu[0], worker_pu, "a caller bound to the worker's PU alone was moved");
  cr_assert_eq(atomic_load(&cc->runs[0]), 6);
  cr_assert_eq(atomic_load(&cc->runs[1]), 6);
  cr_assert_eq(sched_getaffinity(0, sizeof now, &now), 0);
  cr_assert(CPU_EQUAL(&now, &only_worker));

  cr_assert_eq(sched_setaffinity(0, sizeof before, &before), 0);
  free(cc);
  uattn_runtime_destroy(rt);
}

Test(runtime, unpinned_workers) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.pin = false;
  c.num_threads = 3;
  uattn_runtime *rt = create(&c);
  uattn_topology t = topology(rt);
  cr_assert(!t.pinned);
  for (int32_t w = 0; w < 3; w++) cr_assert_eq(t.worker_pu[w], -1);
  run_counted(rt, 200);
  uattn_runtime_destroy(rt);
}

/* A process bound to one CPU, as under `taskset -c N`: a child binds itself and re-executes this binary, so
 * that every thread of the new process starts bound (a sanitizer's helper thread included: the process's
 * binding is the union of its threads'). A constructor catches the re-executed binary before the test
 * framework starts; it reports through its exit status and a pipe. */
#define CHILD_CHECK(cond, ...)                                                                                         \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      dprintf(fd, __VA_ARGS__);                                                                                        \
      return 1;                                                                                                        \
    }                                                                                                                  \
  } while (0)

static int bound_child(int fd, int cpu, int other) {
  cpu_set_t now;
  CHILD_CHECK(sched_getaffinity(0, sizeof now, &now) == 0 && CPU_COUNT(&now) == 1 && CPU_ISSET(cpu, &now),
              "the re-executed child is not bound to CPU %d", cpu);
  uattn_runtime *rt;
  CHILD_CHECK(uattn_runtime_create(NULL, &rt) == UATTN_OK, "create: %s", uattn_last_error());
  uattn_topology t;
  uattn_runtime_get_topology(rt, &t);
  CHILD_CHECK(t.num_workers == 1, "bound to CPU %d: %d workers, expected 1", cpu, t.num_workers);
  CHILD_CHECK(t.binding.pus == 1 && t.binding.cores == 1 && t.usable.cores == 1, "binding: %d PUs, %d cores",
              t.binding.pus, t.binding.cores);
  CHILD_CHECK(t.machine.pus >= 1 && t.caller_pu == cpu, "caller_pu %d, expected %d", t.caller_pu, cpu);
  uattn_runtime_destroy(rt);

  /* more threads than the one core: all of them on it */
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 3;
  CHILD_CHECK(uattn_runtime_create(&c, &rt) == UATTN_OK, "create 3: %s", uattn_last_error());
  uattn_runtime_get_topology(rt, &t);
  CHILD_CHECK(t.oversubscribed && t.worker_pu[1] == cpu && t.worker_pu[2] == cpu, "workers on %d, %d", t.worker_pu[1],
              t.worker_pu[2]);
  count_ctx *cc = calloc(1, sizeof *cc);
  for (int i = 0; i < 100; i++) {
    uattn_runtime_run(rt, count_job, cc);
    for (int w = 0; w < 3; w++)
      CHILD_CHECK(cc->cpu[w] == cpu && cc->runs[w] == i + 1, "call %d: worker %d on CPU %d, %d runs", i, w, cc->cpu[w],
                  (int)cc->runs[w]);
  }
  free(cc);
  uattn_runtime_destroy(rt);

  /* a cpuset naming the other CPU is outside the binding */
  if (other >= 0) {
    char s[32];
    snprintf(s, sizeof s, "%d", other);
    c = uattn_runtime_config_default();
    c.cpuset = s;
    uattn_status st = uattn_runtime_create(&c, &rt);
    CHILD_CHECK(st == UATTN_ERR_OUT_OF_RANGE, "cpuset %s outside the binding: %s (%s)", s, uattn_status_name(st),
                uattn_last_error());
  }
  return 0;
}

__attribute__((constructor)) static void bound_child_main(void) {
  const char *env = getenv("UATTN_TEST_BOUND_CHILD");
  int fd, cpu, other;
  if (!env || sscanf(env, "%d %d %d", &fd, &cpu, &other) != 3) return;
  unsetenv("UATTN_TEST_BOUND_CHILD");
  exit(bound_child(fd, cpu, other)); /* exit, not _exit: a sanitizer reports at exit */
}

static void run_bound_child(int cpu, int other) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    char env[64];
    snprintf(env, sizeof env, "%d %d %d", fds[1], cpu, other);
    if (sched_setaffinity(0, sizeof one, &one) != 0 || setenv("UATTN_TEST_BOUND_CHILD", env, 1) != 0) _exit(3);
    char *args[] = {"test_runtime", NULL};
    execv("/proc/self/exe", args);
    dprintf(fds[1], "execv /proc/self/exe failed");
    _exit(4);
  }
  close(fds[1]);
  char msg[512] = {0};
  ssize_t got = read(fds[0], msg, sizeof msg - 1);
  (void)got;
  close(fds[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child bound to CPU %d: %s (status %d)", cpu, msg, status);
}

Test(runtime, process_bound_to_one_cpu) {
  int n = affinity_count();
  run_bound_child(first_allowed_cpu(0), n > 1 ? first_allowed_cpu(1) : -1);
  if (n > 1) run_bound_child(first_allowed_cpu(n - 1), first_allowed_cpu(0));
}

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

/* ---- scratch ---------------------------------------------------------------------------------------------- */

typedef struct scratch_ctx {
  uattn_runtime *rt;
  size_t bytes;
  int phase; /* 0: fill, 1: check, 2: check pointer only */
  unsigned char *ptr[MAXW];
  _Atomic int32_t errors;
} scratch_ctx;

static void scratch_job(void *p, int32_t w, int32_t n) {
  scratch_ctx *c = p;
  unsigned char *s = uattn_worker_scratch(c->rt, w, c->bytes);
  if (!s || (uintptr_t)s % 64 != 0) {
    atomic_fetch_add(&c->errors, 1);
    return;
  }
  if (c->phase == 0) {
    memset(s, w + 1, c->bytes);
    c->ptr[w] = s;
  } else {
    if (s != c->ptr[w]) atomic_fetch_add(&c->errors, 1);
    if (c->phase == 1)
      for (size_t i = 0; i < c->bytes; i++)
        if (s[i] != (unsigned char)(w + 1)) {
          atomic_fetch_add(&c->errors, 1);
          break;
        }
  }
}

/* A thread-safe counting allocator: the workers grow their scratch concurrently. */
static _Atomic long ts_allocs, ts_frees;
static void *ts_alloc(void *user, size_t bytes) {
  (void)user;
  atomic_fetch_add(&ts_allocs, 1);
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}
static void ts_free(void *user, void *ptr) {
  (void)user;
  atomic_fetch_add(&ts_frees, 1);
  free(ptr);
}

Test(runtime, scratch_is_per_worker_aligned_kept_and_grown) {
  uattn_allocator hooks = {ts_alloc, ts_free, NULL};
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 3;
  c.allocator = &hooks;
  uattn_runtime *rt = create(&c);
  long allocs_at_create = atomic_load(&ts_allocs);
  cr_assert(allocs_at_create >= 1, "the runtime's own memory goes through the allocator");

  scratch_ctx sc = {.rt = rt, .bytes = 4096, .phase = 0};
  uattn_runtime_run(rt, scratch_job, &sc);
  cr_assert_eq(sc.errors, 0);
  for (int w = 0; w < 3; w++)
    for (int v = 0; v < w; v++) cr_assert_neq(sc.ptr[v], sc.ptr[w], "workers %d and %d share scratch", v, w);
  long allocs = atomic_load(&ts_allocs);
  cr_assert_eq(allocs - allocs_at_create, 3, "one scratch allocation per worker");

  for (int w = 0; w < 3; w++) { /* what each worker holds, as a caller holding rt sees it */
    cr_assert(uattn_worker_scratch_fits(rt, w, 4096) && uattn_worker_scratch_fits(rt, w, 1));
    cr_assert_not(uattn_worker_scratch_fits(rt, w, 4097), "worker %d: 4096 bytes reserved, not more", w);
  }
  cr_assert_not(uattn_worker_scratch_fits(rt, 3, 1), "worker out of range");
  cr_assert_not(uattn_worker_scratch_fits(rt, -1, 1));

  sc.phase = 1; /* same size, then smaller: same memory, contents kept, nothing allocated */
  for (int i = 0; i < 20; i++) uattn_runtime_run(rt, scratch_job, &sc);
  sc.bytes = 100;
  uattn_runtime_run(rt, scratch_job, &sc);
  cr_assert_eq(sc.errors, 0, "scratch moved or lost its contents between calls");
  cr_assert_eq(atomic_load(&ts_allocs), allocs);

  sc.bytes = 3 << 20; /* grows: aligned and usable (contents not kept) */
  sc.phase = 0;
  uattn_runtime_run(rt, scratch_job, &sc);
  sc.phase = 1;
  uattn_runtime_run(rt, scratch_job, &sc);
  cr_assert_eq(sc.errors, 0);
  cr_assert_eq(atomic_load(&ts_allocs), allocs + 3);
  for (int w = 0; w < 3; w++) cr_assert(uattn_worker_scratch_fits(rt, w, (size_t)3 << 20));

  cr_assert_null(uattn_worker_scratch(rt, 3, 64), "worker out of range");
  cr_assert_null(uattn_worker_scratch(rt, -1, 64));
  uattn_runtime_destroy(rt);
  cr_assert_eq(atomic_load(&ts_allocs), atomic_load(&ts_frees), "the runtime freed what it allocated");
  CHECK_NO_LEAKS();
}

static void *null_rt_scratch_thread(void *arg) {
  unsigned char *p = uattn_worker_scratch(NULL, 0, 1000);
  if (!p || (uintptr_t)p % 64) return NULL;
  memset(p, 7, 1000);
  unsigned char *q = uattn_worker_scratch(NULL, 0, 500);
  if (q != p || q[999] != 7) return NULL;
  *(unsigned char **)arg = p;
  return arg;
}

Test(runtime, scratch_without_runtime_is_per_thread) {
  unsigned char *mine = uattn_worker_scratch(NULL, 0, 0);
  cr_assert_not_null(mine, "0 bytes still gives a pointer");
  cr_assert_eq((uintptr_t)mine % 64, 0);
  mine = uattn_worker_scratch(NULL, 0, 1000);
  memset(mine, 1, 1000);
  unsigned char *theirs = NULL;
  pthread_t th;
  void *res;
  pthread_create(&th, NULL, null_rt_scratch_thread, &theirs);
  pthread_join(th, &res);
  cr_assert_not_null(res, "a thread's scratch was not aligned, kept or sized");
  cr_assert_neq(theirs, mine);
  cr_assert_eq(mine[999], 1, "another thread's scratch overwrote this one's");
  cr_assert(uattn_worker_scratch_fits(NULL, 0, 1000), "rt NULL: this thread's own buffer");
  cr_assert_not(uattn_worker_scratch_fits(NULL, 0, 1 << 20));
  unsigned char *big = uattn_worker_scratch(NULL, 0, 1 << 20);
  cr_assert(big && (uintptr_t)big % 64 == 0);
  big[(1 << 20) - 1] = 1;
  CHECK_NO_LEAKS(); /* the other thread's buffer was freed at its exit; this thread's is still reachable */
}

/* ---- bad input ------------------------------------------------------------------------------------------- */

static void expect_refused(const uattn_runtime_config *c, uattn_status want, const char *what) {
  uattn_runtime *rt = (uattn_runtime *)0x1;
  uattn_status st = uattn_runtime_create(c, &rt);
  cr_assert_eq(st, want, "%s: %s, expected %s (%s)", what, uattn_status_name(st), uattn_status_name(want),
               uattn_last_error());
  cr_assert_neq(uattn_last_error()[0], '\0', "%s: failed without a message", what);
  cr_assert_eq(rt, (uattn_runtime *)0x1, "%s: *out written on failure", what);
}

Test(runtime, bad_configs_are_refused) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = -1;
  expect_refused(&c, UATTN_ERR_INVALID_ARGUMENT, "num_threads -1");
  c.num_threads = UATTN_RUNTIME_MAX_THREADS + 1;
  expect_refused(&c, UATTN_ERR_INVALID_ARGUMENT, "num_threads too large");
  c = uattn_runtime_config_default();
  c.spin_us = -1;
  expect_refused(&c, UATTN_ERR_INVALID_ARGUMENT, "spin_us -1");
  c.spin_us = 2000000;
  expect_refused(&c, UATTN_ERR_INVALID_ARGUMENT, "spin_us 2 s");

  const char *bad[] = {"3-1",
                       "a",
                       "0,,1",
                       ",0",
                       "0,",
                       "1-",
                       "-1",
                       " 0",
                       "0 ",
                       "0-1-2",
                       "0x1",
                       "0:2",
                       "0;1",
                       "1-0",
                       "+1",
                       "0-",
                       "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    c = uattn_runtime_config_default();
    c.cpuset = bad[i];
    expect_refused(&c, UATTN_ERR_INVALID_ARGUMENT, bad[i]);
    cr_assert(strstr(uattn_last_error(), "config.cpuset"), "message for \"%s\": %s", bad[i], uattn_last_error());
  }

  c = uattn_runtime_config_default();
  uattn_allocator half = {ts_alloc, NULL, NULL};
  c.allocator = &half;
  expect_refused(&c, UATTN_ERR_INVALID_ARGUMENT, "allocator with alloc only");

  cr_assert_eq(uattn_runtime_create(NULL, NULL), UATTN_ERR_INVALID_ARGUMENT);
  uattn_topology t;
  cr_assert_eq(uattn_runtime_get_topology(NULL, &t), UATTN_ERR_INVALID_ARGUMENT);
  uattn_runtime *rt = create(NULL);
  cr_assert_eq(uattn_runtime_get_topology(rt, NULL), UATTN_ERR_INVALID_ARGUMENT);
  uattn_runtime_destroy(rt);
  uattn_runtime_destroy(NULL);
  CHECK_NO_LEAKS(); /* failed creations released what they had taken */
}

/* ---- KV cache memory (runtime/threads/cache_memory.c) ----------------------------------------------------------- */

TestSuite(cache_memory);

/* The THPeligible field of the /proc/self/smaps entry that holds p: 1 or 0, -1 where the kernel does not
 * report it. */
static int thp_eligible(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[256];
  int in = 0, v = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
      in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    else if (in && sscanf(line, "THPeligible: %d", &v) == 1)
      break;
  }
  fclose(f);
  return v;
}

/* Whether /sys says transparent huge pages may be given to a madvise'd range ("always" or "madvise"). */
static bool thp_on_request(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char s[128] = "";
  if (f) {
    if (!fgets(s, sizeof s, f)) s[0] = '\0';
    fclose(f);
  }
  return strstr(s, "[always]") || strstr(s, "[madvise]");
}

/* What either allocator gives, `rounded` bytes (its whole 2 MiB pages) at p: 2 MiB-aligned, zeroed, every
 * byte writable, and marked for huge pages where the system's THP setting allows. */
static void check_cache_memory(void *p, size_t rounded) {
  cr_assert_eq((uintptr_t)p % (2u << 20), 0, "%p is not 2 MiB-aligned", p);
  unsigned char *b = p;
  for (size_t i = 0; i < rounded; i += 4096) cr_assert_eq(b[i], 0, "byte %zu is not zero", i);
  for (size_t i = 0; i < rounded; i++) b[i] = (unsigned char)(i * 7); /* the whole rounded range is ours */
  for (size_t i = 0; i < rounded; i += 997) cr_assert_eq(b[i], (unsigned char)(i * 7));
  const int eligible = thp_eligible(p);
  if (eligible >= 0 && thp_on_request()) cr_assert_eq(eligible, 1, "the cache was not marked for huge pages");
}

Test(cache_memory, is_aligned_zeroed_writable_and_asks_for_huge_pages) {
  const size_t bytes = (3u << 20) + 5; /* rounds up to two 2 MiB pages */
  void *p = (void *)1;
  cr_assert_eq(uattn_cache_alloc(bytes, &p), UATTN_OK, "%s", uattn_last_error());
  check_cache_memory(p, 4u << 20);
  uattn_cache_free(p, bytes);
  uattn_cache_free(NULL, bytes);
}

/* The memory policy /proc/self/numa_maps gives the mapping that holds p ("interleave:0-1", "default"), in
 * out; false where the kernel keeps no such file (no NUMA support built in). */
static bool numa_policy(const void *p, char *out, size_t n) {
  FILE *f = fopen("/proc/self/numa_maps", "r");
  if (!f) return false;
  char line[512], policy[128];
  unsigned long best = 0;
  out[0] = '\0';
  while (fgets(line, sizeof line, f)) { /* the mapping with the highest start at or below p */
    unsigned long start;
    if (sscanf(line, "%lx %127s", &start, policy) == 2 && start <= (uintptr_t)p && start >= best) {
      best = start;
      snprintf(out, n, "%s", policy);
    }
  }
  fclose(f);
  return out[0] != '\0';
}

Test(cache_memory, runtime_cache_interleaves_pages_over_its_nodes) {
  uattn_runtime *rt = create(NULL);
  const uattn_topology topo = topology(rt);
  const size_t bytes = (5u << 20) + 3; /* three 2 MiB pages */
  void *p = (void *)1;
  cr_assert_eq(uattn_runtime_cache_alloc(rt, bytes, &p), UATTN_OK, "%s", uattn_last_error());
  check_cache_memory(p, 6u << 20);
  char policy[128];
  if (numa_policy(p, policy, sizeof policy)) {
    /* the nodes of the runtime's workers: one node spelled out, several at least named as interleaved */
    int32_t node = -1;
    bool one = true;
    for (int32_t w = 0; w < topo.num_workers && w < UATTN_TOPOLOGY_MAX_WORKERS; w++) {
      if (topo.worker_numa[w] < 0) continue;
      if (node >= 0 && topo.worker_numa[w] != node) one = false;
      node = topo.worker_numa[w];
    }
    char want[32] = "interleave:";
    if (one && node >= 0) snprintf(want, sizeof want, "interleave:%d", (int)node);
    cr_assert(one && node >= 0 ? !strcmp(policy, want) : !strncmp(policy, want, strlen(want)),
              "numa_maps gives \"%s\" for the cache, not \"%s\"", policy, want);
  }
  uattn_cache_free(p, bytes);
  uattn_runtime_destroy(rt);
}

#if defined(__x86_64__)
/* Makes every later mbind of this process fail with EPERM, as a container's seccomp profile may (seccomp
 * filter: x86-64's mbind answers EPERM, everything else runs). */
static bool forbid_mbind(void) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mbind, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof *filter), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

/* Pages of the process's address space (/proc/self/statm's first field). */
static long mapped_pages(void) {
  long pages = -1;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld", &pages) != 1) pages = -1;
    fclose(f);
  }
  return pages;
}

/* Where the system refuses the placement: UATTN_ERR_UNSUPPORTED with a message that says what to use instead,
 * *out untouched, the mapping given back. In a child process, whose seccomp filter stays with it. */
Test(cache_memory, runtime_cache_says_so_where_placement_is_refused) {
  uattn_runtime *rt = create(NULL);
  const pid_t pid = fork();
  cr_assert(pid >= 0, "fork failed");
  if (pid == 0) {
    if (!forbid_mbind()) _exit(3); /* no seccomp here: nothing to check */
    const long before = mapped_pages();
    void *p = (void *)1;
    const uattn_status st = uattn_runtime_cache_alloc(rt, 64u << 20, &p);
    const bool said = strstr(uattn_last_error(), "mbind") && strstr(uattn_last_error(), "uattn_cache_alloc");
    const long after = mapped_pages();
    if (st != UATTN_ERR_UNSUPPORTED) _exit(10 + (int)st);
    if (!said) _exit(4);
    if (p != (void *)1) _exit(5);
    if (after - before >= (32l << 20) / sysconf(_SC_PAGESIZE)) _exit(6); /* the 64 MiB stayed mapped */
    _exit(0);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the child died (signal %d)", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  const int code = WEXITSTATUS(status);
  if (code != 3)
    cr_assert_eq(code, 0, "%s",
                 code == 4   ? "the message does not name mbind and uattn_cache_alloc"
                 : code == 5 ? "a refused call wrote *out"
                 : code == 6 ? "the refused mapping was not given back"
                             : "another status than UATTN_ERR_UNSUPPORTED (10 + status)");
  uattn_runtime_destroy(rt);
}
#endif

Test(cache_memory, runtime_cache_refuses_bad_requests_and_leaves_out_alone) {
  uattn_runtime *rt = create(NULL);
  void *p = (void *)1;
  cr_assert_eq(uattn_runtime_cache_alloc(NULL, 1, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "rt"), "%s", uattn_last_error());
  cr_assert_eq(uattn_runtime_cache_alloc(rt, 1, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "out"), "%s", uattn_last_error());
  cr_assert_eq(uattn_runtime_cache_alloc(rt, 0, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "bytes is 0"), "%s", uattn_last_error());
  cr_assert_eq(uattn_runtime_cache_alloc(rt, SIZE_MAX, &p), UATTN_ERR_OVERFLOW);
  cr_assert_eq(uattn_runtime_cache_alloc(rt, (size_t)1 << 62, &p), UATTN_ERR_NO_MEMORY, "4 EiB: %s",
               uattn_last_error());
  cr_assert_eq(p, (void *)1, "a refused call wrote *out");
  uattn_runtime_destroy(rt);
}

Test(cache_memory, refuses_bad_requests_and_leaves_out_alone) {
  void *p = (void *)1;
  cr_assert_eq(uattn_cache_alloc(1, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "out"), "%s", uattn_last_error());
  cr_assert_eq(uattn_cache_alloc(0, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "bytes is 0"), "%s", uattn_last_error());
  cr_assert_eq(uattn_cache_alloc(SIZE_MAX, &p), UATTN_ERR_OVERFLOW);
  cr_assert_eq(uattn_cache_alloc(SIZE_MAX - (2u << 20), &p), UATTN_ERR_OVERFLOW); /* no room for the alignment */
  cr_assert_eq(uattn_cache_alloc((size_t)1 << 62, &p), UATTN_ERR_NO_MEMORY, "4 EiB: %s", uattn_last_error());
  cr_assert(strstr(uattn_last_error(), "mmap"), "%s", uattn_last_error());
  cr_assert_eq(p, (void *)1, "a refused call wrote *out");
}
