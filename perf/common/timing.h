/* Timing helpers shared by the tools in perf/: a monotonic clock and the median of repeated runs. */
#ifndef UATTN_PERF_TIMING_H
#define UATTN_PERF_TIMING_H

#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double perf_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds this process has run (all its threads): on a machine others share, the work a timed run did,
 * which its wall time also counts while the process waited for a core. */
static inline double perf_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int perf_compare_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of n samples (sorts them in place). */
static inline double perf_median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, perf_compare_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

#endif
