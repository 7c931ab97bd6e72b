/* Criterion's assertions without Criterion, for code built into the standalone ThreadSanitizer tests
 * (standalone_test.h, which includes this; and the shared helpers such as attention_case.c, which include
 * it in place of <criterion/criterion.h> when UATTN_TEST_STANDALONE is defined). A failed assertion prints
 * its message and ends the process (each test runs in a forked child) with status 1. */
#ifndef UATTN_STANDALONE_ASSERT_H
#define UATTN_STANDALONE_ASSERT_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* unused: a file may include this and assert nothing */
__attribute__((unused, noreturn)) static void st_fail(const char *file, int line, const char *cond, const char *fmt,
                                                      ...) {
  fprintf(stderr, "  %s:%d: assertion failed: %s\n", file, line, cond);
  if (fmt[0]) {
    va_list ap;
    va_start(ap, fmt);
    fputs("  ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
  exit(1);
}

/* "" __VA_ARGS__: the optional message is a string literal followed by its arguments */
#define cr_assert(cond, ...)                                                                                           \
  do {                                                                                                                 \
    if (!(cond)) st_fail(__FILE__, __LINE__, #cond, "" __VA_ARGS__);                                                   \
  } while (0)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_not(cond, ...) cr_assert(!(cond), __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)
#define cr_skip_test(...)                                                                                              \
  do {                                                                                                                 \
    fprintf(stderr, "  skipped: " __VA_ARGS__);                                                                        \
    fputc('\n', stderr);                                                                                               \
    exit(0);                                                                                                           \
  } while (0)

#endif
