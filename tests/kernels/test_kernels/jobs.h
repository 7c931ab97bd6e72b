/* The kernel sets against each other: the avx2 set's load and attend against the portable set on thousands
 * of random panel jobs (every shape, rule and dtype the forward can hand them), every part (decode included) of
 * every generated bucket in the registry on jobs of its shape, each bucket the dispatch's choice for its shape,
 * the avx2 loads bit for bit, its vector exp and tanh against libm, the ISA ladder (gen/manifest.json) and the
 * selection. The avx2 cases skip themselves on a CPU without AVX2, FMA and F16C, a bucket's on a CPU without
 * its ISA, saying so. Tolerance of attend: max |out - ref| <= 1e-5 * max |ref| over a job (out = o / l),
 * the fp32 rounding of a different summation order with FMA; exact_job and the test say where the fp32
 * conditioning of a job needs more (outputs cancelling to far less than their terms, scores of size 300).
 * Every timed test has the same timeout: two tests with different ones running side by side (--jobs 2) make
 * Criterion 2.4's runner leak a timer, which fails the suite under ASan.
 *
 * This header holds what the suite's files share: random panel jobs and their runs through a set (jobs.c), and
 * the checks of a set on them (checks.c). */
#ifndef UATTN_TEST_KERNEL_JOBS_H
#define UATTN_TEST_KERNEL_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/support.h"
#include "kernels.h"
#include "uattn.h"

/* Sanitized builds run the sweeps thinner (every SPARSE-th point more) and fewer random jobs. */
#if defined(__SANITIZE_ADDRESS__)
#define SPARSE 8
#else
#define SPARSE 1
#endif
/* The amx twin emulates every tile product element by element in C, many times slower than the other twins'
 * vector code, which ASan slows down further: its jobs a further 4 times fewer there. */
#define AMX_TWIN_SPARSE (SPARSE > 1 ? 4 * SPARSE : 1)
/* A test's timeout, a guard against a hang: sanitized builds run several times slower, and slower still on a
 * loaded host (a twin's pass under ASan ran past 300 s where the host took half the CPU). */
#define KERNEL_TEST_TIMEOUT (SPARSE > 1 ? 900 : 300)

void need_avx2(void);
float uniform(test_rng *rng, float lo, float hi);

/* ---- random panel jobs ------------------------------------------------------------------------------ */

typedef struct job_case {
  int32_t rows, group, D, num_keys, count, panel_keys, key_pos0, window, kv_heads;
  uattn_dtype dtype;
  bool nhd;
  float soft_cap;
  float alibi[8];
  bool has_alibi;
  int32_t query_pos[64], visible[64];
  /* the cache-like sources: count keys, each row `stride` elements apart */
  char *k_base, *v_base; /* kv_heads heads a row; the job reads one of them */
  const void *k_src, *v_src;
  size_t stride;
  float *q;            /* [rows][group][D], scaled as the forward scales it for the fp32 sets */
  float *qu, scale;    /* the same queries unscaled (bf16 values, as a bf16 model's), and the scale */
  bool probs_fp32;     /* the layer option the bf16 sets read */
  bool tiled;          /* case_limits.tiled */
  int32_t list_keys;   /* case_limits.list: the keys of each block of the decode call's list (scatter_blocks) */
  uint64_t list_seed;  /* where the list's blocks lie */
  float *m0, *l0, *o0; /* the state before the call */
  int32_t value_dim;   /* the job's uattn_panel_job.value_dim: o's dims the set must compute (0: all D) */
} job_case;

/* What a kernel under test is specialized for (a generated bucket), so its random jobs have that shape;
 * zeros: any shape. */
typedef struct case_limits {
  int32_t head_dim;   /* every job's */
  int32_t block_size; /* most jobs load exactly one block of this many keys in the dtype below */
  uattn_dtype dtype;
  bool decode;     /* jobs the decode kernel takes: up to UATTN_DECODE_MAX_VECTORS vectors */
  bool large;      /* jobs of many rows, often several key chunks long (what the libxsmm body is for) */
  bool bf16;       /* bf16 sources only (a bf16 set's: its dot products round others to bf16) */
  bool fp8;        /* with bf16: fp8 caches instead (E4M3 or E5M2, exact in bf16: the bf16 level takes them too),
                    * and for a bucket's jobs (a block size) bf16 keys among them */
  bool probs_fp32; /* the bf16 sets' P V in fp32 (uattn_layer.probs_fp32) */
  bool tiled;      /* decode jobs on a TILED copy of the keys (decode_tiled), where the set has the kernel */
  bool list;       /* decode jobs over a list of blocks of 8 to 128 keys (uattn_decode_src), scattered over a
                    * pool of twice as many, a quarter of the lists in order */
  bool every_code; /* fp8 caches of random codes, every finite one (subnormals, zeros of both signs, the
                    * largest), mostly at head dims of whole 32s; a third of the jobs' queries 2^76 at a dim
                    * where every key is zero */
  bool specials;   /* with every_code: now and then a code with every exponent bit set (NaN; E5M2's infinities),
                    * in jobs of one row and no window (every vector sees the same keys) */
} case_limits;

