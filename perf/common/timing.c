#include "common/timing.h"

#include <string.h>

double perf_median_of(const double *x, int n) {
  double c[PERF_MAX_RUNS];
  memcpy(c, x, sizeof(double) * (size_t)n);
  return perf_median(c, n);
}

void perf_quartiles(const double *x, int n, double q[3]) {
  double c[PERF_MAX_RUNS];
  memcpy(c, x, sizeof(double) * (size_t)n);
  qsort(c, (size_t)n, sizeof *c, perf_compare_double);
  q[0] = c[n / 4], q[1] = c[n / 2], q[2] = c[(3 * n) / 4];
}

void perf_time_interleaved(void (*fn)(void *, long), int n, void *const arg[], int runs, double (*now)(void),
                           double seconds[], double (*raw)[PERF_MAX_RUNS]) {
  double t[PERF_MAX_CASES][PERF_MAX_RUNS];
  long calls[PERF_MAX_CASES];
  for (int s = 0; s < n; s++) calls[s] = 1;
  for (int s = 0; s < n; s++)
    for (;;) { /* calibrate */
      const double t0 = now();
      for (long i = 0; i < calls[s]; i++) fn(arg[s], i);
      if (now() - t0 > 0.02) break;
      calls[s] *= 2;
    }
  for (int r = 0; r < runs; r++)
    for (int s = 0; s < n; s++) {
      const double t0 = now();
      for (long i = 0; i < calls[s]; i++) fn(arg[s], i);
      t[s][r] = (now() - t0) / calls[s];
    }
  if (raw) memcpy(raw, t, sizeof t[0] * (size_t)n);
  for (int s = 0; s < n; s++) {
    qsort(t[s], (size_t)runs, sizeof *t[s], perf_compare_double);
    seconds[s] = t[s][runs / 2];
  }
}
