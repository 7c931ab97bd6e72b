/* fail_with (fail.h): step.c, npy.c and uattn-sweep's workload all refuse input in one caller-owned line. */
#include "support/fail.h"

#include <stdarg.h>
#include <stdio.h>

int fail_with(char *why, size_t cap, const char *fmt, ...) {
  if (why && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
  }
  return -1;
}
