/* uattn-runtime-bench: what one uattn_runtime_run of an empty job costs, i.e. the runtime's own overhead
 * on every parallel call of the library.
 *
 *   uattn-runtime-bench [--iters N] [--gap-us G]
 *
 * For 1 worker, 2 workers, one per core (when more than 2) and one more than the cores (oversubscribed),
 * it times each call on its own and prints the median, 90th and 99th percentiles, in these regimes:
 *   hot     back-to-back calls, default spin (50 us): the workers are still spinning when the next job comes
 *   gap     the default spin, but G us (default 200) between calls: the workers have gone to sleep
 *   sleep   spin_us = 0: every call wakes the workers from the kernel
 * each with the caller unpinned (the default) and pinned (pin_caller). "shared" is the share of calls made
 * from a CPU where a worker is pinned: the scheduler put the unpinned caller there. It also times
 * uattn_runtime_create + uattn_runtime_destroy.
 *
 * Then the library's own cost around the kernels on small steps, uattn_forward on the calling thread (no
 * runtime): a step with no tokens (validation, the tuning lookup, the kernel choice) and 1 and 8 decodes of
 * one 16-key block (bf16, Llama-3-8B's heads), median microseconds per call. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "common/tensors.h"
#include "common/timing.h"
#include "support/requests.h"
#include "threads/pool.h" /* uattn_runtime_run: internal, so this links the static library */
#include "uattn.h"

static void empty_job(void *ctx, int32_t worker, int32_t num_workers) {
  (void)ctx;
  (void)worker;
  (void)num_workers;
}

static double now_us(void) { return perf_seconds() * 1e6; }

