/* The step runner suite's scratch directory (step_runner.h): one per test, made by both suites' init and
 * removed by their fini, and the files the tests write there. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "step_runner.h"
/* ---- a scratch directory per test (each test is its own process) ---------------------------------------- */

char scratch[512];

static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char child[1024];
      snprintf(child, sizeof child, "%s/%s", path, e->d_name);
      remove_tree(child);
    }
    closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

static void setup(void) {
  snprintf(scratch, sizeof scratch, "%s/uattn-step-runner-XXXXXX", test_env("TMPDIR", "/tmp"));
  cr_assert_not_null(mkdtemp(scratch), "mkdtemp: %s", strerror(errno));
}

/* UATTN_KEEP_SCRATCH=1 keeps each test's files (the step, the runner's outputs) for a look after a failure */
static void teardown(void) {
  if (!scratch[0]) return;
  if (*test_env("UATTN_KEEP_SCRATCH", ""))
    fprintf(stderr, "kept %s\n", scratch);
  else
    remove_tree(scratch);
}

const char *in_scratch(const char *name) {
  static char path[4][1024];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, sizeof path[0], "%s/%s", scratch, name);
  return p;
}

void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "cannot create %s", path);
  cr_assert_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* A skipped test gets no fini, so the runner's suite skips before it makes its directory. */
static void setup_runner(void) {
  const char *p = getenv("UATTN_RUN");
  if (!p || !*p) cr_skip_test("UATTN_RUN (the uattn-run binary) is not set: the runner is not built here");
  cr_assert_eq(access(p, X_OK), 0, "UATTN_RUN=%s is not an executable", p);
  setup();
}

TestSuite(npy, .init = setup, .fini = teardown);
TestSuite(step_runner, .init = setup_runner, .fini = teardown);

void raw_npy(const char *path, int major, const char *header, const void *data, size_t bytes) {
  const size_t hlen = strlen(header), pre = major == 1 ? 10 : 12;
  unsigned char *buf = malloc(pre + hlen + bytes + 1);
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  for (size_t b = 0; b < pre - 8; b++) buf[8 + b] = (unsigned char)(hlen >> (8 * b));
  memcpy(buf + pre, header, hlen);
  if (bytes) memcpy(buf + pre + hlen, data, bytes);
  write_bytes(path, buf, pre + hlen + bytes);
  free(buf);
}
