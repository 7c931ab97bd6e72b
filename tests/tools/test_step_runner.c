/* The step runner (perf/run/uattn_run.c) and its .npy reader/writer (support/npy.c).
 *
 * npy: round trips of every dtype and of odd shapes, NumPy's own files (when $UATTN_PYTHON has numpy),
 * every malformed header we could think of, each refused with its reason and without a leak.
 * uattn-run ($UATTN_RUN, the built binary): every kind of bad input exits 2 with one line naming the key or
 * file, and whole steps — f32; bf16 with an f16 HND cache, sinks, ALiBi, soft cap and a sliding window;
 * fp8 caches with scales; TILED caches; encoder — are compared with a dense attention computed here in
 * double, straight from the semantics (docs/design.md), never from the plan. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/npy.h"
#include "common/support.h"
#include "support/dense_oracle.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define CHECK_NO_LEAKS() cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "leaked memory")
#else
#define CHECK_NO_LEAKS() ((void)0)
#endif

/* ---- a scratch directory per test (each test is its own process) ---------------------------------------- */

static char scratch[512];

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

static const char *in_scratch(const char *name) {
  static char path[4][1024];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, sizeof path[0], "%s/%s", scratch, name);
  return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "cannot create %s", path);
  cr_assert_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

static bool file_exists(const char *path) {
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

/* A file with exactly this header text (NumPy pads; the reader must not need it). */
static void raw_npy(const char *path, int major, const char *header, const void *data, size_t bytes) {
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
  write_bytes(path, "", 0);
  cr_assert_eq(npy_read(path, &a, err, sizeof err), -1);
  cr_assert(strstr(err, "not a .npy file"), "%s", err);
  write_bytes(path, "\x93NUMPX\x01\x00\x10\x00{}", 12);
  cr_assert_eq(npy_read(path, &a, err, sizeof err), -1);
  cr_assert(strstr(err, "not a .npy file"), "%s", err);
  write_bytes(path, "\x93NUMPY\x04\x00\x10\x00{}", 12);
  cr_assert_eq(npy_read(path, &a, err, sizeof err), -1);
  cr_assert(strstr(err, "version 4.0"), "%s", err);
  write_bytes(path, "\x93NUMPY\x01\x00\x40\x00{'descr'", 17);
  cr_assert_eq(npy_read(path, &a, err, sizeof err), -1);
  cr_assert(strstr(err, "truncated header"), "%s", err);
  write_bytes(path, "\x93NUMPY\x02\x00\xff\xff\xff\x7f{", 13);
  cr_assert_eq(npy_read(path, &a, err, sizeof err), -1);
  cr_assert(strstr(err, "implausible"), "%s", err);
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

/* ---- the runner: a step, built here ------------------------------------------------------------------- */

enum { MAX_REQS = 4, MAX_COLS = 8 };

typedef struct spec {
  int32_t bs, nb, hq, hkv, d;
  const char *dtype, *cache_dtype, *layout, *attn;
  double scale, soft_cap;
  int32_t window;
  int nreq;
  int32_t nc[MAX_REQS], ns[MAX_REQS], np[MAX_REQS];
  int32_t table[MAX_REQS][MAX_COLS];
  int tlen[MAX_REQS];
  int32_t drafts[MAX_REQS][4];
  int ndrafts[MAX_REQS]; /* -1: no draft_tokens key */
  bool sinks, alibi;
  double k_scale, v_scale; /* fp8 caches; 0: no key in the JSON (the default, 1) */
  /* data, as exact values k/64 (|k| <= 128) so every dtype holds them exactly */
  int32_t T, qsl[MAX_REQS + 1], eff[MAX_REQS];
  float *q, *k, *v, *kc, *vc, sink[16], slope[16]; /* caches as [slot][h][d] whatever the layout */
} spec;

static int32_t scheduled(const spec *s, int r) {
  if (s->ndrafts[r] <= 0) return s->ns[r];
  int32_t n = 1;
  for (int i = 0; i < s->ndrafts[r]; i++) n += s->drafts[r][i] != -1;
  return n;
}

static float *random_exact(test_rng *rng, size_t n) {
  float *x = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) x[i] = (float)test_rng_range(rng, -128, 128) / 64.0f;
  return x;
}

static void spec_fill(spec *s, uint64_t seed) {
  test_rng rng = {seed};
  s->qsl[0] = 0;
  for (int r = 0; r < s->nreq; r++) {
    s->eff[r] = scheduled(s, r);
    s->qsl[r + 1] = s->qsl[r] + s->eff[r];
  }
  s->T = s->qsl[s->nreq];
  const size_t slots = (size_t)s->nb * s->bs;
  s->q = random_exact(&rng, (size_t)s->T * s->hq * s->d);
  s->k = random_exact(&rng, (size_t)s->T * s->hkv * s->d);
  s->v = random_exact(&rng, (size_t)s->T * s->hkv * s->d);
  s->kc = random_exact(&rng, slots * s->hkv * s->d);
  s->vc = random_exact(&rng, slots * s->hkv * s->d);
  for (int h = 0; h < s->hq; h++) {
    s->sink[h] = (float)test_rng_range(&rng, -64, 128) / 64.0f;
    s->slope[h] = 1.0f / (float)(2 << h);
  }
}

static void spec_free(spec *s) {
  free(s->q);
  free(s->k);
  free(s->v);
  free(s->kc);
  free(s->vc);
}

/* A shared prefix, a chunked prefill, a decode, a spec-decode verification with a placeholder, and a fresh
 * prompt: every path of the plan (causal, shared, unique) in one small f32 step. */
static spec base_spec(void) {
  spec s;
  memset(&s, 0, sizeof s);
  s.bs = 4, s.nb = 12, s.hq = 4, s.hkv = 2, s.d = 8;
  s.dtype = s.cache_dtype = "f32";
  s.layout = "NHD";
  s.attn = "decoder";
  s.scale = 0.3;
  s.nreq = 4;
  /* request 0: a prompt chunk at positions 8..10 over blocks 0, 1 (shared with request 1) */
  s.nc[0] = 8, s.ns[0] = 3, s.np[0] = 20, s.tlen[0] = 4;
  memcpy(s.table[0], (int32_t[]){0, 1, 2, 3}, 4 * sizeof(int32_t));
  /* request 1: a decode at position 13 */
  s.nc[1] = 13, s.ns[1] = 1, s.np[1] = 6, s.tlen[1] = 4;
  memcpy(s.table[1], (int32_t[]){0, 1, 4, 5}, 4 * sizeof(int32_t));
  /* request 2: verifies 2 drafts (the scheduler reports 4: the placeholder does not count) */
  s.nc[2] = 5, s.ns[2] = 4, s.np[2] = 3, s.tlen[2] = 3;
  memcpy(s.table[2], (int32_t[]){6, 7, 8}, 3 * sizeof(int32_t));
  s.ndrafts[2] = 3;
  memcpy(s.drafts[2], (int32_t[]){11, -1, 12}, 3 * sizeof(int32_t));
  /* request 3: a whole prompt */
  s.nc[3] = 0, s.ns[3] = 5, s.np[3] = 5, s.tlen[3] = 2;
  memcpy(s.table[3], (int32_t[]){9, 10}, 2 * sizeof(int32_t));
  s.ndrafts[0] = s.ndrafts[1] = s.ndrafts[3] = -1;
  return s;
}

static cJSON *ints(const int32_t *x, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(x[i]));
  return a;
}

