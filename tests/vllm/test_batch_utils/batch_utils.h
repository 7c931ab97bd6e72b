/* The vLLM batch utilities (runtime/vllm/) against: the seeds' own worked examples, hand-computed
 * cases, brute-force re-statements written here as plain loops over tokens and positions (not the
 * library's arithmetic), an exhaustive breadth-first search for the fewest swaps, golden outputs of a
 * numpy re-statement of the seed code (tests/ref/vllm_utils_ref.py), and every kind of bad input, which
 * must fail with a message and leave every output as it was. This header holds the helpers the suite's files
 * share (batch_utils.c). */
#ifndef UATTN_TEST_BATCH_UTILS_H
#define UATTN_TEST_BATCH_UTILS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uattn.h"
#include "uattn_vllm.h"

/* No .timeout here: with timeouts and --jobs 2, Criterion 2.4.1's runner leaks in the parent process and
 * LeakSanitizer then fails the whole suite. ctest's own timeout catches a hang. */
#define S32 ((int32_t)0x5A5A5A5A) /* sentinel: outputs are pre-filled with it to see what a call wrote */
#define S64 ((int64_t)0x5A5A5A5A5A5A5A5ALL)

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, UATTN_OK, "%s returned %s: %s", #call, uattn_status_name(st_), uattn_last_error());              \
  } while (0)

/* A call that must fail with `want`, say why, and leave the outputs as they were (`untouched`). */
#define CHECK_FAILS(want, untouched, call)                                                                             \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, (want), "%s returned %s, expected %s (%s)", #call, uattn_status_name(st_),                       \
                 uattn_status_name(want), uattn_last_error());                                                         \
    cr_assert_neq(uattn_last_error()[0], '\0', "%s failed without a message", #call);                                  \
    cr_assert((untouched), "%s wrote to an output although it failed", #call);                                         \
  } while (0)
void fill32(int32_t *a, size_t n);
void fill64(int64_t *a, size_t n);
bool untouched32(const int32_t *a, size_t n);
bool untouched64(const int64_t *a, size_t n);
/* every byte still 0xA5 */
bool untouched_bytes(const void *p, size_t n);
void assert_msg_has(const char *needle);
void assert_i32s(const int32_t *got, const int32_t *want, int32_t n, const char *what, int case_no);
void qsl_from_lens(const int32_t *lens, int32_t n, int32_t *qsl);
void assert_split(uattn_batch_split got, int32_t nd, int32_t ne, int32_t np, int32_t tdt, int32_t tet, int32_t tpt,
                  int case_no);

/* Regions as the seed defines them: 2 prefill (no context), 0 decode (short), 1 extend. */
int region(int32_t sched, int32_t comp, int32_t thr);
/* The region of request i under the seed's rule (prompt NULL) or today's. */
int region_at(const int32_t *sched, const int32_t *comp, const int32_t *prompt, int32_t thr, int32_t i);
/* Applies the swaps to the identity and checks the result is in region order and matches `order`. */
void check_reordered(const int32_t *sched, const int32_t *comp, const int32_t *prompt, int32_t n, int32_t thr,
                     const uattn_swap *swaps, int32_t num_swaps, const int32_t *order, int case_no);

/* A JSON case's integer, or array of integers (at most cap; returns the count). */
int32_t jint(const cJSON *obj, const char *key);
int32_t jints(const cJSON *obj, const char *key, int32_t *out, int cap);
/* The tests directory ($UATTN_TESTS_DIR, else this file's folder), in a static buffer. */
const char *tests_dir(void);

#endif
