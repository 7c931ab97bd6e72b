/* The runtime's pinning, checked with sched_getcpu: workers on their pinned PUs, the caller's pin undone by
 * destroy or moved off a worker's PU, unpinned workers, and a process bound to one CPU (a forked child with
 * sched_setaffinity, as under taskset). */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET, setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime.h"

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