static cJSON *spec_json(const spec *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "block_size", s->bs);
  cJSON_AddNumberToObject(o, "num_blocks", s->nb);
  cJSON_AddNumberToObject(o, "num_q_heads", s->hq);
  cJSON_AddNumberToObject(o, "num_kv_heads", s->hkv);
  cJSON_AddNumberToObject(o, "head_dim", s->d);
  cJSON_AddStringToObject(o, "dtype", s->dtype);
  cJSON_AddStringToObject(o, "cache_dtype", s->cache_dtype);
  cJSON_AddStringToObject(o, "kv_layout", s->layout);
  cJSON_AddNumberToObject(o, "scale", s->scale);
  cJSON_AddNumberToObject(o, "soft_cap", s->soft_cap);
  cJSON_AddNumberToObject(o, "sliding_window", s->window);
  cJSON_AddStringToObject(o, "attn_type", s->attn);
  if (s->k_scale > 0) cJSON_AddNumberToObject(o, "k_scale", s->k_scale);
  if (s->v_scale > 0) cJSON_AddNumberToObject(o, "v_scale", s->v_scale);
  cJSON *reqs = cJSON_AddArrayToObject(o, "requests");
  for (int r = 0; r < s->nreq; r++) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "num_computed", s->nc[r]);
    cJSON_AddNumberToObject(q, "num_scheduled", s->ns[r]);
    cJSON_AddNumberToObject(q, "num_prompt", s->np[r]);
    cJSON_AddItemToObject(q, "block_table", ints(s->table[r], s->tlen[r]));
    if (s->ndrafts[r] >= 0) cJSON_AddItemToObject(q, "draft_tokens", ints(s->drafts[r], s->ndrafts[r]));
    cJSON_AddItemToArray(reqs, q);
  }
  cJSON *t = cJSON_AddObjectToObject(o, "tensors");
  cJSON_AddStringToObject(t, "q", "q.npy");
  cJSON_AddStringToObject(t, "k", "k.npy");
  cJSON_AddStringToObject(t, "v", "v.npy");
  cJSON_AddStringToObject(t, "key_cache", "kc.npy");
  cJSON_AddStringToObject(t, "value_cache", "vc.npy");
  if (s->sinks) cJSON_AddStringToObject(t, "sinks", "sinks.npy");
  if (s->alibi) cJSON_AddStringToObject(t, "alibi_slopes", "alibi.npy");
  return o;
}

static uint16_t to_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  cr_assert_eq(b & 0xffffu, 0, "%g is not exact in bf16", x);
  return (uint16_t)(b >> 16);
}

static uint16_t to_f16(float x) { /* exact values only, which is all the test makes */
  uint32_t b;
  memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) == 0) return (uint16_t)(b >> 16);
  const int e = (int)((b >> 23) & 0xff) - 127 + 15;
  cr_assert(e > 0 && e < 31 && (b & 0x1fffu) == 0, "%g is not exact in f16", x);
  return (uint16_t)(((b >> 16) & 0x8000u) | (uint32_t)e << 10 | ((b & 0x7fffffu) >> 13));
}

static bool is_fp8(const char *dtype) { return !strncmp(dtype, "fp8_", 4); }

static uattn_dtype fp8_of(const char *dtype) { return !strcmp(dtype, "fp8_e4m3") ? UATTN_FP8_E4M3 : UATTN_FP8_E5M2; }

/* The fp8 code holding x / scale, for values that are exactly code * scale (all the fp8 test makes): the
 * expected cache is then exact, and so is the dense attention on the float values. */
static uint8_t to_fp8(float x, const char *dtype, float scale) {
  const uattn_dtype t = fp8_of(dtype);
  const uint8_t b = oracle_quantize_fp8(t, x, scale);
  cr_assert_eq(oracle_fp8_to_double(t, b) * scale, (double)x, "%g is not exact in %s times %g", x, dtype, scale);
  return b;
}

static npy_dtype npy_of(const char *dtype) {
  return is_fp8(dtype) ? NPY_U1 : !strcmp(dtype, "f32") ? NPY_F4 : !strcmp(dtype, "bf16") ? NPY_U2 : NPY_F2;
}

/* x in dtype, as the bytes a file holds (an fp8 cache's through its scale) */
static void *encode_scaled(const float *x, size_t n, const char *dtype, float scale) {
  if (is_fp8(dtype)) {
    uint8_t *y = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) y[i] = to_fp8(x[i], dtype, scale);
    return y;
  }
  if (!strcmp(dtype, "f32")) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
  }
  uint16_t *y = malloc(sizeof(uint16_t) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) y[i] = !strcmp(dtype, "bf16") ? to_bf16(x[i]) : to_f16(x[i]);
  return y;
}

static void *encode(const float *x, size_t n, const char *dtype) { return encode_scaled(x, n, dtype, 1.0f); }

/* Where (slot, KV head h, dim d) of a key cache (value false) or value cache (value true) lies in the spec's
 * layout, written from uattn.h's definitions: NHD [slots, Hkv, D], HND [blocks, Hkv, bs, D], TILED keys
 * [blocks, bs / 16, Hkv, D / 2, 16, 2] at (b, o / 16, h, d / 2, o % 16, d % 2) and values
 * [blocks, bs / 16, Hkv, 8, D, 2] at (b, o / 16, h, o % 16 / 2, d, o % 2), with b = slot / bs, o = slot % bs. */
static size_t layout_index(const spec *s, bool value, int64_t slot, int h, int d) {
  const size_t b = (size_t)(slot / s->bs), o = (size_t)(slot % s->bs), H = (size_t)s->hkv, D = (size_t)s->d;
  if (!strcmp(s->layout, "NHD")) return ((size_t)slot * H + (size_t)h) * D + (size_t)d;
  if (!strcmp(s->layout, "HND")) return ((b * H + (size_t)h) * (size_t)s->bs + o) * D + (size_t)d;
  const size_t tiles = (size_t)s->bs / 16, t = o / 16, i = o % 16;
  if (value) return (((((b * tiles + t) * H + (size_t)h) * 8 + i / 2) * D + (size_t)d) * 2) + i % 2;
  return ((((b * tiles + t) * H + (size_t)h) * (D / 2) + (size_t)d / 2) * 16 + i) * 2 + (size_t)d % 2;
}

/* The shape of a key or value cache in the spec's layout (as layout_index); its dimensions in *ndim. */
static void cache_shape(const spec *s, bool value, int64_t *shape, int *ndim) {
  if (!strcmp(s->layout, "NHD")) {
    shape[0] = (int64_t)s->nb * s->bs, shape[1] = s->hkv, shape[2] = s->d;
    *ndim = 3;
  } else if (!strcmp(s->layout, "HND")) {
    shape[0] = s->nb, shape[1] = s->hkv, shape[2] = s->bs, shape[3] = s->d;
    *ndim = 4;
  } else {
    const int64_t k[6] = {s->nb, s->bs / 16, s->hkv, s->d / 2, 16, 2}, v[6] = {s->nb, s->bs / 16, s->hkv, 8, s->d, 2};
    memcpy(shape, value ? v : k, sizeof k);
    *ndim = 6;
  }
}

/* a [slot][h][d] key (value false) or value cache in the spec's layout and dtype; scale: an fp8 cache's
 * k_scale or v_scale */
static void *encode_cache(const spec *s, const float *c, double scale, bool value, int64_t *shape, int *ndim) {
  const size_t n = (size_t)s->nb * s->bs * s->hkv * s->d;
  float *perm = malloc(sizeof(float) * n);
  for (int64_t slot = 0; slot < (int64_t)s->nb * s->bs; slot++)
    for (int h = 0; h < s->hkv; h++)
      for (int d = 0; d < s->d; d++)
        perm[layout_index(s, value, slot, h, d)] = c[((size_t)slot * s->hkv + h) * s->d + d];
  cache_shape(s, value, shape, ndim);
  void *out = encode_scaled(perm, n, s->cache_dtype, scale > 0 ? (float)scale : 1.0f);
  free(perm);
  return out;
}

