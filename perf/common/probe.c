#define _GNU_SOURCE /* syscall(), for the OS's grant of the AMX tile state */
#include "common/probe.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define PROBE_X86 1
/* compilers that know the avx512bf16 target and its intrinsics; older ones report the peak as absent */
#if defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10
#define PROBE_BF16 1
#endif
/* and the AMX ones (amx-tile, amx-bf16), on Linux, the one OS whose grant of the tile state this asks for */
#if defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#include <sys/syscall.h>
#include <unistd.h>
#define PROBE_AMX 1
#endif
#endif

/* Every loop starts its chains from distinct values: chains that start equal and take the same operands are one
 * chain to the compiler, which keeps one and drops the rest. */

#ifdef PROBE_X86
/* The loops' own names in the object, for tests/tools/probe_loops.py: never inlined into a caller, never cloned. */
#if defined(__clang__)
#define PROBE_LOOP noinline
#else
#define PROBE_LOOP noinline, noclone
#endif

/* CPUID leaf 7's EBX has every bit of `need`, leaf 1's ECX FMA, and the OS saves every state of `xcr0` (XCR0
 * bits: 0x6 SSE and AVX, 0xe0 the opmask and zmm registers, 0x60000 the tiles), without which the first such
 * instruction faults. leaf7: leaf 7 subleaf 0's registers, where the caller wants more of them. */
static int cpu_has(unsigned need, unsigned xcr0, unsigned leaf7[4]) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_FMA)) return 0;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & xcr0) != xcr0 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  if (leaf7) leaf7[0] = a, leaf7[1] = b, leaf7[2] = c, leaf7[3] = d;
  return (b & need) == need;
}

enum { XCR0_YMM = 0x6, XCR0_ZMM = 0xe6, XCR0_TILES = 0x60006 };

int bench_probe_fma_lanes(void) {
  if (cpu_has(bit_AVX512F, XCR0_ZMM, NULL)) return 16;
  return cpu_has(bit_AVX2, XCR0_YMM, NULL) ? 8 : 1;
}

__attribute__((target("avx512f"), PROBE_LOOP)) static double probe_fma_zmm(long iters) {
  __m512 a[BENCH_PROBE_FMA_CHAINS];
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int k = 0; k < BENCH_PROBE_FMA_CHAINS; k++) a[k] = _mm512_set1_ps((float)k);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int k = 0; k < BENCH_PROBE_FMA_CHAINS; k++) a[k] = _mm512_fmadd_ps(a[k], b, c);
  }
  __m512 s = a[0];
  for (int k = 1; k < BENCH_PROBE_FMA_CHAINS; k++) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"), PROBE_LOOP)) static double probe_fma_ymm(long iters) {
  __m256 a[BENCH_PROBE_FMA_CHAINS];
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int k = 0; k < BENCH_PROBE_FMA_CHAINS; k++) a[k] = _mm256_set1_ps((float)k);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int k = 0; k < BENCH_PROBE_FMA_CHAINS; k++) a[k] = _mm256_fmadd_ps(a[k], b, c);
  }
  __m256 s = a[0];
  for (int k = 1; k < BENCH_PROBE_FMA_CHAINS; k++) s = _mm256_add_ps(s, a[k]);
  float t[8];
  _mm256_storeu_ps(t, s);
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

__attribute__((target("avx2"), PROBE_LOOP)) static double probe_read_ymm(const float *x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(x + i + 24));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

__attribute__((target("avx2"))) void bench_probe_read_words(const char *p, size_t n, float sink[8]) {
  __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (size_t i = 0; i < n; i += 128)
    for (int x = 0; x < 4; x++) a[x] = _mm256_add_epi16(a[x], _mm256_loadu_si256((const __m256i *)(p + i + 32 * x)));
  const __m256i t = _mm256_add_epi16(_mm256_add_epi16(a[0], a[1]), _mm256_add_epi16(a[2], a[3]));
  _mm256_storeu_ps(sink, _mm256_castsi256_ps(t));
}
#else
int bench_probe_fma_lanes(void) { return 1; }
void bench_probe_read_words(const char *p, size_t n, float sink[8]) { (void)n, sink[0] = (float)p[0]; }
#endif

/* The scalar loops, where the CPU has no vector FMA these know. */
static double probe_fma_scalar(long iters) {
  float a[BENCH_PROBE_FMA_CHAINS];
  for (int k = 0; k < BENCH_PROBE_FMA_CHAINS; k++) a[k] = (float)k;
  for (long i = 0; i < iters; i++)
    for (int k = 0; k < BENCH_PROBE_FMA_CHAINS; k++) a[k] = a[k] * 0.999999f + 1e-7f;
  double s = 0;
  for (int k = 0; k < BENCH_PROBE_FMA_CHAINS; k++) s += a[k];
  return s;
}