static void sleep_us(int us) {
  struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Times iters calls; returns 0 or -1 (message printed). */
static int bench(int32_t threads, int spin_us, bool pin_caller, int gap_us, int iters, const char *regime) {
  uattn_runtime_config cfg = uattn_runtime_config_default();
  cfg.num_threads = threads;
  cfg.spin_us = spin_us;
  cfg.pin_caller = pin_caller;
  uattn_runtime *rt;
  uattn_status st = uattn_runtime_create(&cfg, &rt);
  if (st != UATTN_OK) {
    fprintf(stderr, "uattn_runtime_create(%d threads): %s\n", threads, uattn_last_error());
    return -1;
  }
  double *t = malloc((size_t)iters * sizeof *t);
  if (!t) {
    uattn_runtime_destroy(rt);
    return -1;
  }
  uattn_topology topo;
  uattn_runtime_get_topology(rt, &topo);
  for (int i = 0; i < 100; i++) uattn_runtime_run(rt, empty_job, NULL); /* threads started and placed */
  int shared = 0;
  for (int i = 0; i < iters; i++) {
    if (gap_us) sleep_us(gap_us);
    double t0 = now_us();
    uattn_runtime_run(rt, empty_job, NULL);
    t[i] = now_us() - t0;
    int cpu = sched_getcpu();
    for (int32_t w = 1; w < topo.num_workers && w < UATTN_TOPOLOGY_MAX_WORKERS; w++)
      if (topo.worker_pu[w] == cpu) {
        shared++;
        break;
      }
  }
  qsort(t, (size_t)iters, sizeof *t, perf_compare_double);
  printf("%-6s %7d %7d %-6s %10.2f %8.2f %8.2f %6.0f%%\n", regime, threads, spin_us, pin_caller ? "yes" : "no",
         t[iters / 2], t[iters * 9 / 10], t[iters * 99 / 100], 100.0 * shared / iters);
  free(t);
  uattn_runtime_destroy(rt);
  return 0;
}

/* Median microseconds of uattn_forward on `decodes` decode rows, each with one block of 16 keys (0 decodes:
 * an empty step). Returns -1 (message printed) on an error. */
static double forward_us(int32_t decodes, int iters) {
  enum { BS = 16, HQ = 32, HKV = 8, D = 128, MAX = 8 };
  static uint16_t q[MAX * HQ * D], k[MAX * HKV * D], v[MAX * HKV * D], out[MAX * HQ * D];
  static uint16_t key_cache[MAX * BS * HKV * D], value_cache[MAX * BS * HKV * D];
  int32_t computed[MAX], scheduled[MAX], prompt[MAX], table[MAX];
  for (int32_t r = 0; r < MAX; r++) computed[r] = BS - 1, scheduled[r] = 1, prompt[r] = 4, table[r] = r;
  uattn_plan_config pc = uattn_plan_config_default(BS, MAX, MAX, MAX, BS);
  uattn_plan *plan;
  const uattn_step step = step_requests(decodes, computed, scheduled, prompt, table, 1);
  if (uattn_plan_create(&pc, &plan) != UATTN_OK || uattn_plan_step(plan, &step) != UATTN_OK) {
    fprintf(stderr, "plan: %s\n", uattn_last_error());
    return -1;
  }
  const uattn_layer L = uattn_layer_default(HQ, HKV, D, UATTN_BF16);
  const uattn_tensors t = perf_tensors(q, k, v, key_cache, value_cache, MAX, BS, out);
  double *times = malloc((size_t)iters * sizeof *times);
  double median = -1;
  if (times) {
    for (int i = 0; i < iters + 100 && median == -1; i++) {
      const double t0 = now_us();
      if (uattn_forward(plan, &L, &t, NULL) != UATTN_OK) {
        fprintf(stderr, "uattn_forward: %s\n", uattn_last_error());
        break;
      }
      if (i >= 100) times[i - 100] = now_us() - t0; /* the first 100 warm up */
      if (i == iters + 99) {
        qsort(times, (size_t)iters, sizeof *times, perf_compare_double);
        median = times[iters / 2];
      }
    }
  }
  free(times);
  uattn_plan_destroy(plan);
  return median;
}

int main(int argc, char **argv) {
  int iters = 20000, gap_us = 200;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--gap-us") && i + 1 < argc) {
      gap_us = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: %s [--iters N] [--gap-us G]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 100) iters = 100;

  uattn_runtime *probe;
  uattn_topology topo;
  double t0 = now_us();
  if (uattn_runtime_create(NULL, &probe) != UATTN_OK || uattn_runtime_get_topology(probe, &topo) != UATTN_OK) {
    fprintf(stderr, "uattn_runtime_create: %s\n", uattn_last_error());
    return 1;
  }
  uattn_runtime_destroy(probe);
  double create_us = now_us() - t0;
  int32_t cores = topo.usable.cores;
  printf("uattn %s: %d usable cores (%d PUs) of %d; L1d %zu KiB, L2 %zu KiB, L3 %zu KiB\n", uattn_version(), cores,
         topo.usable.pus, topo.machine.cores, topo.l1d_bytes >> 10, topo.l2_bytes >> 10, topo.l3_bytes >> 10);
  printf("uattn_runtime_create + destroy (default config): %.0f us\n", create_us);
  printf("empty job, one uattn_runtime_run per sample, microseconds (%d samples; gap %d us)\n", iters, gap_us);
  printf("%-6s %7s %7s %-6s %10s %8s %8s %7s\n", "regime", "workers", "spin_us", "pinned", "median", "p90", "p99",
         "shared");

  int32_t counts[4] = {1, 2, cores, cores + 1};
  int ncounts = 4;
  int slow_iters = iters / 10 > 2000 ? iters / 10 : (iters < 2000 ? iters : 2000);
  for (int c = 0; c < ncounts; c++) {
    int32_t n = counts[c];
    if (c == 2 && cores <= 2) continue; /* already measured */
    for (int pinned = 0; pinned < 2; pinned++) {
      if (bench(n, 50, pinned, 0, iters, "hot") || bench(n, 50, pinned, gap_us, slow_iters, "gap") ||
          bench(n, 0, pinned, 0, slow_iters, "sleep"))
        return 1;
    }
  }

  printf("uattn_forward on the calling thread, bf16 caches, block 16, 32/8 heads of 128: median microseconds\n");
  const int32_t decodes[] = {0, 1, 8};
  for (int i = 0; i < 3; i++) {
    const double us = forward_us(decodes[i], iters);
    if (us < 0) return 1;
    printf("  %d decode(s)%s  %8.2f\n", decodes[i], decodes[i] ? "" : " (empty step)", us);
  }
  return 0;
}