static void save(const char *name, npy_dtype dtype, int ndim, const int64_t *shape, const void *data) {
  char err[256];
  cr_assert_eq(npy_write(in_scratch(name), dtype, ndim, shape, data, err, sizeof err), 0, "%s: %s", name, err);
}

static void save_encoded(const char *name, const char *dtype, int ndim, const int64_t *shape, const float *x) {
  size_t n = 1;
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
  void *e = encode(x, n, dtype);
  save(name, npy_of(dtype), ndim, shape, e);
  free(e);
}

static void write_json_file(const char *name, const cJSON *root) {
  char *text = cJSON_Print(root);
  write_text(in_scratch(name), text);
  cJSON_free(text);
}

/* The step's files in the scratch directory: step.json and its tensors. */
static void spec_write(const spec *s) {
  const int64_t qs[] = {s->T, s->hq, s->d}, ks[] = {s->T, s->hkv, s->d}, hs[] = {s->hq};
  save_encoded("q.npy", s->dtype, 3, qs, s->q);
  save_encoded("k.npy", s->dtype, 3, ks, s->k);
  save_encoded("v.npy", s->dtype, 3, ks, s->v);
  int64_t kshape[6], vshape[6];
  int nd;
  void *kc = encode_cache(s, s->kc, s->k_scale, false, kshape, &nd),
       *vc = encode_cache(s, s->vc, s->v_scale, true, vshape, &nd);
  save("kc.npy", npy_of(s->cache_dtype), nd, kshape, kc);
  save("vc.npy", npy_of(s->cache_dtype), nd, vshape, vc);
  free(kc);
  free(vc);
  if (s->sinks) save("sinks.npy", NPY_F4, 1, hs, s->sink);
  if (s->alibi) save("alibi.npy", NPY_F4, 1, hs, s->slope);
  cJSON *j = spec_json(s);
  write_json_file("step.json", j);
  cJSON_Delete(j);
}

/* ---- running the binary --------------------------------------------------------------------------------- */

typedef struct result {
  int rc;
  char err[8192];
  char out[4096];
} result;

static void slurp(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(path, "rb");
  if (!f) return;
  const size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* Runs uattn-run with args (NULL-terminated), its output captured. */
static result run_tool(const char *const *args) {
  const char *exe = getenv("UATTN_RUN"); /* checked by setup_runner */
  const char *argv[32] = {exe};
  int n = 1;
  while (args[n - 1] && n < 31) argv[n] = args[n - 1], n++;
  argv[n] = NULL;
  char out_path[1024], err_path[1024];
  snprintf(out_path, sizeof out_path, "%s/.stdout", scratch);
  snprintf(err_path, sizeof err_path, "%s/.stderr", scratch);
  fflush(NULL);
  const pid_t pid = fork();
  cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
  if (pid == 0) {
    const int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(127);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  slurp(err_path, r.err, sizeof r.err);
  slurp(out_path, r.out, sizeof r.out);
  return r;
}

static result run_step(const char *extra) {
  const char *args[] = {in_scratch("step.json"), "--out", in_scratch("out"), extra, NULL};
  return run_tool(args);
}

/* Exit status 2 and exactly one line on stderr, "uattn-run: ..." holding every fragment given. */
static void expect_error(const result *r, const char *what, const char *frag1, const char *frag2) {
  cr_assert_eq(r->rc, 2, "%s: exit %d, stderr: %s", what, r->rc, r->err);
  const char *nl = strchr(r->err, '\n');
  cr_assert(nl && nl[1] == '\0', "%s: not one line: %s", what, r->err);
  cr_assert(!strncmp(r->err, "uattn-run: ", 11), "%s: %s", what, r->err);
  cr_assert(strstr(r->err, frag1), "%s: \"%s\" not in: %s", what, frag1, r->err);
  if (frag2) cr_assert(strstr(r->err, frag2), "%s: \"%s\" not in: %s", what, frag2, r->err);
}

/* Writes the base step with one change to its JSON, runs it, expects the error. */
typedef void (*mutation)(cJSON *root);

static void expect_json_error(mutation m, const char *what, const char *frag1, const char *frag2) {
  spec s = base_spec();
  spec_fill(&s, 1);
  spec_write(&s);
  cJSON *j = spec_json(&s);
  m(j);
  write_json_file("step.json", j);
  cJSON_Delete(j);
  const result r = run_step(NULL);
  expect_error(&r, what, frag1, frag2);
  spec_free(&s);
}

/* ---- the runner: bad input --------------------------------------------------------------------------- */

Test(step_runner, usage_errors_exit_2) {
  const char *none[] = {NULL};
  result r = run_tool(none);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "missing STEP.json") && strstr(r.err, "usage: uattn-run"), "%s", r.err);
  const char *no_out[] = {"x.json", NULL};
  r = run_tool(no_out);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "missing --out"), "%s", r.err);
  const char *unknown[] = {"x.json", "--out", "o", "--fast", NULL};
  r = run_tool(unknown);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "unknown option --fast"), "%s", r.err);
  const char *repeat[] = {"x.json", "--out", "o", "--repeat", "0", NULL};
  r = run_tool(repeat);
  cr_assert_eq(r.rc, 2);
  cr_assert(strstr(r.err, "--repeat"), "%s", r.err);
  const char *help[] = {"--help", NULL};
  r = run_tool(help);
  cr_assert_eq(r.rc, 0);
  cr_assert(strstr(r.out, "usage: uattn-run STEP.json --out DIR"), "%s", r.out);
}

Test(step_runner, missing_or_malformed_json_file) {
  const char *args[] = {in_scratch("absent.json"), "--out", in_scratch("out"), NULL};
  result r = run_tool(args);
  expect_error(&r, "absent", "absent.json: cannot open", NULL);
  write_text(in_scratch("step.json"), "{\"block_size\": 4,\n  \"num_blocks\": ,\n}");
  r = run_step(NULL);
  expect_error(&r, "malformed", "step.json: malformed JSON at line 2", NULL);
  write_text(in_scratch("step.json"), "{\"block_size\": 4} trailing");
  r = run_step(NULL);
  expect_error(&r, "trailing", "malformed JSON", NULL);
  write_text(in_scratch("step.json"), "[1, 2]");
  r = run_step(NULL);
  expect_error(&r, "array", "top level must be a JSON object", NULL);
  cr_assert_not(file_exists(in_scratch("out/out.npy")));
}

static const char *removed_key;
static void remove_key(cJSON *root) { cJSON_DeleteItemFromObjectCaseSensitive(root, removed_key); }

Test(step_runner, every_missing_required_key_is_named) {
  const char *required[] = {"block_size",     "num_blocks",  "num_q_heads", "num_kv_heads", "head_dim",
                            "dtype",          "cache_dtype", "kv_layout",   "scale",        "soft_cap",
                            "sliding_window", "attn_type",   "requests",    "tensors"};
  for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
    removed_key = required[i];
    char want[128];
    snprintf(want, sizeof want, "uattn-run: %s: missing required key", required[i]);
    expect_json_error(remove_key, required[i], want, NULL);
  }
}

