/* The libxsmm body: large panel jobs as JIT fp32 GEMMs over the avx2 set's panels (see xsmm.h).
 *
 * In the avx2 layout (kernels/avx2/body.h) both products are plain NN GEMMs in column-major terms:
 *   S^T (keys x vectors, ld XLD)  = K (keys x D, ld P: the transposed key panel kt[d * P + i])
 *                                   x Q^T (D x vectors: q row-major, copied to an odd-lines stride);
 *   O^T (D x vectors, ld D)      += V^T (D x keys, ld Dv: the row-major value panel)
 *                                   x P^T (keys x vectors, ld XLD: the probabilities, one row per vector).
 * Per (chunk of XK keys, block of up to XV vectors): S by libxsmm over the keys the block sees; the fused
 * body's rules and online softmax on it (block_rules, block_softmax); o_i *= alpha_i; O += P V by libxsmm
 * with beta 1 over exactly those keys (the value panel is not padded past the keys loaded).
 *
 * Accuracy: a libxsmm kernel sums each element in one FMA chain over k, in k order. Over all of D that
 * loses 1 to 1.5 bits of a score against the fused kernel's DB-dim partial sums (fp32 dot products of D 128:
 * max error 2.8e-7 of sum |q_d k_d| in one chain, 8.7e-8 in 32-dim pieces), so S is formed DB dims at a
 * time, each piece a beta-0 GEMM added to the sum of the previous ones in the fused order (beta 1 would only
 * continue the same chain). P V is one chain over the chunk's keys on top of alpha o, as in the fused
 * kernel. So wherever every fused block has 4 vectors or more (its blocks run one chain per accumulator;
 * any job of 8 vectors or more), this body computes the fused kernel's bits exactly, and the choice between
 * the two (uattn_xsmm_wins) is one of speed only (tests/kernels/test_kernels/avx2.c checks both). One chain over D is
 * about 5% faster and within the tests' bounds on the outputs, but loses those bits on the scores.
 *
 * Speed: a few percent ahead of the fused kernel on the jobs xsmm.h's threshold gives it, behind on the
 * smallest (uattn-kernel-bench --xsmm times the two); as the results are the same bits, the threshold only
 * trades speed.
 *
 * Kernels are dispatched once per shape and kept in a small lock-free-read table (libxsmm's own registry is
 * behind it, but its dispatch costs a hash and a lock each call). Each JIT call goes through a named
 * noinline function (uattn_xsmm_qk, uattn_xsmm_pv), so a frame-pointer call graph puts the JIT samples under
 * a name; with UATTN_PERF_MAP=1 every kernel is also listed in /tmp/perf-<pid>.map, perf's map of JIT code,
 * as libxsmm_smm_m<M>_n<N>_k<K>_beta<0|1> with libxsmm's code size. */
#include "avx2/xsmm.h"

#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "avx2/body.h"

#if defined(UATTN_HAVE_XSMM)
#include <libxsmm.h>
#endif

enum {
  XV = 32,          /* query vectors per block */
  XK = 128,         /* keys per chunk */
  XLD = XK + 16,    /* floats per score row: an odd number of 64-byte lines (see common/panels.h's layout) */
  QPAD_MAX_D = 256, /* head dims up to this have the block's queries copied to a padded stride */
};

/* ---- kernels: one per shape, dispatched once ------------------------------------------------------------ */

typedef void (*xsmm_fn)(const float *a, const float *b, float *c);

typedef struct xsmm_shape {
  int32_t m, n, k, lda, ldb, ldc, beta;
} xsmm_shape;

/* fn: 0 while the slot is free, NO_KERNEL when libxsmm gave none (the C loops run), else the kernel. The
 * shape is written before fn is published (release), so a reader that sees fn (acquire) sees the shape. */
typedef struct xsmm_slot {
  xsmm_shape s;
  _Atomic uintptr_t fn;
} xsmm_slot;

