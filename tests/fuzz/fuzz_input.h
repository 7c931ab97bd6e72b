/* Decoding a libFuzzer input into arguments: the input is read front to back as a stream of choices, and
 * past its end every read gives 0, so any input (the empty one too) decodes to some call. Small ranges take
 * one byte, so a mutation of one byte changes one choice. */
#ifndef UATTN_FUZZ_INPUT_H
#define UATTN_FUZZ_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct fuzz_input {
  const uint8_t *data;
  size_t size, pos;
} fuzz_input;

static inline uint8_t fuzz_u8(fuzz_input *in) { return in->pos < in->size ? in->data[in->pos++] : 0; }

static inline uint32_t fuzz_u32(fuzz_input *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)fuzz_u8(in) << (8 * i);
  return v;
}

static inline bool fuzz_bool(fuzz_input *in) { return fuzz_u8(in) & 1; }

/* A value in [lo, hi]: one byte when the range has at most 256 values, else four. */
static inline int32_t fuzz_range(fuzz_input *in, int32_t lo, int32_t hi) {
  const uint64_t span = (uint64_t)((int64_t)hi - lo) + 1;
  const uint64_t raw = span <= 256 ? fuzz_u8(in) : fuzz_u32(in);
  return (int32_t)(lo + (int64_t)(raw % span));
}

/* Mostly a value in [lo, hi]; one byte in sixteen picks a value at the edge of int32 instead, where the
 * overflow and sign checks are. */
static inline int32_t fuzz_count(fuzz_input *in, int32_t lo, int32_t hi) {
  static const int32_t edges[] = {INT32_MIN, -2, -1, 0, 1, INT32_MAX / 2 + 1, INT32_MAX - 1, INT32_MAX};
  const uint8_t b = fuzz_u8(in);
  if (b >= 240) return edges[b % (sizeof edges / sizeof *edges)];
  const uint64_t span = (uint64_t)((int64_t)hi - lo) + 1;
  return (int32_t)(lo + (int64_t)(b % span));
}

/* Like fuzz_count for a size that the library allocates for: its edges are only the ones it must refuse
 * (zero and negative), since a huge size is valid and only a slow way to run out of memory. */
static inline int32_t fuzz_size(fuzz_input *in, int32_t lo, int32_t hi) {
  static const int32_t edges[] = {INT32_MIN, -1, 0};
  const uint8_t b = fuzz_u8(in);
  if (b >= 248) return edges[b % 3];
  const uint64_t span = (uint64_t)((int64_t)hi - lo) + 1;
  return (int32_t)(lo + (int64_t)(b % span));
}

/* A float: mostly small multiples of 1/8, sometimes zero, negative, NaN or infinite. */
static inline float fuzz_float(fuzz_input *in) {
  static const float specials[] = {0.0f,  -1.0f, 1e30f, -1e30f, __builtin_inff(), -__builtin_inff(), __builtin_nanf(""),
                                   1e-40f};
  const uint8_t b = fuzz_u8(in);
  if (b >= 248) return specials[b - 248];
  return (float)((int)b - 64) / 8.0f;
}

/* n int32 values from the input, each by fuzz_count, in a heap block of exactly n elements (at least one
 * byte, so that n == 0 still gives a distinct non-NULL pointer): ASan then sees a read one past the end. */
static inline int32_t *fuzz_ints(fuzz_input *in, int32_t n, int32_t lo, int32_t hi) {
  int32_t *a = malloc(n > 0 ? sizeof(int32_t) * (size_t)n : 1);
  if (!a) abort();
  for (int32_t i = 0; i < n; i++) a[i] = fuzz_count(in, lo, hi);
  return a;
}

/* An output buffer of bytes bytes (at least one) filled with a pattern, so that fuzz_untouched can tell
 * whether a call wrote to it. */
#define FUZZ_PATTERN 0xa5
static inline void *fuzz_output(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) abort();
  memset(p, FUZZ_PATTERN, bytes ? bytes : 1);
  return p;
}

static inline bool fuzz_untouched(const void *p, size_t bytes) {
  const uint8_t *b = p;
  for (size_t i = 0; i < bytes; i++)
    if (b[i] != FUZZ_PATTERN) return false;
  return true;
}

#endif