static void drop_block_table(cJSON *root) {
  cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 1), "block_table");
}
static void drop_value_cache(cJSON *root) {
  cJSON_DeleteItemFromObject(cJSON_GetObjectItem(root, "tensors"), "value_cache");
}
static void string_block_size(cJSON *root) { cJSON_ReplaceItemInObject(root, "block_size", cJSON_CreateString("16")); }
static void fractional_heads(cJSON *root) { cJSON_ReplaceItemInObject(root, "num_q_heads", cJSON_CreateNumber(4.5)); }
static void huge_blocks(cJSON *root) { cJSON_ReplaceItemInObject(root, "num_blocks", cJSON_CreateNumber(3e9)); }
static void bad_dtype(cJSON *root) { cJSON_ReplaceItemInObject(root, "dtype", cJSON_CreateString("fp8")); }
static void bad_cache_dtype(cJSON *root) {
  cJSON_ReplaceItemInObject(root, "cache_dtype", cJSON_CreateString("fp8_e4m3fn"));
}
static void bad_layout(cJSON *root) { cJSON_ReplaceItemInObject(root, "kv_layout", cJSON_CreateString("nhd")); }
/* base_spec's blocks of 4 keys have no TILED shape */
static void tiled_block_4(cJSON *root) { cJSON_ReplaceItemInObject(root, "kv_layout", cJSON_CreateString("TILED")); }
static void bad_attn(cJSON *root) { cJSON_ReplaceItemInObject(root, "attn_type", cJSON_CreateString("cross")); }
static void zero_threads(cJSON *root) { cJSON_AddNumberToObject(root, "threads", 0); }
static void negative_window(cJSON *root) { cJSON_ReplaceItemInObject(root, "sliding_window", cJSON_CreateNumber(-1)); }
static void heads_not_multiple(cJSON *root) { cJSON_ReplaceItemInObject(root, "num_kv_heads", cJSON_CreateNumber(3)); }
static void duplicate_key(cJSON *root) { cJSON_AddNumberToObject(root, "head_dim", 8); }
static void empty_requests(cJSON *root) { cJSON_ReplaceItemInObject(root, "requests", cJSON_CreateArray()); }
static void request_not_object(cJSON *root) {
  cJSON_ReplaceItemInArray(cJSON_GetObjectItem(root, "requests"), 2, cJSON_CreateNumber(3));
}
static void negative_computed(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 3), "num_computed",
                            cJSON_CreateNumber(-1));
}
static void zero_scheduled(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 1), "num_scheduled",
                            cJSON_CreateNumber(0));
}
static void block_out_of_range(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 0), "block_table");
  cJSON_ReplaceItemInArray(t, 1, cJSON_CreateNumber(12));
}
static void block_table_short(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 1), "block_table");
  cJSON_DeleteItemFromArray(t, 3);
}
static void block_table_padding_read(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 3), "block_table");
  cJSON_ReplaceItemInArray(t, 1, cJSON_CreateNumber(-1));
}
static void bad_draft(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 2), "draft_tokens");
  cJSON_ReplaceItemInArray(t, 0, cJSON_CreateNumber(-7));
}
/* a broken table only the planner can see: two requests write into block 2 */
static void shared_written_block(cJSON *root) {
  cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "requests"), 3), "block_table");
  cJSON_ReplaceItemInArray(t, 0, cJSON_CreateNumber(2));
}
static void tensor_not_string(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "tensors"), "q", cJSON_CreateNumber(1));
}
static void tensor_absent_file(cJSON *root) {
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "tensors"), "k", cJSON_CreateString("nope/k.npy"));
}

Test(step_runner, bad_values_are_named_by_their_key) {
  expect_json_error(drop_block_table, "request key", "requests[1].block_table: missing required key", NULL);
  expect_json_error(drop_value_cache, "tensor key", "tensors.value_cache: missing required key", NULL);
  expect_json_error(string_block_size, "string int", "block_size: must be an integer, got a string", NULL);
  expect_json_error(fractional_heads, "fraction", "num_q_heads: must be an integer", NULL);
  expect_json_error(huge_blocks, "int32", "num_blocks: 3000000000 is over 2147483647", NULL);
  expect_json_error(bad_dtype, "dtype", "dtype: \"fp8\" is not one of f32, bf16, f16", NULL);
  expect_json_error(bad_cache_dtype, "cache dtype",
                    "cache_dtype: \"fp8_e4m3fn\" is not one of f32, bf16, f16, fp8_e4m3, fp8_e5m2", NULL);
  expect_json_error(bad_layout, "layout", "kv_layout: \"nhd\" is not one of NHD, HND, TILED", NULL);
  expect_json_error(tiled_block_4, "tiled block size", "kv_layout: TILED needs a block_size that is a multiple of 16",
                    "(got 4, 8)");
  expect_json_error(bad_attn, "attn_type", "attn_type: \"cross\" is not one of decoder, encoder", NULL);
  expect_json_error(zero_threads, "threads", "threads: 0 must be >= 1", NULL);
  expect_json_error(negative_window, "window", "sliding_window: -1 must be >= 0", NULL);
  expect_json_error(heads_not_multiple, "gqa", "num_q_heads: 4 is not a multiple of num_kv_heads (3)", NULL);
  expect_json_error(duplicate_key, "duplicate", "head_dim: key appears twice", NULL);
  expect_json_error(empty_requests, "no requests", "requests: the step has no requests", NULL);
  expect_json_error(request_not_object, "request type", "requests[2]: must be an object, got a number", NULL);
  expect_json_error(negative_computed, "num_computed", "requests[3].num_computed: -1 must be >= 0", NULL);
  expect_json_error(zero_scheduled, "num_scheduled", "requests[1].num_scheduled", "at least 1 token");
  expect_json_error(block_out_of_range, "block id", "requests[0].block_table[1]: 12 is not a block id", NULL);
  expect_json_error(block_table_short, "short table", "requests[1].block_table: 3 entries cover 12 positions",
                    "needs 14");
  expect_json_error(block_table_padding_read, "padding read", "requests[3].block_table[1]: -1 is not a block id", NULL);
  expect_json_error(bad_draft, "draft", "requests[2].draft_tokens[0]: -7 must be >= -1", NULL);
  expect_json_error(shared_written_block, "planner", "uattn_plan_step: broken block table", "(UATTN_ERR_INCONSISTENT)");
  expect_json_error(tensor_not_string, "tensor type", "tensors.q: must be a file name, got a number", NULL);
  expect_json_error(tensor_absent_file, "absent tensor", "tensors.k: ", "nope/k.npy: cannot open");
}

Test(step_runner, unknown_keys_warn_but_run) {
  spec s = base_spec();
  spec_fill(&s, 2);
  spec_write(&s);
  cJSON *j = spec_json(&s);
  cJSON_AddNumberToObject(j, "sliding_windw", 4);
  write_json_file("step.json", j);
  cJSON_Delete(j);
  const result r = run_step(NULL);
  cr_assert_eq(r.rc, 0, "%s", r.err);
  cr_assert(strstr(r.err, "warning: ignoring unknown key sliding_windw"), "%s", r.err);
  spec_free(&s);
}

/* A tensor file replaced by one of the wrong shape, dtype or layout. */
static void expect_tensor_error(spec *s, const char *file, npy_dtype dtype, int ndim, const int64_t *shape,
                                const char *frag1, const char *frag2) {
  spec_fill(s, 3);
  spec_write(s);
  size_t n = 1;
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
  void *zeros = calloc(n ? n : 1, 8);
  save(file, dtype, ndim, shape, zeros);
  free(zeros);
  const result r = run_step(NULL);
  expect_error(&r, file, frag1, frag2);
  spec_free(s);
}

