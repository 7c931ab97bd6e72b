/* The .npy reader and writer (support/npy.c): round trips of every dtype and of odd shapes, every spelling of
 * a header NumPy could write, NumPy's own files, and malformed files and bad arguments refused with a reason,
 * no file and no leak. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "step_runner.h"
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define CHECK_NO_LEAKS() cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "leaked memory")
#else
#define CHECK_NO_LEAKS() ((void)0)
#endif

/* ---- npy: round trips ------------------------------------------------------------------------------------ */

static void round_trip(npy_dtype dtype, int ndim, const int64_t *shape) {
  const size_t item = npy_dtype_size(dtype);
  size_t count = 1;
  for (int d = 0; d < ndim; d++) count *= (size_t)shape[d];
  unsigned char *data = malloc(count * item + 1);
  test_rng rng = {(uint64_t)dtype * 1000 + (uint64_t)ndim};
  for (size_t i = 0; i < count * item; i++) data[i] = (unsigned char)test_rng_next(&rng);
  const char *path = in_scratch("rt.npy");
  char err[256] = "";
  cr_assert_eq(npy_write(path, dtype, ndim, shape, count ? data : NULL, err, sizeof err), 0, "write: %s", err);

  /* NumPy's layout: the preamble is a multiple of 64 bytes and the header ends in a newline */
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(((size_t)st.st_size - count * item) % 64, 0, "preamble of %zu bytes", (size_t)st.st_size);
  FILE *f = fopen(path, "rb");
  unsigned char pre[10];
  cr_assert_eq(fread(pre, 1, 10, f), 10);
  fclose(f);
  cr_assert(memcmp(pre, "\x93NUMPY\x01\x00", 8) == 0);

  npy_array a;
  cr_assert_eq(npy_read(path, &a, err, sizeof err), 0, "read: %s", err);
  cr_assert_eq(a.dtype, dtype);
  cr_assert_eq(a.ndim, ndim);
  for (int d = 0; d < ndim; d++) cr_assert_eq(a.shape[d], shape[d]);
  cr_assert_eq(a.count, count);
  cr_assert_not_null(a.data);
  cr_assert(memcmp(a.data, data, count * item) == 0, "%s data differs", npy_dtype_descr(dtype));
  npy_free(&a);
  cr_assert_null(a.data);
  npy_free(&a); /* twice is fine */
  free(data);
}

Test(npy, round_trip_every_dtype_and_shape) {
  const npy_dtype dtypes[] = {NPY_F4, NPY_U2, NPY_F2, NPY_I4, NPY_I8};
  const int64_t s1[] = {7}, s2[] = {3, 5}, s3[] = {2, 3, 4}, s4[] = {2, 1, 3, 2}, s0[] = {4, 0, 3};
  int64_t s32[NPY_MAX_DIMS];
  for (int d = 0; d < NPY_MAX_DIMS; d++) s32[d] = 1 + (d == 5);
  for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++) {
    round_trip(dtypes[i], 0, NULL); /* a scalar: one element */
    round_trip(dtypes[i], 1, s1);
    round_trip(dtypes[i], 2, s2);
    round_trip(dtypes[i], 3, s3);
    round_trip(dtypes[i], 4, s4);
    round_trip(dtypes[i], 3, s0); /* empty */
    round_trip(dtypes[i], NPY_MAX_DIMS, s32);
  }
  cr_assert_str_eq(npy_dtype_descr(NPY_U2), "<u2");
  cr_assert_eq(npy_dtype_size(NPY_I8), 8);
  CHECK_NO_LEAKS();
}

