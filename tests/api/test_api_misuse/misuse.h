/* The table runner of the misuse suite (misuse.c says what the suite checks): a public function's arguments
 * in a struct, rows that each edit one field of them, and the suite's fixture (a planned step and a runtime)
 * that the valid arguments start from. */
#ifndef UATTN_TEST_MISUSE_H
#define UATTN_TEST_MISUSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uattn.h"

#define CANARY 0xa5
#define MAX_REGIONS 6
#define MAX_STATE 2048
#define REFUSED ((uattn_status)-1) /* any error status will do (the message is still checked) */

/* Memory a call may write. keep: an in/out buffer whose bytes are inputs too, compared but not filled. */
typedef struct region {
  void *ptr;
  size_t bytes;
  bool keep;
} region;

typedef enum edit_kind { EDIT_NONE, EDIT_NULL, EDIT_I32, EDIT_SIZE, EDIT_MISALIGN } edit_kind;

/* One change to an argument: the field at `field` of the argument struct set to NULL, to an int32 (counts
 * and enums), to a size_t, or (a pointer) moved one byte on. */
typedef struct edit {
  size_t field;
  edit_kind kind;
  int64_t value;
} edit;

typedef struct misuse {
  const char *label;
  edit edits[3];
  uattn_status want;  /* UATTN_OK: the input is legal and the call must succeed; REFUSED: any error */
  const char *needle; /* what the message must mention: the argument, or the problem */
} misuse;

/* A public function under test, called through a struct holding its arguments. The struct's w member is
 * the storage its outputs point into; init makes valid arguments, so that each row breaks one thing. */
typedef struct api_fn {
  const char *name;
  size_t size, w_offset, w_bytes;
  void (*init)(void *args);
  uattn_status (*call)(void *args);
  /* optional: more memory the call may write (heap buffers, in/out structs); returns how many */
  int (*more)(void *args, region *out);
  /* optional: an image of the state of an object the call may change (a plan, a runtime's tuning) */
  size_t (*state)(void *args, unsigned char *image);
  /* optional: frees what a successful call made */
  void (*fini)(void *args, uattn_status st);
} api_fn;

#define API_FN(fn, T, ...)                                                                                             \
  { #fn, sizeof(T), offsetof(T, w), sizeof(((T *)0)->w), fn##_init, fn##_call, __VA_ARGS__ }

#define CASE(T, f, kind, v, want, needle)                                                                              \
  { #f " " #kind " " #v, {{offsetof(T, f), kind, (v) } }, want, needle }
#define NULL_ARG(T, f, needle) CASE(T, f, EDIT_NULL, 0, UATTN_ERR_INVALID_ARGUMENT, needle)
#define MISALIGNED(T, f, needle) CASE(T, f, EDIT_MISALIGN, 1, UATTN_ERR_INVALID_ARGUMENT, needle)
/* a pointer to typed memory: NULL, and misaligned */
#define POINTER_ARG(T, f, needle) NULL_ARG(T, f, needle), MISALIGNED(T, f, needle)
#define SET(T, f, v, want, needle) CASE(T, f, EDIT_I32, v, want, needle)
/* -1 and 0 (zero: what 0 must give) of a count that is an array's length; COUNT adds INT32_MAX (max: what
 * it must give, UATTN_OK for a capacity) */
#define LENGTH(T, f, zero, needle) SET(T, f, -1, REFUSED, needle), SET(T, f, 0, zero, needle)
#define COUNT(T, f, zero, max, needle) LENGTH(T, f, zero, needle), SET(T, f, INT32_MAX, max, needle)
#define ENUM(T, f, needle) SET(T, f, 99, REFUSED, needle), SET(T, f, -1, REFUSED, needle)

void run_table(const api_fn *fn, const misuse *cases, size_t count);
#define RUN(fn, cases) run_table(&(fn), (cases), sizeof(cases) / sizeof((cases)[0]))

/* The fixture, made by the suite's init: a planned step (valid_step under plan_config) and a runtime. */
extern uattn_plan *plan;
extern uattn_runtime *rt;
uattn_plan_config plan_config(void);
uattn_step valid_step(void);

#endif