Test(step_runner, tensor_shape_and_dtype_errors) {
  spec s = base_spec(); /* T = 3 + 1 + 3 + 5 = 12: request 2's placeholder draft does not count */
  expect_tensor_error(&s, "q.npy", NPY_F4, 3, (int64_t[]){13, 4, 8},
                      "uattn-run: tensors.q: shape [13, 4, 8] does not match [12, 4, 8] (T, num_q_heads, head_dim)",
                      NULL);
  s = base_spec();
  expect_tensor_error(&s, "v.npy", NPY_F4, 2, (int64_t[]){12, 16}, "tensors.v: shape [12, 16] does not match",
                      "(T, num_kv_heads, head_dim)");
  s = base_spec();
  expect_tensor_error(&s, "q.npy", NPY_U2, 3, (int64_t[]){12, 4, 8},
                      "tensors.q: ", "dtype <u2 does not match dtype \"f32\" (<f4)");
  s = base_spec();
  expect_tensor_error(&s, "kc.npy", NPY_F4, 3, (int64_t[]){47, 2, 8}, "tensors.key_cache: shape [47, 2, 8]",
                      "(num_blocks * block_size, num_kv_heads, head_dim)");
  s = base_spec();
  s.layout = "HND";
  expect_tensor_error(&s, "vc.npy", NPY_F4, 3, (int64_t[]){48, 2, 8}, "tensors.value_cache: shape [48, 2, 8]",
                      "does not match [12, 2, 4, 8] (num_blocks, num_kv_heads, block_size, head_dim)");
  s = base_spec();
  s.layout = "TILED";
  s.bs = 16; /* a value cache shaped like the keys */
  expect_tensor_error(&s, "vc.npy", NPY_F4, 6, (int64_t[]){12, 1, 2, 4, 16, 2},
                      "tensors.value_cache: shape [12, 1, 2, 4, 16, 2] does not match [12, 1, 2, 8, 8, 2]",
                      "(TILED values: num_blocks, block_size / 16, num_kv_heads, 8, head_dim, 2)");
  s = base_spec();
  s.cache_dtype = "bf16";
  expect_tensor_error(&s, "kc.npy", NPY_F2, 3, (int64_t[]){48, 2, 8}, "tensors.key_cache",
                      "dtype <f2 does not match cache_dtype \"bf16\" (<u2)");
  s = base_spec();
  s.sinks = true;
  expect_tensor_error(&s, "sinks.npy", NPY_F4, 1, (int64_t[]){2}, "tensors.sinks: shape [2] does not match [4]",
                      "(num_q_heads)");
  s = base_spec();
  s.alibi = true;
  expect_tensor_error(&s, "alibi.npy", NPY_I4, 1, (int64_t[]){4}, "tensors.alibi_slopes", "dtype <i4, expected <f4");
}

Test(step_runner, malformed_tensor_file_is_named) {
  spec s = base_spec();
  spec_fill(&s, 4);
  spec_write(&s);
  raw_npy(in_scratch("v.npy"), 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (12, 2, 8), }", s.v,
          12 * 2 * 8 * sizeof(float));
  const result r = run_step(NULL);
  expect_error(&r, "fortran", "tensors.v: ", "v.npy: fortran_order is True");
  spec_free(&s);
}

Test(step_runner, unwritable_output_directory) {
  spec s = base_spec();
  spec_fill(&s, 5);
  spec_write(&s);
  write_text(in_scratch("file"), "x");
  const char *args[] = {in_scratch("step.json"), "--out", in_scratch("file/sub"), NULL};
  const result r = run_tool(args);
  expect_error(&r, "out dir", "--out ", "cannot create");
  spec_free(&s);
}

/* ---- the runner: whole steps against a dense attention -------------------------------------------------- */

static int64_t slot_of(const spec *s, int r, int32_t pos) {
  return (int64_t)s->table[r][pos / s->bs] * s->bs + pos % s->bs;
}

/* docs/design.md read literally, in double: every key of the request up to the query's position (all of them
 * for an encoder), from the cache below num_computed and from this step's k/v above. */
static void dense_attention(const spec *s, double *out, double *lse) {
  const int group = s->hq / s->hkv;
  const bool encoder = !strcmp(s->attn, "encoder");
  for (int r = 0; r < s->nreq; r++) {
    const int32_t seq = s->nc[r] + s->eff[r];
    double *score = malloc(sizeof(double) * (size_t)seq);
    for (int32_t t = s->qsl[r]; t < s->qsl[r + 1]; t++) {
      const int32_t p = s->nc[r] + (t - s->qsl[r]);
      for (int h = 0; h < s->hq; h++) {
        const int kh = h / group;
        double m = s->sinks ? s->sink[h] : -INFINITY;
        for (int32_t j = 0; j < seq; j++) {
          bool visible = encoder || j <= p;
          if (s->window > 0) visible = visible && j > p - s->window;
          score[j] = -INFINITY;
          if (!visible) continue;
          const float *key = j < s->nc[r] ? s->kc + ((size_t)slot_of(s, r, j) * s->hkv + kh) * s->d
                                          : s->k + ((size_t)(s->qsl[r] + j - s->nc[r]) * s->hkv + kh) * s->d;
          double dot = 0;
          for (int d = 0; d < s->d; d++) dot += (double)s->q[((size_t)t * s->hq + h) * s->d + d] * key[d];
          double sc = (double)(float)s->scale * dot;
          if (s->soft_cap > 0) sc = s->soft_cap * tanh(sc / s->soft_cap);
          if (s->alibi) sc += (double)s->slope[h] * (j - p);
          score[j] = sc;
          if (sc > m) m = sc;
        }
        double sum = s->sinks ? exp(s->sink[h] - m) : 0.0;
        double *o = out + ((size_t)t * s->hq + h) * s->d;
        for (int d = 0; d < s->d; d++) o[d] = 0;
        for (int32_t j = 0; j < seq; j++) {
          if (score[j] == -INFINITY) continue;
          const double w = exp(score[j] - m);
          sum += w;
          const float *val = j < s->nc[r] ? s->vc + ((size_t)slot_of(s, r, j) * s->hkv + kh) * s->d
                                          : s->v + ((size_t)(s->qsl[r] + j - s->nc[r]) * s->hkv + kh) * s->d;
          for (int d = 0; d < s->d; d++) o[d] += w * val[d];
        }
        for (int d = 0; d < s->d; d++) o[d] /= sum;
        lse[(size_t)t * s->hq + h] = m + log(sum);
      }
    }
    free(score);
  }
}

/* The caches after the step: this step's k/v at each new token's slot. */
static void updated_caches(const spec *s, float *kc, float *vc) {
  const size_t row = (size_t)s->hkv * s->d, n = (size_t)s->nb * s->bs * row;
  memcpy(kc, s->kc, sizeof(float) * n);
  memcpy(vc, s->vc, sizeof(float) * n);
  for (int r = 0; r < s->nreq; r++)
    for (int32_t i = 0; i < s->eff[r]; i++) {
      const int64_t slot = slot_of(s, r, s->nc[r] + i);
      memcpy(kc + (size_t)slot * row, s->k + (size_t)(s->qsl[r] + i) * row, sizeof(float) * row);
      memcpy(vc + (size_t)slot * row, s->v + (size_t)(s->qsl[r] + i) * row, sizeof(float) * row);
    }
}

static npy_array load(const char *name) {
  npy_array a;
  char err[256];
  cr_assert_eq(npy_read(in_scratch(name), &a, err, sizeof err), 0, "%s: %s", name, err);
  return a;
}

static void check_shape(const npy_array *a, const char *name, npy_dtype dtype, int ndim, const int64_t *shape) {
  cr_assert_eq(a->dtype, dtype, "%s: dtype %s", name, npy_dtype_descr(a->dtype));
  cr_assert_eq(a->ndim, ndim, "%s: ndim %d", name, a->ndim);
  for (int d = 0; d < ndim; d++)
    cr_assert_eq(a->shape[d], shape[d], "%s: dim %d is %lld, not %lld", name, d, (long long)a->shape[d],
                 (long long)shape[d]);
}

/* Runs the step and checks every output: out and lse against the dense attention within tol (relative to
 * the largest |out|), the caches exactly, plan.json's slots and offsets. */
