#include "bench/plot.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int bench_plot_available(void) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char dir[4096];
  while (*path) {
    const size_t len = strcspn(path, ":");
    if (len > 0 && len + sizeof "/gnuplot" <= sizeof dir) {
      memcpy(dir, path, len);
      memcpy(dir + len, "/gnuplot", sizeof "/gnuplot");
      if (access(dir, X_OK) == 0) return 1;
    }
    path += len + (path[len] == ':');
  }
  return 0;
}

int bench_plot(const char *png, const char *title, const bench_bar *bars, int n) {
  double top = 1.0;
  int dot = 0; /* any bar against the bf16 dot peak: then its two series are drawn */
  for (int i = 0; i < n; i++) {
    top = bars[i].frac_1 > top ? bars[i].frac_1 : top;
    top = bars[i].frac_all > top ? bars[i].frac_all : top;
    dot |= bars[i].dot_1 >= 0 || bars[i].dot_all >= 0;
  }
  const int width = (dot ? n * 80 : n * 48) + 300 > 900 ? (dot ? n * 80 : n * 48) + 300 : 900;
  /* a gnuplot that dies early must not kill the benchmark with SIGPIPE: its status says what happened */
  void (*old)(int) = signal(SIGPIPE, SIG_IGN);
  FILE *gp = popen("gnuplot", "w");
  if (!gp) {
    signal(SIGPIPE, old);
    fprintf(stderr, "uattn-bench: cannot start gnuplot\n");
    return -1;
  }
  fprintf(gp,
          "set terminal pngcairo size %d,640 font 'sans,9'\n"
          "set output '%s'\n"
          "set title \"%s\" noenhanced\n"
          "set style data histogram\nset style histogram clustered gap 1\n"
          "set style fill solid 0.85 border -1\nset boxwidth 0.9\n"
          "set ylabel 'fraction of the limit'\nset yrange [0:%.2f]\nset grid ytics\n"
          "set xtics rotate by 35 right scale 0 noenhanced\nset bmargin 12\nset lmargin 22\nset key top left\n"
          "set arrow from graph 0, first 1 to graph 1, first 1 nohead dashtype 2\n"
          "$bars << EOD\n",
          width, png, title, top * (dot ? 1.3 : 1.1)); /* with four bars, room for the key's four lines */
  for (int i = 0; i < n; i++) {
    fprintf(gp, "\"%s\" %.4f %.4f", bars[i].label, bars[i].frac_1, bars[i].frac_all);
    /* NaN: gnuplot leaves the bar out */
    if (dot && bars[i].dot_1 >= 0)
      fprintf(gp, " %.4f %.4f", bars[i].dot_1, bars[i].dot_all);
    else if (dot)
      fprintf(gp, " NaN NaN");
    fprintf(gp, "\n");
  }
  fprintf(gp,
          "EOD\nplot $bars using 2:xtic(1) title '1 thread' lc rgb '#4477aa', "
          "'' using 3 title 'all threads' lc rgb '#ee6677'");
  if (dot)
    fprintf(gp,
            ", '' using 4 title '1 thread, of the bf16 dot peak' lc rgb '#99bbdd', "
            "'' using 5 title 'all threads, of the bf16 dot peak' lc rgb '#f4b6c2'");
  fprintf(gp, "\n");
  const int status = pclose(gp);
  signal(SIGPIPE, old);
  if (status != 0) {
    fprintf(stderr, "uattn-bench: gnuplot failed (status %d) writing %s\n", status, png);
    return -1;
  }
  return 0;
}
