/* The runner of the tests written against standalone_test.h: each test registered by its constructor, then
 * main() runs the ones whose suite::name holds the filter, each in a forked child. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/standalone_test.h"

typedef struct st_test {
  const char *suite, *name;
  const struct st_suite *config;
  void (*body)(void);
} st_test;

static st_test st_tests[512];
static int st_count;

void st_register(const char *suite, const char *name, const struct st_suite *config, void (*body)(void)) {
  if (st_count < (int)(sizeof st_tests / sizeof *st_tests)) st_tests[st_count++] = (st_test){suite, name, config, body};
}

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