static void run_and_check(spec *s, const char *extra, double tol) {
  spec_write(s);
  const result r = run_step(extra);
  cr_assert_eq(r.rc, 0, "uattn-run failed (%d): %s", r.rc, r.err);
  const size_t rows = (size_t)s->T * s->hq, n = rows * s->d;
  double *out = malloc(sizeof(double) * n), *lse = malloc(sizeof(double) * rows);
  dense_attention(s, out, lse);

  npy_array o = load("out/out.npy"), l = load("out/lse.npy");
  check_shape(&o, "out.npy", NPY_F4, 3, (int64_t[]){s->T, s->hq, s->d});
  check_shape(&l, "lse.npy", NPY_F4, 2, (int64_t[]){s->T, s->hq});
  double scale = 0, worst = 0, worst_lse = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(out[i]));
  for (size_t i = 0; i < n; i++) {
    const double e = fabs(((float *)o.data)[i] - out[i]);
    if (e > worst) worst = e, at = i;
  }
  for (size_t i = 0; i < rows; i++) worst_lse = fmax(worst_lse, fabs(((float *)l.data)[i] - lse[i]));
  cr_assert(worst <= tol * scale, "out: error %.3g at row %zu head %zu (got %g, want %g), allowed %.3g", worst,
            at / ((size_t)s->hq * s->d), at / s->d % s->hq, ((float *)o.data)[at], out[at], tol * scale);
  cr_assert(worst_lse <= 1e-4, "lse: error %.3g", worst_lse); /* fp32 whatever the dtype: inputs are exact */
  npy_free(&o);
  npy_free(&l);

  /* caches: exactly the inputs with this step's k/v written, in the input's layout and dtype */
  const size_t cn = (size_t)s->nb * s->bs * s->hkv * s->d;
  float *kc = malloc(sizeof(float) * cn), *vc = malloc(sizeof(float) * cn);
  updated_caches(s, kc, vc);
  int64_t kshape[6], vshape[6];
  int nd;
  void *want_k = encode_cache(s, kc, s->k_scale, false, kshape, &nd);
  void *want_v = encode_cache(s, vc, s->v_scale, true, vshape, &nd);
  npy_array gk = load("out/key_cache.npy"), gv = load("out/value_cache.npy");
  check_shape(&gk, "key_cache.npy", npy_of(s->cache_dtype), nd, kshape);
  check_shape(&gv, "value_cache.npy", npy_of(s->cache_dtype), nd, vshape);
  const size_t bytes = cn * npy_dtype_size(gk.dtype);
  cr_assert(memcmp(gk.data, want_k, bytes) == 0, "key_cache.npy differs from the expected update");
  cr_assert(memcmp(gv.data, want_v, bytes) == 0, "value_cache.npy differs from the expected update");
  npy_free(&gk);
  npy_free(&gv);
  free(want_k);
  free(want_v);
  free(kc);
  free(vc);

  /* plan.json */
  cJSON *plan = test_load_json(in_scratch("out/plan.json"));
  cr_assert_not_null(plan);
  int32_t got[64];
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "slot_mapping"), got, 64), s->T);
  for (int q = 0; q < s->nreq; q++)
    for (int32_t i = 0; i < s->eff[q]; i++)
      cr_assert_eq(got[s->qsl[q] + i], slot_of(s, q, s->nc[q] + i), "slot_mapping[%d]", s->qsl[q] + i);
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "query_start_loc"), got, 64), s->nreq + 1);
  for (int q = 0; q <= s->nreq; q++) cr_assert_eq(got[q], s->qsl[q]);
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "seq_lens"), got, 64), s->nreq);
  for (int q = 0; q < s->nreq; q++) cr_assert_eq(got[q], s->nc[q] + s->eff[q]);
  cr_assert_eq(test_json_ints(cJSON_GetObjectItem(plan, "token_positions"), got, 64), s->T);
  const char *lists[] = {"logits_indices", "logits_groups", "new_token_positions", "shared_blocks"};
  for (int i = 0; i < 4; i++) cr_assert(cJSON_IsArray(cJSON_GetObjectItem(plan, lists[i])), "%s", lists[i]);
  const cJSON *unique = cJSON_GetObjectItem(plan, "unique_blocks");
  cr_assert(cJSON_IsArray(unique));
  const cJSON *u;
  cJSON_ArrayForEach(u, unique) cr_assert_eq(cJSON_GetArraySize(u), 4, "[block, token, block_start, usage]");
  const cJSON *bucket = cJSON_GetObjectItem(plan, "bucket");
  cr_assert_eq(cJSON_GetObjectItem(bucket, "query_len")->valueint, s->T);
  cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(bucket, "shared_blocks")));
  cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(bucket, "unique_blocks")));
  cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(bucket, "logits")));
  cJSON_Delete(plan);
  free(out);
  free(lse);
}

Test(step_runner, f32_step_matches_dense_attention) {
  spec s = base_spec();
  spec_fill(&s, 10);
  run_and_check(&s, NULL, 1e-5);
  cr_assert_not(file_exists(in_scratch("out/timing.json")));
  cr_assert_not(file_exists(in_scratch("out/causal_bias.npy")));
  spec_free(&s);
}

Test(step_runner, repeat_keeps_first_outputs_and_writes_timing) {
  spec s = base_spec();
  spec_fill(&s, 11);
  run_and_check(&s, "--repeat=3", 1e-5); /* the caches checked are those of one update, not four */
  cJSON *t = test_load_json(in_scratch("out/timing.json"));
  cr_assert_not_null(t);
  cr_assert(cJSON_GetObjectItem(t, "forward_ms")->valuedouble >= 0);
  cr_assert(cJSON_GetObjectItem(t, "plan_ms")->valuedouble >= 0);
  cr_assert_eq(cJSON_GetObjectItem(t, "repeat")->valueint, 3);
  cr_assert(cJSON_GetObjectItem(t, "threads")->valueint >= 1, "the workers that ran");
  cJSON_Delete(t);
  spec_free(&s);
}

Test(step_runner, threads_key_is_recorded) {
  spec s = base_spec();
  spec_fill(&s, 12);
  spec_write(&s);
  cJSON *j = spec_json(&s);
  cJSON_AddNumberToObject(j, "threads", 2);
  cJSON_AddNumberToObject(j, "causal_width", 2); /* several causal slices in a 5-token prompt */
  cJSON_AddNumberToObject(j, "chunk_size", 1);   /* one shared block per online-softmax chunk */
  write_json_file("step.json", j);
  cJSON_Delete(j);
  const char *args[] = {in_scratch("step.json"), "--out", in_scratch("out"), "--repeat", "1", NULL};
  const result r = run_tool(args);
  cr_assert_eq(r.rc, 0, "%s", r.err);
  cJSON *t = test_load_json(in_scratch("out/timing.json"));
  cr_assert_eq(cJSON_GetObjectItem(t, "threads")->valueint, 2);
  cr_assert_eq(cJSON_GetObjectItem(t, "repeat")->valueint, 1);
  cJSON_Delete(t);
  /* and the options change nothing in the result */
  const size_t rows = (size_t)s.T * s.hq;
  double *out = malloc(sizeof(double) * rows * s.d), *lse = malloc(sizeof(double) * rows);
  dense_attention(&s, out, lse);
  npy_array o = load("out/out.npy");
  for (size_t i = 0; i < rows * s.d; i++)
    cr_assert(fabs(((float *)o.data)[i] - out[i]) <= 1e-5 * 2, "out[%zu]: %g vs %g", i, ((float *)o.data)[i], out[i]);
  npy_free(&o);
  free(out);
  free(lse);
  spec_free(&s);
}

