/* Inputs the oracle refuses: each fails with a message and writes nothing, tiled caches need whole tiles and
 * dimension pairs, and a cross step without its cross arrays or with bad ones, or bad row selections, fails. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "env.h"
/* ================================================================================================ */
/* inputs the oracle refuses                                                                          */
/* ================================================================================================ */

#define OUT_SENTINEL 12345.0

/* A small valid step (2 requests, bs 2; request 0 has 3 cached keys) to break one thing at a time. */
static void bad_base(env *e) {
  env_init(e, layer(2, 1, 2, UATTN_F32), 2, (int32_t[]){3, 0}, (int32_t[]){1, 2}, (int32_t[]){1, 1}, 2, 31);
  zero_keys_step(e, 0, true);
  zero_keys_step(e, 1, true);
}

/* write_cache and attention on a broken step: each that must fail returns -1 with a message; the caches
 * never change when write_cache fails, nor out/lse when attention does. */
static void expect_refused(env *e, const oracle_step *s, const char *why, bool write_fails, bool attn_fails) {
  const size_t bytes = e->cache_elems * 4; /* the base is f32 */
  void *kc = malloc(bytes), *vc = malloc(bytes);
  memcpy(kc, e->kc, bytes);
  memcpy(vc, e->vc, bytes);
  const size_t n = (size_t)e->T * 2;
  for (size_t i = 0; i < n * 2; i++) e->out[i] = OUT_SENTINEL;
  for (size_t i = 0; i < n; i++) e->lse[i] = OUT_SENTINEL;
  oracle_set_num_threads(0);
  const int w = oracle_write_cache(s, &e->L, &e->t);
  if (write_fails) {
    cr_assert(w == -1 && oracle_last_error()[0] != '\0', "%s: write_cache returned %d", why, w);
    cr_assert(memcmp(kc, e->kc, bytes) == 0 && memcmp(vc, e->vc, bytes) == 0, "%s: the caches changed", why);
  } else {
    cr_assert(w == 0, "%s: write_cache failed: %s", why, oracle_last_error());
  }
  const int a = oracle_attention(s, &e->L, &e->t, e->out, e->lse);
  if (attn_fails) {
    cr_assert(a == -1 && oracle_last_error()[0] != '\0', "%s: attention returned %d", why, a);
    for (size_t i = 0; i < n * 2; i++) cr_assert(e->out[i] == OUT_SENTINEL, "%s: out changed", why);
    for (size_t i = 0; i < n; i++) cr_assert(e->lse[i] == OUT_SENTINEL, "%s: lse changed", why);
  } else {
    cr_assert(a == 0, "%s: attention failed: %s", why, oracle_last_error());
  }
  free(kc);
  free(vc);
}

/* A fresh base, one statement that breaks it, then the verdicts. */
#define REFUSE_CASE(why, write_fails, attn_fails, ...)                                                                 \
  do {                                                                                                                 \
    env e_;                                                                                                            \
    bad_base(&e_);                                                                                                     \
    env *e = &e_;                                                                                                      \
    __VA_ARGS__;                                                                                                       \
    expect_refused(e, &e->s, why, write_fails, attn_fails);                                                            \
    env_free(&e_);                                                                                                     \
  } while (0)

Test(refuse, bad_inputs_fail_with_a_message_and_write_nothing) {
  {
    env e;
    bad_base(&e);
    env_run(&e); /* the base itself is fine */
    expect_refused(&e, NULL, "null step", true, true);
    env_free(&e);
  }
  REFUSE_CASE("Hq not a multiple of Hkv", true, true, e->L.num_kv_heads = 3);
  REFUSE_CASE("zero head_dim", true, true, e->L.head_dim = 0);
  REFUSE_CASE("bad dtype", true, true, e->L.dtype = (uattn_dtype)9);
  REFUSE_CASE("bad cache dtype", true, true, e->L.cache_dtype = (uattn_dtype)9);
  REFUSE_CASE("bad layout", true, true, e->L.kv_layout = (uattn_kv_layout)3);
  REFUSE_CASE("TILED on block size 2", true, true, e->L.kv_layout = UATTN_LAYOUT_TILED);
  REFUSE_CASE("bad attn_type", true, true, e->L.attn_type = 4);
  REFUSE_CASE("negative num_scheduled", true, true, e->ns[1] = -1);
  REFUSE_CASE("negative num_computed", true, true, e->nc[0] = -1);
  REFUSE_CASE("zero block size", true, true, e->s.block_size = 0);
  /* request 0's column 1 holds p = 2 (read) and p = 3 (written) */
  REFUSE_CASE("block id past num_blocks", true, true, e->bt[1] = e->nb);
  REFUSE_CASE("block table too short", true, true, e->s.block_table_stride = 1);
  REFUSE_CASE("null block table", true, true, e->s.block_table = NULL);
  REFUSE_CASE("null caches", true, true, e->t.key_cache = NULL; e->t.value_cache = NULL);
  REFUSE_CASE("null k", true, true, e->t.k = NULL);
  REFUSE_CASE("null q", false, true, e->t.q = NULL);
  /* attention reads every key from the cache, this step's as written: a broken block under them is both
   * functions' to refuse, two tokens written to one slot write_cache's */
  REFUSE_CASE("negative block id, written", true, true, e->bt[e->stride] = -1);
  REFUSE_CASE("two tokens on one slot", true, false, e->nc[1] = 2; e->bt[e->stride + 1] = e->bt[1]);
  /* ... and a bad block under cached keys only is attention's */
  REFUSE_CASE("negative block id, read only", false, true, e->bt[0] = -5);
}