extern const int32_t head_dims[14];

void store_elem(uattn_dtype t, void *dst, size_t i, float f);
void make_case(job_case *c, test_rng *rng, const case_limits *lim);
void free_case(job_case *c);

typedef struct job_result {
  float *m, *l, *o;
} job_result;

/* count keys (and values) of `heads` heads, rows `heads * D` elements apart as in an NHD block, copied into a
 * fresh TILED block (uattn.h) of whole 16-key tiles, written out from the layout's definition: key i of tile t,
 * head h, dim d = 2 p + e at (((t * heads + h) * D / 2 + p) * 16 + i) * 2 + e; its value at
 * (((t * heads + h) * 8 + i / 2) * D + d) * 2 + i % 2. The slots past the keys hold NaN codes, as slots never
 * written may: a kernel must not let them reach the output. */
void tiled_copy(uattn_dtype t, const char *k, const char *v, int32_t count, int32_t heads, int32_t D, char **tk,
                char **tv);
/* Runs a case through a kernel set: load into fresh panels (poisoned with NaN, so anything the set reads
 * that it did not write shows), then attend from the case's initial state. */
job_result run_set(const uattn_kernels *set, uattn_part part, const job_case *c);
void free_result(job_result *r);
/* Whether o's element i (of a vector's D) is one the case keeps (job_case.value_dim): the others are unspecified. */
bool kept_dim(const job_case *c, size_t i);
/* Whether two runs of a case left the same bits in every state and in every output dim the case keeps. */
bool same_bits(const job_result *a, const job_result *b, const job_case *c);
/* A random bf16: mostly of attention's sizes, now and then tiny or denormal (the flushes), never inf or NaN. */
uint16_t random_bf16(test_rng *rng, int kind);
/* Sets a and b leave the same bits on `cases` random jobs of `part` (limits, seed); `differs` says what it
 * means when they do not. */
void check_sets_same_bits(const uattn_kernels *a, const uattn_kernels *b, uattn_part part, const case_limits *limits,
                          int cases, uint64_t seed, const char *differs);
/* Runs `cases` random jobs of the limits' shape through one part of a set and the portable set: each within
 * the bound of the fp32 rounding of a different order, as accurate against fp64 as the portable set, the
 * same bits when run twice. */
void check_set_on_random_jobs(const uattn_kernels *set, uattn_part part, const char *label, const case_limits *lim,
                              int cases, uint64_t seed);
/* A set's part computes, bit for bit, the same states and first value_dim dims of o whether a job keeps every
 * dim or only those (uattn_panel_job.value_dim, drawn at random below the head dim): skipping dims changes no
 * other dim's arithmetic. */
void check_value_dim_is_a_prefix(const uattn_kernels *set, uattn_part part, const case_limits *lim, int cases,
                                 uint64_t seed, const char *label);
/* A set's decode kernel over a list of blocks (case_limits.list: blocks of 8 to 64 keys, in order or scattered)
 * computes, bit for bit, what it computes on the same keys in one block: the avx2 kernel's P V tiles never
 * straddle two blocks, the avx512 sets' fused walks take a share over blocks smaller than it in pieces.
 * Reading a step's rows from the wrong block fails it. */
void check_list_is_one_block(const uattn_kernels *set, const case_limits *lim, int n, uint64_t seed, const char *label);
/* The decode kernel over several KV heads at once (an all-heads unit on an NHD cache) gives each head what
 * a call for that head alone gives, bit for bit (that call is checked against the portable set above):
 * heads' vectors and states further apart than the job's rows (as an all-heads unit's slots are, when a
 * shared span covers some of its rows), their slopes a group apart, their keys a head dim apart in a row.
 * The vectors between the heads' (another span's rows) are left as they were. */
void check_decode_heads(const uattn_kernels *set, const char *label, const case_limits *lim, int cases, uint64_t seed);
/* A bf16 set's attend (decode false) or decode against the portable set on what it is dispatched for: bf16
 * queries on bf16 keys and values and on fp8 ones, P in bf16 and in fp32; sparse thins the jobs. */
void check_bf16_set(const uattn_kernels *set, const char *label, bool decode, uint64_t seed, int sparse);

#endif
