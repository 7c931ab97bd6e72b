/* uattn-bench --plot: a PNG bar chart drawn by gnuplot, one pair of bars (one thread, all threads) per case,
 * and a second pair for the cases that have a fraction of the bf16 dot-product peak. */
#ifndef UATTN_PERF_BENCH_PLOT_H
#define UATTN_PERF_BENCH_PLOT_H

typedef struct bench_bar {
  const char *label;
  double frac_1, frac_all; /* of the case's limit */
  double dot_1, dot_all;   /* of the bf16 dot peak; negative: not measured against it */
} bench_bar;

/* 1 when an executable gnuplot is on PATH. */
int bench_plot_available(void);

/* Writes the chart to png (a path without quotes or newlines). Returns 0, or -1 after saying why on stderr. */
int bench_plot(const char *png, const char *title, const bench_bar *bars, int n);

#endif