enum { SLOTS = 4096, PROBES = 64, CODE_SIZE_UNKNOWN = 4096 };
#define NO_KERNEL ((uintptr_t)1)

static xsmm_slot slots[SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

static uint32_t shape_hash(const xsmm_shape *s) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  const int32_t v[7] = {s->m, s->n, s->k, s->lda, s->ldb, s->ldc, s->beta};
  for (int i = 0; i < 7; i++) h = (h ^ (uint32_t)v[i]) * 0xBF58476D1CE4E5B9ull;
  return (uint32_t)(h >> 32);
}

static int same_shape(const xsmm_shape *a, const xsmm_shape *b) {
  return a->m == b->m && a->n == b->n && a->k == b->k && a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc &&
         a->beta == b->beta;
}

/* Appends "START SIZE name" for a new kernel to /tmp/perf-<pid>.map when UATTN_PERF_MAP=1 (perf's
 * convention for JIT code; called with slots_lock held). The size is libxsmm's, else a conservative 4 KiB. */
static void perf_map_add(const xsmm_shape *s, uintptr_t fn) {
  static int enabled = -1;
  if (enabled < 0) {
    const char *e = getenv("UATTN_PERF_MAP");
    enabled = e && !strcmp(e, "1");
  }
  if (!enabled) return;
  size_t size = CODE_SIZE_UNKNOWN;
#if defined(UATTN_HAVE_XSMM)
  libxsmm_kernel_info info;
  if (libxsmm_get_kernel_info((const void *)fn, &info) == EXIT_SUCCESS && info.code_size > 0) size = info.code_size;
#endif
  char path[64];
  snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%lx %zx libxsmm_smm_m%d_n%d_k%d_beta%d\n", (unsigned long)fn, size, s->m, s->n, s->k, s->beta);
  fclose(f);
}

#if defined(UATTN_HAVE_XSMM)
/* The body's bits are the fused AVX2 body's only if libxsmm emits AVX2 code: on a CPU with AVX-512 it
 * would JIT AVX-512 kernels by itself (target "cpx" on Zen 4), whose products sum in another order. So
 * before its first kernel libxsmm is pinned to AVX2 code; the avx2 set then gives the same bits on every
 * CPU that runs it, and its libxsmm body stays a choice of speed only (a CPU with AVX-512 has the avx512
 * level for speed; on Zen 4, which splits a zmm FMA in two, the AVX2 and AVX-512 kernels timed at par with
 * uattn-kernel-bench --xsmm). This instance of libxsmm is uattn's own (linked statically, its symbols hidden), so the pin
 * changes nothing for a host that uses libxsmm itself; it does override LIBXSMM_TARGET for uattn. */
static void pin_avx2_code(void) {
  libxsmm_init(); /* reads LIBXSMM_TARGET and probes the CPU: done first so it cannot undo the pin */
  if (libxsmm_get_target_archid() > LIBXSMM_X86_AVX2) libxsmm_set_target_archid(LIBXSMM_X86_AVX2);
}
#endif

