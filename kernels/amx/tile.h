/* The few AMX tile operations the amx set uses, in two forms, so that its code is written once:
 *   AMX_TILE_HW defined: the instructions (ldtilecfg, tileloadd, tilestored, tilezero, tdpbf16ps);
 *   otherwise, the twin: eight tiles in memory and tdpbf16ps emulated in plain C.
 * tdpbf16ps, as this emulation computes it: for each element C[m][n] of the destination, the even products
 * a[m][2k] b[k][2n] summed over the K pairs of the instruction in order of k, starting from zero, each
 * addition an fp32 FMA rounded to nearest even; the odd products a[m][2k+1] b[k][2n+1] the same in a second
 * sum; then C + (even + odd), each of those two additions rounded to nearest even. Denormal inputs (C
 * included) are read as zeros of their sign and every denormal result is flushed to a zero of its sign.
 * That is not the order of Intel's pseudocode (each pair's two products added to C in turn); it is what a
 * Sapphire Rapids-class core (family 6 model 207) computes, checked bit for bit on 15 million elements of
 * random tiles with normal, tiny and denormal operands (tests/kernels/test_kernels/amx.c holds the instruction to
 * this emulation where AMX runs). The sums are per instruction, so the twin reproduces the kernel's bits
 * only with the same tile shapes, which is why both share this layer. The emulation's one assumption:
 * MXCSR with neither DAZ nor FTZ set (the default), as avx512bf16/vec.h's. */
#ifndef UATTN_AMX_TILE_H
#define UATTN_AMX_TILE_H

#include <stdint.h>
#include <string.h>

/* ldtilecfg's 64 bytes (palette 1) */
typedef struct amx_config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_config;

#if defined(AMX_TILE_HW)
#include <immintrin.h>

#define AMX_TARGET                                                                                                     \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma,f16c")))
#define AMX_INLINE                                                                                                     \
  static inline __attribute__((always_inline,                                                                          \
                               target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma,"    \
                                      "f16c")))

typedef struct amx_tiles {
  char unused; /* the tiles are registers; the twin's are this struct */
} amx_tiles;

/* statements, each a single instruction (and compiler barriers): tile numbers must be constants (registers); t is the twin's */
#define amx_configure(t, cfg) _tile_loadconfig(cfg)
#define amx_release(t) _tile_release()
#define amx_zero(t, n) _tile_zero(n)
/* GCC's tileloadd is an asm that does not say it reads memory, so the compiler could move C stores to the
 * tile's rows past it: the barrier keeps them before. */
#define amx_load(t, n, p, stride)                                                                                      \
  do {                                                                                                                 \
    __asm__ volatile("" ::: "memory");                                                                                 \
    _tile_loadd(n, p, (long)(stride));                                                                                 \
  } while (0)
#define amx_store(t, n, p, stride) _tile_stored(n, p, (long)(stride))
#define amx_dpbf16(t, c, a, b) _tile_dpbf16ps(c, a, b)

#else /* the twin */

#include "common/vec8.h"

#define AMX_TARGET AVX2_TARGET
#define AMX_INLINE AVX2_INLINE

typedef struct amx_tiles {
  uint8_t rows[8];
  uint16_t colsb[8];
  uint32_t t[8][16][16];
} amx_tiles;

static inline float amx_flush(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if (!(u & 0x7f800000u)) u &= 0x80000000u;
  memcpy(&x, &u, 4);
  return x;
}
static inline float amx_bf16_daz(uint32_t pair, int hi) {
  return amx_flush(uattn_bf16_to_f32((uint16_t)(pair >> (16 * hi))));
}

static inline void amx_configure(amx_tiles *t, const amx_config *cfg) {
  for (int n = 0; n < 8; n++) t->rows[n] = cfg->rows[n], t->colsb[n] = cfg->colsb[n];
}
static inline void amx_release(amx_tiles *t) { (void)t; }
static inline void amx_zero(amx_tiles *t, int n) { memset(t->t[n], 0, sizeof t->t[n]); }
static inline void amx_load(amx_tiles *t, int n, const void *p, size_t stride) {
  for (int r = 0; r < t->rows[n]; r++) memcpy(t->t[n][r], (const char *)p + (size_t)r * stride, t->colsb[n]);
}
static inline void amx_store(amx_tiles *t, int n, void *p, size_t stride) {
  for (int r = 0; r < t->rows[n]; r++) memcpy((char *)p + (size_t)r * stride, t->t[n][r], t->colsb[n]);
}
/* tdpbf16ps C(c) += A(a) B(b), in the order the header describes */
AMX_TARGET static void amx_dpbf16(amx_tiles *t, int c, int a, int b) {
  const int M = t->rows[c], N = t->colsb[c] / 4, K = t->colsb[a] / 4;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      float even = 0.0f, odd = 0.0f;
      for (int k = 0; k < K; k++) {
        const uint32_t x = t->t[a][m][k], y = t->t[b][k][n];
        even = amx_flush(fmaf(amx_bf16_daz(x, 0), amx_bf16_daz(y, 0), even));
        odd = amx_flush(fmaf(amx_bf16_daz(x, 1), amx_bf16_daz(y, 1), odd));
      }
      float acc;
      memcpy(&acc, &t->t[c][m][n], 4);
      acc = amx_flush(amx_flush(acc) + amx_flush(even + odd));
      memcpy(&t->t[c][m][n], &acc, 4);
    }
}

#endif

#endif
