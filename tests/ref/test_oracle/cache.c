/* The oracle's cache update: each key and value at its slot in every layout (tiled written out here), the
 * tiled index a bijection, equal dtypes copied bit for bit, cross attention writing nothing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "env.h"
/* ================================================================================================ */
/* the cache update                                                                                   */
/* ================================================================================================ */

/* A cache of `bytes` whose every byte is the sentinel 0xA5 (malloc'd). */
static unsigned char *sentinel_filled(size_t bytes) {
  unsigned char *c = malloc(bytes);
  memset(c, 0xA5, bytes);
  return c;
}

/* The caches of a cache-update test, each `bytes` long: as the oracle wrote them and as the test expects. */
typedef struct cache_images {
  unsigned char *kc, *vc, *want_k, *want_v;
  size_t bytes;
} cache_images;

/* The oracle's update of step s (k and v in f32) into caches of nb blocks that held only the sentinel; the
 * expected images start as the sentinel too, for the test to fill in. */
static cache_images write_over_sentinel(const oracle_step *s, const uattn_layer *L, const float *k, const float *v,
                                        int32_t nb) {
  cache_images c;
  c.bytes = (size_t)nb * s->block_size * L->num_kv_heads * L->head_dim * oracle_dtype_size(L->cache_dtype);
  c.kc = sentinel_filled(c.bytes), c.vc = sentinel_filled(c.bytes);
  const uattn_tensors t = {.q = NULL, .k = k, .v = v, .key_cache = c.kc, .value_cache = c.vc, .num_blocks = nb};
  cr_assert_eq(oracle_write_cache(s, L, &t), 0, "%s", oracle_last_error());
  c.want_k = sentinel_filled(c.bytes), c.want_v = sentinel_filled(c.bytes);
  return c;
}

/* Both caches as written equal the expected images, byte for byte. */
static void expect_cache_images(const cache_images *c) {
  for (size_t i = 0; i < c->bytes; i++) {
    cr_assert_eq(c->kc[i], c->want_k[i], "key cache byte %zu: %#x, expected %#x", i, c->kc[i], c->want_k[i]);
    cr_assert_eq(c->vc[i], c->want_v[i], "value cache byte %zu: %#x, expected %#x", i, c->vc[i], c->want_v[i]);
  }
}

static void cache_images_free(cache_images *c) {
  free(c->kc);
  free(c->vc);
  free(c->want_k);
  free(c->want_v);
}

/* Two requests, bs 4, Hkv 2, D 3: request 0 has 3 cached tokens and writes p = 3..6 (block 5 slot 3, then
 * block 1 slots 0..2: slots 23, 4, 5, 6); request 1 writes p = 0, 1 to block 2 (slots 8, 9). Every other
 * element of both caches must keep its sentinel. f32 in, the given cache dtype out. */
static void check_cache_write(uattn_kv_layout layout, uattn_dtype cache_dtype) {
  uattn_layer L = layer(2, 2, 3, UATTN_F32);
  L.cache_dtype = cache_dtype;
  L.kv_layout = layout;
  const int32_t bs = 4, nb = 6, hkv = 2, D = 3, T = 6;
  const int32_t nc[2] = {3, 0}, ns[2] = {4, 2};
  const int32_t bt[2 * 3] = {5, 1, -1, 2, -1, -1};
  const int64_t want_slot[6] = {23, 4, 5, 6, 8, 9};
  float k[6 * 2 * 3], v[6 * 2 * 3];
  for (int32_t i = 0; i < T * hkv * D; i++) {
    k[i] = (float)(i + 1) * 1.25f;
    v[i] = -(float)(i + 1) * 0.5f;
  }
  /* round-to-nearest-even ties in bf16 (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6) and f16 (1 + 2^-11 -> 1) */
  k[0] = 1 + 0x1p-8f;
  k[1] = 1 + 0x1.8p-7f;
  k[2] = 1 + 0x1p-11f;
  oracle_step s = {.num_reqs = 2,
                   .block_size = bs,
                   .num_computed = nc,
                   .num_scheduled = ns,
                   .block_table = bt,
                   .block_table_stride = 3};
  cache_images img = write_over_sentinel(&s, &L, k, v, nb);

  for (int32_t row = 0; row < T; row++) {
    const int64_t block = want_slot[row] / bs, off = want_slot[row] % bs;
    for (int32_t g = 0; g < hkv; g++) {
      for (int32_t d = 0; d < D; d++) {
        const size_t at = layout == UATTN_LAYOUT_HND ? (size_t)(((block * hkv + g) * bs + off) * D + d)
                                                     : (size_t)((want_slot[row] * hkv + g) * D + d);
        const size_t src = (size_t)(row * hkv + g) * D + (size_t)d;
        oracle_store(img.want_k, cache_dtype, at, k[src]);
        oracle_store(img.want_v, cache_dtype, at, v[src]);
        cr_assert_eq(oracle_cache_index(&L, bs, want_slot[row], g, d, false), at);
        cr_assert_eq(oracle_cache_index(&L, bs, want_slot[row], g, d, true), at);
      }
    }
  }
  expect_cache_images(&img);
  /* the ties, by hand: slot 23, head 0, d 0..2 */
  const size_t at = layout == UATTN_LAYOUT_HND ? (size_t)(((5 * hkv + 0) * bs + 3) * D) : (size_t)(23 * hkv * D);
  if (cache_dtype == UATTN_BF16) {
    const uint16_t *c = (const uint16_t *)img.kc;
    cr_assert(c[at] == 0x3F80 && c[at + 1] == 0x3F82, "bf16 ties: %#x %#x", c[at], c[at + 1]);
  } else if (cache_dtype == UATTN_F16) {
    const uint16_t *c = (const uint16_t *)img.kc;
    cr_assert(c[at] == 0x3C04 && c[at + 1] == 0x3C0C && c[at + 2] == 0x3C00, "f16: %#x %#x %#x", c[at], c[at + 1],
              c[at + 2]);
  } else {
    cr_assert(((const float *)img.kc)[at] == k[0]);
  }
  cache_images_free(&img);
}