static double probe_read_scalar(const float *x, size_t n) {
  float a[BENCH_PROBE_READ_CHAINS] = {0};
  for (size_t i = 0; i + BENCH_PROBE_READ_CHAINS <= n; i += BENCH_PROBE_READ_CHAINS)
    for (int k = 0; k < BENCH_PROBE_READ_CHAINS; k++) a[k] += x[i + (size_t)k];
  return (double)a[0] + a[1] + a[2] + a[3];
}

double bench_probe_fma(long iters, int lanes) {
#ifdef PROBE_X86
  if (lanes == 16) return probe_fma_zmm(iters);
  if (lanes == 8) return probe_fma_ymm(iters);
#endif
  (void)lanes;
  return probe_fma_scalar(iters);
}

double bench_probe_read(const float *x, size_t n) {
#ifdef PROBE_X86
  if (bench_probe_fma_lanes() >= 8) return probe_read_ymm(x, n);
#endif
  return probe_read_scalar(x, n);
}

#ifdef PROBE_BF16
int bench_probe_has_bf16_dot(void) {
  unsigned sub[4], a, b, c, d;
  /* the loop's broadcasts of 16-bit words need AVX-512BW */
  if (!cpu_has(bit_AVX512F | bit_AVX512BW, XCR0_ZMM, sub) || sub[0] < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d))
    return 0;
  return (int)(a >> 5 & 1); /* AVX512_BF16 */
}

__attribute__((target("avx512f,avx512bw,avx512bf16"), PROBE_LOOP)) static double probe_bf16_dot_zmm(long iters) {
  __m512 a[BENCH_PROBE_BF16_CHAINS];
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380); /* 1, 2^-24 */
  for (int k = 0; k < BENCH_PROBE_BF16_CHAINS; k++) a[k] = _mm512_set1_ps((float)k);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int k = 0; k < BENCH_PROBE_BF16_CHAINS; k++) a[k] = _mm512_dpbf16_ps(a[k], x, y);
  }
  __m512 s = a[0];
  for (int k = 1; k < BENCH_PROBE_BF16_CHAINS; k++) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}

double bench_probe_bf16_dot(long iters) { return bench_probe_has_bf16_dot() ? probe_bf16_dot_zmm(iters) : 0.0; }
#else
int bench_probe_has_bf16_dot(void) { return 0; }
double bench_probe_bf16_dot(long iters) {
  (void)iters;
  return 0.0;
}
#endif

#ifdef PROBE_AMX
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* Whether the CPU has AMX-TILE and AMX-BF16 (leaf 7 EDX bits 24, 22) and the OS enables the tile state
 * (XCR0 bits 17, 18), then whether Linux grants it to this process. */
static int amx_granted(void) {
  unsigned leaf7[4];
  if (!cpu_has(0, XCR0_TILES, leaf7) || !(leaf7[3] >> 24 & 1) || !(leaf7[3] >> 22 & 1)) return 0;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int bench_probe_has_amx(void) {
  static int granted = -1; /* asked once; the first call comes before the probe's threads start */
  if (granted < 0) granted = amx_granted();
  return granted;
}

/* LDTILECFG's 64 bytes, palette 1. */
typedef struct amx_config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_config;

__attribute__((target("amx-tile,amx-bf16"), PROBE_LOOP)) static double probe_amx_bf16(long iters) {
  amx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64; /* every tile 16 rows of 64 bytes */
  _Alignas(64) uint16_t ab[2][16 * 32];
  for (int i = 0; i < 16 * 32; i++) ab[0][i] = 0x3f80, ab[1][i] = 0x3380; /* 1, 2^-24 */
  _Alignas(64) float c[16 * 16];
  _tile_loadconfig(&cfg);
  _tile_zero(0); /* tile instructions are volatile asm to the compiler: equal starts stay four chains */
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab[0], 64);
  _tile_loadd(5, ab[1], 64);
  _tile_loadd(6, ab[0], 64);
  _tile_loadd(7, ab[1], 64);
  for (long i = 0; i < iters; i++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0] + c[255];
}

double bench_probe_amx(long iters) { return bench_probe_has_amx() ? probe_amx_bf16(iters) : 0.0; }
#else
int bench_probe_has_amx(void) { return 0; }
double bench_probe_amx(long iters) {
  (void)iters;
  return 0.0;
}
#endif