static uintptr_t dispatch(const xsmm_shape *s) {
#if defined(UATTN_HAVE_XSMM)
  static pthread_once_t pinned = PTHREAD_ONCE_INIT;
  pthread_once(&pinned, pin_avx2_code);
  const libxsmm_blasint lda = s->lda, ldb = s->ldb, ldc = s->ldc;
  const float alpha = 1.0f, beta = (float)s->beta;
  const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  const libxsmm_smmfunction f =
      libxsmm_smmdispatch(s->m, s->n, s->k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
  if (f) {
    perf_map_add(s, (uintptr_t)f);
    return (uintptr_t)f;
  }
#else
  (void)s;
#endif
  return NO_KERNEL;
}

/* The kernel of a shape (NO_KERNEL: none). */
static uintptr_t kernel_for(const xsmm_shape *s) {
  const uint32_t h = shape_hash(s);
  for (uint32_t p = 0; p < PROBES; p++) { /* the common case: already there, no lock */
    xsmm_slot *e = &slots[(h + p) % SLOTS];
    const uintptr_t fn = atomic_load_explicit(&e->fn, memory_order_acquire);
    if (!fn) break;
    if (same_shape(&e->s, s)) return fn;
  }
  pthread_mutex_lock(&slots_lock);
  uintptr_t fn = 0;
  for (uint32_t p = 0; p < PROBES && !fn; p++) {
    xsmm_slot *e = &slots[(h + p) % SLOTS];
    const uintptr_t f = atomic_load_explicit(&e->fn, memory_order_relaxed);
    if (f && same_shape(&e->s, s)) {
      fn = f;
    } else if (!f) { /* first use of this shape: dispatch it into the free slot */
      e->s = *s;
      fn = dispatch(s);
      atomic_store_explicit(&e->fn, fn, memory_order_release);
    }
  }
  pthread_mutex_unlock(&slots_lock);
  return fn ? fn : dispatch(s); /* a full probe run (thousands of shapes): libxsmm's registry alone */
}

int uattn_xsmm_runs_here(void) {
  static _Atomic int state = -1; /* -1: not probed yet */
  int v = atomic_load_explicit(&state, memory_order_acquire);
  if (v < 0) {
#if defined(UATTN_HAVE_XSMM)
    const xsmm_shape probe = {XK, XV, DB, XK, DB, XLD, 0};
    v = kernel_for(&probe) != NO_KERNEL;
#else
    v = 0;
#endif
    atomic_store_explicit(&state, v, memory_order_release);
  }
  return v;
}

const char *uattn_xsmm_target(void) {
#if defined(UATTN_HAVE_XSMM)
  if (uattn_xsmm_runs_here()) return libxsmm_get_target_arch();
#endif
  return "none";
}

/* ---- the GEMM calls --------------------------------------------------------------------------------------- */

/* C (+)= A B in plain C, one chain per element in k order (libxsmm's order): where no kernel exists. */
AVX2_TARGET static void gemm_loops(const xsmm_shape *s, const float *a, const float *b, float *c) {
  for (int32_t j = 0; j < s->n; j++)
    for (int32_t i = 0; i < s->m; i++) {
      float acc = s->beta ? c[(size_t)j * s->ldc + i] : 0.0f;
      for (int32_t k = 0; k < s->k; k++) acc = fmaf(a[(size_t)k * s->lda + i], b[(size_t)j * s->ldb + k], acc);
      c[(size_t)j * s->ldc + i] = acc;
    }
}

/* Not inlined, nor cloned under another name (GCC's .constprop copies). */
#if defined(__clang__)
#define XSMM_NAMED __attribute__((noinline))
#else
#define XSMM_NAMED __attribute__((noinline, noclone))
#endif

/* The call into JIT code, one level below the named wrappers: JIT code keeps no frame pointer, so a
 * frame-pointer unwind from a sample in it skips its direct caller (this function) and lands in the
 * wrapper, which is what the profile should name. The empty asm keeps the call from becoming a tail jump. */
XSMM_NAMED static void jit_call(uintptr_t fn, const float *a, const float *b, float *c) {
  ((xsmm_fn)fn)(a, b, c);
  __asm__ volatile("" ::: "memory");
}

static void gemm(uintptr_t fn, const xsmm_shape *s, const float *a, const float *b, float *c) {
  if (fn == NO_KERNEL)
    gemm_loops(s, a, b, c);
  else
    jit_call(fn, a, b, c);
}

/* External (hidden) names, so a profile shows which product the JIT samples belong to. */
void uattn_xsmm_qk(uintptr_t fn, const xsmm_shape *s, const float *a, const float *b, float *c);
void uattn_xsmm_pv(uintptr_t fn, const xsmm_shape *s, const float *a, const float *b, float *c);

XSMM_NAMED void uattn_xsmm_qk(uintptr_t fn, const xsmm_shape *s, const float *a, const float *b, float *c) {
  gemm(fn, s, a, b, c);
  __asm__ volatile("" ::: "memory");
}

XSMM_NAMED void uattn_xsmm_pv(uintptr_t fn, const xsmm_shape *s, const float *a, const float *b, float *c) {
  gemm(fn, s, a, b, c);
  __asm__ volatile("" ::: "memory");
}

/* ---- the body --------------------------------------------------------------------------------------------- */

/* S[i][j] += T[i][j] for nb rows of m (a multiple of 8) columns, the fused kernel's order (piece + sum). */
AVX2_INLINE void add_piece(float *S, const float *T, int nb, int32_t m) {
  for (int i = 0; i < nb; i++)
    for (int32_t j = 0; j < m; j += 8) {
      float *s = S + (size_t)i * XLD + j;
      _mm256_store_ps(s, _mm256_add_ps(_mm256_load_ps(T + (size_t)i * XLD + j), _mm256_load_ps(s)));
    }
}

/* S^T = K Q^T for nb query vectors (q_i at q + i * ldq) and m keys (a multiple of 8) of the transposed key
 * panel kt (ld P), DB dims at a time, each piece a beta-0 GEMM (into T after the first) added to the sum of
 * the previous ones: the fused kernel's order. S and T: XLD floats a vector. */
AVX2_INLINE void block_scores(const float *kt, int32_t P, const float *q, int32_t ldq, int32_t D, int nb, int32_t m,
                              float *S, float *T) {
  for (int32_t d0 = 0; d0 < D; d0 += DB) {
    const xsmm_shape s = {m, nb, D - d0 < DB ? D - d0 : DB, P, ldq, XLD, 0};
    uattn_xsmm_qk(kernel_for(&s), &s, kt + (size_t)d0 * P, q + d0, d0 ? T : S);
    if (d0) add_piece(S, T, nb, m);
  }
}

/* O^T += V^T P^T for nb vectors (o_i at o + i * D) over n keys: the value panel's rows vp (ld Dv) and each
 * vector's probabilities at p + i * XLD. */
AVX2_INLINE void block_values(const float *vp, int32_t Dv, const float *p, int32_t D, int nb, int32_t n, float *o) {
  const xsmm_shape s = {D, nb, n, Dv, XLD, D, 1};
  uattn_xsmm_pv(kernel_for(&s), &s, vp, p, o);
}

/* Query vectors [x0, x0 + nb) (q_i at q + i * ldq) against keys [c0, c1) of the panel. */
AVX2_TARGET static void xsmm_block(const attend_ctx *c, int32_t x0, int nb, const float *q, int32_t ldq, int32_t c0,
                                   int32_t c1) {
  const uattn_panel_job *job = c->job;
  const int32_t D = job->head_dim;
  vec_rule rule[XV];
  int32_t klo, khi;
  block_rules(job, x0, nb, c0, c1, rule, &klo, &khi);
  if (klo >= khi) return;                            /* a fully masked tile */
  const int32_t j0 = klo & ~15, j1 = (khi + 7) & ~7; /* as the fused tile: the key panel is zero past count */
  _Alignas(64) float S[XV * XLD], T[XV * XLD];
  block_scores(c->kt + j0, c->P, q, ldq, D, nb, j1 - j0, S, T);
  float alpha[XV];
  block_softmax(job, x0, nb, rule, S, XLD, j0, j1, alpha);
  /* o_i *= alpha_i (the fused kernel folds this into its load of o: the same rounding) */
  float *o = job->o + (size_t)x0 * D;
  for (int i = 0; i < nb; i++) {
    if (alpha[i] == 1.0f) continue;
    const __m256 a = _mm256_set1_ps(alpha[i]);
    float *oi = o + (size_t)i * D;
    int32_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(oi + d, _mm256_mul_ps(a, _mm256_loadu_ps(oi + d)));
    if (d < D) {
      const __m256i m = tail_mask(D - d);
      _mm256_maskstore_ps(oi + d, m, _mm256_mul_ps(a, _mm256_maskload_ps(oi + d, m)));
    }
  }
  block_values(c->vp + (size_t)klo * c->Dv, c->Dv, S + (klo - j0), D, nb, khi - klo, o);
}

AVX2_TARGET void uattn_xsmm_attend(const uattn_panel_job *job, int32_t panel_keys) {
  const int32_t kmax = keys_seen(job, job->rows);
  if (kmax <= 0) return;
  const attend_ctx c = {job, align64c(job->keys), align64c(job->values), key_stride(panel_keys),
                        value_stride(job->head_dim)};
  /* blocks of at most XV vectors, as even as they go, each through every chunk of keys in turn: its
   * queries and outputs stay in L1 while the panels stream from L2 (a job of a 512-row causal slice has
   * 2 MB of them, the panels of a 128-key chunk 128 KB) */
  const int32_t D = job->head_dim, n = job->rows * job->group, blocks = (n + XV - 1) / XV;
  const int32_t small = n / blocks, big = n % blocks;
  for (int32_t b = 0, x0 = 0; b < blocks; b++) {
    const int nb = small + (b < big);
    /* the block's queries at an odd number of lines apart, as the panels (a power-of-two D puts the columns
     * of Q^T that the S kernel walks together onto a few L1 sets: 5-10% at D 256) */
    const float *q = job->q + (size_t)x0 * D;
    int32_t ldq = D;
    _Alignas(64) float Q[XV * (QPAD_MAX_D + 16)]; /* odd_lines(D) <= D + 16 */
    if (D <= QPAD_MAX_D && odd_lines(D) != D) {
      ldq = odd_lines(D);
      for (int i = 0; i < nb; i++) memcpy(Q + (size_t)i * ldq, q + (size_t)i * D, sizeof(float) * (size_t)D);
      q = Q;
    }
    for (int32_t c0 = 0; c0 < kmax; c0 += XK) xsmm_block(&c, x0, nb, q, ldq, c0, kmax - c0 < XK ? kmax : c0 + XK);
    x0 += nb;
  }
}

/* ---- the products alone: what uattn-kernel-bench --xsmm compares the body with ---------------------------- */

size_t uattn_xsmm_products_floats(int32_t head_dim) {
  const size_t D = (size_t)head_dim;
  return 16 + D * (size_t)key_stride(XK) + XV * (size_t)odd_lines(head_dim) + 2 * (size_t)XV * XLD +
         XK * (size_t)value_stride(head_dim) + XV * D;
}

AVX2_TARGET double uattn_xsmm_products(uattn_xsmm_product which, int32_t head_dim, float *scratch) {
  const int32_t D = head_dim, P = key_stride(XK), ldq = odd_lines(D), Dv = value_stride(D);
  float *kt = (float *)align64c(scratch), *q = kt + (size_t)D * P, *S = q + (size_t)XV * ldq, *T = S + XV * XLD;
  float *vp = T + XV * XLD, *o = vp + (size_t)XK * Dv;
  if (which == UATTN_XSMM_SCORES)
    block_scores(kt, P, q, ldq, D, XV, XK, S, T);
  else
    block_values(vp, Dv, S, D, XV, XK, o);
  return 2.0 * XV * XK * D;
}

#else /* not x86: never runs (uattn_avx2_runs_here() is 0 there) */

int uattn_xsmm_runs_here(void) { return 0; }
void uattn_xsmm_attend(const uattn_panel_job *job, int32_t panel_keys) {
  (void)job;
  (void)panel_keys;
}
size_t uattn_xsmm_products_floats(int32_t head_dim) {
  (void)head_dim;
  return 0;
}
double uattn_xsmm_products(uattn_xsmm_product which, int32_t head_dim, float *scratch) {
  (void)which;
  (void)head_dim;
  (void)scratch;
  return 0.0;
}

#endif
