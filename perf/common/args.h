/* The command-line parsing the tools in perf/ share: options as "--name V" or "--name=V", and whole numbers
 * checked against their range (a stray character or an overflow is refused, never read as 0 or a prefix). */
#ifndef UATTN_PERF_ARGS_H
#define UATTN_PERF_ARGS_H

#include <stdbool.h>

/* Whether argument a is the option `name` ("--name" or "--name=V"). */
bool perf_is_option(const char *a, const char *name);

/* The value of argv[*i], an option perf_is_option matched: "--name=V"'s V, else the next argument (taken:
 * *i advances), else "" (missing). */
const char *perf_option_value(const char *name, int argc, char **argv, int *i);

/* s as a whole decimal number in [lo, hi] into *out: 0, or -1 (s NULL, empty, not a number, out of range). */
int perf_parse_int(const char *s, int lo, int hi, int *out);

#endif