Test(cache, write_at_the_right_slots_nhd) {
  check_cache_write(UATTN_LAYOUT_NHD, UATTN_F32);
  check_cache_write(UATTN_LAYOUT_NHD, UATTN_BF16);
  check_cache_write(UATTN_LAYOUT_NHD, UATTN_F16);
}

Test(cache, write_at_the_right_slots_hnd) {
  check_cache_write(UATTN_LAYOUT_HND, UATTN_F32);
  check_cache_write(UATTN_LAYOUT_HND, UATTN_BF16);
  check_cache_write(UATTN_LAYOUT_HND, UATTN_F16);
}

/* TILED's index is a bijection onto [0, num_blocks * bs * Hkv * D), keys and values each: every (slot, head,
 * dim) has its own element and no element is left over. Block sizes of one tile and several, Hkv 1 and 3,
 * head dims from one dim pair up. */
Test(cache, tiled_index_is_a_bijection) {
  const int32_t shapes[][4] = {
      /* bs, Hkv, D, num_blocks */
      {16, 1, 2, 1}, {16, 3, 6, 3}, {32, 2, 4, 2}, {64, 1, 80, 2}, {48, 3, 10, 3}, {256, 2, 64, 2}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const int32_t bs = shapes[i][0], hkv = shapes[i][1], D = shapes[i][2], nb = shapes[i][3];
    uattn_layer L = layer(hkv, hkv, D, UATTN_F32);
    L.kv_layout = UATTN_LAYOUT_TILED;
    const size_t n = (size_t)nb * (size_t)bs * (size_t)hkv * (size_t)D;
    unsigned char *hit = malloc(n);
    for (int v = 0; v < 2; v++) {
      memset(hit, 0, n);
      for (int64_t slot = 0; slot < (int64_t)nb * bs; slot++)
        for (int32_t g = 0; g < hkv; g++)
          for (int32_t d = 0; d < D; d++) {
            const size_t at = oracle_cache_index(&L, bs, slot, g, d, v);
            cr_assert(at < n, "bs %d Hkv %d D %d %s: slot %lld head %d dim %d at %zu, past %zu", bs, hkv, D,
                      v ? "values" : "keys", (long long)slot, g, d, at, n);
            cr_assert(!hit[at], "bs %d Hkv %d D %d %s: element %zu reached twice (slot %lld head %d dim %d)", bs, hkv,
                      D, v ? "values" : "keys", at, (long long)slot, g, d);
            hit[at] = 1;
          }
      /* n distinct indices below n: every element is reached */
    }
    free(hit);
  }
}

/* Elements of bs 32, Hkv 2, D 4 worked out by hand from uattn.h's shapes: keys [nb, 2, 2, 2, 16, 2] (strides
 * 256, 128, 64, 32, 2, 1), values [nb, 2, 2, 8, 4, 2] (strides 256, 128, 64, 8, 2, 1). Slot s is block s / 32,
 * tile s % 32 / 16, key s % 16 of the tile. */
