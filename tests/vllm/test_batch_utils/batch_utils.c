/* The batch utilities suite's shared helpers (batch_utils.h): sentinel-filled outputs, assertions on splits
 * and orders, the reorder regions, and reading the JSON cases. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_utils.h"
#include "common/support.h"

void fill32(int32_t *a, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] = S32;
}
void fill64(int64_t *a, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] = S64;
}
bool untouched32(const int32_t *a, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != S32) return false;
  return true;
}
bool untouched64(const int64_t *a, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != S64) return false;
  return true;
}
bool untouched_bytes(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != 0xA5) return false;
  return true;
}

void assert_msg_has(const char *needle) {
  cr_assert(strstr(uattn_last_error(), needle) != NULL, "message \"%s\" does not mention \"%s\"", uattn_last_error(),
            needle);
}

void assert_i32s(const int32_t *got, const int32_t *want, int32_t n, const char *what, int case_no) {
  for (int32_t i = 0; i < n; i++)
    cr_assert_eq(got[i], want[i], "case %d: %s[%d] = %d, expected %d", case_no, what, i, got[i], want[i]);
}

void qsl_from_lens(const int32_t *lens, int32_t n, int32_t *qsl) {
  qsl[0] = 0;
  for (int32_t i = 0; i < n; i++) qsl[i + 1] = qsl[i] + lens[i];
}

void assert_split(uattn_batch_split got, int32_t nd, int32_t ne, int32_t np, int32_t tdt, int32_t tet, int32_t tpt,
                  int case_no) {
  cr_assert(got.num_decodes == nd && got.num_extends == ne && got.num_prefills == np && got.num_decode_tokens == tdt &&
                got.num_extend_tokens == tet && got.num_prefill_tokens == tpt,
            "case %d: got (%d, %d, %d, %d, %d, %d), expected (%d, %d, %d, %d, %d, %d)", case_no, got.num_decodes,
            got.num_extends, got.num_prefills, got.num_decode_tokens, got.num_extend_tokens, got.num_prefill_tokens, nd,
            ne, np, tdt, tet, tpt);
}

int region(int32_t sched, int32_t comp, int32_t thr) { return comp == 0 ? 2 : (sched <= thr ? 0 : 1); }

/* Regions as today's vLLM defines them: 3 prefill (no context), 2 long extend (more than thr tokens), 0
 * decode (short, prompt done), 1 short extend (short, prompt not done). */
static int region4(int32_t sched, int32_t comp, int32_t prompt, int32_t thr) {
  if (comp == 0) return 3;
  if (sched > thr) return 2;
  return comp >= prompt ? 0 : 1;
}

int region_at(const int32_t *sched, const int32_t *comp, const int32_t *prompt, int32_t thr, int32_t i) {
  return prompt ? region4(sched[i], comp[i], prompt[i], thr) : region(sched[i], comp[i], thr);
}

void check_reordered(const int32_t *sched, const int32_t *comp, const int32_t *prompt, int32_t n, int32_t thr,
                     const uattn_swap *swaps, int32_t num_swaps, const int32_t *order, int case_no) {
  int32_t *batch = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  for (int32_t i = 0; i < n; i++) batch[i] = i;
  for (int32_t k = 0; k < num_swaps; k++) {
    cr_assert(swaps[k].a >= 0 && swaps[k].a < n && swaps[k].b >= 0 && swaps[k].b < n && swaps[k].a != swaps[k].b,
              "case %d: swap %d = (%d, %d) is not a swap of two positions", case_no, k, swaps[k].a, swaps[k].b);
    int32_t t = batch[swaps[k].a];
    batch[swaps[k].a] = batch[swaps[k].b];
    batch[swaps[k].b] = t;
  }
  for (int32_t i = 1; i < n; i++) {
    int prev = region_at(sched, comp, prompt, thr, batch[i - 1]), cur = region_at(sched, comp, prompt, thr, batch[i]);
    cr_assert(prev <= cur, "case %d: after the swaps position %d (region %d) follows region %d", case_no, i, cur, prev);
  }
  if (order) assert_i32s(order, batch, n, "order", case_no);
  free(batch);
}

int32_t jint(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  cr_assert(cJSON_IsNumber(v), "missing %s", key);
  return (int32_t)v->valuedouble;
}

int32_t jints(const cJSON *obj, const char *key, int32_t *out, int cap) {
  int n = test_json_ints(cJSON_GetObjectItemCaseSensitive(obj, key), out, cap);
  cr_assert_geq(n, 0, "bad array %s", key);
  return n;
}

const char *tests_dir(void) {
  static char dir[4096];
  const char *from_env = test_env("UATTN_TESTS_DIR", NULL);
  if (from_env) {
    snprintf(dir, sizeof dir, "%s", from_env);
  } else { /* run outside ctest: the tests directory is this file's */
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash)
      *slash = '\0';
    else
      snprintf(dir, sizeof dir, ".");
  }
  return dir;
}
