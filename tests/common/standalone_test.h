/* The part of Criterion's API that tests/threads/test_runtime/ uses, for a build without Criterion: under
 * ThreadSanitizer, Criterion 2.4 aborts before running anything ("Could not initialize inheritable arena",
 * Criterion issue #274: its sandbox maps memory at random fixed addresses that TSan reserves), so the
 * TSan check of the runtime runs the same test bodies through this instead.
 *
 * As in Criterion, every test runs in a forked child, so environment variables and thread bindings do not
 * leak between tests; a failed assertion prints its message and ends the child with status 1. A child that
 * TSan found a race in ends with TSan's exit code (66). Usage: <binary> [substring of suite/name]. The
 * list of tests and main() are in standalone_test.c, built into the standalone support library. */
#ifndef UATTN_STANDALONE_TEST_H
#define UATTN_STANDALONE_TEST_H

#include "common/standalone_assert.h"

struct st_suite {
  void (*init)(void);
  void (*fini)(void);
};

/* Adds a test to the list main() runs (the Test macro's constructor calls it). */
void st_register(const char *suite, const char *name, const struct st_suite *config, void (*body)(void));

/* A suite must be declared (TestSuite) once, in any one of the files that hold its tests. */
#define TestSuite(suite, ...) const struct st_suite st_suite_##suite = {__VA_ARGS__}
#define Test(suite, name, ...)                                                                                         \
  extern const struct st_suite st_suite_##suite;                                                                       \
  static void st_body_##suite##_##name(void);                                                                          \
  __attribute__((constructor)) static void st_register_##suite##_##name(void) {                                        \
    st_register(#suite, #name, &st_suite_##suite, st_body_##suite##_##name);                                           \
  }                                                                                                                    \
  static void st_body_##suite##_##name(void)

#endif
