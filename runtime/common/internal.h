/* Internal helpers shared by the runtime: error reporting, checked arithmetic, the plan allocator.
 * Nothing here is public. */
#ifndef UATTN_INTERNAL_H
#define UATTN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "uattn.h"

#if defined(__GNUC__)
#define UATTN_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define UATTN_PRINTF(fmt_idx, arg_idx)
#endif

/* Records a message for uattn_last_error() on this thread and returns status, so a check reads
 * `return uattn_fail(UATTN_ERR_..., "what was wrong and what to do", ...);`. */
uattn_status uattn_fail(uattn_status status, const char *fmt, ...) UATTN_PRINTF(2, 3);
/* Clears this thread's message; every public entry point calls it first. */
void uattn_clear_error(void);

/* Checks a caller's pointer: not NULL, and aligned as its element type needs (the code reads and writes
 * through it as that type, and a misaligned access is undefined behaviour; uattn.h's conventions promise
 * a status instead). `what` names the argument in the message. A void pointer is checked against its
 * dtype with UATTN_CHECK_ALIGNMENT. */
#define UATTN_CHECK_PTR(ptr, what)                                                                                     \
  do {                                                                                                                 \
    if ((ptr) == NULL) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s must not be NULL", (what));                   \
    UATTN_CHECK_ALIGNMENT((ptr), __alignof__(*(ptr)), (what));                                                         \
  } while (0)

/* The same for an optional pointer: NULL passes. */
#define UATTN_CHECK_ALIGNED(ptr, what)                                                                                 \
  do {                                                                                                                 \
    if ((ptr) != NULL) UATTN_CHECK_PTR((ptr), (what));                                                                 \
  } while (0)

/* Checks that ptr is a multiple of align bytes. */
#define UATTN_CHECK_ALIGNMENT(ptr, align, what)                                                                        \
  do {                                                                                                                 \
    if ((uintptr_t)(const void *)(ptr) % (align) != 0)                                                                 \
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s = %p is misaligned: its elements need %zu-byte alignment",     \
                        (what), (const void *)(ptr), (size_t)(align));                                                 \
  } while (0)

/* The allocator a plan or runtime was created with, resolved once (NULL hooks mean malloc). */
typedef struct uattn_alloc {
  uattn_allocator hooks;
  int64_t count; /* allocations made through it, for the no-allocation-per-step guarantee */
  size_t bytes;  /* bytes currently held */
} uattn_alloc;

uattn_status uattn_alloc_init(uattn_alloc *a, const uattn_allocator *hooks);
/* 64-byte aligned; NULL on failure (the caller reports). */
void *uattn_alloc_bytes(uattn_alloc *a, size_t bytes);
void uattn_alloc_release(uattn_alloc *a, void *ptr, size_t bytes);

/* A growable array owned by an allocator: grows geometrically, never shrinks, so a workload reaches a
 * steady state with no allocation. */
typedef struct uattn_buf {
  void *data;
  size_t bytes;
} uattn_buf;

/* Makes buf hold at least `bytes`; the old contents are not kept. */
uattn_status uattn_buf_reserve(uattn_alloc *a, uattn_buf *buf, size_t bytes);
void uattn_buf_release(uattn_alloc *a, uattn_buf *buf);

/* a * b into *out, false on int32 overflow or a negative operand. */
static inline int uattn_mul_i32(int32_t a, int32_t b, int32_t *out) {
  int64_t p = (int64_t)a * (int64_t)b;
  if (a < 0 || b < 0 || p > INT32_MAX) return 0;
  *out = (int32_t)p;
  return 1;
}

static inline int32_t uattn_min_i32(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t uattn_max_i32(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t uattn_clamp_i32(int32_t v, int32_t lo, int32_t hi) { return v < lo ? lo : (v > hi ? hi : v); }
static inline int32_t uattn_ceil_div_i32(int32_t a, int32_t b) { return (int32_t)(((int64_t)a + b - 1) / b); }

#endif /* UATTN_INTERNAL_H */
