/* uattn-experiments: measurements of the core itself that once decided how a decode kernel is written, kept so
 * that they can be run again on a new CPU; not a benchmark of uattn (that is uattn-bench and uattn-kernel-bench).
 *
 * pipes (a CPU with AVX512-BF16): which instructions of the bf16 decode kernels compete with vdpbf16ps for the
 * core's pipes (pipes.c): what a change that trades a shuffle for a load, or an exponential's FMAs for
 * something else, can buy, on a machine whose PMU counts nothing (a VM).
 *
 * overlap: how much of a compute load a cold walk over memory can hide on this core, for the ways a decode
 * walk reads its keys and values (overlap.c): two streams, two streams asking a share ahead (the kernels'
 * way), one stream; the ceiling a decode kernel with that much compute can reach against the plain read.
 *
 * One thread; medians of RUNS runs of at least 20 ms each, the cases' runs interleaved. --cpu-time: time with
 * the thread's CPU clock instead of the wall clock (a loaded shared host).
 *
 *   uattn-experiments pipes|overlap [RUNS] [--cpu-time]           (RUNS: timed runs per figure, 7 by default) */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "avx2/avx2.h"
#include "avx512bf16/avx512bf16.h"
#include "common/args.h"
#include "common/probe.h"
#include "common/timing.h"
#include "experiments/overlap.h"
#include "experiments/pipes.h"
#include "uattn.h"

enum { MAX_RUNS = 64 };

static int runs = 7;
static double (*now)(void) = perf_seconds;

/* pipes: each loop kind 1000 times a call (pipes.c, whose loops keep their values live themselves). */
static void run_pipes(void *arg, long call) {
  (void)call;
  float sink[16];
  pipes_loop(*(const int *)arg, 1000, sink);
}

static int bench_pipes(void) {
  if (!uattn_avx512bf16_runs_here()) {
    printf("  pipes: this CPU lacks AVX512-BF16 (or VBMI): no vdpbf16ps to compete with\n");
    return 0;
  }
  int kinds[PIPES_KINDS];
  void *arg[PIPES_KINDS];
  for (int k = 0; k < PIPES_KINDS; k++) kinds[k] = k, arg[k] = &kinds[k];
  double t[PIPES_KINDS];
  perf_time_interleaved(run_pipes, PIPES_KINDS, arg, runs, now, t, NULL);
  const double dot = t[PIPES_DOT] / 12e3; /* seconds a dot product, at their throughput */
  printf(
      "  what competes with vdpbf16ps zmm: loops of 12 of them and 6 of another instruction (a ring of\n"
      "  results), against the 12 alone; the time one of them adds, in dot-product slots (0: pipes of its\n"
      "  own; 1: a dot product's place)\n\n");
  printf("  %-40s %9.3f ns     %.1f a ns\n", pipes_names[PIPES_DOT], dot * 1e9, 1e-9 / dot);
  for (int k = PIPES_DOT_BCAST; k <= PIPES_DOT_LOADED; k++) /* the dot products' own broadcasts */
    printf("  %-40s %9.3f ns     %.2f slots\n", pipes_names[k], t[k] / 12e3 * 1e9, t[k] / t[PIPES_DOT]);
  for (int k = PIPES_DOT_LOADED + 1; k < PIPES_KINDS; k++) {
    const double extra = (t[k] - t[PIPES_DOT]) / 6e3;
    printf("  %-40s %+9.3f ns     %.2f slots\n", pipes_names[k], extra * 1e9, extra > 0 ? extra / dot : 0.0);
  }
  return 0;
}

/* overlap: overlap.c's walks over 512 MiB (two 256 MiB regions, or one stream through both), cold, and 4
 * shares again and again, hot, at each compute load, against the plain read of the same bytes. */
typedef struct overlap_case {
  int work; /* index into overlap_work; -1: the plain read */
  const char *k, *v;
  size_t step, shares, mask;
  bool ask;
  size_t bytes; /* read a call */
} overlap_case;

static void run_overlap(void *arg, long call) {
  (void)call;
  const overlap_case *c = arg;
  float sink[8];
  if (c->work < 0)
    bench_probe_read_words(c->k, c->bytes, sink);
  else
    overlap_walk(c->work, c->k, c->v, c->step, c->shares, c->mask, c->ask, sink);
  __asm__ volatile("" : : "r"(sink) : "memory");
}

