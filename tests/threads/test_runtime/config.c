/* The runtime's topology against the kernel's own view (sysfs and sched_getaffinity, not hwloc), its thread
 * counts from the config and the environment, cpusets, and bad configurations, which must fail with a message
 * and leave *out alone. */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET, setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

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
