/* libFuzzer target: the step runner's reading (support/step.c: STEP.json, then the .npy tensors it names,
 * through support/npy.c). The input is STEP.json's text, then a NUL byte, then the bytes of a file x.npy; the
 * other tensors a step may name (q.npy, k.npy, v.npy, kc.npy, vc.npy, heads.npy, and v2.npy, vc2.npy: values of
 * head_dim_v 2) are valid files written once at start-up, so a step that names them gets past the reading of its
 * tensors to the shape checks.
 * x.npy is also read on its own with npy_read, whose result must describe a readable array. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/npy.h"
#include "support/step.h"

static volatile uint8_t data_sum; /* keeps the reads of an array's data */
static char dir[] = "/tmp/uattn-fuzz-run-XXXXXX";
static char json_path[64], npy_path[64];
static const char *const fixed_names[] = {"q.npy",     "k.npy",  "v.npy",   "kc.npy", "vc.npy",
                                          "heads.npy", "v2.npy", "vc2.npy", "x.npy",  "STEP.json"};

static void remove_dir(void) {
  char path[96];
  for (size_t i = 0; i < sizeof fixed_names / sizeof *fixed_names; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, fixed_names[i]);
    unlink(path);
  }
  rmdir(dir);
}

/* The fixed tensors, in the shapes of the seed corpus's steps: T = 4 query rows, 2 query heads, 1 KV head,
 * head dim 4 (head_dim_v 2 for v2 and vc2), 4 blocks of 2 tokens, f32 and NHD. */
static void write_fixed(const char *name, npy_dtype dtype, int ndim, const int64_t *shape) {
  char path[96], err[256];
  size_t count = 1;
  for (int d = 0; d < ndim; d++) count *= (size_t)shape[d];
  void *zeros = calloc(count ? count : 1, 8);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!zeros || npy_write(path, dtype, ndim, shape, zeros, err, sizeof err)) {
    fprintf(stderr, "fuzz_step_runner: cannot write %s: %s\n", path, err);
    abort();
  }
  free(zeros);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (!mkdtemp(dir)) abort();
  atexit(remove_dir);
  snprintf(json_path, sizeof json_path, "%s/STEP.json", dir);
  snprintf(npy_path, sizeof npy_path, "%s/x.npy", dir);
  const int64_t q[] = {4, 2, 4}, kv[] = {4, 1, 4}, cache[] = {8, 1, 4}, heads[] = {2}, v2[] = {4, 1, 2},
                vc2[] = {8, 1, 2};
  write_fixed("q.npy", NPY_F4, 3, q);
  write_fixed("k.npy", NPY_F4, 3, kv);
  write_fixed("v.npy", NPY_F4, 3, kv);
  write_fixed("kc.npy", NPY_F4, 3, cache);
  write_fixed("vc.npy", NPY_F4, 3, cache);
  write_fixed("heads.npy", NPY_F4, 1, heads);
  write_fixed("v2.npy", NPY_F4, 3, v2);
  write_fixed("vc2.npy", NPY_F4, 3, vc2);
  return 0;
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  const size_t json_len = nul ? (size_t)(nul - data) : size;
  write_file(json_path, data, json_len);
  write_file(npy_path, nul ? nul + 1 : data, nul ? size - json_len - 1 : 0);

  npy_array a;
  char err[512];
  if (npy_read(npy_path, &a, err, sizeof err) == 0) {
    /* the array must hold count elements of its dtype: summing them lets ASan check that */
    const size_t bytes = a.count * npy_dtype_size(a.dtype);
    for (size_t i = 0; i < bytes; i++) data_sum += ((const uint8_t *)a.data)[i];
    npy_free(&a);
  } else if (!err[0]) {
    fprintf(stderr, "fuzz_step_runner: npy_read refused the file without a reason\n");
    abort();
  }

  step s;
  char why[2048];
  const int rc = step_read(&s, json_path, why, sizeof why);
  step_free(&s);
  if (rc != 0 && !why[0]) {
    fprintf(stderr, "fuzz_step_runner: the step was refused without a reason\n");
    abort();
  }
  return 0;
}