static int bench_overlap(void) {
  const size_t half = (size_t)256 << 20, shares = half / OVERLAP_SHARE;
  void *mem = NULL;
  if (uattn_cache_alloc(2 * half, &mem) != UATTN_OK) {
    fprintf(stderr, "uattn-experiments: %s\n", uattn_last_error());
    return 1;
  }
  char *buf = mem;
  memset(buf, 0x3f, 2 * half); /* every float 0.75: no denormals in the FMAs, and the pages are there */
  printf(
      "  a walk over 512 MiB in %d-byte shares, a share of keys then one of values, each 64-byte line fed to a\n"
      "  number of FMAs; ns per 512 bytes (a key and KV head of bf16 at head dim 128), and (the plain read's\n"
      "  time over the walk's: the share of the bandwidth reached)\n\n",
      OVERLAP_SHARE);
  enum { HOT, TWO, ASK, ONE, KINDS };
  overlap_case c[OVERLAP_WORKS * KINDS + 1];
  void *arg[OVERLAP_WORKS * KINDS + 1];
  for (int w = 0; w < OVERLAP_WORKS; w++) {
    /* hot: 4 shares of each region (32 KB), as many lines a call as a cold walk's sixteenth */
    c[w * KINDS + HOT] = (overlap_case){w, buf, buf + half, OVERLAP_SHARE, shares / 16, 3, false, 0};
    c[w * KINDS + TWO] = (overlap_case){w, buf, buf + half, OVERLAP_SHARE, shares, ~(size_t)0, false, 0};
    c[w * KINDS + ASK] = (overlap_case){w, buf, buf + half, OVERLAP_SHARE, shares, ~(size_t)0, true, 0};
    c[w * KINDS + ONE] = (overlap_case){w, buf, buf + OVERLAP_SHARE, 2 * OVERLAP_SHARE, shares, ~(size_t)0, false, 0};
  }
  c[OVERLAP_WORKS * KINDS] = (overlap_case){-1, buf, NULL, 0, 0, 0, false, 2 * half};
  for (int i = 0; i <= OVERLAP_WORKS * KINDS; i++) arg[i] = &c[i];
  double sec[OVERLAP_WORKS * KINDS + 1];
  perf_time_interleaved(run_overlap, OVERLAP_WORKS * KINDS + 1, arg, runs, now, sec, NULL);
  const double per = 512.0 / (2.0 * (double)half) * 1e9; /* seconds of a cold call to ns per 512 bytes */
  const double read = sec[OVERLAP_WORKS * KINDS] * per;
  printf("  %-14s %8s %16s %16s %16s\n", "FMAs a line", "hot", "two streams", "+ asks", "one stream");
  for (int w = 0; w < OVERLAP_WORKS; w++) {
    const double *t = sec + w * KINDS;
    printf("  %-14d %8.1f", overlap_work[w], t[HOT] * per * 16);
    for (int k = TWO; k <= ONE; k++) printf(" %9.1f (%3.0f%%)", t[k] * per, 100 * read / (t[k] * per));
    printf("\n");
  }
  printf("  %-14s %8s %9.1f\n", "plain read", "", read);
  uattn_cache_free(buf, 2 * half);
  return 0;
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "";
  const bool pipes = !strcmp(what, "pipes"), overlap = !strcmp(what, "overlap");
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--cpu-time"))
      now = perf_thread_cpu_seconds;
    else if (perf_parse_int(argv[i], 1, MAX_RUNS, &runs))
      runs = 0;
  }
  if ((!pipes && !overlap) || runs < 1) {
    fprintf(stderr, "usage: uattn-experiments pipes|overlap [RUNS (1-%d)] [--cpu-time]\n", MAX_RUNS);
    return 2;
  }
  if (!uattn_avx2_runs_here()) {
    fprintf(stderr, "uattn-experiments: this CPU lacks AVX2, FMA or F16C\n");
    return 1;
  }
  printf("uattn-experiments %s: one thread; medians of %d runs%s\n\n", what, runs,
         now == perf_seconds ? "" : " (thread CPU time)");
  return pipes ? bench_pipes() : bench_overlap();
}