Test(step_runner, bf16_with_f16_hnd_cache_sinks_alibi_soft_cap_window) {
  spec s = base_spec();
  s.dtype = "bf16";
  s.cache_dtype = "f16";
  s.layout = "HND";
  s.sinks = s.alibi = true;
  s.soft_cap = 1.5;
  s.window = 6;
  s.scale = 0.25; /* exact in every dtype the library might hold it in */
  spec_fill(&s, 13);
  run_and_check(&s, NULL, 1.0 / 64); /* out is rounded to bf16 (8 bits) before the runner widens it */
  spec_free(&s);
}

/* Values that are exactly an fp8 code of both formats times scale: m * 2^e (m in 4..7, e in [-8, -2], so
 * 3 significant bits inside both formats' normal ranges), either sign, or 0. */
static void fp8_exact(test_rng *rng, float *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i++) {
    const int m = test_rng_range(rng, 3, 7), e = test_rng_range(rng, -8, -2), sign = test_rng_range(rng, 0, 1);
    x[i] = m == 3 ? 0.0f : (float)((sign ? -1 : 1) * ldexp(m, e) * scale);
  }
}

/* fp8 caches end to end: |u1 cache files in and out, k_scale / v_scale from the JSON (0.5 and 3, so a
 * swapped or missing scale shows), every path of base_spec (causal, shared, unique; the decode and the
 * verification read their own new keys back from the fp8 cache). The keys and values are exactly
 * representable (fp8_exact), so the cache after the step is known bit for bit and the dense attention on
 * the float values is exact: f32 accumulation is all that is left (1e-5). */
Test(step_runner, fp8_caches) {
  const char *const formats[] = {"fp8_e4m3", "fp8_e5m2"}, *const layouts[] = {"NHD", "HND"};
  for (int f = 0; f < 2; f++) {
    spec s = base_spec();
    s.cache_dtype = formats[f];
    s.layout = layouts[f];
    s.k_scale = 0.5;
    s.v_scale = 3.0;
    spec_fill(&s, 15 + (uint64_t)f);
    test_rng rng = {99 + (uint64_t)f};
    const size_t kv = (size_t)s.T * s.hkv * s.d, cache = (size_t)s.nb * s.bs * s.hkv * s.d;
    fp8_exact(&rng, s.k, kv, s.k_scale);
    fp8_exact(&rng, s.v, kv, s.v_scale);
    fp8_exact(&rng, s.kc, cache, s.k_scale);
    fp8_exact(&rng, s.vc, cache, s.v_scale);
    run_and_check(&s, NULL, 1e-5);
    spec_free(&s);
  }
}

/* base_spec's paths on a TILED cache: blocks of 32 keys, two tiles each, so that every index of uattn.h's
 * definition moves (block, tile, key in the tile, KV head, dim pair and its element, key pair). Request 0's
 * chunk writes across a tile boundary, request 1's decode into the second tile of its block; both read
 * block 0 (shared), request 3's prompt fills one block and starts the next. */
static spec tiled_spec(void) {
  spec s;
  memset(&s, 0, sizeof s);
  s.bs = 32, s.nb = 8, s.hq = 4, s.hkv = 2, s.d = 8;
  s.dtype = s.cache_dtype = "f32";
  s.layout = "TILED";
  s.attn = "decoder";
  s.scale = 0.3;
  s.nreq = 4;
  /* request 0: a prompt chunk at positions 45..50 (block 1, tile 0 keys 13..15 and tile 1 keys 0..2) */
  s.nc[0] = 45, s.ns[0] = 6, s.np[0] = 60, s.tlen[0] = 2;
  memcpy(s.table[0], (int32_t[]){0, 1}, 2 * sizeof(int32_t));
  /* request 1: a decode at position 50 (block 3, tile 1 key 2) */
  s.nc[1] = 50, s.ns[1] = 1, s.np[1] = 20, s.tlen[1] = 2;
  memcpy(s.table[1], (int32_t[]){0, 3}, 2 * sizeof(int32_t));
  /* request 2: verifies 2 drafts at positions 20..22 (the placeholder does not count) */
  s.nc[2] = 20, s.ns[2] = 4, s.np[2] = 3, s.tlen[2] = 1;
  s.table[2][0] = 4;
  s.ndrafts[2] = 3;
  memcpy(s.drafts[2], (int32_t[]){11, -1, 12}, 3 * sizeof(int32_t));
  /* request 3: a whole prompt of 40 */
  s.nc[3] = 0, s.ns[3] = 40, s.np[3] = 40, s.tlen[3] = 3;
  memcpy(s.table[3], (int32_t[]){5, 6, 7}, 3 * sizeof(int32_t));
  s.ndrafts[0] = s.ndrafts[1] = s.ndrafts[3] = -1;
  return s;
}

/* A TILED step in f32, in bf16 on a bf16 cache, and on fp8 caches with scales (exact values, as above):
 * the output against the dense attention on the [slot][h][d] values, and the caches after the step, shaped
 * and laid out as layout_index says, bit for bit. */
Test(step_runner, tiled_caches) {
  const char *const dtypes[] = {"f32", "bf16", "f32"}, *const caches[] = {"f32", "bf16", "fp8_e4m3"};
  const double tol[] = {1e-5, 1.0 / 64, 1e-5}; /* bf16: out rounded to 8 bits, P maybe too */
  for (int c = 0; c < 3; c++) {
    spec s = tiled_spec();
    s.dtype = dtypes[c];
    s.cache_dtype = caches[c];
    if (is_fp8(s.cache_dtype)) s.k_scale = 0.5, s.v_scale = 3.0;
    if (!strcmp(s.dtype, "bf16")) s.scale = 0.25; /* exact in every dtype the library might hold it in */
    spec_fill(&s, 40 + (uint64_t)c);
    if (is_fp8(s.cache_dtype)) {
      test_rng rng = {140 + (uint64_t)c};
      const size_t kv = (size_t)s.T * s.hkv * s.d, cache = (size_t)s.nb * s.bs * s.hkv * s.d;
      fp8_exact(&rng, s.k, kv, s.k_scale);
      fp8_exact(&rng, s.v, kv, s.v_scale);
      fp8_exact(&rng, s.kc, cache, s.k_scale);
      fp8_exact(&rng, s.vc, cache, s.v_scale);
    }
    run_and_check(&s, NULL, tol[c]);
    spec_free(&s);
  }
}

static void fp8_cache_zero_k_scale(cJSON *o) {
  cJSON_ReplaceItemInObject(o, "cache_dtype", cJSON_CreateString("fp8_e4m3"));
  cJSON_AddNumberToObject(o, "k_scale", 0);
}
static void negative_v_scale(cJSON *o) { cJSON_AddNumberToObject(o, "v_scale", -1); }
static void string_k_scale(cJSON *o) { cJSON_AddStringToObject(o, "k_scale", "1"); }
static void fp8_dtype(cJSON *o) { cJSON_ReplaceItemInObject(o, "dtype", cJSON_CreateString("fp8_e5m2")); }

Test(step_runner, bad_fp8_keys_are_named) {
  expect_json_error(fp8_cache_zero_k_scale, "k_scale", "k_scale: 0 is not a usable value", NULL);
  expect_json_error(negative_v_scale, "v_scale", "v_scale: -1 is not a usable value", NULL);
  expect_json_error(string_k_scale, "k_scale type", "k_scale: must be a number", NULL);
  expect_json_error(fp8_dtype, "fp8 dtype", "dtype: fp8_e5m2 is a cache dtype only", NULL);
}

Test(step_runner, f16_step) {
  spec s = base_spec();
  s.dtype = s.cache_dtype = "f16";
  spec_fill(&s, 14);
  run_and_check(&s, NULL, 1.0 / 512);
  spec_free(&s);
}

