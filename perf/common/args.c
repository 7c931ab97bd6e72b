#include "common/args.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool perf_is_option(const char *a, const char *name) {
  const size_t len = strlen(name);
  return strncmp(a, name, len) == 0 && (a[len] == '\0' || a[len] == '=');
}

const char *perf_option_value(const char *name, int argc, char **argv, int *i) {
  const char *a = argv[*i] + strlen(name);
  if (*a == '=') return a + 1;
  return *i + 1 < argc ? argv[++*i] : "";
}

int perf_parse_int(const char *s, int lo, int hi, int *out) {
  if (!s) return -1;
  char *end = NULL;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (end == s || *end || errno || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}