Test(npy, accepts_every_spelling_numpy_could_write) {
  const float x[6] = {1, 2, 3, 4, 5, 6};
  struct {
    int major;
    const char *header;
    int ndim;
    int64_t d0;
  } ok[] = {
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }          \n", 2, 2},
      {1, "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (6,)}", 1, 6},
      {1, "{'shape':(2,3,),'fortran_order':False,'descr':'<f4'}", 2, 2},
      {1, "\n { 'descr' : '<f4' ,\t'fortran_order' : False , 'shape' : ( 3 , 2 ) , } \n", 2, 3},
      {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 6), }\n", 2, 1},
      {3, "{'descr': '<f4', 'fortran_order': False, 'shape': (6, 1, 1), }\n", 3, 6},
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    raw_npy(in_scratch("ok.npy"), ok[i].major, ok[i].header, x, sizeof x);
    npy_array a;
    char err[256] = "";
    cr_assert_eq(npy_read(in_scratch("ok.npy"), &a, err, sizeof err), 0, "case %zu: %s", i, err);
    cr_assert_eq(a.ndim, ok[i].ndim, "case %zu", i);
    cr_assert_eq(a.shape[0], ok[i].d0, "case %zu", i);
    cr_assert_eq(a.count, 6);
    cr_assert(memcmp(a.data, x, sizeof x) == 0);
    npy_free(&a);
  }
  raw_npy(in_scratch("scalar.npy"), 1, "{'descr': '<i8', 'fortran_order': False, 'shape': ()}", "\x2a\0\0\0\0\0\0\0",
          8);
  npy_array a;
  char err[256];
  cr_assert_eq(npy_read(in_scratch("scalar.npy"), &a, err, sizeof err), 0, "%s", err);
  cr_assert_eq(a.ndim, 0);
  cr_assert_eq(a.count, 1);
  cr_assert_eq(((int64_t *)a.data)[0], 42);
  npy_free(&a);
  CHECK_NO_LEAKS();
}

/* A file of these n bytes at path is refused by npy_read with a message that says needle. */
static void expect_file_refused(const char *path, const void *bytes, size_t n, const char *needle) {
  char err[512];
  npy_array a;
  write_bytes(path, bytes, n);
  cr_assert_eq(npy_read(path, &a, err, sizeof err), -1);
  cr_assert(strstr(err, needle), "%s", err);
}

Test(npy, refuses_malformed_files_with_a_reason_and_no_leak) {
  const unsigned char data[64] = {0};
  struct {
    const char *header;
    size_t bytes; /* of data after the header */
    const char *why;
  } bad[] = {
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, "fortran_order is True"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, "big-endian"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16, "'<f8' is not supported"},
      {"{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", 2, "not supported"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, "structured"},
      {"{'descr': '<f4', 'fortran_order': False}", 8, "missing key 'shape'"},
      {"{'fortran_order': False, 'shape': (2,)}", 8, "missing key 'descr'"},
      {"{'descr': '<f4', 'shape': (2,)}", 8, "missing key 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", 8, "unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "appears twice"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", 8, "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", 8, "must be a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", 8, "negative"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}", 8, "other than an integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", 8, "expected ',' or ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 8, "overflows"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}", 8, "overflow"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", 8, "True or False"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", 8, "True or False"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", 8, "expected '}' after a value"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "expected ':' after a key"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", 8, "ends where '}' was expected"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", 8, "expected '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", 8, "after the dict"},
      {"{'descr': 'a\\'b', 'fortran_order': False, 'shape': (2,)}", 8, "escape"},
      {"{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "quoted string"},
      {"['descr', '<f4']", 8, "expected '{'"},
      {"", 8, "ends where '{' was expected"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", 8, "truncated data"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 8, "4 bytes after the data"},
  };
  const char *path = in_scratch("bad.npy");
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    raw_npy(path, 1, bad[i].header, data, bad[i].bytes);
    npy_array a;
    memset(&a, 0xab, sizeof a);
    char err[512] = "";
    cr_assert_eq(npy_read(path, &a, err, sizeof err), -1, "case %zu accepted: %s", i, bad[i].header);
    cr_assert(strstr(err, bad[i].why), "case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].why);
    cr_assert_null(a.data, "case %zu", i);
    cr_assert_eq(a.count, 0, "case %zu", i);
  }

  /* damage before the header */
  char err[512];
  npy_array a;
  expect_file_refused(path, "", 0, "not a .npy file");
  expect_file_refused(path, "\x93NUMPX\x01\x00\x10\x00{}", 12, "not a .npy file");
  expect_file_refused(path, "\x93NUMPY\x04\x00\x10\x00{}", 12, "version 4.0");
  expect_file_refused(path, "\x93NUMPY\x01\x00\x40\x00{'descr'", 17, "truncated header");
  expect_file_refused(path, "\x93NUMPY\x02\x00\xff\xff\xff\x7f{", 13, "implausible");
  cr_assert_eq(npy_read(in_scratch("absent.npy"), &a, err, sizeof err), -1);
  cr_assert(strstr(err, "cannot open: No such file"), "%s", err);
  CHECK_NO_LEAKS();
}