Test(step_runner, encoder_attention_is_bidirectional) {
  spec s = base_spec();
  s.attn = "encoder";
  s.nreq = 2; /* two fresh prompts */
  s.nc[0] = 0, s.ns[0] = 6, s.np[0] = 6, s.tlen[0] = 2;
  memcpy(s.table[0], (int32_t[]){3, 5}, 2 * sizeof(int32_t));
  s.nc[1] = 0, s.ns[1] = 3, s.np[1] = 3, s.tlen[1] = 1;
  memcpy(s.table[1], (int32_t[]){7}, sizeof(int32_t));
  s.ndrafts[0] = s.ndrafts[1] = -1;
  spec_fill(&s, 15);
  run_and_check(&s, NULL, 1e-5);
  spec_free(&s);
}

Test(step_runner, dump_biases_writes_seed_tensors) {
  spec s = base_spec();
  spec_fill(&s, 16);
  run_and_check(&s, "--dump-biases", 1e-5);
  cJSON *plan = test_load_json(in_scratch("out/plan.json"));
  const cJSON *b = cJSON_GetObjectItem(plan, "bucket");
  const int64_t tq = cJSON_GetObjectItem(b, "query_len")->valueint;
  const int64_t ts = cJSON_GetObjectItem(b, "shared_blocks")->valueint;
  const int64_t tu = cJSON_GetObjectItem(b, "unique_blocks")->valueint;
  cJSON_Delete(plan);
  /* blocks 0 and 1 are read by requests 0 and 1; 6 and 7 by the three rows of request 2 */
  cr_assert_eq(ts, 4);
  npy_array a = load("out/causal_bias.npy");
  check_shape(&a, "causal_bias", NPY_F4, 2, (int64_t[]){tq, tq});
  const float *cb = a.data;
  /* row 1 (request 0, a prompt chunk) sees rows 0 and 1; row 3 (request 1, a decode) sees none here */
  cr_assert(cb[1 * tq + 0] == 0.0f && cb[1 * tq + 1] == 0.0f && isinf(cb[1 * tq + 2]));
  for (int64_t j = 0; j < tq; j++) cr_assert(isinf(cb[3 * tq + j]) && cb[3 * tq + j] < 0);
  npy_free(&a);
  a = load("out/shared_bias.npy");
  check_shape(&a, "shared_bias", NPY_F4, 3, (int64_t[]){tq, ts, s.bs});
  npy_free(&a);
  a = load("out/shared_usage.npy");
  check_shape(&a, "shared_usage", NPY_I4, 2, (int64_t[]){tq, ts});
  const int32_t *usage = a.data;
  cr_assert_eq(usage[0 * ts + 1], s.bs, "row 0 reads all of block 1");
  /* per token: the drafts at positions 5, 6, 7 see 2, 3, 4 keys of block 7 (not one usage per block) */
  cr_assert(usage[4 * ts + 3] == 2 && usage[5 * ts + 3] == 3 && usage[6 * ts + 3] == 4);
  npy_free(&a);
  a = load("out/unique_bias.npy");
  check_shape(&a, "unique_bias", NPY_F4, 2, (int64_t[]){tu, s.bs});
  npy_free(&a);
  a = load("out/unique_block_mapping.npy");
  check_shape(&a, "unique_block_mapping", NPY_I4, 1, (int64_t[]){tu});
  npy_free(&a);
  a = load("out/shared_blocks.npy");
  check_shape(&a, "shared_blocks", NPY_I4, 1, (int64_t[]){ts});
  const int32_t *ids = a.data;
  cr_assert(ids[0] == 0 && ids[1] == 1 && ids[2] == 6 && ids[3] == 7);
  npy_free(&a);
  spec_free(&s);
}

/* 256 spec-decode requests of two rows each over 9 blocks of 64: every block is shared (by its request's
 * two rows), so the seed's shared bias [512, 2304, 64] is 288 MiB, over the planner's 256 MiB limit, while
 * the attention itself is tiny. The refusal is a warning; everything else is written. */
Test(step_runner, refused_shared_bias_is_a_warning) {
  const int32_t bs = 64, per = 9, R = 256, T = 2 * R, nb = R * per;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "block_size", bs);
  cJSON_AddNumberToObject(j, "num_blocks", nb);
  cJSON_AddNumberToObject(j, "num_q_heads", 1);
  cJSON_AddNumberToObject(j, "num_kv_heads", 1);
  cJSON_AddNumberToObject(j, "head_dim", 4);
  cJSON_AddStringToObject(j, "dtype", "f32");
  cJSON_AddStringToObject(j, "cache_dtype", "f32");
  cJSON_AddStringToObject(j, "kv_layout", "NHD");
  cJSON_AddNumberToObject(j, "scale", 0.5);
  cJSON_AddNumberToObject(j, "soft_cap", 0);
  cJSON_AddNumberToObject(j, "sliding_window", 0);
  cJSON_AddStringToObject(j, "attn_type", "decoder");
  cJSON *reqs = cJSON_AddArrayToObject(j, "requests");
  for (int32_t r = 0; r < R; r++) {
    cJSON *q = cJSON_CreateObject();
    int32_t table[9], draft = 5;
    for (int32_t i = 0; i < per; i++) table[i] = r * per + i;
    cJSON_AddNumberToObject(q, "num_computed", per * bs - 2);
    cJSON_AddNumberToObject(q, "num_scheduled", 2);
    cJSON_AddNumberToObject(q, "num_prompt", 10);
    cJSON_AddItemToObject(q, "block_table", ints(table, per));
    cJSON_AddItemToObject(q, "draft_tokens", ints(&draft, 1));
    cJSON_AddItemToArray(reqs, q);
  }
  cJSON *t = cJSON_AddObjectToObject(j, "tensors");
  const char *names[] = {"q", "k", "v", "key_cache", "value_cache"};
  const char *files[] = {"q.npy", "k.npy", "v.npy", "kc.npy", "vc.npy"};
  for (int i = 0; i < 5; i++) cJSON_AddStringToObject(t, names[i], files[i]);
  write_json_file("step.json", j);
  cJSON_Delete(j);
  test_rng rng = {17};
  float *x = random_exact(&rng, (size_t)nb * bs * 4);
  save("q.npy", NPY_F4, 3, (int64_t[]){T, 1, 4}, x);
  save("k.npy", NPY_F4, 3, (int64_t[]){T, 1, 4}, x + 1);
  save("v.npy", NPY_F4, 3, (int64_t[]){T, 1, 4}, x + 2);
  save("kc.npy", NPY_F4, 3, (int64_t[]){(int64_t)nb * bs, 1, 4}, x);
  save("vc.npy", NPY_F4, 3, (int64_t[]){(int64_t)nb * bs, 1, 4}, x);
  free(x);

  const result r = run_step("--dump-biases");
  cr_assert_eq(r.rc, 0, "%s", r.err);
  cr_assert(strstr(r.err, "uattn-run: warning: shared_bias.npy skipped (UATTN_ERR_TOO_LARGE)"), "%s", r.err);
  cr_assert_not(file_exists(in_scratch("out/shared_bias.npy")));
  npy_array a = load("out/shared_usage.npy");
  check_shape(&a, "shared_usage", NPY_I4, 2, (int64_t[]){T, nb});
  npy_free(&a);
  const char *rest[] = {"out/causal_bias.npy",   "out/unique_bias.npy", "out/unique_block_mapping.npy",
                        "out/shared_blocks.npy", "out/out.npy",         "out/plan.json"};
  for (int i = 0; i < 6; i++) cr_assert(file_exists(in_scratch(rest[i])), "%s", rest[i]);
}
