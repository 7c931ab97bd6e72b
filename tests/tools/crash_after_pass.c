/* A Criterion suite for run_suite_check.sh: after_pass::dies passes, then its process dies of SIGSEGV in its
 * teardown, every time (CRASH_ALWAYS) or only when the file CRASH_ONCE names does not exist yet (it is made). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void die_after(void) {
  const char *once = getenv("CRASH_ONCE");
  if (once && access(once, F_OK) != 0) {
    FILE *f = fopen(once, "w");
    if (f) fclose(f);
    raise(SIGSEGV);
  }
  if (getenv("CRASH_ALWAYS")) raise(SIGSEGV);
}

Test(after_pass, dies, .fini = die_after) { cr_assert(1); }
Test(after_pass, other) { cr_assert(getenv("FAIL_OTHER") == NULL, "FAIL_OTHER is set"); }