Test(npy, write_refuses_bad_arguments_and_leaves_no_file) {
  char err[256];
  const int64_t neg[] = {2, -1}, ok[] = {2, 2};
  const float x[4] = {0};
  cr_assert_eq(npy_write(in_scratch("a.npy"), NPY_F4, 2, neg, x, err, sizeof err), -1);
  cr_assert(strstr(err, "negative"), "%s", err);
  cr_assert_eq(npy_write(in_scratch("a.npy"), NPY_F4, NPY_MAX_DIMS + 1, ok, x, err, sizeof err), -1);
  cr_assert_eq(npy_write(in_scratch("a.npy"), NPY_F4, 2, ok, NULL, err, sizeof err), -1);
  cr_assert(strstr(err, "no data"), "%s", err);
  cr_assert_eq(npy_write(in_scratch("a.npy"), (npy_dtype)9, 2, ok, x, err, sizeof err), -1);
  cr_assert_not(file_exists(in_scratch("a.npy")));
  cr_assert_eq(npy_write(in_scratch("no/such/dir.npy"), NPY_F4, 2, ok, x, err, sizeof err), -1);
  cr_assert(strstr(err, "cannot create"), "%s", err);
  CHECK_NO_LEAKS();
}

/* NumPy reads what we write, and we read what NumPy writes, v2 included; it also makes the files we must
 * refuse (Fortran order, big-endian) the way real dumps would have them. */
Test(npy, interoperates_with_numpy) {
  const char *py = test_env("UATTN_PYTHON", "/usr/bin/python3");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", py);
  if (system(cmd) != 0) cr_skip_test("no numpy in %s", py);
  const int32_t ours[6] = {1, -2, 3, -4, 5, 2147483647};
  const int64_t shape[] = {2, 3};
  char err[256];
  cr_assert_eq(npy_write(in_scratch("ours.npy"), NPY_I4, 2, shape, ours, err, sizeof err), 0, "%s", err);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && %s -c '\n"
           "import numpy as np\n"
           "a = np.load(\"ours.npy\")\n"
           "assert a.dtype == np.int32 and a.shape == (2, 3) and a.tolist() == [[1, -2, 3], [-4, 5, 2147483647]], a\n"
           "b = np.arange(24, dtype=np.float16).reshape(2, 3, 4) / 8\n"
           "with open(\"v2.npy\", \"wb\") as f: np.lib.format.write_array(f, b, version=(2, 0))\n"
           "np.save(\"bf.npy\", (np.arange(5, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16))\n"
           "np.save(\"i8.npy\", np.array([-1, 2**40], dtype=np.int64))\n"
           "np.save(\"fortran.npy\", np.asfortranarray(np.ones((2, 3), np.float32)))\n"
           "np.save(\"big.npy\", np.ones(3, dtype=\">f4\"))\n"
           "np.save(\"f8.npy\", np.ones(3))\n"
           "'",
           scratch, py);
  cr_assert_eq(system(cmd), 0, "numpy side failed");

  npy_array a;
  cr_assert_eq(npy_read(in_scratch("v2.npy"), &a, err, sizeof err), 0, "%s", err);
  cr_assert_eq(a.dtype, NPY_F2);
  cr_assert_eq(a.ndim, 3);
  cr_assert_eq(a.shape[2], 4);
  cr_assert_eq(((uint16_t *)a.data)[8], 0x3c00); /* 8 / 8 = 1.0 in binary16 */
  npy_free(&a);
  cr_assert_eq(npy_read(in_scratch("bf.npy"), &a, err, sizeof err), 0, "%s", err);
  cr_assert_eq(a.dtype, NPY_U2);
  cr_assert_eq(((uint16_t *)a.data)[1], 0x3f80); /* bf16 1.0 */
  npy_free(&a);
  cr_assert_eq(npy_read(in_scratch("i8.npy"), &a, err, sizeof err), 0, "%s", err);
  cr_assert_eq(((int64_t *)a.data)[1], (int64_t)1 << 40);
  npy_free(&a);
  cr_assert_eq(npy_read(in_scratch("fortran.npy"), &a, err, sizeof err), -1);
  cr_assert(strstr(err, "fortran_order"), "%s", err);
  cr_assert_eq(npy_read(in_scratch("big.npy"), &a, err, sizeof err), -1);
  cr_assert(strstr(err, "big-endian"), "%s", err);
  cr_assert_eq(npy_read(in_scratch("f8.npy"), &a, err, sizeof err), -1);
  cr_assert(strstr(err, "'<f8' is not supported"), "%s", err);
  CHECK_NO_LEAKS();
}