Test(cache, tiled_index_by_hand) {
  uattn_layer L = layer(2, 2, 4, UATTN_F32);
  L.kv_layout = UATTN_LAYOUT_TILED;
  const struct {
    int64_t slot;
    int32_t head, dim;
    size_t key, value;
  } want[] = {
      {0, 0, 0, 0, 0},
      {0, 0, 1, 1, 2},      /* key: dim 1 is e 1 of pair 0; value: dims are stride 2 */
      {1, 0, 0, 2, 1},      /* key 1: keys stride 2; value: key 1 is the odd one of pair 0 */
      {0, 0, 2, 32, 4},     /* key: dim pair 1 */
      {5, 0, 2, 42, 21},    /* key: 32 + 5 * 2; value: pair 2 (16) + dim 2 (4) + odd key (1) */
      {0, 1, 0, 64, 64},    /* the second head of tile 0 */
      {16, 0, 0, 128, 128}, /* tile 1 of block 0 */
      {17, 1, 3, 64 + 128 + 32 + 2 + 1, 64 + 128 + 6 + 1},
      {32, 0, 0, 256, 256}, /* block 1 */
      {95, 1, 3, 767, 767}, /* the last element of 3 blocks: block 2, tile 1, key 15, head 1, dim 3 */
      {94, 1, 2, 2 * 256 + 128 + 64 + 32 + 14 * 2, 2 * 256 + 128 + 64 + 7 * 8 + 2 * 2},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    const size_t k = oracle_cache_index(&L, 32, want[i].slot, want[i].head, want[i].dim, false);
    const size_t v = oracle_cache_index(&L, 32, want[i].slot, want[i].head, want[i].dim, true);
    cr_assert_eq(k, want[i].key, "slot %lld head %d dim %d: key index %zu, want %zu", (long long)want[i].slot,
                 want[i].head, want[i].dim, k, want[i].key);
    cr_assert_eq(v, want[i].value, "slot %lld head %d dim %d: value index %zu, want %zu", (long long)want[i].slot,
                 want[i].head, want[i].dim, v, want[i].value);
  }
  /* NHD and HND, same slots: one row of D per (slot, head) in both caches */
  L.kv_layout = UATTN_LAYOUT_NHD;
  cr_assert_eq(oracle_cache_index(&L, 32, 17, 1, 3, false), (size_t)(17 * 2 + 1) * 4 + 3);
  cr_assert_eq(oracle_cache_index(&L, 32, 17, 1, 3, true), (size_t)(17 * 2 + 1) * 4 + 3);
  L.kv_layout = UATTN_LAYOUT_HND;
  cr_assert_eq(oracle_cache_index(&L, 32, 49, 1, 2, false), (size_t)((1 * 2 + 1) * 32 + 17) * 4 + 2);
  cr_assert_eq(oracle_cache_index(&L, 32, 49, 1, 2, true), (size_t)((1 * 2 + 1) * 32 + 17) * 4 + 2);
}

/* The cache update on TILED, bs 32, Hkv 2, D 4, 3 blocks: request 0 has 30 cached tokens and writes p = 30..33
 * (block 2 keys 30, 31 (tile 1), then block 0 keys 0, 1: slots 94, 95, 0, 1); request 1 writes p = 15..17
 * across tiles 0 and 1 of block 1 (slots 47, 48, 49). Every element lands where test_oracle's own index puts
 * it, the rest keep their sentinel; the first key's elements by hand. */