/* TILED needs whole 16-key tiles and dim pairs: block sizes 8 and 24 and an odd head dim are refused by
 * write_cache and attention alike, with a message naming the layout, the caches and outputs untouched; the
 * same steps on NHD, and TILED on block 16 and 32 with an even head dim, are fine. */
Test(refuse, tiled_needs_whole_tiles_and_dim_pairs) {
  const struct {
    int32_t bs, D;
    bool ok;
  } cases[] = {{8, 2, false}, {24, 2, false}, {16, 3, false}, {32, 5, false}, {16, 2, true}, {32, 4, true}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    env e;
    uattn_layer L = layer(2, 1, cases[i].D, UATTN_F32);
    L.kv_layout = UATTN_LAYOUT_TILED;
    env_init(&e, L, 2, (int32_t[]){20, 0}, (int32_t[]){1, 3}, NULL, cases[i].bs, 32);
    const size_t bytes = e.cache_elems * 4, n = (size_t)e.T * 2;
    void *kc = malloc(bytes), *vc = malloc(bytes);
    memcpy(kc, e.kc, bytes);
    memcpy(vc, e.vc, bytes);
    for (size_t x = 0; x < n * (size_t)cases[i].D; x++) e.out[x] = OUT_SENTINEL;
    const int w = oracle_write_cache(&e.s, &e.L, &e.t);
    if (cases[i].ok) {
      cr_assert_eq(w, 0, "bs %d D %d: %s", cases[i].bs, cases[i].D, oracle_last_error());
      cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), 0, "%s", oracle_last_error());
    } else {
      cr_assert_eq(w, -1, "bs %d D %d: write_cache accepted TILED", cases[i].bs, cases[i].D);
      cr_assert(strstr(oracle_last_error(), "TILED") != NULL, "%s", oracle_last_error());
      cr_assert(memcmp(kc, e.kc, bytes) == 0 && memcmp(vc, e.vc, bytes) == 0, "bs %d D %d: the caches changed",
                cases[i].bs, cases[i].D);
      cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1, "bs %d D %d: attention accepted TILED",
                   cases[i].bs, cases[i].D);
      cr_assert(strstr(oracle_last_error(), "TILED") != NULL, "%s", oracle_last_error());
      for (size_t x = 0; x < n * (size_t)cases[i].D; x++)
        cr_assert(e.out[x] == OUT_SENTINEL, "bs %d D %d: out changed", cases[i].bs, cases[i].D);
      e.L.kv_layout = UATTN_LAYOUT_NHD;
      cr_assert_eq(oracle_write_cache(&e.s, &e.L, &e.t), 0, "NHD: %s", oracle_last_error());
      cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), 0, "NHD: %s", oracle_last_error());
    }
    free(kc);
    free(vc);
    env_free(&e);
  }
}

Test(refuse, cross_and_row_selection) {
  {
    env e;
    bad_base(&e);
    e.L.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
    e.t.cross = NULL;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1);
    e.t.cross = &e.cross;
    e.cbt[0] = e.nb + 4;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1);
    cr_assert(strstr(oracle_last_error(), "cross") != NULL, "%s", oracle_last_error());
    e.cbt[0] = 0;
    e.enc[1] = -1;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), -1);
    e.enc[1] = 1;
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, e.lse), 0, "%s", oracle_last_error());
    env_free(&e);
  }
  {
    env e;
    bad_base(&e);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 1, (int32_t[]){3}, e.out, e.lse), -1);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 1, (int32_t[]){-1}, e.out, e.lse), -1);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 2, NULL, e.out, e.lse), -1);
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, NULL, e.lse), -1);
    cr_assert_eq(oracle_attention_rows(&e.s, &e.L, &e.t, 0, NULL, e.out, e.lse), 0);
    cr_assert_eq(oracle_attention(&e.s, &e.L, &e.t, e.out, NULL), 0, "lse is optional: %s", oracle_last_error());
    env_free(&e);
  }
}
