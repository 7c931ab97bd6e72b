/* Timing and statistics shared by the tools in perf/: the clocks, the median of repeated runs, quartiles, and
 * cases timed with their runs interleaved (timing.c). */
#ifndef UATTN_PERF_TIMING_H
#define UATTN_PERF_TIMING_H

#include <stdlib.h>
#include <time.h>

/* The most cases and runs perf_time_interleaved takes. */
enum { PERF_MAX_CASES = 32, PERF_MAX_RUNS = 128 };

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

/* CPU seconds the calling thread has run: a single-threaded measurement without the time it waited for a
 * core (cache and memory contention still show). */
static inline double perf_thread_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
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

/* The median of n <= PERF_MAX_RUNS samples, left as they are. */
double perf_median_of(const double *x, int n);

/* The quartiles of n <= PERF_MAX_RUNS samples (q[1] the median's upper middle for even n), left as they are. */
void perf_quartiles(const double *x, int n, double q[3]);

/* Seconds per call of fn(arg[s], i) for n <= PERF_MAX_CASES cases: each case's calls a run calibrated to at
 * least 20 ms, then `runs` (<= PERF_MAX_RUNS) runs with the cases interleaved (case 0, 1, ..., 0, 1, ...) so
 * that all see the same machine: on a shared host its speed drifts by tens of % within a minute. seconds[s]:
 * the median run's (the upper middle for even runs); raw (or NULL): every run's, case by case, in run order.
 * now: the clock (perf_seconds, or perf_thread_cpu_seconds on a loaded host). */
void perf_time_interleaved(void (*fn)(void *, long), int n, void *const arg[], int runs, double (*now)(void),
                           double seconds[], double (*raw)[PERF_MAX_RUNS]);

#endif