static void check_tiled_cache_write(uattn_dtype cache_dtype) {
  uattn_layer L = layer(2, 2, 4, UATTN_F32);
  L.cache_dtype = cache_dtype;
  L.kv_layout = UATTN_LAYOUT_TILED;
  if (oracle_is_fp8(cache_dtype)) L.k_scale = 0.5f, L.v_scale = 2.0f;
  const int32_t bs = 32, nb = 3, hkv = 2, D = 4, T = 7;
  const int32_t nc[2] = {30, 15}, ns[2] = {4, 3}, np[2] = {34, 18}; /* prompts: fp8 caches ask */
  const int32_t bt[2 * 2] = {2, 0, 1, -1};
  const int64_t want_slot[7] = {94, 95, 0, 1, 47, 48, 49};
  float k[7 * 2 * 4], v[7 * 2 * 4];
  for (int32_t i = 0; i < T * hkv * D; i++) {
    k[i] = (float)(i + 1) * 0.25f;
    v[i] = -(float)(i + 1) * 0.125f;
  }
  oracle_step s = {.num_reqs = 2,
                   .block_size = bs,
                   .num_computed = nc,
                   .num_scheduled = ns,
                   .num_prompt = np,
                   .block_table = bt,
                   .block_table_stride = 2};
  cache_images img = write_over_sentinel(&s, &L, k, v, nb);

  env e; /* only for slot_index: its layer, block size and nothing else */
  memset(&e, 0, sizeof e);
  e.L = L;
  e.bs = bs;
  for (int32_t row = 0; row < T; row++)
    for (int32_t g = 0; g < hkv; g++)
      for (int32_t d = 0; d < D; d++) {
        const size_t src = (size_t)(row * hkv + g) * D + (size_t)d;
        const size_t ak = slot_index(&e, want_slot[row], g, d, false), av = slot_index(&e, want_slot[row], g, d, true);
        if (oracle_is_fp8(cache_dtype)) {
          img.want_k[ak] = oracle_quantize_fp8(cache_dtype, k[src], L.k_scale);
          img.want_v[av] = oracle_quantize_fp8(cache_dtype, v[src], L.v_scale);
        } else {
          oracle_store(img.want_k, cache_dtype, ak, k[src]);
          oracle_store(img.want_v, cache_dtype, av, v[src]);
        }
      }
  expect_cache_images(&img);
  /* row 0 (slot 94: block 2, tile 1, key 14), head 0: keys at 640 + 28 + {0, 1, 32, 33}, values at
   * 640 + 56 + {0, 2, 4, 6} (key 14 is the even one of pair 7) */
  const size_t kat[4] = {668, 669, 700, 701}, vat[4] = {696, 698, 700, 702};
  for (int32_t d = 0; d < D && !oracle_is_fp8(cache_dtype); d++) {
    cr_assert_eq(oracle_load(img.kc, cache_dtype, kat[d]), oracle_round(cache_dtype, k[d]), "slot 94 key dim %d", d);
    cr_assert_eq(oracle_load(img.vc, cache_dtype, vat[d]), oracle_round(cache_dtype, v[d]), "slot 94 value dim %d", d);
  }
  cache_images_free(&img);
}

Test(cache, write_at_the_right_slots_tiled) {
  check_tiled_cache_write(UATTN_F32);
  check_tiled_cache_write(UATTN_BF16);
  check_tiled_cache_write(UATTN_F16);
  check_tiled_cache_write(UATTN_FP8_E4M3);
  check_tiled_cache_write(UATTN_FP8_E5M2);
}

Test(cache, equal_dtypes_copy_bits_and_cross_writes_nothing) {
  /* f32 -> f32 keeps a signalling NaN's exact bits; bf16 -> bf16 keeps its pattern */
  uattn_layer L = layer(1, 1, 1, UATTN_F32);
  uint32_t snan = 0x7F800001u, kc[4], vc[4];
  float k, v = 1;
  memcpy(&k, &snan, sizeof k);
  memset(kc, 0, sizeof kc);
  memset(vc, 0, sizeof vc);
  const int32_t nc = 2, ns = 1, bt[1] = {0};
  oracle_step s = {.num_reqs = 1,
                   .block_size = 4,
                   .num_computed = &nc,
                   .num_scheduled = &ns,
                   .block_table = bt,
                   .block_table_stride = 1};
  uattn_tensors t = {.k = &k, .v = &v, .key_cache = kc, .value_cache = vc, .num_blocks = 1};
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());
  cr_assert(kc[2] == snan && kc[0] == 0 && kc[1] == 0 && kc[3] == 0);

  L.attn_type = UATTN_ATTENTION_ENCODER_DECODER;
  memset(kc, 0, sizeof kc);
  const int32_t enc = 1;
  uattn_cross cross = {.encoder_lens = &enc, .block_table = bt, .block_table_stride = 1};
  t.cross = &cross;
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());
  for (int i = 0; i < 4; i++) cr_assert(kc[i] == 0 && vc[i] == (i == 2 ? 0x3F800000u : 0u));
}

Test(cache, encoder_self_attention_writes_like_the_decoder) {
  uattn_layer L = layer(1, 1, 1, UATTN_F32);
  L.attn_type = UATTN_ATTENTION_ENCODER;
  float k[2] = {3, 4}, v[2] = {5, 6}, kc[8] = {0}, vc[8] = {0};
  const int32_t nc = 3, ns = 2, bt[2] = {1, 0};
  oracle_step s = {.num_reqs = 1,
                   .block_size = 4,
                   .num_computed = &nc,
                   .num_scheduled = &ns,
                   .block_table = bt,
                   .block_table_stride = 2};
  uattn_tensors t = {.k = k, .v = v, .key_cache = kc, .value_cache = vc, .num_blocks = 2};
  cr_assert_eq(oracle_write_cache(&s, &L, &t), 0, "%s", oracle_last_error());
  /* p = 3 -> block 1 slot 7; p = 4 -> block 0 slot 0 */
  for (int i = 0; i < 8; i++)
    cr_assert(kc[i] == (i == 7 ? 3.0f : i == 0 ? 4.0f : 0.0f) && vc[i] == (i == 7 ? 5.0f : i == 0 ? 6.0f : 0.0f));
}
