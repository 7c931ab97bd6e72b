/* The part of Criterion's API that tests/threads/test_runtime.c uses, for a build without Criterion: under
 * ThreadSanitizer, Criterion 2.4 aborts before running anything ("Could not initialize inheritable arena",
 * Criterion issue #274: its sandbox maps memory at random fixed addresses that TSan reserves), so the
 * TSan check of the runtime runs the same test bodies through this instead.
 *
 * As in Criterion, every test runs in a forked child, so environment variables and thread bindings do not
 * leak between tests; a failed assertion prints its message and ends the child with status 1. A child that
 * TSan found a race in ends with TSan's exit code (66). Usage: <binary> [substring of suite/name]. Include
 * once, in the test file: it defines main(). */
#ifndef UATTN_STANDALONE_TEST_H
#define UATTN_STANDALONE_TEST_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/standalone_assert.h"

struct st_suite {
  void (*init)(void);
  void (*fini)(void);
};

typedef struct st_test {
  const char *suite, *name;
  const struct st_suite *config;
  void (*body)(void);
} st_test;

static st_test st_tests[512];
static int st_count;

static void st_register(const char *suite, const char *name, const struct st_suite *config, void (*body)(void)) {
  if (st_count < (int)(sizeof st_tests / sizeof *st_tests)) st_tests[st_count++] = (st_test){suite, name, config, body};
}

/* A suite must be declared (TestSuite) before its tests, as test_runtime.c does. */
#define TestSuite(suite, ...) static const struct st_suite st_suite_##suite = {__VA_ARGS__}
#define Test(suite, name, ...)                                                                                         \
  static void st_body_##suite##_##name(void);                                                                          \
  __attribute__((constructor)) static void st_register_##suite##_##name(void) {                                        \
    st_register(#suite, #name, &st_suite_##suite, st_body_##suite##_##name);                                           \
  }                                                                                                                    \
  static void st_body_##suite##_##name(void)

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  int run = 0, failed = 0;
  for (int i = 0; i < st_count; i++) {
    const st_test *t = &st_tests[i];
    char full[256];
    snprintf(full, sizeof full, "%s::%s", t->suite, t->name);
    if (filter && !strstr(full, filter)) continue;
    run++;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      if (t->config->init) t->config->init();
      t->body();
      if (t->config->fini) t->config->fini();
      exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) failed++;
    if (WIFSIGNALED(status))
      fprintf(stderr, "[FAIL] %s (signal %d)\n", full, WTERMSIG(status));
    else
      fprintf(stderr, "[%s] %s%s\n", ok ? "PASS" : "FAIL", full,
              WIFEXITED(status) && WEXITSTATUS(status) == 66 ? " (ThreadSanitizer report)" : "");
  }
  fprintf(stderr, "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d\n", run, run - failed, failed);
  return failed ? 1 : 0;
}

#endif
